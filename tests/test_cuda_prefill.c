// test_cuda_prefill.c — the prefill path on the GPU (docs/PREFILL.md). Its pieces against their
// CPU references (the test-backend-ops habit: random inputs, guarded outputs, NaN fails): the
// cuBLASLt GEMM against sd_linear, the chunked KDA kernels against both CPU forms of the
// recurrence, the flash attention against a float64 softmax, the MoE block against
// sd_moe_forward. Then whole models: the routing the token path's but at near-ties, every
// position's logits within MODEL.md's GPU tolerance of the token path routed as the prefill routed,
// the state left and the next decode step within it of the token path; plain and speculative runs
// after a fast prefill token for token; refusals that leave the state as it was. Without a device every test
// reports itself skipped.
#include <math.h>
#include <stdint.h>
#include <string.h>
#include "common.h"

#if !SPECDEC_HAVE_CUDA
Test(cuda_prefill, suite) { cr_skip_test("CUDA backend not built (no toolkit or -DSPECDEC_CUDA=OFF): GPU suite skipped"); }
#else
#include "cuda_backend.h"     // sd_cuda_model_upload, sd_cuda_state_init, sd_cuda_backend_of
#include "cuda_prefill.h"     // sd_cuda_prefill_set_chunk
#include "decode.h"           // sd_decode
#include "gemm.h"             // sd_gemm_*
#include "gpu_check.h"        // gpu_buf, CHECK_REL
#include "kda_prefill.h"      // sd_cuda_kda_chunk
#include "kda_scan.h"         // sd_kda_step, sd_kda_chunk_head
#include "layers.h"           // sd_moe_forward
#include "ops.h"              // sd_linear
#include "prefill_internal.h" // sd_prefill_scratch_of, sd_prefill_moe_ffn
#include "sample.h"           // sd_argmax
#include "spec.h"             // sd_spec_generate

static void need_gpu(void) {
    if (sd_cuda_device_count() == 0) cr_skip_test("no CUDA device: GPU suite skipped");
}
#define OK(call)                                                          \
    do {                                                                  \
        sd_status st_ = {0};                                              \
        sd_code rc_ = (call);                                             \
        cr_assert_eq(rc_, SD_OK, "%s: %s", #call, st_.msg);               \
    } while (0)

// ---------------------------------------------------------------------------- GEMM
// Tolerances (gemm.h): a bf16 weight multiplies bf16-rounded activations, a relative error of at
// most 2^-9 a product (rms ≈ 1.1e-3 over random terms): 4e-3 leaves ~4× room. An f32 weight runs in
// fp32, only the summation order differs: 1e-5.
typedef struct { int M, N, K, ldy; sd_dtype dt; float beta; } gemm_case;
static const gemm_case GEMM_CASES[] = {
    {1, 64, 32, 64, SD_DT_BF16, 0},    {7, 2, 32, 4, SD_DT_BF16, 0},      // tiny's b_proj, rows padded to 4
    {37, 16, 8, 16, SD_DT_BF16, 0},    {300, 512, 512, 512, SD_DT_BF16, 0}, // tiny's f_b; toy's o_proj
    {129, 1536, 512, 1536, SD_DT_BF16, 1}, {257, 2048, 2304, 2048, SD_DT_BF16, 0}, // accumulate; a kimi expert's gate+up
    {64, 256, 512, 256, SD_DT_F32, 0}, {5, 8, 32, 8, SD_DT_F32, 1},       // f32 weights; tiny's router
};

Test(cuda_prefill, gemm_matches_sd_linear) {
    need_gpu();
    sd_gemm *g;
    OK(sd_gemm_create(&g, (size_t)512 * 4096, &st_));
    for (size_t ci = 0; ci < sizeof GEMM_CASES / sizeof GEMM_CASES[0]; ci++) {
        const gemm_case *c = &GEMM_CASES[ci];
        const size_t nw = (size_t)c->N * c->K, nx = (size_t)c->M * c->K, ny = (size_t)c->M * c->ldy;
        float *wf = gpu_rand_host(nw, 10 + ci, 1.7f / sqrtf((float)c->K)), *x = gpu_rand_host(nx, 20 + ci, 1.0f);
        float *y0 = gpu_rand_host(ny, 30 + ci, 1.0f), *ref = malloc(sizeof(float) * ny), *got = malloc(sizeof(float) * ny);
        const size_t es = sd_dtype_size(c->dt);
        void *wh = malloc(nw * es);
        for (size_t i = 0; i < nw; i++) {
            if (c->dt == SD_DT_BF16) ((uint16_t *)wh)[i] = sd_f32_to_bf16(wf[i]);
            else ((float *)wh)[i] = wf[i];
        }
        const sd_mat wm_host = {.dtype = c->dt, .data = wh, .rows = c->N, .cols = c->K};
        float *lin = malloc(sizeof(float) * (size_t)c->M * c->N);
        sd_linear(&wm_host, x, c->M, lin);
        memcpy(ref, y0, sizeof(float) * ny);
        for (int t = 0; t < c->M; t++)
            for (int o = 0; o < c->N; o++) ref[(size_t)t * c->ldy + o] = c->beta * ref[(size_t)t * c->ldy + o] + lin[(size_t)t * c->N + o];
        gpu_buf dw = gpu_buf_new(nw, es), dx = gpu_buf_new(nx, 4), dy = gpu_buf_new(ny, 4);
        gpu_buf_put(&dw, wh, nw * es);
        gpu_buf_put(&dx, x, nx * 4);
        gpu_buf_put(&dy, y0, ny * 4);
        const sd_mat wm = {.dtype = c->dt, .data = dw.p, .rows = c->N, .cols = c->K};
        OK(sd_gemm_linear(g, &wm, dx.p, c->K, c->M, dy.p, c->ldy, c->beta, 0, &st_));
        const size_t plans = sd_gemm_plans(g);
        gpu_buf_put(&dy, y0, ny * 4);
        OK(sd_gemm_linear(g, &wm, dx.p, c->K, c->M, dy.p, c->ldy, c->beta, 0, &st_)); // the same shape: its plan again
        cr_assert_eq(sd_gemm_plans(g), plans, "a second call of one shape made a new plan");
        GPU_OK(cudaDeviceSynchronize());
        gpu_buf_get(&dy, got, ny * 4);
        CHECK_REL(got, ref, ny, c->dt == SD_DT_BF16 ? 4e-3 : 1e-5, "gemm M=%d N=%d K=%d %s beta %g", c->M, c->N, c->K,
                  sd_dtype_name(c->dt), c->beta);
        gpu_buf_done(&dw, "gemm w");
        gpu_buf_done(&dx, "gemm x");
        gpu_buf_done(&dy, "gemm y");
        free(wf); free(x); free(y0); free(ref); free(got); free(wh); free(lin);
    }
    sd_gemm_free(g);
}

// The MLA absorptions' shape: per head h, Y_h = X_h · op(W_h) with X_h columns of one row,
// W_h a slice of kv_b, both transpositions; against float64 loops.
Test(cuda_prefill, gemm_strided_batches) {
    need_gpu();
    enum { Hm = 4, C = 50, dn = 64, dr = 32, dv = 64, R = 128, LDM = Hm * (dn + dr) + R + dr };
    sd_gemm *g;
    OK(sd_gemm_create(&g, (size_t)C * LDM, &st_)); // the staged span of either call fits
    const size_t nkv = (size_t)Hm * (dn + dv) * R;
    float *kvf = gpu_rand_host(nkv, 5, 0.1f), *qm = gpu_rand_host((size_t)C * LDM, 6, 1.0f);
    uint16_t *kvb = malloc(nkv * 2);
    for (size_t i = 0; i < nkv; i++) kvb[i] = sd_f32_to_bf16(kvf[i]);
    gpu_buf dkv = gpu_buf_new(nkv, 2), dq = gpu_buf_new((size_t)C * LDM, 4), dy = gpu_buf_new((size_t)C * Hm * R, 4);
    gpu_buf_put(&dkv, kvb, nkv * 2);
    gpu_buf_put(&dq, qm, sizeof(float) * C * LDM);
    for (int op = 0; op < 2; op++) { // SD_GEMM_WN: q̃ = qn·W_UK (N = R, K = dn); SD_GEMM_WT: o = lat·W_UVᵀ (N = dv, K = R)
        const int N = op == SD_GEMM_WN ? R : dv, K = op == SD_GEMM_WN ? dn : R;
        const int ldx = op == SD_GEMM_WN ? LDM : Hm * R, sx = op == SD_GEMM_WN ? dn + dr : R;
        const size_t w_off = op == SD_GEMM_WN ? 0 : (size_t)dn * R;
        const sd_gemm_args a = {.w = (const uint16_t *)dkv.p + w_off, .w_dtype = SD_DT_BF16, .ldw = R, .op = op, .x = dq.p,
                                .x_dtype = SD_DT_F32, .ldx = ldx, .y = dy.p, .ldy = Hm * N, .M = C, .N = N, .K = K,
                                .batch = Hm, .stride_w = (long long)(dn + dv) * R, .stride_x = sx, .stride_y = N};
        OK(sd_gemm_run(g, &a, 0, &st_));
        GPU_OK(cudaDeviceSynchronize());
        float *got = malloc(sizeof(float) * C * Hm * N), *ref = malloc(sizeof(float) * C * Hm * N);
        gpu_buf_get(&dy, got, sizeof(float) * C * Hm * N);
        for (int h = 0; h < Hm; h++)
            for (int t = 0; t < C; t++)
                for (int n = 0; n < N; n++) {
                    double acc = 0;
                    for (int k = 0; k < K; k++) {
                        const size_t wi = (size_t)h * (dn + dv) * R + w_off + (op == SD_GEMM_WN ? (size_t)k * R + n : (size_t)n * R + k);
                        acc += (double)qm[(size_t)t * ldx + (size_t)h * sx + k] * sd_bf16_to_f32(kvb[wi]);
                    }
                    ref[(size_t)t * Hm * N + (size_t)h * N + n] = (float)acc;
                }
        CHECK_REL(got, ref, (size_t)C * Hm * N, 4e-3, "batched %s", op == SD_GEMM_WN ? "X·W" : "X·Wt");
        free(got);
        free(ref);
    }
    gpu_buf_done(&dkv, "kv_b");
    gpu_buf_done(&dq, "x");
    gpu_buf_done(&dy, "y");
    free(kvf); free(qm); free(kvb);
    sd_gemm_free(g);
}

// ---------------------------------------------------------------------------- KDA
typedef struct { int H, d, T; } kda_case;
// Rows of n floats at stride ld (zero between), a copy of the packed rows x (T, n).
static float *strided_rows(const float *x, int T, int n, int ld) {
    float *y = calloc((size_t)T * ld, sizeof(float));
    cr_assert_not_null(y);
    for (int t = 0; t < T; t++) memcpy(y + (size_t)t * ld, x + (size_t)t * n, sizeof(float) * n);
    return y;
}

static const kda_case KDA_CASES[] = {{2, 8, 1}, {2, 8, 63}, {3, 16, 64}, {4, 32, 65}, {2, 64, 130}, {4, 128, 200}};

// The device's chunked recurrence against the CPU's chunked form and the token recurrence, from
// a non-empty state, inputs laid out as the prefill's (q, k, v interleaved rows of 3P).
Test(cuda_prefill, kda_chunk_matches_both_cpu_forms) {
    need_gpu();
    for (size_t ci = 0; ci < sizeof KDA_CASES / sizeof KDA_CASES[0]; ci++) {
        const int H = KDA_CASES[ci].H, d = KDA_CASES[ci].d, T = KDA_CASES[ci].T, P = H * d;
        const size_t n3 = (size_t)T * 3 * P, nS = (size_t)H * d * d;
        float *qkv = gpu_rand_host(n3, 40 + ci, 1.0f), *g = gpu_rand_host((size_t)T * P, 50 + ci, 1.0f);
        float *beta = gpu_rand_host((size_t)T * H, 60 + ci, 1.0f), *S0 = gpu_rand_host(nS, 70 + ci, 0.2f);
        for (size_t i = 0; i < (size_t)T * P; i++) g[i] = -0.5f * (g[i] + 1.0f) - 1e-3f; // log decay in (-1, 0)
        for (int i = 0; i < T * H; i++) beta[i] = 0.5f + 0.45f * beta[i];
        for (int t = 0; t < T; t++)
            for (int which = 0; which < 2; which++)
                for (int h = 0; h < H; h++) {
                    float *x = qkv + (size_t)t * 3 * P + (size_t)which * P + (size_t)h * d, ss = 0;
                    for (int i = 0; i < d; i++) ss += x[i] * x[i];
                    for (int i = 0; i < d; i++) x[i] /= sqrtf(ss + 1e-6f);
                }
        // sd_kda_chunk_head writes its outputs at its inputs' stride (3P), the token loop at P.
        float *y_chunk = calloc((size_t)T * 3 * P, sizeof(float)), *y_rec = calloc((size_t)T * P, sizeof(float));
        float *S_chunk = malloc(sizeof(float) * nS), *S_rec = malloc(sizeof(float) * nS);
        float *Sa = malloc(sizeof(float) * d * d), *Sb = malloc(sizeof(float) * d * d);
        float *work = malloc(sizeof(float) * sd_kda_chunk_work_floats(d, SD_KDA_CHUNK));
        memcpy(S_chunk, S0, sizeof(float) * nS);
        float *g3 = strided_rows(g, T, P, 3 * P); // sd_kda_chunk_head reads every input at one stride
        for (int h = 0; h < H; h++) {
            const size_t o = (size_t)h * d;
            sd_kda_chunk_head(S_chunk + (size_t)h * d * d, qkv + o, qkv + P + o, qkv + 2 * P + o, g3 + o, beta + h, T, d,
                              SD_KDA_CHUNK, 3 * P, H, y_chunk + o, work);
            memcpy(Sa, S0 + (size_t)h * d * d, sizeof(float) * d * d);
            for (int t = 0; t < T; t++) {
                const size_t r = (size_t)t * 3 * P + o;
                sd_kda_step(Sa, Sb, qkv + r, qkv + P + r, qkv + 2 * P + r, g + (size_t)t * P + o, beta[(size_t)t * H + h], d,
                            y_rec + (size_t)t * P + o);
                float *tmp = Sa; Sa = Sb; Sb = tmp;
            }
            memcpy(S_rec + (size_t)h * d * d, Sa, sizeof(float) * d * d);
        }
        float *y_cpu = malloc(sizeof(float) * T * P);
        for (int t = 0; t < T; t++)
            for (int h = 0; h < H; h++) memcpy(y_cpu + (size_t)t * P + (size_t)h * d, y_chunk + (size_t)t * 3 * P + (size_t)h * d, sizeof(float) * d);
        gpu_buf dqkv = gpu_buf_new(n3, 4), dg = gpu_buf_new((size_t)T * P, 4), db = gpu_buf_new((size_t)T * H, 4);
        gpu_buf dS = gpu_buf_new(nS, 4), dSo = gpu_buf_new(nS, 4), dy = gpu_buf_new((size_t)T * P, 4);
        gpu_buf dw = gpu_buf_new(sd_cuda_kda_chunk_work_floats(T, H, d), 4);
        gpu_buf_put(&dqkv, qkv, n3 * 4);
        gpu_buf_put(&dg, g, sizeof(float) * T * P);
        gpu_buf_put(&db, beta, sizeof(float) * T * H);
        gpu_buf_put(&dS, S0, nS * 4);
        const float *q = dqkv.p;
        OK(sd_cuda_kda_chunk(q, q + P, q + 2 * P, 3 * P, dg.p, P, db.p, H, T, H, d, dS.p, dSo.p, dy.p, P, dw.p, 0, &st_));
        GPU_OK(cudaDeviceSynchronize());
        float *y_gpu = malloc(sizeof(float) * T * P), *S_gpu = malloc(sizeof(float) * nS);
        gpu_buf_get(&dy, y_gpu, sizeof(float) * T * P);
        gpu_buf_get(&dSo, S_gpu, nS * 4);
        // fp32 both sides; the device's fast exp (≲ 1e-6 relative) and FMA; the CPU forms agree
        // to ~5e-7 (test_kda_chunk). 1e-4 leaves room and catches any indexing slip (O(1)).
        CHECK_REL(y_gpu, y_cpu, (size_t)T * P, 1e-4, "kda H=%d d=%d T=%d outputs vs the CPU chunked form", H, d, T);
        CHECK_REL(S_gpu, S_chunk, nS, 1e-4, "kda H=%d d=%d T=%d state vs the CPU chunked form", H, d, T);
        CHECK_REL(y_gpu, y_rec, (size_t)T * P, 1e-4, "kda H=%d d=%d T=%d outputs vs the token recurrence", H, d, T);
        CHECK_REL(S_gpu, S_rec, nS, 1e-4, "kda H=%d d=%d T=%d state vs the token recurrence", H, d, T);
        // In place (the same slot read and written): the same state.
        OK(sd_cuda_kda_chunk(q, q + P, q + 2 * P, 3 * P, dg.p, P, db.p, H, T, H, d, dS.p, dS.p, dy.p, P, dw.p, 0, &st_));
        GPU_OK(cudaDeviceSynchronize());
        float *S_in_place = malloc(sizeof(float) * nS);
        gpu_buf_get(&dS, S_in_place, nS * 4);
        cr_assert(memcmp(S_in_place, S_gpu, nS * 4) == 0, "kda H=%d d=%d T=%d: in place differs", H, d, T);
        gpu_buf_done(&dqkv, "qkv"); gpu_buf_done(&dg, "g"); gpu_buf_done(&db, "beta");
        gpu_buf_done(&dS, "S"); gpu_buf_done(&dSo, "S out"); gpu_buf_done(&dy, "y"); gpu_buf_done(&dw, "work");
        free(qkv); free(g); free(g3); free(beta); free(S0); free(y_chunk); free(y_rec); free(S_chunk); free(S_rec);
        free(Sa); free(Sb); free(work); free(y_cpu); free(y_gpu); free(S_gpu); free(S_in_place);
    }
}

// ---------------------------------------------------------------------------- MoE
// One MoE layer over C tokens: the device's routing equal to the CPU's, its output within the
// bf16 activations' tolerance or fp32's (1e-5). BF16 experts round five times on the way, each at
// most 2^-8 relative (≈ 1.6e-3 rms over random values): the gathered rows, the grouped [gate | up]
// output (gate and up each), the SwiGLU and the grouped down output; independent roundings add
// to ≈ 3.6e-3 rms, and 1e-2 leaves ~3× room.
static void check_moe(const char *config, int bf16, int C) {
    need_gpu();
    sd_model host, dev;
    synth_from(config, 11, bf16, SD_MAX_LAYERS, 1.0f, &host);
    OK(sd_cuda_model_upload(&host, &dev, &st_));
    const sd_config *c = &host.cfg;
    const int layer = c->first_k_dense_replace, D = c->hidden_size, K = c->num_experts_per_token;
    sd_state hs;
    OK(sd_state_init(&hs, c, 8, C, &st_));
    float *a = gpu_rand_host((size_t)C * D, 123, 1.0f), *ref = malloc(sizeof(float) * C * D), *got = malloc(sizeof(float) * C * D);
    sd_moe_forward(&host.w.layers[layer].moe, c, &hs, a, C, ref);
    sd_prefill_scratch *p;
    OK(sd_prefill_scratch_of(&dev, &p, &st_));
    cr_assert_geq(p->chunk, C);
    sd_cuda_backend *b = sd_cuda_backend_of(&dev);
    GPU_OK(cudaMemcpy(p->a, a, sizeof(float) * C * D, cudaMemcpyHostToDevice));
    GPU_OK(cudaMemset(p->x, 0, sizeof(float) * C * D));
    OK(sd_cuda_to_bf16(p->a, (size_t)C * D, p->a16, b->stream, &st_));
    OK(sd_prefill_moe_ffn(b, p, &dev, layer, C, &st_));
    GPU_OK(cudaStreamSynchronize(b->stream));
    GPU_OK(cudaMemcpy(got, p->x, sizeof(float) * C * D, cudaMemcpyDeviceToHost));
    int *sel = malloc(sizeof(int) * C * K);
    GPU_OK(cudaMemcpy(sel, p->moe.sel, sizeof(int) * C * K, cudaMemcpyDeviceToHost));
    for (int i = 0; i < C * K; i++) cr_assert_eq(sel[i], hs.scratch.sel[i], "%s: sel[%d] (token %d)", config, i, i / K);
    CHECK_REL(got, ref, (size_t)C * D, bf16 ? 1e-2 : 1e-5, "%s MoE layer %d, %d tokens (%s)", config, layer, C,
              bf16 ? "bf16" : "f32");
    free(a); free(ref); free(got); free(sel);
    sd_state_free(&hs);
    sd_model_free(&dev);
    sd_model_free(&host);
}
Test(cuda_prefill, moe_tiny_f32) { check_moe("configs/tiny.json", 0, 57); }
Test(cuda_prefill, moe_tiny_bf16) { check_moe("configs/tiny.json", 1, 200); }
Test(cuda_prefill, moe_toy_bf16) { check_moe("configs/toy.json", 1, 300); }
Test(cuda_prefill, moe_toy_bf16_many_rows) { check_moe("configs/toy.json", 1, 2000); } // ~250 rows an expert

// ---------------------------------------------------------------------------- whole models
static float *read_back(const float *dev_ptr, size_t n) {
    float *h = malloc(sizeof(float) * (n ? n : 1));
    GPU_OK(cudaMemcpy(h, dev_ptr, sizeof(float) * n, cudaMemcpyDeviceToHost));
    return h;
}

// Where a logits error lives: the rows above tol and the five worst (position, relative error,
// the token path's smallest routing margin there, whether the argmax moved), on stderr, so a failure says whether a few positions (a token
// routed otherwise) or all of them (a drift) carry it.
static void report_rows(const float *got, const float *ref, const float *margin, int n, int V, double tol, const char *what) {
    double worst[5] = {0};
    int at[5] = {-1, -1, -1, -1, -1}, above = 0;
    for (int t = 0; t < n; t++) {
        double d = 0, r = 0;
        int ag = 0, ar = 0;
        for (int v = 0; v < V; v++) {
            const double a = got[(size_t)t * V + v], b = ref[(size_t)t * V + v];
            d += (a - b) * (a - b);
            r += b * b;
            if (a > got[(size_t)t * V + ag]) ag = v;
            if (b > ref[(size_t)t * V + ar]) ar = v;
        }
        const double e = r > 0 ? sqrt(d / r) : sqrt(d);
        above += e > tol;
        for (int i = 0; i < 5; i++)
            if (e > worst[i]) {
                for (int j = 4; j > i; j--) worst[j] = worst[j - 1], at[j] = at[j - 1];
                worst[i] = e;
                at[i] = t * 2 + (ag != ar); // the position, and the argmax flag in the low bit
                break;
            }
    }
    fprintf(stderr, "[rows] %s: %d of %d positions above %.0e; worst:", what, above, n, tol);
    for (int i = 0; i < 5 && at[i] >= 0; i++)
        fprintf(stderr, " pos %d %.3g (routing margin %.2g)%s", at[i] / 2, worst[i], margin[at[i] / 2],
                at[i] & 1 ? " (argmax moved)" : "");
    fprintf(stderr, "\n");
}

// One path's routing of a prompt: sel and w of every (layer, position) (MoE layers only filled)
// and the margin there, as the route tap reports them.
typedef struct {
    int n, K;
    int *sel;
    float *w, *margin;
} routes;

static routes routes_new(const sd_config *c, int n) {
    const size_t at = (size_t)c->num_hidden_layers * n;
    routes r = {.n = n, .K = c->num_experts_per_token, .sel = calloc(at * c->num_experts_per_token, sizeof(int)),
                .w = calloc(at * c->num_experts_per_token, sizeof(float)), .margin = calloc(at, sizeof(float))};
    cr_assert(r.sel && r.w && r.margin);
    return r;
}
static void routes_free(routes *r) { free(r->sel); free(r->w); free(r->margin); }

static void record_route(void *ctx, int layer, int pos, const int *sel, const float *w, int k, float margin) {
    routes *r = ctx;
    cr_assert(pos >= 0 && pos < r->n && k == r->K, "route tap: position %d, k %d", pos, k);
    const size_t at = (size_t)layer * r->n + pos;
    memcpy(r->sel + at * k, sel, sizeof(int) * k);
    memcpy(r->w + at * k, w, sizeof(float) * k);
    r->margin[at] = margin;
}

// The route override of the teacher-forced reference: the prefill's routing in place of the
// router's, the router's own choice kept beside it.
typedef struct {
    const routes *pre;
    routes *own;
} forcing;
static void force_route(void *ctx, int layer, int pos, int *sel, float *w, int k) {
    const forcing *f = ctx;
    const size_t at = (size_t)layer * f->pre->n + pos;
    memcpy(f->own->sel + at * k, sel, sizeof(int) * k);
    memcpy(sel, f->pre->sel + at * k, sizeof(int) * k);
    memcpy(w, f->pre->w + at * k, sizeof(float) * k);
}

// Under the same routing history the prefill's router input differs from the token path's by the
// bf16 rounding of the activations (2^-9 a product) carried through the layers, so the two may
// choose otherwise only where the token path's choice stands near a tie.
#define ROUTE_FLIP_MARGIN 0x1p-6f

// Whether two selections of k experts hold the same experts (in any order: two selected experts
// of near-equal scores may come out in either order, which moves only the combine's rounding).
static bool same_experts(const int *a, const int *b, int k) {
    for (int i = 0; i < k; i++) {
        bool found = false;
        for (int j = 0; j < k && !found; j++) found = a[i] == b[j];
        if (!found) return false;
    }
    return true;
}

// Where the prefill's selection of positions 0 .. n-1 differs from the router's own choice in the
// teacher-forced reference (own.sel, margin[] of that run): each must sit at a margin below
// ROUTE_FLIP_MARGIN.
static void check_route_flips(const sd_config *c, const routes *pre, const routes *own, const float *margin, int n,
                              const char *what) {
    int flips = 0, wide = 0, entries = 0, wide_layer = -1, wide_pos = -1;
    float widest = 0;
    for (int i = 0; i < c->num_hidden_layers; i++) {
        if (!sd_config_is_moe(c, i)) continue;
        for (int t = 0; t < n; t++) {
            const size_t at = (size_t)i * pre->n + t;
            entries++;
            if (same_experts(pre->sel + at * pre->K, own->sel + at * own->K, pre->K)) continue;
            flips++;
            wide += margin[at] >= ROUTE_FLIP_MARGIN;
            if (flips <= 6) { // the first few, so a failure shows what moved
                fprintf(stderr, "[flip] %s: layer %d position %d margin %.3g: prefill", what, i, t, margin[at]);
                for (int j = 0; j < pre->K; j++) fprintf(stderr, " %d", pre->sel[at * pre->K + j]);
                fprintf(stderr, ", token path");
                for (int j = 0; j < own->K; j++) fprintf(stderr, " %d", own->sel[at * own->K + j]);
                fprintf(stderr, "\n");
            }
            if (margin[at] > widest) widest = margin[at], wide_layer = i, wide_pos = t;
        }
    }
    cr_log_info("%s: %d of %d (MoE layer, position) entries route otherwise than the token path would on the same "
                "history (margins up to %.3g there)", what, flips, entries, widest);
    cr_assert(!wide, "%s: %d entries route otherwise at a margin >= %.3g; the widest %.3g at layer %d, position %d", what,
              wide, ROUTE_FLIP_MARGIN, widest, wide_layer, wide_pos);
}

// The prompt through the prefill (pieces of `piece` tokens) against the token path (verify chunks
// of 8, ≡ decode, ≡ the CPU reference). The prefill's routing is the token path's but at
// near-ties, and a near-tie routed otherwise changes a position's row outright, so the values are
// held to the teacher-forced token path — the CPU reference routed as the prefill routed (model.h's
// route override): every position's logits, the live state it leaves (KDA slot and conv rows, MLA
// cache rows) and the next decode step, within MODEL.md's GPU tolerance. The route tap must not
// change the prefill's bits.
static void check_model(const char *config, int bf16, int n, int piece) {
    need_gpu();
    sd_model host, dev;
    synth_from(config, 7, bf16, SD_MAX_LAYERS, 1.0f, &host);
    OK(sd_cuda_model_upload(&host, &dev, &st_));
    const sd_config *c = &dev.cfg;
    const int V = c->vocab_size, max_T = 8;
    int *tokens = malloc(sizeof(int) * (n + 1));
    random_tokens(17, V, n + 1, tokens);
    char what[128];
    snprintf(what, sizeof what, "%s (%s) %d tokens in pieces of %d", config, bf16 ? "bf16" : "f32", n, piece);
    OK(sd_cuda_prefill_set_chunk(&dev, piece, &st_));
    sd_state tok_s, pre_s, plain_s, cpu_s;
    OK(sd_model_state_init(&dev, &tok_s, n + 1, max_T, &st_));
    OK(sd_model_state_init(&dev, &pre_s, n + 1, max_T, &st_));
    OK(sd_model_state_init(&dev, &plain_s, n + 1, max_T, &st_));
    OK(sd_model_state_init(&host, &cpu_s, n + 1, max_T, &st_));
    const size_t NV = (size_t)(n + 1) * V;
    float *ref = malloc(sizeof(float) * NV), *got = malloc(sizeof(float) * NV), *plain = malloc(sizeof(float) * NV);
    float *forced = malloc(sizeof(float) * NV), *margin = malloc(sizeof(float) * n);
    routes tok = routes_new(c, n + 1), pre = routes_new(c, n + 1), own = routes_new(c, n + 1), forced_taps = routes_new(c, n + 1);

    // The token path as it routes itself (its margins; the error it shows, for the report).
    const sd_forward_opts taps = {.on_route = record_route, .route_ctx = &tok};
    for (int t = 0; t < n; t += max_T) {
        const int T = n - t < max_T ? n - t : max_T;
        OK(sd_forward(&dev, &tok_s, tokens + t, T, ref + (size_t)t * V, 0, &taps, &st_));
        OK(sd_state_commit(&tok_s, T, &st_));
    }
    // The prefill, with its route tap and without.
    cr_assert(n > SD_PREFILL_TOKEN_PATH_MAX);
    const sd_prefill_opts pre_taps = {.on_route = record_route, .route_ctx = &pre};
    OK(sd_prefill_rows(&dev, &pre_s, tokens, n, got, true, &pre_taps, &st_));
    cr_assert(pre_s.len == n && pre_s.pending == 0);
    OK(sd_prefill_rows(&dev, &plain_s, tokens, n, plain, true, NULL, &st_));
    cr_assert(!memcmp(got, plain, sizeof(float) * (size_t)n * V), "%s: the route tap changed the prefill's logits", what);
    for (size_t i = 0; i < (size_t)n * V; i++) cr_assert(isfinite(got[i]), "%s: logit %zu is not finite", what, i);

    // The teacher-forced reference: the CPU token path with the prefill's selections and weights.
    forcing f = {.pre = &pre, .own = &own};
    const sd_forward_opts force_opts = {.override_route = force_route, .override_ctx = &f, .on_route = record_route,
                                        .route_ctx = &forced_taps};
    for (int t = 0; t < n; t += max_T) {
        const int T = n - t < max_T ? n - t : max_T;
        OK(sd_forward(&host, &cpu_s, tokens + t, T, forced + (size_t)t * V, 0, &force_opts, &st_));
        OK(sd_state_commit(&cpu_s, T, &st_));
    }
    int flips = 0;
    for (int i = 0; i < c->num_hidden_layers; i++)
        for (int t = 0; sd_config_is_moe(c, i) && t < n; t++) {
            const size_t at = (size_t)i * tok.n + t;
            flips += !same_experts(pre.sel + at * tok.K, tok.sel + at * tok.K, tok.K);
        }
    for (int t = 0; t < n; t++) { // the token path's least margin of each position, for the report
        margin[t] = INFINITY;
        for (int i = 0; i < c->num_hidden_layers; i++)
            if (sd_config_is_moe(c, i) && tok.margin[(size_t)i * tok.n + t] < margin[t]) margin[t] = tok.margin[(size_t)i * tok.n + t];
    }
    report_rows(got, forced, margin, n, V, 2e-2, what);
    cr_log_info("%s: against the token path as it routes itself (%d entries otherwise): relative error %.3g", what, flips,
                gpu_rel_err(got, ref, (size_t)n * V));
    CHECK_REL(got, forced, (size_t)n * V, 2e-2, "%s: every position's logits (the token path routed as the prefill)", what);
    expect_greedy_where_clear(got, forced, n, V, what);
    check_route_flips(c, &pre, &own, forced_taps.margin, n, what);

    // The state it leaves against the teacher-forced one: the live KDA slot and conv rows, the MLA cache rows.
    for (int i = 0; i < c->num_hidden_layers; i++) {
        if (c->mixer[i] == SD_MIXER_KDA) {
            const size_t nS = (size_t)c->kda_num_heads * c->kda_head_dim * c->kda_head_dim;
            float *a = read_back(sd_state_kda_S(&pre_s, i, n), nS);
            CHECK_REL(a, sd_state_kda_S(&cpu_s, i, n), nS, 2e-2, "%s: layer %d KDA state", what, i);
            const int P = sd_config_kda_dim(c), W = c->short_conv_kernel_size;
            for (int pos = n - (W - 1); pos < n; pos++) {
                const float *row_a = pre_s.kda[i].conv + (size_t)sd_state_conv_row(&pre_s, pos) * 3 * P;
                const float *row_r = cpu_s.kda[i].conv + (size_t)sd_state_conv_row(&cpu_s, pos) * 3 * P;
                float *ca = read_back(row_a, 3 * (size_t)P);
                CHECK_REL(ca, row_r, 3 * (size_t)P, 2e-2, "%s: layer %d conv row of position %d", what, i, pos);
                free(ca);
            }
            free(a);
        } else {
            const size_t nc = (size_t)n * c->kv_lora_rank;
            float *a = read_back(pre_s.mla[i].c, nc);
            CHECK_REL(a, cpu_s.mla[i].c, nc, 2e-2, "%s: layer %d MLA latent cache", what, i);
            free(a);
        }
    }
    // The next decode step continues from it (the CPU routed as the device's step routed).
    OK(sd_forward(&dev, &pre_s, tokens + n, 1, got + (size_t)n * V, 0, &(sd_forward_opts){.on_route = record_route, .route_ctx = &pre},
                  &st_));
    OK(sd_forward(&host, &cpu_s, tokens + n, 1, forced + (size_t)n * V, 0, &force_opts, &st_));
    CHECK_REL(got + (size_t)n * V, forced + (size_t)n * V, V, 2e-2, "%s: the decode step after the prompt", what);
    expect_greedy_where_clear(got + (size_t)n * V, forced + (size_t)n * V, 1, V, what);
    free(tokens); free(ref); free(got); free(plain); free(forced); free(margin);
    routes_free(&tok);
    routes_free(&pre);
    routes_free(&own);
    routes_free(&forced_taps);
    sd_state_free(&tok_s);
    sd_state_free(&pre_s);
    sd_state_free(&plain_s);
    sd_state_free(&cpu_s);
    sd_model_free(&dev);
    sd_model_free(&host);
}

Test(cuda_prefill, tiny_f32_pieces) { check_model("configs/tiny.json", 0, 150, 64); }
Test(cuda_prefill, tiny_bf16_pieces) { check_model("configs/tiny.json", 1, 300, 64); }
Test(cuda_prefill, tiny_bf16_one_piece) { check_model("configs/tiny.json", 1, 100, SD_CUDA_PREFILL_CHUNK); }
Test(cuda_prefill, toy_bf16_pieces, .timeout = 300) { check_model("configs/toy.json", 1, 300, 128); }
Test(cuda_prefill, toy_bf16_one_piece, .timeout = 300) { check_model("configs/toy.json", 1, 200, SD_CUDA_PREFILL_CHUNK); }

// Spec ≡ greedy after a fast prefill: both runs prefill the same prompt the same way.
Test(cuda_prefill, speculative_equals_plain_after_prefill, .timeout = 300) {
    need_gpu();
    enum { N_PROMPT = 81, N_NEW = 40 };
    sd_config cfg, dcfg;
    load_config("configs/toy.json", &cfg);
    OK(sd_draft_config(&cfg, 2, &dcfg, &st_));
    const sd_synth_opts o = {.seed = 21, .dtype = SD_DT_BF16, .tail_from = 2, .tail_scale = 0.1f, .depth = cfg.num_hidden_layers};
    sd_model ht, hd, t, d;
    OK(sd_synth_model(&ht, &cfg, &o, &st_));
    OK(sd_synth_model(&hd, &dcfg, &o, &st_));
    OK(sd_cuda_model_upload(&ht, &t, &st_));
    OK(sd_cuda_model_upload(&hd, &d, &st_));
    sd_model_free(&ht);
    sd_model_free(&hd);
    int prompt[N_PROMPT], want[N_NEW], got[N_NEW];
    random_tokens(4, cfg.vocab_size, N_PROMPT, prompt);
    sd_state s;
    OK(sd_model_state_init(&t, &s, N_PROMPT + N_NEW, 16, &st_));
    OK(sd_decode(&t, &s, prompt, N_PROMPT, N_NEW, 0.0f, 0, NULL, want, &st_));
    sd_state_free(&s);
    for (int k = 1; k <= 8; k += 3) {
        sd_state ts, ds;
        OK(sd_model_state_init(&t, &ts, N_PROMPT + N_NEW + k + 1, k + 1, &st_));
        OK(sd_model_state_init(&d, &ds, N_PROMPT + N_NEW + k + 1, k, &st_));
        const sd_spec_opts so = {.k = k};
        sd_accept_stats stats = {0};
        OK(sd_spec_generate(&t, &ts, &d, &ds, prompt, N_PROMPT, N_NEW, &so, got, &stats, &st_));
        for (int i = 0; i < N_NEW; i++) cr_assert_eq(got[i], want[i], "k=%d: token %d is %d, plain gave %d", k, i, got[i], want[i]);
        sd_state_free(&ts);
        sd_state_free(&ds);
    }
    sd_model_free(&t);
    sd_model_free(&d);
}

// Refused requests leave the state as it was: pending positions, a full context, a bad token.
Test(cuda_prefill, refusals_leave_the_state) {
    need_gpu();
    sd_model host, dev;
    synth_from("configs/tiny.json", 7, 1, SD_MAX_LAYERS, 1.0f, &host);
    OK(sd_cuda_model_upload(&host, &dev, &st_));
    int tokens[64];
    random_tokens(3, host.cfg.vocab_size, 64, tokens);
    sd_state s;
    OK(sd_model_state_init(&dev, &s, 60, 4, &st_));
    sd_status st = {0};
    OK(sd_forward(&dev, &s, tokens, 2, NULL, 0, NULL, &st_));
    cr_assert_eq(sd_cuda_prefill(&dev, &s, tokens, 40, NULL, false, NULL, &st), SD_ERR_USAGE, "pending positions must be refused");
    cr_assert(strstr(st.msg, "pending"), "%s", st.msg);
    cr_assert(s.len == 0 && s.pending == 2);
    OK(sd_state_commit(&s, 2, &st_));
    cr_assert_eq(sd_prefill(&dev, &s, tokens, 64, NULL, &st), SD_ERR_FULL, "a context overflow must be refused");
    cr_assert_eq(s.len, 2);
    tokens[39] = host.cfg.vocab_size;
    cr_assert_eq(sd_prefill(&dev, &s, tokens, 40, NULL, &st), SD_ERR_DATA, "a token outside the vocabulary must be refused");
    cr_assert(strstr(st.msg, "vocabulary"), "%s", st.msg);
    cr_assert_eq(s.len, 2);
    // The route override is the CPU reference's alone: a device forward refuses it, state kept.
    routes none = routes_new(&host.cfg, 60), own = routes_new(&host.cfg, 60);
    forcing f = {.pre = &none, .own = &own};
    const sd_forward_opts force_opts = {.override_route = force_route, .override_ctx = &f};
    cr_assert_eq(sd_forward(&dev, &s, tokens, 2, NULL, 0, &force_opts, &st), SD_ERR_UNSUPPORTED);
    cr_assert(strstr(st.msg, "route override"), "%s", st.msg);
    cr_assert(s.len == 2 && s.pending == 0);
    routes_free(&none);
    routes_free(&own);
    sd_state_free(&s);
    sd_model_free(&dev);
    sd_model_free(&host);
}
#endif
