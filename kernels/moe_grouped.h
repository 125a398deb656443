// moe_grouped.h — the routed experts of a prefill piece as two grouped GEMMs, one launch each
// (docs/PREFILL.md): the rows grouped by expert (moe_prefill.h's order), every (row tile, output
// tile) of every expert a block of one launch, so the experts with a handful of rows and those
// with many share the device at once, and nothing goes back to the host between the routing and
// the combine (the tile list is built on the device from the counts).
//
// Precision: BF16 operands on the tensor cores (mma.sync 16×8×16), FP32 accumulation, FP32 out — the
// arithmetic of the cuBLASLt GEMMs it replaces (gemm.h), in its own summation order: within the
// prefill's tolerance of the token path, never bit for bit (docs/PREFILL.md). Deterministic: a
// tile's sums do not depend on the other tiles or on timing.
#pragma once
#include <cuda_runtime_api.h> // cudaStream_t
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif
#include "moe_experts.h" // sd_cuda_expert
#include "status.h"      // sd_code, sd_status

#define SD_MOE_GROUPED_BM 128 // grouped rows per tile: an expert's group is cut into tiles of at most this many

// The most tiles n grouped rows over E experts can make (each expert's last tile may be partial).
static inline int sd_moe_grouped_max_tiles(int n, int E) { return (n + SD_MOE_GROUPED_BM - 1) / SD_MOE_GROUPED_BM + E; }

// From counts (E, device): offsets[e] = the exclusive prefix sum (the scatter's input), and the
// tile list — tiles (3 ints a tile: expert, first grouped row, rows; experts ascending) and
// n_tiles (1 int). tiles holds sd_moe_grouped_max_tiles(n, E) entries.
sd_code sd_cuda_moe_grouped_tiles(const int *counts, int E, int *offsets, int *tiles, int *n_tiles, cudaStream_t stream,
                                  sd_status *st);

typedef enum {
    SD_MOE_GROUPED_UP = 0,   // W rows [gate (Ie) | up (Ie)] of each expert, K = D: y (n, 2·Ie) = [x·gateᵀ | x·upᵀ]
    SD_MOE_GROUPED_DOWN = 1, // W = down (D, Ie), K = Ie: y (n, D) = x·downᵀ
} sd_moe_grouped_op;

// y (rows, N, ld N) = x (rows, K, bf16, ld K) · W_eᵀ for the grouped rows of every tile's expert e,
// W_e read from table[e] (every expert the tiles name must be BF16). N = 2·Ie (UP) or D (DOWN);
// K = D (UP) or Ie (DOWN), a multiple of 8; max_tiles as given to sd_cuda_moe_grouped_tiles.
sd_code sd_cuda_moe_grouped_gemm(sd_moe_grouped_op op, const sd_cuda_expert *table, const int *tiles, const int *n_tiles,
                                 int max_tiles, const uint16_t *x, int N, int K, int Ie, float *y, cudaStream_t stream,
                                 sd_status *st);

#ifdef __cplusplus
}
#endif
