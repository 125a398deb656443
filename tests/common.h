// common.h — helpers the engine suites share: paths, tiny models, and logits of a sequence.
#pragma once
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include "model.h"
#include "sample.h" // sd_argmax
#include "synth.h"

static inline const char *src_dir(void) {
    const char *d = getenv("SPECDEC_SOURCE_DIR");
    return d ? d : SPECDEC_SOURCE_DIR;
}

// A path under the source tree ("configs/tiny.json", "tests/golden-hf/..."); static buffer
// rotation of 4.
static inline const char *src_path(const char *rel) {
    static char buf[4][4096];
    static int i;
    i = (i + 1) % 4;
    snprintf(buf[i], sizeof buf[i], "%s/%s", src_dir(), rel);
    return buf[i];
}

static inline void load_config(const char *rel, sd_config *cfg) {
    sd_status st = {0};
    cr_assert_eq(sd_config_load(src_path(rel), cfg, &st), SD_OK, "%s", st.msg);
}

// Synthesise a model for a config file (F32 matrices unless bf16).
static inline void synth_from(const char *rel, uint64_t seed, int bf16, int tail_from, float tail_scale, sd_model *m) {
    sd_config cfg;
    load_config(rel, &cfg);
    sd_synth_opts o = {.seed = seed, .dtype = bf16 ? SD_DT_BF16 : SD_DT_F32, .tail_from = tail_from, .tail_scale = tail_scale};
    sd_status st = {0};
    cr_assert_eq(sd_synth_model(m, &cfg, &o, &st), SD_OK, "%s", st.msg);
}

// Teacher-forced logits of tokens[0..n) in forwards of `chunk` tokens (on m's backend); caller frees.
static inline float *logits_chunked(const sd_model *m, const int *tokens, int n, int chunk) {
    sd_state s;
    sd_status st = {0};
    cr_assert_eq(sd_model_state_init(m, &s, n, chunk, &st), SD_OK, "%s", st.msg); // on m's backend
    float *lg = malloc(sizeof(float) * (size_t)n * m->cfg.vocab_size);
    for (int t = 0; t < n; t += chunk) {
        int T = n - t < chunk ? n - t : chunk;
        cr_assert_eq(sd_forward(m, &s, tokens + t, T, lg + (size_t)t * m->cfg.vocab_size, 0, NULL, &st), SD_OK, "%s", st.msg);
        cr_assert_eq(sd_state_commit(&s, T, &st), SD_OK);
    }
    sd_state_free(&s);
    return lg;
}

// MODEL.md: greedy tokens agree wherever the reference's top-2 margin exceeds the tolerance
// (2e-2 of the row's largest magnitude): got's argmax of each such row of ref (n rows of V).
static inline void expect_greedy_where_clear(const float *got, const float *ref, int n, int V, const char *what) {
    for (int t = 0; t < n; t++) {
        const float *r = ref + (size_t)t * V;
        const int top = sd_argmax(r, V);
        float second = -INFINITY, scale = 0.0f;
        for (int i = 0; i < V; i++) {
            if (i != top && r[i] > second) second = r[i];
            if (fabsf(r[i]) > scale) scale = fabsf(r[i]);
        }
        if (r[top] - second > 2e-2f * scale)
            cr_expect_eq(sd_argmax(got + (size_t)t * V, V), top, "%s: greedy token at position %d", what, t);
    }
}

// Deterministic pseudo-random tokens in 0..V-1.
static inline void random_tokens(uint32_t seed, int V, int n, int *out) {
    uint32_t x = seed * 2654435761u + 12345u;
    for (int i = 0; i < n; i++) {
        x ^= x << 13; x ^= x >> 17; x ^= x << 5;
        out[i] = (int)(x % (uint32_t)V);
    }
}
