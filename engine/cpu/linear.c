// linear.c — dot products and the Linear op of the CPU reference (accumulation order: ops.h).
#include "ops.h"
#include <immintrin.h> // x86-64-v3 (AVX2): the build targets it
#include <string.h>

#define LANES 16

// The 16 partials live in two 8-wide vectors (GCC/Clang vector extensions), so they stay in
// registers: vector 0 holds partials 0..7, vector 1 partials 8..15. Element-wise vector + and *
// are the same IEEE operations as the scalar ones; the order is the one ops.h states.
typedef float v8f __attribute__((vector_size(32)));

static inline v8f load_f32(const float *p) {
    v8f v;
    memcpy(&v, p, sizeof v);
    return v;
}
// bf16 → f32 is exact: the 16 bits become the high half of the f32 (one vpmovzxwd + shift; the
// generic __builtin_convertvector compiles to four instructions here).
static inline v8f load_bf16(const uint16_t *p) {
    __m256i u = _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16);
    return (v8f)_mm256_castsi256_ps(u);
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

// Two rows against one token: each row keeps its own partials in the stated order; interleaving
// the two rows' chains keeps the adder busy (one row alone waits on its add latency).
#define DOT_TWO_ROWS(WT, WTYPE)                                                                     \
    static void two_rows_##WT(const WTYPE *w0, const WTYPE *w1, int n, const float *x, float *y0, float *y1) { \
        v8f a_lo = {0}, a_hi = {0}, b_lo = {0}, b_hi = {0};                                         \
        int i = 0;                                                                                  \
        for (; i + LANES <= n; i += LANES) {                                                        \
            const v8f x0 = load_f32(x + i), x1 = load_f32(x + i + 8);                               \
            a_lo += load_##WT(w0 + i) * x0;                                                         \
            a_hi += load_##WT(w0 + i + 8) * x1;                                                     \
            b_lo += load_##WT(w1 + i) * x0;                                                         \
            b_hi += load_##WT(w1 + i + 8) * x1;                                                     \
        }                                                                                           \
        float pa[LANES], pb[LANES];                                                                 \
        spill(a_lo, a_hi, pa);                                                                      \
        spill(b_lo, b_hi, pb);                                                                      \
        for (int j = i; j < n; j++) {                                                               \
            pa[j % LANES] += WIDEN_SCALAR_##WT(w0, j) * x[j];                                       \
            pb[j % LANES] += WIDEN_SCALAR_##WT(w1, j) * x[j];                                       \
        }                                                                                           \
        *y0 = fold_lanes(pa);                                                                       \
        *y1 = fold_lanes(pb);                                                                       \
    }
DOT_TWO_ROWS(bf16, uint16_t)
DOT_TWO_ROWS(f32, float)

// Rows o, o+1 against one token.
static void two_rows(const sd_mat *m, int o, const float *x, float *y) {
    const size_t n = (size_t)m->cols;
    if (m->dtype == SD_DT_BF16) {
        const uint16_t *w = (const uint16_t *)m->data + (size_t)o * n;
        two_rows_bf16(w, w + n, (int)n, x, y + o, y + o + 1);
    } else {
        const float *w = (const float *)m->data + (size_t)o * n;
        two_rows_f32(w, w + n, (int)n, x, y + o, y + o + 1);
    }
}

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
    if (T == 1) { // decode: rows in pairs
        const int pairs = w->rows / 2;
#pragma omp parallel for schedule(static) if (parallel)
        for (int p = 0; p < pairs; p++) two_rows(w, 2 * p, x, y);
        if (w->rows % 2) row_tokens(w, w->rows - 1, x, 1, y);
        return;
    }
#pragma omp parallel for schedule(static) if (parallel)
    for (int o = 0; o < w->rows; o++) row_tokens(w, o, x, T, y);
}
