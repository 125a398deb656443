// gpu_check.h — what a GPU suite checks outputs with (the test-backend-ops habit): random inputs,
// device buffers with sentinel guards either side (a write outside the buffer fails the test),
// and the relative error ‖got − ref‖ / ‖ref‖ in which any non-finite value fails.
#pragma once
#include <criterion/criterion.h>
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define GPU_OK(call)                                                                    \
    do {                                                                                \
        cudaError_t e_ = (call);                                                        \
        cr_assert_eq(e_, cudaSuccess, "%s: %s", #call, cudaGetErrorString(e_));         \
    } while (0)

// Uniform in [-scale, scale), never a zero buffer; the same seed gives the same values.
static inline void gpu_fill_rand(float *x, size_t n, uint64_t seed, float scale) {
    uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
    for (size_t i = 0; i < n; i++) {
        s ^= s >> 12; s ^= s << 25; s ^= s >> 27;
        x[i] = ((float)((s * 2685821657736338717ull) >> 40) * (1.0f / 16777216.0f) * 2.0f - 1.0f) * scale;
    }
}
static inline float *gpu_rand_host(size_t n, uint64_t seed, float scale) {
    float *x = malloc(sizeof(float) * (n ? n : 1));
    gpu_fill_rand(x, n, seed, scale);
    return x;
}

// A device buffer of n elements of `esize` bytes with GPU_GUARD sentinel words either side.
#define GPU_GUARD 256
#define GPU_SENTINEL 0x7fa5a5a5u // a NaN payload no kernel writes
typedef struct { uint32_t *base; void *p; size_t bytes; } gpu_buf;

static inline gpu_buf gpu_buf_new(size_t n, size_t esize) {
    gpu_buf g = {.bytes = (n * esize + 3) / 4 * 4};
    const size_t words = g.bytes / 4 + 2 * GPU_GUARD;
    GPU_OK(cudaMalloc((void **)&g.base, words * 4));
    uint32_t *fill = malloc(words * 4);
    for (size_t i = 0; i < words; i++) fill[i] = GPU_SENTINEL;
    GPU_OK(cudaMemcpy(g.base, fill, words * 4, cudaMemcpyHostToDevice));
    free(fill);
    g.p = g.base + GPU_GUARD;
    return g;
}
static inline void gpu_buf_put(gpu_buf *g, const void *h, size_t bytes) { GPU_OK(cudaMemcpy(g->p, h, bytes, cudaMemcpyHostToDevice)); }
static inline void gpu_buf_get(const gpu_buf *g, void *h, size_t bytes) { GPU_OK(cudaMemcpy(h, g->p, bytes, cudaMemcpyDeviceToHost)); }
// Guards untouched, then freed.
static inline void gpu_buf_done(gpu_buf *g, const char *what) {
    const size_t words = g->bytes / 4 + 2 * GPU_GUARD;
    uint32_t *all = malloc(words * 4);
    GPU_OK(cudaMemcpy(all, g->base, words * 4, cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < GPU_GUARD; i++) {
        cr_assert_eq(all[i], GPU_SENTINEL, "%s: write %zu words before the buffer", what, GPU_GUARD - i);
        cr_assert_eq(all[words - GPU_GUARD + i], GPU_SENTINEL, "%s: write %zu words past the end", what, i);
    }
    free(all);
    GPU_OK(cudaFree(g->base));
}

// ‖got − ref‖ / ‖ref‖ over n values; +inf when got holds a NaN or an infinity.
static inline double gpu_rel_err(const float *got, const float *ref, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(got[i])) return INFINITY;
        const double d = (double)got[i] - ref[i];
        num += d * d;
        den += (double)ref[i] * ref[i];
    }
    return sqrt(num / (den > 0 ? den : 1));
}
#define CHECK_REL(got, ref, n, bound, ...)                                                                   \
    do {                                                                                                     \
        char what_[320];                                                                                     \
        snprintf(what_, sizeof what_, __VA_ARGS__);                                                          \
        const double e_ = gpu_rel_err((got), (ref), (n));                                                    \
        cr_log_info("%s: relative error %.3g (bound %.1e)", what_, e_, (double)(bound));                     \
        cr_assert(e_ <= (bound), "%s: relative error %.3g > %.1e (NaN/inf counts as a failure)", what_, e_, \
                  (double)(bound));                                                                          \
    } while (0)
