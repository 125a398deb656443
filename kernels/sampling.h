// sampling.h — the sampling numerics of engine/sample.h on the GPU, row-wise over logits in device
// memory; the same operation order as the CPU reference (float throughout, sums in index order).
#pragma once
#include <cuda_runtime_api.h> // cudaStream_t
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif
#include "status.h" // sd_code, sd_status

// out[r] = sd_argmax(x + r·n, n): the first index of the maximum, NaN never wins, all NaN → 0.
// ws: SD_ARGMAX_WS_INTS(rows) ints of device memory (engine/state.h), zero before the first call;
// each call leaves it so. out may be pinned host memory (a device-mapped pointer).
sd_code sd_cuda_argmax(const float *x, int rows, int n, int *out, int *ws, cudaStream_t stream, sd_status *st);

// p[r] = sd_softmax(logits[r], n, temperature): m = max (NaN skipped); e_i = expf((l_i - m)/τ)
// (NaN → 0); s = Σ e_i in index order (one thread: the CPU's float running sum); p_i = e_i·(1/s).
// τ <= 0 (or NaN) or no finite max: one-hot at the argmax. p may alias logits.
sd_code sd_cuda_softmax(const float *logits, int rows, int n, float temperature, float *p, cudaStream_t stream,
                        sd_status *st);

// *out = sd_sample(p, n, u) with u = sd_uniform(seed, round, pos, purpose) drawn on the device
// (philox.h). Both sums run in index order in one thread, as the CPU's.
sd_code sd_cuda_sample(const float *p, int n, uint64_t seed, uint32_t round, uint32_t pos, uint32_t purpose, int *out,
                       cudaStream_t stream, sd_status *st);

// out[r] = sd_sample(p + r·n, n, sd_uniform(seed, round, pos + r, purpose)) for r < rows (out in
// device memory): the draws of a forward's output rows, one thread per row.
sd_code sd_cuda_sample_rows(const float *p, int rows, int n, uint64_t seed, uint32_t round, uint32_t pos,
                            uint32_t purpose, int *out, cudaStream_t stream, sd_status *st);

#ifdef __cplusplus
}
#endif
