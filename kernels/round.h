// round.h — the device bookkeeping of a speculative round replayed from a captured graph
// (engine/cuda/door.c): what the host reads back after the round, and what the next round starts
// from, written on the device so no value crosses to the host inside the round.
#pragma once
#include <cuda_runtime_api.h> // cudaStream_t
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif
#include "status.h" // sd_code, sd_status

// After the acceptance wrote out = {n, bonus} (acceptance.h) and the drafts seq[1..k]: pub[0] = n,
// pub[1] = bonus, pub[2 + i] = seq[1 + i] for i < k (pub: pinned, device-mapped host memory);
// then seq[0] = bonus (the next round's x) and *round += 1 (the draws' round counter, philox.h),
// when round is not NULL. k = 0 (a plain decode step): the caller's out is {0, the step's token}
// (the token written there by the step's pick), so pub = {0, token} and seq[0] = token.
sd_code sd_cuda_round_publish(const int *out, int *seq, int k, int *pub, uint32_t *round, cudaStream_t stream,
                              sd_status *st);

#ifdef __cplusplus
}
#endif
