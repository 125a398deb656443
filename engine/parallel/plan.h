// plan.h — who holds what in a tensor-parallel group of N ranks (docs/PARALLEL.md): KDA and MLA
// heads, the dense and shared-expert intermediate columns, the routed experts and the lm_head's
// vocabulary rows, each split into N contiguous ranges in rank order. A count that does not
// divide by N is split as evenly as possible: the first (count mod N) ranks hold one more, and a
// rank may hold none of a kind. Pure data, the same for every backend: a CPU rank and a device
// rank of the same plan hold the same slices.
#pragma once
#include <stddef.h>
#include "config.h" // sd_config

#define SD_TP_MAX_RANKS 64

typedef struct {
    int first, count; // [first, first + count)
} sd_tp_range;

// One rank's share of each split kind.
typedef struct {
    sd_tp_range kda_heads, mla_heads; // of Hk, Hm
    sd_tp_range dense;                // of the dense MLP's I columns
    sd_tp_range shared;               // of the shared experts' S·Ie columns
    sd_tp_range experts;              // of the E routed experts
    sd_tp_range vocab;                // of the V lm_head rows
} sd_tp_share;

typedef struct sd_tp_plan {
    int ranks;
    int vocab_max;                    // the largest vocab.count: the head gathers pad to it
    sd_tp_share rank[SD_TP_MAX_RANKS];
} sd_tp_plan;

// The even split of n items over `ranks`: rank r holds n/ranks + (r < n % ranks ? 1 : 0), after
// the ranks before it.
sd_tp_range sd_tp_split(int n, int ranks, int rank);

// The plan of cfg (a whole model's config) over `ranks` ranks, 1..SD_TP_MAX_RANKS. Never refuses
// a count for not dividing.
sd_code sd_tp_plan_make(const sd_config *cfg, int ranks, sd_tp_plan *p, sd_status *st);

// One line naming every rank's share, for receipts and --json: "3 ranks: r0 kda 0-1 mla 0-1
// dense 0-15 shared 0-4 experts 0-2 vocab 0-22; r1 ..." (an empty range prints as "-").
void sd_tp_plan_describe(const sd_tp_plan *p, char *buf, size_t len);
