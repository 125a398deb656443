// mla_prefill.h — multi-head latent attention over a long prompt on the GPU (MODEL.md "MLA"; the
// CPU op: engine/cpu/mla.c), the kernels around the prefill's GEMMs (engine/cuda/prefill_layers.c):
// the cache write, the bf16 operand packing and a causal flash attention on the tensor cores. The
// prefill attends in the expanded form — each head's keys [k_nope | kpe] and values from the
// latents through kv_b (k_nope_{j,h} = W_UK,h c_j, v_{j,h} = W_UV,h c_j) — which is the absorbed
// form of the token path in exact arithmetic at (dn + dr) + dv products a (query, key) pair and
// head instead of (R + dr) + R. T tokens at positions pos0 .. pos0+T-1 of one
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

// The width of a packed query or key row of one head: dn + dr rounded up to a multiple of 16
// (zeros beyond); of a packed value row: dv rounded up to 8·2^k (zeros beyond).
int sd_mla_head_width(int dn, int dr);
int sd_mla_value_width(int dv);

// Queries: qp[t·Hm + h] = bf16([qn_{t,h} | qp_{t,h} | 0 ..]), mq's head h (row stride ld_mq, at
// h·(dn+dr), its rope part rotated by the cache write).
sd_code sd_cuda_mla_pack_queries(const float *mq, int ld_mq, int T, int Hm, int dn, int dr, uint16_t *qp, cudaStream_t stream,
                                 sd_status *st);
// Keys and values of cache rows j0 .. j0+n-1 from kvb (n, Hm·(dn+dv)) = c · kv_bᵀ (row i: cache row
// j0 + i; head h's [k_nope | v] at h·(dn+dv)) and the rope keys kpe (rows of dr):
// kp[j·Hm + h] = bf16([k_nope_{j,h} | kpe_j | 0 ..]), vp[j·Hm + h] = bf16([v_{j,h} | 0 ..]).
sd_code sd_cuda_mla_pack_kv(const float *kvb, const float *kpe, int j0, int n, int Hm, int dn, int dr, int dv, uint16_t *kp,
                            uint16_t *vp, cudaStream_t stream, sd_status *st);

// Causal attention of each head of the T tokens against that head's keys 0 .. pos0+t: score =
// q·k · scale, softmax over the visible keys, o[t][h·dv + i] = Σ_j p_j v_{j,h,i} (o rows Hm·dv).
// BF16 operands on the tensor cores (mma.sync m16n8k16), FP32 scores, softmax and accumulation,
// the online softmax of flash attention over 64-key tiles; a block per (head, 64 query rows).
// The value dim at most 256; the packed widths' tiles must fit shared memory (an error says so).
sd_code sd_cuda_mla_flash(const uint16_t *qp, const uint16_t *kp, const uint16_t *vp, int T, int Hm, int dn, int dr, int dv,
                          int pos0, float scale, float *o, cudaStream_t stream, sd_status *st);

#ifdef __cplusplus
}
#endif
