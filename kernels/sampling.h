// sampling.h — the sampling numerics of engine/sample.h on the GPU, row-wise over logits in device
// memory; the same operation order as the CPU reference (float throughout, sums in index order).
#pragma once
#include <cuda_runtime_api.h> // cudaStream_t
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif
#include "cursor.h" // sd_dev_pos
#include "status.h" // sd_code, sd_status

// Where a draw's round and position come from (philox.h: u = sd_uniform(seed, round, pos,
// purpose)): fixed values, or device memory that a captured graph reads at every replay — the
// round from *round_dev, the position sd_pos_read(pos) (a state's cursor plus an offset).
typedef struct {
    const uint32_t *round_dev; // NULL: `round`
    uint32_t round;
    sd_dev_pos pos;
} sd_dev_draw;

// A draw at fixed values (a host-known round and position).
static inline sd_dev_draw sd_draw_fixed(uint32_t round, uint32_t pos) {
    sd_dev_draw d = {0, round, {0, (int)pos}};
    return d;
}

// The most slices the argmax cuts a row into, and its workspace: per row a ticket, then a value and
// an index per slice.
#define SD_ARGMAX_SLICES 64
#define SD_ARGMAX_WS_INTS(rows) ((size_t)(rows) * (2 * SD_ARGMAX_SLICES + 1))

// out[r] = sd_argmax(x + r·n, n): the first index of the maximum, NaN never wins, all NaN → 0.
// ws: SD_ARGMAX_WS_INTS(rows) ints of device memory, zero before the first call; each call leaves
// it so. out may be pinned host memory (a device-mapped pointer).
sd_code sd_cuda_argmax(const float *x, int rows, int n, int *out, int *ws, cudaStream_t stream, sd_status *st);

// p[r] = sd_softmax(logits[r], n, temperature): m = max (NaN skipped); e_i = expf((l_i - m)/τ)
// (NaN → 0); s = Σ e_i in index order (one thread: the CPU's float running sum); p_i = e_i·(1/s).
// τ <= 0 (or NaN) or no finite max: one-hot at the argmax. p may alias logits.
sd_code sd_cuda_softmax(const float *logits, int rows, int n, float temperature, float *p, cudaStream_t stream,
                        sd_status *st);

// out[r] = sd_sample(p + r·n, n, sd_uniform(seed, round, pos + r, purpose)) for r < rows, with the
// round and pos of `at` (out in device or pinned memory): the draws of a forward's output rows, one
// thread per row, both sums in index order as the CPU's.
sd_code sd_cuda_sample_rows(const float *p, int rows, int n, uint64_t seed, sd_dev_draw at, uint32_t purpose, int *out,
                            cudaStream_t stream, sd_status *st);

#ifdef __cplusplus
}
#endif
