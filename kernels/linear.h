// linear.h — y[t, o] = W[o] · x[t] on the GPU (the CPU op: sd_linear in engine/cpu/ops.h), alone
// or as several Linears in ONE launch (the projections that read the same input, a SwiGLU pair
// with its activation, an output projection that adds into the residual stream).
#pragma once
#include <cuda_runtime_api.h> // cudaStream_t
#include <stdbool.h>

#ifdef __cplusplus
extern "C" {
#endif
#include "tensor.h"              // sd_mat
#include "status.h"           // sd_code, sd_status

// w: F32 or BF16 [rows, cols] with a device data pointer; x (T, cols), y (T, rows) device.
// Any T >= 1 (launched in tiles of up to 32 tokens, each weight row read once per tile).
// Each y element is one fixed-order fp32 dot (kernels/linear.cuh): bitwise the same for any T,
// so verify ≡ decode holds on the GPU. Differs from the CPU's order (NMSE-level).
sd_code sd_cuda_linear(const sd_mat *w, const float *x, int T, float *y, cudaStream_t stream, sd_status *st);

typedef enum {
    SD_LIN_STORE = 0,  // y[t·ldy + o] = w[o]·x_t
    SD_LIN_ADD = 1,    // y[t·ldy + o] += w[o]·x_t (a residual writer: the add fused)
    SD_LIN_SWIGLU = 2, // y[t·ldy + o] = silu(w[o]·x_t) · (w2[o]·x_t) (gate = w, up = w2, same shape)
} sd_lin_mode;

// One Linear of a multi-launch; x (T, ldx) with ldx >= cols, y (T, ldy) with ldy >= rows.
typedef struct {
    const sd_mat *w;
    const sd_mat *w2; // SD_LIN_SWIGLU only
    const float *x;
    int ldx;
    float *y;
    int ldy;
    sd_lin_mode mode;
    int *flag; // STORE/ADD: an output written that is not finite sets this non-finite flag to site
    int site;  //   (finite.h), when lower; NULL: no check (the head's logits use it)
} sd_lin_job;

// Every job over the same T tokens in one launch (per 8 jobs and 32-token tile); each output
// element has the order of sd_cuda_linear's, and SWIGLU's product is silu(g)·u in fp32 (common.cuh's
// sd_dev_silu: the CPU's sd_silu with the device expf).
// Jobs must not write what another job of the call reads.
sd_code sd_cuda_linear_multi(const sd_lin_job *jobs, int n_jobs, int T, cudaStream_t stream, sd_status *st);

// The RMSNorm that produces the jobs' input: out (T, n) = rmsnorm(x (T, n), w, eps). With flag,
// a row of x that is not finite sets the forward's non-finite flag to site (finite.h), when
// lower: the norm reads every element of the residual stream anyway, so the check costs nothing.
typedef struct {
    const float *x;
    const float *w;
    float eps;
    int n;
    float *out;
    int *flag; // NULL: no check
    int site;
} sd_lin_norm;

// sd_cuda_rmsnorm(norm) then sd_cuda_linear_multi(jobs), bit for bit, in ONE launch when the T
// normed rows fit in shared memory (T <= 2): every block recomputes them with rows.cuh's
// sd_block_rmsnorm (the same function and block size as sd_cuda_rmsnorm) while its weight rows
// stream in, block 0 writes norm->out, and jobs whose x is norm->out read the shared copy. No
// job may write norm->x.
sd_code sd_cuda_linear_multi_norm(const sd_lin_job *jobs, int n_jobs, int T, const sd_lin_norm *norm,
                                  cudaStream_t stream, sd_status *st);

#ifdef __cplusplus
}
#endif
