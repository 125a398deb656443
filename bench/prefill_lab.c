// prefill_lab.c — the prefill path's lab (docs/PREFILL.md) at Kimi-Linear's dimensions: each piece
// checked against its reference, then timed (CUDA events, median), one PASS/FAIL line each and a
// table at the end; exit 1 if any check fails.
//   ceilings  the copy bandwidth and the bf16 GEMM rate (ceilings.h) every rate below is read against
//   gemm      cuBLASLt (kernels/gemm.h) at the prefill's shapes: 16 rows against sd_linear, then the
//             piece's rows timed (TFLOP/s)
//   kda       the chunked recurrence (kernels/kda_prefill.h) at H = 32, d = 128: 200 tokens from a
//             non-empty state against the CPU's chunked form and the token recurrence, then 4096 timed
//   mla       the flash attention (kernels/mla_prefill.h) at Hm = 32, R = 512, dr = 64: 40 queries
//             after 100 keys against float64, then 4096 queries over 4096 and over 32768 keys timed
//   model     Kimi-Linear's first four layers (dense+KDA, MoE+KDA ×2, MoE+MLA) synthesised on the
//             device: a 300-token prefill against the token path (every position's logits and the next
//             decode step, MODEL.md's 2e-2), then a 4096-token piece timed whole and by sublayer, and
//             the routed experts' GEMMs over the same rows: the engine's grouped cuBLAS calls
//             (kernels/moe_grouped.h) for up and down, one cuBLASLt call per expert for up, and
//             the lab's own cublasGemmGroupedBatchedEx calls for up and down with bf16 and with f32
//             out (f32 out is what cuBLAS refuses for bf16 inputs; the line says whether it still does)
// usage: prefill_lab [--all | --ceilings --gemm --kda --mla --model]   (no option: --all)
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "gpu_bench.h"        // SD_BENCH_CK, SD_BENCH_OK, sd_bench_time_ms, the ceilings
#include "cuda_backend.h"     // sd_cuda_backend_of, sd_cuda_state_init
#include "cuda_prefill.h"     // sd_cuda_prefill_set_chunk
#include "cuda_synth.h"       // sd_cuda_model_synth
#include "kda_prefill.h"      // sd_cuda_kda_chunk
#include "kda_scan.h"         // sd_kda_step, sd_kda_chunk_head
#include "mla_prefill.h"      // sd_cuda_mla_flash
#include "moe_grouped.h"      // sd_cuda_moe_grouped_gemm
#include "ops.h"              // sd_linear
#include "prefill_internal.h" // sd_prefill_scratch_of and the sublayers
#include "rows.h"             // sd_cuda_rmsnorm
#include "sample.h"           // sd_argmax
#include "synth_fill.h"       // sd_cuda_synth_fill
#include "trace.h"            // trace_now_ns

#ifndef SPECDEC_SOURCE_DIR
#define SPECDEC_SOURCE_DIR "."
#endif

// ---------------------------------------------------------------------------- rows of the table
typedef struct {
    const char *section;
    char name[64];
    double err, bound; // err < 0: not checked
    double ms;         // < 0: not timed
    double rate;
    const char *unit;
} lab_row;
static lab_row rows[64];
static int n_rows, n_fail;

static void add_row(const char *section, const char *name, double err, double bound, double ms, double rate, const char *unit) {
    lab_row *r = &rows[n_rows < 64 ? n_rows++ : 63];
    *r = (lab_row){.section = section, .err = err, .bound = bound, .ms = ms, .rate = rate, .unit = unit};
    snprintf(r->name, sizeof r->name, "%s", name);
    const bool checked = err >= 0, pass = checked && err <= bound; // NaN fails
    if (checked && !pass) n_fail++;
    printf("%s %-9s %-30s", !checked ? "TIME" : pass ? "PASS" : "FAIL", section, name);
    if (checked) printf(" rel %.2e (bound %.0e)", err, bound);
    if (ms >= 0) printf(" %10.3f ms %9.1f %s", ms, rate, unit);
    printf("\n");
    fflush(stdout);
}

static void print_table(void) {
    printf("\n%-9s %-30s %-6s %10s %10s %12s\n", "section", "item", "check", "rel err", "ms", "rate");
    for (int i = 0; i < n_rows; i++) {
        const lab_row *r = &rows[i];
        const char *c = r->err < 0 ? "-" : r->err <= r->bound ? "PASS" : "FAIL";
        printf("%-9s %-30s %-6s", r->section, r->name, c);
        if (r->err >= 0) printf(" %10.2e", r->err);
        else printf(" %10s", "");
        if (r->ms >= 0) printf(" %10.3f %8.1f %s\n", r->ms, r->rate, r->unit);
        else printf("\n");
    }
    printf("prefill_lab: %s (%d checks failed)\n", n_fail ? "FAIL" : "PASS", n_fail);
}

// ---------------------------------------------------------------------------- helpers
static double rel_err(const float *got, const float *ref, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(got[i])) return INFINITY;
        num += ((double)got[i] - ref[i]) * ((double)got[i] - ref[i]);
        den += (double)ref[i] * ref[i];
    }
    return sqrt(num / (den > 0 ? den : 1));
}
static void fill_host(float *x, size_t n, uint64_t seed, float lo, float hi) {
    uint64_t s = seed * 0x9E3779B97F4A7C15ull + 7;
    for (size_t i = 0; i < n; i++) {
        s ^= s >> 12; s ^= s << 25; s ^= s >> 27;
        x[i] = lo + (hi - lo) * (float)((s * 2685821657736338717ull) >> 40) * (1.0f / 16777216.0f);
    }
}
static void *dev_alloc(size_t bytes) {
    void *p;
    SD_BENCH_CK(cudaMalloc(&p, bytes ? bytes : 16));
    return p;
}
static void *to_dev(const void *h, size_t bytes) {
    void *p = dev_alloc(bytes);
    SD_BENCH_CK(cudaMemcpy(p, h, bytes, cudaMemcpyHostToDevice));
    return p;
}
static void *to_host(const void *d, size_t bytes) {
    void *h = malloc(bytes ? bytes : 16);
    SD_BENCH_CK(cudaMemcpy(h, d, bytes, cudaMemcpyDeviceToHost));
    return h;
}

// ---------------------------------------------------------------------------- ceilings
static double copy_gbs, gemm_tflops;
static void lab_ceilings(void) {
    copy_gbs = sd_bench_copy_gbs((size_t)1 << 30, 10);
    gemm_tflops = sd_bench_gemm_tflops(8192, 10);
    add_row("ceilings", "copy (read + written)", -1, 0, 0, copy_gbs, "GB/s");
    add_row("ceilings", "bf16 GEMM 8192^3", -1, 0, 0, gemm_tflops, "TFLOP/s");
}

// ---------------------------------------------------------------------------- gemm
typedef struct { const char *name; int M, N, K; sd_dtype w, x; } gemm_shape;
static const gemm_shape GEMMS[] = {
    {"kda q|k|v", 4096, 12288, 2304, SD_DT_BF16, SD_DT_BF16},
    {"kda f_b (K = d, f32 x)", 4096, 4096, 128, SD_DT_BF16, SD_DT_F32},
    {"o_proj", 4096, 2304, 4096, SD_DT_BF16, SD_DT_BF16},
    {"mla q|kv_a", 4096, 6720, 2304, SD_DT_BF16, SD_DT_BF16},
    {"dense gate|up", 4096, 18432, 2304, SD_DT_BF16, SD_DT_BF16},
    {"dense down", 4096, 2304, 9216, SD_DT_BF16, SD_DT_BF16},
    {"shared gate|up", 4096, 2048, 2304, SD_DT_BF16, SD_DT_BF16},
    {"expert gate|up M=128", 128, 2048, 2304, SD_DT_BF16, SD_DT_BF16},
    {"expert down M=128", 128, 2304, 1024, SD_DT_BF16, SD_DT_BF16},
    {"router (f32)", 4096, 256, 2304, SD_DT_F32, SD_DT_F32},
    {"lm_head M=1", 1, 163840, 2304, SD_DT_BF16, SD_DT_BF16},
};
typedef struct { sd_gemm *g; sd_gemm_args a; } gemm_ctx;
static void run_gemm(void *ctx, cudaStream_t q) {
    gemm_ctx *c = ctx;
    SD_BENCH_OK(sd_gemm_run(c->g, &c->a, q, &st_));
}

static void lab_gemm(void) {
    sd_gemm *g;
    SD_BENCH_OK(sd_gemm_create(&g, (size_t)4096 * 4096, &st_));
    for (size_t i = 0; i < sizeof GEMMS / sizeof GEMMS[0]; i++) {
        const gemm_shape *s = &GEMMS[i];
        const int wbf = s->w == SD_DT_BF16, xbf = s->x == SD_DT_BF16, Mc = s->M < 16 ? s->M : 16;
        const size_t nw = (size_t)s->N * s->K, nx = (size_t)s->M * s->K;
        void *w = dev_alloc(nw * (wbf ? 2 : 4)), *x = dev_alloc(nx * (xbf ? 2 : 4));
        float *y = dev_alloc((size_t)s->M * s->N * 4);
        SD_BENCH_OK(sd_cuda_synth_fill(w, (int64_t)nw, wbf, 3 + i, 21, 1.7f / sqrtf((float)s->K), 0.0f, 0, &st_));
        SD_BENCH_OK(sd_cuda_synth_fill(x, (int64_t)nx, xbf, 5 + i, 22, 1.0f, 0.0f, 0, &st_));
        gemm_ctx c = {.g = g, .a = {.w = w, .w_dtype = s->w, .ldw = s->K, .op = SD_GEMM_WT, .x = x, .x_dtype = s->x,
                                    .ldx = s->K, .y = y, .ldy = s->N, .M = Mc, .N = s->N, .K = s->K}};
        run_gemm(&c, 0);
        SD_BENCH_CK(cudaDeviceSynchronize());
        // The reference: sd_linear on the host copies (bf16 activations widened exactly).
        void *wh = to_host(w, nw * (wbf ? 2 : 4)), *xh = to_host(x, (size_t)Mc * s->K * (xbf ? 2 : 4));
        float *xf = malloc(sizeof(float) * Mc * s->K), *ref = malloc(sizeof(float) * Mc * s->N);
        for (size_t e = 0; e < (size_t)Mc * s->K; e++) xf[e] = xbf ? sd_bf16_to_f32(((uint16_t *)xh)[e]) : ((float *)xh)[e];
        const sd_mat wm = {.dtype = s->w, .data = wh, .rows = s->N, .cols = s->K};
        sd_linear(&wm, xf, Mc, ref);
        float *got = to_host(y, sizeof(float) * Mc * s->N);
        const double err = rel_err(got, ref, (size_t)Mc * s->N);
        c.a.M = s->M;
        const double ms = sd_bench_time_ms(run_gemm, &c, 0, 10);
        // bf16 x: both sides multiply the same bf16 values (only the order differs); f32 x with a
        // bf16 weight: the staging rounds x (2^-9 relative); f32 both: fp32.
        const double bound = !wbf ? 1e-5 : xbf ? 1e-4 : 4e-3;
        add_row("gemm", s->name, err, bound, ms, 2.0 * s->M * (double)s->N * s->K / (ms * 1e-3) / 1e12, "TFLOP/s");
        free(wh); free(xh); free(xf); free(ref); free(got);
        SD_BENCH_CK(cudaFree(w)); SD_BENCH_CK(cudaFree(x)); SD_BENCH_CK(cudaFree(y));
    }
    sd_gemm_free(g);
}

// ---------------------------------------------------------------------------- kda
typedef struct { const float *qkv, *g, *beta; float *S, *So, *y, *work; int T, H, d; } kda_ctx;
static void run_kda(void *ctx, cudaStream_t q) {
    kda_ctx *c = ctx;
    const int P = c->H * c->d;
    SD_BENCH_OK(sd_cuda_kda_chunk(c->qkv, c->qkv + P, c->qkv + 2 * P, 3 * P, c->g, P, c->beta, c->H, c->T, c->H, c->d, c->S, c->So,
                          c->y, P, c->work, q, &st_));
}

// Inputs of T tokens in the prefill's layout: q, k normalised per head, g in (-1, 0), β in (0.05, 0.95).
static void kda_inputs(int T, int H, int d, float **qkv, float **g, float **beta, float **S0) {
    const int P = H * d;
    *qkv = malloc(sizeof(float) * T * 3 * P);
    *g = malloc(sizeof(float) * T * P);
    *beta = malloc(sizeof(float) * T * H);
    *S0 = malloc(sizeof(float) * H * d * d);
    fill_host(*qkv, (size_t)T * 3 * P, 1, -1, 1);
    fill_host(*g, (size_t)T * P, 2, -1, -1e-3f);
    fill_host(*beta, (size_t)T * H, 3, 0.05f, 0.95f);
    fill_host(*S0, (size_t)H * d * d, 4, -0.2f, 0.2f);
    for (int t = 0; t < T; t++)
        for (int h = 0; h < 2 * H; h++) { // the q heads then the k heads of the row
            float *x = *qkv + (size_t)t * 3 * P + (size_t)h * d, ss = 0;
            for (int i = 0; i < d; i++) ss += x[i] * x[i];
            for (int i = 0; i < d; i++) x[i] /= sqrtf(ss + 1e-6f);
        }
}

static void lab_kda(void) {
    enum { H = 32, d = 128, P = H * d, TC = 200, TT = 4096 };
    float *qkv, *g, *beta, *S0;
    kda_inputs(TC, H, d, &qkv, &g, &beta, &S0);
    // The CPU's chunked form and the token recurrence.
    float *S_chunk = malloc(sizeof(float) * H * d * d), *S_rec = malloc(sizeof(float) * H * d * d);
    float *y_chunk = calloc((size_t)TC * 3 * P, sizeof(float)), *y_rec = malloc(sizeof(float) * TC * P);
    float *Sa = malloc(sizeof(float) * d * d), *Sb = malloc(sizeof(float) * d * d);
    float *work = malloc(sizeof(float) * sd_kda_chunk_work_floats(d, SD_KDA_CHUNK));
    memcpy(S_chunk, S0, sizeof(float) * H * d * d);
    float *g3 = calloc((size_t)TC * 3 * P, sizeof(float)); // sd_kda_chunk_head reads every input at one stride
    for (int t = 0; t < TC; t++) memcpy(g3 + (size_t)t * 3 * P, g + (size_t)t * P, sizeof(float) * P);
    for (int h = 0; h < H; h++) {
        const size_t o = (size_t)h * d;
        sd_kda_chunk_head(S_chunk + o * d, qkv + o, qkv + P + o, qkv + 2 * P + o, g3 + o, beta + h, TC, d, SD_KDA_CHUNK, 3 * P,
                          H, y_chunk + o, work);
        memcpy(Sa, S0 + o * d, sizeof(float) * d * d);
        for (int t = 0; t < TC; t++) {
            const size_t r = (size_t)t * 3 * P + o;
            sd_kda_step(Sa, Sb, qkv + r, qkv + P + r, qkv + 2 * P + r, g + (size_t)t * P + o, beta[t * H + h], d,
                        y_rec + (size_t)t * P + o);
            float *tmp = Sa; Sa = Sb; Sb = tmp;
        }
        memcpy(S_rec + o * d, Sa, sizeof(float) * d * d);
    }
    kda_ctx c = {.qkv = to_dev(qkv, sizeof(float) * TC * 3 * P), .g = to_dev(g, sizeof(float) * TC * P),
                 .beta = to_dev(beta, sizeof(float) * TC * H), .S = to_dev(S0, sizeof(float) * H * d * d),
                 .So = dev_alloc(sizeof(float) * H * d * d), .y = dev_alloc(sizeof(float) * TT * P),
                 .work = dev_alloc(sizeof(float) * sd_cuda_kda_chunk_work_floats(TT, H, d)), .T = TC, .H = H, .d = d};
    run_kda(&c, 0);
    float *y = to_host(c.y, sizeof(float) * TC * P), *S = to_host(c.So, sizeof(float) * H * d * d);
    float *y_cpu = malloc(sizeof(float) * TC * P);
    for (int t = 0; t < TC; t++) memcpy(y_cpu + (size_t)t * P, y_chunk + (size_t)t * 3 * P, sizeof(float) * P);
    add_row("kda", "outputs vs CPU chunked", rel_err(y, y_cpu, (size_t)TC * P), 1e-4, -1, 0, "");
    add_row("kda", "state vs CPU chunked", rel_err(S, S_chunk, (size_t)H * d * d), 1e-4, -1, 0, "");
    add_row("kda", "outputs vs token recurrence", rel_err(y, y_rec, (size_t)TC * P), 1e-4, -1, 0, "");
    add_row("kda", "state vs token recurrence", rel_err(S, S_rec, (size_t)H * d * d), 1e-4, -1, 0, "");
    // 4096 tokens (inputs of any values in range: device-filled, timing only).
    SD_BENCH_CK(cudaFree((void *)c.qkv)); SD_BENCH_CK(cudaFree((void *)c.g)); SD_BENCH_CK(cudaFree((void *)c.beta));
    c.qkv = dev_alloc(sizeof(float) * TT * 3 * P);
    c.g = dev_alloc(sizeof(float) * TT * P);
    c.beta = dev_alloc(sizeof(float) * TT * H);
    SD_BENCH_OK(sd_cuda_synth_fill((void *)c.qkv, (int64_t)TT * 3 * P, false, 7, 31, 0.09f, 0.0f, 0, &st_));
    SD_BENCH_OK(sd_cuda_synth_fill((void *)c.g, (int64_t)TT * P, false, 8, 32, 0.5f, -0.5f, 0, &st_));
    SD_BENCH_OK(sd_cuda_synth_fill((void *)c.beta, (int64_t)TT * H, false, 9, 33, 0.4f, 0.5f, 0, &st_));
    c.T = TT;
    const double ms = sd_bench_time_ms(run_kda, &c, 0, 5);
    add_row("kda", "chunked recurrence T=4096", -1, 0, ms, TT / ms, "tokens/ms");
    free(qkv); free(g); free(g3); free(beta); free(S0); free(S_chunk); free(S_rec); free(y_chunk); free(y_rec);
    free(Sa); free(Sb); free(work); free(y); free(S); free(y_cpu);
    SD_BENCH_CK(cudaFree((void *)c.qkv)); SD_BENCH_CK(cudaFree((void *)c.g)); SD_BENCH_CK(cudaFree((void *)c.beta));
    SD_BENCH_CK(cudaFree(c.S)); SD_BENCH_CK(cudaFree(c.So)); SD_BENCH_CK(cudaFree(c.y)); SD_BENCH_CK(cudaFree(c.work));
}

// ---------------------------------------------------------------------------- mla
typedef struct { const uint16_t *q, *k, *v; float *o; int T, pos0; } flash_ctx;
enum { MH = 32, MDN = 128, MDR = 64, MDV = 128 };
static void run_flash(void *ctx, cudaStream_t q) {
    flash_ctx *c = ctx;
    SD_BENCH_OK(sd_cuda_mla_flash(c->q, c->k, c->v, c->T, MH, MDN, MDR, MDV, c->pos0, 1.0f / sqrtf((float)(MDN + MDR)), c->o,
                                  q, &st_));
}
// Useful FLOPs of causal attention per head: per visible (query, key) pair, the score (dn + dr)
// and the value sum (dv), two FLOPs each.
static double flash_flops(int T, int pos0) {
    return 2.0 * MH * ((double)T * pos0 + (double)T * (T + 1) / 2) * ((MDN + MDR) + MDV);
}
// Packed random queries, keys and values of T queries over pos0 + T keys (every head).
static flash_ctx flash_inputs(int T, int pos0, uint64_t seed) {
    const int W = sd_mla_head_width(MDN, MDR), VW = sd_mla_value_width(MDV), nk = pos0 + T;
    flash_ctx c = {.q = dev_alloc((size_t)T * MH * W * 2), .k = dev_alloc((size_t)nk * MH * W * 2),
                   .v = dev_alloc((size_t)nk * MH * VW * 2), .o = dev_alloc(sizeof(float) * T * MH * MDV), .T = T, .pos0 = pos0};
    SD_BENCH_OK(sd_cuda_synth_fill((void *)c.q, (int64_t)T * MH * W, true, seed, 41, 1.0f, 0.0f, 0, &st_));
    SD_BENCH_OK(sd_cuda_synth_fill((void *)c.k, (int64_t)nk * MH * W, true, seed + 1, 42, 1.0f, 0.0f, 0, &st_));
    SD_BENCH_OK(sd_cuda_synth_fill((void *)c.v, (int64_t)nk * MH * VW, true, seed + 2, 43, 1.0f, 0.0f, 0, &st_));
    return c;
}
static void flash_free(flash_ctx *c) {
    SD_BENCH_CK(cudaFree((void *)c->q)); SD_BENCH_CK(cudaFree((void *)c->k)); SD_BENCH_CK(cudaFree((void *)c->v));
    SD_BENCH_CK(cudaFree(c->o));
}

static void lab_mla(void) {
    const int W = sd_mla_head_width(MDN, MDR), VW = sd_mla_value_width(MDV);
    { // the check: 40 queries after 100 keys, against float64 over the same bf16 values
        const int T = 40, pos0 = 100, nk = pos0 + T;
        flash_ctx c = flash_inputs(T, pos0, 11);
        run_flash(&c, 0);
        uint16_t *qh = to_host(c.q, (size_t)T * MH * W * 2), *kh = to_host(c.k, (size_t)nk * MH * W * 2);
        uint16_t *vh = to_host(c.v, (size_t)nk * MH * VW * 2);
        float *got = to_host(c.o, sizeof(float) * T * MH * MDV), *ref = malloc(sizeof(float) * T * MH * MDV);
        double *p = malloc(sizeof(double) * nk), *acc = malloc(sizeof(double) * MDV);
        const double scale = 1.0 / sqrt((double)(MDN + MDR));
        for (int r = 0; r < T * MH; r++) { // r = t·MH + h: the query row, and the output's
            const int lim = pos0 + r / MH, h = r % MH;
            double mx = -INFINITY, sum = 0;
            for (int j = 0; j <= lim; j++) {
                double s = 0;
                for (int i = 0; i < W; i++)
                    s += (double)sd_bf16_to_f32(qh[(size_t)r * W + i]) * sd_bf16_to_f32(kh[((size_t)j * MH + h) * W + i]);
                p[j] = s * scale;
                mx = p[j] > mx ? p[j] : mx;
            }
            for (int v = 0; v < MDV; v++) acc[v] = 0;
            for (int j = 0; j <= lim; j++) {
                p[j] = exp(p[j] - mx);
                sum += p[j];
                for (int v = 0; v < MDV; v++) acc[v] += p[j] * sd_bf16_to_f32(vh[((size_t)j * MH + h) * VW + v]);
            }
            for (int v = 0; v < MDV; v++) ref[(size_t)r * MDV + v] = (float)(acc[v] / sum);
        }
        add_row("mla", "flash vs float64", rel_err(got, ref, (size_t)T * MH * MDV), 5e-3, -1, 0, "");
        free(qh); free(kh); free(vh); free(got); free(ref); free(p); free(acc);
        flash_free(&c);
    }
    static const int POS0[] = {0, 28672};
    for (int i = 0; i < 2; i++) { // 4096 queries over 4096 and over 32768 keys
        const int T = 4096, pos0 = POS0[i];
        flash_ctx c = flash_inputs(T, pos0, 13);
        const double ms = sd_bench_time_ms(run_flash, &c, 0, 3);
        char name[64];
        snprintf(name, sizeof name, "flash T=4096 keys=%d", pos0 + T);
        add_row("mla", name, -1, 0, ms, flash_flops(T, pos0) / (ms * 1e-3) / 1e12, "TFLOP/s");
        flash_free(&c);
    }
}

// ---------------------------------------------------------------------------- model
typedef struct { sd_cuda_backend *b; sd_prefill_scratch *p; const sd_model *m; sd_state *s; int layer, C, kind; } sub_ctx;
static void run_sub(void *ctx, cudaStream_t q) {
    (void)q;
    sub_ctx *c = ctx;
    sd_status st = {0};
    sd_code rc = c->kind == 0   ? sd_prefill_kda_mixer(c->b, c->p, c->m, c->s, c->layer, c->C, &st)
                 : c->kind == 1 ? sd_prefill_mla_mixer(c->b, c->p, c->m, c->s, c->layer, c->C, &st)
                 : c->kind == 2 ? sd_prefill_moe_ffn(c->b, c->p, c->m, c->layer, c->C, &st)
                                : sd_prefill_dense_ffn(c->b, c->p, c->m, c->layer, c->C, &st);
    if (rc) {
        fprintf(stderr, "prefill_lab: sublayer %d of layer %d: %s\n", c->kind, c->layer, st.msg);
        exit(1);
    }
}

typedef struct {
    cublasHandle_t h;
    const cublasOperation_t *ta, *tb;
    const int *m, *n, *k, *lda, *ldb, *ldc, *gs;
    const float *al, *be;
    void *A, *B, *C;
    int ng;
    cudaDataType ctype;
    cublasStatus_t rc;
} grouped_ctx;
static void run_grouped(void *ctx, cudaStream_t q) {
    grouped_ctx *c = ctx;
    (void)q; // the handle's stream
    c->rc = cublasGemmGroupedBatchedEx(c->h, c->ta, c->tb, c->m, c->n, c->k, c->al, (const void *const *)c->A, CUDA_R_16BF,
                                       c->lda, (const void *const *)c->B, CUDA_R_16BF, c->ldb, c->be, (void *const *)c->C,
                                       c->ctype, c->ldc, c->ng, c->gs, CUBLAS_COMPUTE_32F);
}

// The routed experts' up or down GEMMs of the last MoE call (p->counts_host) as one grouped cuBLAS
// call of the lab's own, bf16 in and FP32 compute, out in bf16 (the engine's type) or in f32: timed
// beside the engine's calls.
static void grouped_cublas(const sd_model *m, sd_prefill_scratch *p, int layer, bool down, bool f32_out, cudaStream_t q) {
    const sd_config *c = &m->cfg;
    const int E = c->num_experts, D = c->hidden_size, Ie = c->moe_intermediate_size;
    const int M = down ? D : 2 * Ie, Kd = down ? Ie : D;
    int *mm = malloc(sizeof(int) * E), *nn = malloc(sizeof(int) * E), *kk = malloc(sizeof(int) * E);
    int *lda = malloc(sizeof(int) * E), *ldb = malloc(sizeof(int) * E), *ldc = malloc(sizeof(int) * E);
    int *gs = malloc(sizeof(int) * E);
    cublasOperation_t *ta = malloc(sizeof *ta * E), *tb = malloc(sizeof *tb * E);
    float *al = malloc(sizeof(float) * E), *be = malloc(sizeof(float) * E);
    const void **A = malloc(sizeof(void *) * E), **B = malloc(sizeof(void *) * E);
    void **C = malloc(sizeof(void *) * E);
    const size_t osize = f32_out ? 4 : 2;
    char *out = dev_alloc((size_t)c->num_experts_per_token * p->chunk * M * osize);
    int ng = 0, off = 0;
    for (int e = 0; e < E; off += p->counts_host[e], e++) {
        if (!p->counts_host[e]) continue;
        const sd_ffn_weights *f = &m->w.layers[layer].moe.experts[e];
        mm[ng] = M; nn[ng] = p->counts_host[e]; kk[ng] = Kd;
        lda[ng] = Kd; ldb[ng] = Kd; ldc[ng] = M; gs[ng] = 1;
        ta[ng] = CUBLAS_OP_T; tb[ng] = CUBLAS_OP_N; al[ng] = 1.0f; be[ng] = 0.0f;
        A[ng] = down ? f->down.data : f->gate.data; // gate and up lie one after the other: [gate | up]
        B[ng] = down ? (const void *)((const uint16_t *)p->moe.hb + (size_t)off * Ie)
                     : (const void *)((const uint16_t *)p->moe.xg + (size_t)off * D);
        C[ng] = out + (size_t)off * M * osize;
        ng++;
    }
    void *dA = to_dev(A, sizeof(void *) * ng), *dB = to_dev(B, sizeof(void *) * ng), *dC = to_dev(C, sizeof(void *) * ng);
    cublasHandle_t h;
    if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) { add_row("model", "grouped cuBLAS: no handle", -1, 0, -1, 0, ""); return; }
    cublasSetStream(h, q);
    grouped_ctx gc = {.h = h, .ta = ta, .tb = tb, .m = mm, .n = nn, .k = kk, .al = al, .be = be, .A = dA, .B = dB, .C = dC,
                      .lda = lda, .ldb = ldb, .ldc = ldc, .ng = ng, .gs = gs, .ctype = f32_out ? CUDA_R_32F : CUDA_R_16BF};
    run_grouped(&gc, q); // a refusal is reported, not timed
    const cublasStatus_t rc = gc.rc;
    const double ms = rc == CUBLAS_STATUS_SUCCESS ? sd_bench_time_ms(run_grouped, &gc, q, 3) : -1;
    char name[80];
    if (rc == CUBLAS_STATUS_SUCCESS)
        snprintf(name, sizeof name, "experts %s, grouped cuBLAS (%d, %s out)", down ? "down" : "up", ng, f32_out ? "f32" : "bf16");
    else snprintf(name, sizeof name, "grouped cuBLAS %s out: %s", f32_out ? "f32" : "bf16", cublasGetStatusString(rc));
    add_row("model", name, -1, 0, ms, 0, "");
    cublasDestroy(h);
    SD_BENCH_CK(cudaFree(dA)); SD_BENCH_CK(cudaFree(dB)); SD_BENCH_CK(cudaFree(dC)); SD_BENCH_CK(cudaFree(out));
    free(mm); free(nn); free(kk); free(lda); free(ldb); free(ldc); free(gs); free(ta); free(tb); free(al); free(be);
    free(A); free(B); free(C);
}

// The routed experts' GEMMs of MoE layer `layer` over the rows its last call grouped: up or down.
typedef struct { const sd_model *m; sd_prefill_scratch *p; int layer, down; } loop_ctx;
// The engine's grouped cuBLAS call as the last MoE call planned it (kernels/moe_grouped.h), up or down.
static void run_grouped_engine(void *ctx, cudaStream_t q) {
    loop_ctx *c = ctx;
    SD_BENCH_OK(sd_cuda_moe_grouped_gemm(c->p->grouped, c->down ? SD_MOE_GROUPED_DOWN : SD_MOE_GROUPED_UP, q, &st_));
}
// One cuBLASLt call per expert over the same rows (up only, f32 out), timed the same way.
static void run_loop_up(void *ctx, cudaStream_t q) {
    loop_ctx *c = ctx;
    const sd_config *cf = &c->m->cfg;
    const int D = cf->hidden_size, Ie = cf->moe_intermediate_size;
    for (int e = 0, off = 0; e < cf->num_experts; off += c->p->counts_host[e], e++) {
        if (!c->p->counts_host[e]) continue;
        const sd_ffn_weights *f = &c->m->w.layers[c->layer].moe.experts[e];
        sd_mat both;
        if (!sd_prefill_stacked(&f->gate, &f->up, &both)) both = f->gate;
        SD_BENCH_OK(sd_gemm_linear_bf16(c->p->gemm, &both, (const uint16_t *)c->p->moe.xg + (size_t)off * D, D, c->p->counts_host[e],
                                (float *)c->p->moe.h1 + (size_t)off * 2 * Ie, 2 * Ie, 0.0f, q, &st_));
    }
}

typedef struct { const sd_model *m; sd_state *s; const int *tokens; int n; } pre_ctx;
static void run_prefill(void *ctx, cudaStream_t q) {
    (void)q;
    pre_ctx *c = ctx;
    sd_state_reset(c->s);
    SD_BENCH_OK(sd_prefill(c->m, c->s, c->tokens, c->n, NULL, &st_));
}

static void lab_model(void) {
    char path[4096];
    const char *src = getenv("SPECDEC_SOURCE_DIR");
    snprintf(path, sizeof path, "%s/configs/kimi-linear-48b-a3b.json", src ? src : SPECDEC_SOURCE_DIR);
    sd_config kimi, cfg;
    SD_BENCH_OK(sd_config_load(path, &kimi, &st_));
    SD_BENCH_OK(sd_draft_config(&kimi, 4, &cfg, &st_)); // layers 1-3 KDA, 4 MLA; layer 0 dense, 1-3 MoE
    const sd_synth_opts so = {.seed = 3, .dtype = SD_DT_BF16, .tail_from = SD_MAX_LAYERS, .tail_scale = 1.0f};
    sd_model dev;
    SD_BENCH_OK(sd_cuda_model_synth(&cfg, &so, 0, &dev, &st_));
    sd_cuda_backend *b = sd_cuda_backend_of(&dev);
    const int V = cfg.vocab_size, NC = 300, C = 4096;
    int *tokens = malloc(sizeof(int) * (C + 1));
    for (int i = 0; i <= C; i++) tokens[i] = (int)(((uint64_t)i * 2654435761u + 12345u) % (uint64_t)V);
    { // the check: 300 tokens through the prefill against the token path (verify chunks of 8)
        sd_state rs, ps;
        SD_BENCH_OK(sd_cuda_state_init(&rs, &dev, NC + 1, 8, &st_));
        SD_BENCH_OK(sd_cuda_state_init(&ps, &dev, NC + 1, 8, &st_));
        float *ref = malloc(sizeof(float) * (size_t)(NC + 1) * V), *got = malloc(sizeof(float) * (size_t)(NC + 1) * V);
        for (int t = 0; t < NC; t += 8) {
            const int T = NC - t < 8 ? NC - t : 8;
            SD_BENCH_OK(sd_forward(&dev, &rs, tokens + t, T, ref + (size_t)t * V, 0, NULL, &st_));
            SD_BENCH_OK(sd_state_commit(&rs, T, &st_));
        }
        SD_BENCH_OK(sd_prefill_rows(&dev, &ps, tokens, NC, got, true, NULL, &st_));
        add_row("model", "prefill vs token path, 300", rel_err(got, ref, (size_t)NC * V), 2e-2, -1, 0, "");
        SD_BENCH_OK(sd_forward(&dev, &rs, tokens + NC, 1, ref + (size_t)NC * V, 0, NULL, &st_));
        SD_BENCH_OK(sd_forward(&dev, &ps, tokens + NC, 1, got + (size_t)NC * V, 0, NULL, &st_));
        add_row("model", "next decode step", rel_err(got + (size_t)NC * V, ref + (size_t)NC * V, V), 2e-2, -1, 0, "");
        int agree = 0, clear = 0;
        for (int t = 0; t <= NC; t++) clear++, agree += sd_argmax(got + (size_t)t * V, V) == sd_argmax(ref + (size_t)t * V, V);
        printf("        model: greedy tokens agree at %d of %d positions (synthetic weights: near-ties are common)\n", agree, clear);
        free(ref); free(got);
        sd_state_free(&rs);
        sd_state_free(&ps);
    }
    // A 4096-token piece: whole (host clock, as a prompt is fed), then by
    // sublayer from the piece's start.
    sd_state s;
    SD_BENCH_OK(sd_cuda_state_init(&s, &dev, C + 1, 8, &st_));
    pre_ctx pc = {.m = &dev, .s = &s, .tokens = tokens, .n = C};
    run_prefill(&pc, b->stream); // warm-up: every GEMM shape's plan
    SD_BENCH_CK(cudaDeviceSynchronize());
    double best = 1e30;
    for (int r = 0; r < 3; r++) {
        const uint64_t t0 = trace_now_ns();
        run_prefill(&pc, b->stream);
        SD_BENCH_CK(cudaDeviceSynchronize());
        const double ms = (double)(trace_now_ns() - t0) * 1e-6;
        best = ms < best ? ms : best;
    }
    add_row("model", "4 layers + head, 4096 tokens", -1, 0, best, C / best * 1e3, "tokens/s");
    sd_state_reset(&s);
    sd_prefill_scratch *p;
    SD_BENCH_OK(sd_prefill_scratch_of(&dev, &p, &st_));
    SD_BENCH_OK(sd_cuda_rmsnorm(p->x, dev.w.layers[0].input_norm, C, cfg.hidden_size, cfg.rms_norm_eps, p->a, b->stream, &st_));
    SD_BENCH_OK(sd_cuda_to_bf16(p->a, (size_t)C * cfg.hidden_size, p->a16, b->stream, &st_));
    static const struct { const char *name; int layer, kind; } SUBS[] = {
        {"KDA mixer (layer 0)", 0, 0}, {"MLA mixer (layer 3)", 3, 1}, {"dense FFN (layer 0)", 0, 3}, {"MoE FFN (layer 1)", 1, 2}};
    for (int i = 0; i < 4; i++) {
        sub_ctx sc = {.b = b, .p = p, .m = &dev, .s = &s, .layer = SUBS[i].layer, .C = C, .kind = SUBS[i].kind};
        const double ms = sd_bench_time_ms(run_sub, &sc, b->stream, 3);
        add_row("model", SUBS[i].name, -1, 0, ms, C / ms * 1e3, "tokens/s");
    }
    // The MoE sublayer ran last: its grouping (layer 1's), counts (p->counts_host) and grouped plan
    // are in the scratch.
    loop_ctx lc = {.m = &dev, .p = p, .layer = 1};
    add_row("model", "experts up, engine's grouped", -1, 0, sd_bench_time_ms(run_grouped_engine, &lc, b->stream, 3), 0, "");
    lc.down = 1;
    add_row("model", "experts down, engine's grouped", -1, 0, sd_bench_time_ms(run_grouped_engine, &lc, b->stream, 3), 0, "");
    lc.down = 0;
    add_row("model", "experts up, cuBLASLt loop", -1, 0, sd_bench_time_ms(run_loop_up, &lc, b->stream, 3), 0, "");
    for (int down = 0; down < 2; down++)
        for (int f32 = 0; f32 < 2; f32++) grouped_cublas(&dev, p, 1, down, f32, b->stream);
    printf("        model: prefill scratch %.2f GB for pieces of %d tokens\n", sd_cuda_prefill_scratch_bytes(&dev) / 1e9, p->chunk);
    free(tokens);
    sd_state_free(&s);
    sd_model_free(&dev);
}

const char *sd_bench_prog = "prefill_lab";

int main(int argc, char **argv) {
    bool all = argc == 1, want[5] = {false};
    static const char *names[5] = {"--ceilings", "--gemm", "--kda", "--mla", "--model"};
    for (int i = 1; i < argc; i++) {
        bool known = !strcmp(argv[i], "--all");
        all |= known;
        for (int k = 0; k < 5; k++)
            if (!strcmp(argv[i], names[k])) want[k] = known = true;
        if (!strcmp(argv[i], "--help") || !known) {
            printf("usage: prefill_lab [--all | --ceilings --gemm --kda --mla --model]  (no option: --all)\n");
            return strcmp(argv[i], "--help") ? 2 : 0;
        }
    }
    int n = 0;
    SD_BENCH_CK(cudaGetDeviceCount(&n));
    if (n < 1) { fprintf(stderr, "prefill_lab: no CUDA device\n"); return 1; }
    char dev_name[256];
    SD_BENCH_OK(sd_cuda_device_name(0, dev_name, sizeof dev_name, &st_));
    printf("prefill_lab on %s\n", dev_name);
    if (all || want[0]) lab_ceilings();
    if (all || want[1]) lab_gemm();
    if (all || want[2]) lab_kda();
    if (all || want[3]) lab_mla();
    if (all || want[4]) lab_model();
    print_table();
    return n_fail ? 1 : 0;
}
