// bench_gpu_tp.c — the tensor-parallel step on devices (docs/PARALLEL.md), at every N the machine
// has: per config (default kimi-linear-48b-a3b, bf16 weights synthesised on the devices — each
// rank only its shard, cuda_synth.h), a prompt of --ctx tokens prefilled, then at that context
//   - the decode step (T = 1) and the verify pass (T = k + 1), eager (sd_forward: the argmaxes come
//     back) and graph (one captured forward replayed on every rank, its collectives inside);
//     each rolled back so every repetition sees the same context; rank 0's host-clock median;
//   - the step's collectives alone: its 2L all-reduces of T × D floats (all-gather + rank-order
//     sum) and the head's argmax gather, eager and graph, on the same ranks: their share of the
//     step (the walk runs them in stream order, so nothing overlaps them);
//   - speedup and scaling efficiency against the N = 1 group (speedup / N).
// Rows for N = 1, 2, 4, 8 up to the devices present (--ranks N... picks others), first the whole
// model on one device with no group (the N = 1 group's overhead against it). N that the machine
// lacks are named as not run. Prints a table and one JSON line per row ("bench":"gpu_tp").
// usage: bench_gpu_tp [--config NAME] [--ctx N] [--reps N] [--k K] [--ranks N]... [--seed S]
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "cuda_backend.h"  // sd_cuda_backend_of, sd_cuda_device_count
#include "cuda_graph.h"    // sd_cuda_graph_capture, sd_cuda_graph_forward
#include "cuda_scratch.h"  // sd_cuda_scratch_of
#include "cuda_synth.h"    // sd_cuda_model_synth
#include "cuda_tp.h"       // sd_cuda_tp_group_synth
#include "gpu_bench.h"     // SD_BENCH_CK, SD_BENCH_OK
#include "model.h"
#include "tp_head.h"       // sd_cuda_tp_pick
#include "tp_reduce.h"     // sd_cuda_tp_reduce
#include "trace.h"         // trace_now_ns

#ifndef SPECDEC_SOURCE_DIR
#define SPECDEC_SOURCE_DIR "."
#endif

const char *sd_bench_prog = "bench_gpu_tp";

static double now_ms(void) { return (double)trace_now_ns() * 1e-6; }

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}
static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

enum { ARM_EAGER, ARM_GRAPH, N_ARMS };
static const char *arm_name[N_ARMS] = {"eager", "graph"};
enum { WHAT_STEP, WHAT_COLL, N_WHAT };

typedef struct {
    int ctx, reps, T, arm, what;
    const int *prompt;
    double ms; // rank 0's median
} job;

// A step's collectives alone, as the walk and the head issue them: 2L all-reduces of the T × D
// partial (x->mix gathered, summed into x->x) and the head's argmax gather of T pairs.
static sd_code collectives(const sd_model *m, sd_state *s, int T, sd_status *st) {
    sd_comm *c = m->comm;
    const sd_cuda_scratch g = sd_cuda_scratch_of(s);
    cudaStream_t q = sd_cuda_backend_of(m)->stream;
    const size_t n = (size_t)T * m->cfg.hidden_size;
    for (int i = 0; i < m->cfg.num_hidden_layers; i++)
        for (int part = 0; part < 2; part++) {
            SD_TRY(sd_comm_gather_to(c, SD_COMM_ALL_REDUCE, i, part ? "ffn" : "mixer", s->scratch.mix, n * sizeof(float),
                                     g.tp_gather, st));
            SD_TRY(sd_cuda_tp_reduce(g.tp_gather, c->ranks, n, s->scratch.x, true, q, st));
        }
    return sd_comm_gather_to(c, SD_COMM_ALL_GATHER, -1, "head argmax", g.tp_pairs, sizeof(sd_cuda_tp_pick) * (size_t)T,
                             g.tp_gather, st);
}

typedef struct {
    cudaGraphExec_t exec;
    cudaStream_t q;
} coll_graph;

static sd_code launch_coll(void *ctx, sd_status *st) {
    const coll_graph *cg = ctx;
    if (cudaGraphLaunch(cg->exec, cg->q) != cudaSuccess) return sd_fail(st, SD_ERR_SYS, "bench: graph launch failed");
    return SD_OK;
}

// The collectives captured once into a graph (every rank alike).
static sd_code capture_coll(const sd_model *m, sd_state *s, int T, coll_graph *cg, sd_comm_window *w, sd_status *st) {
    cg->q = sd_cuda_backend_of(m)->stream;
    cudaGraph_t graph = NULL;
    if (cudaStreamBeginCapture(cg->q, cudaStreamCaptureModeThreadLocal) != cudaSuccess)
        return sd_fail(st, SD_ERR_SYS, "bench: begin capture failed");
    sd_comm_capture_begin(m->comm);
    sd_code rc = collectives(m, s, T, st);
    const cudaError_t e = cudaStreamEndCapture(cg->q, &graph);
    if (!rc) rc = sd_comm_capture_end(m->comm, w, st);
    else sd_comm_capture_end(m->comm, w, NULL);
    if (!rc && (e != cudaSuccess || cudaGraphInstantiate(&cg->exec, graph, 0) != cudaSuccess))
        rc = sd_fail(st, SD_ERR_SYS, "bench: capture of the collectives failed");
    if (graph) cudaGraphDestroy(graph);
    return rc;
}

// One timed unit of work of the job on this rank (its drain included).
static sd_code unit(job *j, const sd_model *m, sd_state *s, const int *toks, sd_cuda_graph *g, coll_graph *cg,
                    const sd_comm_window *w, sd_status *st) {
    int top[64];
    if (j->what == WHAT_COLL) {
        if (cg->exec) SD_TRY(sd_comm_replay(m->comm, w, launch_coll, cg, st));
        else SD_TRY(collectives(m, s, j->T, st));
        if (cudaStreamSynchronize(sd_cuda_backend_of(m)->stream) != cudaSuccess) return sd_fail(st, SD_ERR_SYS, "bench: sync failed");
        return sd_comm_check(m->comm, st);
    }
    if (g->exec) SD_TRY(sd_cuda_graph_forward(g, toks, top, st));
    else SD_TRY(sd_forward(m, s, toks, j->T, NULL, 0, &(sd_forward_opts){.argmax = top}, st));
    return sd_state_commit(s, 0, st);
}

// A rank's part: the prompt prefilled, a warm-up, then reps timed units (rank 0 keeps the median).
static sd_code bench_rank(void *ctx, int rank, const sd_model *m, sd_status *st) {
    job *j = ctx;
    sd_state s;
    SD_TRY(sd_model_state_init(m, &s, j->ctx + j->T + 1, j->T > 9 ? j->T : 9, st));
    int toks[64];
    for (int i = 0; i < j->T; i++) toks[i] = (j->prompt[i] * 7 + 3 * i) % m->cfg.vocab_size;
    sd_cuda_graph g = {0};
    coll_graph cg = {0};
    sd_comm_window w = {0};
    double *ms = malloc(sizeof(double) * (size_t)j->reps);
    sd_code rc = ms ? sd_prefill(m, &s, j->prompt, j->ctx, NULL, st) : sd_fail(st, SD_ERR_SYS, "out of memory");
    if (!rc) rc = unit(j, m, &s, toks, &g, &cg, &w, st); // eager warm-up: kernels loaded, buffers grown
    if (!rc && j->arm == ARM_GRAPH && j->what == WHAT_STEP) rc = sd_cuda_graph_capture(m, &s, j->T, &g, st);
    if (!rc && j->arm == ARM_GRAPH && j->what == WHAT_COLL) rc = capture_coll(m, &s, j->T, &cg, &w, st);
    for (int i = 0; !rc && i < 3; i++) rc = unit(j, m, &s, toks, &g, &cg, &w, st);
    for (int i = 0; !rc && i < j->reps; i++) {
        const double t0 = now_ms();
        rc = unit(j, m, &s, toks, &g, &cg, &w, st);
        ms[i] = now_ms() - t0;
    }
    if (!rc && rank == 0) j->ms = median(ms, j->reps);
    if (g.exec) sd_cuda_graph_free(&g);
    if (cg.exec) cudaGraphExecDestroy(cg.exec);
    sd_comm_window_free(&w);
    free(ms);
    sd_state_free(&s);
    return rc;
}

typedef struct {
    const char *config, *devices;
    int N, ctx, k, reps;
} row_ctx;

static void print_row(const row_ctx *r, int T, const char *arm, double ms, double ms_n1, double coll_ms) {
    const double speedup = ms_n1 > 0 ? ms_n1 / ms : 0, eff = r->N > 0 && ms_n1 > 0 ? speedup / r->N : 0;
    const double share = coll_ms > 0 ? coll_ms / ms : 0;
    char ranks[16], sp[16] = "-", ef[16] = "-", cm[16] = "-", sh[16] = "-";
    snprintf(ranks, sizeof ranks, r->N ? "%d" : "none", r->N);
    if (speedup > 0) snprintf(sp, sizeof sp, "%.2fx", speedup), snprintf(ef, sizeof ef, "%.1f%%", 100 * eff);
    if (coll_ms > 0) snprintf(cm, sizeof cm, "%.3f", coll_ms), snprintf(sh, sizeof sh, "%.1f%%", 100 * share);
    printf("%-22s %5s %-7s %-6s %2d %9.3f %9s %8s %9s %7s\n", r->config, ranks, T == 1 ? "decode" : "verify", arm, T, ms, sp, ef,
           cm, sh);
    printf("{\"bench\":\"gpu_tp\",\"config\":\"%s\",\"ranks\":%d,\"devices\":\"%s\",\"phase\":\"%s\",\"T\":%d,\"k\":%d,"
           "\"arm\":\"%s\",\"ctx\":%d,\"reps\":%d,\"ms_median\":%.4f,\"speedup_vs_1\":%.4f,\"efficiency\":%.4f,"
           "\"collectives_ms\":%.4f,\"collectives_share\":%.4f}\n",
           r->config, r->N, r->devices, T == 1 ? "decode" : "verify", T, T - 1, arm, r->ctx, r->reps, ms, speedup, eff, coll_ms,
           share);
    fflush(stdout);
}

int main(int argc, char **argv) {
    const char *config = "kimi-linear-48b-a3b";
    int ctx = 256, reps = 20, k = 4, ranks[16], n_ranks = 0;
    uint64_t seed = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--config") && i + 1 < argc) config = argv[++i];
        else if (!strcmp(argv[i], "--ctx") && i + 1 < argc) ctx = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--k") && i + 1 < argc) k = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--ranks") && i + 1 < argc && n_ranks < 16) ranks[n_ranks++] = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--seed") && i + 1 < argc) seed = strtoull(argv[++i], NULL, 0);
        else {
            fprintf(stderr, "usage: bench_gpu_tp [--config NAME] [--ctx N] [--reps N] [--k K] [--ranks N]... [--seed S]\n");
            return 2;
        }
    }
    if (reps < 1 || ctx < 1 || k < 1 || k > 31) {
        fprintf(stderr, "bench_gpu_tp: need --reps >= 1, --ctx >= 1, 1 <= --k <= 31\n");
        return 2;
    }
    const int devices = sd_cuda_device_count();
    if (devices < 1) {
        fprintf(stderr, "bench_gpu_tp: no CUDA device\n");
        return 1;
    }
    if (!n_ranks)
        for (int N = 1; N <= 8; N *= 2) ranks[n_ranks++] = N;
    const char *src = getenv("SPECDEC_SOURCE_DIR") ? getenv("SPECDEC_SOURCE_DIR") : SPECDEC_SOURCE_DIR;
    char path[4096];
    snprintf(path, sizeof path, "%s/configs/%s.json", src, config);
    sd_config cfg;
    SD_BENCH_OK(sd_config_load(path, &cfg, &st_));
    const sd_synth_opts so = {.seed = seed, .dtype = SD_DT_BF16, .tail_from = SD_MAX_LAYERS, .tail_scale = 1.0f};
    int *prompt = malloc(sizeof(int) * (size_t)ctx);
    for (int i = 0; i < ctx; i++) prompt[i] = (int)((1103515245u * (unsigned)i + 12345u) % (unsigned)cfg.vocab_size);
    const int Ts[2] = {1, k + 1};
    printf("%-22s %5s %-7s %-6s %2s %9s %9s %8s %9s %7s\n", "config", "ranks", "phase", "arm", "T", "ms", "speedup", "eff",
           "coll ms", "coll %");

    // The whole model on one device, no group.
    {
        sd_model dev;
        const double t0 = now_ms();
        SD_BENCH_OK(sd_cuda_model_synth(&cfg, &so, 0, &dev, &st_));
        fprintf(stderr, "bench_gpu_tp: %s synthesised on device 0 in %.0f ms\n", config, now_ms() - t0);
        char name[300];
        snprintf(name, sizeof name, "%s", sd_cuda_backend_of(&dev)->device_name);
        const row_ctx r = {.config = config, .devices = name, .N = 0, .ctx = ctx, .k = k, .reps = reps};
        for (int t = 0; t < 2; t++)
            for (int arm = 0; arm < N_ARMS; arm++) {
                job j = {.ctx = ctx, .reps = reps, .T = Ts[t], .arm = arm, .what = WHAT_STEP, .prompt = prompt};
                SD_BENCH_OK(bench_rank(&j, 0, &dev, &st_));
                print_row(&r, Ts[t], arm_name[arm], j.ms, 0, 0);
            }
        sd_model_free(&dev);
    }

    double ms_n1[2][N_ARMS] = {{0}};
    for (int ri = 0; ri < n_ranks; ri++) {
        const int N = ranks[ri];
        if (N < 1 || N > devices) {
            printf("# %d ranks: not run (%d CUDA device%s here; a rank needs a device of its own)\n", N, devices, devices == 1 ? "" : "s");
            continue;
        }
        sd_tp_group g;
        const sd_cuda_tp_opts o = {.ranks = N, .rank = -1, .timeout_s = 30, .canary_layer = -1};
        const double t0 = now_ms();
        SD_BENCH_OK(sd_cuda_tp_group_synth(&g, &cfg, &so, &o, &st_));
        char names[2048];
        sd_cuda_tp_devices(&g, names, sizeof names);
        fprintf(stderr, "bench_gpu_tp: %d rank%s synthesised in %.0f ms: %s\n", N, N == 1 ? "" : "s", now_ms() - t0, names);
        const row_ctx r = {.config = config, .devices = names, .N = N, .ctx = ctx, .k = k, .reps = reps};
        for (int t = 0; t < 2; t++)
            for (int arm = 0; arm < N_ARMS; arm++) {
                job step = {.ctx = ctx, .reps = reps, .T = Ts[t], .arm = arm, .what = WHAT_STEP, .prompt = prompt};
                job coll = step;
                coll.what = WHAT_COLL;
                SD_BENCH_OK(sd_tp_group_run(&g, bench_rank, &step, NULL, &st_));
                SD_BENCH_OK(sd_tp_group_run(&g, bench_rank, &coll, NULL, &st_));
                if (N == 1) ms_n1[t][arm] = step.ms;
                print_row(&r, Ts[t], arm_name[arm], step.ms, ms_n1[t][arm], coll.ms);
            }
        sd_tp_group_free(&g);
    }
    free(prompt);
    return 0;
}
