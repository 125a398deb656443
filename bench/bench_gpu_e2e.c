// bench_gpu_e2e.c — the whole forward on one GPU, eager (no graphs), against the HBM roofline:
//   1. copy bandwidth: a large cudaMemcpyDeviceToDevice, bytes read + written over the median
//      time — the ceiling every row below is measured against;
//   2. per config (weights synthesised ON the device, cuda_synth.h: kimi-linear-48b-a3b is ~98 GB
//      in bf16), a prompt of --ctx tokens prefilled, then at that context the decode step (T = 1)
//      and the verify pass (T = k+1, k = 1..kmax), each rolled back after the step so every
//      repetition sees the same context: host-clock median over --reps steps (sd_forward drains
//      the stream; each row's argmax comes back, as in a decode step or a greedy verify); then
//      the decode step and the largest verify again as replays of one captured CUDA graph
//      (cuda_graph.h, arm "graph"): the launch overhead eager mode pays; then the stream-launched
//      steps in plain stream order (kernels/pdl.h, arm "device/off"): what the launch overlap buys;
//   3. the bytes a step must move: every weight read once (embedding rows of the T tokens, every
//      non-expert tensor, lm_head), the DISTINCT routed experts the step's tokens select (counted
//      from the routing of the same step, per layer, through opts.on_route), the KDA state read
//      once and written per token (+ the conv window), the MLA latent cache read (+ written);
//      % roofline = bytes / copy bandwidth / time;
//   4. per sublayer (one KDA mixer, one MLA mixer, one MoE block, lm_head: the head's final norm
//      fused into the lm_head launch, as a forward runs it) at T = 1 and T = kmax+1:
//      device time from events over back-to-back calls, against that sublayer's bytes;
//   5. a level-2 trace pass: how the step splits into KDA / MLA / FFN (drains at each bucket, so
//      the sum exceeds the clean step);
//   6. at T = 1, the RMSNorm fused into a sublayer's first launch against norm kernel + launch.
// Prints a table and one JSON line per row ("bench":"gpu_e2e").
// usage: bench_gpu_e2e [--config NAME]... [--ctx N] [--reps N] [--kmax K] [--seed S] [--eager] [--decode-only]
//                      [--profile]
//        (NAME: a file in configs/ without .json; default toy and kimi-linear-48b-a3b).
//        --decode-only: only the decode step and the T = 2 .. kmax+1 verify passes, stream and
//        graph (the rows a speed comparison between builds needs). --profile: after the prefill,
//        only one decode step, one verify pass and one decode step replayed from a captured graph
//        (steps 0-2) between cudaProfilerStart and Stop (for `ncu --profile-from-start off` and
//        bench/ktrace.c), no timing.
#include <cuda_profiler_api.h>
#include <cuda_runtime_api.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "cuda_backend.h" // sd_cuda_backend_of, sd_cuda_state_init
#include "cuda_graph.h"   // sd_cuda_graph_capture, sd_cuda_graph_forward
#include "cuda_layers.h"  // sd_cuda_kda_forward, sd_cuda_mla_forward, sd_cuda_moe_forward
#include "cuda_synth.h"   // sd_cuda_model_synth
#include "linear.h"       // sd_cuda_linear, sd_cuda_linear_multi(_norm)
#include "pdl.h"          // sd_cuda_pdl
#include "rows.h"         // sd_cuda_rmsnorm
#include "model.h"
#include "trace.h"        // trace_now_ns, trace_burst

#ifndef SPECDEC_SOURCE_DIR
#define SPECDEC_SOURCE_DIR "."
#endif

#define CK(call)                                                                                  \
    do {                                                                                          \
        cudaError_t e_ = (call);                                                                  \
        if (e_ != cudaSuccess) {                                                                  \
            fprintf(stderr, "bench_gpu_e2e: %s: %s (%s:%d)\n", #call, cudaGetErrorString(e_), __FILE__, __LINE__); \
            exit(1);                                                                              \
        }                                                                                         \
    } while (0)
#define OKS(call)                                                                                 \
    do {                                                                                          \
        sd_status st_ = {0};                                                                      \
        if ((call) != SD_OK) {                                                                    \
            fprintf(stderr, "bench_gpu_e2e: %s: %s\n", #call, st_.msg);                           \
            exit(1);                                                                              \
        }                                                                                         \
    } while (0)

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

// ---------------------------------------------------------------------------- the ceiling
// Bytes read + written per second of a large device-to-device copy (median of 10).
static double copy_bandwidth(size_t bytes) {
    void *a, *b;
    CK(cudaMalloc(&a, bytes));
    CK(cudaMalloc(&b, bytes));
    CK(cudaMemset(a, 1, bytes));
    CK(cudaMemset(b, 2, bytes));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    double ms[10];
    for (int i = -2; i < 10; i++) {
        CK(cudaEventRecord(e0, 0));
        CK(cudaMemcpyAsync(i & 1 ? a : b, i & 1 ? b : a, bytes, cudaMemcpyDeviceToDevice, 0));
        CK(cudaEventRecord(e1, 0));
        CK(cudaEventSynchronize(e1));
        float t;
        CK(cudaEventElapsedTime(&t, e0, e1));
        if (i >= 0) ms[i] = t;
    }
    const double m = median(ms, 10);
    CK(cudaEventDestroy(e0));
    CK(cudaEventDestroy(e1));
    CK(cudaFree(a));
    CK(cudaFree(b));
    return 2.0 * (double)bytes / (m * 1e-3);
}

// ---------------------------------------------------------------------------- bytes of a step
typedef struct {
    int L, E;
    unsigned char *seen; // (L, E): expert e of layer l selected by some token of the step
} route_seen;

static void on_route(void *ctx, int layer, int pos, const int *sel, const float *w, int k, float margin) {
    (void)pos, (void)w, (void)margin;
    route_seen *r = ctx;
    for (int j = 0; j < k; j++) r->seen[(size_t)layer * r->E + sel[j]] = 1;
}
static int distinct_of(const route_seen *r, int layer) {
    int n = 0;
    for (int e = 0; e < r->E; e++) n += r->seen[(size_t)layer * r->E + e];
    return n;
}

typedef struct { double dense, embed, head, experts, kda, mla; } step_bytes;
static double total_of(const step_bytes *b) { return b->dense + b->embed + b->head + b->experts + b->kda + b->mla; }

static size_t tensor_bytes(const sd_weight_spec *s) {
    return (size_t)s->shape[0] * (size_t)(s->ndim == 2 ? s->shape[1] : 1) * sd_dtype_size(s->dtype);
}
// A routed expert's tensor (model.layers.i.<moe>.experts.j.*; not the shared experts), and an FFN's.
static bool is_routed(const sd_weight_spec *s) { return strstr(s->name, ".experts.") != NULL; }
static bool is_ffn(const sd_weight_spec *s) { return strstr(s->name, ".mlp.") || strstr(s->name, ".block_sparse_moe."); }

// KDA state: S read once and written per token (fp32), the conv window rows read and the T new
// rows written. MLA: the latent + rope cache rows 0 .. pos0+T-1 read once, T rows written.
static double kda_state_bytes(const sd_config *c, int T) {
    const double S = (double)c->kda_num_heads * c->kda_head_dim * c->kda_head_dim * 4;
    const double row = 3.0 * sd_config_kda_dim(c) * 4;
    return S * (1 + T) + row * (c->short_conv_kernel_size - 1 + 2 * T);
}
static double mla_cache_bytes(const sd_config *c, int pos0, int T) {
    return (double)(c->kv_lora_rank + c->qk_rope_head_dim) * 4 * (pos0 + 2 * T);
}
static double expert_bytes(const sd_model *m, int layer) {
    const sd_ffn_weights *x = &m->w.layers[layer].moe.experts[0];
    return (double)x->gate.rows * x->gate.cols * sd_dtype_size(x->gate.dtype) +
           (double)x->up.rows * x->up.cols * sd_dtype_size(x->up.dtype) +
           (double)x->down.rows * x->down.cols * sd_dtype_size(x->down.dtype);
}

static step_bytes bytes_of_step(const sd_model *m, const route_seen *r, int pos0, int T) {
    const sd_config *c = &m->cfg;
    step_bytes b = {0};
    for (int i = 0; i < m->w.n_specs; i++) {
        const sd_weight_spec *s = &m->w.specs[i];
        if (is_routed(s)) continue;
        if (strcmp(s->name, "model.embed_tokens.weight") == 0) {
            b.embed = (double)T * s->shape[1] * sd_dtype_size(s->dtype);
            if (c->tie_word_embeddings) b.head = (double)tensor_bytes(s);
        } else if (strcmp(s->name, "lm_head.weight") == 0) {
            b.head = (double)tensor_bytes(s);
        } else {
            b.dense += (double)tensor_bytes(s);
        }
    }
    for (int l = 0; l < c->num_hidden_layers; l++) {
        if (m->w.layers[l].is_moe) b.experts += distinct_of(r, l) * expert_bytes(m, l);
        if (c->mixer[l] == SD_MIXER_KDA) b.kda += kda_state_bytes(c, T);
        else b.mla += mla_cache_bytes(c, pos0, T);
    }
    return b;
}

// Bytes of one layer's tensors: the mixer (with its input norm) or the FFN (with its norm; the
// routed experts as `distinct` of them).
static double layer_bytes(const sd_model *m, int layer, bool ffn, int distinct) {
    double b = 0;
    for (int i = 0; i < m->w.n_specs; i++) {
        const sd_weight_spec *s = &m->w.specs[i];
        if (s->layer != layer || is_routed(s)) continue;
        const bool f = is_ffn(s) || strstr(s->name, "post_attention_layernorm");
        if (f == ffn) b += (double)tensor_bytes(s);
    }
    if (ffn && m->w.layers[layer].is_moe) b += distinct * expert_bytes(m, layer);
    return b;
}

// ---------------------------------------------------------------------------- one config
typedef struct {
    int ctx, reps, kmax, eager, profile, decode_only;
    uint64_t seed;
    double bw;
    char device[256];
} bench_opts;

static void tokens_of(uint32_t seed, int V, int n, int *out) {
    uint32_t x = seed * 2654435761u + 12345u;
    for (int i = 0; i < n; i++) {
        x ^= x << 13; x ^= x >> 17; x ^= x << 5;
        out[i] = (int)(x % (uint32_t)V);
    }
}

static void print_row(const char *config, const char *arm, int T, const bench_opts *o, double med, double mn, double p90,
                      const step_bytes *b, double distinct_avg, const double split[4]) {
    const double bytes = total_of(b), gbs = bytes / (med * 1e-3) / 1e9, pct = 100.0 * bytes / (o->bw * med * 1e-3);
    printf("%-22s %-10s %2d %9.3f %9.3f %8.3f %7.1f %8.1f %6.1f%%\n", config, arm, T, med, mn, bytes / 1e9, distinct_avg, gbs,
           pct);
    printf("{\"bench\":\"gpu_e2e\",\"config\":\"%s\",\"device\":\"%s\",\"moe_arm\":\"%s\",\"phase\":\"%s\",\"T\":%d,\"k\":%d,"
           "\"ctx\":%d,\"reps\":%d,\"ms_median\":%.4f,\"ms_min\":%.4f,\"ms_p90\":%.4f,\"bytes\":%.0f,\"bytes_dense\":%.0f,"
           "\"bytes_embed\":%.0f,\"bytes_lm_head\":%.0f,\"bytes_experts\":%.0f,\"bytes_kda_state\":%.0f,"
           "\"bytes_mla_cache\":%.0f,\"distinct_experts_per_moe_layer\":%.2f,\"copy_bw_gbs\":%.1f,\"achieved_gbs\":%.1f,"
           "\"pct_roofline\":%.2f,\"trace2_ms\":{\"vkda\":%.3f,\"scan\":%.3f,\"vmla\":%.3f,\"vffn\":%.3f}}\n",
           config, o->device, arm, T == 1 ? "decode" : "verify", T, T - 1, o->ctx, o->reps, med, mn, p90, bytes, b->dense,
           b->embed, b->head, b->experts, b->kda, b->mla, distinct_avg, o->bw / 1e9, gbs, pct, split[0], split[1], split[2],
           split[3]);
    fflush(stdout);
}

// One step of T tokens at the current context, rolled back afterwards. It ends as a decode step
// or a greedy verify does: each row's argmax (T ints) comes back, the logits stay on the device.
static void step(const sd_model *dev, sd_state *s, const int *toks, int T, const sd_forward_opts *opts) {
    int top[64];
    sd_forward_opts o = opts ? *opts : (sd_forward_opts){0};
    o.argmax = top;
    OKS(sd_forward(dev, s, toks, T, NULL, 0, &o, &st_));
    OKS(sd_state_commit(s, 0, &st_));
}

// How a measured step runs: sd_forward with the device-table MoE arm, with the eager arm, or as
// a replay of a CUDA graph captured once (cuda_graph.h; device-table arm).
typedef enum { ARM_DEVICE, ARM_EAGER, ARM_GRAPH } step_arm;
static const char *arm_name[] = {"device", "eager", "graph"};

// One timed step: as step(), or one graph replay (then rolled back the same way).
static void timed_step(const sd_model *dev, sd_state *s, const int *toks, int T, sd_cuda_graph *g) {
    if (!g) return step(dev, s, toks, T, NULL);
    int top[64];
    OKS(sd_cuda_graph_forward(g, toks, top, &st_));
    OKS(sd_state_commit(s, 0, &st_));
}

// One row (print_row); returns its median step in ms.
static double measure(const char *config, const sd_model *dev, sd_state *s, int T, step_arm arm, const bench_opts *o) {
    const sd_config *c = &dev->cfg;
    sd_cuda_backend *b = sd_cuda_backend_of(dev);
    b->moe_arm = arm == ARM_EAGER ? SD_CUDA_MOE_EAGER : SD_CUDA_MOE_DEVICE_TABLE;
    int toks[64];
    tokens_of(1000u + (uint32_t)T, c->vocab_size, T, toks);
    // The routing of this very step (deterministic: the same tokens at the same context).
    route_seen r = {.L = c->num_hidden_layers, .E = c->num_experts};
    r.seen = calloc((size_t)r.L * (r.E ? r.E : 1), 1);
    const sd_forward_opts ropts = {.on_route = on_route, .route_ctx = &r};
    step(dev, s, toks, T, &ropts);
    int n_moe = 0;
    double distinct = 0;
    for (int l = 0; l < c->num_hidden_layers; l++)
        if (dev->w.layers[l].is_moe) { distinct += distinct_of(&r, l); n_moe++; }
    sd_cuda_graph graph, *g = NULL;
    if (arm == ARM_GRAPH) {
        OKS(sd_cuda_graph_capture(dev, s, T, &graph, &st_));
        g = &graph;
    }
    for (int i = 0; i < 3; i++) timed_step(dev, s, toks, T, g);
    double *ms = malloc(sizeof(double) * (size_t)o->reps);
    for (int i = 0; i < o->reps; i++) {
        const double t0 = now_ms();
        timed_step(dev, s, toks, T, g);
        ms[i] = now_ms() - t0;
    }
    if (g) sd_cuda_graph_free(g);
    const double med = median(ms, o->reps), mn = ms[0], p90 = ms[(int)(0.9 * (o->reps - 1))];
    // Level-2 split (drains around each bucket).
    trace_burst tb;
    trace_burst_begin(&tb, 2, T - 1, dev->backend->sync, dev->backend->sync_ctx);
    const sd_forward_opts topts = {.trace = &tb};
    step(dev, s, toks, T, &topts);
    const double split[4] = {tb.bucket_ns[TRACE_BUCKET_VKDA] * 1e-6, tb.bucket_ns[TRACE_BUCKET_SCAN] * 1e-6,
                             tb.bucket_ns[TRACE_BUCKET_VMLA] * 1e-6, tb.bucket_ns[TRACE_BUCKET_VFFN] * 1e-6};
    const step_bytes sb = bytes_of_step(dev, &r, s->len, T);
    char arm_label[64];
    snprintf(arm_label, sizeof arm_label, "%s%s", arm_name[arm], sd_cuda_pdl_on() || arm == ARM_GRAPH ? "" : "/off");
    print_row(config, arm_label, T, o, med, mn, p90, &sb, n_moe ? distinct / n_moe : 0, split);
    free(ms);
    free(r.seen);
    b->moe_arm = SD_CUDA_MOE_DEVICE_TABLE;
    return med;
}

// Device time per call of one sublayer over back-to-back calls (events), against its bytes.
typedef enum { SUB_KDA, SUB_MLA, SUB_MOE, SUB_HEAD } sub_kind;

// The head's one launch (engine/cuda/head.c's): rmsnorm(h, final_norm) fused into lm_head.
static sd_code head_launch(const sd_model *dev, sd_state *s, int T, cudaStream_t q) {
    const sd_config *c = &dev->cfg;
    sd_status st = {0};
    const sd_lin_norm norm = {.x = s->scratch.x, .w = dev->w.final_norm, .eps = c->rms_norm_eps, .n = c->hidden_size,
                              .out = s->scratch.a};
    const sd_lin_job j = {.w = &dev->w.lm_head, .x = s->scratch.a, .ldx = c->hidden_size, .y = s->scratch.logits,
                          .ldy = c->vocab_size, .mode = SD_LIN_STORE};
    const sd_code rc = sd_cuda_linear_multi_norm(&j, 1, T, &norm, q, &st);
    if (rc) fprintf(stderr, "bench_gpu_e2e: head launch: %s\n", st.msg);
    return rc;
}

static void sublayers(const char *config, const sd_model *dev, sd_state *s, int T, const bench_opts *o) {
    const sd_config *c = &dev->cfg;
    sd_cuda_backend *b = sd_cuda_backend_of(dev);
    sd_scratch *x = &s->scratch;
    int kda = -1, mla = -1, moe = -1;
    for (int l = 0; l < c->num_hidden_layers; l++) {
        if (kda < 0 && c->mixer[l] == SD_MIXER_KDA) kda = l;
        if (mla < 0 && c->mixer[l] == SD_MIXER_MLA) mla = l;
        if (moe < 0 && dev->w.layers[l].is_moe) moe = l;
    }
    // The MoE block's distinct experts for these T input rows.
    int distinct = 0;
    if (moe >= 0) {
        OKS(sd_cuda_moe_forward(b, &dev->w.layers[moe].moe, c, s, moe, x->a, T, x->mix, &st_));
        int sel[64 * 16];
        const int K = c->num_experts_per_token;
        CK(cudaMemcpy(sel, x->sel, sizeof(int) * (size_t)T * K, cudaMemcpyDeviceToHost));
        unsigned char *seen = calloc((size_t)c->num_experts, 1);
        for (int i = 0; i < T * K; i++) distinct += !seen[sel[i]]++;
        free(seen);
    }
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    const int n = 20;
    for (int k = SUB_KDA; k <= SUB_HEAD; k++) {
        const int layer = k == SUB_KDA ? kda : k == SUB_MLA ? mla : k == SUB_MOE ? moe : 0;
        if (layer < 0) continue;
        double bytes = 0;
        const char *name = "";
        float ms = 0;
        for (int pass = 0; pass < 2; pass++) { // pass 0 warms up
            CK(cudaStreamSynchronize(b->stream));
            const double h0 = now_ms();
            CK(cudaEventRecord(e0, b->stream));
            for (int i = 0; i < n; i++) {
                if (k == SUB_KDA)
                    OKS(sd_cuda_kda_forward(b, &dev->w.layers[layer].kda, c, s, layer, x->a, T, x->mix, NULL, &st_));
                else if (k == SUB_MLA)
                    OKS(sd_cuda_mla_forward(b, &dev->w.layers[layer].mla, c, s, layer, x->a, T, x->mix, &st_));
                else if (k == SUB_MOE)
                    OKS(sd_cuda_moe_forward(b, &dev->w.layers[layer].moe, c, s, layer, x->a, T, x->mix, &st_));
                else // the head's launch as a forward runs it: the final norm fused into lm_head
                    if (head_launch(dev, s, T, b->stream)) exit(1);
            }
            CK(cudaEventRecord(e1, b->stream));
            const double host = now_ms() - h0;
            CK(cudaEventSynchronize(e1));
            CK(cudaEventElapsedTime(&ms, e0, e1));
            ms /= n;
            if (!pass) continue;
            if (k == SUB_KDA) { name = "kda_mixer"; bytes = layer_bytes(dev, layer, false, 0) + kda_state_bytes(c, T); }
            else if (k == SUB_MLA) { name = "mla_mixer"; bytes = layer_bytes(dev, layer, false, 0) + mla_cache_bytes(c, s->len, T); }
            else if (k == SUB_MOE) { name = "moe_block"; bytes = layer_bytes(dev, layer, true, distinct); }
            else { name = "lm_head"; bytes = (double)dev->w.lm_head.rows * dev->w.lm_head.cols * sd_dtype_size(dev->w.lm_head.dtype); }
            const double pct = 100.0 * bytes / (o->bw * ms * 1e-3);
            printf("  %-10s layer %2d T=%d: %8.1f us/call (host enqueue %6.1f us/call), %7.2f MB, %6.1f%% roofline%s\n", name,
                   layer, T, ms * 1e3, host * 1e3 / n, bytes / 1e6, pct,
                   k == SUB_MOE ? (distinct ? "" : " (no experts)") : "");
            printf("{\"bench\":\"gpu_e2e_sublayer\",\"config\":\"%s\",\"sublayer\":\"%s\",\"layer\":%d,\"T\":%d,\"us\":%.2f,"
                   "\"host_enqueue_us\":%.2f,\"bytes\":%.0f,\"distinct_experts\":%d,\"pct_roofline\":%.2f}\n",
                   config, name, layer, T, ms * 1e3, host * 1e3 / n, bytes, k == SUB_MOE ? distinct : 0, pct);
        }
    }
    fflush(stdout);
    CK(cudaEventDestroy(e0));
    CK(cudaEventDestroy(e1));
}

// The RMSNorm fused into a sublayer's first launch (sd_cuda_linear_multi_norm) against the norm
// kernel + that launch, on the first KDA layer's input projections and the first MoE layer's
// router + shared gate/up: device time per call from events over back-to-back calls.
static double time_calls(cudaStream_t q, int n, void (*fn)(void *), void *ctx) {
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    float ms = 0;
    for (int pass = 0; pass < 2; pass++) {
        CK(cudaEventRecord(e0, q));
        for (int i = 0; i < n; i++) fn(ctx);
        CK(cudaEventRecord(e1, q));
        CK(cudaEventSynchronize(e1));
        CK(cudaEventElapsedTime(&ms, e0, e1));
    }
    CK(cudaEventDestroy(e0));
    CK(cudaEventDestroy(e1));
    return ms * 1e3 / n;
}

typedef struct {
    sd_lin_job jobs[6];
    int n, T;
    sd_lin_norm norm;
    cudaStream_t q;
} norm_case;

static void run_fused(void *ctx) {
    norm_case *c = ctx;
    OKS(sd_cuda_linear_multi_norm(c->jobs, c->n, c->T, &c->norm, c->q, &st_));
}
static void run_split(void *ctx) {
    norm_case *c = ctx;
    OKS(sd_cuda_rmsnorm(c->norm.x, c->norm.w, c->T, c->norm.n, c->norm.eps, c->norm.out, c->q, &st_));
    OKS(sd_cuda_linear_multi(c->jobs, c->n, c->T, c->q, &st_));
}

static sd_lin_job bench_job(const sd_mat *w, const float *x, float *y, sd_lin_mode mode) {
    return (sd_lin_job){.w = w, .x = x, .ldx = w->cols, .y = y, .ldy = w->rows, .mode = mode};
}

static void norm_fusion(const char *config, const sd_model *dev, sd_state *s, int T) {
    const sd_config *c = &dev->cfg;
    sd_cuda_backend *b = sd_cuda_backend_of(dev);
    sd_scratch *x = &s->scratch;
    int kda = -1, moe = -1;
    for (int l = 0; l < c->num_hidden_layers; l++) {
        if (kda < 0 && c->mixer[l] == SD_MIXER_KDA) kda = l;
        if (moe < 0 && dev->w.layers[l].is_moe) moe = l;
    }
    for (int which = 0; which < 2; which++) {
        const int l = which ? moe : kda;
        if (l < 0) continue;
        const sd_layer_weights *ly = &dev->w.layers[l];
        norm_case nc = {.T = T, .q = b->stream,
                        .norm = {.x = x->x, .w = which ? ly->post_norm : ly->input_norm, .eps = c->rms_norm_eps,
                                 .n = c->hidden_size, .out = x->a}};
        sd_mat router = {.dtype = SD_DT_F32, .rows = c->num_experts, .cols = c->hidden_size};
        if (!which) {
            const sd_kda_weights *k = &ly->kda;
            nc.jobs[0] = bench_job(&k->q, x->a, x->q, SD_LIN_STORE);
            nc.jobs[1] = bench_job(&k->k, x->a, x->k, SD_LIN_STORE);
            nc.jobs[2] = bench_job(&k->v, x->a, x->v, SD_LIN_STORE);
            nc.jobs[3] = bench_job(&k->f_a, x->a, x->fa, SD_LIN_STORE);
            nc.jobs[4] = bench_job(&k->b, x->a, x->beta, SD_LIN_STORE);
            nc.jobs[5] = bench_job(&k->g_a, x->a, x->ga, SD_LIN_STORE);
            nc.n = 6;
        } else {
            router.data = ly->moe.router;
            nc.jobs[0] = bench_job(&router, x->a, x->router, SD_LIN_STORE);
            nc.jobs[1] = bench_job(&ly->moe.shared.gate, x->a, x->ffn_h2, SD_LIN_SWIGLU);
            nc.jobs[1].w2 = &ly->moe.shared.up;
            nc.n = c->num_shared_experts > 0 ? 2 : 1;
        }
        const double split = time_calls(b->stream, 20, run_split, &nc), fused = time_calls(b->stream, 20, run_fused, &nc);
        printf("  norm fusion %-13s layer %2d T=%d: norm kernel + launch %6.1f us, fused %6.1f us\n",
               which ? "moe_router" : "kda_in_proj", l, T, split, fused);
        printf("{\"bench\":\"gpu_e2e_norm_fusion\",\"config\":\"%s\",\"launch\":\"%s\",\"layer\":%d,\"T\":%d,"
               "\"split_us\":%.2f,\"fused_us\":%.2f}\n",
               config, which ? "moe_router" : "kda_in_proj", l, T, split, fused);
    }
    fflush(stdout);
}

static void run_config(const char *name, const bench_opts *o) {
    char path[4096];
    snprintf(path, sizeof path, "%s/configs/%s.json", src_dir(), name);
    sd_config cfg;
    OKS(sd_config_load(path, &cfg, &st_));
    const sd_synth_opts so = {.seed = o->seed, .dtype = SD_DT_BF16, .tail_from = SD_MAX_LAYERS, .tail_scale = 1.0f};
    sd_model dev;
    double t0 = now_ms();
    OKS(sd_cuda_model_synth(&cfg, &so, 0, &dev, &st_));
    const double t_synth = now_ms() - t0;
    const int max_T = o->kmax + 1;
    sd_state s;
    OKS(sd_cuda_state_init(&s, &dev, o->ctx + 2 * max_T, max_T, &st_));
    int *prompt = malloc(sizeof(int) * (size_t)(o->ctx ? o->ctx : 1));
    tokens_of(7, cfg.vocab_size, o->ctx, prompt);
    t0 = now_ms();
    if (o->ctx) OKS(sd_prefill(&dev, &s, prompt, o->ctx, NULL, &st_));
    CK(cudaDeviceSynchronize());
    const double t_prefill = now_ms() - t0;
    size_t free_b = 0, total_b = 0;
    CK(cudaMemGetInfo(&free_b, &total_b));
    printf("\n%s: %.2f GB of bf16 weights synthesised on the device in %.0f ms; prefill of %d tokens (chunks of %d) %.0f ms; "
           "device memory free %.1f of %.1f GB\n",
           name, dev.w.arena_bytes / 1e9, t_synth, o->ctx, max_T, t_prefill, free_b / 1e9, total_b / 1e9);
    printf("{\"bench\":\"gpu_e2e_setup\",\"config\":\"%s\",\"weights_bytes\":%zu,\"synth_ms\":%.1f,\"prefill_ms\":%.1f,"
           "\"ctx\":%d}\n",
           name, dev.w.arena_bytes, t_synth, t_prefill, o->ctx);
    printf("%-22s %-10s %2s %9s %9s %8s %7s %8s %7s\n", "config", "arm", "T", "ms_med", "ms_min", "GB", "exp/lyr", "GB/s",
           "%roof");
    if (o->profile) {
        int toks[64];
        tokens_of(99, cfg.vocab_size, max_T, toks);
        step(&dev, &s, toks, 1, NULL);
        step(&dev, &s, toks, max_T, NULL);
        sd_cuda_graph g1; // the decode step as a graph replay too: its timeline against the stream launches'
        OKS(sd_cuda_graph_capture(&dev, &s, 1, &g1, &st_));
        timed_step(&dev, &s, toks, 1, &g1);
        CK(cudaProfilerStart());
        step(&dev, &s, toks, 1, NULL);
        step(&dev, &s, toks, max_T, NULL);
        timed_step(&dev, &s, toks, 1, &g1);
        CK(cudaProfilerStop());
        sd_cuda_graph_free(&g1);
        free(prompt);
        sd_state_free(&s);
        sd_model_free(&dev);
        return;
    }
    if (o->decode_only) { // the decode step and the verify passes, stream and graph
        for (int T = 1; T <= max_T; T++) measure(name, &dev, &s, T, ARM_DEVICE, o);
        for (int T = 1; T <= max_T; T++) measure(name, &dev, &s, T, ARM_GRAPH, o);
        free(prompt);
        sd_state_free(&s);
        sd_model_free(&dev);
        return;
    }
    for (int T = 1; T <= max_T; T++) measure(name, &dev, &s, T, ARM_DEVICE, o);
    measure(name, &dev, &s, 1, ARM_GRAPH, o); // the same step, one captured graph replayed
    measure(name, &dev, &s, max_T, ARM_GRAPH, o);
    // The same stream-launched steps without the launch overlap (kernels/pdl.h).
    const sd_pdl_mode mode0 = sd_cuda_pdl_mode();
    sd_cuda_pdl(SD_PDL_OFF);
    measure(name, &dev, &s, 1, ARM_DEVICE, o);
    measure(name, &dev, &s, max_T, ARM_DEVICE, o);
    sd_cuda_pdl(mode0);
    if (o->eager) {
        measure(name, &dev, &s, 1, ARM_EAGER, o);
        measure(name, &dev, &s, max_T, ARM_EAGER, o);
    }
    sublayers(name, &dev, &s, 1, o);
    sublayers(name, &dev, &s, max_T, o);
    norm_fusion(name, &dev, &s, 1);
    free(prompt);
    sd_state_free(&s);
    sd_model_free(&dev);
}

int main(int argc, char **argv) {
    bench_opts o = {.ctx = 512, .reps = 30, .kmax = 8, .seed = 1};
    const char *configs[16];
    int n_cfg = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--config") && i + 1 < argc && n_cfg < 16) configs[n_cfg++] = argv[++i];
        else if (!strcmp(argv[i], "--ctx") && i + 1 < argc) o.ctx = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc) o.reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--kmax") && i + 1 < argc) o.kmax = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--seed") && i + 1 < argc) o.seed = strtoull(argv[++i], NULL, 0);
        else if (!strcmp(argv[i], "--eager")) o.eager = 1;
        else if (!strcmp(argv[i], "--profile")) o.profile = 1;
        else if (!strcmp(argv[i], "--decode-only")) o.decode_only = 1;
        else {
            fprintf(stderr, "usage: bench_gpu_e2e [--config NAME]... [--ctx N] [--reps N] [--kmax K] [--seed S] [--eager] "
                            "[--decode-only] [--profile]\n");
            return 2;
        }
    }
    if (o.reps < 1 || o.kmax < 0 || o.kmax > 31 || o.ctx < 0) {
        fprintf(stderr, "bench_gpu_e2e: need --reps >= 1, 0 <= --kmax <= 31, --ctx >= 0\n");
        return 2;
    }
    if (!n_cfg) {
        configs[n_cfg++] = "toy";
        configs[n_cfg++] = "kimi-linear-48b-a3b";
    }
    if (sd_cuda_device_count() < 1) {
        printf("bench_gpu_e2e: no CUDA device: skipped\n");
        return 0;
    }
    CK(cudaSetDevice(0));
    OKS(sd_cuda_device_name(0, o.device, sizeof o.device, &st_));
    o.bw = copy_bandwidth((size_t)2 << 30);
    printf("%s: device-to-device copy %.1f GB/s (read + write, 2 GiB, median of 10)\n", o.device, o.bw / 1e9);
    printf("{\"bench\":\"gpu_e2e_copy\",\"device\":\"%s\",\"bytes\":%zu,\"copy_bw_gbs\":%.1f}\n", o.device, (size_t)2 << 30,
           o.bw / 1e9);
    for (int i = 0; i < n_cfg; i++) run_config(configs[i], &o);
    return 0;
}
