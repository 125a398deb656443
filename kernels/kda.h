// kda.h — Kimi Delta Attention on the GPU (MODEL.md "KDA"; the CPU op: engine/cpu/kda.c), in the
// three steps the layer walk calls around its Linears. Every pointer is device memory; positions
// and slots follow engine/state.h.
#pragma once
#include <cuda_runtime_api.h> // cudaStream_t
#include <stdbool.h>

#ifdef __cplusplus
extern "C" {
#endif
#include "cursor.h"           // sd_dev_pos
#include "tensor.h"              // sd_mat
#include "status.h"           // sd_code, sd_status

// H = 0 (a tensor-parallel rank holding no KDA head) launches nothing.
// Positions come from device memory (sd_dev_pos: a state's cursor, cursor.h), read by the kernels.
// settled: the cursor, the conv rows before pos0 and the state slot n0 were written before the
// forward began (its stream drained: the layer walk), so conv and scan read them before they
// wait for their predecessor (pdl.h); false: after (a caller chaining launches without a drain).
//
// (a) Writes the raw projections q, k, v (T, P each) of positions pos0 .. pos0+T-1 into the conv
// rows (row of position p: p % n_rows, each row [q | k | v], 3P floats), then for every new token
// the depthwise causal conv (taps (P, W), tap W-1 on the current token, zero before position 0)
// + silu into qc, kc, vc (T, P), and per head q, k ← x / sqrt(Σx² + 1e-6). In the same launch
// the gates' low-rank second halves: gate = f_b·fa, gb = g_b·ga (f_b, g_b [P, d] F32 or BF16;
// fa, ga (T, d); gate, gb (T, P)), each element one fixed-order dot (kernels/kda.cu). Needs
// n_rows >= T + W - 1 (the ring holds this call's rows and the W-1 before them).
sd_code sd_cuda_kda_conv(float *conv_rows, int n_rows, const float *q, const float *k, const float *v,
                         const float *q_conv, const float *k_conv, const float *v_conv, int T, int H, int d, int W,
                         sd_dev_pos pos0, bool settled, const sd_mat *f_b, const float *fa, float *gate, const sd_mat *g_b,
                         const float *ga, float *gb, float *qc, float *kc, float *vc, cudaStream_t stream, sd_status *st);

// (b) The recurrence over T tokens: reads the state after n0 tokens from slot n0 % n_slots of S
// (n_slots × H × d × d, fp32, S[slot][h][i][j]) and writes slots n0+1 .. n0+T; y (T, P) gets
// o_h = S_hᵀ(q_h · d^-0.5). Each sum over the key index i has an order fixed by d alone
// (kernels/kda.cu: partial chains per 32 keys at d = 32..128), whatever T is: verify ≡ decode
// bit for bit; against the CPU's single chain it differs by rounding. With A_log (H) and dt_bias
// (P), gate and beta are the raw projections and the scan applies the gates as it reads them:
// g = -exp(A_log[h]) · softplus(gate + dt_bias), β = sigmoid(beta) (the CPU's formulas); with
// both NULL they are final. Needs T < n_slots (slot n0 is never overwritten).
sd_code sd_cuda_kda_scan(float *S, int n_slots, sd_dev_pos n0, int T, int H, int d, const float *qc, const float *kc,
                         const float *vc, const float *gate, const float *beta, const float *A_log, const float *dt_bias,
                         float *y, bool settled, cudaStream_t stream, sd_status *st);

// (c) In place: y_h ← rmsnorm(y_h, o_norm, eps) ⊙ sigmoid(gb_h) per (token, head); y, gb (T, P).
sd_code sd_cuda_kda_out(float *y, const float *gb, const float *o_norm, float eps, int T, int H, int d,
                        cudaStream_t stream, sd_status *st);

#ifdef __cplusplus
}
#endif
