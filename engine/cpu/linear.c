// linear.c — dot products and the Linear op of the CPU reference (accumulation order: ops.h).
#include "ops.h"
#include <string.h>

#define LANES 16

// The 16 partials live in two 8-wide vectors (GCC/Clang vector extensions), so they stay in
// registers: vector 0 holds partials 0..7, vector 1 partials 8..15. Element-wise vector + and *
// are the same IEEE operations as the scalar ones; the order is the one ops.h states.
typedef float v8f __attribute__((vector_size(32)));
typedef uint16_t v8u16 __attribute__((vector_size(16)));
typedef uint32_t v8u32 __attribute__((vector_size(32)));

static inline v8f load_f32(const float *p) {
    v8f v;
    memcpy(&v, p, sizeof v);
    return v;
}
// bf16 → f32 is exact: the 16 bits become the high half of the f32.
static inline v8f load_bf16(const uint16_t *p) {
    v8u16 h;
    memcpy(&h, p, sizeof h);
    v8u32 u = __builtin_convertvector(h, v8u32) << 16;
    v8f v;
    memcpy(&v, &u, sizeof v);
    return v;
}

static float fold_lanes(float p[LANES]) {
    for (int w = LANES / 2; w >= 1; w /= 2)
        for (int l = 0; l < w; l++) p[l] += p[l + w];
    return p[0];
}

static inline void spill(v8f lo, v8f hi, float p[LANES]) {
    memcpy(p, &lo, sizeof lo);
    memcpy(p + 8, &hi, sizeof hi);
}

float sd_dot_f32(const float *a, const float *b, int n) {
    v8f lo = {0}, hi = {0};
    int i = 0;
    for (; i + LANES <= n; i += LANES) {
        lo += load_f32(a + i) * load_f32(b + i);
        hi += load_f32(a + i + 8) * load_f32(b + i + 8);
    }
    float p[LANES];
    spill(lo, hi, p);
    for (; i < n; i++) p[i % LANES] += a[i] * b[i];
    return fold_lanes(p);
}

float sd_dot_bf16(const uint16_t *w, const float *x, int n) {
    v8f lo = {0}, hi = {0};
    int i = 0;
    for (; i + LANES <= n; i += LANES) {
        lo += load_bf16(w + i) * load_f32(x + i);
        hi += load_bf16(w + i + 8) * load_f32(x + i + 8);
    }
    float p[LANES];
    spill(lo, hi, p);
    for (; i < n; i++) p[i % LANES] += sd_bf16_to_f32(w[i]) * x[i];
    return fold_lanes(p);
}

float sd_mat_dot_row(const sd_mat *m, int row, const float *x) {
    size_t off = (size_t)row * m->cols;
    if (m->dtype == SD_DT_BF16) return sd_dot_bf16((const uint16_t *)m->data + off, x, m->cols);
    return sd_dot_f32((const float *)m->data + off, x, m->cols);
}

void sd_mat_row_f32(const sd_mat *m, int row, float *out) {
    size_t off = (size_t)row * m->cols;
    if (m->dtype == SD_DT_BF16) {
        const uint16_t *w = (const uint16_t *)m->data + off;
        for (int i = 0; i < m->cols; i++) out[i] = sd_bf16_to_f32(w[i]);
    } else {
        memcpy(out, (const float *)m->data + off, sizeof(float) * m->cols);
    }
}

// Up to TB tokens against one weight row, each token with its own 16 partials accumulated
// exactly as sd_dot_* does (element i into partial i % 16, increasing i; same fold), so every
// result is bit-identical to the single-token dot — the weights are loaded and widened once for
// all TB tokens. TB and the weight type are compile-time constants so the partials stay in
// registers.
#define WIDEN_SCALAR_bf16(w, i) sd_bf16_to_f32((w)[i])
#define WIDEN_SCALAR_f32(w, i) ((w)[i])
#define DOT_ROW_TOKENS(TB, WT, WTYPE)                                                               \
    static void dot##TB##_##WT(const WTYPE *w, int n, const float *x, float *y, int y_stride) {    \
        v8f lo[TB], hi[TB];                                                                         \
        for (int t = 0; t < TB; t++) lo[t] = hi[t] = (v8f){0};                                      \
        int i = 0;                                                                                  \
        for (; i + LANES <= n; i += LANES) {                                                        \
            const v8f w0 = load_##WT(w + i), w1 = load_##WT(w + i + 8);                             \
            for (int t = 0; t < TB; t++) {                                                          \
                lo[t] += w0 * load_f32(x + (size_t)t * n + i);                                      \
                hi[t] += w1 * load_f32(x + (size_t)t * n + i + 8);                                  \
            }                                                                                       \
        }                                                                                           \
        for (int t = 0; t < TB; t++) {                                                              \
            float p[LANES];                                                                         \
            spill(lo[t], hi[t], p);                                                                 \
            for (int j = i; j < n; j++) p[j % LANES] += WIDEN_SCALAR_##WT(w, j) * x[(size_t)t * n + j]; \
            y[(size_t)t * y_stride] = fold_lanes(p);                                                \
        }                                                                                           \
    }
DOT_ROW_TOKENS(4, bf16, uint16_t)
DOT_ROW_TOKENS(2, bf16, uint16_t)
DOT_ROW_TOKENS(4, f32, float)
DOT_ROW_TOKENS(2, f32, float)

// Row o of w against tokens t0..T-1 (groups of 4, then 2, then single dots).
static void row_tokens(const sd_mat *m, int o, const float *x, int T, float *y) {
    const int n = m->cols, rows = m->rows;
    const size_t off = (size_t)o * n;
    int t = 0;
    if (m->dtype == SD_DT_BF16) {
        const uint16_t *w = (const uint16_t *)m->data + off;
        for (; t + 4 <= T; t += 4) dot4_bf16(w, n, x + (size_t)t * n, y + (size_t)t * rows + o, rows);
        for (; t + 2 <= T; t += 2) dot2_bf16(w, n, x + (size_t)t * n, y + (size_t)t * rows + o, rows);
        for (; t < T; t++) y[(size_t)t * rows + o] = sd_dot_bf16(w, x + (size_t)t * n, n);
    } else {
        const float *w = (const float *)m->data + off;
        for (; t + 4 <= T; t += 4) dot4_f32(w, n, x + (size_t)t * n, y + (size_t)t * rows + o, rows);
        for (; t + 2 <= T; t += 2) dot2_f32(w, n, x + (size_t)t * n, y + (size_t)t * rows + o, rows);
        for (; t < T; t++) y[(size_t)t * rows + o] = sd_dot_f32(w, x + (size_t)t * n, n);
    }
}

void sd_linear(const sd_mat *w, const float *x, int T, float *y) {
    // Small products are not worth waking the thread team; the result is the same either way.
    const int parallel = (long)w->rows * w->cols * T >= SD_PARALLEL_MIN_WORK;
#pragma omp parallel for schedule(static) if (parallel)
    for (int o = 0; o < w->rows; o++) row_tokens(w, o, x, T, y);
}

float sd_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h >> 15) << 31, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
    union { uint32_t u; float f; } v;
    if (exp == 0) { // zero or subnormal: man · 2^-24, exact in f32
        float f = (float)man * (1.0f / 16777216.0f);
        return sign ? -f : f;
    }
    if (exp == 31) v.u = sign | 0x7f800000u | (man << 13);
    else v.u = sign | ((exp + 112) << 23) | (man << 13);
    return v.f;
}
