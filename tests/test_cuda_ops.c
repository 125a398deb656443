// test_cuda_ops.c — every launcher of kernels/*.h against the CPU reference, as ONE table of cases
// run by one loop (ggml's test-backend-ops habit). A case names the launchers it checks (.op:
// test_op_coverage fails when an exported launcher has no case, or a case names one that no
// header declares), its shape, its weights' dtype and its tolerance against the CPU — an NMSE
// bound (NaN/Inf fails) or TOL_BITWISE. Its run function draws fresh random inputs, computes the
// CPU reference (an engine CPU op, or a plain-C twin of MODEL.md where the engine's op is not
// separable), runs the launchers on guarded device buffers (sentinels either side, checked when
// each buffer is released), compares, and checks the exactness laws bit for bit: a token alone ≡
// inside a T-token call (verify ≡ decode), one launch ≡ the launches it fuses, both MoE arms
// equal. The prefill's kernels, never bitwise the token path, check their own laws bit for bit
// instead: two pieces ≡ one call, in place ≡ out of place, a call repeated ≡ itself. Then the
// sublayers and whole models against the CPU. Without a device (or without the CUDA build) every
// test reports itself skipped — never passed.
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <string.h>
#include "common.h"

#if !SPECDEC_HAVE_CUDA
Test(cuda, suite) { cr_skip_test("CUDA backend not built (no toolkit or -DSPECDEC_CUDA=OFF): GPU suite skipped"); }
#else
#include "cuda_harness.h"
#include <cuda_runtime_api.h>
#include "accept.h"       // sd_accept_ref (CPU)
#include "acceptance.h"   // sd_cuda_accept
#include "cuda_backend.h" // sd_cuda_model_upload, sd_cuda_state_init, sd_cuda_backend_of
#include "cuda_layers.h"  // sd_cuda_kda_forward, sd_cuda_mla_forward, sd_cuda_moe_forward
#include "cuda_scratch.h" // sd_cuda_scratch_of
#include "cursor.h"       // sd_cuda_cursor_set/_advance/_commit, sd_pos_fixed, sd_pos_cursor
#include "gemm.h"         // sd_gemm_*, sd_cuda_to_bf16
#include "kda.h"          // sd_cuda_kda_conv, sd_cuda_kda_scan, sd_cuda_kda_out
#include "layers.h"       // the CPU sublayers, sd_ffn_forward, sd_moe_route
#include "kda_scan.h"     // sd_kda_step, sd_kda_chunk_head
#include "kda_prefill.h"  // sd_cuda_kda_prefill_conv, _ring, _out, sd_cuda_kda_chunk
#include "linear.h"       // sd_cuda_linear, sd_cuda_linear_multi, sd_cuda_linear_multi_norm
#include "mla.h"          // sd_cuda_mla_attend, SD_MLA_SPLIT
#include "mla_prefill.h"  // sd_cuda_mla_prefill_cache, _pack_keys, _pack_queries, _flash
#include "moe_experts.h"  // sd_cuda_moe_up, sd_cuda_moe_down
#include "moe_prefill.h"  // sd_cuda_moe_prefill_*, sd_cuda_gather_rows, sd_cuda_swiglu_rows
#include "moe_route.h"    // sd_cuda_moe_select, sd_cuda_moe_route_select, the grouping
#include "ops.h"          // sd_linear, sd_rmsnorm, sd_dot_f32, sd_mat_row_f32, activations (CPU)
#include "philox.h"       // sd_uniform
#include "round.h"        // sd_cuda_round_publish
#include "rows.h"         // sd_cuda_embed, sd_cuda_rmsnorm
#include "sample.h"       // sd_argmax, sd_softmax, sd_sample (CPU)
#include "sampling.h"     // sd_cuda_argmax, sd_cuda_softmax, sd_cuda_sample_rows
#include "synth_fill.h"   // sd_cuda_synth_fill

// ---------------------------------------------------------------------------- Linear
// shape: rows, cols, T. y vs sd_linear; each token alone gives the bits it has inside the T-token
// call (verify ≡ decode).
static void run_linear(const op_case *c) {
    const int rows = c->shape[0], cols = c->shape[1], T = c->shape[2];
    tmat w = tmat_rand(rows, cols, c->dt, seed_of(0));
    float *x = rand_host((size_t)T * cols, seed_of(1), 1.0f), *ref = xmalloc(sizeof(float) * T * rows);
    sd_linear(&w.host, x, T, ref);
    gbuf dx = gbuf_of(x, (size_t)T * cols), dy = gbuf_new((size_t)T * rows), d1 = gbuf_new(rows);
    OK(sd_cuda_linear(&w.dev, dx.p, T, dy.p, 0, &st_));
    float *got = gbuf_read(&dy, (size_t)T * rows);
    compare(c, "y", got, ref, (size_t)T * rows);
    for (int t = 0; t < T; t++) {
        OK(sd_cuda_linear(&w.dev, dx.p + (size_t)t * cols, 1, d1.p, 0, &st_));
        float *one = gbuf_read(&d1, rows);
        same_bits(fmt("token %d alone vs inside the call", t), one, got + (size_t)t * rows, rows);
        free(one);
    }
    gbuf_done(&dx, "x");
    gbuf_done(&dy, "y");
    gbuf_done(&d1, "y of one token");
    free(x); free(ref); free(got);
    tmat_free(&w);
}

// shape: T, D (cols), r0 (STORE rows), r1 (ADD rows), I (SwiGLU rows), extra (more STORE jobs, up
// to MULTI_EXTRA), strided (the ADD job reads x with row stride D + 3 — unaligned rows — and adds
// into y with row stride r1 + 5). All jobs in ONE sd_cuda_linear_multi call; each vs the CPU, and
// bitwise: a STORE job ≡ sd_cuda_linear of its matrix alone, the ADD job ≡ y + that, its padding
// untouched.
#define MULTI_EXTRA 6
static void run_linear_multi(const op_case *c) {
    const int T = c->shape[0], D = c->shape[1], extra = c->shape[5], nj = 3 + extra;
    const int r1 = c->shape[3], I = c->shape[4], ldx = c->shape[6] ? D + 3 : D, ldy = c->shape[6] ? r1 + 5 : r1;
    cr_assert(extra <= MULTI_EXTRA);
    int rows[3 + MULTI_EXTRA] = {c->shape[2], r1, I};
    for (int e = 0; e < extra; e++) rows[3 + e] = 8 + 13 * e;
    tmat w[3 + MULTI_EXTRA]; // [0] STORE, [1] ADD, [2] the SwiGLU gate (up: its up), [3..] STORE
    for (int j = 0; j < nj; j++) w[j] = tmat_rand(rows[j], D, c->dt, seed_of(j));
    tmat up = tmat_rand(I, D, c->dt, seed_of(20));
    float *x = rand_host((size_t)T * D, seed_of(21), 1.0f), *xs = rand_host((size_t)T * ldx, seed_of(22), 1.0f);
    for (int t = 0; t < T; t++) memcpy(xs + (size_t)t * ldx, x + (size_t)t * D, sizeof(float) * D);
    float *y1 = rand_host((size_t)T * ldy, seed_of(23), 1.0f); // what the ADD job adds into
    gbuf dx = gbuf_of(x, (size_t)T * D), dxs = gbuf_of(xs, (size_t)T * ldx), dy[3 + MULTI_EXTRA];
    sd_lin_job jobs[3 + MULTI_EXTRA];
    for (int j = 0; j < nj; j++) {
        dy[j] = j == 1 ? gbuf_of(y1, (size_t)T * ldy) : gbuf_new((size_t)T * rows[j]);
        jobs[j] = (sd_lin_job){.w = &w[j].dev, .x = dx.p, .ldx = D, .y = dy[j].p, .ldy = rows[j], .mode = SD_LIN_STORE};
    }
    jobs[1] = (sd_lin_job){.w = &w[1].dev, .x = dxs.p, .ldx = ldx, .y = dy[1].p, .ldy = ldy, .mode = SD_LIN_ADD};
    jobs[2].w2 = &up.dev;
    jobs[2].mode = SD_LIN_SWIGLU;
    OK(sd_cuda_linear_multi(jobs, nj, T, 0, &st_));
    for (int j = 0; j < nj; j++) {
        const size_t n = j == 1 ? (size_t)T * ldy : (size_t)T * rows[j], nl = (size_t)T * rows[j];
        float *got = gbuf_read(&dy[j], n), *ref = xmalloc(sizeof(float) * nl), *ref_up = NULL;
        sd_linear(&w[j].host, x, T, ref);
        gbuf alone = gbuf_new(nl);
        OK(sd_cuda_linear(&w[j].dev, dx.p, T, alone.p, 0, &st_));
        float *lin = gbuf_read(&alone, nl);
        if (j == 1) { // y + W·x: against the CPU, and bitwise against y + the Linear alone
            float *want = copy_floats(y1, n), *sum = copy_floats(y1, n);
            for (int t = 0; t < T; t++)
                for (int o = 0; o < r1; o++) {
                    want[(size_t)t * ldy + o] += ref[(size_t)t * r1 + o];
                    sum[(size_t)t * ldy + o] += lin[(size_t)t * r1 + o];
                }
            compare(c, "ADD job", got, want, n);
            same_bits("ADD job vs y + the Linear alone (padding untouched)", got, sum, n);
            free(want); free(sum);
        } else if (j == 2) { // silu(gate·x) · (up·x)
            ref_up = xmalloc(sizeof(float) * nl);
            sd_linear(&up.host, x, T, ref_up);
            for (size_t i = 0; i < nl; i++) ref[i] = sd_silu(ref[i]) * ref_up[i];
            compare(c, "SwiGLU job", got, ref, n);
        } else {
            compare(c, fmt("STORE job %d", j), got, ref, n);
            same_bits(fmt("STORE job %d vs its Linear alone", j), got, lin, n);
        }
        gbuf_done(&alone, "the Linear alone");
        gbuf_done(&dy[j], "job output");
        free(got); free(ref); free(ref_up); free(lin);
    }
    gbuf_done(&dx, "x");
    gbuf_done(&dxs, "strided x");
    for (int j = 0; j < nj; j++) tmat_free(&w[j]);
    tmat_free(&up);
    free(x); free(xs); free(y1);
}

// shape: T, n, r0 (STORE rows from the normed rows), I (SwiGLU rows from them), r1 (ADD rows from
// the raw x). sd_cuda_linear_multi_norm bitwise vs sd_cuda_rmsnorm then sd_cuda_linear_multi (the
// contract: fused at T <= 2 when n % 4 == 0, else the two launches), normed rows included; both
// against the CPU.
static void run_linear_multi_norm(const op_case *c) {
    const int T = c->shape[0], n = c->shape[1], r0 = c->shape[2], I = c->shape[3], r1 = c->shape[4];
    const float eps = 1e-5f;
    tmat w0 = tmat_rand(r0, n, c->dt, seed_of(0)), g = tmat_rand(I, n, c->dt, seed_of(1));
    tmat u = tmat_rand(I, n, c->dt, seed_of(2)), w1 = tmat_rand(r1, n, c->dt, seed_of(3));
    float *x = rand_host((size_t)T * n, seed_of(4), 2.0f), *nw = rand_in(n, seed_of(5), 0.5f, 1.5f);
    float *y1 = rand_host((size_t)T * r1, seed_of(6), 1.0f);
    gbuf dx = gbuf_of(x, (size_t)T * n), dnw = gbuf_of(nw, n);
    const size_t len[4] = {(size_t)T * n, (size_t)T * r0, (size_t)T * I, (size_t)T * r1};
    static const char *what[4] = {"normed rows", "STORE job", "SwiGLU job", "ADD job"};
    float *got[2][4]; // [two launches, fused] × what
    for (int fused = 0; fused < 2; fused++) {
        gbuf o[4] = {gbuf_new(len[0]), gbuf_new(len[1]), gbuf_new(len[2]), gbuf_of(y1, len[3])};
        const sd_lin_norm norm = {.x = dx.p, .w = dnw.p, .eps = eps, .n = n, .out = o[0].p};
        const sd_lin_job jobs[3] = {
            {.w = &w0.dev, .x = o[0].p, .ldx = n, .y = o[1].p, .ldy = r0, .mode = SD_LIN_STORE},
            {.w = &g.dev, .w2 = &u.dev, .x = o[0].p, .ldx = n, .y = o[2].p, .ldy = I, .mode = SD_LIN_SWIGLU},
            {.w = &w1.dev, .x = dx.p, .ldx = n, .y = o[3].p, .ldy = r1, .mode = SD_LIN_ADD},
        };
        if (fused) {
            OK(sd_cuda_linear_multi_norm(jobs, 3, T, &norm, 0, &st_));
        } else {
            OK(sd_cuda_rmsnorm(dx.p, dnw.p, T, n, eps, o[0].p, 0, &st_));
            OK(sd_cuda_linear_multi(jobs, 3, T, 0, &st_));
        }
        for (int i = 0; i < 4; i++) {
            got[fused][i] = gbuf_read(&o[i], len[i]);
            gbuf_done(&o[i], what[i]);
        }
    }
    for (int i = 0; i < 4; i++) compare(c, fmt("%s: fused vs rmsnorm then linear_multi", what[i]), got[1][i], got[0][i], len[i]);
    float *a = xmalloc(sizeof(float) * len[0]), *ref[4] = {a, xmalloc(sizeof(float) * len[1]), xmalloc(sizeof(float) * len[2]),
                                                          xmalloc(sizeof(float) * len[3])};
    float *hu = xmalloc(sizeof(float) * len[2]);
    for (int t = 0; t < T; t++) sd_rmsnorm(x + (size_t)t * n, nw, n, eps, a + (size_t)t * n);
    sd_linear(&w0.host, a, T, ref[1]);
    sd_linear(&g.host, a, T, ref[2]);
    sd_linear(&u.host, a, T, hu);
    for (size_t i = 0; i < len[2]; i++) ref[2][i] = sd_silu(ref[2][i]) * hu[i];
    sd_linear(&w1.host, x, T, ref[3]);
    for (size_t i = 0; i < len[3]; i++) ref[3][i] += y1[i];
    for (int i = 0; i < 4; i++) check_close(i ? TOL_DOT : TOL_ELEM, fmt("%s vs the CPU", what[i]), got[1][i], ref[i], len[i]);
    for (int i = 0; i < 4; i++) { free(got[0][i]); free(got[1][i]); free(ref[i]); }
    gbuf_done(&dx, "x");
    gbuf_done(&dnw, "norm weight");
    tmat_free(&w0); tmat_free(&g); tmat_free(&u); tmat_free(&w1);
    free(x); free(nw); free(y1); free(hu);
}

// ---------------------------------------------------------------------------- rows
// shape: rows, n, in place (out aliases x). vs sd_rmsnorm per row.
static void run_rmsnorm(const op_case *c) {
    const int rows = c->shape[0], n = c->shape[1], inplace = c->shape[2];
    const size_t nx = (size_t)rows * n;
    float *x = rand_host(nx, seed_of(0), 2.0f), *w = rand_host(n, seed_of(1), 1.0f), *ref = xmalloc(sizeof(float) * nx);
    for (int r = 0; r < rows; r++) sd_rmsnorm(x + (size_t)r * n, w, n, 1e-5f, ref + (size_t)r * n);
    gbuf dx = gbuf_of(x, nx), dw = gbuf_of(w, n), dy = inplace ? dx : gbuf_new(nx);
    OK(sd_cuda_rmsnorm(dx.p, dw.p, rows, n, 1e-5f, dy.p, 0, &st_));
    float *got = gbuf_read(&dy, nx);
    compare(c, "out", got, ref, nx);
    if (!inplace) gbuf_done(&dy, "out");
    gbuf_done(&dx, "x");
    gbuf_done(&dw, "w");
    free(x); free(w); free(ref); free(got);
}

// shape: V, D, T, pinned (the token ids in pinned host memory, as the forward passes them, instead
// of device memory). Rows widened exactly: bitwise vs sd_mat_row_f32.
static void run_embed(const op_case *c) {
    const int V = c->shape[0], D = c->shape[1], T = c->shape[2], pinned = c->shape[3];
    tmat e = tmat_rand(V, D, c->dt, seed_of(0));
    int *tok = xmalloc(sizeof(int) * T);
    uint64_t r = seed_of(1);
    for (int t = 0; t < T; t++) tok[t] = rng_int(&r, V);
    tok[0] = V - 1; // the last row, the first, and a repeat
    if (T > 2) tok[2] = 0;
    if (T > 3) tok[3] = tok[1];
    int *ids = NULL;
    gbuf dtok = {0};
    if (pinned) {
        CU(cudaMallocHost((void **)&ids, sizeof(int) * T));
        memcpy(ids, tok, sizeof(int) * T);
    } else {
        dtok = gbuf_of(tok, T);
        ids = IP(dtok);
    }
    gbuf dx = gbuf_new((size_t)T * D);
    OK(sd_cuda_embed(&e.dev, ids, T, dx.p, 0, &st_));
    CU(cudaDeviceSynchronize()); // the kernel has read the pinned ids
    float *got = gbuf_read(&dx, (size_t)T * D), *ref = xmalloc(sizeof(float) * T * D);
    for (int t = 0; t < T; t++) sd_mat_row_f32(&e.host, tok[t], ref + (size_t)t * D);
    compare(c, "rows", got, ref, (size_t)T * D);
    if (pinned) CU(cudaFreeHost(ids));
    else gbuf_done(&dtok, "tokens");
    gbuf_done(&dx, "x");
    tmat_free(&e);
    free(tok); free(got); free(ref);
}

// ---------------------------------------------------------------------------- cursor
static void cursor_expect(const gbuf *cur, int len, int pending, const char *after) {
    int got[2], want[2] = {len, pending};
    gbuf_get(cur, got, 2);
    same_bits(fmt("cursor {len, pending} after %s", after), got, want, 2);
}

// No shape: set, then advances of random sizes with a commit of a device count (plus 0 or 1, the
// bonus) after every second one, then set again; every value exact.
static void run_cursor(const op_case *c) {
    (void)c;
    uint64_t r = seed_of(0);
    gbuf cur = gbuf_new(2), n = gbuf_new(1);
    int len = 1 + rng_int(&r, 5000), pending = rng_int(&r, 9);
    OK(sd_cuda_cursor_set(IP(cur), len, pending, 0, &st_));
    cursor_expect(&cur, len, pending, "set");
    for (int step = 0; step < 6; step++) {
        const int T = 1 + rng_int(&r, 9);
        OK(sd_cuda_cursor_advance(IP(cur), T, 0, &st_));
        pending += T;
        cursor_expect(&cur, len, pending, fmt("advance %d", T));
        if (step % 2) {
            const int kept = rng_int(&r, pending + 1), plus = step % 4 == 1;
            gbuf_put(&n, &kept, 1);
            OK(sd_cuda_cursor_commit(IP(cur), IP(n), plus, 0, &st_));
            len += kept + plus;
            pending = 0;
            cursor_expect(&cur, len, pending, fmt("commit %d + %d", kept, plus));
        }
    }
    OK(sd_cuda_cursor_set(IP(cur), 0, 0, 0, &st_));
    cursor_expect(&cur, 0, 0, "set 0");
    gbuf_done(&cur, "cursor");
    gbuf_done(&n, "count");
}

// ---------------------------------------------------------------------------- KDA
// One conv call's inputs (host), shared by the T-token call, the one-token chain and the twin.
typedef struct {
    int H, d, W, T, pos0, n_rows;
    float *ring, *q, *k, *v, *tq, *tk, *tv, *fa, *ga; // ring (n_rows, 3P); q, k, v (T, P); taps (P, W); fa, ga (T, d)
    tmat fb, gbw;                                     // f_b, g_b (P, d)
} conv_in;
typedef struct { float *ring, *qc, *kc, *vc, *gate, *gb; } conv_out;

// The CPU twin of the conv (MODEL.md "KDA"; engine/cpu/kda.c conv_token and l2norm_heads, which
// are not separable from sd_kda_forward): for the token at pos and channel ch,
// acc = Σ_j taps[ch][j]·in(pos − (W−1) + j), j increasing, positions below 0 skipped, this call's
// positions (>= pos0) from q/k/v and earlier ones from ring row p % n_rows; out = silu(acc); then
// per head q, k ← x / sqrt(Σx² + 1e-6) with Σx² = sd_dot_f32.
static void conv_twin(const conv_in *in, float *qc, float *kc, float *vc) {
    const int H = in->H, d = in->d, W = in->W, P = H * d;
    const float *fresh[3] = {in->q, in->k, in->v}, *taps[3] = {in->tq, in->tk, in->tv};
    float *out[3] = {qc, kc, vc};
    for (int t = 0; t < in->T; t++) {
        const int pos = in->pos0 + t;
        for (int which = 0; which < 3; which++) {
            float *o = out[which] + (size_t)t * P;
            for (int ch = 0; ch < P; ch++) {
                float acc = 0.0f;
                for (int j = 0; j < W; j++) {
                    const int p = pos - (W - 1) + j;
                    if (p < 0) continue;
                    const float xv = p >= in->pos0 ? fresh[which][(size_t)(p - in->pos0) * P + ch]
                                                   : in->ring[(size_t)(p % in->n_rows) * 3 * P + (size_t)which * P + ch];
                    acc += taps[which][(size_t)ch * W + j] * xv;
                }
                o[ch] = sd_silu(acc);
            }
            if (which < 2) unit_heads(o, 1, H, d);
        }
    }
}

// shape[5] settled, shape[6] the position from a device cursor (advanced after each call).
// per_token: T calls of one token (the ring rows of the earlier ones are this chain's writes).
static conv_out conv_on_device(const op_case *c, const conv_in *in, bool per_token) {
    const int H = in->H, d = in->d, W = in->W, T = in->T, P = H * d, settled = c->shape[5], via_cursor = c->shape[6];
    const size_t nY = (size_t)T * P, nr = (size_t)in->n_rows * 3 * P;
    gbuf ring = gbuf_of(in->ring, nr), q = gbuf_of(in->q, nY), k = gbuf_of(in->k, nY), v = gbuf_of(in->v, nY);
    gbuf tq = gbuf_of(in->tq, (size_t)P * W), tk = gbuf_of(in->tk, (size_t)P * W), tv = gbuf_of(in->tv, (size_t)P * W);
    gbuf fa = gbuf_of(in->fa, (size_t)T * d), ga = gbuf_of(in->ga, (size_t)T * d), cur = cursor_at(in->pos0);
    gbuf qc = gbuf_new(nY), kc = gbuf_new(nY), vc = gbuf_new(nY), gate = gbuf_new(nY), gb = gbuf_new(nY);
    CU(cudaDeviceSynchronize());
    const int n = per_token ? 1 : T;
    for (int s = 0; s * n < T; s++) {
        const size_t oY = (size_t)s * P, oA = (size_t)s * d;
        const sd_dev_pos pos = via_cursor ? sd_pos_cursor(IP(cur)) : sd_pos_fixed(in->pos0 + s);
        OK(sd_cuda_kda_conv(ring.p, in->n_rows, q.p + oY, k.p + oY, v.p + oY, tq.p, tk.p, tv.p, n, H, d, W, pos, settled,
                            &in->fb.dev, fa.p + oA, gate.p + oY, &in->gbw.dev, ga.p + oA, gb.p + oY, qc.p + oY, kc.p + oY,
                            vc.p + oY, 0, &st_));
        if (via_cursor) OK(sd_cuda_cursor_advance(IP(cur), n, 0, &st_));
        if (settled) CU(cudaDeviceSynchronize()); // kda.h: the next call's ring rows and cursor precede it
    }
    if (via_cursor) cursor_expect(&cur, in->pos0 >= 2 ? in->pos0 - 2 : in->pos0, (in->pos0 >= 2 ? 2 : 0) + T, "the conv calls");
    conv_out o = {gbuf_read(&ring, nr), gbuf_read(&qc, nY), gbuf_read(&kc, nY), gbuf_read(&vc, nY), gbuf_read(&gate, nY),
                  gbuf_read(&gb, nY)};
    gbuf *all[] = {&ring, &q, &k, &v, &tq, &tk, &tv, &fa, &ga, &cur, &qc, &kc, &vc, &gate, &gb};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) gbuf_done(all[i], "conv buffer");
    return o;
}
static void conv_out_free(conv_out *o) { free(o->ring); free(o->qc); free(o->kc); free(o->vc); free(o->gate); free(o->gb); }

// shape: H, d, W, T, pos0, settled, cursor, slack (ring rows beyond the T + W − 1 a call needs).
// The ring bitwise (the raw inputs at their positions, every other row untouched); qc, kc, vc vs
// the twin; gate, gb vs sd_linear (TOL_DOT); T one-token calls ≡ the T-token call, bitwise.
static void run_kda_conv(const op_case *c) {
    conv_in in = {.H = c->shape[0], .d = c->shape[1], .W = c->shape[2], .T = c->shape[3], .pos0 = c->shape[4]};
    in.n_rows = in.T + in.W - 1 + c->shape[7];
    const int P = in.H * in.d, T = in.T;
    const size_t nY = (size_t)T * P, nr = (size_t)in.n_rows * 3 * P;
    in.ring = rand_host(nr, seed_of(0), 1.0f);
    in.q = rand_host(nY, seed_of(1), 1.0f);
    in.k = rand_host(nY, seed_of(2), 1.0f);
    in.v = rand_host(nY, seed_of(3), 1.0f);
    in.tq = rand_host((size_t)P * in.W, seed_of(4), 1.0f / sqrtf((float)in.W));
    in.tk = rand_host((size_t)P * in.W, seed_of(5), 1.0f / sqrtf((float)in.W));
    in.tv = rand_host((size_t)P * in.W, seed_of(6), 1.0f / sqrtf((float)in.W));
    in.fa = rand_host((size_t)T * in.d, seed_of(7), 1.0f);
    in.ga = rand_host((size_t)T * in.d, seed_of(8), 1.0f);
    in.fb = tmat_rand(P, in.d, c->dt, seed_of(9));
    in.gbw = tmat_rand(P, in.d, c->dt, seed_of(10));
    conv_out ref = {copy_floats(in.ring, nr), xmalloc(sizeof(float) * nY), xmalloc(sizeof(float) * nY), xmalloc(sizeof(float) * nY),
                    xmalloc(sizeof(float) * nY), xmalloc(sizeof(float) * nY)};
    conv_twin(&in, ref.qc, ref.kc, ref.vc);
    for (int t = 0; t < T; t++) {
        float *row = ref.ring + (size_t)((in.pos0 + t) % in.n_rows) * 3 * P;
        memcpy(row, in.q + (size_t)t * P, sizeof(float) * P);
        memcpy(row + P, in.k + (size_t)t * P, sizeof(float) * P);
        memcpy(row + 2 * P, in.v + (size_t)t * P, sizeof(float) * P);
    }
    sd_linear(&in.fb.host, in.fa, T, ref.gate);
    sd_linear(&in.gbw.host, in.ga, T, ref.gb);
    conv_out all = conv_on_device(c, &in, false), one = conv_on_device(c, &in, true);
    same_bits("ring rows", all.ring, ref.ring, nr);
    compare(c, "qc", all.qc, ref.qc, nY);
    compare(c, "kc", all.kc, ref.kc, nY);
    compare(c, "vc", all.vc, ref.vc, nY);
    check_close(TOL_DOT, "gate = f_b·fa", all.gate, ref.gate, nY);
    check_close(TOL_DOT, "gb = g_b·ga", all.gb, ref.gb, nY);
    const float *a[6] = {all.ring, all.qc, all.kc, all.vc, all.gate, all.gb}, *b[6] = {one.ring, one.qc, one.kc, one.vc, one.gate, one.gb};
    static const char *what[6] = {"ring", "qc", "kc", "vc", "gate", "gb"};
    for (int i = 0; i < 6; i++) same_bits(fmt("%s: one token at a time vs the T-token call", what[i]), b[i], a[i], i ? nY : nr);
    conv_out_free(&ref); conv_out_free(&all); conv_out_free(&one);
    free(in.ring); free(in.q); free(in.k); free(in.v); free(in.tq); free(in.tk); free(in.tv); free(in.fa); free(in.ga);
    tmat_free(&in.fb); tmat_free(&in.gbw);
}

// One scan call's inputs (host).
typedef struct {
    int H, d, T, n0, n_slots;
    float *S;                         // (n_slots, H, d, d)
    float *qc, *kc, *vc, *gate, *beta; // (T, P) ×4, (T, H)
    float *A_log, *dt_bias;           // (H), (P): the gates are raw projections; both NULL: final gates
} scan_in;
typedef struct { float *S, *y; } scan_out;

// The CPU reference of the recurrence: engine/cpu/kda.c's gates (MODEL.md "KDA": when raw,
// g = −exp(A_log[h])·softplus(gate + dt_bias) and β = sigmoid(beta); else as given) and
// sd_kda_step, per head and token, from slot n0+t into slot n0+t+1.
static void scan_ref(const scan_in *in, float *S, float *y) {
    const int H = in->H, d = in->d, P = H * d;
    const size_t per_slot = (size_t)P * d, head = (size_t)d * d;
    float g[256];
    cr_assert(d <= 256);
    for (int h = 0; h < H; h++)
        for (int t = 0; t < in->T; t++) {
            const size_t o = (size_t)t * P + (size_t)h * d;
            for (int i = 0; i < d; i++)
                g[i] = in->A_log ? -expf(in->A_log[h]) * sd_softplus(in->gate[o + i] + in->dt_bias[(size_t)h * d + i])
                                 : in->gate[o + i];
            const float beta = in->A_log ? sd_sigmoid(in->beta[(size_t)t * H + h]) : in->beta[(size_t)t * H + h];
            sd_kda_step(S + (size_t)((in->n0 + t) % in->n_slots) * per_slot + h * head,
                        S + (size_t)((in->n0 + t + 1) % in->n_slots) * per_slot + h * head, in->qc + o, in->kc + o, in->vc + o,
                        g, beta, d, y + o);
        }
}

// shape[5] settled, shape[6] the position from a device cursor; per_token: T calls of one token.
static scan_out scan_on_device(const op_case *c, const scan_in *in, bool per_token) {
    const int H = in->H, d = in->d, T = in->T, P = H * d, settled = c->shape[5], via_cursor = c->shape[6];
    const size_t nS = (size_t)in->n_slots * P * d, nY = (size_t)T * P;
    gbuf S = gbuf_of(in->S, nS), qc = gbuf_of(in->qc, nY), kc = gbuf_of(in->kc, nY), vc = gbuf_of(in->vc, nY);
    gbuf gate = gbuf_of(in->gate, nY), beta = gbuf_of(in->beta, (size_t)T * H), y = gbuf_new(nY), cur = cursor_at(in->n0);
    gbuf al = gbuf_new(H), db = gbuf_new(P);
    if (in->A_log) {
        gbuf_put(&al, in->A_log, H);
        gbuf_put(&db, in->dt_bias, P);
    }
    CU(cudaDeviceSynchronize());
    const int n = per_token ? 1 : T;
    for (int s = 0; s * n < T; s++) {
        const size_t oY = (size_t)s * P;
        const sd_dev_pos pos = via_cursor ? sd_pos_cursor(IP(cur)) : sd_pos_fixed(in->n0 + s);
        OK(sd_cuda_kda_scan(S.p, in->n_slots, pos, n, H, d, qc.p + oY, kc.p + oY, vc.p + oY, gate.p + oY, beta.p + (size_t)s * H,
                            in->A_log ? al.p : NULL, in->A_log ? db.p : NULL, y.p + oY, settled, 0, &st_));
        if (via_cursor) OK(sd_cuda_cursor_advance(IP(cur), n, 0, &st_));
        if (settled) CU(cudaDeviceSynchronize()); // kda.h: the next call's slot and cursor precede it
    }
    scan_out o = {gbuf_read(&S, nS), gbuf_read(&y, nY)};
    gbuf *all[] = {&S, &qc, &kc, &vc, &gate, &beta, &y, &cur, &al, &db};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) gbuf_done(all[i], "scan buffer");
    return o;
}

// shape: H, d, T, n0, raw (the gates from raw projections with A_log and dt_bias; 0: final gates),
// settled, cursor, slack (state slots beyond T + 1). y and every written slot vs the reference, every
// other slot untouched; T one-token calls ≡ the T-token call, bitwise.
static void run_kda_scan(const op_case *c) {
    scan_in in = {.H = c->shape[0], .d = c->shape[1], .T = c->shape[2], .n0 = c->shape[3]};
    in.n_slots = in.T + 1 + c->shape[7];
    const int H = in.H, d = in.d, T = in.T, P = H * d, raw = c->shape[4];
    const size_t per_slot = (size_t)P * d, nS = (size_t)in.n_slots * per_slot, nY = (size_t)T * P;
    in.S = rand_host(nS, seed_of(0), 0.1f);
    in.qc = rand_host(nY, seed_of(1), 1.0f);
    in.kc = rand_host(nY, seed_of(2), 1.0f);
    unit_heads(in.qc, T, H, d);
    unit_heads(in.kc, T, H, d);
    in.vc = rand_host(nY, seed_of(3), 1.0f);
    if (raw) { // decays exp(g) in about [0.15, 0.98]
        in.gate = rand_host(nY, seed_of(4), 1.0f);
        in.beta = rand_host((size_t)T * H, seed_of(5), 2.0f);
        in.A_log = rand_in(H, seed_of(6), 0.0f, 1.0f);
        in.dt_bias = rand_in(P, seed_of(7), -3.0f, -1.0f);
    } else {
        in.gate = rand_in(nY, seed_of(4), -0.7f, -0.01f);
        in.beta = rand_in((size_t)T * H, seed_of(5), 0.05f, 0.95f);
    }
    float *S = copy_floats(in.S, nS), *y = xmalloc(sizeof(float) * nY);
    scan_ref(&in, S, y);
    scan_out all = scan_on_device(c, &in, false), one = scan_on_device(c, &in, true);
    compare(c, "y", all.y, y, nY);
    for (int slot = 0; slot < in.n_slots; slot++) {
        int t = 1;
        while (t <= T && (in.n0 + t) % in.n_slots != slot) t++;
        const size_t o = (size_t)slot * per_slot;
        if (t <= T) compare(c, fmt("state after n0 + %d tokens", t), all.S + o, S + o, per_slot);
        else same_bits(fmt("state slot %d (not written)", slot), all.S + o, in.S + o, per_slot);
    }
    same_bits("y: one token at a time vs the T-token call", one.y, all.y, nY);
    same_bits("state: one token at a time vs the T-token call", one.S, all.S, nS);
    free(S); free(y); free(all.S); free(all.y); free(one.S); free(one.y);
    free(in.S); free(in.qc); free(in.kc); free(in.vc); free(in.gate); free(in.beta); free(in.A_log); free(in.dt_bias);
}

// shape: T, H, d. In place y_h ← rmsnorm(y_h, o_norm) ⊙ sigmoid(gb_h), vs sd_rmsnorm and sd_sigmoid.
static void run_kda_out(const op_case *c) {
    const int T = c->shape[0], H = c->shape[1], d = c->shape[2], P = H * d;
    const size_t nY = (size_t)T * P;
    const float eps = 1e-5f;
    float *y = rand_host(nY, seed_of(0), 1.0f), *gb = rand_host(nY, seed_of(1), 2.0f), *w = rand_in(d, seed_of(2), 0.5f, 1.5f);
    float *ref = copy_floats(y, nY);
    for (size_t o = 0; o < nY; o += d) {
        sd_rmsnorm(ref + o, w, d, eps, ref + o);
        for (int j = 0; j < d; j++) ref[o + j] *= sd_sigmoid(gb[o + j]);
    }
    gbuf dy = gbuf_of(y, nY), dgb = gbuf_of(gb, nY), dw = gbuf_of(w, d);
    OK(sd_cuda_kda_out(dy.p, dgb.p, dw.p, eps, T, H, d, 0, &st_));
    float *got = gbuf_read(&dy, nY);
    compare(c, "y", got, ref, nY);
    gbuf_done(&dy, "y");
    gbuf_done(&dgb, "gb");
    gbuf_done(&dw, "o_norm");
    free(y); free(gb); free(w); free(ref); free(got);
}

// ---------------------------------------------------------------------------- MLA
// One attend call's inputs (host).
typedef struct {
    int Hm, dn, dr, dv, R, T, pos0, cap;
    bool rope;
    double theta;
    float eps;
    tmat kvb;                             // (Hm·(dn+dv), R)
    float *mq, *kv, *kv_norm, *c, *kpe;   // (T, Hm·(dn+dr)), (T, R+dr), (R); cache (cap, R), (cap, dr)
} mla_in;
typedef struct { float *mq, *c, *kpe, *mo; } mla_out;

// engine/cpu/mla.c's rope: pairs (2i, 2i+1) turned by pos·θ^(-2i/dr), the angle in double,
// cos/sin rounded to float once.
static void rope_twin(float *x, int dr, int pos, double theta) {
    for (int i = 0; i < dr / 2; i++) {
        const double ang = (double)pos * pow(theta, -2.0 * i / dr);
        const float cs = (float)cos(ang), sn = (float)sin(ang), x0 = x[2 * i], x1 = x[2 * i + 1];
        x[2 * i] = x0 * cs - x1 * sn;
        x[2 * i + 1] = x0 * sn + x1 * cs;
    }
}

// The CPU twin of one head's attention (MODEL.md "MLA", absorbed; engine/cpu/mla.c attend, not
// separable from sd_mla_forward): q̃ = Σ_i qn[i]·W_UK,h[i] (i increasing); score_j =
// (q̃·c_j + qp·kpe_j)·(dn+dr)^-½ for j <= pos; p = softmax (max subtracted, sum in j order);
// lat = Σ_j p_j c_j; o = W_UV,h · lat.
static void attend_twin(const mla_in *in, const float *qh, const float *c, const float *kpe, int h, int pos, float *o) {
    const int R = in->R, dn = in->dn, dr = in->dr, row0 = h * (dn + in->dv);
    float *qabs = xmalloc(sizeof(float) * R), *lat = xmalloc(sizeof(float) * R), *wrow = xmalloc(sizeof(float) * R);
    float *scores = xmalloc(sizeof(float) * (pos + 1));
    for (int r = 0; r < R; r++) qabs[r] = lat[r] = 0.0f;
    for (int i = 0; i < dn; i++) {
        sd_mat_row_f32(&in->kvb.host, row0 + i, wrow);
        for (int r = 0; r < R; r++) qabs[r] += qh[i] * wrow[r];
    }
    const float scale = 1.0f / sqrtf((float)(dn + dr));
    float mx = -INFINITY, sum = 0.0f;
    for (int j = 0; j <= pos; j++) {
        scores[j] = (sd_dot_f32(qabs, c + (size_t)j * R, R) + sd_dot_f32(qh + dn, kpe + (size_t)j * dr, dr)) * scale;
        if (scores[j] > mx) mx = scores[j];
    }
    for (int j = 0; j <= pos; j++) {
        scores[j] = expf(scores[j] - mx);
        sum += scores[j];
    }
    const float inv = 1.0f / sum;
    for (int j = 0; j <= pos; j++) {
        const float p = scores[j] * inv;
        for (int r = 0; r < R; r++) lat[r] += p * c[(size_t)j * R + r];
    }
    for (int v = 0; v < in->dv; v++) o[v] = sd_mat_dot_row(&in->kvb.host, row0 + dn + v, lat);
    free(qabs); free(lat); free(wrow); free(scores);
}

// shape[7] & 2: settled, & 4: the position from a device cursor; per_token: T calls of one token.
static mla_out mla_on_device(const op_case *c, const mla_in *in, bool per_token) {
    const int settled = (c->shape[7] & 2) != 0, via_cursor = (c->shape[7] & 4) != 0;
    const int Hm = in->Hm, R = in->R, dr = in->dr, T = in->T, qw = in->dn + dr;
    const size_t nq = (size_t)T * Hm * qw, nkv = (size_t)T * (R + dr), nc = (size_t)in->cap * R, nk = (size_t)in->cap * dr;
    const size_t nmo = (size_t)T * Hm * in->dv;
    gbuf mq = gbuf_of(in->mq, nq), kv = gbuf_of(in->kv, nkv), kvn = gbuf_of(in->kv_norm, R), cc = gbuf_of(in->c, nc);
    gbuf kp = gbuf_of(in->kpe, nk), qabs = gbuf_new((size_t)T * Hm * R), mo = gbuf_new(nmo), cur = cursor_at(in->pos0);
    gbuf part = gbuf_new((size_t)T * Hm * SD_MLA_SPLIT * (R + 2)); // mla.h's (T, Hm, SD_MLA_SPLIT, R + 2)
    CU(cudaDeviceSynchronize());
    const int n = per_token ? 1 : T;
    for (int s = 0; s * n < T; s++) {
        const sd_dev_pos pos = via_cursor ? sd_pos_cursor(IP(cur)) : sd_pos_fixed(in->pos0 + s);
        const sd_mla_write wr = {.kv = kv.p + (size_t)s * (R + dr), .kv_norm = kvn.p, .eps = in->eps, .rope = in->rope,
                                 .theta = in->theta};
        OK(sd_cuda_mla_attend(mq.p + (size_t)s * Hm * qw, &in->kvb.dev, cc.p, kp.p, n, Hm, in->dn, dr, in->dv, R, pos, settled,
                              &wr, qabs.p, part.p, mo.p + (size_t)s * Hm * in->dv, 0, &st_));
        if (via_cursor) OK(sd_cuda_cursor_advance(IP(cur), n, 0, &st_));
        if (settled) CU(cudaDeviceSynchronize()); // mla.h: the next call's cache rows and cursor precede it
    }
    mla_out o = {gbuf_read(&mq, nq), gbuf_read(&cc, nc), gbuf_read(&kp, nk), gbuf_read(&mo, nmo)};
    gbuf *all[] = {&mq, &kv, &kvn, &cc, &kp, &qabs, &mo, &cur, &part};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) gbuf_done(all[i], "mla buffer");
    return o;
}
static void mla_out_free(mla_out *o) { free(o->mq); free(o->c); free(o->kpe); free(o->mo); }

// shape: Hm, dn, dr, dv, R, T, pos0, flags (1: RoPE, 2: settled, 4: position from a device
// cursor). The cache write (c = rmsnorm(kv[0..R)), kpe = kv[R..), RoPE of kpe and the queries'
// rope parts when set) and the absorbed attention vs the twin; the cache rows outside the call's
// untouched; T one-token calls ≡ the T-token call, bitwise.
static void run_mla(const op_case *c) {
    mla_in in = {.Hm = c->shape[0], .dn = c->shape[1], .dr = c->shape[2], .dv = c->shape[3], .R = c->shape[4],
                 .T = c->shape[5], .pos0 = c->shape[6], .rope = (c->shape[7] & 1) != 0, .theta = 10000.0, .eps = 1e-5f};
    in.cap = in.pos0 + in.T + 1; // one row past the call's: must stay as it was
    const int Hm = in.Hm, dn = in.dn, dr = in.dr, dv = in.dv, R = in.R, T = in.T, pos0 = in.pos0, qw = dn + dr;
    const size_t nq = (size_t)T * Hm * qw, nc = (size_t)in.cap * R, nk = (size_t)in.cap * dr, nmo = (size_t)T * Hm * dv;
    in.kvb = tmat_rand(Hm * (dn + dv), R, c->dt, seed_of(0));
    in.mq = rand_host(nq, seed_of(1), 1.0f);
    in.kv = rand_host((size_t)T * (R + dr), seed_of(2), 1.0f);
    in.kv_norm = rand_in(R, seed_of(3), 0.5f, 1.5f);
    in.c = rand_host(nc, seed_of(4), 1.0f); // rows < pos0: an earlier forward's; the rest junk
    in.kpe = rand_host(nk ? nk : 1, seed_of(5), 1.0f);
    mla_out ref = {copy_floats(in.mq, nq), copy_floats(in.c, nc), copy_floats(in.kpe, nk), xmalloc(sizeof(float) * nmo)};
    for (int t = 0; t < T; t++) {
        const int pos = pos0 + t;
        const float *kvt = in.kv + (size_t)t * (R + dr);
        sd_rmsnorm(kvt, in.kv_norm, R, in.eps, ref.c + (size_t)pos * R);
        memcpy(ref.kpe + (size_t)pos * dr, kvt + R, sizeof(float) * dr);
        if (!in.rope) continue;
        rope_twin(ref.kpe + (size_t)pos * dr, dr, pos, in.theta);
        for (int h = 0; h < Hm; h++) rope_twin(ref.mq + (size_t)t * Hm * qw + (size_t)h * qw + dn, dr, pos, in.theta);
    }
    for (int t = 0; t < T; t++)
        for (int h = 0; h < Hm; h++)
            attend_twin(&in, ref.mq + (size_t)t * Hm * qw + (size_t)h * qw, ref.c, ref.kpe, h, pos0 + t,
                        ref.mo + ((size_t)t * Hm + h) * dv);
    mla_out all = mla_on_device(c, &in, false), one = mla_on_device(c, &in, true);
    compare(c, "mo", all.mo, ref.mo, nmo);
    const size_t c0 = (size_t)pos0 * R, c1 = (size_t)(pos0 + T) * R, k0 = (size_t)pos0 * dr, k1 = (size_t)(pos0 + T) * dr;
    check_close(TOL_ELEM, "latent rows c of the call", all.c + c0, ref.c + c0, c1 - c0);
    same_bits("latent rows before pos0", all.c, in.c, c0);
    same_bits("latent row past the call", all.c + c1, in.c + c1, nc - c1);
    same_bits("rope key rows before pos0", all.kpe, in.kpe, k0);
    same_bits("rope key row past the call", all.kpe + k1, in.kpe + k1, nk - k1);
    if (in.rope && dr > 1) {
        check_close(TOL_ELEM, "rope key rows of the call (rotated)", all.kpe + k0, ref.kpe + k0, k1 - k0);
        check_close(TOL_ELEM, "queries (rope parts rotated in place)", all.mq, ref.mq, nq);
    } else {
        same_bits("rope key rows of the call (copied)", all.kpe + k0, ref.kpe + k0, k1 - k0);
        same_bits("queries (untouched without RoPE)", all.mq, in.mq, nq);
    }
    same_bits("mo: one token at a time vs the T-token call", one.mo, all.mo, nmo);
    same_bits("latent cache: one token at a time", one.c, all.c, nc);
    same_bits("rope key cache: one token at a time", one.kpe, all.kpe, nk);
    same_bits("queries: one token at a time", one.mq, all.mq, nq);
    mla_out_free(&ref); mla_out_free(&all); mla_out_free(&one);
    free(in.mq); free(in.kv); free(in.kv_norm); free(in.c); free(in.kpe);
    tmat_free(&in.kvb);
}

// ---------------------------------------------------------------------------- MoE routing
// shape: E, K, G, topk_group, T, tie. The selection from router logits (the walk's path from two
// tokens up) against the CPU route of the same logits (an identity router: each score is its logit
// exactly), its grouping against sd_cuda_moe_groups_host, bitwise; the weights within the case's
// tolerance; the readiness counters zeroed. Shapes take the one-block rank kernel with and without
// the warp sort and the warp-per-token kernel; with tie every token's scores tie — K-1 experts at
// one value, two more at a lower one across the K-th place, bias 0 — so the lower index must win.
static void run_moe_select(const op_case *c) {
    const int E = c->shape[0], K = c->shape[1], G = c->shape[2], topk = c->shape[3], T = c->shape[4], tie = c->shape[5];
    sd_config cfg = {.hidden_size = E, .num_experts = E, .num_experts_per_token = K, .num_expert_group = G,
                     .topk_group = topk, .moe_renormalize = true, .routed_scaling_factor = 2.446f};
    float *logits = rand_host((size_t)T * E, seed_of(0), 2.0f), *bias = rand_host(E, seed_of(1), 0.1f);
    float *eye = calloc((size_t)E * E, sizeof(float));
    for (int e = 0; e < E; e++) eye[(size_t)e * E + e] = 1.0f;
    if (tie) {
        memset(bias, 0, sizeof(float) * E);
        for (int t = 0; t < T; t++) {
            float *l = logits + (size_t)t * E;
            for (int j = 0; j < K - 1; j++) l[(size_t)(E - 1 - 3 * j - t) % E] = 6.0f; // E a power of two
            l[1 + t] = 5.0f; // ties l[E - 2 - t] for the K-th place: the lower index wins
            l[E - 2 - t] = 5.0f;
        }
    }
    sd_moe_weights mw = {.router = eye, .bias = bias};
    int *sel = xmalloc(sizeof(int) * T * K);
    float *w = xmalloc(sizeof(float) * T * K);
    for (int t = 0; t < T; t++) sd_moe_route(&mw, &cfg, logits + (size_t)t * E, sel + t * K, w + t * K);
    const size_t n_int = sd_cuda_moe_groups_ints(T, K, E);
    int *groups = xmalloc(sizeof(int) * n_int);
    sd_cuda_moe_groups_host(sel, T, K, E, groups);
    gbuf dl = gbuf_of(logits, (size_t)T * E), db = gbuf_of(bias, E), dsel = gbuf_new((size_t)T * K), dw = gbuf_new((size_t)T * K);
    gbuf dg = gbuf_new(n_int), dready = gbuf_new((size_t)E + 2);
    CU(cudaMemset(dready.p, 0x7f, sizeof(int) * (E + 2)));
    OK(sd_cuda_moe_select(dl.p, db.p, T, E, K, G, topk, true, 2.446f, IP(dsel), dw.p, IP(dg), IP(dready), 0, &st_));
    int *ready = gbuf_read(&dready, (size_t)E + 2), *zeros = calloc((size_t)E + 2, sizeof(int));
    same_bits("readiness counters zeroed", ready, zeros, (size_t)E + 2);
    int *sel_got = gbuf_read(&dsel, (size_t)T * K), *g_got = gbuf_read(&dg, n_int);
    float *w_got = gbuf_read(&dw, (size_t)T * K);
    same_bits("sel", sel_got, sel, (size_t)T * K);
    // The grouping's used part: the count, each group's expert, the ng + 1 starts, every entry.
    const int gc = T * K < E ? T * K : E, ng = groups[0];
    same_bits("number of groups", g_got, groups, 1);
    same_bits("group experts", g_got + 1, groups + 1, ng);
    same_bits("group starts", g_got + 1 + gc, groups + 1 + gc, (size_t)ng + 1);
    same_bits("grouped entries", g_got + 2 + 2 * gc, groups + 2 + 2 * gc, n_int - 2 - 2 * (size_t)gc);
    compare(c, "weights", w_got, w, (size_t)T * K);
    gbuf *all[] = {&dl, &db, &dsel, &dw, &dg, &dready};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) gbuf_done(all[i], "select buffer");
    free(logits); free(bias); free(eye); free(sel); free(w); free(groups); free(ready); free(zeros);
    free(sel_got); free(g_got); free(w_got);
}

// shape: E, K, D, norm. The one-token route + select launch (the walk's path at T = 1) bitwise
// against the two launches it replaces — the router Linear (its norm fused, or x as is) and
// sd_cuda_moe_select: logits, the normed row, sel, w and the grouping; twice, so the ticket's
// return to zero is exercised; the readiness counters zeroed each time.
static void run_moe_route_select(const op_case *c) {
    const int E = c->shape[0], K = c->shape[1], D = c->shape[2], norm_on = c->shape[3];
    cr_assert(sd_cuda_moe_route_select_fits(1, E, D, 1), "%s: the shape fits the one launch", LABEL);
    float *x = rand_host(D, seed_of(0), 1.5f), *nw = rand_host(D, seed_of(1), 1.0f), *bias = rand_host(E, seed_of(2), 0.1f);
    tmat router = tmat_rand(E, D, SD_DT_F32, seed_of(3));
    const size_t n_int = sd_cuda_moe_groups_ints(1, K, E);
    gbuf dx = gbuf_of(x, D), dnw = gbuf_of(nw, D), db = gbuf_of(bias, E), dticket = gbuf_zero(1), dready = gbuf_new((size_t)E + 2);
    gbuf out[2][5]; // [reference, one launch] × what
    const size_t n_of[5] = {(size_t)D, (size_t)E, (size_t)K, (size_t)K, n_int};
    static const char *what[5] = {"normed row", "logits", "sel", "w", "grouping"};
    for (int v = 0; v < 2; v++)
        for (int i = 0; i < 5; i++) out[v][i] = gbuf_new(n_of[i]);
    for (int rep = 0; rep < 2; rep++) {
        const sd_lin_norm ref_norm = {.x = dx.p, .w = dnw.p, .eps = 1e-5f, .n = D, .out = out[0][0].p};
        const sd_lin_job job = {.w = &router.dev, .x = norm_on ? out[0][0].p : dx.p, .ldx = D, .y = out[0][1].p, .ldy = E,
                                .mode = SD_LIN_STORE};
        if (norm_on) OK(sd_cuda_linear_multi_norm(&job, 1, 1, &ref_norm, 0, &st_));
        else OK(sd_cuda_linear_multi(&job, 1, 1, 0, &st_));
        OK(sd_cuda_moe_select(out[0][1].p, db.p, 1, E, K, 1, 1, true, 2.446f, IP(out[0][2]), out[0][3].p, IP(out[0][4]), NULL, 0,
                              &st_));
        CU(cudaMemset(dready.p, 0x7f, sizeof(int) * (E + 2)));
        const sd_lin_norm norm = {.x = dx.p, .w = dnw.p, .eps = 1e-5f, .n = D, .out = out[1][0].p};
        OK(sd_cuda_moe_route_select(router.dev.data, db.p, dx.p, norm_on ? &norm : NULL, 1, E, D, K, 1, true, 2.446f,
                                    out[1][1].p, IP(out[1][2]), out[1][3].p, IP(out[1][4]), IP(dticket), IP(dready), 0, &st_));
        CU(cudaDeviceSynchronize());
        for (int i = norm_on ? 0 : 1; i < 5; i++) { // at one token every int of the grouping is used (K distinct experts)
            uint32_t *a = gbuf_read(&out[0][i], n_of[i]), *b = gbuf_read(&out[1][i], n_of[i]);
            compare(c, fmt("call %d: %s", rep, what[i]), b, a, n_of[i]);
            free(a); free(b);
        }
        int ticket = -1, *ready = gbuf_read(&dready, (size_t)E + 2), *zeros = calloc((size_t)E + 2, sizeof(int));
        gbuf_get(&dticket, &ticket, 1);
        same_bits(fmt("call %d: the ticket back to zero", rep), &ticket, zeros, 1);
        same_bits(fmt("call %d: readiness counters zeroed", rep), ready, zeros, (size_t)E + 2);
        free(ready); free(zeros);
    }
    gbuf *all[] = {&dx, &dnw, &db, &dticket, &dready};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) gbuf_done(all[i], "route+select buffer");
    for (int v = 0; v < 2; v++)
        for (int i = 0; i < 5; i++) gbuf_done(&out[v][i], what[i]);
    tmat_free(&router);
    free(x); free(nw); free(bias);
}

// ---------------------------------------------------------------------------- MoE experts
// A random expert table, selection and grouping (host and device), shared by both arms.
typedef struct {
    int E, K, D, Ie, S, T, acc;
    tmat *gate, *up, *down;  // E experts: (Ie, D), (Ie, D), (D, Ie)
    tmat sg, su, sdn;        // the shared expert (S > 0): (S·Ie, D), (S·Ie, D), (D, S·Ie)
    float *x, *w, *out0;     // (T, D) input, (T, K) routing weights, (T, D) what out holds before
    int *sel, *groups;       // (T, K); the grouping of sel (sd_cuda_moe_groups_host)
    sd_cuda_expert *table;   // device: the E experts' matrices
    gbuf dx, dw, dgroups;
} moe_fix;
typedef struct { float *out, *exp_out, *hs; } moe_res;

// The CPU twin of the block's experts and combine (MODEL.md "MoE"; engine/cpu/moe.c's order, whose
// routing is not separable from sd_moe_forward): out[t] = Σ_j w[t][j]·expert_{sel[t][j]}(x_t)
// (j increasing) + shared(x_t), each expert sd_ffn_forward; with accumulate, out0[t] + that.
static void moe_twin(const moe_fix *f, float *out) {
    const int D = f->D, wide = f->S > 1 ? f->S * f->Ie : f->Ie;
    float *y = xmalloc(sizeof(float) * D), *h1 = xmalloc(sizeof(float) * wide), *h2 = xmalloc(sizeof(float) * wide);
    for (int t = 0; t < f->T; t++) {
        const float *xt = f->x + (size_t)t * D;
        float *o = out + (size_t)t * D;
        for (int i = 0; i < D; i++) o[i] = 0.0f;
        for (int j = 0; j < f->K; j++) {
            const int e = f->sel[t * f->K + j];
            const sd_ffn_weights ex = {f->gate[e].host, f->up[e].host, f->down[e].host};
            sd_ffn_forward(&ex, xt, 1, y, h1, h2);
            for (int i = 0; i < D; i++) o[i] += f->w[t * f->K + j] * y[i];
        }
        if (f->S) {
            const sd_ffn_weights sh = {f->sg.host, f->su.host, f->sdn.host};
            sd_ffn_forward(&sh, xt, 1, y, h1, h2);
            for (int i = 0; i < D; i++) o[i] += y[i];
        }
        if (f->acc)
            for (int i = 0; i < D; i++) o[i] = f->out0[(size_t)t * D + i] + o[i];
    }
    free(y); free(h1); free(h2);
}

// One arm of engine/cuda/moe_block.c on the fixture. The shared expert's activations ride in the up
// launch at T <= 2 and come from a SwiGLU Linear job before it from three tokens up (the router's
// launch, there). Device table: one up over every group (with the shared expert) and one down with
// the combine, with the readiness counters at T <= 2; eager: per group an up and a down, then the
// shared expert's up and the combine-only down. Row tickets back to zero; the readiness counters as
// the counted launches leave them.
static moe_res moe_on_device(const moe_fix *f, bool table_arm) {
    const int T = f->T, K = f->K, E = f->E, D = f->D, n_ent = T * K, gc = n_ent < E ? n_ent : E;
    const bool shared = f->S > 0, in_up = shared && T <= 2;
    const int ld_hs = shared ? f->S * f->Ie : 1;
    gbuf dh = gbuf_new((size_t)n_ent * f->Ie), dexp = gbuf_new((size_t)n_ent * D), dhs = gbuf_new((size_t)T * ld_hs);
    gbuf dso = gbuf_new((size_t)T * D), dout = gbuf_of(f->out0, (size_t)T * D), dtick = gbuf_zero(D), dready = gbuf_zero((size_t)E + 2);
    if (shared && !in_up) {
        const sd_lin_job j = {.w = &f->sg.dev, .w2 = &f->su.dev, .x = f->dx.p, .ldx = D, .y = dhs.p, .ldy = ld_hs, .mode = SD_LIN_SWIGLU};
        OK(sd_cuda_linear_multi(&j, 1, T, 0, &st_));
    }
    sd_cuda_moe_args a = {.table = f->table, .groups = IP(f->dgroups), .T = T, .K = K, .E = E, .D = D, .Ie = f->Ie,
                          .x = f->dx.p, .w = f->dw.p, .h = dh.p, .exp_out = dexp.p, .shared_down = shared ? &f->sdn.dev : NULL,
                          .shared_gate = in_up ? &f->sg.dev : NULL, .shared_up = in_up ? &f->su.dev : NULL, .hs = dhs.p,
                          .ld_hs = shared ? ld_hs : 0, .shared_out = dso.p, .out = dout.p, .accumulate = f->acc,
                          .tickets = IP(dtick)};
    const bool counted = table_arm && T <= 2;
    if (table_arm) {
        if (counted) a.ready = IP(dready);
        OK(sd_cuda_moe_up(&a, 0, gc, 0, n_ent, true, 0, &st_));
        OK(sd_cuda_moe_down(&a, 0, n_ent, true, 0, &st_));
    } else {
        const int *gstart = f->groups + 1 + gc;
        for (int g = 0; g < f->groups[0]; g++) {
            OK(sd_cuda_moe_up(&a, g, g + 1, gstart[g], gstart[g + 1], false, 0, &st_));
            OK(sd_cuda_moe_down(&a, gstart[g], gstart[g + 1], false, 0, &st_));
        }
        OK(sd_cuda_moe_up(&a, 0, 0, 0, 0, true, 0, &st_));
        OK(sd_cuda_moe_down(&a, 0, 0, true, 0, &st_));
    }
    CU(cudaDeviceSynchronize());
    const char *arm = table_arm ? "device table" : "eager";
    int *tick = gbuf_read(&dtick, D), *ready = gbuf_read(&dready, (size_t)E + 2), *zeros = calloc((size_t)D + E + 2, sizeof(int));
    same_bits(fmt("%s: row tickets back to zero", arm), tick, zeros, D);
    if (counted) { // each selected expert's up blocks, the same number for each; the shared expert's; the down blocks
        int per_expert = -1;
        for (int e = 0; e < E; e++) {
            bool chosen = false;
            for (int i = 0; i < n_ent; i++) chosen |= f->sel[i] == e;
            if (!chosen) {
                cr_assert_eq(ready[e], 0, "%s: expert %d (not selected) counted %d", LABEL, e, ready[e]);
                continue;
            }
            if (per_expert < 0) per_expert = ready[e];
            cr_assert(ready[e] == per_expert && ready[e] > 0, "%s: expert %d counted %d, another %d", LABEL, e, ready[e], per_expert);
        }
        cr_assert(shared ? ready[E] > 0 : ready[E] == 0, "%s: the shared expert counted %d", LABEL, ready[E]);
        cr_assert(ready[E + 1] > 0, "%s: the down launch counted %d blocks", LABEL, ready[E + 1]);
    } else {
        same_bits(fmt("%s: readiness counters untouched", arm), ready, zeros, (size_t)E + 2);
    }
    moe_res r = {gbuf_read(&dout, (size_t)T * D), gbuf_read(&dexp, (size_t)n_ent * D), gbuf_read(&dhs, (size_t)T * ld_hs)};
    gbuf *all[] = {&dh, &dexp, &dhs, &dso, &dout, &dtick, &dready};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) gbuf_done(all[i], fmt("%s moe buffer", arm));
    free(tick); free(ready); free(zeros);
    return r;
}

// shape: E, K, D, Ie, S (the shared expert's width in Ie; 0: none), T, accumulate. Both arms over
// the same random table, selection and grouping: bitwise equal (out, exp_out, the shared
// activations), and the device table's out vs the twin.
static void run_moe_experts(const op_case *c) {
    moe_fix f = {.E = c->shape[0], .K = c->shape[1], .D = c->shape[2], .Ie = c->shape[3], .S = c->shape[4], .T = c->shape[5],
                 .acc = c->shape[6]};
    const int E = f.E, K = f.K, D = f.D, T = f.T, Ie = f.Ie;
    f.gate = xmalloc(sizeof(tmat) * E);
    f.up = xmalloc(sizeof(tmat) * E);
    f.down = xmalloc(sizeof(tmat) * E);
    sd_cuda_expert *table = xmalloc(sizeof(sd_cuda_expert) * E);
    const int bf = c->dt == SD_DT_BF16;
    for (int e = 0; e < E; e++) {
        f.gate[e] = tmat_rand(Ie, D, c->dt, seed_of(3 * e));
        f.up[e] = tmat_rand(Ie, D, c->dt, seed_of(3 * e + 1));
        f.down[e] = tmat_rand(D, Ie, c->dt, seed_of(3 * e + 2));
        table[e] = (sd_cuda_expert){f.gate[e].dev.data, f.up[e].dev.data, f.down[e].dev.data, bf, bf, bf};
    }
    CU(cudaMalloc((void **)&f.table, sizeof(sd_cuda_expert) * E));
    CU(cudaMemcpy(f.table, table, sizeof(sd_cuda_expert) * E, cudaMemcpyHostToDevice));
    if (f.S) {
        f.sg = tmat_rand(f.S * Ie, D, c->dt, seed_of(1000));
        f.su = tmat_rand(f.S * Ie, D, c->dt, seed_of(1001));
        f.sdn = tmat_rand(D, f.S * Ie, c->dt, seed_of(1002));
    }
    f.x = rand_host((size_t)T * D, seed_of(1003), 1.0f);
    f.w = rand_in((size_t)T * K, seed_of(1004), 0.05f, 0.6f);
    f.out0 = rand_host((size_t)T * D, seed_of(1005), 1.0f); // the residual stream (accumulate) or junk (overwritten)
    f.sel = xmalloc(sizeof(int) * T * K);
    uint64_t r = seed_of(1006);
    int *perm = xmalloc(sizeof(int) * E);
    for (int t = 0; t < T; t++) { // K distinct experts a token, in a random order
        for (int e = 0; e < E; e++) perm[e] = e;
        for (int j = 0; j < K; j++) {
            const int i = j + rng_int(&r, E - j), s = perm[i];
            perm[i] = perm[j];
            perm[j] = s;
            f.sel[t * K + j] = s;
        }
    }
    const size_t n_int = sd_cuda_moe_groups_ints(T, K, E);
    f.groups = xmalloc(sizeof(int) * n_int);
    sd_cuda_moe_groups_host(f.sel, T, K, E, f.groups);
    f.dx = gbuf_of(f.x, (size_t)T * D);
    f.dw = gbuf_of(f.w, (size_t)T * K);
    f.dgroups = gbuf_of(f.groups, n_int);
    float *ref = xmalloc(sizeof(float) * T * D);
    moe_twin(&f, ref);
    moe_res table_arm = moe_on_device(&f, true), eager = moe_on_device(&f, false);
    compare(c, "out (device table)", table_arm.out, ref, (size_t)T * D);
    same_bits("out: eager vs device table", eager.out, table_arm.out, (size_t)T * D);
    same_bits("routed expert outputs: eager vs device table", eager.exp_out, table_arm.exp_out, (size_t)T * K * D);
    if (f.S) same_bits("shared activations: eager vs device table", eager.hs, table_arm.hs, (size_t)T * f.S * Ie);
    gbuf_done(&f.dx, "x");
    gbuf_done(&f.dw, "w");
    gbuf_done(&f.dgroups, "grouping");
    CU(cudaFree(f.table));
    for (int e = 0; e < E; e++) { tmat_free(&f.gate[e]); tmat_free(&f.up[e]); tmat_free(&f.down[e]); }
    if (f.S) { tmat_free(&f.sg); tmat_free(&f.su); tmat_free(&f.sdn); }
    moe_res *res[2] = {&table_arm, &eager};
    for (int i = 0; i < 2; i++) { free(res[i]->out); free(res[i]->exp_out); free(res[i]->hs); }
    free(f.gate); free(f.up); free(f.down); free(table); free(f.x); free(f.w); free(f.out0); free(f.sel); free(perm);
    free(f.groups); free(ref);
}

// ---------------------------------------------------------------------------- sampling
// shape: rows, n, pattern, pinned (out in pinned host memory). Pattern 0 (rows >= 4): random rows,
// a tie (the first index wins), all NaN (index 0), NaN with a later maximum (NaN never wins).
// Pattern 1 (rows == 2, vocabulary-sized): the maximum in the last slice after a NaN, a tie across
// slices; all rows, then one, with the same workspace (a verify, then a decode), so each call's
// tickets sit where earlier calls left partials. Bitwise vs sd_argmax; the tickets left zero.
static void run_argmax(const op_case *c) {
    const int rows = c->shape[0], n = c->shape[1], pattern = c->shape[2], pinned = c->shape[3];
    float *l = rand_host((size_t)rows * n, seed_of(0), 6.0f);
    if (pattern == 0) {
        cr_assert(rows >= 4);
        l[1 * (size_t)n + 17] = 50.0f;
        l[1 * (size_t)n + n - 3] = 50.0f;
        for (int i = 0; i < n; i++) l[2 * (size_t)n + i] = NAN;
        l[3 * (size_t)n + 3] = NAN;
        l[3 * (size_t)n + 9] = 80.0f;
    } else {
        cr_assert(rows == 2 && n > 150000);
        l[100] = NAN;
        l[n - 5] = 70.0f;
        l[(size_t)n + 9000] = 90.0f;
        l[(size_t)n + 150000] = 90.0f;
    }
    int *ref = xmalloc(sizeof(int) * rows), *got = xmalloc(sizeof(int) * rows), *host_out = NULL;
    for (int r = 0; r < rows; r++) ref[r] = sd_argmax(l + (size_t)r * n, n);
    if (pattern == 1) cr_assert(ref[0] == n - 5 && ref[1] == 9000, "%s: the reference rows are not as built", LABEL);
    const size_t ws_n = SD_ARGMAX_WS_INTS(rows);
    gbuf dl = gbuf_of(l, (size_t)rows * n), ws = gbuf_zero(ws_n), dout = gbuf_new(rows);
    if (pinned) CU(cudaMallocHost((void **)&host_out, sizeof(int) * rows));
    int *out = pinned ? host_out : IP(dout);
    for (int nr = rows; nr >= (pattern ? 1 : rows); nr--) {
        if (pinned) memset(host_out, 0xff, sizeof(int) * rows); // a result not written shows as -1
        else CU(cudaMemset(dout.p, 0xff, sizeof(int) * rows));
        OK(sd_cuda_argmax(dl.p, nr, n, out, IP(ws), 0, &st_));
        CU(cudaDeviceSynchronize());
        if (pinned) memcpy(got, host_out, sizeof(int) * nr);
        else gbuf_get(&dout, got, nr);
        compare(c, fmt("argmax of %d rows", nr), got, ref, nr);
    }
    int *ws_back = gbuf_read(&ws, ws_n);
    for (int r = 0; r < rows; r++)
        cr_assert_eq(ws_back[(size_t)r * (2 * SD_ARGMAX_SLICES + 1)], 0, "%s: row %d's ticket left at %d", LABEL, r,
                     ws_back[(size_t)r * (2 * SD_ARGMAX_SLICES + 1)]);
    if (pinned) CU(cudaFreeHost(host_out));
    gbuf_done(&dl, "logits");
    gbuf_done(&ws, "workspace");
    gbuf_done(&dout, "out");
    free(l); free(ref); free(got); free(ws_back);
}

// shape: rows (>= 5), n, in place (p aliases the logits). τ = 1, 0.7 and 0 (one-hot) over random
// rows with −inf entries, a tie, all NaN, NaN beside a maximum, +inf (no finite max: one-hot).
static void run_softmax(const op_case *c) {
    const int rows = c->shape[0], n = c->shape[1], inplace = c->shape[2];
    const size_t nl = (size_t)rows * n;
    cr_assert(rows >= 5 && n >= 20);
    float *l = rand_host(nl, seed_of(0), 6.0f), *ref = xmalloc(sizeof(float) * nl);
    for (int i = 0; i < n; i += 11) l[i] = -INFINITY;
    l[1 * (size_t)n + 17] = 50.0f;
    l[1 * (size_t)n + n - 2] = 50.0f;
    for (int i = 0; i < n; i++) l[2 * (size_t)n + i] = NAN;
    l[3 * (size_t)n + 3] = NAN;
    l[3 * (size_t)n + 9] = 80.0f;
    l[4 * (size_t)n + 5] = INFINITY;
    for (int i = 0; i < n; i += 7) l[4 * (size_t)n + i] = -INFINITY;
    const float temps[] = {1.0f, 0.7f, 0.0f};
    gbuf dl = gbuf_new(nl), dp = inplace ? dl : gbuf_new(nl);
    for (int k = 0; k < 3; k++) {
        for (int r = 0; r < rows; r++) sd_softmax(l + (size_t)r * n, n, temps[k], ref + (size_t)r * n);
        gbuf_put(&dl, l, nl);
        OK(sd_cuda_softmax(dl.p, rows, n, temps[k], dp.p, 0, &st_));
        float *got = gbuf_read(&dp, nl);
        compare(c, fmt("p at temperature %g", temps[k]), got, ref, nl);
        free(got);
    }
    if (!inplace) gbuf_done(&dp, "p");
    gbuf_done(&dl, "logits");
    free(l); free(ref);
}

// shape: rows, n, pinned (out in pinned host memory). p rows: softmaxes of random logits, one with
// exact zeros (every other entry), one one-hot; four draws (seed, round, pos, purpose) each.
// Bitwise vs sd_sample with sd_uniform(seed, round, pos + r, purpose).
static void run_sample_rows(const op_case *c) {
    const int rows = c->shape[0], n = c->shape[1], pinned = c->shape[2];
    const size_t np = (size_t)rows * n;
    float *p = rand_host(np, seed_of(0), 3.0f);
    for (int i = 0; rows > 1 && i < n; i += 2) p[(size_t)n + i] = -INFINITY;
    for (int r = 0; r < rows; r++) sd_softmax(p + (size_t)r * n, n, 1.0f, p + (size_t)r * n);
    if (rows > 2)
        for (int i = 0; i < n; i++) p[2 * (size_t)n + i] = i == n / 3 ? 1.0f : 0.0f;
    gbuf dp = gbuf_of(p, np), dout = gbuf_new(rows);
    int *host_out = NULL, *got = xmalloc(sizeof(int) * rows), *ref = xmalloc(sizeof(int) * rows);
    if (pinned) CU(cudaMallocHost((void **)&host_out, sizeof(int) * rows));
    uint64_t r = seed_of(1);
    for (int draw = 0; draw < 4; draw++) {
        const uint64_t seed = rng_next(&r);
        const uint32_t round = (uint32_t)rng_next(&r), pos = (uint32_t)rng_int(&r, 100000), purpose = (uint32_t)draw;
        OK(sd_cuda_sample_rows(dp.p, rows, n, seed, sd_draw_fixed(round, pos), purpose, pinned ? host_out : IP(dout), 0, &st_));
        CU(cudaDeviceSynchronize());
        if (pinned) memcpy(got, host_out, sizeof(int) * rows);
        else gbuf_get(&dout, got, rows);
        for (int k = 0; k < rows; k++) ref[k] = sd_sample(p + (size_t)k * n, n, sd_uniform(seed, round, pos + (uint32_t)k, purpose));
        compare(c, fmt("draw %d (purpose %u)", draw, purpose), got, ref, rows);
    }
    if (pinned) CU(cudaFreeHost(host_out));
    gbuf_done(&dp, "p");
    gbuf_done(&dout, "out");
    free(p); free(got); free(ref);
}

// shape: k, V, greedy, reps, q_is_p (sampled: q_i = p_{i-1}, so every draft with p > 0 stands and
// the bonus comes from p_k). Bitwise (n, bonus) vs sd_accept_ref, and after a rejection the
// residual too. Greedy: top random, drafts mostly matching. Sampled: softmaxes of random logits,
// drafts drawn from q.
static void run_accept(const op_case *c) {
    const int k = c->shape[0], V = c->shape[1], greedy = c->shape[2], reps = c->shape[3], q_is_p = c->shape[4];
    for (int rep = 0; rep < reps; rep++) {
        uint64_t r = seed_of(rep);
        int drafts[SD_ACCEPT_MAX_K], top[SD_ACCEPT_MAX_K + 1], want[2], got[2];
        cr_assert(k >= 1 && k <= SD_ACCEPT_MAX_K);
        gbuf dout = gbuf_new(2);
        if (greedy) {
            for (int i = 0; i <= k; i++) top[i] = rng_int(&r, V);
            for (int i = 0; i < k; i++) drafts[i] = rng_int(&r, 4) ? top[i] : rng_int(&r, V);
            const sd_accept_args a = {.k = k, .V = V, .drafts = drafts, .top = top};
            sd_accept_ref(&a, &want[0], &want[1]);
            gbuf dd = gbuf_of(drafts, k), dt = gbuf_of(top, (size_t)k + 1);
            OK(sd_cuda_accept(IP(dd), k, IP(dt), NULL, NULL, NULL, V, 0, sd_draw_fixed(0, 0), IP(dout), 0, &st_));
            gbuf_get(&dout, got, 2);
            gbuf_done(&dd, "drafts");
            gbuf_done(&dt, "top");
        } else {
            float *p = rand_host((size_t)(k + 1) * V, seed_of(100 + rep), 3.0f), *q = rand_host((size_t)k * V, seed_of(200 + rep), 3.0f);
            for (int i = 0; i <= k; i++) sd_softmax(p + (size_t)i * V, V, 1.0f, p + (size_t)i * V);
            for (int i = 0; i < k; i++) {
                float *qi = q + (size_t)i * V;
                if (q_is_p) memcpy(qi, p + (size_t)i * V, sizeof(float) * V);
                else sd_softmax(qi, V, 1.0f, qi);
                drafts[i] = sd_sample(qi, V, rng_unit(&r));
            }
            float *work = xmalloc(sizeof(float) * V);
            const sd_accept_args a = {.k = k, .V = V, .drafts = drafts, .p = p, .q = q, .work = work, .seed = rng_next(&r),
                                      .round = (uint32_t)rng_next(&r), .pos_x = (uint32_t)rng_int(&r, 1000)};
            sd_accept_ref(&a, &want[0], &want[1]);
            gbuf dp = gbuf_of(p, (size_t)(k + 1) * V), dq = gbuf_of(q, (size_t)k * V), dwork = gbuf_new(V), dd = gbuf_of(drafts, k);
            OK(sd_cuda_accept(IP(dd), k, NULL, dp.p, dq.p, dwork.p, V, a.seed, sd_draw_fixed(a.round, a.pos_x), IP(dout), 0, &st_));
            gbuf_get(&dout, got, 2);
            if (want[0] < k) { // a rejection: the residual the bonus came from
                float *gw = gbuf_read(&dwork, V);
                same_bits(fmt("rep %d: the residual", rep), gw, work, V);
                free(gw);
            }
            gbuf_done(&dp, "p"); gbuf_done(&dq, "q"); gbuf_done(&dwork, "work"); gbuf_done(&dd, "drafts");
            free(p); free(q); free(work);
        }
        compare(c, fmt("rep %d: (n, bonus)", rep), got, want, 2);
        gbuf_done(&dout, "out");
    }
}

// shape: k, round (1: a round counter to advance; 0: NULL), pinned (pub in pinned host memory, as the
// host reads it back, with sentinel words either side; 0: device memory). pub = {n, bonus,
// seq[1..k]}, then seq[0] = bonus (seq[1..k] untouched) and the counter + 1. k = 0 (a plain decode
// step): out = {0, the new token}.
static void run_round_publish(const op_case *c) {
    const int k = c->shape[0], with_round = c->shape[1], pinned = c->shape[2];
    uint64_t r = seed_of(0);
    const int out[2] = {k ? rng_int(&r, k + 1) : 0, rng_int(&r, 163840)};
    int *seq = xmalloc(sizeof(int) * (k + 1)), *want = xmalloc(sizeof(int) * (k + 2)), *got = xmalloc(sizeof(int) * (k + 2));
    for (int i = 0; i <= k; i++) seq[i] = rng_int(&r, 163840);
    const uint32_t round0 = (uint32_t)rng_next(&r);
    gbuf dout = gbuf_of(out, 2), dseq = gbuf_of(seq, (size_t)k + 1), dround = gbuf_of(&round0, 1), dpub = gbuf_new((size_t)k + 2);
    int *host = NULL;
    const size_t nh = (size_t)k + 2 + 2 * GUARD;
    if (pinned) {
        CU(cudaMallocHost((void **)&host, sizeof(int) * nh));
        for (size_t i = 0; i < nh; i++) memcpy(&host[i], &SENTINEL, 4);
    }
    int *pub = pinned ? host + GUARD : IP(dpub);
    OK(sd_cuda_round_publish(IP(dout), IP(dseq), k, pub, with_round ? (uint32_t *)dround.p : NULL, 0, &st_));
    CU(cudaDeviceSynchronize());
    want[0] = out[0];
    want[1] = out[1];
    for (int i = 0; i < k; i++) want[2 + i] = seq[1 + i];
    if (pinned) memcpy(got, pub, sizeof(int) * (k + 2));
    else gbuf_get(&dpub, got, (size_t)k + 2);
    compare(c, "pub", got, want, (size_t)k + 2);
    seq[0] = out[1];
    int *seq_got = gbuf_read(&dseq, (size_t)k + 1);
    compare(c, "seq", seq_got, seq, (size_t)k + 1);
    uint32_t round_got, round_want = round0 + (with_round ? 1u : 0u);
    gbuf_get(&dround, &round_got, 1);
    compare(c, "round counter", &round_got, &round_want, 1);
    if (pinned) {
        for (size_t i = 0; i < GUARD; i++) {
            uint32_t a, b;
            memcpy(&a, &host[i], 4);
            memcpy(&b, &host[GUARD + k + 2 + i], 4);
            cr_assert(a == SENTINEL && b == SENTINEL, "%s: pub written outside its %d ints", LABEL, k + 2);
        }
        CU(cudaFreeHost(host));
    }
    gbuf *all[] = {&dout, &dseq, &dround, &dpub};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) gbuf_done(all[i], "round buffer");
    free(seq); free(want); free(got); free(seq_got);
}

// shape: bf16, smallest (0: the largest tensor of the dtype in configs/tiny.json's synthesis; 1: the
// smallest — at f32 a vector shorter than one 4-element Philox block). Bitwise vs the bytes
// sd_synth_model wrote for that tensor, with its sd_synth_tensor_params.
static void run_synth_fill(const op_case *c) {
    const bool bf16 = c->shape[0] != 0, smallest = c->shape[1] != 0;
    const sd_dtype dt = bf16 ? SD_DT_BF16 : SD_DT_F32;
    sd_config cfg;
    load_config("configs/tiny.json", &cfg);
    const sd_synth_opts o = {.seed = 0x123456789abcdef0ull ^ case_seed, .dtype = dt, .tail_from = SD_MAX_LAYERS, .tail_scale = 1.0f};
    sd_model m;
    sd_status st = {0};
    cr_assert_eq(sd_synth_model(&m, &cfg, &o, &st), SD_OK, "%s", st.msg);
    const sd_weight_spec *pick = NULL;
    int64_t n = 0;
    for (int i = 0; i < m.w.n_specs; i++) {
        const sd_weight_spec *s = &m.w.specs[i];
        const int64_t ns = s->shape[0] * (s->ndim == 2 ? s->shape[1] : 1);
        if (s->dtype == dt && (!pick || (smallest ? ns < n : ns > n))) pick = s, n = ns;
    }
    cr_assert(pick, "%s: no %s tensor", LABEL, sd_dtype_name(dt));
    const sd_synth_tensor p = sd_synth_tensor_params(pick, &m.cfg, &o);
    const size_t bytes = (size_t)n * sd_dtype_size(dt), words = (bytes + 3) / 4;
    gbuf d = gbuf_new(words);
    OK(sd_cuda_synth_fill(d.p, n, bf16, o.seed, p.name_hash, p.scale, p.offset, 0, &st_));
    unsigned char *got = gbuf_read(&d, words);
    const unsigned char *want = sd_weight_data(pick);
    cr_log_info("%s: tensor %s, %lld elements", LABEL, pick->name, (long long)n);
    if (memcmp(got, want, bytes) != 0) {
        size_t i = 0;
        while (got[i] == want[i]) i++;
        cr_assert_fail("%s: tensor %s (%lld elements) differs from host synthesis at element %zu", LABEL, pick->name,
                       (long long)n, i / sd_dtype_size(dt));
    }
    gbuf_done(&d, "tensor");
    free(got);
    sd_model_free(&m);
}

// ---------------------------------------------------------------------------- prefill: bf16 operands
// The prefill's kernels (kernels/gemm.h, kda_prefill.h, mla_prefill.h, moe_prefill.h) are never
// bitwise the token path; their own tolerances (the reasons, once):
// TOL_BF16  one rounding to bf16 (nearest even) on the device side only — the staged GEMM
//           activations, the flash's probabilities before P·V, a bf16 output: each value within
//           2^-8 relative, so an elementwise output's NMSE < 2^-16 ≈ 1.5e-5; through a dot the errors
//           average to ≈ 2e-6 for uniform values (every such case has >= 56 outputs, so the ratio of
//           sums stays near its mean).
// TOL_MMA   the same bf16 values on both sides, fp32 accumulation on the tensor cores in cuBLASLt's
//           order (products exact, adds aligned and truncated: NMSE ≲ 1e-10 at K = 2304); 1e-8 stays
//           far below one bf16 rounding of the activations (≈ 2e-6), so it sees how the device rounded.
// TOL_CHUNK the chunked (WY) recurrence against both CPU forms: fp32 with fmaf and the fast __expf
//           through a triangular solve a chunk, in another order; the two CPU forms agree to ≈ 3e-13
//           on these inputs: 1e-9 leaves room, an indexing slip is O(1).
#define TOL_BF16 2e-5
#define TOL_MMA 1e-8
#define TOL_CHUNK 1e-9

static uint16_t *bf16_of(const float *x, size_t n) {
    uint16_t *h = xmalloc(2 * n);
    for (size_t i = 0; i < n; i++) h[i] = sd_f32_to_bf16(x[i]);
    return h;
}
static float *widen_bf16(const uint16_t *h, size_t n) {
    float *x = xmalloc(sizeof(float) * n);
    for (size_t i = 0; i < n; i++) x[i] = sd_bf16_to_f32(h[i]);
    return x;
}
// A guarded buffer of n bf16 values (n/2 words rounded up; h NULL: left as the sentinel).
static gbuf gbuf_halves(const uint16_t *h, size_t n) {
    gbuf g = gbuf_new((n + 1) / 2);
    if (h && n) CU(cudaMemcpy(g.p, h, 2 * n, cudaMemcpyHostToDevice));
    return g;
}
static uint16_t *read_halves(const gbuf *g, size_t n) { return gbuf_read(g, (n + 1) / 2); }
// got (read_halves) holds want bit for bit, and the half past the n (n odd) is still the sentinel's.
static void check_halves(const char *what, const uint16_t *got, const uint16_t *want, size_t n) {
    const size_t nw = (n + 1) / 2;
    uint32_t *w = xmalloc(4 * nw);
    for (size_t i = 0; i < nw; i++) w[i] = SENTINEL;
    if (n) memcpy(w, want, 2 * n);
    same_bits(what, got, w, nw);
    free(w);
}
static void same_halves(const char *what, const gbuf *g, const uint16_t *want, size_t n) {
    uint16_t *got = read_halves(g, n);
    check_halves(what, got, want, n);
    free(got);
}

// shape: n, edges (1: the first entries are the values below). y bitwise vs sd_f32_to_bf16 (nearest
// even on the bits: ties, overflow to ±inf, subnormals kept), except that a NaN is checked as a NaN
// (its payload is the device's); nothing past the n halves written (n = 0: nothing at all).
static void run_to_bf16(const op_case *c) {
    static const uint32_t edges[] = {
        0x3f808000u, 0x3f818000u, 0x3f808001u, 0xbf80ffffu, // ties to even (down, up), past a tie, negative
        0x7f7fffffu, 0xff7f8000u, 0x7f800000u, 0xff800000u, // FLT_MAX and a tie below -FLT_MAX: to ±inf; ±inf
        0x00000001u, 0x807fffffu, 0x00408000u, 0x00018000u, // subnormals: to 0, to the smallest normal, ties
        0x80000000u, 0x00000000u,                           // ±0
        0x7fc00000u, 0xffc00001u, 0x7f800001u, 0x7fffffffu, // NaNs (quiet, negative, signalling, all ones)
    };
    const size_t n = (size_t)c->shape[0], ne = c->shape[1] ? sizeof edges / sizeof *edges : 0;
    float *x = rand_host(n, seed_of(0), 3.0f);
    for (size_t i = 0; i < ne && i < n; i++) memcpy(&x[i], &edges[i], 4);
    uint16_t *want = bf16_of(x, n);
    gbuf dx = gbuf_of(x, n), dy = gbuf_halves(NULL, n);
    OK(sd_cuda_to_bf16(dx.p, n, (uint16_t *)dy.p, 0, &st_));
    uint16_t *got = read_halves(&dy, n);
    for (size_t i = 0; i < n; i++)
        if (isnan(x[i])) { // a NaN stays a NaN; then its bits are not compared
            cr_assert((got[i] & 0x7fffu) > 0x7f80u, "%s: x[%zu] (NaN 0x%08x) gave 0x%04x, not a NaN", LABEL, i,
                      ne > i ? edges[i] : 0u, got[i]);
            got[i] = want[i];
        }
    check_halves("y", got, want, n);
    gbuf_done(&dx, "x");
    gbuf_done(&dy, "y");
    free(x); free(want); free(got);
}

// ---------------------------------------------------------------------------- prefill: GEMM
// The cuBLASLt wrapper (gemm.h) exports sd_gemm_*, which test_op_coverage does not list (its names
// are not sd_cuda_); its cases name the launcher they check with it, sd_cuda_to_bf16.
// shape: M, N, K, batch, op (SD_GEMM_WT, SD_GEMM_WN), xgap, ygap, beta. Problem b: W_b at b·(its size
// + 8) elements (WT [N, K], WN [K, N], rows packed), X_b the columns b·(K + xgap) .. of rows
// batch·(K + xgap) wide, Y_b likewise with N + ygap (the MLA absorptions' layout): Y = X·op(W) (+ Y0
// with beta 1). One random weight held as F32 and as BF16 (the same bf16 values), f32 activations.
// Each arm: Y vs float64 of X (F32: TOL_DOT; BF16: TOL_BF16, the staging's rounding) and, for BF16,
// of X rounded to bf16 (TOL_MMA); Y outside the problems untouched. Then, each bitwise that Y through
// the same plan (the plan count does not grow): the call again; the Linear form's wrapper (batch 1,
// WT: sd_gemm_linear); for BF16 sd_cuda_to_bf16 of the staged layout (bitwise vs the host's
// rounding) run as bf16 activations (sd_gemm_linear_bf16 for the Linear form, else sd_gemm_run).
// Leading dimensions keep rows 16-byte aligned, as the prefill's do.
static void run_gemm(const op_case *c) {
    const int M = c->shape[0], N = c->shape[1], K = c->shape[2], B = c->shape[3] > 1 ? c->shape[3] : 1;
    const sd_gemm_op op = (sd_gemm_op)c->shape[4];
    const bool wt = op == SD_GEMM_WT, linear = wt && B == 1;
    const float beta = (float)c->shape[7];
    const int wrows = wt ? N : K, ldw = wt ? K : N, ldk = (K + 7) / 8 * 8;
    const long long sw = (long long)wrows * ldw + 8, sx = K + c->shape[5], sy = N + c->shape[6];
    const int ldx = B * (int)sx, ldy = B * (int)sy;
    const size_t nw = (size_t)(B - 1) * sw + (size_t)wrows * ldw, nx = (size_t)M * ldx, ny = (size_t)M * ldy;
    const size_t no = (size_t)B * M * N, ns = (size_t)B * M * ldk; // outputs (b, m, n); staged activations
    float *w0 = rand_host(nw, seed_of(0), 1.7f / sqrtf((float)K));
    uint16_t *w16 = bf16_of(w0, nw);
    float *wf = widen_bf16(w16, nw), *x = rand_host(nx, seed_of(1), 1.0f), *y0 = rand_host(ny, seed_of(2), 0.5f);
    float *ref = xmalloc(sizeof(float) * no), *ref16 = xmalloc(sizeof(float) * no);
    uint16_t *x16 = bf16_of(x, nx);
    float *xr = widen_bf16(x16, nx); // X rounded to bf16
    for (int b = 0; b < B; b++)
        for (int m = 0; m < M; m++)
            for (int n = 0; n < N; n++) {
                double a = 0, a16 = 0;
                for (int k = 0; k < K; k++) {
                    const double wv = wf[(size_t)b * sw + (wt ? (size_t)n * ldw + k : (size_t)k * ldw + n)];
                    const size_t xi = (size_t)m * ldx + (size_t)b * sx + k;
                    a += x[xi] * wv;
                    a16 += xr[xi] * wv;
                }
                const double y = beta * (double)y0[(size_t)m * ldy + (size_t)b * sy + n];
                ref[((size_t)b * M + m) * N + n] = (float)(y + a);
                ref16[((size_t)b * M + m) * N + n] = (float)(y + a16);
            }
    // The staged layout of gemm.cu: problem b's row m at (b·M + m)·ldk, K values, then padding.
    float *xs = rand_host(ns, seed_of(3), 1.0f); // the padding: any values (never read)
    for (int b = 0; b < B; b++)
        for (int m = 0; m < M; m++)
            memcpy(xs + ((size_t)b * M + m) * ldk, x + (size_t)m * ldx + (size_t)b * sx, sizeof(float) * K);
    uint16_t *xs16 = bf16_of(xs, ns);
    sd_gemm *g;
    OK(sd_gemm_create(&g, ns, &st_));
    gbuf dx = gbuf_of(x, nx), dy = gbuf_new(ny), dxs = gbuf_of(xs, ns), dxb = gbuf_halves(NULL, ns);
    static const char *again[3] = {"the same call again", "sd_gemm_linear", "bf16 activations from sd_cuda_to_bf16"};
    for (int arm = 0; arm < 2; arm++) { // the F32 weight, then the BF16 one
        const bool bf = arm == 1;
        const char *wn = bf ? "bf16 weight" : "f32 weight";
        gbuf dw = bf ? gbuf_halves(w16, nw) : gbuf_of(wf, nw);
        const sd_gemm_args a = {.w = dw.p, .w_dtype = bf ? SD_DT_BF16 : SD_DT_F32, .ldw = ldw, .op = op, .x = dx.p,
                                .x_dtype = SD_DT_F32, .ldx = ldx, .y = dy.p, .ldy = ldy, .M = M, .N = N, .K = K,
                                .beta = beta, .batch = B, .stride_w = sw, .stride_x = sx, .stride_y = sy};
        const sd_mat wm = {.dtype = a.w_dtype, .data = dw.p, .rows = N, .cols = K};
        gbuf_put(&dy, y0, ny);
        OK(sd_gemm_run(g, &a, 0, &st_));
        const size_t plans = sd_gemm_plans(g);
        float *got = gbuf_read(&dy, ny), *outs = xmalloc(sizeof(float) * no), *rest = copy_floats(y0, ny);
        for (int b = 0; b < B; b++)
            for (int m = 0; m < M; m++)
                for (int n = 0; n < N; n++) {
                    const size_t yi = (size_t)m * ldy + (size_t)b * sy + n;
                    outs[((size_t)b * M + m) * N + n] = rest[yi] = got[yi];
                }
        same_bits(fmt("%s: Y outside the problems' columns untouched", wn), got, rest, ny);
        if (bf) {
            compare(c, "bf16 weight: Y vs float64 of the f32 activations (the staging's rounding)", outs, ref, no);
            check_close(TOL_MMA, "bf16 weight: Y vs float64 of the activations rounded to bf16", outs, ref16, no);
        } else {
            check_close(TOL_DOT, "f32 weight: Y vs float64", outs, ref, no);
        }
        for (int v = 0; v < 3; v++) {
            if ((v == 1 && !linear) || (v == 2 && !bf)) continue;
            gbuf_put(&dy, y0, ny);
            if (v == 0) OK(sd_gemm_run(g, &a, 0, &st_));
            if (v == 1) OK(sd_gemm_linear(g, &wm, dx.p, ldx, M, dy.p, ldy, beta, 0, &st_));
            if (v == 2) {
                OK(sd_cuda_to_bf16(dxs.p, ns, (uint16_t *)dxb.p, 0, &st_));
                same_halves("sd_cuda_to_bf16 of the staged activations", &dxb, xs16, ns);
                sd_gemm_args ab = a;
                ab.x = dxb.p;
                ab.x_dtype = SD_DT_BF16;
                ab.ldx = ldk;
                ab.stride_x = (long long)M * ldk;
                if (linear) OK(sd_gemm_linear_bf16(g, &wm, (const uint16_t *)dxb.p, ldk, M, dy.p, ldy, beta, 0, &st_));
                else OK(sd_gemm_run(g, &ab, 0, &st_));
            }
            CU(cudaDeviceSynchronize());
            cr_assert_eq(sd_gemm_plans(g), plans, "%s: %s: %s made a new plan", LABEL, wn, again[v]);
            float *y = gbuf_read(&dy, ny);
            same_bits(fmt("%s: %s vs the first call", wn, again[v]), y, got, ny);
            free(y);
        }
        gbuf_done(&dw, "W");
        free(got); free(outs); free(rest);
    }
    CU(cudaDeviceSynchronize()); // sd_gemm_free waits for nothing
    sd_gemm_free(g);
    gbuf *all[] = {&dx, &dy, &dxs, &dxb};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) gbuf_done(all[i], "gemm buffer");
    free(w0); free(w16); free(wf); free(x); free(x16); free(xr); free(y0); free(ref); free(ref16); free(xs); free(xs16);
}

// ---------------------------------------------------------------------------- prefill: KDA
typedef struct { float *qkvc, *gate, *beta, *ring; } kconv_out;

// The kept raw rows of a piece of n tokens from t0 (sd_cuda_kda_prefill_ring: its last min(n, W−1))
// into a host ring.
static void ring_rows(float *ring, const float *qkv, int n_rows, int pos0, int t0, int n, int P, int W) {
    const int keep = n < W - 1 ? n : W - 1;
    for (int t = t0 + n - keep; t < t0 + n; t++)
        memcpy(ring + (size_t)((pos0 + t) % n_rows) * 3 * P, qkv + (size_t)t * 3 * P, sizeof(float) * 3 * P);
}

// The conv (a) then the ring write (b) on the device, as the prefill launches them, over the pieces
// [0, first) and [first, T) (first = T: one call); qkv read only.
static kconv_out kconv_on_device(const conv_in *in, const float *qkv, const float *A_log, const float *dt_bias,
                                 const float *gate, const float *beta, int ld_b, int first) {
    const int H = in->H, d = in->d, W = in->W, T = in->T, P = H * d;
    const size_t n3 = (size_t)T * 3 * P, nr = (size_t)in->n_rows * 3 * P, nP = (size_t)T * P, nb = (size_t)T * ld_b;
    gbuf dq = gbuf_of(qkv, n3), ring = gbuf_of(in->ring, nr), dc = gbuf_new(n3), dg = gbuf_of(gate, nP), db = gbuf_of(beta, nb);
    gbuf tq = gbuf_of(in->tq, (size_t)P * W), tk = gbuf_of(in->tk, (size_t)P * W), tv = gbuf_of(in->tv, (size_t)P * W);
    gbuf al = gbuf_of(A_log, H), dtb = gbuf_of(dt_bias, P);
    const int piece[2][2] = {{0, first}, {first, T - first}};
    for (int i = 0; i < 2; i++) {
        const int t0 = piece[i][0], n = piece[i][1];
        if (n < 1) continue;
        const size_t o3 = (size_t)t0 * 3 * P;
        OK(sd_cuda_kda_prefill_conv(dq.p + o3, ring.p, in->n_rows, in->pos0 + t0, n, H, d, W, tq.p, tk.p, tv.p, al.p, dtb.p,
                                    dg.p + (size_t)t0 * P, db.p + (size_t)t0 * ld_b, ld_b, dc.p + o3, 0, &st_));
        OK(sd_cuda_kda_prefill_ring(dq.p + o3, ring.p, in->n_rows, in->pos0 + t0, n, P, W, 0, &st_));
    }
    kconv_out o = {gbuf_read(&dc, n3), gbuf_read(&dg, nP), gbuf_read(&db, nb), gbuf_read(&ring, nr)};
    float *q_back = gbuf_read(&dq, n3);
    same_bits("qkv untouched", q_back, qkv, n3);
    free(q_back);
    gbuf *all[] = {&dq, &ring, &dc, &dg, &db, &tq, &tk, &tv, &al, &dtb};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) gbuf_done(all[i], "conv buffer");
    return o;
}
static void kconv_out_free(kconv_out *o) { free(o->qkvc); free(o->gate); free(o->beta); free(o->ring); }

// shape: H, d, W, T, pos0, n_rows, split, bpad. The conv then the ring write over T tokens at
// pos0 .. (the prefill's order: the history read before it is overwritten), qkv raw (T, 3P) rows, the
// ring holding earlier positions' rows: qkvc vs the conv twin above; the gate and β in place vs
// −exp(A_log)·softplus(gate + dt_bias) and sigmoid (TOL_ELEM); β's padding (ld_b = H + bpad) and the
// ring bitwise (the last min(T, W−1) raw rows at their positions, every other row as it was). With
// split: the same tokens as two pieces, split then T − split (the second's history from the first's
// ring rows), ≡ the one call, bitwise — a piece boundary changes nothing.
static void run_kda_prefill_conv(const op_case *c) {
    conv_in in = {.H = c->shape[0], .d = c->shape[1], .W = c->shape[2], .T = c->shape[3], .pos0 = c->shape[4],
                  .n_rows = c->shape[5]};
    const int H = in.H, d = in.d, W = in.W, T = in.T, P = H * d, split = c->shape[6], ld_b = H + c->shape[7];
    cr_assert(in.n_rows >= 1 && in.n_rows >= W - 1 && split < T, "%s: a ring of W − 1 rows at least", LABEL);
    const size_t n3 = (size_t)T * 3 * P, nr = (size_t)in.n_rows * 3 * P, nP = (size_t)T * P, nb = (size_t)T * ld_b;
    float *qkv = rand_host(n3, seed_of(0), 1.0f);
    in.ring = rand_host(nr, seed_of(1), 1.0f);
    in.tq = rand_host((size_t)P * W, seed_of(2), 1.0f / sqrtf((float)W));
    in.tk = rand_host((size_t)P * W, seed_of(3), 1.0f / sqrtf((float)W));
    in.tv = rand_host((size_t)P * W, seed_of(4), 1.0f / sqrtf((float)W));
    float *A_log = rand_in(H, seed_of(5), 0.0f, 1.0f), *dt_bias = rand_in(P, seed_of(6), -3.0f, -1.0f);
    float *gate = rand_host(nP, seed_of(7), 1.0f), *beta = rand_host(nb, seed_of(8), 2.0f);
    in.q = xmalloc(sizeof(float) * nP);
    in.k = xmalloc(sizeof(float) * nP);
    in.v = xmalloc(sizeof(float) * nP);
    float *out[3] = {xmalloc(sizeof(float) * nP), xmalloc(sizeof(float) * nP), xmalloc(sizeof(float) * nP)};
    float *fresh[3] = {in.q, in.k, in.v};
    for (int t = 0; t < T; t++)
        for (int which = 0; which < 3; which++)
            memcpy(fresh[which] + (size_t)t * P, qkv + (size_t)t * 3 * P + (size_t)which * P, sizeof(float) * P);
    conv_twin(&in, out[0], out[1], out[2]);
    float *ref_c = xmalloc(sizeof(float) * n3), *ref_g = xmalloc(sizeof(float) * nP), *ref_r = copy_floats(in.ring, nr);
    for (int t = 0; t < T; t++)
        for (int which = 0; which < 3; which++)
            memcpy(ref_c + (size_t)t * 3 * P + (size_t)which * P, out[which] + (size_t)t * P, sizeof(float) * P);
    for (size_t i = 0; i < nP; i++) {
        const int ch = (int)(i % P);
        ref_g[i] = -expf(A_log[ch / d]) * sd_softplus(gate[i] + dt_bias[ch]);
    }
    ring_rows(ref_r, qkv, in.n_rows, in.pos0, 0, T, P, W);
    float *ref_b = xmalloc(sizeof(float) * T * H), *got_b = xmalloc(sizeof(float) * T * H);
    for (int t = 0; t < T; t++)
        for (int h = 0; h < H; h++) ref_b[t * H + h] = sd_sigmoid(beta[(size_t)t * ld_b + h]);
    kconv_out all = kconv_on_device(&in, qkv, A_log, dt_bias, gate, beta, ld_b, T);
    compare(c, "qkvc (conv, silu, q and k unit per head)", all.qkvc, ref_c, n3);
    compare(c, "gate (the log decay)", all.gate, ref_g, nP);
    float *b_rest = copy_floats(beta, nb);
    for (int t = 0; t < T; t++)
        for (int h = 0; h < H; h++) got_b[t * H + h] = b_rest[(size_t)t * ld_b + h] = all.beta[(size_t)t * ld_b + h];
    compare(c, "beta (sigmoid)", got_b, ref_b, (size_t)T * H);
    same_bits("beta's padding columns untouched", all.beta, b_rest, nb);
    same_bits("ring rows", all.ring, ref_r, nr);
    if (split) {
        kconv_out two = kconv_on_device(&in, qkv, A_log, dt_bias, gate, beta, ld_b, split);
        float *ref_r2 = copy_floats(in.ring, nr);
        ring_rows(ref_r2, qkv, in.n_rows, in.pos0, 0, split, P, W);
        ring_rows(ref_r2, qkv, in.n_rows, in.pos0, split, T - split, P, W);
        same_bits(fmt("qkvc: pieces of %d and %d vs one call", split, T - split), two.qkvc, all.qkvc, n3);
        same_bits("gate: two pieces vs one call", two.gate, all.gate, nP);
        same_bits("beta: two pieces vs one call", two.beta, all.beta, nb);
        same_bits("ring rows after two pieces", two.ring, ref_r2, nr);
        kconv_out_free(&two);
        free(ref_r2);
    }
    kconv_out_free(&all);
    for (int i = 0; i < 3; i++) free(out[i]);
    free(qkv); free(in.ring); free(in.tq); free(in.tk); free(in.tv); free(in.q); free(in.k); free(in.v);
    free(A_log); free(dt_bias); free(gate); free(beta); free(ref_c); free(ref_g); free(ref_r); free(ref_b); free(got_b);
    free(b_rest);
}

// shape: H, d, T, ypad (ld_y = P + ypad), weak (log decays g in [-0.05, -1e-4): long memory; else
// [-1, -1e-3)). Inputs as the prefill lays them out: q, k, v the conv's rows (ld 3P; q, k unit per
// head), g (ld P), β post-sigmoid (ld_b = H rounded up to 4, the padding junk). y and the state vs
// the CPU's chunked form (sd_kda_chunk_head) and the token recurrence (sd_kda_step), TOL_CHUNK; y's
// padding and S_in (out of place) untouched; then in place (S_out = S_in) ≡ out of place, bitwise.
static void run_kda_chunk(const op_case *c) {
    const int H = c->shape[0], d = c->shape[1], T = c->shape[2], weak = c->shape[4], P = H * d;
    const int ld_y = P + c->shape[3], ld_b = (H + 3) / 4 * 4;
    const size_t n3 = (size_t)T * 3 * P, nP = (size_t)T * P, nS = (size_t)H * d * d, ny = (size_t)T * ld_y;
    float *qkv = rand_host(n3, seed_of(0), 1.0f);
    for (int t = 0; t < T; t++) unit_heads(qkv + (size_t)t * 3 * P, 2, H, d); // the row's q heads, then its k heads
    float *g = rand_in(nP, seed_of(1), weak ? -0.05f : -1.0f, weak ? -1e-4f : -1e-3f);
    float *beta = rand_in((size_t)T * ld_b, seed_of(2), 0.05f, 0.95f), *S0 = rand_host(nS, seed_of(3), 0.2f);
    // The CPU forms, q, k, v in rows of P.
    float *qkv_cpu[3] = {xmalloc(sizeof(float) * nP), xmalloc(sizeof(float) * nP), xmalloc(sizeof(float) * nP)};
    for (int t = 0; t < T; t++)
        for (int which = 0; which < 3; which++)
            memcpy(qkv_cpu[which] + (size_t)t * P, qkv + (size_t)t * 3 * P + (size_t)which * P, sizeof(float) * P);
    const float *q = qkv_cpu[0], *k = qkv_cpu[1], *v = qkv_cpu[2];
    float *y_chunk = xmalloc(sizeof(float) * nP), *y_tok = xmalloc(sizeof(float) * nP), *S_chunk = copy_floats(S0, nS);
    float *S_tok = xmalloc(sizeof(float) * nS), *Sa = xmalloc(sizeof(float) * d * d), *Sb = xmalloc(sizeof(float) * d * d);
    float *work = xmalloc(sizeof(float) * sd_kda_chunk_work_floats(d, SD_KDA_CHUNK));
    for (int h = 0; h < H; h++) {
        const size_t o = (size_t)h * d;
        sd_kda_chunk_head(S_chunk + o * d, q + o, k + o, v + o, g + o, beta + h, T, d, SD_KDA_CHUNK, P, ld_b, y_chunk + o, work);
        memcpy(Sa, S0 + o * d, sizeof(float) * d * d);
        for (int t = 0; t < T; t++) {
            const size_t r = (size_t)t * P + o;
            sd_kda_step(Sa, Sb, q + r, k + r, v + r, g + r, beta[(size_t)t * ld_b + h], d, y_tok + r);
            float *tmp = Sa; Sa = Sb; Sb = tmp;
        }
        memcpy(S_tok + o * d, Sa, sizeof(float) * d * d);
    }
    float *got_y[2], *got_S[2];
    for (int in_place = 0; in_place < 2; in_place++) {
        gbuf dq = gbuf_of(qkv, n3), dg = gbuf_of(g, nP), db = gbuf_of(beta, (size_t)T * ld_b), dS = gbuf_of(S0, nS);
        gbuf dSo = gbuf_new(nS), dy = gbuf_new(ny), dw = gbuf_new(sd_cuda_kda_chunk_work_floats(T, H, d));
        float *S_out = in_place ? dS.p : dSo.p;
        OK(sd_cuda_kda_chunk(dq.p, dq.p + P, dq.p + 2 * P, 3 * P, dg.p, P, db.p, ld_b, T, H, d, dS.p, S_out, dy.p, ld_y, dw.p, 0,
                             &st_));
        uint32_t *yw = gbuf_read(&dy, ny), *y_rest = xmalloc(4 * ny);
        got_y[in_place] = xmalloc(sizeof(float) * nP);
        for (size_t i = 0; i < ny; i++) y_rest[i] = SENTINEL;
        for (int t = 0; t < T; t++) {
            memcpy(got_y[in_place] + (size_t)t * P, yw + (size_t)t * ld_y, sizeof(float) * P);
            memcpy(y_rest + (size_t)t * ld_y, yw + (size_t)t * ld_y, sizeof(float) * P);
        }
        same_bits("y's padding columns untouched", yw, y_rest, ny);
        got_S[in_place] = gbuf_read(in_place ? &dS : &dSo, nS);
        if (!in_place) {
            compare(c, "y vs the CPU chunked form", got_y[0], y_chunk, nP);
            compare(c, "y vs the token recurrence", got_y[0], y_tok, nP);
            compare(c, "state vs the CPU chunked form", got_S[0], S_chunk, nS);
            compare(c, "state vs the token recurrence", got_S[0], S_tok, nS);
            float *S_in = gbuf_read(&dS, nS);
            same_bits("S_in untouched (out of place)", S_in, S0, nS);
            free(S_in);
        }
        gbuf *all[] = {&dq, &dg, &db, &dS, &dSo, &dy, &dw};
        for (size_t i = 0; i < sizeof all / sizeof *all; i++) gbuf_done(all[i], "chunk buffer");
        free(yw); free(y_rest);
    }
    same_bits("y: in place vs out of place", got_y[1], got_y[0], nP);
    same_bits("state: in place vs out of place", got_S[1], got_S[0], nS);
    for (int i = 0; i < 3; i++) free(qkv_cpu[i]);
    for (int i = 0; i < 2; i++) { free(got_y[i]); free(got_S[i]); }
    free(qkv); free(g); free(beta); free(S0); free(y_chunk); free(y_tok); free(S_chunk); free(S_tok); free(Sa); free(Sb);
    free(work);
}

// shape: T, H, d. Both outputs: f32 vs sd_rmsnorm per head ⊙ sd_sigmoid(gb) (TOL_ELEM); bf16 the
// f32 output rounded, bitwise (one kernel and expression, the store apart), and vs the CPU
// (TOL_BF16); y, gb untouched.
static void run_kda_prefill_out(const op_case *c) {
    const int T = c->shape[0], H = c->shape[1], d = c->shape[2];
    const size_t nY = (size_t)T * H * d;
    const float eps = 1e-5f;
    float *y = rand_host(nY, seed_of(0), 1.0f), *gb = rand_host(nY, seed_of(1), 2.0f), *w = rand_in(d, seed_of(2), 0.5f, 1.5f);
    float *ref = xmalloc(sizeof(float) * nY);
    for (size_t o = 0; o < nY; o += d) {
        sd_rmsnorm(y + o, w, d, eps, ref + o);
        for (int j = 0; j < d; j++) ref[o + j] *= sd_sigmoid(gb[o + j]);
    }
    gbuf dy = gbuf_of(y, nY), dgb = gbuf_of(gb, nY), dw = gbuf_of(w, d), o32 = gbuf_new(nY), o16 = gbuf_halves(NULL, nY);
    OK(sd_cuda_kda_prefill_out(dy.p, dgb.p, dw.p, eps, T, H, d, o32.p, false, 0, &st_));
    OK(sd_cuda_kda_prefill_out(dy.p, dgb.p, dw.p, eps, T, H, d, o16.p, true, 0, &st_));
    float *got = gbuf_read(&o32, nY), *y_back = gbuf_read(&dy, nY), *gb_back = gbuf_read(&dgb, nY);
    compare(c, "out (f32)", got, ref, nY);
    uint16_t *want16 = bf16_of(got, nY), *got16 = read_halves(&o16, nY);
    check_halves("out (bf16): the f32 output rounded", got16, want16, nY);
    float *wide = widen_bf16(got16, nY);
    check_close(TOL_BF16, "out (bf16) vs the CPU", wide, ref, nY);
    same_bits("y untouched", y_back, y, nY);
    same_bits("gb untouched", gb_back, gb, nY);
    gbuf *all[] = {&dy, &dgb, &dw, &o32, &o16};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) gbuf_done(all[i], "out buffer");
    free(y); free(gb); free(w); free(ref); free(got); free(y_back); free(gb_back); free(want16); free(got16); free(wide);
}

// ---------------------------------------------------------------------------- prefill: MLA
// shape: T, Hm, dn, dr, R, pos0, rope, shared (the prefill's layout: kv inside the query rows at
// Hm·(dn+dr), one row stride for both; else two buffers). Cache rows pos0 .. pos0+T−1: c vs sd_rmsnorm
// (TOL_ELEM) and bitwise sd_cuda_rmsnorm of the same rows (mla_prefill.h: the decode path's norm); kpe
// the rope key, with rope rotated vs the twin above (TOL_ELEM; an odd dr's last entry has no pair and
// is copied, as engine/cpu/mla.c and kernels/mla.cu do), else copied (bitwise); with rope every head's
// rope part of mq rotated in place (TOL_ELEM); every other value of mq, kv and the cache as it was.
static void run_mla_prefill_cache(const op_case *c) {
    const int T = c->shape[0], Hm = c->shape[1], dn = c->shape[2], dr = c->shape[3], R = c->shape[4], pos0 = c->shape[5];
    const bool rope = c->shape[6] != 0, shared = c->shape[7] != 0;
    const int qw = dn + dr, Nq = Hm * qw, cap = pos0 + T + 1; // one cache row past the call's
    const int ld_mq = shared ? Nq + R + dr + 3 : Nq + 5, ld_kv = shared ? ld_mq : R + dr + 2;
    const size_t nm = (size_t)T * ld_mq, nkv = (size_t)T * ld_kv, nc = (size_t)cap * R, nk = (size_t)cap * dr;
    const double theta = 50000.0;
    const float eps = 1e-5f;
    float *mq = rand_host(nm, seed_of(0), 1.0f), *kvs = shared ? NULL : rand_host(nkv, seed_of(1), 1.0f);
    const float *kv = shared ? mq + Nq : kvs;
    float *kvn = rand_in(R, seed_of(2), 0.5f, 1.5f), *cc = rand_host(nc, seed_of(3), 1.0f), *kpe = rand_host(nk, seed_of(4), 1.0f);
    float *ref_c = copy_floats(cc, nc), *ref_k = copy_floats(kpe, nk), *ref_m = copy_floats(mq, nm);
    for (int t = 0; t < T; t++) {
        const int pos = pos0 + t;
        const float *kvt = kv + (size_t)t * ld_kv;
        sd_rmsnorm(kvt, kvn, R, eps, ref_c + (size_t)pos * R);
        memcpy(ref_k + (size_t)pos * dr, kvt + R, sizeof(float) * dr);
        if (!rope) continue;
        rope_twin(ref_k + (size_t)pos * dr, dr, pos, theta);
        for (int h = 0; h < Hm; h++) rope_twin(ref_m + (size_t)t * ld_mq + (size_t)h * qw + dn, dr, pos, theta);
    }
    gbuf dm = gbuf_of(mq, nm), dkv = shared ? dm : gbuf_of(kvs, nkv), dnw = gbuf_of(kvn, R), dc = gbuf_of(cc, nc);
    gbuf dk = gbuf_of(kpe, nk), dnorm = gbuf_new((size_t)T * R);
    const float *kv_dev = shared ? dm.p + Nq : dkv.p;
    OK(sd_cuda_mla_prefill_cache(kv_dev, ld_kv, dnw.p, eps, rope, theta, pos0, T, Hm, dn, dr, R, dm.p, ld_mq, dc.p, dk.p, 0,
                                 &st_));
    for (int t = 0; t < T; t++) // the decode path's norm of the same rows (the cache write leaves them as they were)
        OK(sd_cuda_rmsnorm(kv_dev + (size_t)t * ld_kv, dnw.p, 1, R, eps, dnorm.p + (size_t)t * R, 0, &st_));
    float *got_m = gbuf_read(&dm, nm), *got_c = gbuf_read(&dc, nc), *got_k = gbuf_read(&dk, nk);
    float *norm = gbuf_read(&dnorm, (size_t)T * R);
    const size_t c0 = (size_t)pos0 * R, k0 = (size_t)pos0 * dr;
    compare(c, "latent rows c of the call", got_c + c0, ref_c + c0, (size_t)T * R);
    same_bits("latent rows: bitwise sd_cuda_rmsnorm's", got_c + c0, norm, (size_t)T * R);
    float *c_rest = copy_floats(cc, nc);
    memcpy(c_rest + c0, got_c + c0, sizeof(float) * T * R);
    same_bits("latent rows outside the call untouched", got_c, c_rest, nc);
    if (rope) {
        compare(c, "rope key rows of the call (rotated)", got_k + k0, ref_k + k0, (size_t)T * dr);
        float *k_rest = copy_floats(kpe, nk), *rot = xmalloc(sizeof(float) * T * Hm * dr), *rot_ref = xmalloc(sizeof(float) * T * Hm * dr);
        float *m_rest = copy_floats(mq, nm);
        memcpy(k_rest + k0, got_k + k0, sizeof(float) * T * dr);
        same_bits("rope key rows outside the call untouched", got_k, k_rest, nk);
        for (int t = 0; t < T; t++)
            for (int h = 0; h < Hm; h++) {
                const size_t o = (size_t)t * ld_mq + (size_t)h * qw + dn, r = ((size_t)t * Hm + h) * dr;
                memcpy(rot + r, got_m + o, sizeof(float) * dr);
                memcpy(rot_ref + r, ref_m + o, sizeof(float) * dr);
                memcpy(m_rest + o, got_m + o, sizeof(float) * dr);
            }
        compare(c, "queries' rope parts (rotated in place)", rot, rot_ref, (size_t)T * Hm * dr);
        same_bits(shared ? "query rows outside the rope parts (the kv columns too) untouched"
                         : "query rows outside the rope parts untouched", got_m, m_rest, nm);
        free(k_rest); free(rot); free(rot_ref); free(m_rest);
    } else {
        same_bits("rope key cache (the call's rows copied)", got_k, ref_k, nk);
        same_bits("query rows untouched without RoPE", got_m, mq, nm);
    }
    if (!shared) {
        float *kv_back = gbuf_read(&dkv, nkv);
        same_bits("kv untouched", kv_back, kvs, nkv);
        free(kv_back);
        gbuf_done(&dkv, "kv");
    }
    gbuf *all[] = {&dm, &dnw, &dc, &dk, &dnorm};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) gbuf_done(all[i], "cache buffer");
    free(mq); free(kvs); free(kvn); free(cc); free(kpe); free(ref_c); free(ref_k); free(ref_m);
    free(got_m); free(got_c); free(got_k); free(norm); free(c_rest);
}

// shape: T, Hm, dn, dr, R, pos0, mqpad. The keys of pos0 + T cache rows and the T·Hm queries (q̃ from
// qabs, the rope part from mq rows of Hm·(dn+dr) + mqpad) packed to sd_mla_packed_width (R + dr up to
// a multiple of 16): bitwise vs the host's rounding, zeros past R + dr, nothing past the rows.
static void run_mla_pack(const op_case *c) {
    const int T = c->shape[0], Hm = c->shape[1], dn = c->shape[2], dr = c->shape[3], R = c->shape[4], pos0 = c->shape[5];
    const int ld_mq = Hm * (dn + dr) + c->shape[6], W = sd_mla_packed_width(R, dr), n = pos0 + T, nq = T * Hm;
    cr_assert_eq(W, (R + dr + 15) / 16 * 16, "%s: packed width %d", LABEL, W);
    float *cc = rand_host((size_t)n * R, seed_of(0), 1.0f), *kpe = rand_host((size_t)n * dr, seed_of(1), 1.0f);
    float *qabs = rand_host((size_t)nq * R, seed_of(2), 3.0f), *mq = rand_host((size_t)T * ld_mq, seed_of(3), 1.0f);
    uint16_t *wk = xmalloc(2 * (size_t)n * W), *wq = xmalloc(2 * (size_t)nq * W);
    for (int j = 0; j < n; j++)
        for (int col = 0; col < W; col++)
            wk[(size_t)j * W + col] = sd_f32_to_bf16(col < R ? cc[(size_t)j * R + col] : col < R + dr ? kpe[(size_t)j * dr + col - R] : 0.0f);
    for (int r = 0; r < nq; r++) {
        const float *rope_part = mq + (size_t)(r / Hm) * ld_mq + (size_t)(r % Hm) * (dn + dr) + dn;
        for (int col = 0; col < W; col++)
            wq[(size_t)r * W + col] = sd_f32_to_bf16(col < R ? qabs[(size_t)r * R + col] : col < R + dr ? rope_part[col - R] : 0.0f);
    }
    gbuf dc = gbuf_of(cc, (size_t)n * R), dkpe = gbuf_of(kpe, (size_t)n * dr), dqa = gbuf_of(qabs, (size_t)nq * R);
    gbuf dmq = gbuf_of(mq, (size_t)T * ld_mq), dkp = gbuf_halves(NULL, (size_t)n * W), dqp = gbuf_halves(NULL, (size_t)nq * W);
    OK(sd_cuda_mla_pack_keys(dc.p, dkpe.p, n, R, dr, (uint16_t *)dkp.p, 0, &st_));
    OK(sd_cuda_mla_pack_queries(dqa.p, dmq.p, ld_mq, T, Hm, dn, dr, R, (uint16_t *)dqp.p, 0, &st_));
    same_halves(fmt("packed keys (%d rows of %d)", n, W), &dkp, wk, (size_t)n * W);
    same_halves(fmt("packed queries (%d rows of %d)", nq, W), &dqp, wq, (size_t)nq * W);
    gbuf *all[] = {&dc, &dkpe, &dqa, &dmq, &dkp, &dqp};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) gbuf_done(all[i], "pack buffer");
    free(cc); free(kpe); free(qabs); free(mq); free(wk); free(wq);
}

// shape: T, Hm, R, dr, pos0, dn (the scale (dn + dr)^-½). Packed bf16 rows of random values (zeros
// past R + dr, as the packing leaves them), 64 rows of NaN past the last key and the last query,
// which the kernel must never read: lat vs the float64 causal softmax over the same bf16 values
// (TOL_BF16: the probabilities enter P·V rounded to bf16); the same call again, the same bits.
static void run_mla_flash(const op_case *c) {
    const int T = c->shape[0], Hm = c->shape[1], R = c->shape[2], dr = c->shape[3], pos0 = c->shape[4], dn = c->shape[5];
    const int W = sd_mla_packed_width(R, dr), nq = T * Hm, nk = pos0 + T, junk = 64;
    const float scale = 1.0f / sqrtf((float)(dn + dr));
    const size_t aq = (size_t)(nq + junk) * W, ak = (size_t)(nk + junk) * W, nl = (size_t)nq * R;
    float *qf = rand_host(aq, seed_of(0), 1.0f), *kf = rand_host(ak, seed_of(1), 1.0f);
    uint16_t *qb = xmalloc(2 * aq), *kb = xmalloc(2 * ak);
    for (size_t i = 0; i < aq; i++) qb[i] = i >= (size_t)nq * W ? 0x7fc0u : (int)(i % W) < R + dr ? sd_f32_to_bf16(qf[i]) : 0;
    for (size_t i = 0; i < ak; i++) kb[i] = i >= (size_t)nk * W ? 0x7fc0u : (int)(i % W) < R + dr ? sd_f32_to_bf16(kf[i]) : 0;
    float *ref = xmalloc(sizeof(float) * nl);
    double *p = xmalloc(sizeof(double) * nk), *acc = xmalloc(sizeof(double) * R);
    for (int r = 0; r < nq; r++) {
        const int lim = pos0 + r / Hm;
        double mx = -INFINITY, sum = 0;
        for (int j = 0; j <= lim; j++) {
            double s = 0;
            for (int i = 0; i < R + dr; i++) s += (double)sd_bf16_to_f32(qb[(size_t)r * W + i]) * sd_bf16_to_f32(kb[(size_t)j * W + i]);
            p[j] = s * scale;
            if (p[j] > mx) mx = p[j];
        }
        for (int v = 0; v < R; v++) acc[v] = 0;
        for (int j = 0; j <= lim; j++) {
            p[j] = exp(p[j] - mx);
            sum += p[j];
            for (int v = 0; v < R; v++) acc[v] += p[j] * sd_bf16_to_f32(kb[(size_t)j * W + v]);
        }
        for (int v = 0; v < R; v++) ref[(size_t)r * R + v] = (float)(acc[v] / sum);
    }
    gbuf dq = gbuf_halves(qb, aq), dk = gbuf_halves(kb, ak), dl = gbuf_new(nl);
    OK(sd_cuda_mla_flash((const uint16_t *)dq.p, (const uint16_t *)dk.p, T, Hm, R, dr, pos0, scale, dl.p, 0, &st_));
    float *got = gbuf_read(&dl, nl);
    compare(c, "lat", got, ref, nl);
    OK(sd_cuda_mla_flash((const uint16_t *)dq.p, (const uint16_t *)dk.p, T, Hm, R, dr, pos0, scale, dl.p, 0, &st_));
    float *again = gbuf_read(&dl, nl);
    same_bits("lat: the same call again", again, got, nl);
    gbuf_done(&dq, "packed queries");
    gbuf_done(&dk, "packed keys");
    gbuf_done(&dl, "lat");
    free(qf); free(kf); free(qb); free(kb); free(ref); free(p); free(acc); free(got); free(again);
}

// ---------------------------------------------------------------------------- prefill: MoE
static int by_value(const void *a, const void *b) {
    const float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}
// The smallest difference between any two of v[0..n) (sorts v).
static double min_gap(float *v, int n) {
    qsort(v, (size_t)n, sizeof *v, by_value);
    double gap = INFINITY;
    for (int i = 1; i < n; i++) gap = fmin(gap, (double)v[i] - v[i - 1]);
    return gap;
}
// Whether the CPU's routing of one token's logits is clear: its biased scores s' (sd_moe_route's)
// and, with groups, the groups' top-2 sums pairwise at least 4e-6 apart — beyond the couple of ulps
// (≤ 2.4e-7 in s, twice that in a sum) the device's expf may move them — so the device must pick the
// CPU's experts in the CPU's order.
static bool route_is_clear(const float *logit, const float *bias, int E, int G) {
    float *sp = xmalloc(sizeof(float) * E), *sorted = xmalloc(sizeof(float) * E), *gs = xmalloc(sizeof(float) * G);
    for (int e = 0; e < E; e++) sorted[e] = sp[e] = sd_sigmoid(logit[e]) + bias[e];
    bool clear = min_gap(sorted, E) >= 4e-6;
    if (G > 1) {
        const int per = E / G;
        for (int g = 0; g < G; g++) {
            const float *v = sp + g * per;
            float top = v[0] > v[1] ? v[0] : v[1], second = v[0] > v[1] ? v[1] : v[0];
            for (int i = 2; i < per; i++) {
                if (v[i] > top) { second = top; top = v[i]; }
                else if (v[i] > second) second = v[i];
            }
            gs[g] = top + second;
        }
        clear = clear && min_gap(gs, G) >= 4e-6;
    }
    free(sp); free(sorted); free(gs);
    return clear;
}

// shape: E, K, G, topk_group, T, tie, plain (no renormalisation, scaling 1). sel bitwise and w
// (TOL_ELEM: the device's expf in the sigmoid) vs sd_moe_route of the same logits (an identity
// router: each score is its logit exactly), every token's routing clear (route_is_clear; a token is
// drawn again until it is). With tie (G = 1, bias 0) each token puts K−1 experts at one logit and two
// more at a lower one, across the K-th place — equal inputs, equal scores on both sides, so the lower
// index must win — and the rest far below.
static void run_moe_prefill_select(const op_case *c) {
    const int E = c->shape[0], K = c->shape[1], G = c->shape[2], topk = c->shape[3], T = c->shape[4], tie = c->shape[5];
    const bool renorm = c->shape[6] == 0;
    const float scaling = renorm ? 2.446f : 1.0f;
    sd_config cfg = {.hidden_size = E, .num_experts = E, .num_experts_per_token = K, .num_expert_group = G,
                     .topk_group = topk, .moe_renormalize = renorm, .routed_scaling_factor = scaling};
    float *bias = rand_host(E, seed_of(0), 0.1f), *logits = xmalloc(sizeof(float) * T * E);
    int *perm = xmalloc(sizeof(int) * E);
    if (tie) {
        cr_assert(G == 1 && E > K, "%s: ties need one group and E > K", LABEL);
        memset(bias, 0, sizeof(float) * E);
    }
    uint64_t r = seed_of(1);
    for (int t = 0; t < T; t++) {
        float *l = logits + (size_t)t * E;
        for (int attempt = 0;; attempt++) {
            cr_assert(attempt < 10000, "%s: token %d: no clear routing drawn", LABEL, t);
            float *f = rand_host(E, seed_of(2 + t + T * attempt), tie ? 2.0f : 2.5f);
            memcpy(l, f, sizeof(float) * E);
            free(f);
            if (tie || route_is_clear(l, bias, E, G)) break;
        }
        if (!tie) continue;
        for (int e = 0; e < E; e++) perm[e] = e;
        for (int j = 0; j <= K; j++) { // K + 1 distinct experts in a random order
            const int i = j + rng_int(&r, E - j), s = perm[i];
            perm[i] = perm[j];
            perm[j] = s;
        }
        for (int j = 0; j < K - 1; j++) l[perm[j]] = 6.0f;
        l[perm[K - 1]] = l[perm[K]] = 5.0f;
    }
    float *eye = calloc((size_t)E * E, sizeof(float));
    for (int e = 0; e < E; e++) eye[(size_t)e * E + e] = 1.0f;
    const sd_moe_weights mw = {.router = eye, .bias = bias};
    int *sel = xmalloc(sizeof(int) * T * K);
    float *w = xmalloc(sizeof(float) * T * K);
    for (int t = 0; t < T; t++) sd_moe_route(&mw, &cfg, logits + (size_t)t * E, sel + t * K, w + t * K);
    gbuf dl = gbuf_of(logits, (size_t)T * E), db = gbuf_of(bias, E), dsel = gbuf_new((size_t)T * K), dw = gbuf_new((size_t)T * K);
    OK(sd_cuda_moe_prefill_select(dl.p, db.p, T, E, K, G, topk, renorm, scaling, IP(dsel), dw.p, 0, &st_));
    int *got_sel = gbuf_read(&dsel, (size_t)T * K);
    float *got_w = gbuf_read(&dw, (size_t)T * K);
    same_bits("sel", got_sel, sel, (size_t)T * K);
    compare(c, "w", got_w, w, (size_t)T * K);
    gbuf *all[] = {&dl, &db, &dsel, &dw};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) gbuf_done(all[i], "select buffer");
    free(bias); free(logits); free(perm); free(eye); free(sel); free(w); free(got_sel); free(got_w);
}

// K distinct experts of E for each of T tokens, in a random order.
static int *random_sel(int T, int K, int E, uint64_t seed) {
    int *sel = xmalloc(sizeof(int) * T * K), *perm = xmalloc(sizeof(int) * E);
    uint64_t r = seed;
    for (int t = 0; t < T; t++) {
        for (int e = 0; e < E; e++) perm[e] = e;
        for (int j = 0; j < K; j++) {
            const int i = j + rng_int(&r, E - j), s = perm[i];
            perm[i] = perm[j];
            perm[j] = s;
            sel[t * K + j] = s;
        }
    }
    free(perm);
    return sel;
}

// shape: E, K, T. sel: K distinct experts a token, at random (so some experts have none). counts vs
// the host's count; then, the offsets their exclusive prefix sum, row_tok and inv vs the grouping
// of sd_cuda_moe_groups_host (experts ascending, each expert's entries in (token, slot) order — the
// decode path's): entry p of it is row p. All bitwise.
static void run_moe_prefill_group(const op_case *c) {
    const int E = c->shape[0], K = c->shape[1], T = c->shape[2], n = T * K, gc = n < E ? n : E;
    int *sel = random_sel(T, K, E, seed_of(0)), *counts = calloc((size_t)E, sizeof(int)), *offsets = xmalloc(sizeof(int) * E);
    for (int i = 0; i < n; i++) counts[sel[i]]++;
    for (int e = 0, acc = 0; e < E; acc += counts[e], e++) offsets[e] = acc;
    int *groups = xmalloc(sizeof(int) * sd_cuda_moe_groups_ints(T, K, E));
    sd_cuda_moe_groups_host(sel, T, K, E, groups);
    const int *ent = groups + 2 + 2 * gc; // entry p of the grouping: t·K + j
    int *row_tok = xmalloc(sizeof(int) * n), *inv = xmalloc(sizeof(int) * n);
    for (int p = 0; p < n; p++) {
        row_tok[p] = ent[p] / K;
        inv[ent[p]] = p;
    }
    gbuf dsel = gbuf_of(sel, n), dcounts = gbuf_new(E), doff = gbuf_of(offsets, E), drow = gbuf_new(n), dinv = gbuf_new(n);
    OK(sd_cuda_moe_prefill_count(IP(dsel), n, E, IP(dcounts), 0, &st_));
    OK(sd_cuda_moe_prefill_scatter(IP(dsel), n, K, E, IP(doff), IP(drow), IP(dinv), 0, &st_));
    int *got_c = gbuf_read(&dcounts, E), *got_r = gbuf_read(&drow, n), *got_i = gbuf_read(&dinv, n);
    compare(c, "counts", got_c, counts, E);
    compare(c, "row_tok", got_r, row_tok, n);
    compare(c, "inv", got_i, inv, n);
    gbuf *all[] = {&dsel, &dcounts, &doff, &drow, &dinv};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) gbuf_done(all[i], "grouping buffer");
    free(sel); free(counts); free(offsets); free(groups); free(row_tok); free(inv); free(got_c); free(got_r); free(got_i);
}

// shape: n, D, ldpad, T (x's rows, ld D + ldpad). rows: random in [0, T), with the first and the last
// row and a repeat; out = x[rows] as f32 (an exact copy) and as bf16 (nearest even), both bitwise,
// nothing past the n rows written.
static void run_gather_rows(const op_case *c) {
    const int n = c->shape[0], D = c->shape[1], ld_x = D + c->shape[2], T = c->shape[3];
    const size_t nx = (size_t)T * ld_x, no = (size_t)n * D;
    float *x = rand_host(nx, seed_of(0), 2.0f), *want = xmalloc(sizeof(float) * no);
    int *rows = xmalloc(sizeof(int) * n);
    uint64_t r = seed_of(1);
    for (int i = 0; i < n; i++) rows[i] = rng_int(&r, T);
    rows[0] = T - 1;
    if (n > 1) rows[1] = 0;
    if (n > 2) rows[2] = rows[n - 1];
    for (int i = 0; i < n; i++) memcpy(want + (size_t)i * D, x + (size_t)rows[i] * ld_x, sizeof(float) * D);
    uint16_t *want16 = bf16_of(want, no);
    gbuf dx = gbuf_of(x, nx), drows = gbuf_of(rows, n), o32 = gbuf_new(no), o16 = gbuf_halves(NULL, no);
    OK(sd_cuda_gather_rows(dx.p, ld_x, IP(drows), n, D, o32.p, false, 0, &st_));
    OK(sd_cuda_gather_rows(dx.p, ld_x, IP(drows), n, D, o16.p, true, 0, &st_));
    float *got = gbuf_read(&o32, no);
    compare(c, "out (f32)", got, want, no);
    same_halves("out (bf16)", &o16, want16, no);
    gbuf *all[] = {&dx, &drows, &o32, &o16};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) gbuf_done(all[i], "gather buffer");
    free(x); free(want); free(rows); free(want16); free(got);
}

// shape: n, I. h rows (2I: gate·x, then up·x); out f32 vs sd_silu(gate)·up (TOL_ELEM), bf16 the
// f32 output rounded, bitwise, and vs the CPU (TOL_BF16); h untouched.
static void run_swiglu_rows(const op_case *c) {
    const int n = c->shape[0], I = c->shape[1];
    const size_t nh = (size_t)n * 2 * I, no = (size_t)n * I;
    float *h = rand_host(nh, seed_of(0), 4.0f), *ref = xmalloc(sizeof(float) * no);
    for (int r = 0; r < n; r++)
        for (int i = 0; i < I; i++) ref[(size_t)r * I + i] = sd_silu(h[(size_t)r * 2 * I + i]) * h[(size_t)r * 2 * I + I + i];
    gbuf dh = gbuf_of(h, nh), o32 = gbuf_new(no), o16 = gbuf_halves(NULL, no);
    OK(sd_cuda_swiglu_rows(dh.p, n, I, o32.p, false, 0, &st_));
    OK(sd_cuda_swiglu_rows(dh.p, n, I, o16.p, true, 0, &st_));
    float *got = gbuf_read(&o32, no), *h_back = gbuf_read(&dh, nh);
    compare(c, "out (f32)", got, ref, no);
    uint16_t *want16 = bf16_of(got, no), *got16 = read_halves(&o16, no);
    check_halves("out (bf16): the f32 output rounded", got16, want16, no);
    float *wide = widen_bf16(got16, no);
    check_close(TOL_BF16, "out (bf16) vs the CPU", wide, ref, no);
    same_bits("h untouched", h_back, h, nh);
    gbuf *all[] = {&dh, &o32, &o16};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) gbuf_done(all[i], "swiglu buffer");
    free(h); free(ref); free(got); free(h_back); free(want16); free(got16); free(wide);
}

// shape: T, K, D, shared. y: the T·K grouped rows, inv a random permutation (entry → row), w, x the
// residual stream: x[t] += Σ_j w·y[inv] (+ shared[t]) vs the CPU's order (engine/cpu/moe.c: the slots
// from j = 0, then the shared expert's row, then the residual add), bitwise — neither side contracts
// a multiply-add (--fmad=false, -ffp-contract=off).
static void run_moe_prefill_combine(const op_case *c) {
    const int T = c->shape[0], K = c->shape[1], D = c->shape[2], with_shared = c->shape[3], n = T * K;
    float *y = rand_host((size_t)n * D, seed_of(0), 1.0f), *w = rand_in((size_t)n, seed_of(1), 0.05f, 0.6f);
    float *sh = rand_host((size_t)T * D, seed_of(2), 1.0f), *x = rand_host((size_t)T * D, seed_of(3), 1.0f);
    int *inv = xmalloc(sizeof(int) * n);
    uint64_t r = seed_of(4);
    for (int i = 0; i < n; i++) inv[i] = i;
    for (int i = n - 1; i > 0; i--) {
        const int j = rng_int(&r, i + 1), s = inv[i];
        inv[i] = inv[j];
        inv[j] = s;
    }
    float *ref = copy_floats(x, (size_t)T * D);
    for (int t = 0; t < T; t++)
        for (int i = 0; i < D; i++) {
            float acc = 0.0f;
            for (int j = 0; j < K; j++) acc += w[t * K + j] * y[(size_t)inv[t * K + j] * D + i];
            if (with_shared) acc += sh[(size_t)t * D + i];
            ref[(size_t)t * D + i] += acc;
        }
    gbuf dy = gbuf_of(y, (size_t)n * D), dinv = gbuf_of(inv, n), dw = gbuf_of(w, n), dsh = gbuf_of(sh, (size_t)T * D);
    gbuf dx = gbuf_of(x, (size_t)T * D);
    OK(sd_cuda_moe_prefill_combine(dy.p, IP(dinv), dw.p, with_shared ? dsh.p : NULL, T, K, D, dx.p, 0, &st_));
    float *got = gbuf_read(&dx, (size_t)T * D);
    compare(c, with_shared ? "x (+ the shared expert's rows)" : "x (no shared expert)", got, ref, (size_t)T * D);
    gbuf *all[] = {&dy, &dinv, &dw, &dsh, &dx};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) gbuf_done(all[i], "combine buffer");
    free(y); free(w); free(sh); free(x); free(inv); free(ref); free(got);
}


// ---------------------------------------------------------------------------- the table
// Tolerances: the TOL_* above (their reasons stand there); a case's other comparisons name theirs.
static const op_case CASES[] = {
    // Linear (TOL_DOT); a token alone ≡ inside the call, bitwise.
    {.op = "sd_cuda_linear", .run = run_linear, .shape = {64, 32, 1}, .dt = SD_DT_F32, .tol = TOL_DOT},
    {.op = "sd_cuda_linear", .run = run_linear, .shape = {37, 40, 5}, .dt = SD_DT_BF16, .tol = TOL_DOT},
    {.op = "sd_cuda_linear", .run = run_linear, .shape = {300, 2304, 8}, .dt = SD_DT_BF16, .tol = TOL_DOT},
    {.op = "sd_cuda_linear", .note = "two tiles of 32 tokens", .run = run_linear, .shape = {129, 515, 33}, .dt = SD_DT_F32, .tol = TOL_DOT},
    {.op = "sd_cuda_linear", .run = run_linear, .shape = {16, 7, 3}, .dt = SD_DT_F32, .tol = TOL_DOT},
    {.op = "sd_cuda_linear", .run = run_linear, .shape = {33, 36, 17}, .dt = SD_DT_BF16, .tol = TOL_DOT},
    {.op = "sd_cuda_linear", .run = run_linear, .shape = {8, 1024, 32}, .dt = SD_DT_BF16, .tol = TOL_DOT},
    {.op = "sd_cuda_linear", .run = run_linear, .shape = {1000, 64, 2}, .dt = SD_DT_F32, .tol = TOL_DOT},
    {.op = "sd_cuda_linear", .note = "rows too wide for a BULK block", .run = run_linear, .shape = {37, 9216, 3}, .dt = SD_DT_BF16, .tol = TOL_DOT},
    {.op = "sd_cuda_linear", .note = "rows too wide for a BULK block", .run = run_linear, .shape = {21, 12288, 2}, .dt = SD_DT_BF16, .tol = TOL_DOT},
    {.op = "sd_cuda_linear", .note = "rows too wide for a BULK block", .run = run_linear, .shape = {19, 6144, 2}, .dt = SD_DT_F32, .tol = TOL_DOT},
    // STORE, ADD and SWIGLU jobs in one launch (TOL_DOT); each STORE job ≡ its Linear alone, bitwise.
    {.op = "sd_cuda_linear_multi", .note = "BULK", .run = run_linear_multi, .shape = {1, 256, 300, 64, 200, 0, 0}, .dt = SD_DT_BF16, .tol = TOL_DOT},
    {.op = "sd_cuda_linear_multi", .note = "9 jobs: two launches", .run = run_linear_multi, .shape = {2, 512, 37, 129, 96, 6, 0}, .dt = SD_DT_F32, .tol = TOL_DOT},
    {.op = "sd_cuda_linear_multi", .note = "two tokens, unaligned strided ADD", .run = run_linear_multi, .shape = {2, 64, 33, 17, 24, 3, 1}, .dt = SD_DT_F32, .tol = TOL_DOT},
    {.op = "sd_cuda_linear_multi", .note = "unaligned strided ADD", .run = run_linear_multi, .shape = {5, 96, 70, 50, 40, 2, 1}, .dt = SD_DT_BF16, .tol = TOL_DOT},
    {.op = "sd_cuda_linear_multi", .note = "two tiles of 32 tokens", .run = run_linear_multi, .shape = {33, 200, 64, 48, 80, 0, 1}, .dt = SD_DT_F32, .tol = TOL_DOT},
    {.op = "sd_cuda_linear_multi", .note = "40 tokens", .run = run_linear_multi, .shape = {40, 2304, 64, 40, 128, 1, 0}, .dt = SD_DT_BF16, .tol = TOL_DOT},
    {.op = "sd_cuda_linear_multi", .note = "rows too wide for BULK", .run = run_linear_multi, .shape = {1, 9216, 21, 16, 8, 0, 0}, .dt = SD_DT_BF16, .tol = TOL_DOT},
    // The norm fused into the Linears: bitwise against sd_cuda_rmsnorm then sd_cuda_linear_multi (the
    // contract); against the CPU within TOL_ELEM (the normed rows) and TOL_DOT (the jobs).
    {.op = "sd_cuda_linear_multi_norm", .note = "fused", .run = run_linear_multi_norm, .shape = {1, 2304, 300, 96, 64}, .dt = SD_DT_BF16, .tol = TOL_BITWISE},
    {.op = "sd_cuda_linear_multi_norm", .note = "fused, 32 KB of normed rows", .run = run_linear_multi_norm, .shape = {2, 4096, 64, 40, 33}, .dt = SD_DT_BF16, .tol = TOL_BITWISE},
    {.op = "sd_cuda_linear_multi_norm", .note = "fused, a row past the register norm", .run = run_linear_multi_norm, .shape = {1, 5000, 40, 16, 21}, .dt = SD_DT_F32, .tol = TOL_BITWISE},
    {.op = "sd_cuda_linear_multi_norm", .note = "fused, narrow", .run = run_linear_multi_norm, .shape = {2, 36, 64, 32, 20}, .dt = SD_DT_F32, .tol = TOL_BITWISE},
    {.op = "sd_cuda_linear_multi_norm", .note = "three tokens: two launches", .run = run_linear_multi_norm, .shape = {3, 512, 100, 64, 37}, .dt = SD_DT_BF16, .tol = TOL_BITWISE},
    {.op = "sd_cuda_linear_multi_norm", .note = "n % 4 != 0: two launches", .run = run_linear_multi_norm, .shape = {1, 37, 20, 16, 9}, .dt = SD_DT_F32, .tol = TOL_BITWISE},
    // RMSNorm (TOL_ELEM).
    {.op = "sd_cuda_rmsnorm", .run = run_rmsnorm, .shape = {5, 2304, 0}, .tol = TOL_ELEM},
    {.op = "sd_cuda_rmsnorm", .run = run_rmsnorm, .shape = {3, 37, 0}, .tol = TOL_ELEM},
    {.op = "sd_cuda_rmsnorm", .run = run_rmsnorm, .shape = {1, 8, 0}, .tol = TOL_ELEM},
    {.op = "sd_cuda_rmsnorm", .note = "in place", .run = run_rmsnorm, .shape = {9, 512, 1}, .tol = TOL_ELEM},
    {.op = "sd_cuda_rmsnorm", .note = "past the register path", .run = run_rmsnorm, .shape = {2, 5000, 0}, .tol = TOL_ELEM},
    {.op = "sd_cuda_rmsnorm", .note = "in place", .run = run_rmsnorm, .shape = {4, 4096, 1}, .tol = TOL_ELEM},
    // Embedding rows widened exactly: bitwise.
    {.op = "sd_cuda_embed", .run = run_embed, .shape = {50, 72, 6, 0}, .dt = SD_DT_BF16, .tol = TOL_BITWISE},
    {.op = "sd_cuda_embed", .run = run_embed, .shape = {50, 72, 6, 0}, .dt = SD_DT_F32, .tol = TOL_BITWISE},
    {.op = "sd_cuda_embed", .note = "ids in pinned memory", .run = run_embed, .shape = {1000, 2304, 5, 1}, .dt = SD_DT_BF16, .tol = TOL_BITWISE},
    {.op = "sd_cuda_embed", .note = "ids in pinned memory", .run = run_embed, .shape = {300, 64, 1, 1}, .dt = SD_DT_F32, .tol = TOL_BITWISE},
    // The cursor's integers: exact.
    {.op = "sd_cuda_cursor_set, sd_cuda_cursor_advance, sd_cuda_cursor_commit", .run = run_cursor, .tol = TOL_BITWISE},
    // KDA conv: qc, kc, vc TOL_ELEM; the gates TOL_DOT; the ring and one token at a time bitwise.
    // W = 9 passes the kernel's register window (CONV_WMAX 8); pos0 = 2 with W = 9 reaches before 0.
    {.op = "sd_cuda_kda_conv", .run = run_kda_conv, .shape = {2, 16, 4, 1, 0, 0, 0, 0}, .dt = SD_DT_F32, .tol = TOL_ELEM},
    {.op = "sd_cuda_kda_conv", .run = run_kda_conv, .shape = {3, 64, 4, 3, 0, 1, 0, 0}, .dt = SD_DT_BF16, .tol = TOL_ELEM},
    {.op = "sd_cuda_kda_conv", .run = run_kda_conv, .shape = {2, 128, 4, 3, 13, 0, 1, 2}, .dt = SD_DT_BF16, .tol = TOL_ELEM},
    {.op = "sd_cuda_kda_conv", .run = run_kda_conv, .shape = {2, 64, 9, 3, 2, 1, 1, 0}, .dt = SD_DT_F32, .tol = TOL_ELEM},
    {.op = "sd_cuda_kda_conv", .run = run_kda_conv, .shape = {1, 128, 9, 1, 40, 0, 0, 3}, .dt = SD_DT_BF16, .tol = TOL_ELEM},
    {.op = "sd_cuda_kda_conv", .run = run_kda_conv, .shape = {4, 16, 9, 3, 11, 1, 0, 1}, .dt = SD_DT_BF16, .tol = TOL_ELEM},
    {.op = "sd_cuda_kda_conv", .run = run_kda_conv, .shape = {2, 64, 4, 1, 5, 1, 1, 0}, .dt = SD_DT_F32, .tol = TOL_ELEM},
    {.op = "sd_cuda_kda_conv", .run = run_kda_conv, .shape = {2, 40, 4, 3, 6, 0, 0, 0}, .dt = SD_DT_BF16, .tol = TOL_ELEM},
    {.op = "sd_cuda_kda_conv", .run = run_kda_conv, .shape = {3, 128, 4, 3, 1, 0, 1, 0}, .dt = SD_DT_F32, .tol = TOL_ELEM},
    // KDA scan (TOL_SEQ): d 8, 16 (a thread a column), 32..128 (the tiled scan; T = 17 takes two
    // chunks), 40 (any d); raw and final gates; slots n0 = 0, 7, 300.
    {.op = "sd_cuda_kda_scan", .run = run_kda_scan, .shape = {3, 16, 1, 7, 1, 0, 0, 0}, .tol = TOL_SEQ},
    {.op = "sd_cuda_kda_scan", .run = run_kda_scan, .shape = {3, 16, 5, 0, 0, 1, 0, 0}, .tol = TOL_SEQ},
    {.op = "sd_cuda_kda_scan", .run = run_kda_scan, .shape = {3, 16, 17, 300, 1, 0, 1, 0}, .tol = TOL_SEQ},
    {.op = "sd_cuda_kda_scan", .run = run_kda_scan, .shape = {3, 32, 1, 0, 0, 1, 1, 0}, .tol = TOL_SEQ},
    {.op = "sd_cuda_kda_scan", .run = run_kda_scan, .shape = {3, 32, 5, 7, 1, 0, 0, 2}, .tol = TOL_SEQ},
    {.op = "sd_cuda_kda_scan", .run = run_kda_scan, .shape = {3, 32, 17, 7, 1, 1, 0, 0}, .tol = TOL_SEQ},
    {.op = "sd_cuda_kda_scan", .run = run_kda_scan, .shape = {3, 64, 1, 300, 1, 1, 0, 0}, .tol = TOL_SEQ},
    {.op = "sd_cuda_kda_scan", .run = run_kda_scan, .shape = {3, 64, 5, 7, 0, 0, 1, 0}, .tol = TOL_SEQ},
    {.op = "sd_cuda_kda_scan", .run = run_kda_scan, .shape = {3, 64, 17, 0, 1, 0, 0, 1}, .tol = TOL_SEQ},
    {.op = "sd_cuda_kda_scan", .run = run_kda_scan, .shape = {2, 96, 1, 7, 0, 0, 0, 0}, .tol = TOL_SEQ},
    {.op = "sd_cuda_kda_scan", .run = run_kda_scan, .shape = {2, 96, 5, 0, 1, 1, 1, 0}, .tol = TOL_SEQ},
    {.op = "sd_cuda_kda_scan", .run = run_kda_scan, .shape = {2, 96, 17, 7, 1, 0, 0, 0}, .tol = TOL_SEQ},
    {.op = "sd_cuda_kda_scan", .run = run_kda_scan, .shape = {2, 128, 1, 7, 1, 0, 1, 0}, .tol = TOL_SEQ},
    {.op = "sd_cuda_kda_scan", .run = run_kda_scan, .shape = {2, 128, 5, 300, 1, 1, 0, 0}, .tol = TOL_SEQ},
    {.op = "sd_cuda_kda_scan", .run = run_kda_scan, .shape = {2, 128, 17, 7, 0, 1, 1, 0}, .tol = TOL_SEQ},
    {.op = "sd_cuda_kda_scan", .run = run_kda_scan, .shape = {3, 40, 1, 0, 1, 1, 0, 0}, .tol = TOL_SEQ},
    {.op = "sd_cuda_kda_scan", .run = run_kda_scan, .shape = {3, 40, 5, 7, 1, 0, 1, 0}, .tol = TOL_SEQ},
    {.op = "sd_cuda_kda_scan", .run = run_kda_scan, .shape = {3, 40, 17, 7, 0, 0, 0, 2}, .tol = TOL_SEQ},
    {.op = "sd_cuda_kda_scan", .run = run_kda_scan, .shape = {4, 8, 5, 3, 1, 0, 0, 0}, .tol = TOL_SEQ},
    // KDA output norm and gate (TOL_ELEM).
    {.op = "sd_cuda_kda_out", .run = run_kda_out, .shape = {1, 3, 16}, .tol = TOL_ELEM},
    {.op = "sd_cuda_kda_out", .run = run_kda_out, .shape = {5, 2, 128}, .tol = TOL_ELEM},
    {.op = "sd_cuda_kda_out", .run = run_kda_out, .shape = {3, 4, 40}, .tol = TOL_ELEM},
    {.op = "sd_cuda_kda_out", .run = run_kda_out, .shape = {17, 2, 64}, .tol = TOL_ELEM},
    // MLA (mo TOL_SEQ; the cache rows TOL_ELEM or bitwise; one token at a time bitwise). pos0 = 700:
    // up to 23 chunks of 32 rows a token; Hm not a multiple of the split's 4 heads a block; R = 512,
    // dr = 64 the compiled Kimi split; dn = 160 past the absorb's preloaded groups; dr = 6 unvectorised.
    {.op = "sd_cuda_mla_attend", .run = run_mla, .shape = {5, 24, 16, 20, 64, 3, 0, 1}, .dt = SD_DT_BF16, .tol = TOL_SEQ},
    {.op = "sd_cuda_mla_attend", .run = run_mla, .shape = {5, 24, 16, 20, 64, 3, 700, 7}, .dt = SD_DT_F32, .tol = TOL_SEQ},
    {.op = "sd_cuda_mla_attend", .run = run_mla, .shape = {3, 16, 6, 16, 40, 1, 700, 0}, .dt = SD_DT_F32, .tol = TOL_SEQ},
    {.op = "sd_cuda_mla_attend", .run = run_mla, .shape = {3, 16, 6, 16, 40, 3, 0, 6}, .dt = SD_DT_BF16, .tol = TOL_SEQ},
    {.op = "sd_cuda_mla_attend", .note = "Kimi's shapes", .run = run_mla, .shape = {4, 128, 64, 128, 512, 3, 700, 3}, .dt = SD_DT_BF16, .tol = TOL_SEQ},
    {.op = "sd_cuda_mla_attend", .note = "Kimi's shapes", .run = run_mla, .shape = {4, 128, 64, 128, 512, 1, 0, 0}, .dt = SD_DT_F32, .tol = TOL_SEQ},
    {.op = "sd_cuda_mla_attend", .run = run_mla, .shape = {8, 64, 32, 64, 128, 3, 37, 5}, .dt = SD_DT_BF16, .tol = TOL_SEQ},
    {.op = "sd_cuda_mla_attend", .run = run_mla, .shape = {2, 160, 8, 24, 96, 3, 50, 1}, .dt = SD_DT_F32, .tol = TOL_SEQ},
    // MoE selection: sel and the grouping bitwise, the weights TOL_ELEM (one device expf in the
    // sigmoid, the sum in another order).
    {.op = "sd_cuda_moe_select", .run = run_moe_select, .shape = {256, 8, 1, 1, 1, 0}, .tol = TOL_ELEM},
    {.op = "sd_cuda_moe_select", .run = run_moe_select, .shape = {256, 8, 1, 1, 4, 0}, .tol = TOL_ELEM},
    {.op = "sd_cuda_moe_select", .note = "ties", .run = run_moe_select, .shape = {256, 8, 1, 1, 2, 1}, .tol = TOL_ELEM},
    {.op = "sd_cuda_moe_select", .run = run_moe_select, .shape = {64, 6, 1, 1, 3, 0}, .tol = TOL_ELEM},
    {.op = "sd_cuda_moe_select", .note = "ties", .run = run_moe_select, .shape = {64, 6, 1, 1, 3, 1}, .tol = TOL_ELEM},
    {.op = "sd_cuda_moe_select", .run = run_moe_select, .shape = {48, 4, 1, 1, 5, 0}, .tol = TOL_ELEM},
    {.op = "sd_cuda_moe_select", .run = run_moe_select, .shape = {16, 2, 1, 1, 9, 0}, .tol = TOL_ELEM},
    {.op = "sd_cuda_moe_select", .note = "ties", .run = run_moe_select, .shape = {16, 2, 1, 1, 9, 1}, .tol = TOL_ELEM},
    {.op = "sd_cuda_moe_select", .note = "expert groups", .run = run_moe_select, .shape = {64, 6, 8, 3, 9, 0}, .tol = TOL_ELEM},
    // The one-token route + select: bitwise against the router Linear and sd_cuda_moe_select.
    {.op = "sd_cuda_moe_route_select", .run = run_moe_route_select, .shape = {256, 8, 2304, 1}, .tol = TOL_BITWISE},
    {.op = "sd_cuda_moe_route_select", .run = run_moe_route_select, .shape = {256, 8, 512, 0}, .tol = TOL_BITWISE},
    {.op = "sd_cuda_moe_route_select", .run = run_moe_route_select, .shape = {16, 2, 512, 1}, .tol = TOL_BITWISE},
    {.op = "sd_cuda_moe_route_select", .run = run_moe_route_select, .shape = {20, 3, 64, 0}, .tol = TOL_BITWISE},
    {.op = "sd_cuda_moe_route_select", .run = run_moe_route_select, .shape = {64, 6, 36, 1}, .tol = TOL_BITWISE},
    // Routed and shared experts with the combine: vs the twin TOL_DOT (three dots and a silu an
    // output); the two arms bitwise equal.
    {.op = "sd_cuda_moe_up, sd_cuda_moe_down", .run = run_moe_experts, .shape = {8, 2, 64, 32, 1, 1, 0}, .dt = SD_DT_F32, .tol = TOL_DOT},
    {.op = "sd_cuda_moe_up, sd_cuda_moe_down", .run = run_moe_experts, .shape = {8, 2, 64, 32, 1, 2, 1}, .dt = SD_DT_BF16, .tol = TOL_DOT},
    {.op = "sd_cuda_moe_up, sd_cuda_moe_down", .note = "shared expert two wide", .run = run_moe_experts, .shape = {16, 4, 256, 96, 2, 5, 1}, .dt = SD_DT_BF16, .tol = TOL_DOT},
    {.op = "sd_cuda_moe_up, sd_cuda_moe_down", .note = "no shared expert", .run = run_moe_experts, .shape = {16, 4, 256, 96, 0, 9, 0}, .dt = SD_DT_F32, .tol = TOL_DOT},
    {.op = "sd_cuda_moe_up, sd_cuda_moe_down", .note = "Kimi's widths", .run = run_moe_experts, .shape = {32, 8, 2304, 128, 1, 1, 1}, .dt = SD_DT_BF16, .tol = TOL_DOT},
    {.op = "sd_cuda_moe_up, sd_cuda_moe_down", .note = "Kimi's widths", .run = run_moe_experts, .shape = {32, 8, 2304, 128, 1, 2, 0}, .dt = SD_DT_BF16, .tol = TOL_DOT},
    {.op = "sd_cuda_moe_up, sd_cuda_moe_down", .note = "D not a multiple of 16", .run = run_moe_experts, .shape = {4, 2, 100, 40, 1, 3, 0}, .dt = SD_DT_F32, .tol = TOL_DOT},
    {.op = "sd_cuda_moe_up, sd_cuda_moe_down", .note = "no shared expert, counted", .run = run_moe_experts, .shape = {64, 6, 512, 64, 0, 2, 1}, .dt = SD_DT_BF16, .tol = TOL_DOT},
    // Argmax (bitwise).
    {.op = "sd_cuda_argmax", .run = run_argmax, .shape = {4, 5000, 0, 0}, .tol = TOL_BITWISE},
    {.op = "sd_cuda_argmax", .note = "odd rows, out pinned", .run = run_argmax, .shape = {4, 5001, 0, 1}, .tol = TOL_BITWISE},
    {.op = "sd_cuda_argmax", .note = "vocabulary rows", .run = run_argmax, .shape = {2, 163840, 1, 0}, .tol = TOL_BITWISE},
    {.op = "sd_cuda_argmax", .note = "vocabulary rows, odd, out pinned", .run = run_argmax, .shape = {2, 163841, 1, 1}, .tol = TOL_BITWISE},
    // Softmax: the CPU's operation order, expf within 2 ulp (TOL_ELEM).
    {.op = "sd_cuda_softmax", .run = run_softmax, .shape = {5, 5000, 0}, .tol = TOL_ELEM},
    {.op = "sd_cuda_softmax", .note = "in place, vocabulary rows", .run = run_softmax, .shape = {5, 163841, 1}, .tol = TOL_ELEM},
    {.op = "sd_cuda_softmax", .run = run_softmax, .shape = {6, 64, 0}, .tol = TOL_ELEM},
    // Sampling: the CPU's loop and draw, bitwise.
    {.op = "sd_cuda_sample_rows", .run = run_sample_rows, .shape = {4, 5000, 0}, .tol = TOL_BITWISE},
    {.op = "sd_cuda_sample_rows", .note = "out pinned", .run = run_sample_rows, .shape = {3, 163840, 1}, .tol = TOL_BITWISE},
    {.op = "sd_cuda_sample_rows", .run = run_sample_rows, .shape = {1, 7, 0}, .tol = TOL_BITWISE},
    // Acceptance: (n, bonus) bitwise (test_cuda_accept sweeps the variants).
    {.op = "sd_cuda_accept", .note = "greedy", .run = run_accept, .shape = {1, 3, 1, 40, 0}, .tol = TOL_BITWISE},
    {.op = "sd_cuda_accept", .note = "greedy", .run = run_accept, .shape = {16, 5, 1, 40, 0}, .tol = TOL_BITWISE},
    {.op = "sd_cuda_accept", .note = "sampled", .run = run_accept, .shape = {5, 64, 0, 20, 0}, .tol = TOL_BITWISE},
    {.op = "sd_cuda_accept", .note = "sampled", .run = run_accept, .shape = {16, 1025, 0, 8, 0}, .tol = TOL_BITWISE},
    {.op = "sd_cuda_accept", .note = "sampled, q = p", .run = run_accept, .shape = {3, 8192, 0, 6, 1}, .tol = TOL_BITWISE},
    {.op = "sd_cuda_accept", .note = "sampled, one entry", .run = run_accept, .shape = {1, 1, 0, 4, 0}, .tol = TOL_BITWISE},
    // A round's bookkeeping: exact integers.
    {.op = "sd_cuda_round_publish", .run = run_round_publish, .shape = {3, 1, 1}, .tol = TOL_BITWISE},
    {.op = "sd_cuda_round_publish", .run = run_round_publish, .shape = {16, 1, 0}, .tol = TOL_BITWISE},
    {.op = "sd_cuda_round_publish", .note = "a decode step", .run = run_round_publish, .shape = {0, 1, 1}, .tol = TOL_BITWISE},
    {.op = "sd_cuda_round_publish", .note = "no round counter", .run = run_round_publish, .shape = {1, 0, 0}, .tol = TOL_BITWISE},
    // Weight synthesis: the host generator's bytes.
    {.op = "sd_cuda_synth_fill", .run = run_synth_fill, .shape = {1, 0}, .tol = TOL_BITWISE},
    {.op = "sd_cuda_synth_fill", .run = run_synth_fill, .shape = {1, 1}, .tol = TOL_BITWISE},
    {.op = "sd_cuda_synth_fill", .run = run_synth_fill, .shape = {0, 0}, .tol = TOL_BITWISE},
    {.op = "sd_cuda_synth_fill", .note = "shorter than a Philox block", .run = run_synth_fill, .shape = {0, 1}, .tol = TOL_BITWISE},
    // ---- the prefill (kernels/gemm.h, kda_prefill.h, mla_prefill.h, moe_prefill.h): TOL_BF16,
    // TOL_MMA and TOL_CHUNK stand above run_to_bf16 with their reasons.
    // bf16 conversion: bitwise (a NaN as a NaN).
    {.op = "sd_cuda_to_bf16", .note = "edge values", .run = run_to_bf16, .shape = {37, 1}, .tol = TOL_BITWISE},
    {.op = "sd_cuda_to_bf16", .note = "one value", .run = run_to_bf16, .shape = {1, 0}, .tol = TOL_BITWISE},
    {.op = "sd_cuda_to_bf16", .note = "none: nothing written", .run = run_to_bf16, .shape = {0, 0}, .tol = TOL_BITWISE},
    {.op = "sd_cuda_to_bf16", .note = "past one grid", .run = run_to_bf16, .shape = {600001, 1}, .tol = TOL_BITWISE},
    // The GEMM (sd_gemm_run, sd_gemm_linear, sd_gemm_linear_bf16), both weight dtypes a case: .tol is
    // the bf16 weight's against the f32 activations (TOL_BF16); the rest name theirs (run_gemm).
    {.op = "sd_cuda_to_bf16", .note = "GEMM: one row", .run = run_gemm, .shape = {1, 64, 32, 1, SD_GEMM_WT, 0, 0, 0}, .tol = TOL_BF16},
    {.op = "sd_cuda_to_bf16", .note = "GEMM: K = 8", .run = run_gemm, .shape = {37, 16, 8, 1, SD_GEMM_WT, 0, 0, 0}, .tol = TOL_BF16},
    {.op = "sd_cuda_to_bf16", .note = "GEMM: 8 columns, accumulate", .run = run_gemm, .shape = {7, 8, 32, 1, SD_GEMM_WT, 0, 0, 1}, .tol = TOL_BF16},
    {.op = "sd_cuda_to_bf16", .note = "GEMM: Y rows padded", .run = run_gemm, .shape = {300, 512, 512, 1, SD_GEMM_WT, 0, 4, 0}, .tol = TOL_BF16},
    {.op = "sd_cuda_to_bf16", .note = "GEMM: X rows padded, accumulate", .run = run_gemm, .shape = {129, 1536, 512, 1, SD_GEMM_WT, 4, 0, 1}, .tol = TOL_BF16},
    {.op = "sd_cuda_to_bf16", .note = "GEMM: Kimi's expert gate|up", .run = run_gemm, .shape = {17, 2048, 2304, 1, SD_GEMM_WT, 0, 0, 0}, .tol = TOL_BF16},
    {.op = "sd_cuda_to_bf16", .note = "GEMM: Kimi's router", .run = run_gemm, .shape = {40, 256, 2304, 1, SD_GEMM_WT, 0, 0, 0}, .tol = TOL_BF16},
    {.op = "sd_cuda_to_bf16", .note = "GEMM: X·W, one problem", .run = run_gemm, .shape = {8, 8, 40, 1, SD_GEMM_WN, 0, 0, 0}, .tol = TOL_BF16},
    {.op = "sd_cuda_to_bf16", .note = "GEMM: batched X·W (the MLA absorption)", .run = run_gemm, .shape = {50, 128, 64, 4, SD_GEMM_WN, 32, 0, 0}, .tol = TOL_BF16},
    {.op = "sd_cuda_to_bf16", .note = "GEMM: batched X·Wt (the MLA value projection)", .run = run_gemm, .shape = {50, 64, 128, 4, SD_GEMM_WT, 0, 0, 0}, .tol = TOL_BF16},
    {.op = "sd_cuda_to_bf16", .note = "GEMM: Kimi's absorption", .run = run_gemm, .shape = {20, 512, 128, 32, SD_GEMM_WN, 64, 0, 0}, .tol = TOL_BF16},
    {.op = "sd_cuda_to_bf16", .note = "GEMM: Kimi's value projection", .run = run_gemm, .shape = {20, 128, 512, 32, SD_GEMM_WT, 0, 0, 0}, .tol = TOL_BF16},
    {.op = "sd_cuda_to_bf16", .note = "GEMM: K = 20 (staged rows of 24), gaps, accumulate", .run = run_gemm, .shape = {9, 16, 20, 3, SD_GEMM_WN, 4, 4, 1}, .tol = TOL_BF16},
    {.op = "sd_cuda_to_bf16", .note = "GEMM: batched X·Wt, gaps", .run = run_gemm, .shape = {64, 40, 24, 2, SD_GEMM_WT, 8, 8, 0}, .tol = TOL_BF16},
    // KDA conv + gates, then the ring rows (TOL_ELEM; the ring, β's padding and pieces bitwise).
    {.op = "sd_cuda_kda_prefill_conv, sd_cuda_kda_prefill_ring", .note = "one token at 0, a ring of W - 1 rows", .run = run_kda_prefill_conv, .shape = {2, 16, 4, 1, 0, 3, 0, 0}, .tol = TOL_ELEM},
    {.op = "sd_cuda_kda_prefill_conv, sd_cuda_kda_prefill_ring", .note = "T < W - 1, pieces of 1", .run = run_kda_prefill_conv, .shape = {2, 16, 4, 2, 5, 4, 1, 2}, .tol = TOL_ELEM},
    {.op = "sd_cuda_kda_prefill_conv, sd_cuda_kda_prefill_ring", .note = "pieces of 33 and 37", .run = run_kda_prefill_conv, .shape = {3, 64, 4, 70, 13, 11, 33, 1}, .tol = TOL_ELEM},
    {.op = "sd_cuda_kda_prefill_conv, sd_cuda_kda_prefill_ring", .note = "Kimi's shapes", .run = run_kda_prefill_conv, .shape = {32, 128, 4, 100, 37, 11, 64, 0}, .tol = TOL_ELEM},
    {.op = "sd_cuda_kda_prefill_conv, sd_cuda_kda_prefill_ring", .note = "d past 128 threads, W = 6 before 0, a piece < W - 1", .run = run_kda_prefill_conv, .shape = {2, 200, 6, 9, 3, 8, 4, 0}, .tol = TOL_ELEM},
    {.op = "sd_cuda_kda_prefill_conv, sd_cuda_kda_prefill_ring", .note = "W = 1: no history, no ring rows", .run = run_kda_prefill_conv, .shape = {4, 32, 1, 5, 9, 1, 2, 0}, .tol = TOL_ELEM},
    {.op = "sd_cuda_kda_prefill_conv, sd_cuda_kda_prefill_ring", .note = "the ring wraps", .run = run_kda_prefill_conv, .shape = {1, 8, 4, 3, 1000, 5, 1, 3}, .tol = TOL_ELEM},
    // The chunked recurrence (TOL_CHUNK): d 8 .. 128, T about the 64-token chunk; in place bitwise.
    {.op = "sd_cuda_kda_chunk", .note = "one token", .run = run_kda_chunk, .shape = {2, 8, 1, 0, 0}, .tol = TOL_CHUNK},
    {.op = "sd_cuda_kda_chunk", .note = "one short chunk, weak decay", .run = run_kda_chunk, .shape = {2, 8, 63, 0, 1}, .tol = TOL_CHUNK},
    {.op = "sd_cuda_kda_chunk", .note = "one whole chunk, y rows padded", .run = run_kda_chunk, .shape = {3, 16, 64, 4, 0}, .tol = TOL_CHUNK},
    {.op = "sd_cuda_kda_chunk", .note = "a chunk and a token", .run = run_kda_chunk, .shape = {4, 32, 65, 0, 0}, .tol = TOL_CHUNK},
    {.op = "sd_cuda_kda_chunk", .note = "one token, beta rows padded", .run = run_kda_chunk, .shape = {5, 32, 1, 0, 0}, .tol = TOL_CHUNK},
    {.op = "sd_cuda_kda_chunk", .note = "three chunks, weak decay", .run = run_kda_chunk, .shape = {2, 64, 130, 0, 1}, .tol = TOL_CHUNK},
    {.op = "sd_cuda_kda_chunk", .note = "five chunks, weak decay", .run = run_kda_chunk, .shape = {3, 64, 257, 0, 1}, .tol = TOL_CHUNK},
    {.op = "sd_cuda_kda_chunk", .note = "y rows padded, weak decay", .run = run_kda_chunk, .shape = {1, 16, 129, 8, 1}, .tol = TOL_CHUNK},
    {.op = "sd_cuda_kda_chunk", .run = run_kda_chunk, .shape = {4, 128, 200, 0, 0}, .tol = TOL_CHUNK},
    {.op = "sd_cuda_kda_chunk", .note = "Kimi's heads", .run = run_kda_chunk, .shape = {32, 128, 130, 0, 0}, .tol = TOL_CHUNK},
    // The gated output norm: f32 TOL_ELEM; bf16 the f32 rounded, bitwise, and TOL_BF16 vs the CPU.
    {.op = "sd_cuda_kda_prefill_out", .run = run_kda_prefill_out, .shape = {1, 3, 16}, .tol = TOL_ELEM},
    {.op = "sd_cuda_kda_prefill_out", .run = run_kda_prefill_out, .shape = {5, 2, 128}, .tol = TOL_ELEM},
    {.op = "sd_cuda_kda_prefill_out", .run = run_kda_prefill_out, .shape = {3, 4, 40}, .tol = TOL_ELEM},
    {.op = "sd_cuda_kda_prefill_out", .note = "Kimi's heads", .run = run_kda_prefill_out, .shape = {70, 32, 128}, .tol = TOL_ELEM},
    {.op = "sd_cuda_kda_prefill_out", .note = "d past 128 threads", .run = run_kda_prefill_out, .shape = {2, 1, 200}, .tol = TOL_ELEM},
    // The MLA cache write (TOL_ELEM; the rows it must not touch bitwise).
    {.op = "sd_cuda_mla_prefill_cache", .note = "RoPE", .run = run_mla_prefill_cache, .shape = {3, 5, 24, 16, 64, 0, 1, 0}, .tol = TOL_ELEM},
    {.op = "sd_cuda_mla_prefill_cache", .note = "RoPE at 700, the prefill's shared rows", .run = run_mla_prefill_cache, .shape = {3, 5, 24, 16, 64, 700, 1, 1}, .tol = TOL_ELEM},
    {.op = "sd_cuda_mla_prefill_cache", .note = "one token", .run = run_mla_prefill_cache, .shape = {1, 3, 16, 6, 40, 9, 1, 1}, .tol = TOL_ELEM},
    {.op = "sd_cuda_mla_prefill_cache", .note = "no RoPE", .run = run_mla_prefill_cache, .shape = {3, 2, 16, 4, 40, 2, 0, 0}, .tol = TOL_ELEM},
    {.op = "sd_cuda_mla_prefill_cache", .note = "Kimi's shapes (no RoPE)", .run = run_mla_prefill_cache, .shape = {5, 32, 128, 64, 512, 100, 0, 1}, .tol = TOL_ELEM},
    {.op = "sd_cuda_mla_prefill_cache", .note = "RoPE at R = 512, dr = 64", .run = run_mla_prefill_cache, .shape = {4, 8, 64, 64, 512, 37, 1, 0}, .tol = TOL_ELEM},
    {.op = "sd_cuda_mla_prefill_cache", .note = "R past the register norm", .run = run_mla_prefill_cache, .shape = {2, 4, 16, 8, 5000, 3, 1, 0}, .tol = TOL_ELEM},
    {.op = "sd_cuda_mla_prefill_cache", .note = "odd dr with RoPE: the unpaired entry copied", .run = run_mla_prefill_cache, .shape = {2, 2, 16, 5, 40, 3, 1, 1}, .tol = TOL_ELEM},
    // Packing to bf16: bitwise.
    {.op = "sd_cuda_mla_pack_keys, sd_cuda_mla_pack_queries", .note = "one row each, width 32", .run = run_mla_pack, .shape = {1, 1, 8, 4, 16, 0, 0}, .tol = TOL_BITWISE},
    {.op = "sd_cuda_mla_pack_keys, sd_cuda_mla_pack_queries", .run = run_mla_pack, .shape = {3, 5, 24, 6, 40, 7, 3}, .tol = TOL_BITWISE},
    {.op = "sd_cuda_mla_pack_keys, sd_cuda_mla_pack_queries", .note = "Kimi's shapes, the prefill's query rows", .run = run_mla_pack, .shape = {40, 32, 128, 64, 512, 100, 576}, .tol = TOL_BITWISE},
    {.op = "sd_cuda_mla_pack_keys, sd_cuda_mla_pack_queries", .note = "dr = 0", .run = run_mla_pack, .shape = {2, 3, 16, 0, 64, 5, 0}, .tol = TOL_BITWISE},
    {.op = "sd_cuda_mla_pack_keys, sd_cuda_mla_pack_queries", .note = "keys past one grid", .run = run_mla_pack, .shape = {8, 2, 16, 64, 512, 2000, 0}, .tol = TOL_BITWISE},
    {.op = "sd_cuda_mla_pack_keys, sd_cuda_mla_pack_queries", .note = "R + dr = 16", .run = run_mla_pack, .shape = {2, 2, 8, 3, 13, 1, 1}, .tol = TOL_BITWISE},
    {.op = "sd_cuda_mla_pack_keys, sd_cuda_mla_pack_queries", .note = "R + dr = 17", .run = run_mla_pack, .shape = {2, 2, 8, 4, 13, 1, 1}, .tol = TOL_BITWISE},
    // Flash attention over the packed rows (TOL_BF16); every value-column split, 1 .. 16 key tiles.
    {.op = "sd_cuda_mla_flash", .note = "one token, one key", .run = run_mla_flash, .shape = {1, 2, 16, 4, 0, 16}, .tol = TOL_BF16},
    {.op = "sd_cuda_mla_flash", .run = run_mla_flash, .shape = {37, 2, 16, 4, 5, 24}, .tol = TOL_BF16},
    {.op = "sd_cuda_mla_flash", .note = "a partial query block", .run = run_mla_flash, .shape = {70, 4, 128, 32, 50, 64}, .tol = TOL_BF16},
    {.op = "sd_cuda_mla_flash", .note = "Kimi's shapes", .run = run_mla_flash, .shape = {40, 32, 512, 64, 100, 128}, .tol = TOL_BF16},
    {.op = "sd_cuda_mla_flash", .note = "dr = 0, three key tiles", .run = run_mla_flash, .shape = {130, 4, 64, 0, 0, 64}, .tol = TOL_BF16},
    {.op = "sd_cuda_mla_flash", .note = "six key tiles", .run = run_mla_flash, .shape = {5, 3, 96, 8, 300, 32}, .tol = TOL_BF16},
    {.op = "sd_cuda_mla_flash", .note = "R = 40: one n8 tile a warp", .run = run_mla_flash, .shape = {3, 2, 40, 8, 10, 16}, .tol = TOL_BF16},
    {.op = "sd_cuda_mla_flash", .note = "width 896: the most shared memory", .run = run_mla_flash, .shape = {2, 1, 832, 64, 7, 128}, .tol = TOL_BF16},
    {.op = "sd_cuda_mla_flash", .note = "1017 keys", .run = run_mla_flash, .shape = {17, 5, 512, 64, 1000, 128}, .tol = TOL_BF16},
    // MoE routing: sel bitwise, w TOL_ELEM.
    {.op = "sd_cuda_moe_prefill_select", .note = "Kimi's routing, one token", .run = run_moe_prefill_select, .shape = {256, 8, 1, 1, 1, 0, 0}, .tol = TOL_ELEM},
    {.op = "sd_cuda_moe_prefill_select", .note = "Kimi's routing", .run = run_moe_prefill_select, .shape = {256, 8, 1, 1, 300, 0, 0}, .tol = TOL_ELEM},
    {.op = "sd_cuda_moe_prefill_select", .note = "ties", .run = run_moe_prefill_select, .shape = {256, 8, 1, 1, 9, 1, 0}, .tol = TOL_ELEM},
    {.op = "sd_cuda_moe_prefill_select", .note = "ties", .run = run_moe_prefill_select, .shape = {16, 2, 1, 1, 9, 1, 0}, .tol = TOL_ELEM},
    {.op = "sd_cuda_moe_prefill_select", .note = "expert groups", .run = run_moe_prefill_select, .shape = {64, 6, 8, 3, 50, 0, 0}, .tol = TOL_ELEM},
    {.op = "sd_cuda_moe_prefill_select", .note = "expert groups, not renormalised", .run = run_moe_prefill_select, .shape = {64, 6, 8, 3, 13, 0, 1}, .tol = TOL_ELEM},
    {.op = "sd_cuda_moe_prefill_select", .note = "32 groups of 3", .run = run_moe_prefill_select, .shape = {96, 4, 32, 4, 9, 0, 0}, .tol = TOL_ELEM},
    {.op = "sd_cuda_moe_prefill_select", .note = "E < 32, T not a multiple of 8", .run = run_moe_prefill_select, .shape = {20, 3, 1, 1, 11, 0, 0}, .tol = TOL_ELEM},
    {.op = "sd_cuda_moe_prefill_select", .note = "K = 32", .run = run_moe_prefill_select, .shape = {64, 32, 1, 1, 5, 0, 0}, .tol = TOL_ELEM},
    {.op = "sd_cuda_moe_prefill_select", .note = "E = 512, not renormalised", .run = run_moe_prefill_select, .shape = {512, 8, 1, 1, 17, 0, 1}, .tol = TOL_ELEM},
    // The grouping's counts and rows: bitwise.
    {.op = "sd_cuda_moe_prefill_count, sd_cuda_moe_prefill_scatter", .note = "one token", .run = run_moe_prefill_group, .shape = {256, 8, 1}, .tol = TOL_BITWISE},
    {.op = "sd_cuda_moe_prefill_count, sd_cuda_moe_prefill_scatter", .run = run_moe_prefill_group, .shape = {256, 8, 37}, .tol = TOL_BITWISE},
    {.op = "sd_cuda_moe_prefill_count, sd_cuda_moe_prefill_scatter", .note = "2400 entries", .run = run_moe_prefill_group, .shape = {256, 8, 300}, .tol = TOL_BITWISE},
    {.op = "sd_cuda_moe_prefill_count, sd_cuda_moe_prefill_scatter", .note = "E not a multiple of 8", .run = run_moe_prefill_group, .shape = {20, 3, 11}, .tol = TOL_BITWISE},
    {.op = "sd_cuda_moe_prefill_count, sd_cuda_moe_prefill_scatter", .note = "every expert every token", .run = run_moe_prefill_group, .shape = {5, 5, 7}, .tol = TOL_BITWISE},
    {.op = "sd_cuda_moe_prefill_count, sd_cuda_moe_prefill_scatter", .run = run_moe_prefill_group, .shape = {64, 6, 100}, .tol = TOL_BITWISE},
    // Gathered rows: bitwise.
    {.op = "sd_cuda_gather_rows", .note = "one row", .run = run_gather_rows, .shape = {1, 8, 0, 1}, .tol = TOL_BITWISE},
    {.op = "sd_cuda_gather_rows", .note = "Kimi's: 37 tokens x 8", .run = run_gather_rows, .shape = {296, 2304, 0, 37}, .tol = TOL_BITWISE},
    {.op = "sd_cuda_gather_rows", .note = "odd D, x rows padded", .run = run_gather_rows, .shape = {50, 101, 3, 20}, .tol = TOL_BITWISE},
    {.op = "sd_cuda_gather_rows", .note = "rows past 256 threads", .run = run_gather_rows, .shape = {7, 1000, 24, 3}, .tol = TOL_BITWISE},
    {.op = "sd_cuda_gather_rows", .run = run_gather_rows, .shape = {2400, 64, 0, 300}, .tol = TOL_BITWISE},
    // SwiGLU rows: f32 TOL_ELEM; bf16 the f32 rounded, bitwise, and TOL_BF16 vs the CPU.
    {.op = "sd_cuda_swiglu_rows", .note = "one row", .run = run_swiglu_rows, .shape = {1, 16}, .tol = TOL_ELEM},
    {.op = "sd_cuda_swiglu_rows", .note = "Kimi's experts", .run = run_swiglu_rows, .shape = {296, 1024}, .tol = TOL_ELEM},
    {.op = "sd_cuda_swiglu_rows", .note = "Kimi's dense FFN", .run = run_swiglu_rows, .shape = {33, 9216}, .tol = TOL_ELEM},
    {.op = "sd_cuda_swiglu_rows", .note = "odd I", .run = run_swiglu_rows, .shape = {5, 37}, .tol = TOL_ELEM},
    {.op = "sd_cuda_swiglu_rows", .note = "past one grid", .run = run_swiglu_rows, .shape = {3000, 768}, .tol = TOL_ELEM},
    // The weighted combine: the CPU's order, bitwise.
    {.op = "sd_cuda_moe_prefill_combine", .note = "Kimi's, one token", .run = run_moe_prefill_combine, .shape = {1, 8, 2304, 1}, .tol = TOL_BITWISE},
    {.op = "sd_cuda_moe_prefill_combine", .note = "Kimi's", .run = run_moe_prefill_combine, .shape = {37, 8, 2304, 1}, .tol = TOL_BITWISE},
    {.op = "sd_cuda_moe_prefill_combine", .note = "no shared expert", .run = run_moe_prefill_combine, .shape = {5, 2, 100, 0}, .tol = TOL_BITWISE},
    {.op = "sd_cuda_moe_prefill_combine", .run = run_moe_prefill_combine, .shape = {300, 6, 64, 1}, .tol = TOL_BITWISE},
    {.op = "sd_cuda_moe_prefill_combine", .note = "K = 1, rows past 256 threads", .run = run_moe_prefill_combine, .shape = {3, 1, 1000, 0}, .tol = TOL_BITWISE},
};

Test(cuda_ops, table, .timeout = 600) {
    NEED_GPU();
    const size_t n_cases = sizeof CASES / sizeof *CASES;
    for (size_t i = 0; i < n_cases; i++) {
        const op_case *c = &CASES[i];
        int ns = 8;
        while (ns > 0 && c->shape[ns - 1] == 0) ns--;
        char shape[96] = "";
        for (int k = 0, at = 0; k < ns && at < (int)sizeof shape; k++)
            at += snprintf(shape + at, sizeof shape - (size_t)at, "%s%d", k ? "," : "", c->shape[k]);
        snprintf(LABEL, sizeof LABEL, "case %zu/%zu %s [%s] %s%s%s", i + 1, n_cases, c->op, shape, sd_dtype_name(c->dt),
                 c->note ? ", " : "", c->note ? c->note : "");
        case_seed = 0x5eed0000ull + 1000003ull * (i + 1);
        c->run(c);
        CU(cudaDeviceSynchronize());
        CU(cudaGetLastError());
        cr_log_info("%s: ok (%s)", LABEL, c->tol == TOL_BITWISE ? "bitwise" : fmt("NMSE <= %.0e", c->tol));
    }
}

#endif
