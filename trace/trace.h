// trace.h — the phase trace of speculative rounds (DESIGN.md "Trace lines").
//
// Level 0: off (no clock read, no lock on the hot path: every hook is behind a NULL check).
// Level 1: per burst (= one generation call), the five phases; each boundary synchronises
//          the backend first so device time lands in the phase that spent it. Shares, not walls.
// Level 2: plus the verify sub-split, ticked from inside the verify pass's layer walk:
//          vkda (scan inside it), vmla, vffn; vrest = verify - vkda - vmla, vffn inside vrest.
#pragma once
#include <stdint.h>
#include <stdio.h>
#include <stddef.h>
#include "sample.h" // sd_accept_stats

struct trace_timeline; // chrome.h

typedef enum {
    TRACE_PHASE_DRAFT = 0,
    TRACE_PHASE_VERIFY,
    TRACE_PHASE_ACCEPT,
    TRACE_PHASE_ROLL,
    TRACE_PHASE_MAINT,
    TRACE_N_PHASES
} trace_phase;

typedef enum {
    TRACE_BUCKET_VKDA = 0, // KDA mixer calls of the verify pass
    TRACE_BUCKET_SCAN,     // the sequential recurrence inside them
    TRACE_BUCKET_VMLA,     // MLA mixer calls of the verify pass
    TRACE_BUCKET_VFFN,     // dense, MoE and shared-expert FFN calls of the verify pass
    TRACE_N_BUCKETS
} trace_bucket;

// Pure level resolution (unit-tested without touching the environment). Each value is "1",
// "2", or anything else (= not set; "0" is not a level). Either alone is honoured; both valid
// and different: the general one wins and one line naming both is written to `warn` (else
// warn[0] = 0), the alias named by `alias_name` (e.g. "SPECDEC_KIMI_LINEAR_SPEC_TRACE"; NULL
// writes "the family alias"). A junk general value never masks a valid alias.
int trace_level_resolve(const char *general, const char *alias, const char *alias_name,
                        char *warn, size_t warn_len);

// The process's level: SPECDEC_SPEC_TRACE and SPECDEC_<FAMILY>_SPEC_TRACE (family = model_type
// upper-cased, e.g. KIMI_LINEAR; NULL = no alias), read and resolved once per process (the
// warning, if any, printed once to stderr). cli_level 0, 1 or 2 (the CLI's --trace) overrides
// the environment, which is then not read; -1 = not given.
int trace_level(const char *family, int cli_level);

// Monotonic nanoseconds.
uint64_t trace_now_ns(void);

// Event mode of the level-2 buckets: instead of draining the device around every mixer and FFN
// call, a backend records timing events on its stream there and the burst sums their elapsed
// times once, after a drain (trace_burst_collect). The phases still drain at their boundaries.
typedef struct trace_events {
    void *(*record)(void *ctx);                       // an event recorded now; NULL when out
    double (*elapsed_ms)(void *ctx, void *a, void *b); // after a drain
    void (*release_all)(void *ctx);                    // every event back to the pool
    void *ctx;
} trace_events;

#define TRACE_MAX_EVENT_PAIRS 4096

// One level-2 bucket's start and stop events (event mode).
typedef struct {
    void *a, *b;
    trace_bucket which;
    uint32_t round; // the burst's round it was recorded in (the Chrome trace places it there)
} trace_pair;

// One burst's clocks and counts. Filled by the round loop (phases, acceptance) and by the
// verify layer walk (buckets).
typedef struct trace_burst {
    int level;
    int k;
    sd_accept_stats acc;                 // the burst's rounds (acc.rounds) and acceptance counts
    uint64_t phase_ns[TRACE_N_PHASES];
    uint64_t bucket_ns[TRACE_N_BUCKETS];
    uint64_t t_mark;                     // the last boundary's clock
    void (*sync)(void *ctx);             // drains the backend; NULL = nothing to drain (CPU)
    void *sync_ctx;
    const trace_events *events;          // level-2 event mode (NULL: drain and read the clock)
    trace_pair pairs[TRACE_MAX_EVENT_PAIRS];
    int n_pairs, pairs_lost;             // recorded pairs; pairs the pool could not time
    struct trace_timeline *timeline;     // every phase and bucket as a slice (chrome.h); NULL = none
} trace_burst;

// Start a burst (drains the accumulators; reads the clock when level >= 1).
void trace_burst_begin(trace_burst *b, int level, int k, void (*sync)(void *), void *sync_ctx);
// A round starts: at level >= 1 the backend is drained and the clock marked, so what ran since
// the last phase ended — the prefill, the loop's bookkeeping between rounds, a graph capture — is
// charged to no phase. The five phases of a round then sum to the round's time.
void trace_round_begin(trace_burst *b);
// A phase opens its NVTX range ("draft", "verify", ...) at every level, so a profile shows the
// round's structure even with the trace off.
void trace_phase_begin(trace_phase phase);
// Phase boundary: close the phase's NVTX range; at level >= 1 also sync the backend, read the
// clock and charge the time since the last mark to `ended`.
void trace_phase_end(trace_burst *b, trace_phase ended);

// The round loop's count of one finished round: n_accepted of k drafts accepted, n_emitted
// tokens committed (sd_stats_add_round on b->acc; the timeline notes the round's acceptance).
void trace_burst_round(trace_burst *b, int n_accepted, int n_emitted);

// Switch a burst's level-2 buckets to event mode (call right after trace_burst_begin).
void trace_burst_use_events(trace_burst *b, const trace_events *ev);
// Keep every phase and bucket of the burst as a slice in t (chrome.h; right after begin).
void trace_burst_use_timeline(trace_burst *b, struct trace_timeline *t);
// Event mode: drain, add every recorded pair's elapsed time to its bucket (and, with a
// timeline, make it a slice of that duration), release the events. Call at the end of the
// burst, before emitting. A no-op in drain mode.
void trace_burst_collect(trace_burst *b);

// Event mode, after a drain: adds the elapsed times of n pairs to their buckets (and, with a
// timeline, their slices to the current round) — the pairs recorded while a graph was captured,
// which every replay records again; the caller keeps them.
void trace_burst_add_pairs(trace_burst *b, const trace_pair *pairs, int n);

// Level-2 bucket timing around one call inside the verify walk. Usage:
//   uint64_t t = trace_bucket_start(b);  ...call...  trace_bucket_stop(b, TRACE_BUCKET_VKDA, t);
// Drain mode: both sync the backend and read the clock. Event mode: both record an event and
// nothing waits. Both are no-ops (return 0) unless b && b->level >= 2.
uint64_t trace_bucket_start(trace_burst *b);
void trace_bucket_stop(trace_burst *b, trace_bucket which, uint64_t t_start);

// The two line shapes of DESIGN.md, TAG = tag ("spec" by default). Level 1 writes the phase
// line; level 2 adds the -v line. Nothing at level 0 or with rounds == 0.
void trace_burst_emit(const trace_burst *b, const char *tag, FILE *out);
// The same text into a buffer (for tests and receipts); returns the length written.
size_t trace_burst_format(const trace_burst *b, const char *tag, char *buf, size_t len);
