// linear.c — dot products and the Linear op of the CPU reference (accumulation order: ops.h).
#include "ops.h"
#include <string.h>

#define LANES 16

static float fold_lanes(float p[LANES]) {
    for (int w = LANES / 2; w >= 1; w /= 2)
        for (int l = 0; l < w; l++) p[l] += p[l + w];
    return p[0];
}

float sd_dot_f32(const float *a, const float *b, int n) {
    float p[LANES] = {0};
    int i = 0;
    for (; i + LANES <= n; i += LANES)
        for (int l = 0; l < LANES; l++) p[l] += a[i + l] * b[i + l];
    for (; i < n; i++) p[i % LANES] += a[i] * b[i];
    return fold_lanes(p);
}

float sd_dot_bf16(const uint16_t *w, const float *x, int n) {
    float p[LANES] = {0};
    int i = 0;
    for (; i + LANES <= n; i += LANES)
        for (int l = 0; l < LANES; l++) p[l] += sd_bf16_to_f32(w[i + l]) * x[i + l];
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

void sd_linear(const sd_mat *w, const float *x, int T, float *y) {
    const int rows = w->rows, cols = w->cols;
    // Small products are not worth waking the thread team; the result is the same either way.
    const int parallel = (long)rows * cols * T >= SD_PARALLEL_MIN_WORK;
#pragma omp parallel for schedule(static) if (parallel)
    for (int o = 0; o < rows; o++)
        for (int t = 0; t < T; t++) y[(size_t)t * rows + o] = sd_mat_dot_row(w, o, x + (size_t)t * cols);
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
