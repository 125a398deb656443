// route_log.h — each rank's routing as its forwards report it (sd_forward_opts.on_route: one
// record per MoE layer and token, in walk order), and the cross-rank verdict: the ranks of a
// group route alike — every record equal bit for bit (sel and w) — or the first record where
// they do not, naming the rank that differs. Routing is replicated, so the ranks must agree
// exactly; a rank that routes otherwise (sd_tp_shard_canary) is caught here.
#pragma once
#include <stdbool.h>
#include <stddef.h>

typedef struct {
    int layer, pos;
    int sel[16];  // the first k used (k <= 16)
    float w[16];
} sd_tp_route;

typedef struct {
    sd_tp_route *v;
    size_t n, cap;
    int k;          // the records' k (0 until the first)
    bool broken;    // out of memory, or a k above 16: the log is unusable
} sd_tp_route_log;

// The on_route callback of sd_forward_opts; route_ctx = the rank's sd_tp_route_log (zeroed).
void sd_tp_route_record(void *log, int layer, int pos, const int *sel, const float *w, int k, float margin);
void sd_tp_route_log_free(sd_tp_route_log *log);

typedef struct {
    bool agree;
    int rank, other;  // disagreeing: `rank` differs from `other` (a rank of the majority when there is one)
    int layer, pos;   // at this record (first in walk order)
    char msg[256];    // one line, e.g. "tp routes: rank 2 differs from rank 0 at layer 3, token 12: sel 4,1 w ... vs ..."
} sd_tp_route_verdict;

// Compare the ranks' logs record by record.
void sd_tp_routes_compare(const sd_tp_route_log *logs, int ranks, sd_tp_route_verdict *v);
