// linear.h — y[t, o] = W[o] · x[t] on the GPU (the CPU op: sd_linear in engine/cpu/ops.h).
#pragma once
#include <cuda_runtime_api.h> // cudaStream_t

#ifdef __cplusplus
extern "C" {
#endif
#include "ops.h"              // sd_mat
#include "status.h"           // sd_code, sd_status

// w: F32 or BF16 [rows, cols] with a device data pointer; x (T, cols), y (T, rows) device.
// Any T >= 1 (launched in tiles of up to 32 tokens, each weight row read once per tile).
// Each y element is one fixed-order fp32 dot (kernels/common.cuh sd_row_dot): bitwise the same
// for any T, so verify ≡ decode holds on the GPU. Differs from the CPU's order (NMSE-level).
sd_code sd_cuda_linear(const sd_mat *w, const float *x, int T, float *y, cudaStream_t stream, sd_status *st);

#ifdef __cplusplus
}
#endif
