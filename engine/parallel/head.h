// head.h — the lm_head of a rank that holds its vocabulary rows [first, first + count) (plan.h),
// done across the split so every rank gets the same answer, and the answer one device gives:
//   - argmaxes alone (greedy): each rank's argmax of its slice as (value, global index), all
//     gathered — 8 bytes a row a rank — and combined in rank order, which is vocabulary order:
//     the first largest value wins (ties: the lower id), NaN never wins, all NaN gives 0. That is
//     sd_argmax of the whole row, bit for bit.
//   - whole rows (logits asked for, or sampling): the slices are gathered into every rank's
//     whole rows (no arithmetic), so the softmax and the Philox draw run on the same row as on
//     one device, in sample.h's order (the sampling and the acceptance need whole rows: p(d) and
//     the residual's sum run over every id).
#pragma once
#include "comm.h"   // sd_comm
#include "tensor.h" // sd_mat

// One row's argmax on one rank: index -1 when the rank has no candidate (no rows, or all NaN).
typedef struct {
    float value;
    int index; // global vocabulary id
} sd_tp_argmax;

// The whole row's argmax from the ranks' local ones, in rank order (the rule above).
int sd_tp_argmax_combine(const sd_tp_argmax *local, int ranks);

// The head on this rank for n rows of normed input a (n × D): its slice's logits
// (head_rows · a), then whole into `full` (n × V; NULL: not wanted) and/or the argmax of every
// whole row into `argmax` (NULL: not wanted). Two collectives at most, the same on every rank.
sd_code sd_tp_head(sd_comm *c, const sd_mat *head_rows, const float *a, int n, int V, float *full, int *argmax,
                   sd_status *st);
