// layers.h — the CPU reference sublayers of MODEL.md, each over T tokens at positions
// sd_state_next_pos(s) .. +T-1 of one sequence. Every token's arithmetic is the same whatever T is.
#pragma once
#include "state.h"   // sd_state
#include "trace.h"   // trace_burst (level-2 scan bucket)
#include "weights.h" // sd_kda_weights, sd_mla_weights, sd_ffn_weights, sd_moe_weights

// KDA: projections, short convs (writing their raw inputs into the state's conv rows), gates,
// the recurrence (state slots len+1 .. len+T), gated output norm, o_proj. `tb` (may be NULL)
// times the sequential recurrence as the scan bucket.
void sd_kda_forward(const sd_kda_weights *w, const sd_config *c, sd_state *s, int layer,
                    const float *a, int T, float *out, trace_burst *tb);

// MLA, absorbed form: appends c_t, kpe_t to the cache rows len .. len+T-1 and attends causally.
void sd_mla_forward(const sd_mla_weights *w, const sd_config *c, sd_state *s, int layer,
                    const float *a, int T, float *out);

// SwiGLU FFN (dense, one expert, or the shared experts): out = down·(silu(gate·x) ⊙ up·x).
// h1, h2 are (T, width) scratch.
void sd_ffn_forward(const sd_ffn_weights *w, const float *x, int T, float *out, float *h1, float *h2);

// The router for one token: sel (K expert ids in selection order) and w (their weights).
void sd_moe_route(const sd_moe_weights *w, const sd_config *c, const float *b, int *sel, float *wts);

// Route every token, run the selected experts and the shared expert; out[t] = Σ_j w_j·expert_j
// (j in selection order) + shared. Leaves sel/w of token t at s->scratch.sel/w + t·K. A rank's
// shard (sd_config_shard) routes over every expert but runs and sums only the ones it holds,
// with its slice of the shared expert: the group's all-reduce adds the ranks' parts.
// sd_moe_forward = sd_moe_route_rows then sd_moe_experts; between them a caller may rewrite the
// scratch's sel/w (model.h's route override).
void sd_moe_forward(const sd_moe_weights *w, const sd_config *c, sd_state *s, const float *b, int T, float *out);
// The router of every token: its logits at s->scratch.router + t·E, sel/w at s->scratch.sel/w + t·K.
void sd_moe_route_rows(const sd_moe_weights *w, const sd_config *c, sd_state *s, const float *b, int T);
// The experts of the selection in s->scratch.sel/w, and the shared expert.
void sd_moe_experts(const sd_moe_weights *w, const sd_config *c, sd_state *s, const float *b, int T, float *out);
