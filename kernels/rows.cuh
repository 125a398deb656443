// rows.cuh — the RMSNorm of one row by one block, shared by rows.cu and mla.cu.
#pragma once
#include "common.cuh"

#define SD_NORM_THREADS 256

// out = x / sqrt(Σx²/n + eps) ⊙ w (the CPU sd_rmsnorm formula); thread partials in index
// order, then sd_block_sum. blockDim.x == SD_NORM_THREADS. out may alias x.
__device__ __forceinline__ void sd_block_rmsnorm(const float *x, const float *w, int n, float eps, float *out, float *sh) {
    float p = 0.0f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) p += x[i] * x[i];
    const float ss = sd_block_sum(p, sh);
    const float scale = 1.0f / sqrtf(ss / (float)n + eps);
    for (int i = threadIdx.x; i < n; i += blockDim.x) out[i] = (x[i] * scale) * w[i];
}
