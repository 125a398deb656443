// moe.h — SwiGLU FFN and the MoE block on the GPU (MODEL.md "MoE"; the CPU ops: engine/cpu/moe.c).
// Two expert arms compute the same bits (each output element is the same device dot):
//   device-table: sd_cuda_moe_experts reads sel from device memory (no host sync; capturable);
//   eager:        the host reads sel back and runs each expert as sd_cuda_ffn over its tokens.
#pragma once
#include <cuda_runtime_api.h> // cudaStream_t
#include <stdbool.h>

#ifdef __cplusplus
extern "C" {
#endif
#include "status.h"  // sd_code, sd_status
#include "weights.h" // sd_ffn_weights

// One routed expert's matrices (device pointers; gate/up (Ie, D), down (D, Ie)), for the table.
typedef struct {
    const void *gate, *up, *down;
    int gate_bf16, up_bf16, down_bf16; // 1: BF16, 0: F32
} sd_cuda_expert;

// Routing as the CPU's sd_moe_route, one block per token: s = sigmoid(router·b) (F32 router,
// fixed-order dot), s' = s + bias, grouped top-k with the CPU's tie rules (lower index wins),
// weights renormalised and scaled. sel, w (T, K) are written to device memory.
sd_code sd_cuda_moe_route(const float *router, const float *bias, const float *b, int T, int E, int D, int K, int G,
                          int topk_group, bool renormalize, float scaling, int *sel, float *w, cudaStream_t stream,
                          sd_status *st);

// h ← silu(h) ⊙ h2 over n elements.
sd_code sd_cuda_silu_mul(float *h, const float *h2, size_t n, cudaStream_t stream, sd_status *st);

// out = down·(silu(gate·x) ⊙ up·x) for T tokens (dense FFN, one expert, the shared experts);
// h1, h2 (T, width) scratch.
sd_code sd_cuda_ffn(const sd_ffn_weights *w, const float *x, int T, float *out, float *h1, float *h2,
                    cudaStream_t stream, sd_status *st);

// Device-table arm: for every (token t, slot j), expert e = sel[t·K+j] of table (E entries, device
// memory) runs on x[t] (x (T, D)); exp_out[(t·K+j)·D ..] = its output. h is scratch of h_cap floats
// (>= T·Ie); slots are processed in groups of h_cap / (T·Ie).
sd_code sd_cuda_moe_experts(const sd_cuda_expert *table, int Ie, int D, const int *sel, const float *x, int T, int K,
                            float *h, size_t h_cap, float *exp_out, cudaStream_t stream, sd_status *st);

// out[t] = Σ_j w[t·K+j] · exp_out[t·K+j] (j in selection order, from 0), then + shared[t] when
// shared is not NULL.
sd_code sd_cuda_moe_combine(const float *exp_out, const float *w, const float *shared, int T, int K, int D, float *out,
                            cudaStream_t stream, sd_status *st);

#ifdef __cplusplus
}
#endif
