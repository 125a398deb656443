// chrome.c — a burst's timeline and its Chrome trace-event JSON (chrome.h).
#include "chrome.h"
#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include "atomic_file.h" // sd_atomic_open, sd_atomic_commit

static const char *const slice_phase_names[TRACE_N_PHASES] = {"draft", "verify", "accept", "rollback", "maintenance"};
static const char *const slice_bucket_names[TRACE_N_BUCKETS] = {"vkda", "scan", "vmla", "vffn"};
// Drafting and the draft's catch-up run on the draft model; verify, accept and rollback on the target.
static const bool phase_on_draft[TRACE_N_PHASES] = {true, false, false, false, true};

enum { TID_TARGET = 1, TID_DRAFT = 2 };

// ---------------------------------------------------------------------------------------------
// recording

void trace_timeline_free(trace_timeline *t) {
    if (!t) return;
    free(t->slices);
    free(t->rounds);
    memset(t, 0, sizeof *t);
}

// Room for one more of elem bytes at index n of *p (capacity *cap); false when out of memory.
static bool reserve(void **p, size_t *cap, size_t n, size_t elem) {
    if (n < *cap) return true;
    size_t want = *cap ? 2 * *cap : 1024;
    while (want <= n) want *= 2;
    void *g = realloc(*p, want * elem);
    if (!g) return false;
    memset((char *)g + *cap * elem, 0, (want - *cap) * elem);
    *p = g;
    *cap = want;
    return true;
}

static void push(trace_timeline *t, trace_slice s) {
    if (!reserve((void **)&t->slices, &t->cap, t->n, sizeof *t->slices)) { t->lost++; return; }
    t->slices[t->n++] = s;
}

static trace_round_note *note_of(trace_timeline *t, uint32_t round) {
    if (!reserve((void **)&t->rounds, &t->cap_rounds, round, sizeof *t->rounds)) return NULL;
    if (round >= t->n_rounds) t->n_rounds = (size_t)round + 1;
    return &t->rounds[round];
}

void trace_timeline_phase(trace_timeline *t, trace_phase p, uint32_t round, uint64_t t0, uint64_t t1) {
    push(t, (trace_slice){.t0_ns = t0, .dur_ns = t1 - t0, .round = round, .phase = (int8_t)p, .bucket = -1});
    trace_round_note *n = p == TRACE_PHASE_VERIFY ? note_of(t, round) : NULL;
    if (n) n->verify_t0 = t0;
}

void trace_timeline_bucket(trace_timeline *t, trace_bucket b, uint32_t round, uint64_t t0, uint64_t dur) {
    push(t, (trace_slice){.t0_ns = t0, .dur_ns = dur, .round = round, .phase = -1, .bucket = (int8_t)b});
}

void trace_timeline_round(trace_timeline *t, uint32_t round, int accepted, int emitted) {
    trace_round_note *n = note_of(t, round);
    if (!n) return;
    n->accepted = accepted;
    n->emitted = emitted;
}

uint64_t trace_timeline_verify_start(const trace_timeline *t, uint32_t round) {
    return round < t->n_rounds ? t->rounds[round].verify_t0 : 0;
}

// ---------------------------------------------------------------------------------------------
// writing

// Earlier first; at one start the longer (the enclosing slice) first, so viewers nest correctly.
static int by_start(const void *pa, const void *pb) {
    const trace_slice *a = pa, *b = pb;
    if (a->t0_ns != b->t0_ns) return a->t0_ns < b->t0_ns ? -1 : 1;
    if (a->dur_ns != b->dur_ns) return a->dur_ns > b->dur_ns ? -1 : 1;
    return 0;
}

// Microseconds with nanosecond digits, exactly as printed (no binary-float noise).
static void add_us(cJSON *o, const char *key, uint64_t ns) {
    char buf[32];
    snprintf(buf, sizeof buf, "%llu.%03llu", (unsigned long long)(ns / 1000), (unsigned long long)(ns % 1000));
    cJSON_AddRawToObject(o, key, buf);
}

static bool put_event(FILE *f, cJSON *e, bool *first) {
    char *txt = e ? cJSON_PrintUnformatted(e) : NULL;
    cJSON_Delete(e);
    if (!txt) return false;
    fprintf(f, "%s\n%s", *first ? "" : ",", txt);
    *first = false;
    cJSON_free(txt);
    return true;
}

static cJSON *meta_event(const char *what, int pid, int tid, const char *key, const char *name, int sort) {
    cJSON *e = cJSON_CreateObject(), *args = cJSON_CreateObject();
    cJSON_AddStringToObject(e, "name", what);
    cJSON_AddStringToObject(e, "ph", "M");
    cJSON_AddNumberToObject(e, "pid", pid);
    cJSON_AddNumberToObject(e, "tid", tid);
    if (name) cJSON_AddStringToObject(args, key, name);
    else cJSON_AddNumberToObject(args, key, sort);
    cJSON_AddItemToObject(e, "args", args);
    return e;
}

static cJSON *slice_event(const trace_timeline *t, const trace_slice *s, uint64_t origin, int k, int pid_draft) {
    const bool is_phase = s->phase >= 0;
    const bool draft = is_phase && phase_on_draft[s->phase];
    cJSON *e = cJSON_CreateObject(), *args = cJSON_CreateObject();
    cJSON_AddStringToObject(e, "name", is_phase ? slice_phase_names[s->phase] : slice_bucket_names[s->bucket]);
    cJSON_AddStringToObject(e, "cat", is_phase ? "phase" : "verify-bucket");
    cJSON_AddStringToObject(e, "ph", "X");
    add_us(e, "ts", s->t0_ns - origin);
    add_us(e, "dur", s->dur_ns);
    cJSON_AddNumberToObject(e, "pid", draft ? pid_draft : 1);
    cJSON_AddNumberToObject(e, "tid", draft ? TID_DRAFT : TID_TARGET);
    cJSON_AddNumberToObject(args, "round", s->round);
    if (is_phase && s->round < t->n_rounds) {
        cJSON_AddNumberToObject(args, "accepted", t->rounds[s->round].accepted);
        cJSON_AddNumberToObject(args, "k", k);
    }
    cJSON_AddItemToObject(e, "args", args);
    return e;
}

static bool write_events(FILE *f, const trace_timeline *t, const trace_slice *sorted, const trace_chrome_info *info) {
    const char *td = info->target_device ? info->target_device : "target device";
    const char *dd = info->draft_device ? info->draft_device : td;
    const int pid_draft = strcmp(td, dd) == 0 ? 1 : 2;
    bool first = true, ok = true;
    ok = ok && put_event(f, meta_event("process_name", 1, TID_TARGET, "name", td, 0), &first);
    if (pid_draft != 1) ok = ok && put_event(f, meta_event("process_name", pid_draft, TID_DRAFT, "name", dd, 0), &first);
    ok = ok && put_event(f, meta_event("thread_name", 1, TID_TARGET, "name", "target", 0), &first);
    ok = ok && put_event(f, meta_event("thread_name", pid_draft, TID_DRAFT, "name", "draft", 0), &first);
    ok = ok && put_event(f, meta_event("thread_sort_index", 1, TID_TARGET, "sort_index", NULL, 0), &first);
    ok = ok && put_event(f, meta_event("thread_sort_index", pid_draft, TID_DRAFT, "sort_index", NULL, 1), &first);
    const uint64_t origin = t->n ? sorted[0].t0_ns : 0;
    for (size_t i = 0; ok && i < t->n; i++) ok = put_event(f, slice_event(t, &sorted[i], origin, info->k, pid_draft), &first);
    return ok;
}

static char *other_data(const trace_timeline *t, const trace_chrome_info *info) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "producer", "specdec");
    cJSON_AddStringToObject(o, "tag", info->tag ? info->tag : "spec");
    cJSON_AddNumberToObject(o, "k", info->k);
    cJSON_AddNumberToObject(o, "rounds", (double)t->n_rounds);
    cJSON_AddNumberToObject(o, "slices", (double)t->n);
    cJSON_AddNumberToObject(o, "slices_lost", (double)t->lost);
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return s;
}

sd_code trace_chrome_write(const trace_timeline *t, const trace_chrome_info *info, const char *path, sd_status *st) {
    trace_slice *sorted = malloc((t->n ? t->n : 1) * sizeof *sorted);
    char *other = other_data(t, info);
    if (!sorted || !other) {
        free(sorted);
        cJSON_free(other);
        return sd_fail(st, SD_ERR_SYS, "%s: out of memory for %zu trace slices", path, t->n);
    }
    if (t->n) memcpy(sorted, t->slices, t->n * sizeof *sorted);
    qsort(sorted, t->n, sizeof *sorted, by_start);
    sd_atomic_file af;
    sd_code rc = sd_atomic_open(&af, path, st);
    if (!rc) {
        fprintf(af.f, "{\"displayTimeUnit\":\"ms\",\"otherData\":%s,\"traceEvents\":[", other);
        bool ok = write_events(af.f, t, sorted, info);
        fputs("\n]}\n", af.f);
        if (ok) rc = sd_atomic_commit(&af, st);
        else {
            sd_atomic_abort(&af);
            rc = sd_fail(st, SD_ERR_SYS, "%s: out of memory writing the trace", path);
        }
    }
    free(sorted);
    cJSON_free(other);
    return rc;
}
