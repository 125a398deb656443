// rows.c — the op table's row cases (kernels/rows.h): sd_cuda_rmsnorm against sd_rmsnorm, and
// sd_cuda_embed's rows widened exactly against sd_mat_row_f32.
#include "op_cases.h"
#include "ops.h"  // sd_rmsnorm, sd_mat_row_f32 (CPU)
#include <string.h>
#include "finite.h" // sd_cuda_finite_reset
#include "rows.h"   // sd_cuda_embed, sd_cuda_rmsnorm, sd_cuda_rmsnorm_flagged

// shape: rows, n, in place (out aliases x). vs sd_rmsnorm per row.
void run_rmsnorm(const op_case *c) {
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

// shape: rows, n. sd_cuda_rmsnorm_flagged: the same bits as sd_cuda_rmsnorm on finite rows with
// the flag untouched; a NaN, an Inf and a -Inf planted in rows in turn set the flag to the lowest
// site that saw one, exactly (finite.h's reset first).
void run_rmsnorm_flagged(const op_case *c) {
    const int rows = c->shape[0], n = c->shape[1];
    const size_t nx = (size_t)rows * n;
    float *x = rand_host(nx, seed_of(0), 2.0f), *w = rand_host(n, seed_of(1), 1.0f);
    gbuf dx = gbuf_of(x, nx), dw = gbuf_of(w, n), dy = gbuf_new(nx), dr = gbuf_new(nx), flag = gbuf_new(1);
    OK(sd_cuda_finite_reset(IP(flag), 0, &st_));
    OK(sd_cuda_rmsnorm(dx.p, dw.p, rows, n, 1e-5f, dr.p, 0, &st_));
    OK(sd_cuda_rmsnorm_flagged(dx.p, dw.p, rows, n, 1e-5f, dy.p, IP(flag), 3, 0, &st_));
    float *got = gbuf_read(&dy, nx), *ref = gbuf_read(&dr, nx);
    cr_assert(memcmp(got, ref, sizeof(float) * nx) == 0, "%s: the flagged norm's bits differ from sd_cuda_rmsnorm's", LABEL);
    int f;
    gbuf_get(&flag, &f, 1);
    cr_assert_eq(f, 0x7fffffff, "%s: finite rows set the flag to %d", LABEL, f);
    const float planted[3] = {NAN, INFINITY, -INFINITY};
    const int sites[3] = {9, 4, 6}; // the flag keeps 4
    uint64_t r = seed_of(2);
    for (int k = 0; k < 3; k++) {
        x[(size_t)rng_int(&r, (int)nx)] = planted[k];
        gbuf_put(&dx, x, nx);
        OK(sd_cuda_rmsnorm_flagged(dx.p, dw.p, rows, n, 1e-5f, dy.p, IP(flag), sites[k], 0, &st_));
        gbuf_get(&flag, &f, 1);
        const int want = k == 0 ? 9 : 4;
        cr_assert_eq(f, want, "%s: after planting %g at site %d the flag is %d, want %d", LABEL, planted[k], sites[k], f, want);
    }
    gbuf_done(&dy, "out");
    gbuf_done(&dr, "ref");
    gbuf_done(&dx, "x");
    gbuf_done(&dw, "w");
    gbuf_done(&flag, "flag");
    free(x); free(w); free(got); free(ref);
}

// shape: V, D, T, pinned (the token ids in pinned host memory, as the forward passes them, instead
// of device memory). Rows widened exactly: bitwise vs sd_mat_row_f32.
void run_embed(const op_case *c) {
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
