// decode.c — plain decode: prefill, then one forward + commit(1) per token.
#include "decode.h"
#include <stdbool.h>
#include <stdlib.h>
#include "philox.h" // sd_uniform
#include "sample.h" // sd_argmax, sd_softmax, sd_sample

int sd_pick_token(const float *logits, int V, float temperature, uint64_t seed, int pos, float *scratch) {
    if (temperature <= 0.0f) return sd_argmax(logits, V);
    sd_softmax(logits, V, temperature, scratch);
    return sd_sample(scratch, V, sd_uniform(seed, 0, (uint32_t)pos, SD_DRAW_DECODE));
}

sd_code sd_decode(const sd_model *m, sd_state *s, const int *prompt, int n_prompt, int max_new,
                  float temperature, uint64_t seed, int *out, sd_status *st) {
    const int V = m->cfg.vocab_size;
    float *logits = malloc(sizeof(float) * 2 * (size_t)V);
    if (!logits) return sd_fail(st, SD_ERR_SYS, "out of memory");
    sd_code rc = sd_prefill(m, s, prompt, n_prompt, logits, st);
    // Greedy steps ask the backend for the argmax only (one int back instead of V floats).
    const bool greedy = temperature <= 0.0f;
    int top = greedy ? sd_argmax(logits, V) : 0;
    sd_forward_opts argmax_only = {.argmax = &top};
    for (int i = 0; !rc && i < max_new; i++) {
        out[i] = greedy ? top : sd_pick_token(logits, V, temperature, seed, s->len, logits + V);
        if (i + 1 == max_new) break;
        rc = sd_forward(m, s, &out[i], 1, greedy ? NULL : logits, 0, greedy ? &argmax_only : NULL, st);
        if (!rc) rc = sd_state_commit(s, 1, st);
    }
    free(logits);
    return rc;
}

void sd_synth_prompt(uint64_t seed, int V, int n, int *out) {
    for (int i = 0; i < n; i++) out[i] = (int)(sd_uniform(seed, 0xFFFFFFFFu, (uint32_t)i, SD_DRAW_DECODE) * (float)V) % V;
}
