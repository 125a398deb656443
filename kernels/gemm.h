// gemm.h — Y = X · op(W) on the GPU through cuBLASLt: the prefill's projections, experts and
// attention absorptions (engine/cuda/prefill.c). Row-major throughout, as the rest of the engine:
// W is a weight as stored (sd_mat [N, K], or a slice of one), X (M, K) activations, Y (M, N) fp32.
//
// Precision: a BF16 weight multiplies BF16 activations with FP32 accumulation (the tensor-core
// path): f32 activations are rounded to bf16 (nearest even) by a small kernel into the handle's
// staging buffer first — a compact copy, each problem's rows K (rounded up to 8) apart, so the
// operand is 16-byte aligned whatever the source's strides — so each product carries a relative
// error of at most 2^-9 (rms ≈ 1.1e-3 over a dot of random terms) against the CPU's sd_linear,
// which multiplies the f32 activations.
// An F32 weight runs in FP32 (CUBLAS_COMPUTE_32F, no TF32): the router, whose selection must not
// drift, and models stored in F32. Results do not depend on the other rows of the call in exact
// arithmetic, but the summation order is cuBLASLt's (not the decode Linear's): prefill is equal
// to the token path within tolerance, never bit for bit (docs/PREFILL.md).
//
// This lives in kernels/ rather than engine/cuda/ because its conversion kernel is device code and
// the labs link it with the other launchers.
#pragma once
#include <cuda_runtime_api.h> // cudaStream_t
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif
#include "status.h" // sd_code, sd_status
#include "tensor.h" // sd_mat, sd_dtype

// One device's GEMMs on one stream at a time: the cuBLASLt handle, its workspace, the bf16
// staging buffer (stage_elems elements) and the plans — a matmul descriptor per operation and,
// per shape (dims, leading dimensions, batch strides, pointer alignments, accumulate or not), the
// matrix layouts and the heuristic's algorithm, made on the shape's first call and reused after:
// a call of a known shape allocates nothing and asks no heuristic.
typedef struct sd_gemm sd_gemm;
sd_code sd_gemm_create(sd_gemm **out, size_t stage_elems, sd_status *st);
void sd_gemm_free(sd_gemm *g); // NULL is fine; waits for nothing (the caller drains its stream first)
size_t sd_gemm_plans(const sd_gemm *g); // how many shapes have a plan (for tests and benches)

typedef enum {
    SD_GEMM_WT = 0, // W stored [N, K] (ld ldw >= K): Y = X · Wᵀ — a Linear weight as stored
    SD_GEMM_WN = 1, // W stored [K, N] (ld ldw >= N): Y = X · W
} sd_gemm_op;

typedef struct {
    const void *w;          // device
    sd_dtype w_dtype;       // SD_DT_BF16 or SD_DT_F32
    int ldw;
    sd_gemm_op op;
    const void *x;          // (M, K) rows of stride ldx, device
    sd_dtype x_dtype;       // SD_DT_F32 (converted when w is BF16) or SD_DT_BF16 (w must be BF16)
    int ldx;
    float *y;               // (M, N) rows of stride ldy, device
    int ldy;
    int M, N, K;
    float beta;             // 0: Y = X·op(W);  1: Y += X·op(W) (a residual writer's add fused)
    int batch;              // >= 1 strided problems (0 counts as 1); problem b at w + b·stride_w, ...
    long long stride_w, stride_x, stride_y; // in elements
} sd_gemm_args;

// One call (M, N, K >= 1; M = 0 is a no-op). Enqueued on `stream`; the staging buffer (batch · M ·
// K rounded up to 8 elements for f32 activations of a bf16 weight) is reused by the next call, which
// is ordered after this one on the same stream. Errors name the shape.
sd_code sd_gemm_run(sd_gemm *g, const sd_gemm_args *a, cudaStream_t stream, sd_status *st);

// The Linear of engine/cpu/ops.h: y (M, N = w->rows) = x (M, K = w->cols, f32, ld ldx) · wᵀ,
// stored (beta 0) or added (beta 1).
sd_code sd_gemm_linear(sd_gemm *g, const sd_mat *w, const float *x, int ldx, int M, float *y, int ldy, float beta,
                       cudaStream_t stream, sd_status *st);
// The same from bf16 activations (w must be BF16).
sd_code sd_gemm_linear_bf16(sd_gemm *g, const sd_mat *w, const uint16_t *x, int ldx, int M, float *y, int ldy, float beta,
                            cudaStream_t stream, sd_status *st);

// y[i] = bf16(x[i]) (round to nearest even, NaN kept) for i < n: the staging conversion, exposed
// for the kernels that hand bf16 operands to the GEMM themselves.
sd_code sd_cuda_to_bf16(const float *x, size_t n, uint16_t *y, cudaStream_t stream, sd_status *st);

#ifdef __cplusplus
}
#endif
