// rows.cuh — the RMSNorm of one row by one block, shared by rows.cu and mla.cu.
#pragma once
#include "common.cuh"

#define SD_NORM_THREADS 256

#define SD_NORM_REG 16 // elements a thread holds in registers (rows up to 16·256 = 4096 wide)

// out = x / sqrt(Σx²/n + eps) ⊙ w (the CPU sd_rmsnorm formula); thread partials in index
// order, then sd_block_sum. blockDim.x == SD_NORM_THREADS. out may alias x. Up to SD_NORM_REG
// elements a thread, every load of x and w is issued before the first is used (one memory
// latency, not one per element); wider rows loop, in the same order.
// The forward's non-finite flag (finite.h), set where a norm reads the residual stream: a sum of
// squares that is not finite means the row holds a NaN or an Inf (or values whose squares
// overflow). One thread a block; the flag keeps the lowest site.
__device__ __forceinline__ void sd_flag_nonfinite(float ss, int *flag, int site) {
    if (flag && threadIdx.x == 0 && !isfinite(ss)) atomicMin(flag, site);
}

// flag (may be null): the non-finite flag to set, with site, when x's row is not finite.
__device__ __forceinline__ void sd_block_rmsnorm(const float *x, const float *w, int n, float eps, float *out, float *sh,
                                                 int *flag = nullptr, int site = 0) {
    float p = 0.0f;
    if (n <= SD_NORM_REG * SD_NORM_THREADS) {
        float v[SD_NORM_REG], wv[SD_NORM_REG];
#pragma unroll
        for (int k = 0; k < SD_NORM_REG; k++) {
            const int i = threadIdx.x + k * SD_NORM_THREADS;
            v[k] = i < n ? x[i] : 0.0f;
            wv[k] = i < n ? w[i] : 0.0f;
        }
#pragma unroll
        for (int k = 0; k < SD_NORM_REG; k++)
            if (threadIdx.x + k * SD_NORM_THREADS < n) p += v[k] * v[k];
        const float ss = sd_block_sum(p, sh);
        sd_flag_nonfinite(ss, flag, site);
        const float scale = 1.0f / sqrtf(ss / (float)n + eps);
#pragma unroll
        for (int k = 0; k < SD_NORM_REG; k++) {
            const int i = threadIdx.x + k * SD_NORM_THREADS;
            if (i < n) out[i] = (v[k] * scale) * wv[k];
        }
        return;
    }
    for (int i = threadIdx.x; i < n; i += blockDim.x) p += x[i] * x[i];
    const float ss = sd_block_sum(p, sh);
    sd_flag_nonfinite(ss, flag, site);
    const float scale = 1.0f / sqrtf(ss / (float)n + eps);
    for (int i = threadIdx.x; i < n; i += blockDim.x) out[i] = (x[i] * scale) * w[i];
}
