// bench_gpu_door.c — speculative rounds through the decode-graph door (engine/cuda/cuda_door.h)
// against the same rounds launched eagerly, on one GPU. Per config (weights synthesised on the
// device; the draft is the target's first --draft-layers layers, the target's other layers'
// residual writers scaled by --tail E, which sets the acceptance):
//   1. plain decode: ms per token, eager and graph (the door's captured step);
//   2. per draft depth k = 1 .. --kmax: ms per round and tokens/s, eager and graph, the graph's
//      speedup over eager, the measured acceptance and mean accepted length, the speculative
//      speedup over plain graph decode, and the speedup the measured acceptance and phase costs
//      predict (mean accepted length × plain step / the round's phase-sum per round, from a
//      level-1 trace of the graph rounds); and accept + rollback + maintenance as a share of the
//      round (level-1 trace);
//   3. the selection ledger armed: ms per round with its recorder inside the graphs (and the
//      drain after each round) against unarmed.
// Every timing is a host-clock median over --reps generations of --tokens tokens after a prompt
// of --prompt tokens. Prints a table and one JSON line per row ("bench":"gpu_door").
// usage: bench_gpu_door [--config NAME]... [--tail E]... [--kmax K] [--tokens N] [--prompt N] [--reps N]
//                       [--draft-layers N]
//        (NAME: a file in configs/ without .json; defaults: toy and kimi-linear-48b-a3b, E 0.1 and 1.0)
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "cuda_backend.h" // sd_cuda_device_count, sd_cuda_backend_of
#include "cuda_door.h"    // sd_cuda_door_*, sd_cuda_ledger_device
#include "cuda_synth.h"   // sd_cuda_model_synth
#include "decode.h"       // sd_decode
#include "ledger.h"
#include "spec.h"         // sd_spec_generate
#include "synth.h"        // sd_draft_config
#include "trace.h"        // trace_now_ns

#ifndef SPECDEC_SOURCE_DIR
#define SPECDEC_SOURCE_DIR "."
#endif

#define OKS(call)                                                                                 \
    do {                                                                                          \
        sd_status st_ = {0};                                                                      \
        if ((call) != SD_OK) {                                                                    \
            fprintf(stderr, "bench_gpu_door: %s: %s\n", #call, st_.msg);                          \
            exit(1);                                                                              \
        }                                                                                         \
    } while (0)

typedef struct {
    int kmax, tokens, prompt, reps, draft_layers;
} bench_opts;

static double now_ms(void) { return (double)trace_now_ns() * 1e-6; }
static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}
static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}
static const char *src_dir(void) {
    const char *d = getenv("SPECDEC_SOURCE_DIR");
    return d ? d : SPECDEC_SOURCE_DIR;
}

typedef struct {
    sd_model t, d;
    int V;
    int prompt[4096];
} pair;

static void make_pair(const char *name, float tail, const bench_opts *o, pair *p) {
    char path[4096];
    snprintf(path, sizeof path, "%s/configs/%s.json", src_dir(), name);
    sd_config cfg, dcfg;
    OKS(sd_config_load(path, &cfg, &st_));
    OKS(sd_draft_config(&cfg, o->draft_layers, &dcfg, &st_));
    const sd_synth_opts so = {.seed = 3, .dtype = SD_DT_BF16, .tail_from = o->draft_layers, .tail_scale = tail,
                              .depth = cfg.num_hidden_layers};
    OKS(sd_cuda_model_synth(&cfg, &so, 0, &p->t, &st_));
    OKS(sd_cuda_model_synth(&dcfg, &so, 0, &p->d, &st_));
    p->V = cfg.vocab_size;
    sd_synth_prompt(11, p->V, o->prompt, p->prompt);
}

static void free_pair(pair *p) {
    sd_model_free(&p->d);
    sd_model_free(&p->t);
}

// One generation: eager (door NULL: sd_spec_generate / sd_decode) or through a door; returns ms,
// fills stats (spec) and the trace when given.
typedef struct {
    int k;             // 0: plain decode
    bool graph, ledger;
    trace_burst *trace; // level 1, or NULL
} run_kind;

static double generate(pair *p, const bench_opts *o, const run_kind *rk, sd_accept_stats *stats) {
    const int k = rk->k, cap = o->prompt + o->tokens + 2 * (k + 2);
    sd_state ts = {0}, ds = {0};
    OKS(sd_model_state_init(&p->t, &ts, cap, k + 1 > 16 ? k + 1 : 16, &st_));
    if (k) OKS(sd_model_state_init(&p->d, &ds, cap, k + 1, &st_));
    int *out = malloc(sizeof(int) * (size_t)(o->tokens + SD_SPEC_MAX_K + 1));
    memset(stats, 0, sizeof *stats);
    ledger L;
    ledger_init(&L, sd_cuda_ledger_device(), rk->ledger);
    double t0 = 0;
    if (!rk->graph) {
        t0 = now_ms();
        if (k) {
            const sd_spec_opts so = {.k = k, .trace = rk->trace};
            OKS(sd_spec_generate(&p->t, &ts, &p->d, &ds, p->prompt, o->prompt, o->tokens, &so, out, stats, &st_));
        } else {
            OKS(sd_decode(&p->t, &ts, p->prompt, o->prompt, o->tokens, 0.0f, 0, NULL, out, &st_));
        }
    } else {
        OKS(sd_prefill(&p->t, &ts, p->prompt, o->prompt - 1, NULL, &st_));
        if (k) OKS(sd_prefill(&p->d, &ds, p->prompt, o->prompt - 1, NULL, &st_));
        sd_cuda_door *door;
        const sd_cuda_door_opts dop = {.k = k, .trace = rk->trace, .ledger = rk->ledger ? &L : NULL};
        OKS(sd_cuda_door_open(&p->t, &ts, k ? &p->d : NULL, k ? &ds : NULL, &dop, &door, &st_));
        // The first round or step captures: run it before the clock starts.
        int x = p->prompt[o->prompt - 1], emit[SD_SPEC_MAX_K + 1], n = 0, done = 0;
        uint32_t round = 0;
        if (k) {
            OKS(sd_cuda_door_round(door, x, round++, emit, &n, &st_));
            if (rk->trace) trace_burst_round(rk->trace, n, n + 1);
            done = n + 1;
            x = emit[n];
        } else {
            OKS(sd_cuda_door_step(door, x, &x, &st_));
            done = 1;
        }
        t0 = now_ms();
        while (done < o->tokens) {
            if (k) {
                OKS(sd_cuda_door_round(door, x, round++, emit, &n, &st_));
                sd_stats_add_round(stats, k, n, n + 1);
                if (rk->trace) trace_burst_round(rk->trace, n, n + 1); // the burst counts what its phases timed
                done += n + 1;
                x = emit[n];
            } else {
                OKS(sd_cuda_door_step(door, x, &x, &st_));
                done++;
            }
        }
        sd_cuda_door_close(door);
    }
    const double ms = now_ms() - t0;
    ledger_free(&L);
    free(out);
    sd_state_free(&ts);
    if (k) sd_state_free(&ds);
    return ms;
}

// The prompt's prefill alone (the target's, and the draft's when k > 0): what an eager run's clock
// holds besides its rounds.
static double prefill_only(pair *p, const bench_opts *o, int k) {
    const int cap = o->prompt + 8;
    sd_state ts = {0}, ds = {0};
    OKS(sd_model_state_init(&p->t, &ts, cap, 16, &st_));
    if (k) OKS(sd_model_state_init(&p->d, &ds, cap, k + 1, &st_));
    const double t0 = now_ms();
    OKS(sd_prefill(&p->t, &ts, p->prompt, o->prompt - 1, NULL, &st_));
    if (k) OKS(sd_prefill(&p->d, &ds, p->prompt, o->prompt - 1, NULL, &st_));
    const double ms = now_ms() - t0;
    sd_state_free(&ts);
    if (k) sd_state_free(&ds);
    return ms;
}

// Median ms over reps of the generation's rounds or steps (an eager run's prefill taken out);
// stats of the last rep.
static double timed(pair *p, const bench_opts *o, const run_kind *rk, sd_accept_stats *stats) {
    double *v = malloc(sizeof(double) * (size_t)o->reps);
    for (int i = 0; i < o->reps; i++)
        v[i] = generate(p, o, rk, stats) - (rk->graph ? 0.0 : prefill_only(p, o, rk->k));
    const double m = median(v, o->reps);
    free(v);
    return m;
}

static void run_config(const char *name, float tail, const bench_opts *o) {
    pair p;
    make_pair(name, tail, o, &p);
    sd_accept_stats s;
    const run_kind plain_e = {0}, plain_g = {.graph = true};
    const double pe = timed(&p, o, &plain_e, &s) / o->tokens, pg = timed(&p, o, &plain_g, &s) / (o->tokens - 1);
    printf("\n%s, tail %.2f: plain decode %.3f ms/token eager, %.3f graph (%.2fx)\n", name, tail, pe, pg, pe / pg);
    printf("{\"bench\":\"gpu_door_plain\",\"config\":\"%s\",\"tail\":%.2f,\"eager_ms_per_token\":%.4f,"
           "\"graph_ms_per_token\":%.4f}\n", name, tail, pe, pg);
    printf("%-22s %2s %10s %10s %6s %9s %9s %6s %6s %8s %8s %9s %9s\n", "config", "k", "eager_ms/r", "graph_ms/r", "g/e",
           "eager_t/s", "graph_t/s", "acc", "len", "vs_plain", "predict", "arm_share", "ledger_ms");
    for (int k = 1; k <= o->kmax; k++) {
        sd_accept_stats se, sg;
        const run_kind ke = {.k = k}, kg = {.k = k, .graph = true}, kl = {.k = k, .graph = true, .ledger = true};
        const double me = timed(&p, o, &ke, &se), mg = timed(&p, o, &kg, &sg), ml = timed(&p, o, &kl, &s);
        const double re = me / (double)se.rounds, rg = mg / (double)sg.rounds, rl = ml / (double)s.rounds;
        const double tps_e = 1e3 * o->tokens / me, tps_g = 1e3 * (double)sg.emitted / mg;
        const double len = sd_stats_mean_accepted_length(&sg), vs_plain = pg / (rg / len);
        // Phase costs of the graph rounds (level 1: one graph a phase, the host draining between).
        trace_burst tb;
        trace_burst_begin(&tb, 1, k, p.t.backend->sync, p.t.backend->sync_ctx);
        const run_kind kt = {.k = k, .graph = true, .trace = &tb};
        generate(&p, o, &kt, &s);
        double phase[TRACE_N_PHASES], sum = 0;
        for (int i = 0; i < TRACE_N_PHASES; i++) sum += phase[i] = (double)tb.phase_ns[i] * 1e-6 / (double)tb.acc.rounds;
        const double predict = len * pg / sum;
        const double arm = (phase[TRACE_PHASE_ACCEPT] + phase[TRACE_PHASE_ROLL] + phase[TRACE_PHASE_MAINT]) / sum;
        printf("%-22s %2d %10.3f %10.3f %6.2f %9.1f %9.1f %6.3f %6.2f %8.2f %8.2f %8.2f%% %9.3f\n", name, k, re, rg, re / rg,
               tps_e, tps_g, sd_stats_acceptance_rate(&sg), len, vs_plain, predict, 100.0 * arm, rl);
        printf("{\"bench\":\"gpu_door\",\"config\":\"%s\",\"tail\":%.2f,\"k\":%d,\"eager_ms_per_round\":%.4f,"
               "\"graph_ms_per_round\":%.4f,\"eager_tokens_per_s\":%.1f,\"graph_tokens_per_s\":%.1f,"
               "\"acceptance\":%.4f,\"mean_accepted_length\":%.3f,\"speedup_vs_plain\":%.3f,\"predicted_speedup\":%.3f,"
               "\"accept_roll_maint_share\":%.4f,\"ledger_ms_per_round\":%.4f,\"phase_ms\":{\"draft\":%.4f,"
               "\"verify\":%.4f,\"accept\":%.4f,\"roll\":%.4f,\"maint\":%.4f}}\n",
               name, tail, k, re, rg, tps_e, tps_g, sd_stats_acceptance_rate(&sg), len, vs_plain, predict, arm, rl,
               phase[0], phase[1], phase[2], phase[3], phase[4]);
        fflush(stdout);
    }
    free_pair(&p);
}

int main(int argc, char **argv) {
    bench_opts o = {.kmax = 8, .tokens = 96, .prompt = 32, .reps = 3, .draft_layers = 2};
    const char *configs[8];
    float tails[8];
    int n_cfg = 0, n_tail = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--config") && i + 1 < argc && n_cfg < 8) configs[n_cfg++] = argv[++i];
        else if (!strcmp(argv[i], "--tail") && i + 1 < argc && n_tail < 8) tails[n_tail++] = strtof(argv[++i], NULL);
        else if (!strcmp(argv[i], "--kmax") && i + 1 < argc) o.kmax = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--tokens") && i + 1 < argc) o.tokens = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--prompt") && i + 1 < argc) o.prompt = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc) o.reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--draft-layers") && i + 1 < argc) o.draft_layers = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: bench_gpu_door [--config NAME]... [--tail E]... [--kmax K] [--tokens N] [--prompt N] "
                            "[--reps N] [--draft-layers N]\n");
            return 2;
        }
    }
    if (o.kmax < 1 || o.kmax > SD_SPEC_MAX_K || o.tokens < 2 || o.prompt < 2 || o.prompt > 4096 || o.reps < 1 ||
        o.draft_layers < 1) {
        fprintf(stderr, "bench_gpu_door: need 1 <= --kmax <= %d, --tokens >= 2, 2 <= --prompt <= 4096, --reps >= 1\n",
                SD_SPEC_MAX_K);
        return 2;
    }
    if (!n_cfg) configs[n_cfg++] = "toy", configs[n_cfg++] = "kimi-linear-48b-a3b";
    if (!n_tail) tails[n_tail++] = 0.1f, tails[n_tail++] = 1.0f;
    if (sd_cuda_device_count() < 1) {
        printf("bench_gpu_door: no CUDA device: skipped\n");
        return 0;
    }
    for (int c = 0; c < n_cfg; c++)
        for (int t = 0; t < n_tail; t++) run_config(configs[c], tails[t], &o);
    return 0;
}
