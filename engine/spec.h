// spec.h — speculative rounds (MODEL.md "Speculative rounds"): draft → verify → accept →
// rollback → maintenance, greedy or sampled, with the phase trace observing the loop.
#pragma once
#include "generate.h" // sd_gen_control
#include "model.h"  // sd_model, sd_state
#include "sample.h" // sd_accept_stats
#include "trace.h"  // trace_burst

#define SD_SPEC_MAX_K 16

typedef struct {
    int k;             // draft depth, 1..SD_SPEC_MAX_K
    float temperature; // <= 0: greedy; else sampled acceptance at this temperature
    uint64_t seed;     // keys the Philox draws (seed, round, position, purpose)
    trace_burst *trace; // phase clocks (and level-2 buckets in verify); NULL = off
    sd_gen_control *control; // stop ids, stop flag, per-commit callback (generate.h); NULL = none
} sd_spec_opts;

// Generate max_new tokens after the prompt (n_prompt >= 1) into out. Both states must be empty,
// the target's holding n_prompt + max_new + k + 1 positions and max_T >= k + 1, the draft's
// max_T >= k. The draft must share the target's vocabulary. stats accumulates the rounds. With
// o->control the generation may end early (a committed stop id, the stop flag, both checked
// between rounds) and control->n_out says how many tokens out holds.
sd_code sd_spec_generate(const sd_model *target, sd_state *ts, const sd_model *draft, sd_state *ds,
                         const int *prompt, int n_prompt, int max_new, const sd_spec_opts *o,
                         int *out, sd_accept_stats *stats, sd_status *st);
