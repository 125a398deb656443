// test_kda_chunk.c — the chunked (WY) KDA recurrence (engine/cpu/kda_chunk.c) against the token
// recurrence (sd_kda_step, what decode runs) on random inputs: the outputs of every token and the
// state after the last, over lengths that are and are not multiples of the chunk, from a zero and
// a non-empty starting state, at weak and strong decay.
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "common.h"
#include "kda_scan.h"

static uint64_t rng(uint64_t *s) {
    *s ^= *s >> 12; *s ^= *s << 25; *s ^= *s >> 27;
    return *s * 2685821657736338717ull;
}
static float unit(uint64_t *s) { return (float)(rng(s) >> 40) * (1.0f / 16777216.0f); } // [0, 1)

// ‖a − b‖ / ‖b‖; a non-finite value in a fails (+inf).
static double rel(const float *a, const float *b, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(a[i])) return INFINITY;
        num += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        den += (double)b[i] * b[i];
    }
    return sqrt(num / (den > 0 ? den : 1));
}

typedef struct {
    int d, chunk, T;
    float state_scale; // 0: the zero state of a fresh sequence
    float decay;       // g in [-decay, 0)
} kda_case;

// Inputs of one head, H = 2 heads interleaved (ld = 2d) so the strides are exercised.
static void check_case(const kda_case *c) {
    enum { H = 2 };
    const int d = c->d, T = c->T;
    const size_t ld = (size_t)H * d, n = (size_t)T * ld;
    float *q = malloc(sizeof(float) * n), *k = malloc(sizeof(float) * n), *v = malloc(sizeof(float) * n);
    float *g = malloc(sizeof(float) * n), *beta = malloc(sizeof(float) * T * H);
    float *o_ref = calloc(n, sizeof(float)), *o_chk = calloc(n, sizeof(float));
    float *S0 = malloc(sizeof(float) * d * d * H), *S_chk = malloc(sizeof(float) * d * d * H);
    float *Sa = malloc(sizeof(float) * d * d), *Sb = malloc(sizeof(float) * d * d);
    float *work = malloc(sizeof(float) * sd_kda_chunk_work_floats(d, c->chunk));
    uint64_t s = 0x1234567ull + (uint64_t)d * 131 + (uint64_t)T * 7 + (uint64_t)c->chunk;
    for (size_t i = 0; i < n; i++) {
        q[i] = unit(&s) * 2 - 1;
        k[i] = unit(&s) * 2 - 1;
        v[i] = unit(&s) * 2 - 1;
        g[i] = -c->decay * (unit(&s) * 0.999f + 0.001f);
    }
    for (int t = 0; t < T; t++)
        for (int h = 0; h < H; h++) {
            beta[t * H + h] = 0.02f + 0.96f * unit(&s);
            float *qh = q + t * ld + (size_t)h * d, *kh = k + t * ld + (size_t)h * d;
            float sq = 0, sk = 0;
            for (int i = 0; i < d; i++) { sq += qh[i] * qh[i]; sk += kh[i] * kh[i]; }
            for (int i = 0; i < d; i++) { qh[i] /= sqrtf(sq + 1e-6f); kh[i] /= sqrtf(sk + 1e-6f); }
        }
    for (size_t i = 0; i < (size_t)d * d * H; i++) S0[i] = c->state_scale * (unit(&s) * 2 - 1);
    memcpy(S_chk, S0, sizeof(float) * d * d * H);

    double worst_o = 0, worst_S = 0;
    for (int h = 0; h < H; h++) {
        const size_t off = (size_t)h * d;
        memcpy(Sa, S0 + (size_t)h * d * d, sizeof(float) * d * d);
        for (int t = 0; t < T; t++) { // the token recurrence, ping-ponging two buffers
            sd_kda_step(Sa, Sb, q + t * ld + off, k + t * ld + off, v + t * ld + off, g + t * ld + off, beta[t * H + h], d,
                        o_ref + t * ld + off);
            float *tmp = Sa; Sa = Sb; Sb = tmp;
        }
        float *Sh = S_chk + (size_t)h * d * d;
        sd_kda_chunk_head(Sh, q + off, k + off, v + off, g + off, beta + h, T, d, c->chunk, ld, H, o_chk + off, work);
        const double eS = rel(Sh, Sa, (size_t)d * d);
        if (eS > worst_S) worst_S = eS;
    }
    worst_o = rel(o_chk, o_ref, n);
    cr_log_info("d=%d chunk=%d T=%d S0 %.2g decay %.2g: outputs rel %.3g, final state rel %.3g", d, c->chunk, T,
                c->state_scale, c->decay, worst_o, worst_S);
    // fp32 throughout: the two forms round differently (the chunk form sums a chunk's corrections
    // in other groupings and solves a triangular system): these cases measure ≤ 5e-7; the bound
    // leaves 100× room and still catches any algebraic slip (those are O(1)).
    cr_assert(worst_o <= 5e-5, "outputs: relative error %.3g > 5e-5 (d=%d chunk=%d T=%d)", worst_o, d, c->chunk, T);
    cr_assert(worst_S <= 5e-5, "final state: relative error %.3g > 5e-5 (d=%d chunk=%d T=%d)", worst_S, d, c->chunk, T);
    free(q); free(k); free(v); free(g); free(beta); free(o_ref); free(o_chk);
    free(S0); free(S_chk); free(Sa); free(Sb); free(work);
}

static const kda_case CASES[] = {
    {.d = 8, .chunk = 4, .T = 1, .state_scale = 0.0f, .decay = 0.5f},     // one token, zero state
    {.d = 8, .chunk = 4, .T = 13, .state_scale = 0.3f, .decay = 0.5f},    // T not a multiple of the chunk
    {.d = 16, .chunk = 16, .T = 64, .state_scale = 0.0f, .decay = 0.2f},  // whole chunks
    {.d = 16, .chunk = 16, .T = 50, .state_scale = 0.5f, .decay = 3.0f},  // strong decay: exponents far below -88
    {.d = 32, .chunk = 64, .T = 100, .state_scale = 0.2f, .decay = 0.05f}, // weak decay, long memory
    {.d = 64, .chunk = 64, .T = 129, .state_scale = 0.1f, .decay = 1.0f},
    {.d = 128, .chunk = 64, .T = 70, .state_scale = 0.1f, .decay = 0.3f}, // the Kimi head width
};

Test(kda_chunk, matches_the_token_recurrence) {
    for (size_t i = 0; i < sizeof CASES / sizeof CASES[0]; i++) check_case(&CASES[i]);
}

// A chunk longer than the prompt is one chunk; chunk = 1 is the token recurrence regrouped.
Test(kda_chunk, degenerate_chunks) {
    const kda_case c1 = {.d = 16, .chunk = 256, .T = 37, .state_scale = 0.2f, .decay = 0.4f};
    const kda_case c2 = {.d = 16, .chunk = 1, .T = 9, .state_scale = 0.2f, .decay = 0.4f};
    check_case(&c1);
    check_case(&c2);
}
