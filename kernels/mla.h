// mla.h — multi-head latent attention on the GPU, absorbed form (MODEL.md "MLA"; the CPU op:
// engine/cpu/mla.c). Every pointer is device memory; cache rows are absolute positions (state.h).
#pragma once
#include <cuda_runtime_api.h> // cudaStream_t
#include <stdbool.h>

#ifdef __cplusplus
extern "C" {
#endif
#include "cursor.h" // sd_dev_pos
#include "ops.h"    // sd_mat
#include "status.h" // sd_code, sd_status

// Positions come from device memory (sd_dev_pos: a state's cursor, cursor.h), read by the kernels.
//
// Cache write for positions pos0 .. pos0+T-1: c[pos] = rmsnorm(kv[t][0..R), kv_norm, eps),
// kpe[pos] = kv[t][R..R+dr); with rope (mla_use_nope false) kpe[pos] and every head's rope part of
// mq[t] (T, Hm·(dn+dr)) are rotated in place: interleaved pairs (2i, 2i+1) by the angle
// pos·θ^(-2i/dr), computed in double on the device and rounded to float once — the CPU's formula
// (engine/cpu/mla.c rope), evaluated with the device's double pow/cos/sin.
sd_code sd_cuda_mla_cache_write(const float *kv, const float *kv_norm, float eps, int T, int R, int dr, sd_dev_pos pos0,
                                float *c, float *kpe, float *mq, int Hm, int dn, bool rope, double theta,
                                cudaStream_t stream, sd_status *st);

// Attention of the T query tokens at pos0 .. pos0+T-1 over cache rows 0 .. their own position:
// q̃_h = W_UK,hᵀ qn_h; score_j = (q̃_h·c_j + qp_h·kpe_j)·(dn+dr)^-0.5; softmax; lat = Σ_j p_j c_j;
// mo[t][h] = W_UV,h · lat (dv). kv_b (Hm·(dn+dv), R), R <= 512. A flash-decoding split: one cluster
// of 8 blocks per (head group, token), each token's rows cut into at most 8 chunks by its position
// alone and merged in chunk order (kernels/mla.cu); needs no scratch. Bitwise the same for a token
// alone or inside a T-token call.
sd_code sd_cuda_mla_attend(const float *mq, const sd_mat *kv_b, const float *c, const float *kpe, int T, int Hm, int dn,
                           int dr, int dv, int R, sd_dev_pos pos0, float *mo, cudaStream_t stream, sd_status *st);

#ifdef __cplusplus
}
#endif
