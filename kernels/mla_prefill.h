// mla_prefill.h — multi-head latent attention over a long prompt on the GPU (MODEL.md "MLA",
// absorbed form; the CPU op: engine/cpu/mla.c), the kernels around the prefill's GEMMs
// (engine/cuda/prefill.c): the cache write, the bf16 operand packing and a causal flash attention
// over the latent cache on the tensor cores. T tokens at positions pos0 .. pos0+T-1 of one
// sequence; every pointer is device memory; cache rows are absolute positions (engine/state.h).
#pragma once
#include <cuda_runtime_api.h> // cudaStream_t
#include <stdbool.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif
#include "status.h" // sd_code, sd_status

// The cache write of the decode path (kernels/mla.h): c[pos] = rmsnorm(kv[t][0..R), kv_norm, eps)
// (rows.cuh's sd_block_rmsnorm, the decode path's function), kpe[pos] = kv[t][R..R+dr); with rope
// kpe[pos] and every head's rope part of mq[t] (row stride ld_mq, head h at h·(dn+dr)+dn) rotated in
// place: interleaved pairs (2i, 2i+1) by pos·θ^(-2i/dr), the angle in double, rounded to float
// once — engine/cpu/mla.c's rope. kv rows of stride ld_kv.
sd_code sd_cuda_mla_prefill_cache(const float *kv, int ld_kv, const float *kv_norm, float eps, bool rope, double theta,
                                  int pos0, int T, int Hm, int dn, int dr, int R, float *mq, int ld_mq, float *c, float *kpe,
                                  cudaStream_t stream, sd_status *st);

// The width of a packed attention row: R + dr rounded up to a multiple of 16 (zeros beyond).
int sd_mla_packed_width(int R, int dr);

// Keys: kp[j] = bf16([c_j | kpe_j | 0 ..]) for cache rows j < n (width sd_mla_packed_width).
sd_code sd_cuda_mla_pack_keys(const float *c, const float *kpe, int n, int R, int dr, uint16_t *kp, cudaStream_t stream,
                              sd_status *st);
// Queries: qp[t·Hm + h] = bf16([q̃_{t,h} (qabs (T, Hm, R)) | qp_{t,h} (mq, rotated) | 0 ..]).
sd_code sd_cuda_mla_pack_queries(const float *qabs, const float *mq, int ld_mq, int T, int Hm, int dn, int dr, int R,
                                 uint16_t *qp, cudaStream_t stream, sd_status *st);

// Causal attention of the T·Hm packed query rows (row t·Hm + h: token t, head h) against the packed
// keys 0 .. pos0+t: score = q·k · scale, softmax over the visible keys, lat[t·Hm + h] = Σ_j p_j c_j
// (R floats a row: the value of key j is its first R packed columns, c_j). BF16 operands on the
// tensor cores (mma.sync m16n8k16), FP32 scores, softmax and accumulation, the online softmax of
// flash attention over 64-key tiles; query blocks of 64 rows × up to 256 value columns.
// R a multiple of 8, R + dr <= 896.
sd_code sd_cuda_mla_flash(const uint16_t *qp, const uint16_t *kp, int T, int Hm, int R, int dr, int pos0, float scale,
                          float *lat, cudaStream_t stream, sd_status *st);

#ifdef __cplusplus
}
#endif
