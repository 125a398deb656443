// rows.h — row ops of the residual stream on the GPU: embedding gather, RMSNorm.
#pragma once
#include <cuda_runtime_api.h> // cudaStream_t

#ifdef __cplusplus
extern "C" {
#endif
#include "tensor.h"              // sd_mat
#include "status.h"           // sd_code, sd_status

// x[t] = embed[tokens[t]] widened to f32 (exact); x (T, cols) in device memory, tokens (T) in
// device memory or in pinned, device-mapped host memory (the forward's: engine/cuda/cuda_backend.h).
sd_code sd_cuda_embed(const sd_mat *embed, const int *tokens, int T, float *x, cudaStream_t stream, sd_status *st);
// out[r] = x[r] / sqrt(sum(x[r]²)/n + eps) ⊙ w for rows r < rows (row stride n); out may alias x.
// One block of 256 threads per row; sum order fixed by n (sd_block_sum).
sd_code sd_cuda_rmsnorm(const float *x, const float *w, int rows, int n, float eps, float *out,
                        cudaStream_t stream, sd_status *st);
// The same bits, and a row whose sum of squares is not finite sets the forward's non-finite flag
// (finite.h) to site, when lower (flag may be NULL: no check).
sd_code sd_cuda_rmsnorm_flagged(const float *x, const float *w, int rows, int n, float eps, float *out, int *flag,
                                int site, cudaStream_t stream, sd_status *st);

#ifdef __cplusplus
}
#endif
