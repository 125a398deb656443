// chrome.h — the Chrome trace-event JSON of a speculative run, the file ui.perfetto.dev and
// chrome://tracing open: one track per model (target, draft) inside one process per device, a
// slice per phase of every round (arguments: round, accepted, k), and the level-2 buckets as
// slices inside verify (scan inside vkda).
//
// A timeline attached to a burst (trace_burst_use_timeline) keeps each phase and bucket as a
// slice whose duration is the very number the burst adds to its total — the same two clock reads
// in drain mode, the same event pair in event mode — so a phase's slices sum to the trace line's
// figure for it. Event mode places a bucket slice at its round's verify start plus the device
// time since the round's first event (trace_burst_collect).
#pragma once
#include <stddef.h>
#include <stdint.h>
#include "status.h" // sd_status
#include "trace.h"  // trace_phase, trace_bucket

typedef struct trace_slice {
    uint64_t t0_ns, dur_ns; // trace_now_ns clock
    uint32_t round;
    int8_t phase;           // trace_phase, or -1 for a bucket slice
    int8_t bucket;          // trace_bucket, or -1 for a phase slice
} trace_slice;

typedef struct trace_round_note {
    uint64_t verify_t0; // when the round's verify phase began
    int accepted, emitted;
} trace_round_note;

typedef struct trace_timeline {
    trace_slice *slices;
    size_t n, cap;
    trace_round_note *rounds;
    size_t n_rounds, cap_rounds;
    size_t lost; // slices not kept for want of memory (the writer names the count)
} trace_timeline;

void trace_timeline_free(trace_timeline *t);

// The recorders trace.c calls.
void trace_timeline_phase(trace_timeline *t, trace_phase p, uint32_t round, uint64_t t0, uint64_t t1);
void trace_timeline_bucket(trace_timeline *t, trace_bucket b, uint32_t round, uint64_t t0, uint64_t dur);
void trace_timeline_round(trace_timeline *t, uint32_t round, int accepted, int emitted);
uint64_t trace_timeline_verify_start(const trace_timeline *t, uint32_t round); // 0 if unknown

// What the tracks are called.
typedef struct trace_chrome_info {
    const char *tag;           // the trace tag (NULL = "spec")
    int k;
    const char *target_device; // e.g. "cpu: AMD EPYC 7B13", "cuda: NVIDIA H200"
    const char *draft_device;  // the same text puts both tracks in one process
} trace_chrome_info;

// Writes the timeline to path atomically (atomic_file.h): {"traceEvents": [...],
// "displayTimeUnit": "ms", "otherData": {...}}, timestamps in µs from the first slice.
sd_code trace_chrome_write(const trace_timeline *t, const trace_chrome_info *info, const char *path, sd_status *st);
