// tp_head.h — the lm_head of a device rank that holds vocabulary rows [first, first + count)
// (docs/PARALLEL.md "The head"; the CPU's: engine/parallel/head.h), in the pieces around its
// all-gathers:
//   argmaxes alone: each row's argmax of the slice as a (value, global id) pair; after the
//                   all-gather of every rank's pairs, the combine in rank order (vocabulary
//                   order): the first largest value wins — ties to the lower id — NaN never wins,
//                   all NaN gives 0: sd_argmax of the whole row, bit for bit;
//   whole rows:     after the all-gather of every rank's n × count slice (each rank's block
//                   padded to the same size), the slices laid into whole n × V rows (no
//                   arithmetic).
#pragma once
#include <cuda_runtime_api.h> // cudaStream_t
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif
#include "status.h" // sd_code, sd_status

#define SD_CUDA_TP_MAX_RANKS 64 // engine/parallel/plan.h's SD_TP_MAX_RANKS

// One row's argmax on one rank: index -1 when the rank has no candidate (no rows, or all NaN).
// The layout of engine/parallel/head.h's sd_tp_argmax.
typedef struct sd_cuda_tp_pick {
    float value;
    int index; // global vocabulary id
} sd_cuda_tp_pick;

// Every rank's vocabulary range, in rank order.
typedef struct {
    int ranks;
    int first[SD_CUDA_TP_MAX_RANKS], count[SD_CUDA_TP_MAX_RANKS];
} sd_cuda_tp_vocab;

// out[t] = the pair of row t of `logits` (n rows of `count` floats, device memory) whose local
// argmax is idx[t] (sd_cuda_argmax's): {logits[t][idx[t]], first + idx[t]}, or {NaN, -1} when
// that value is NaN or count is 0 (idx is then not read).
sd_code sd_cuda_tp_argmax_pairs(const float *logits, int n, int count, int first, const int *idx, sd_cuda_tp_pick *out,
                                cudaStream_t stream, sd_status *st);

// out[t] = the combined argmax of row t over all[r · n + t], r in rank order (the rule above);
// out may be pinned host memory (device-mapped).
sd_code sd_cuda_tp_argmax_combine(const sd_cuda_tp_pick *all, int ranks, int n, int *out, cudaStream_t stream,
                                  sd_status *st);

// out (n × V) from g: rank r's block at r · block floats holds its n × count_r slice, row t at
// t · count_r; out[t · V + first_r + i] = that slice's [t][i].
sd_code sd_cuda_tp_lay_rows(const float *g, const sd_cuda_tp_vocab *v, int n, size_t block, int V, float *out,
                            cudaStream_t stream, sd_status *st);

#ifdef __cplusplus
}
#endif
