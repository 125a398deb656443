// moe_prefill.c — the op table's MoE prefill cases (kernels/moe_prefill.h): the routing, the
// grouping's counts and rows, the gathered rows, the SwiGLU rows and the weighted combine.
#include "op_cases.h"
#include "layers.h"      // sd_moe_route, sd_moe_weights (CPU)
#include "moe_prefill.h" // sd_cuda_moe_prefill_*, sd_cuda_gather_rows, sd_cuda_swiglu_rows
#include "moe_route.h"   // sd_cuda_moe_groups_ints, sd_cuda_moe_groups_host
#include "ops.h"         // sd_silu, sd_sigmoid (CPU)

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
void run_moe_prefill_select(const op_case *c) {
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
void run_moe_prefill_group(const op_case *c) {
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
void run_gather_rows(const op_case *c) {
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

// shape: n, I, h_bf16. h rows (2I: gate·x, then up·x; with h_bf16 stored as bf16, as the grouped
// GEMM writes them); out f32 vs sd_silu(gate)·up of the values as stored (TOL_ELEM), bf16 the f32
// output rounded, bitwise, and vs the CPU (TOL_BF16); h untouched.
void run_swiglu_rows(const op_case *c) {
    const int n = c->shape[0], I = c->shape[1], h_bf16 = c->shape[2];
    const size_t nh = (size_t)n * 2 * I, no = (size_t)n * I;
    float *h = rand_host(nh, seed_of(0), 4.0f), *ref = xmalloc(sizeof(float) * no);
    uint16_t *h16 = bf16_of(h, nh);
    if (h_bf16)
        for (size_t i = 0; i < nh; i++) h[i] = sd_bf16_to_f32(h16[i]);
    for (int r = 0; r < n; r++)
        for (int i = 0; i < I; i++) ref[(size_t)r * I + i] = sd_silu(h[(size_t)r * 2 * I + i]) * h[(size_t)r * 2 * I + I + i];
    gbuf dh = h_bf16 ? gbuf_halves(h16, nh) : gbuf_of(h, nh), o32 = gbuf_new(no), o16 = gbuf_halves(NULL, no);
    OK(sd_cuda_swiglu_rows(dh.p, h_bf16, n, I, o32.p, false, 0, &st_));
    OK(sd_cuda_swiglu_rows(dh.p, h_bf16, n, I, o16.p, true, 0, &st_));
    float *got = gbuf_read(&o32, no);
    compare(c, "out (f32)", got, ref, no);
    uint16_t *want16 = bf16_of(got, no), *got16 = read_halves(&o16, no);
    check_halves("out (bf16): the f32 output rounded", got16, want16, no);
    float *wide = widen_bf16(got16, no);
    check_close(TOL_BF16, "out (bf16) vs the CPU", wide, ref, no);
    if (h_bf16) same_halves("h untouched", &dh, h16, nh);
    else {
        float *h_back = gbuf_read(&dh, nh);
        same_bits("h untouched", h_back, h, nh);
        free(h_back);
    }
    gbuf *all[] = {&dh, &o32, &o16};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) gbuf_done(all[i], "swiglu buffer");
    free(h); free(h16); free(ref); free(got); free(want16); free(got16); free(wide);
}

// shape: T, K, D, shared, y_bf16. y: the T·K grouped rows (with y_bf16 stored as bf16, as the
// grouped GEMM writes them), inv a random permutation (entry → row), w, x the residual stream:
// x[t] += Σ_j w·y[inv] (+ shared[t]) over the y values as stored vs the CPU's order
// (engine/cpu/moe.c: the slots from j = 0, then the shared expert's row, then the residual add),
// bitwise — neither side contracts a multiply-add (--fmad=false, -ffp-contract=off).
void run_moe_prefill_combine(const op_case *c) {
    const int T = c->shape[0], K = c->shape[1], D = c->shape[2], with_shared = c->shape[3], y_bf16 = c->shape[4], n = T * K;
    const size_t ny = (size_t)n * D;
    float *y = rand_host(ny, seed_of(0), 1.0f), *w = rand_in((size_t)n, seed_of(1), 0.05f, 0.6f);
    uint16_t *y16 = bf16_of(y, ny);
    if (y_bf16)
        for (size_t i = 0; i < ny; i++) y[i] = sd_bf16_to_f32(y16[i]);
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
    gbuf dy = y_bf16 ? gbuf_halves(y16, ny) : gbuf_of(y, ny), dinv = gbuf_of(inv, n), dw = gbuf_of(w, n);
    gbuf dsh = gbuf_of(sh, (size_t)T * D), dx = gbuf_of(x, (size_t)T * D);
    OK(sd_cuda_moe_prefill_combine(dy.p, y_bf16, IP(dinv), dw.p, with_shared ? dsh.p : NULL, T, K, D, dx.p, 0, &st_));
    float *got = gbuf_read(&dx, (size_t)T * D);
    compare(c, with_shared ? "x (+ the shared expert's rows)" : "x (no shared expert)", got, ref, (size_t)T * D);
    gbuf *all[] = {&dy, &dinv, &dw, &dsh, &dx};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) gbuf_done(all[i], "combine buffer");
    free(y); free(y16); free(w); free(sh); free(x); free(inv); free(ref); free(got);
}
