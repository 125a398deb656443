// moe_prefill.h — the MoE block (and the SwiGLU of every FFN) over a long prompt on the GPU
// (MODEL.md "MoE"; the CPU op: engine/cpu/moe.c sd_moe_forward), the kernels around the prefill's
// expert GEMMs (engine/cuda/prefill.c). The T·K (token, slot) entries are grouped by expert as the
// CPU and kernels/moe_route.h group them — experts ascending, each expert's entries in (token, slot)
// order — so the expert GEMMs run over contiguous rows: entry i = t·K + j takes row inv[i] of the
// grouped buffers, whose row r holds token row_tok[r]. Every pointer is device memory.
#pragma once
#include <cuda_runtime_api.h> // cudaStream_t
#include <stdbool.h>

#ifdef __cplusplus
extern "C" {
#endif
#include "status.h" // sd_code, sd_status

// The routing of sd_moe_route for T tokens from their router logits (T, E), one warp a token:
// s = sigmoid(logit), s' = s + bias, with G > 1 (G <= 32) the topk_group best groups by the sum of
// their two largest s' kept, then the K largest s' in descending order (ties: lower index), w_j =
// s[sel_j] summed in selection order, renormalised when asked, scaled. sel, w (T, K).
sd_code sd_cuda_moe_prefill_select(const float *logits, const float *bias, int T, int E, int K, int G, int topk_group,
                                   bool renormalize, float scaling, int *sel, float *w, cudaStream_t stream, sd_status *st);

// counts[e] = how many of the n entries of sel chose expert e.
sd_code sd_cuda_moe_prefill_count(const int *sel, int n, int E, int *counts, cudaStream_t stream, sd_status *st);

// With offsets[e] the exclusive prefix sum of counts: entry i's row is offsets[sel_i] plus its rank
// among the entries of expert sel_i (in entry order); row_tok[row] = i / K, inv[i] = row.
sd_code sd_cuda_moe_prefill_scatter(const int *sel, int n, int K, int E, const int *offsets, int *row_tok, int *inv,
                                    cudaStream_t stream, sd_status *st);

// out[r] = x[rows[r]] (D wide; x rows of stride ld_x) as bf16 (nearest even) or f32, r < n.
sd_code sd_cuda_gather_rows(const float *x, int ld_x, const int *rows, int n, int D, void *out, bool out_bf16,
                            cudaStream_t stream, sd_status *st);

// The SwiGLU of n rows of h (2I wide, bf16 or f32: gate·x in columns 0..I-1, up·x in I..2I-1):
// out[r][i] = silu(h[r][i]) · h[r][I + i] in fp32 from the values as stored, written as bf16 or
// f32 (I wide) — the down GEMM's input.
sd_code sd_cuda_swiglu_rows(const void *h, bool h_bf16, int n, int I, void *out, bool out_bf16, cudaStream_t stream,
                            sd_status *st);

// x[t] += Σ_{j<K} w[t·K+j] · y[inv[t·K+j]] (j from 0, the CPU's order) + shared[t] (NULL: none),
// in fp32 from the y values as stored. y (grouped rows, D wide, bf16 or f32), shared and x (T, D).
sd_code sd_cuda_moe_prefill_combine(const void *y, bool y_bf16, const int *inv, const float *w, const float *shared, int T,
                                    int K, int D, float *x, cudaStream_t stream, sd_status *st);

#ifdef __cplusplus
}
#endif
