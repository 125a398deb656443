// decode.h — plain autoregressive decode (the baseline speculative decoding must equal under
// greedy), and the seeded synthetic prompt the CLI uses for --prompt-len.
#pragma once
#include "generate.h" // sd_gen_control
#include "model.h"    // sd_model, sd_state

// Choose the next token from logits: argmax when temperature <= 0, else a sample of
// softmax(logits/temperature) with the uniform sd_uniform(seed, 0, pos, SD_DRAW_DECODE).
// `scratch` holds V floats.
int sd_pick_token(const float *logits, int V, float temperature, uint64_t seed, int pos, float *scratch);

// Prefill the prompt (s must be empty, n_prompt >= 1), then generate max_new tokens into out:
// each chosen in the backend (argmax, or sd_pick_token's draw), one int back per token. With a
// control (may be NULL) it may end early — a stop id, the stop flag — and ctl->n_out says how
// many tokens out holds.
sd_code sd_decode(const sd_model *m, sd_state *s, const int *prompt, int n_prompt, int max_new,
                  float temperature, uint64_t seed, sd_gen_control *ctl, int *out, sd_status *st);

// n prompt tokens drawn uniformly from the vocabulary by Philox (seed, purpose SD_DRAW_DECODE,
// round 0xFFFFFFFF so they never coincide with a sampling draw).
void sd_synth_prompt(uint64_t seed, int V, int n, int *out);
