// run_ledger.h — SPECDEC_GRAPH_SEL_LEDGER=1 on `specdec run --graph`: the selection ledger's
// device recorder armed inside the door's graphs, its slots drained after every round or step
// and checked: every MoE layer's slot must hold a routing of every token the forward ran (an
// unwritten entry reads as expert -1). It measures what arming the ledger costs a real run and
// proves the recorder fires in every graph; the comparison against the eager host oracle is
// `specdec gate graph-sel`'s.
#pragma once
#include "ledger.h" // ledger
#include "model.h"  // sd_model

typedef struct {
    ledger L;
    int dev, K;
    size_t rows, unwritten; // rows drained; of them, rows with an expert -1
    int first_layer, first_pos; // the first unwritten row
    sd_code failed;             // a drain error (reported by run_ledger_finish)
    sd_status st;
} run_ledger;

// Armed, on the target's device (the slots are pre-armed by the door before it captures).
void run_ledger_init(run_ledger *r, const sd_model *target);
// The door's after_target: drain, check, refill the sentinel.
void run_ledger_after_target(void *ctx, int pos0, int T);
// The verdict: an error naming the first unwritten (layer, token), or a drain's error.
sd_code run_ledger_finish(const run_ledger *r, sd_status *st);
void run_ledger_free(run_ledger *r);
