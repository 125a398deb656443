// kda_prefill.h — Kimi Delta Attention over a long prompt on the GPU (MODEL.md "KDA"), the kernels
// around the prefill's GEMMs (engine/cuda/prefill.c): the short convolutions with the gates, the
// recurrence in its chunked (WY) form (engine/cpu/kda_scan.h states the algebra; the CPU twin is
// engine/cpu/kda_chunk.c), and the gated output norm. T tokens at positions pos0 .. pos0+T-1 of one
// sequence; every pointer is device memory; the state follows engine/state.h (conv ring rows
// [q | k | v] of 3P floats at row p % n_rows, S slots of H·d·d floats). Positions are launch
// arguments: a prefill is never captured in a graph.
//
// Not bitwise any token path: fp32 with FMA in the hot loops and the device's fast exp (relative
// error ≲ 1e-6 on arguments ≤ 0); equal to the token recurrence within fp32 tolerance
// (bench/prefill_lab checks it against both CPU forms).
#pragma once
#include <cuda_runtime_api.h> // cudaStream_t
#include <stdbool.h>

#ifdef __cplusplus
extern "C" {
#endif
#include "status.h" // sd_code, sd_status

#define SD_KDA_CHUNK 64 // tokens a chunk of the WY form (fla's chunk_kda uses the same)

// (a) Per token t and head h: the depthwise causal convolutions + silu of the raw projections
// qkv (T, 3P: [q | k | v] per row, the GEMMs' output) — history before pos0 from the conv ring,
// zero before position 0, tap j on the input of position p-(W-1)+j summed in increasing j — into
// qkvc (T, 3P), q and k then divided by sqrt(Σx² + 1e-6) per head; the decay gate in place:
// gate ← -exp(A_log[h])·softplus(gate + dt_bias) (gate (T, P): f_b·(f_a·a)); beta ← sigmoid(beta)
// in place (beta (T, ld_b >= H): b·a).
sd_code sd_cuda_kda_prefill_conv(const float *qkv, const float *ring, int n_rows, int pos0, int T, int H, int d, int W,
                                 const float *q_conv, const float *k_conv, const float *v_conv, const float *A_log,
                                 const float *dt_bias, float *gate, float *beta, int ld_b, float *qkvc,
                                 cudaStream_t stream, sd_status *st);

// (b) The raw rows of the last min(T, W-1) positions into the conv ring (after (a) has read the
// history they may overwrite: launched after it on the same stream).
sd_code sd_cuda_kda_prefill_ring(const float *qkv, float *ring, int n_rows, int pos0, int T, int P, int W,
                                 cudaStream_t stream, sd_status *st);

// Work buffers of (c) for T tokens: five (T, P) matrices, then the chunks' Aqk and decays.
size_t sd_cuda_kda_chunk_work_floats(int T, int H, int d);

// (c) The recurrence over T tokens from the state S_in (H, d, d) to S_out (may be S_in), outputs
// y (T, ld_y: head h at column h·d) = o_t = S_tᵀ(q_t · d^-0.5). q, k, v rows of stride ld (qkvc:
// q, q+P, q+2P with ld 3P), g (T, ld_g) the log decay, beta (T, ld_b) post-sigmoid. Two launches:
// the chunk-parallel part (per chunk and head: the cumulative decay, A and Aqk, the triangular
// solve for U0 and W, the decayed queries and keys) and the sequential part (per head and block of
// value columns, chunk after chunk: U = U0 − W·S, the outputs, S ← Diag(decay)·S + K̄ᵀ·U).
// d ∈ {8, 16, 32, 64, 128}.
sd_code sd_cuda_kda_chunk(const float *q, const float *k, const float *v, int ld, const float *g, int ld_g,
                          const float *beta, int ld_b, int T, int H, int d, const float *S_in, float *S_out, float *y,
                          int ld_y, float *work, cudaStream_t stream, sd_status *st);

// (d) y_h ← rmsnorm(y_h, o_norm, eps) ⊙ sigmoid(gb_h) per token and head (y, gb (T, P)), written
// to out (T, P) as bf16 (out_bf16) or f32 — the o_proj GEMM's input.
sd_code sd_cuda_kda_prefill_out(const float *y, const float *gb, const float *o_norm, float eps, int T, int H, int d,
                                void *out, bool out_bf16, cudaStream_t stream, sd_status *st);

#ifdef __cplusplus
}
#endif
