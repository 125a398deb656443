// receipt.c — receipts: atomic JSONL writer, trace-log parser, JSONL loader (the compare is in
// receipt_compare.c).
#include "receipt.h"
#include <cjson/cJSON.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "atomic_file.h" // sd_atomic_open, sd_atomic_commit
#include "file_open.h"   // sd_fopen_regular
#include "metrics.h"     // trace_metrics_add_vllm

static const char *const receipt_phase_names[TRACE_N_PHASES] = {
    "draft", "verify", "accept", "roll", "maint"};
static const char *const receipt_phase_ms_keys[TRACE_N_PHASES] = {
    "draft_ms", "verify_ms", "accept_ms", "roll_ms", "maint_ms"};
static const char *const receipt_bucket_names[TRACE_N_BUCKETS] = {"vkda", "scan", "vmla", "vffn"};

// ---------------------------------------------------------------------------------------------
// sets and files

void receipt_set_free(receipt_set *s) {
    if (!s) return;
    free(s->bursts);
    free(s->env_json);
    memset(s, 0, sizeof *s);
}

static sd_code receipt_set_push(receipt_set *s, const receipt_burst *r, sd_status *st) {
    if (s->n == s->cap) {
        size_t cap = s->cap ? 2 * s->cap : 16;
        receipt_burst *p = realloc(s->bursts, cap * sizeof *p);
        if (!p) return sd_fail(st, SD_ERR_SYS, "receipt: out of memory (%zu bursts)", cap);
        s->bursts = p;
        s->cap = cap;
    }
    s->bursts[s->n++] = *r;
    return SD_OK;
}

static sd_code receipt_read_file(const char *path, char **text, sd_status *st) {
    FILE *f = sd_fopen_regular(path, st); // a FIFO must not block `receipt parse` or `compare`
    if (!f) return st->code;
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    while (buf) {
        n += fread(buf + n, 1, cap - 1 - n, f);
        if (n < cap - 1) break;
        char *p = realloc(buf, cap * 2);
        if (!p) { free(buf); buf = NULL; break; }
        buf = p;
        cap *= 2;
    }
    int err = ferror(f);
    fclose(f);
    if (!buf) return sd_fail(st, SD_ERR_SYS, "%s: out of memory reading the file", path);
    if (err) { free(buf); return sd_fail(st, SD_ERR_SYS, "%s: read error", path); }
    buf[n] = 0;
    if (strlen(buf) != n) {
        free(buf);
        return sd_fail(st, SD_ERR_DATA, "%s: binary data (NUL byte), not a trace log or receipt", path);
    }
    *text = buf;
    return SD_OK;
}

// Splits a mutable text in place: returns the next line (without '\n' or a trailing '\r')
// and advances *cursor; NULL at the end.
static char *receipt_next_line(char **cursor) {
    char *s = *cursor;
    if (!s || !*s) return NULL;
    char *nl = strchr(s, '\n');
    if (nl) { *nl = 0; *cursor = nl + 1; } else { *cursor = s + strlen(s); }
    size_t len = strlen(s);
    if (len && s[len - 1] == '\r') s[len - 1] = 0;
    return s;
}

// ---------------------------------------------------------------------------------------------
// trace lines -> records (the one parser: the writer uses it too)

#define RECEIPT_PHASE_MARKER "-phase] rounds="
#define RECEIPT_V_MARKER "-phase-v] rounds="

// The TAG in "[TAG<marker>" ending at `m`; 0 if malformed (no '[', empty, spaces, too long).
static int receipt_tag_before(const char *line, const char *m, char *tag) {
    const char *lb = m;
    while (lb > line && lb[-1] != '[') lb--;
    if (lb == line) return 0;
    size_t len = (size_t)(m - lb);
    if (len == 0 || len >= RECEIPT_TAG_MAX) return 0;
    for (size_t i = 0; i < len; i++)
        if (lb[i] == ' ' || lb[i] == '\t' || lb[i] == ']') return 0;
    memcpy(tag, lb, len);
    tag[len] = 0;
    return 1;
}

// 1 when only whitespace remains at s.
static int receipt_rest_blank(const char *s) {
    while (*s == ' ' || *s == '\t') s++;
    return *s == 0;
}

static int receipt_scan_phase(const char *s, receipt_burst *r) {
    unsigned long long rounds;
    double *ph = r->phase_ms, *pr = r->per_round_ms;
    int end = -1;
    int got = sscanf(s,
        "rounds=%llu k=%d total=%lfms | draft=%lf verify=%lf accept=%lf roll=%lf maint=%lf | "
        "per-round ms: draft=%lf verify=%lf accept=%lf roll=%lf maint=%lf total=%lf%n",
        &rounds, &r->k, &r->total_ms, &ph[0], &ph[1], &ph[2], &ph[3], &ph[4],
        &pr[0], &pr[1], &pr[2], &pr[3], &pr[4], &r->per_round_total_ms, &end);
    if (got != 14 || end < 0 || !receipt_rest_blank(s + end)) return 0;
    r->rounds = rounds;
    return 1;
}

static int receipt_scan_v(const char *s, uint64_t *rounds, int *k, double v[TRACE_N_BUCKETS],
                          double *vrest) {
    unsigned long long rr;
    int end = -1;
    int got = sscanf(s,
        "rounds=%llu k=%d | per-round ms: vkda=%lf (scan=%lf) vmla=%lf vrest=%lf (vffn=%lf)%n",
        &rr, k, &v[TRACE_BUCKET_VKDA], &v[TRACE_BUCKET_SCAN], &v[TRACE_BUCKET_VMLA], vrest,
        &v[TRACE_BUCKET_VFFN], &end);
    if (got != 7 || end < 0 || !receipt_rest_blank(s + end)) return 0;
    *rounds = rr;
    return 1;
}

// Pairs a -v line with the latest record of its TAG parsed in this call (index >= first).
static sd_code receipt_pair_v(receipt_set *out, size_t first, const char *tag, const char *rest,
                              const char *name, int line_no, sd_status *st) {
    uint64_t rounds;
    int k;
    double v[TRACE_N_BUCKETS], vrest;
    if (!receipt_scan_v(rest, &rounds, &k, v, &vrest))
        return sd_fail(st, SD_ERR_DATA, "%s:%d: malformed [%s-phase-v] line", name, line_no, tag);
    for (size_t i = out->n; i-- > first;) {
        receipt_burst *r = &out->bursts[i];
        if (strcmp(r->tag, tag) != 0) continue;
        if (r->has_v || r->rounds != rounds || r->k != k) break;
        memcpy(r->v_ms, v, sizeof v);
        r->vrest_ms = vrest;
        r->has_v = 1;
        return SD_OK;
    }
    return sd_fail(st, SD_ERR_DATA,
                   "%s:%d: [%s-phase-v] line without its [%s-phase] line (rounds=%llu k=%d)",
                   name, line_no, tag, tag, (unsigned long long)rounds, k);
}

static sd_code receipt_parse_line(const char *line, const char *name, int line_no, size_t first,
                                  receipt_set *out, sd_status *st) {
    char tag[RECEIPT_TAG_MAX];
    const char *m = strstr(line, RECEIPT_V_MARKER);
    if (m) {
        if (!receipt_tag_before(line, m, tag))
            return sd_fail(st, SD_ERR_DATA, "%s:%d: bad TAG in a -phase-v line", name, line_no);
        return receipt_pair_v(out, first, tag, strstr(m, "rounds="), name, line_no, st);
    }
    m = strstr(line, RECEIPT_PHASE_MARKER);
    if (!m) return SD_OK; // not a trace line
    if (!receipt_tag_before(line, m, tag))
        return sd_fail(st, SD_ERR_DATA, "%s:%d: bad TAG in a -phase line", name, line_no);
    receipt_burst r;
    memset(&r, 0, sizeof r);
    memcpy(r.tag, tag, sizeof tag);
    r.drafted = r.accepted = r.emitted = -1;
    if (!receipt_scan_phase(strstr(m, "rounds="), &r))
        return sd_fail(st, SD_ERR_DATA, "%s:%d: malformed [%s-phase] line", name, line_no, tag);
    return receipt_set_push(out, &r, st);
}

sd_code receipt_parse_text(const char *text, const char *name, receipt_set *out, sd_status *st) {
    if (!name) name = "<text>";
    char *copy = strdup(text ? text : "");
    if (!copy) return sd_fail(st, SD_ERR_SYS, "%s: out of memory", name);
    size_t first = out->n;
    char *cursor = copy, *line;
    sd_code rc = SD_OK;
    for (int line_no = 1; rc == SD_OK && (line = receipt_next_line(&cursor)); line_no++)
        rc = receipt_parse_line(line, name, line_no, first, out, st);
    free(copy);
    return rc;
}

sd_code receipt_parse_file(const char *path, receipt_set *out, sd_status *st) {
    char *text;
    sd_code rc = receipt_read_file(path, &text, st);
    if (rc != SD_OK) return rc;
    const size_t before = out->n;
    rc = receipt_parse_text(text, path, out, st);
    free(text);
    if (rc == SD_OK && out->n == before)
        rc = sd_fail(st, SD_ERR_DATA, "%s: no trace lines ([TAG-phase] rounds=...): nothing to parse", path);
    return rc;
}

// ---------------------------------------------------------------------------------------------
// records <-> JSON

static void receipt_add_count(cJSON *o, const char *key, int64_t v) {
    if (v < 0) cJSON_AddNullToObject(o, key);
    else cJSON_AddNumberToObject(o, key, (double)v);
}

// One burst line (malloc'd, no newline); NULL when out of memory.
static char *receipt_burst_json(const receipt_burst *r) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "kind", "burst");
    cJSON_AddStringToObject(o, "tag", r->tag);
    cJSON_AddNumberToObject(o, "rounds", (double)r->rounds);
    cJSON_AddNumberToObject(o, "k", r->k);
    cJSON_AddNumberToObject(o, "total_ms", r->total_ms);
    for (int i = 0; i < TRACE_N_PHASES; i++)
        cJSON_AddNumberToObject(o, receipt_phase_ms_keys[i], r->phase_ms[i]);
    cJSON *pr = cJSON_AddObjectToObject(o, "per_round");
    for (int i = 0; i < TRACE_N_PHASES; i++)
        cJSON_AddNumberToObject(pr, receipt_phase_names[i], r->per_round_ms[i]);
    cJSON_AddNumberToObject(pr, "total", r->per_round_total_ms);
    if (r->has_v) { // per-round ms, in the -v line's order
        cJSON_AddNumberToObject(o, "vkda", r->v_ms[TRACE_BUCKET_VKDA]);
        cJSON_AddNumberToObject(o, "scan", r->v_ms[TRACE_BUCKET_SCAN]);
        cJSON_AddNumberToObject(o, "vmla", r->v_ms[TRACE_BUCKET_VMLA]);
        cJSON_AddNumberToObject(o, "vrest", r->vrest_ms);
        cJSON_AddNumberToObject(o, "vffn", r->v_ms[TRACE_BUCKET_VFFN]);
    }
    receipt_add_count(o, "drafted", r->drafted);
    receipt_add_count(o, "accepted", r->accepted);
    receipt_add_count(o, "emitted", r->emitted);
    if (r->drafted >= 0 && r->accepted >= 0 && r->emitted >= 0 && r->has_positions) {
        sd_accept_stats acc = {.rounds = r->rounds, .drafted = (uint64_t)r->drafted,
                               .accepted = (uint64_t)r->accepted, .emitted = (uint64_t)r->emitted, .k = r->k};
        memcpy(acc.per_position, r->per_position, sizeof acc.per_position);
        memcpy(acc.histogram, r->histogram, sizeof acc.histogram);
        trace_metrics_add_vllm(o, &acc, r->k);
    } else {
        trace_metrics_add_unknown(o);
    }
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return s;
}

static int receipt_json_num(const cJSON *o, const char *key, double *v) {
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!cJSON_IsNumber(x)) return 0;
    *v = x->valuedouble;
    return 1;
}

// A count: a non-negative number, or null / absent (= unknown, -1).
static int receipt_json_count(const cJSON *o, const char *key, int64_t *v) {
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, key);
    *v = -1;
    if (!x || cJSON_IsNull(x)) return 1;
    if (!cJSON_IsNumber(x) || x->valuedouble < 0) return 0;
    *v = (int64_t)x->valuedouble;
    return 1;
}

// n non-negative integers of the array at key into v; absent or null: 0 (unknown), bad: -1.
static int receipt_json_counts(const cJSON *o, const char *key, int n, uint64_t *v) {
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(o, key), *x;
    if (!a || cJSON_IsNull(a)) return 0;
    if (!cJSON_IsArray(a) || cJSON_GetArraySize(a) != n) return -1;
    int i = 0;
    cJSON_ArrayForEach(x, a) {
        if (!cJSON_IsNumber(x) || x->valuedouble < 0 || x->valuedouble != floor(x->valuedouble)) return -1;
        v[i++] = (uint64_t)x->valuedouble;
    }
    return 1;
}

// Fills r from a burst object; on failure returns the name of the offending key.
static const char *receipt_burst_from_json(const cJSON *o, receipt_burst *r) {
    memset(r, 0, sizeof *r);
    const cJSON *tag = cJSON_GetObjectItemCaseSensitive(o, "tag");
    if (!cJSON_IsString(tag) || !tag->valuestring[0] || strlen(tag->valuestring) >= RECEIPT_TAG_MAX)
        return "tag";
    strcpy(r->tag, tag->valuestring);
    double rounds, k;
    if (!receipt_json_num(o, "rounds", &rounds) || rounds < 1 || rounds != floor(rounds)) return "rounds";
    if (!receipt_json_num(o, "k", &k) || k != floor(k)) return "k";
    r->rounds = (uint64_t)rounds;
    r->k = (int)k;
    if (!receipt_json_num(o, "total_ms", &r->total_ms)) return "total_ms";
    for (int i = 0; i < TRACE_N_PHASES; i++)
        if (!receipt_json_num(o, receipt_phase_ms_keys[i], &r->phase_ms[i])) return receipt_phase_ms_keys[i];
    const cJSON *pr = cJSON_GetObjectItemCaseSensitive(o, "per_round");
    if (!cJSON_IsObject(pr)) return "per_round";
    for (int i = 0; i < TRACE_N_PHASES; i++)
        if (!receipt_json_num(pr, receipt_phase_names[i], &r->per_round_ms[i])) return "per_round";
    if (!receipt_json_num(pr, "total", &r->per_round_total_ms)) return "per_round";
    if (cJSON_GetObjectItemCaseSensitive(o, "vkda")) {
        for (int i = 0; i < TRACE_N_BUCKETS; i++)
            if (!receipt_json_num(o, receipt_bucket_names[i], &r->v_ms[i])) return receipt_bucket_names[i];
        if (!receipt_json_num(o, "vrest", &r->vrest_ms)) return "vrest";
        r->has_v = 1;
    }
    if (!receipt_json_count(o, "drafted", &r->drafted)) return "drafted";
    if (!receipt_json_count(o, "accepted", &r->accepted)) return "accepted";
    if (!receipt_json_count(o, "emitted", &r->emitted)) return "emitted";
    // Receipts older than vLLM's names carry no per-position counts: they stay unknown.
    if (r->k < 0 || r->k > SD_STATS_MAX_POSITIONS) return "k";
    int pos = receipt_json_counts(o, "num_accepted_tokens_per_pos", r->k, r->per_position);
    int hist = receipt_json_counts(o, "acceptance_histogram", r->k + 1, r->histogram);
    if (pos < 0 || pos != hist) return pos < 0 ? "num_accepted_tokens_per_pos" : "acceptance_histogram";
    r->has_positions = pos;
    return NULL;
}

static sd_code receipt_load_line(char *line, const char *path, int line_no, receipt_set *out,
                                 sd_status *st) {
    cJSON *o = cJSON_Parse(line);
    if (!cJSON_IsObject(o)) {
        cJSON_Delete(o);
        return sd_fail(st, SD_ERR_DATA, "%s:%d: not a JSON object", path, line_no);
    }
    const cJSON *kind = cJSON_GetObjectItemCaseSensitive(o, "kind");
    sd_code rc = SD_OK;
    if (!cJSON_IsString(kind)) {
        rc = sd_fail(st, SD_ERR_DATA, "%s:%d: no \"kind\" string", path, line_no);
    } else if (strcmp(kind->valuestring, "env") == 0) {
        if (out->env_json)
            rc = sd_fail(st, SD_ERR_DATA, "%s:%d: a second env line", path, line_no);
        else if (!(out->env_json = strdup(line)))
            rc = sd_fail(st, SD_ERR_SYS, "%s: out of memory", path);
    } else if (out->ended) {
        rc = sd_fail(st, SD_ERR_DATA, "%s:%d: a line after the end line", path, line_no);
    } else if (strcmp(kind->valuestring, "end") == 0) {
        const cJSON *status = cJSON_GetObjectItemCaseSensitive(o, "status");
        if (!cJSON_IsString(status))
            rc = sd_fail(st, SD_ERR_DATA, "%s:%d: end line without a \"status\" string", path, line_no);
        out->ended = 1;
        out->interrupted = cJSON_IsString(status) && strcmp(status->valuestring, "interrupted") == 0;
    } else if (strcmp(kind->valuestring, "burst") == 0) {
        receipt_burst r;
        const char *bad = receipt_burst_from_json(o, &r);
        rc = bad ? sd_fail(st, SD_ERR_DATA, "%s:%d: burst: missing or bad \"%s\"", path, line_no, bad)
                 : receipt_set_push(out, &r, st);
    } else {
        rc = sd_fail(st, SD_ERR_DATA, "%s:%d: unknown kind \"%s\" (expected env, burst or end)", path,
                     line_no, kind->valuestring);
    }
    cJSON_Delete(o);
    return rc;
}

sd_code receipt_load(const char *path, receipt_set *out, sd_status *st) {
    char *text;
    sd_code rc = receipt_read_file(path, &text, st);
    if (rc != SD_OK) return rc;
    char *cursor = text, *line;
    for (int line_no = 1; rc == SD_OK && (line = receipt_next_line(&cursor)); line_no++)
        if (!receipt_rest_blank(line)) rc = receipt_load_line(line, path, line_no, out, st);
    free(text);
    return rc;
}

sd_code receipt_read_any(const char *path, receipt_set *out, sd_status *st) {
    char *text;
    sd_code rc = receipt_read_file(path, &text, st);
    if (rc != SD_OK) return rc;
    const char *p = text;
    while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r') p++;
    int is_jsonl = *p == '{';
    free(text);
    return is_jsonl ? receipt_load(path, out, st) : receipt_parse_file(path, out, st);
}

sd_code receipt_write_jsonl(const receipt_set *s, FILE *out, sd_status *st) {
    if (s->env_json) fprintf(out, "%s\n", s->env_json);
    for (size_t i = 0; i < s->n; i++) {
        char *line = receipt_burst_json(&s->bursts[i]);
        if (!line) return sd_fail(st, SD_ERR_SYS, "receipt: out of memory");
        fprintf(out, "%s\n", line);
        cJSON_free(line);
    }
    if (fflush(out) != 0 || ferror(out))
        return sd_fail(st, SD_ERR_SYS, "receipt: write error: %s", strerror(errno));
    return SD_OK;
}

// ---------------------------------------------------------------------------------------------
// the atomic writer

// Rewrites the whole file atomically.
static sd_code receipt_writer_flush(const receipt_writer *w, sd_status *st) {
    sd_atomic_file af;
    sd_code rc = sd_atomic_open(&af, w->path, st);
    if (rc != SD_OK) return rc;
    for (size_t i = 0; i < w->n; i++) fprintf(af.f, "%s\n", w->lines[i]);
    return sd_atomic_commit(&af, st);
}

// Appends a line (taking ownership of the malloc'd `line`) and rewrites the file; on failure
// the line is dropped again so memory and disk stay the same.
static sd_code receipt_writer_append(receipt_writer *w, char *line, sd_status *st) {
    if (w->n == w->cap) {
        size_t cap = w->cap ? 2 * w->cap : 16;
        char **p = realloc(w->lines, cap * sizeof *p);
        if (!p) { cJSON_free(line); return sd_fail(st, SD_ERR_SYS, "%s: out of memory", w->path); }
        w->lines = p;
        w->cap = cap;
    }
    w->lines[w->n++] = line;
    sd_code rc = receipt_writer_flush(w, st);
    if (rc != SD_OK) cJSON_free(w->lines[--w->n]);
    return rc;
}

static void receipt_add_str(cJSON *o, const char *key, const char *v) {
    if (v) cJSON_AddStringToObject(o, key, v);
    else cJSON_AddNullToObject(o, key);
}

static char *receipt_env_json(const receipt_env *e) {
    cJSON *o = cJSON_CreateObject();
    char seed[32];
    snprintf(seed, sizeof seed, "%" PRIu64, e->seed);
    cJSON_AddStringToObject(o, "kind", "env");
    receipt_add_str(o, "version", e->version);
    receipt_add_str(o, "commit", e->commit);
    receipt_add_str(o, "config_sha256", e->config_sha256);
    receipt_add_str(o, "weights_sha256", e->weights_sha256);
    receipt_add_str(o, "draft_sha256", e->draft_sha256);
    receipt_add_str(o, "backend", e->backend);
    receipt_add_str(o, "device", e->device);
    receipt_add_str(o, "driver", e->driver);
    receipt_add_str(o, "tp_layout", e->tp_layout);
    cJSON_AddBoolToObject(o, "decode_graph", e->decode_graph);
    receipt_add_str(o, "tag", e->tag);
    receipt_add_str(o, "flags", e->flags);
    receipt_add_str(o, "trace_level_source", e->trace_level_source);
    receipt_add_str(o, "cpu_model", e->cpu_model);
    cJSON_AddNumberToObject(o, "cpu_threads", e->cpu_threads);
    receipt_add_str(o, "omp_wait_policy", e->omp_wait_policy);
    cJSON_AddNumberToObject(o, "k", e->k);
    cJSON_AddRawToObject(o, "seed", seed); // exact: a double cannot hold every uint64
    cJSON_AddNumberToObject(o, "temperature", e->temperature);
    cJSON_AddNumberToObject(o, "trace_level", e->trace_level);
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return s;
}

sd_code receipt_open(receipt_writer *w, const char *path, const receipt_env *env, sd_status *st) {
    memset(w, 0, sizeof *w);
    if (!path || !path[0]) return sd_fail(st, SD_ERR_USAGE, "receipt: empty path");
    if (!(w->path = strdup(path))) return sd_fail(st, SD_ERR_SYS, "%s: out of memory", path);
    char *line = receipt_env_json(env);
    sd_code rc = line ? receipt_writer_append(w, line, st)
                      : sd_fail(st, SD_ERR_SYS, "%s: out of memory", path);
    if (rc != SD_OK) receipt_close(w);
    return rc;
}

sd_code receipt_add_burst(receipt_writer *w, const trace_burst *b, const char *tag, sd_status *st) {
    if (!tag) tag = "spec";
    if (b->level < 1)
        return sd_fail(st, SD_ERR_USAGE, "%s: burst traced at level 0 (no clocks); a receipt "
                       "needs trace level 1 or 2", w->path);
    if (b->acc.rounds == 0) return SD_OK; // the trace prints nothing either
    if (!tag[0] || strlen(tag) >= RECEIPT_TAG_MAX || strpbrk(tag, " \t[]\n"))
        return sd_fail(st, SD_ERR_USAGE, "%s: bad trace tag '%s'", w->path, tag);

    // The record is the parse of the trace line itself, so log and receipt agree exactly.
    char text[2048];
    trace_burst_format(b, tag, text, sizeof text);
    receipt_set one = {0};
    sd_code rc = receipt_parse_text(text, "trace line", &one, st);
    if (rc == SD_OK && one.n != 1)
        rc = sd_fail(st, SD_ERR_DATA, "%s: the trace line did not parse back", w->path);
    if (rc != SD_OK) { receipt_set_free(&one); return rc; }
    receipt_burst r = one.bursts[0];
    receipt_set_free(&one);
    r.drafted = (int64_t)b->acc.drafted;
    r.accepted = (int64_t)b->acc.accepted;
    r.emitted = (int64_t)b->acc.emitted;
    r.has_positions = b->k >= 0 && b->k <= SD_STATS_MAX_POSITIONS;
    memcpy(r.per_position, b->acc.per_position, sizeof r.per_position);
    memcpy(r.histogram, b->acc.histogram, sizeof r.histogram);
    char *line = receipt_burst_json(&r);
    if (!line) return sd_fail(st, SD_ERR_SYS, "%s: out of memory", w->path);
    return receipt_writer_append(w, line, st);
}

sd_code receipt_finish(receipt_writer *w, const char *status, const char *stop_reason, int tokens, sd_status *st) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "kind", "end");
    receipt_add_str(o, "status", status);
    receipt_add_str(o, "stop_reason", stop_reason);
    cJSON_AddNumberToObject(o, "tokens", tokens);
    char *line = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    if (!line) return sd_fail(st, SD_ERR_SYS, "%s: out of memory", w->path);
    return receipt_writer_append(w, line, st);
}

void receipt_close(receipt_writer *w) {
    if (!w) return;
    for (size_t i = 0; i < w->n; i++) cJSON_free(w->lines[i]);
    free(w->lines);
    free(w->path);
    memset(w, 0, sizeof *w);
}
