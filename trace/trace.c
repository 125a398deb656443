// trace.c — levels, phase clocks, level-2 buckets and the two emitted line shapes (trace.h).
#include "trace.h"
#include "chrome.h" // trace_timeline_* (the slices of a timeline, when one is attached)
#include "nvtx.h"   // TRACE_RANGE_PUSH, TRACE_RANGE_POP
#include <ctype.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define TRACE_GENERAL_NAME "SPECDEC_SPEC_TRACE"

// "1" -> 1, "2" -> 2, anything else (NULL, "", "0", " 1", "x") -> 0 (= not set).
static int trace_parse_level(const char *v) {
    if (v && strcmp(v, "1") == 0) return 1;
    if (v && strcmp(v, "2") == 0) return 2;
    return 0;
}

int trace_level_resolve(const char *general, const char *alias, const char *alias_name,
                        char *warn, size_t warn_len) {
    int g = trace_parse_level(general);
    int a = trace_parse_level(alias);
    if (warn && warn_len > 0) warn[0] = 0;
    if (g && a && g != a && warn && warn_len > 0)
        snprintf(warn, warn_len,
                 "[spec-trace] " TRACE_GENERAL_NAME "=%d overrides %s=%d "
                 "(the general flag wins; unset one to silence this)",
                 g, alias_name ? alias_name : "the family alias", a);
    return g ? g : a;
}

// SPECDEC_<FAMILY>_SPEC_TRACE with the family upper-cased (non-alphanumerics become '_').
static void trace_alias_name(const char *family, char *buf, size_t len) {
    size_t n = (size_t)snprintf(buf, len, "SPECDEC_%s_SPEC_TRACE", family);
    for (size_t i = 8; i < n && i < len && buf[i] != 0; i++) {
        unsigned char c = (unsigned char)buf[i];
        buf[i] = isalnum(c) ? (char)toupper(c) : '_';
    }
}

// The environment's level, read and resolved on the first call only (the process's first
// family wins; one engine serves one family).
static int trace_env_level(const char *family) {
    static int cached = -1;
    if (cached >= 0) return cached;
    char alias_name[128] = {0};
    const char *alias = NULL;
    if (family && family[0]) {
        trace_alias_name(family, alias_name, sizeof alias_name);
        alias = getenv(alias_name);
    }
    char warn[256];
    cached = trace_level_resolve(getenv(TRACE_GENERAL_NAME), alias, alias_name, warn, sizeof warn);
    if (warn[0]) fprintf(stderr, "%s\n", warn);
    return cached;
}

int trace_level(const char *family, int cli_level) {
    if (cli_level >= 0 && cli_level <= 2) return cli_level;
    return trace_env_level(family);
}

uint64_t trace_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

// A boundary: drain the backend so the time spent so far is on the clock, then read it.
static uint64_t trace_boundary(const trace_burst *b) {
    if (b->sync) b->sync(b->sync_ctx);
    return trace_now_ns();
}

void trace_burst_begin(trace_burst *b, int level, int k, void (*sync)(void *), void *sync_ctx) {
    memset(b, 0, sizeof *b);
    b->level = level;
    b->k = k;
    b->sync = sync;
    b->sync_ctx = sync_ctx;
    if (level >= 1) b->t_mark = trace_boundary(b);
}

static const char *const phase_names[TRACE_N_PHASES] = {"draft", "verify", "accept", "rollback", "maintenance"};

void trace_phase_begin(trace_phase phase) {
    if (phase >= 0 && phase < TRACE_N_PHASES) TRACE_RANGE_PUSH(phase_names[phase]);
}

void trace_round_begin(trace_burst *b) {
    if (b && b->level >= 1) b->t_mark = trace_boundary(b);
}

void trace_phase_end(trace_burst *b, trace_phase ended) {
    if (ended < 0 || ended >= TRACE_N_PHASES) return;
    TRACE_RANGE_POP();
    if (!b || b->level < 1) return;
    uint64_t now = trace_boundary(b);
    b->phase_ns[ended] += now - b->t_mark;
    if (b->timeline) trace_timeline_phase(b->timeline, ended, (uint32_t)b->acc.rounds, b->t_mark, now);
    b->t_mark = now;
}

void trace_burst_round(trace_burst *b, int n_accepted, int n_emitted) {
    sd_stats_add_round(&b->acc, b->k, n_accepted, n_emitted);
    if (b->timeline) trace_timeline_round(b->timeline, (uint32_t)(b->acc.rounds - 1), n_accepted, n_emitted);
}

void trace_burst_use_events(trace_burst *b, const trace_events *ev) { b->events = ev; }

void trace_burst_use_timeline(trace_burst *b, struct trace_timeline *t) { b->timeline = t; }

// Event mode hands the start event to its stop through the uint64_t the API passes along.
uint64_t trace_bucket_start(trace_burst *b) {
    if (!b || b->level < 2) return 0;
    if (b->events) return (uint64_t)(uintptr_t)b->events->record(b->events->ctx);
    return trace_boundary(b);
}

void trace_bucket_stop(trace_burst *b, trace_bucket which, uint64_t t_start) {
    if (!b || b->level < 2 || which < 0 || which >= TRACE_N_BUCKETS) return;
    if (!b->events) {
        uint64_t now = trace_boundary(b);
        b->bucket_ns[which] += now - t_start;
        if (b->timeline) trace_timeline_bucket(b->timeline, which, (uint32_t)b->acc.rounds, t_start, now - t_start);
        return;
    }
    void *end = b->events->record(b->events->ctx);
    if (!t_start || !end || b->n_pairs == TRACE_MAX_EVENT_PAIRS) {
        b->pairs_lost++;
        return;
    }
    b->pairs[b->n_pairs].a = (void *)(uintptr_t)t_start;
    b->pairs[b->n_pairs].b = end;
    b->pairs[b->n_pairs].which = which;
    b->pairs[b->n_pairs].round = (uint32_t)b->acc.rounds;
    b->n_pairs++;
}

// Adds pairs[0..n) to their buckets and, with a timeline, makes each a slice of its round: it
// starts at the round's verify start plus the device time since the round's first event (the
// phase boundary before verify drained the device, so the clocks meet there).
static void trace_charge_pairs(trace_burst *b, const trace_pair *pairs, int n, uint32_t round_of_all, bool one_round) {
    const trace_events *ev = b->events;
    void *anchor = NULL;
    uint32_t anchor_round = UINT32_MAX;
    for (int i = 0; i < n; i++) {
        const uint64_t dur = (uint64_t)(ev->elapsed_ms(ev->ctx, pairs[i].a, pairs[i].b) * 1e6);
        b->bucket_ns[pairs[i].which] += dur;
        if (!b->timeline) continue;
        const uint32_t round = one_round ? round_of_all : pairs[i].round;
        if (round != anchor_round) {
            anchor = pairs[i].a;
            anchor_round = round;
        }
        const double since = ev->elapsed_ms(ev->ctx, anchor, pairs[i].a);
        const uint64_t t0 = trace_timeline_verify_start(b->timeline, round) + (since > 0 ? (uint64_t)(since * 1e6) : 0);
        trace_timeline_bucket(b->timeline, pairs[i].which, round, t0, dur);
    }
}

void trace_burst_add_pairs(trace_burst *b, const trace_pair *pairs, int n) {
    if (b && b->events) trace_charge_pairs(b, pairs, n, (uint32_t)b->acc.rounds, true);
}

void trace_burst_collect(trace_burst *b) {
    if (!b->events) return;
    if (b->sync) b->sync(b->sync_ctx);
    trace_charge_pairs(b, b->pairs, b->n_pairs, 0, false);
    b->n_pairs = 0;
    b->events->release_all(b->events->ctx);
}

static double trace_ms(uint64_t ns) { return (double)ns / 1e6; }
static double trace_per_round(uint64_t ns, uint64_t rounds) { return (double)ns / 1e6 / (double)rounds; }

// Advances *used past an snprintf of n chars into len bytes: at most to len - 1 (the text is
// cut, never overrun).
static void trace_append(size_t len, size_t *used, int n) {
    if (n < 0) return;
    size_t room = len - *used;
    *used += (size_t)n < room ? (size_t)n : room - 1;
}

size_t trace_burst_format(const trace_burst *b, const char *tag, char *buf, size_t len) {
    if (!buf || len == 0) return 0;
    buf[0] = 0;
    if (!b || b->level < 1 || b->acc.rounds == 0) return 0;
    if (!tag) tag = "spec";
    const uint64_t *ph = b->phase_ns, r = b->acc.rounds;
    uint64_t total = 0;
    for (int i = 0; i < TRACE_N_PHASES; i++) total += ph[i];
    size_t used = 0;
    int n = snprintf(buf, len,
        "[%s-phase] rounds=%llu k=%d total=%.2fms | draft=%.2f verify=%.2f accept=%.2f roll=%.2f "
        "maint=%.2f | per-round ms: draft=%.3f verify=%.3f accept=%.3f roll=%.3f maint=%.3f "
        "total=%.3f\n",
        tag, (unsigned long long)r, b->k, trace_ms(total),
        trace_ms(ph[TRACE_PHASE_DRAFT]), trace_ms(ph[TRACE_PHASE_VERIFY]),
        trace_ms(ph[TRACE_PHASE_ACCEPT]), trace_ms(ph[TRACE_PHASE_ROLL]),
        trace_ms(ph[TRACE_PHASE_MAINT]),
        trace_per_round(ph[TRACE_PHASE_DRAFT], r), trace_per_round(ph[TRACE_PHASE_VERIFY], r),
        trace_per_round(ph[TRACE_PHASE_ACCEPT], r), trace_per_round(ph[TRACE_PHASE_ROLL], r),
        trace_per_round(ph[TRACE_PHASE_MAINT], r), trace_per_round(total, r));
    trace_append(len, &used, n);
    if (b->level < 2) return used;

    // vrest = verify - vkda - vmla, saturating: bucket syncs can make the buckets outgrow
    // the verify phase by a hair; a negative remainder would be noise, not time.
    const uint64_t *bk = b->bucket_ns;
    uint64_t mixers = bk[TRACE_BUCKET_VKDA] + bk[TRACE_BUCKET_VMLA];
    uint64_t verify = ph[TRACE_PHASE_VERIFY];
    uint64_t vrest = verify > mixers ? verify - mixers : 0;
    n = snprintf(buf + used, len - used,
        "[%s-phase-v] rounds=%llu k=%d | per-round ms: vkda=%.3f (scan=%.3f) vmla=%.3f "
        "vrest=%.3f (vffn=%.3f)\n",
        tag, (unsigned long long)r, b->k,
        trace_per_round(bk[TRACE_BUCKET_VKDA], r), trace_per_round(bk[TRACE_BUCKET_SCAN], r),
        trace_per_round(bk[TRACE_BUCKET_VMLA], r), trace_per_round(vrest, r),
        trace_per_round(bk[TRACE_BUCKET_VFFN], r));
    trace_append(len, &used, n);
    return used;
}

void trace_burst_emit(const trace_burst *b, const char *tag, FILE *out) {
    char buf[1024];
    if (trace_burst_format(b, tag, buf, sizeof buf) > 0) {
        fputs(buf, out);
        fflush(out);
    }
}
