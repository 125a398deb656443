// moe_grouped.h — the routed experts of a prefill piece as two grouped GEMMs through cuBLAS
// (cublasGemmGroupedBatchedEx; docs/PREFILL.md): the rows grouped by expert (moe_prefill.h's
// order), one problem an expert with rows — two for [gate | up] when the expert's gate and up are
// not one after the other in memory — all of a layer's problems one call: [gate | up], then down.
//
// The API takes the problems' sizes as host arrays, so the caller has the counts on the host (one
// readback a layer). Row-major throughout, as the rest of the engine; cuBLAS is column-major, so
// each problem is the product of gemm.h's mapping: row-major y (rows, N) = x (rows, K) · Wᵀ with W
// stored [N, K] is column-major yᵀ (N × rows) = op(A) · B, A = W read as K × N (lda K) with op
// transposed, B = x read as K × rows (ldb K), C = y read as N × rows (ldc the row stride):
// m = N, n = rows, k = K.
//
// Precision: BF16 operands, FP32 accumulation (CUBLAS_COMPUTE_32F), BF16 out — cuBLAS refuses FP32
// output for BF16 inputs in grouped mode — so each output element is its fp32 sum rounded once to
// bf16 (nearest even), |error| <= 2^-8 of it. The summation order is cuBLAS's, whose kernel may
// depend on an expert's row count: within the prefill's tolerance of the token path, never bit
// for bit. The same counts give the same bits.
#pragma once
#include <cuda_runtime_api.h> // cudaStream_t
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif
#include "moe_experts.h" // sd_cuda_expert
#include "status.h"      // sd_code, sd_status

typedef enum {
    SD_MOE_GROUPED_UP = 0,   // h (n, 2·Ie) = [x·gateᵀ | x·upᵀ], x (n, D)
    SD_MOE_GROUPED_DOWN = 1, // y (n, D) = hb·downᵀ, hb (n, Ie)
} sd_moe_grouped_op;

// One device's grouped GEMMs on one stream at a time: the cuBLAS handle (made on the current
// device) and its workspace, the host arrays of the problems' sizes, and the problems' A, B, C
// pointers (pinned, and their device copy) for up to E experts.
typedef struct sd_moe_grouped sd_moe_grouped;
sd_code sd_cuda_moe_grouped_create(sd_moe_grouped **out, int E, sd_status *st);
void sd_moe_grouped_free(sd_moe_grouped *g); // NULL is fine; waits for the last call's work to finish

// The problems of one MoE layer, counts (host, E) rows an expert in expert order over the grouped
// rows, experts (host, E) the layer's table (device pointers; every expert with rows BF16, its
// matrices 16-byte aligned): up reads x (n, D) and writes h (n, 2·Ie), down reads hb (n, Ie) and
// writes y (n, D), all bf16 rows of device memory (n the counts' sum; D and Ie multiples of 8, so
// every row starts 16-byte aligned in 16-byte aligned buffers). The problems' pointers go to the
// device in one copy on stream; the host arrays and pinned pointers are rewritten only after the
// previous layer's calls have run (the plan waits for them).
sd_code sd_cuda_moe_grouped_plan(sd_moe_grouped *g, const sd_cuda_expert *experts, const int *counts, int E, int D, int Ie,
                                 const uint16_t *x, uint16_t *h, const uint16_t *hb, uint16_t *y, cudaStream_t stream,
                                 sd_status *st);

// One of the planned GEMMs, enqueued on stream (the plan's, or one ordered after it). A cuBLAS
// failure names the call and its status.
sd_code sd_cuda_moe_grouped_gemm(sd_moe_grouped *g, sd_moe_grouped_op op, cudaStream_t stream, sd_status *st);

#ifdef __cplusplus
}
#endif
