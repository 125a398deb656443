// acceptance.h — step 3 of a speculative round on the GPU: the device twin of engine/accept.c's
// sd_accept_ref (accept.h states the rule). One launch writes (n, bonus) into device memory, so
// a later step on the same stream (a captured graph, say) can consume the accepted count without
// a host round trip; the backend's accept op reads the two ints back.
#pragma once
#include <cuda_runtime_api.h> // cudaStream_t
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif
#include "sampling.h" // sd_dev_draw
#include "status.h"   // sd_code, sd_status

// out[0] = n, out[1] = bonus, bit-identical to sd_accept_ref on the same inputs. All pointers are
// device memory: drafts (k) d_1..d_k in 0..V-1; greedy: top (k+1) argmax p_0..p_k (p, q, work
// unused); sampled (top NULL): p (k+1, V), q (k, V), work (V, the residual; aliases neither).
// Draws at (seed, round, pos_x + i, purpose) as the reference, with the round and pos_x of `at`
// (fixed, or read from device memory at the launch: a captured round). Errors: k < 1 or V < 1.
sd_code sd_cuda_accept(const int *drafts, int k, const int *top, const float *p, const float *q, float *work, int V,
                       uint64_t seed, sd_dev_draw at, int *out, cudaStream_t stream, sd_status *st);

#ifdef __cplusplus
}
#endif
