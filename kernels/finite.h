// finite.h — the non-finite flag of a forward (engine/model.h "Non-finite activations"): one
// device int that the check launches at each sublayer end lower, with atomicMin, to the site of
// the first NaN or Inf they see. Both launches write a fixed address, so they are capture-safe;
// the flag is read after the forward (or the replayed graph) drains, never scanned by the host.
#pragma once
#include <cuda_runtime_api.h> // cudaStream_t
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif
#include "status.h" // sd_code, sd_status

// *flag = SD_NONFINITE_NONE (INT_MAX): the start of a forward.
sd_code sd_cuda_finite_reset(int *flag, cudaStream_t stream, sd_status *st);
// *flag = min(*flag, site) when any of x[0..n) is a NaN or an Inf.
sd_code sd_cuda_finite_check(const float *x, size_t n, int site, int *flag, cudaStream_t stream, sd_status *st);

#ifdef __cplusplus
}
#endif
