// trace_rounds.h — a burst timed for real, for the trace suites: one round ticks the five
// phases and, per layer, the level-2 buckets nested inside verify (scan inside vkda) as the layer
// walk does.
#pragma once
#include "trace.h"

static inline void spin_us(uint64_t us) {
    uint64_t t0 = trace_now_ns();
    while (trace_now_ns() - t0 < us * 1000) {}
}

// One round of three layers; the round loop's count: `accepted` of k, accepted + 1 emitted.
static inline void run_round(trace_burst *b, int accepted) {
    spin_us(200);
    trace_phase_end(b, TRACE_PHASE_DRAFT);
    for (int layer = 0; layer < 3; layer++) {
        uint64_t t = trace_bucket_start(b);
        spin_us(50);
        uint64_t ts = trace_bucket_start(b);
        spin_us(100);
        trace_bucket_stop(b, TRACE_BUCKET_SCAN, ts);
        trace_bucket_stop(b, TRACE_BUCKET_VKDA, t);
        t = trace_bucket_start(b);
        spin_us(80);
        trace_bucket_stop(b, TRACE_BUCKET_VMLA, t);
        spin_us(20); // glue
        t = trace_bucket_start(b);
        spin_us(60);
        trace_bucket_stop(b, TRACE_BUCKET_VFFN, t);
    }
    trace_phase_end(b, TRACE_PHASE_VERIFY);
    spin_us(30);
    trace_phase_end(b, TRACE_PHASE_ACCEPT);
    spin_us(20);
    trace_phase_end(b, TRACE_PHASE_ROLL);
    spin_us(40);
    trace_phase_end(b, TRACE_PHASE_MAINT);
    trace_burst_round(b, accepted, accepted + 1);
}
