// bench_gpu_trace.c — the phase trace of the speculative rounds on the GPU (printed, never
// asserted). Greedy rounds of a target and its derived draft (synth.h: the target's first 2
// layers, the same seed and .depth = the target's L; the target's layers 2.. with o_proj and
// every down_proj scaled by 0.1), k = --k, --tokens tokens a burst, on device 0. Two modes:
//
// Default (neither --config nor --ctx): drain mode against event mode, toy, a 16-token prompt:
//   - tokens/s at level 0, level 1, level 2 (drain: the stream is drained around every mixer and
//     FFN call of verify) and level 2 (events: CUDA events recorded there, summed after the
//     burst), best of 3 runs each, and the overhead of each against level 0;
//   - the verify sub-split of both level-2 modes as shares of verify (vkda, scan, vmla, vrest,
//     vffn), side by side: drains serialise the verify pass, events only observe it.
//
// Context mode (--config and/or --ctx): the rounds' phase shares at long contexts, for
// configs/NAME.json, target and draft synthesised ON the device (cuda_synth.h: kimi-linear-48b-a3b
// is ~98 GB in bf16, never made on the host). Per context N:
//   - a prompt of N tokens (sd_synth_prompt, seed 0): its first N-1 prefilled into both states
//     with sd_prefill (beyond SD_PREFILL_TOKEN_PATH_MAX tokens the backend's prefill), its last
//     the first round's x. sd_spec_generate is given that one token, so it prefills nothing:
//     neither the phase totals nor tokens/s hold any prefill. (Given the whole prompt it would
//     prefill N-1 tokens in forwards of the state's max_T; trace_round_begin keeps that time out
//     of the phases, not out of the wall clock.)
//   - both states' device arenas saved once after the prefill and copied back before every burst,
//     so every burst starts from the same N-1 committed tokens (the KDA state is recurrent: no
//     rollback reaches back past a burst);
//   - one warm-up burst, then at level 1 and at level 2 in event mode (the event pool), the best
//     (by tokens/s) of 3 bursts each, interleaved;
//   - per level a row: tokens/s (host clock around the burst), ms per round, tokens per round,
//     each phase's share of the burst total (the sum of the five phases: draft, verify, accept,
//     roll, maint) and at level 2 the verify sub-split as shares of verify (vkda, scan inside
//     it, vmla, vrest = verify - vkda - vmla, vffn inside vrest); then the burst's trace lines
//     (trace_burst_format, TAG = NAME-ctxN-lL: the receipts' line shapes); then one JSON line
//     ("bench":"gpu_rounds_ctx") with every number.
//   The states and their saved copies are freed between contexts. Progress (synthesis, prefill,
//   memory) goes to stderr.
// usage: bench_gpu_trace [--config NAME] [--ctx N[,N,...]] [--tokens N] [--k K] [--help]
//        (NAME: a file in configs/ without .json, default toy; ctx default 16; tokens default 256;
//        k default 4)
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "cuda_backend.h" // sd_cuda_device_count, sd_cuda_model_upload, sd_cuda_state_init
#include "cuda_synth.h"   // sd_cuda_model_synth
#include "decode.h"       // sd_synth_prompt
#include "events.h"       // sd_cuda_event_pool
#include "gpu_bench.h"    // SD_BENCH_CK
#include "spec.h"
#include "synth.h"

#ifndef SPECDEC_SOURCE_DIR
#define SPECDEC_SOURCE_DIR "."
#endif

#define USAGE "usage: bench_gpu_trace [--config NAME] [--ctx N[,N,...]] [--tokens N] [--k K] [--help]\n"
#define MAX_CTXS 16
#define MAX_LEN (1 << 20) // the largest --ctx and --tokens
#define REPS 3            // bursts a level, the best kept
#define PROMPT 16         // the default mode's prompt
#define SLACK 8           // positions a state holds beyond prompt + tokens + k + 1

const char *sd_bench_prog = "bench_gpu_trace"; // gpu_bench.h's error lines

static void die(const sd_status *st) {
    fprintf(stderr, "bench_gpu_trace: %s\n", st->msg);
    exit(1);
}

static double ms_since(uint64_t t0) { return (double)(trace_now_ns() - t0) * 1e-6; }

static void sync_model(void *m) { sd_model_sync(m); }

// The demo's derived draft: synthesised with these options, its layers are the target's first.
static sd_synth_opts derived_opts(const sd_config *target) {
    return (sd_synth_opts){.seed = 0, .dtype = SD_DT_BF16, .tail_from = 2, .tail_scale = 0.1f,
                           .depth = target->num_hidden_layers};
}

// Both states' forwards: the verify pass's k+1 tokens (and the default mode's forwards).
static int max_T_of(int k) { return k + 1 > 8 ? k + 1 : 8; }

// ---------------------------------------------------------------------------- options
typedef struct {
    const char *config; // NULL: toy
    sd_config cfg;      // configs/<config>.json, loaded while parsing
    int ctx[MAX_CTXS], n_ctx;
    int tokens, k;
    bool ctx_mode; // --config or --ctx given
} bench_opts;

static const char *src_dir(void) {
    const char *d = getenv("SPECDEC_SOURCE_DIR");
    return d ? d : SPECDEC_SOURCE_DIR;
}

// configs/<name>.json; false (the loader's message in st) when it does not load.
static bool load_config(const char *name, sd_config *cfg, sd_status *st) {
    char path[4096];
    snprintf(path, sizeof path, "%s/configs/%s.json", src_dir(), name);
    return sd_config_load(path, cfg, st) == SD_OK;
}

// A whole-string decimal integer in lo..hi.
static bool parse_int(const char *s, long lo, long hi, int *out) {
    char *end;
    errno = 0;
    const long v = strtol(s, &end, 10);
    if (end == s || *end || errno || v < lo || v > hi) return false;
    *out = (int)v;
    return true;
}

// N[,N,...], each 1..MAX_LEN, at most MAX_CTXS; the count, or -1.
static int parse_ctx_list(const char *s, int *ctx) {
    int n = 0;
    for (const char *p = s;;) {
        char *end;
        errno = 0;
        const long v = strtol(p, &end, 10);
        if (end == p || errno || v < 1 || v > MAX_LEN || n == MAX_CTXS || (*end && *end != ',')) return -1;
        ctx[n++] = (int)v;
        if (!*end) return n;
        p = end + 1;
    }
}

static void print_help(void) {
    printf(USAGE
           "  --config NAME      context mode on configs/NAME.json (default toy)\n"
           "  --ctx N[,N,...]    context mode at these prompt lengths: N tokens before the rounds (default 16)\n"
           "  --tokens N         tokens generated a burst (default 256)\n"
           "  --k K              draft depth, 1..%d (default 4)\n"
           "  --help             this text\n"
           "without --config and --ctx: drain mode against event mode of the level-2 trace (toy)\n",
           SD_SPEC_MAX_K);
}

// -1: run with o; else the exit status (0 after --help, 2 after a one-line error).
static int parse_args(int argc, char **argv, bench_opts *o) {
    *o = (bench_opts){.ctx = {16}, .n_ctx = 1, .tokens = 256, .k = 4};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help")) { print_help(); return 0; }
        const bool known = !strcmp(a, "--config") || !strcmp(a, "--ctx") || !strcmp(a, "--tokens") || !strcmp(a, "--k");
        if (!known) { fprintf(stderr, "bench_gpu_trace: unknown option '%s' (see --help)\n", a); return 2; }
        if (!v) { fprintf(stderr, "bench_gpu_trace: %s needs a value (see --help)\n", a); return 2; }
        i++;
        if (!strcmp(a, "--config")) {
            sd_status st = {0};
            if (!load_config(v, &o->cfg, &st)) {
                fprintf(stderr, "bench_gpu_trace: bad --config '%s': %s\n", v, st.msg);
                return 2;
            }
            o->config = v;
            o->ctx_mode = true;
        } else if (!strcmp(a, "--ctx")) {
            o->n_ctx = parse_ctx_list(v, o->ctx);
            if (o->n_ctx < 1) {
                fprintf(stderr, "bench_gpu_trace: bad --ctx '%s' (N[,N,...]: at most %d, each 1..%d)\n", v, MAX_CTXS, MAX_LEN);
                return 2;
            }
            o->ctx_mode = true;
        } else if (!strcmp(a, "--tokens")) {
            if (!parse_int(v, 1, MAX_LEN, &o->tokens)) {
                fprintf(stderr, "bench_gpu_trace: bad --tokens '%s' (1..%d)\n", v, MAX_LEN);
                return 2;
            }
        } else if (!parse_int(v, 1, SD_SPEC_MAX_K, &o->k)) {
            fprintf(stderr, "bench_gpu_trace: bad --k '%s' (1..%d)\n", v, SD_SPEC_MAX_K);
            return 2;
        }
    }
    sd_status st = {0};
    if (!o->config && !load_config("toy", &o->cfg, &st)) die(&st);
    return -1;
}

// ---------------------------------------------------------------------------- one burst
typedef struct { double tok_s; trace_burst tb; } result;

// One burst of n tokens after `prompt` at this level (pool: level 2 in event mode): sd_spec_generate
// prefills the prompt's first n_prompt - 1 tokens (inside the host clock, outside the phases) and
// the rounds start from its last. Host clock from a drained device to a drained device.
static void timed_burst(const sd_model *t, sd_state *ts, const sd_model *d, sd_state *ds, const int *prompt, int n_prompt,
                        int n, int k, int level, sd_cuda_event_pool *pool, result *r) {
    sd_status st = {0};
    int *out = malloc(sizeof(int) * (size_t)n);
    trace_burst_begin(&r->tb, level, k, sync_model, (void *)t);
    if (pool) trace_burst_use_events(&r->tb, &pool->hooks);
    sd_spec_opts o = {.k = k, .trace = level ? &r->tb : NULL};
    sd_accept_stats stats = {0};
    sd_model_sync((void *)t);
    sd_model_sync((void *)d);
    uint64_t t0 = trace_now_ns();
    if (sd_spec_generate(t, ts, d, ds, prompt, n_prompt, n, &o, out, &stats, &st)) die(&st);
    sd_model_sync((void *)t);
    sd_model_sync((void *)d);
    r->tok_s = n / ((trace_now_ns() - t0) * 1e-9);
    trace_burst_collect(&r->tb);
    free(out);
}

// The shares a burst's trace makes: phases as % of the burst total, the level-2 sub-split
// (vkda, scan, vmla, vrest, vffn) in ms and as % of verify.
enum { V_KDA, V_SCAN, V_MLA, V_REST, V_FFN, V_N };
static const char *const phase_names[TRACE_N_PHASES] = {"draft", "verify", "accept", "roll", "maint"};
static const char *const split_names[V_N] = {"vkda", "scan", "vmla", "vrest", "vffn"};

typedef struct {
    double total_ms, ms_round, tok_round;
    double phase_ms[TRACE_N_PHASES], phase_pct[TRACE_N_PHASES];
    double split_ms[V_N], split_pct[V_N];
} shares;

static shares shares_of(const trace_burst *b) {
    shares s = {0};
    for (int i = 0; i < TRACE_N_PHASES; i++) s.total_ms += (s.phase_ms[i] = b->phase_ns[i] * 1e-6);
    for (int i = 0; i < TRACE_N_PHASES; i++) s.phase_pct[i] = s.total_ms > 0 ? 100 * s.phase_ms[i] / s.total_ms : 0;
    const double rounds = b->acc.rounds ? (double)b->acc.rounds : 1;
    s.ms_round = s.total_ms / rounds;
    s.tok_round = (double)b->acc.emitted / rounds;
    const double v = s.phase_ms[TRACE_PHASE_VERIFY];
    s.split_ms[V_KDA] = b->bucket_ns[TRACE_BUCKET_VKDA] * 1e-6;
    s.split_ms[V_SCAN] = b->bucket_ns[TRACE_BUCKET_SCAN] * 1e-6;
    s.split_ms[V_MLA] = b->bucket_ns[TRACE_BUCKET_VMLA] * 1e-6;
    s.split_ms[V_FFN] = b->bucket_ns[TRACE_BUCKET_VFFN] * 1e-6;
    const double rest = v - s.split_ms[V_KDA] - s.split_ms[V_MLA]; // saturating, as trace_burst_format's
    s.split_ms[V_REST] = rest > 0 ? rest : 0;
    for (int i = 0; i < V_N; i++) s.split_pct[i] = v > 0 ? 100 * s.split_ms[i] / v : 0;
    return s;
}

// ---------------------------------------------------------------------------- default mode
static void device_model(const sd_config *cfg, const sd_synth_opts *o, sd_model *dev) {
    sd_status st = {0};
    sd_model host;
    if (sd_synth_model(&host, cfg, o, &st) || sd_cuda_model_upload(&host, dev, &st)) die(&st);
    sd_model_free(&host);
}

// One burst from empty states: sd_spec_generate prefills the PROMPT-token prompt itself.
static void run(const sd_model *t, const sd_model *d, int n, int k, int level, sd_cuda_event_pool *pool, result *r) {
    sd_status st = {0};
    sd_state ts, ds;
    int prompt[PROMPT];
    sd_synth_prompt(0, t->cfg.vocab_size, PROMPT, prompt);
    const int cap = PROMPT + n + k + 1 + SLACK;
    if (sd_model_state_init(t, &ts, cap, max_T_of(k), &st) || sd_model_state_init(d, &ds, cap, max_T_of(k), &st)) die(&st);
    timed_burst(t, &ts, d, &ds, prompt, PROMPT, n, k, level, pool, r);
    sd_state_free(&ts);
    sd_state_free(&ds);
}

static int drain_against_events(const bench_opts *bo) {
    const int n = bo->tokens, k = bo->k;
    sd_config dcfg;
    sd_status st = {0};
    if (sd_draft_config(&bo->cfg, 2, &dcfg, &st)) die(&st);
    const sd_synth_opts o = derived_opts(&bo->cfg);
    sd_model t, d;
    device_model(&bo->cfg, &o, &t);
    device_model(&dcfg, &o, &d);
    sd_cuda_event_pool pool;
    if (sd_cuda_events_init(&pool, &t, 2 * TRACE_MAX_EVENT_PAIRS, &st)) die(&st);

    const char *names[4] = {"level 0", "level 1", "level 2 drain", "level 2 events"};
    static result best[4], r;
    run(&t, &d, 32, k, 1, NULL, &r); // warm-up: module load, first allocations
    for (int rep = 0; rep < REPS; rep++)
        for (int m = 0; m < 4; m++) {
            run(&t, &d, n, k, m < 3 ? m : 2, m == 3 ? &pool : NULL, &r);
            if (r.tok_s > best[m].tok_s) best[m] = r;
        }
    printf("== phase trace on the GPU (toy + derived draft, k = %d, %d tokens, best of 3) ==\n", k, n);
    for (int m = 0; m < 4; m++)
        printf("%-15s %9.1f tokens/s  overhead vs level 0: %+6.1f%%\n", names[m], best[m].tok_s,
               100.0 * (best[0].tok_s / best[m].tok_s - 1.0));
    printf("\nverify sub-split as %% of verify:   vkda   (scan)   vmla   vrest  (vffn)   verify ms/round\n");
    for (int m = 2; m < 4; m++) {
        const trace_burst *b = &best[m].tb;
        const shares s = shares_of(b);
        printf("%-32s %6.1f  (%5.1f) %6.1f  %6.1f  (%5.1f)   %.3f%s\n", names[m], s.split_pct[V_KDA], s.split_pct[V_SCAN],
               s.split_pct[V_MLA], s.split_pct[V_REST], s.split_pct[V_FFN],
               s.phase_ms[TRACE_PHASE_VERIFY] / (double)b->acc.rounds, b->pairs_lost ? " (event pairs lost)" : "");
        char line[1024];
        trace_burst_format(b, m == 2 ? "drain" : "events", line, sizeof line);
        printf("%s", line);
    }
    sd_cuda_events_free(&pool);
    sd_model_free(&t);
    sd_model_free(&d);
    return 0;
}

// ---------------------------------------------------------------------------- context mode
typedef struct {
    const char *name;
    sd_model t, d; // on device 0
    double t_synth_ms, d_synth_ms;
    char device[256];
} model_pair;

// Target and derived draft of cfg synthesised on device 0 (no host copy of the weights).
static void synth_pair(const char *name, const sd_config *cfg, model_pair *p) {
    sd_status st = {0};
    sd_config dcfg;
    if (sd_draft_config(cfg, 2, &dcfg, &st)) die(&st);
    const sd_synth_opts o = derived_opts(cfg);
    p->name = name;
    uint64_t t0 = trace_now_ns();
    if (sd_cuda_model_synth(cfg, &o, 0, &p->t, &st)) die(&st);
    p->t_synth_ms = ms_since(t0);
    fprintf(stderr, "bench_gpu_trace: %s: target, %.2f GB of bf16 weights, synthesised on the device in %.0f ms\n", name,
            p->t.w.arena_bytes / 1e9, p->t_synth_ms);
    t0 = trace_now_ns();
    if (sd_cuda_model_synth(&dcfg, &o, 0, &p->d, &st)) die(&st);
    p->d_synth_ms = ms_since(t0);
    fprintf(stderr, "bench_gpu_trace: %s: derived draft (2 layers), %.2f GB, synthesised on the device in %.0f ms\n", name,
            p->d.w.arena_bytes / 1e9, p->d_synth_ms);
    if (sd_cuda_device_name(0, p->device, sizeof p->device, &st)) die(&st);
}

// A device state's whole arena (caches, scratch and the cursor {len, pending}) at one moment.
typedef struct { void *bytes; int len; } saved_state;

static void state_save(const sd_state *s, saved_state *c) {
    SD_BENCH_CK(cudaMalloc(&c->bytes, s->arena_bytes));
    SD_BENCH_CK(cudaMemcpy(c->bytes, s->arena, s->arena_bytes, cudaMemcpyDeviceToDevice));
    SD_BENCH_CK(cudaDeviceSynchronize());
    c->len = s->len;
}

// Back to the saved moment: every byte, the cursor among them, then the host's len and pending.
static void state_restore(sd_state *s, const saved_state *c) {
    SD_BENCH_CK(cudaMemcpy(s->arena, c->bytes, s->arena_bytes, cudaMemcpyDeviceToDevice));
    SD_BENCH_CK(cudaDeviceSynchronize());
    s->len = c->len;
    s->pending = 0;
}

// One context: both states holding the prompt's first ctx-1 tokens, and their saved copies.
typedef struct {
    int ctx;
    int *prompt; // ctx tokens
    sd_state ts, ds;
    saved_state t_saved, d_saved;
    double t_prefill_ms, d_prefill_ms;
} context;

// n tokens of the prompt into s (sd_prefill; nothing for n = 0), in ms from a drained device.
static double prefill(const sd_model *m, sd_state *s, const int *prompt, int n) {
    sd_status st = {0};
    if (n == 0) return 0;
    sd_model_sync((void *)m);
    const uint64_t t0 = trace_now_ns();
    if (sd_prefill(m, s, prompt, n, NULL, &st)) die(&st);
    sd_model_sync((void *)m);
    return ms_since(t0);
}

static void context_init(const model_pair *p, int ctx, const bench_opts *o, context *c) {
    sd_status st = {0};
    c->ctx = ctx;
    c->prompt = malloc(sizeof(int) * (size_t)ctx);
    sd_synth_prompt(0, p->t.cfg.vocab_size, ctx, c->prompt);
    const int cap = ctx + o->tokens + o->k + 1 + SLACK;
    const int max_T = max_T_of(o->k);
    if (sd_cuda_state_init(&c->ts, &p->t, cap, max_T, &st) || sd_cuda_state_init(&c->ds, &p->d, cap, max_T, &st)) die(&st);
    c->t_prefill_ms = prefill(&p->t, &c->ts, c->prompt, ctx - 1);
    c->d_prefill_ms = prefill(&p->d, &c->ds, c->prompt, ctx - 1);
    state_save(&c->ts, &c->t_saved);
    state_save(&c->ds, &c->d_saved);
    size_t free_b = 0, total_b = 0;
    SD_BENCH_CK(cudaMemGetInfo(&free_b, &total_b));
    fprintf(stderr,
            "bench_gpu_trace: %s ctx %d: %d tokens prefilled in %.0f ms (target) + %.0f ms (draft); states %.2f + %.2f GB "
            "(and as much saved); device memory free %.1f of %.1f GB\n",
            p->name, ctx, ctx - 1, c->t_prefill_ms, c->d_prefill_ms, c->ts.arena_bytes / 1e9, c->ds.arena_bytes / 1e9,
            free_b / 1e9, total_b / 1e9);
}

static void context_free(context *c) {
    SD_BENCH_CK(cudaFree(c->t_saved.bytes));
    SD_BENCH_CK(cudaFree(c->d_saved.bytes));
    sd_state_free(&c->ts);
    sd_state_free(&c->ds);
    free(c->prompt);
}

// One burst of the rounds at the context: from the saved states, the prompt's last token as x.
static void context_burst(const model_pair *p, context *c, const bench_opts *o, int level, sd_cuda_event_pool *pool,
                          result *r) {
    state_restore(&c->ts, &c->t_saved);
    state_restore(&c->ds, &c->d_saved);
    timed_burst(&p->t, &c->ts, &p->d, &c->ds, c->prompt + c->ctx - 1, 1, o->tokens, o->k, level, pool, r);
}

static void print_table_head(const model_pair *p, const bench_opts *o) {
    printf("== speculative rounds at long contexts on %s (%s + derived draft (2 layers), k = %d, %d tokens a burst, greedy, "
           "best of %d) ==\n", p->device, p->name, o->k, o->tokens, REPS);
    printf("(phases: %% of the burst total, the five phases' sum; level 2 in event mode, its sub-split: %% of verify, scan "
           "inside vkda, vffn inside vrest)\n");
    printf("%8s %3s %10s %9s %9s | %7s %7s %7s %7s %7s | %7s %7s %7s %7s %7s\n", "ctx", "lvl", "tokens/s", "ms/round",
           "tok/round", "draft%", "verify%", "accept%", "roll%", "maint%", "vkda%", "(scan%)", "vmla%", "vrest%", "(vffn%)");
}

static void print_row(const context *c, int level, const result *r, const shares *s) {
    printf("%8d %3d %10.1f %9.3f %9.2f |", c->ctx, level, r->tok_s, s->ms_round, s->tok_round);
    for (int i = 0; i < TRACE_N_PHASES; i++) printf(" %7.1f", s->phase_pct[i]);
    printf(" |");
    if (level < 2) {
        for (int i = 0; i < V_N; i++) printf(" %7s", "-");
    } else {
        for (int i = 0; i < V_N; i++) printf(i == V_SCAN || i == V_FFN ? " (%5.1f)" : " %7.1f", s->split_pct[i]);
    }
    printf("%s\n", r->tb.pairs_lost ? " (event pairs lost)" : "");
}

// "key":{"name":value,...} of n values.
static void json_object(const char *key, const char *const *names, const double *v, int n) {
    printf(",\"%s\":{", key);
    for (int i = 0; i < n; i++) printf("%s\"%s\":%.4f", i ? "," : "", names[i], v[i]);
    printf("}");
}

static void print_json(const model_pair *p, const context *c, const bench_opts *o, int level, const result *r,
                       const shares *s) {
    const sd_accept_stats *a = &r->tb.acc;
    printf("{\"bench\":\"gpu_rounds_ctx\",\"config\":\"%s\",\"device\":\"%s\",\"ctx\":%d,\"level\":%d,\"mode\":\"%s\","
           "\"k\":%d,\"tokens\":%d,\"reps\":%d,\"tokens_per_s\":%.2f,\"rounds\":%llu,\"drafted\":%llu,\"accepted\":%llu,"
           "\"emitted\":%llu,\"acceptance\":%.4f,\"tokens_per_round\":%.4f,\"total_ms\":%.4f,\"ms_per_round\":%.4f",
           p->name, p->device, c->ctx, level, level < 2 ? "phases" : "events", o->k, o->tokens, REPS, r->tok_s,
           (unsigned long long)a->rounds, (unsigned long long)a->drafted, (unsigned long long)a->accepted,
           (unsigned long long)a->emitted, sd_stats_acceptance_rate(a), s->tok_round, s->total_ms, s->ms_round);
    json_object("phase_ms", phase_names, s->phase_ms, TRACE_N_PHASES);
    json_object("phase_pct", phase_names, s->phase_pct, TRACE_N_PHASES);
    if (level >= 2) {
        json_object("vsplit_ms", split_names, s->split_ms, V_N);
        json_object("vsplit_pct", split_names, s->split_pct, V_N);
    } else {
        printf(",\"vsplit_ms\":null,\"vsplit_pct\":null");
    }
    printf(",\"event_pairs_lost\":%d,\"prefill_tokens\":%d,\"prefill_ms\":{\"target\":%.1f,\"draft\":%.1f},"
           "\"synth_ms\":{\"target\":%.1f,\"draft\":%.1f},\"weights_bytes\":{\"target\":%zu,\"draft\":%zu},"
           "\"state_bytes\":{\"target\":%zu,\"draft\":%zu}}\n",
           r->tb.pairs_lost, c->ctx - 1, c->t_prefill_ms, c->d_prefill_ms, p->t_synth_ms, p->d_synth_ms,
           p->t.w.arena_bytes, p->d.w.arena_bytes, c->ts.arena_bytes, c->ds.arena_bytes);
}

// Per level: the row, the burst's trace lines (TAG = NAME-ctxN-lL), the JSON line.
static void report_level(const model_pair *p, const context *c, const bench_opts *o, int level, const result *r) {
    const shares s = shares_of(&r->tb);
    print_row(c, level, r, &s);
    char tag[64], lines[1024];
    snprintf(tag, sizeof tag, "%s-ctx%d-l%d", p->name, c->ctx, level);
    trace_burst_format(&r->tb, tag, lines, sizeof lines);
    printf("%s", lines);
    print_json(p, c, o, level, r, &s);
    if (r->tb.pairs_lost)
        fprintf(stderr, "bench_gpu_trace: %s ctx %d: %d event pairs lost (at most %d a burst): the sub-split undercounts; "
                        "lower --tokens\n", p->name, c->ctx, r->tb.pairs_lost, TRACE_MAX_EVENT_PAIRS);
    fflush(stdout);
}

// One context: prefill, a warm-up burst, then levels 1 and 2 (events) best of REPS, reported.
static void rounds_at(const model_pair *p, int ctx, const bench_opts *o, sd_cuda_event_pool *pool) {
    context c;
    context_init(p, ctx, o, &c);
    static result best[2], r;
    memset(best, 0, sizeof best);
    uint64_t t0 = trace_now_ns();
    context_burst(p, &c, o, 1, NULL, &r);
    fprintf(stderr, "bench_gpu_trace: %s ctx %d: warm-up burst %.0f ms (%.1f tokens/s)\n", p->name, ctx, ms_since(t0), r.tok_s);
    for (int rep = 0; rep < REPS; rep++)
        for (int l = 0; l < 2; l++) {
            context_burst(p, &c, o, l + 1, l ? pool : NULL, &r);
            if (r.tok_s > best[l].tok_s) best[l] = r;
        }
    for (int l = 0; l < 2; l++) report_level(p, &c, o, l + 1, &best[l]);
    context_free(&c);
}

static int rounds_at_contexts(const bench_opts *o) {
    SD_BENCH_CK(cudaSetDevice(0));
    static model_pair p; // stays put: the states point into its models
    synth_pair(o->config ? o->config : "toy", &o->cfg, &p);
    sd_status st = {0};
    sd_cuda_event_pool pool;
    if (sd_cuda_events_init(&pool, &p.t, 2 * TRACE_MAX_EVENT_PAIRS, &st)) die(&st);
    print_table_head(&p, o);
    for (int i = 0; i < o->n_ctx; i++) rounds_at(&p, o->ctx[i], o, &pool);
    sd_cuda_events_free(&pool);
    sd_model_free(&p.t);
    sd_model_free(&p.d);
    return 0;
}

int main(int argc, char **argv) {
    static bench_opts o;
    const int rc = parse_args(argc, argv, &o);
    if (rc >= 0) return rc;
    if (sd_cuda_device_count() == 0) { printf("bench_gpu_trace: no CUDA device, nothing measured\n"); return 0; }
    return o.ctx_mode ? rounds_at_contexts(&o) : drain_against_events(&o);
}
