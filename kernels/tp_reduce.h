// tp_reduce.h — the sum of a device rank's all-reduce (docs/PARALLEL.md): after an all-gather of
// every rank's partial, the ranks' rows added in rank order — the GPU twin of engine/parallel/
// comm.h's sd_comm_sum_ranks, bit for bit (the same order, no FMA). An element's order depends on
// the number of ranks only, never on how many rows share the message, so a row reduced alone
// (a decode step) and inside a (k+1)-row verify get the same bits.
#pragma once
#include <cuda_runtime_api.h> // cudaStream_t
#include <stdbool.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif
#include "status.h" // sd_code, sd_status

// s[i] = ((g[i] + g[n + i]) + g[2n + i]) + ... over `ranks` slices of n floats laid one after
// another (device memory); out[i] = s[i], or with accumulate out[i] = out[i] + s[i] (the
// residual add: h + all_reduce(partial), two roundings as on the CPU). out must not overlap g
// unless it is g's first slice and not accumulate.
sd_code sd_cuda_tp_reduce(const float *g, int ranks, size_t n, float *out, bool accumulate, cudaStream_t stream,
                          sd_status *st);

#ifdef __cplusplus
}
#endif
