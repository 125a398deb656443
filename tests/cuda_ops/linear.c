// linear.c — the op table's Linear cases (kernels/linear.h): sd_cuda_linear (a token alone ≡
// inside the call), sd_cuda_linear_multi's STORE, ADD and SwiGLU jobs in one launch, and
// sd_cuda_linear_multi_norm ≡ sd_cuda_rmsnorm then sd_cuda_linear_multi, each against the CPU.
#include "op_cases.h"
#include "linear.h" // sd_cuda_linear, sd_cuda_linear_multi, sd_cuda_linear_multi_norm
#include "ops.h"    // sd_linear, sd_rmsnorm, sd_silu (CPU)
#include "rows.h"   // sd_cuda_rmsnorm

// shape: rows, cols, T. y vs sd_linear; each token alone gives the bits it has inside the T-token
// call (verify ≡ decode).
void run_linear(const op_case *c) {
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
void run_linear_multi(const op_case *c) {
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
void run_linear_multi_norm(const op_case *c) {
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
