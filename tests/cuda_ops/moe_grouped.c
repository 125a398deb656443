// moe_grouped.c — the op table's cases for the prefill's grouped expert GEMMs (kernels/moe_grouped.h):
// both GEMMs of a plan against float64 of the same bf16 values, each bf16 output within one
// rounding of its fp32 sum.
#include "op_cases.h"
#include "moe_grouped.h" // sd_cuda_moe_grouped_*

// Counts of E experts summing to n, at random; with `skew` expert 0 takes a third of the rows (an
// expert of many rows) and every third expert none.
static int *random_counts(int E, int n, int skew, uint64_t seed) {
    int *c = calloc((size_t)E, sizeof(int));
    uint64_t r = seed;
    int left = n;
    if (skew && E > 1) {
        c[0] = n / 3;
        left -= c[0];
    }
    while (left > 0) {
        const int e = rng_int(&r, E);
        if (skew && e % 3 == 2) continue;
        c[e]++;
        left--;
    }
    return c;
}

// want[r][o] = Σ_k x[r][k]·w_o[k] in float64 and mag[r][o] = Σ_k |x[r][k]·w_o[k]|, for the rows of
// every expert (row_expert) and the N output columns whose weight rows row_of gives.
typedef const uint16_t *(*weight_row_fn)(uint16_t *const *w16, int e, int o, int Ie, int K);
static const uint16_t *up_row(uint16_t *const *w16, int e, int o, int Ie, int K) {
    return o < Ie ? w16[3 * e] + (size_t)o * K : w16[3 * e + 1] + (size_t)(o - Ie) * K;
}
static const uint16_t *down_row(uint16_t *const *w16, int e, int o, int Ie, int K) {
    (void)Ie;
    return w16[3 * e + 2] + (size_t)o * K;
}
static void sums(const float *x, int n, int K, int N, int Ie, const int *row_expert, uint16_t *const *w16,
                 weight_row_fn row_of, double *want, double *mag) {
    for (int r = 0; r < n; r++)
        for (int o = 0; o < N; o++) {
            const uint16_t *wr = row_of(w16, row_expert[r], o, Ie, K);
            double acc = 0, abs_acc = 0;
            for (int k = 0; k < K; k++) {
                const double p = (double)x[(size_t)r * K + k] * sd_bf16_to_f32(wr[k]);
                acc += p;
                abs_acc += fabs(p);
            }
            want[(size_t)r * N + o] = acc;
            mag[(size_t)r * N + o] = abs_acc;
        }
}

// got (bf16) against the float64 sums, element by element, then as a whole (NMSE, the case's
// tolerance). The device's fp32 sum a of the K products (each exact in fp32: bf16 · bf16) is
// within e = 2K·2^-23·Σ|x·w| of want — at most 2K truncations (a product aligned into a step, a
// partial sum), each by at most 2^-23 of a magnitude no larger than Σ|x·w| — and got is a rounded
// once to bf16 (nearest even): |got − a| <= 2^-8·|a|. So |got − want| <= 2^-8·(|want| + e) + e.
static void check_rounded_sums(const op_case *c, const char *what, const uint16_t *got, const double *want,
                               const double *mag, size_t n, int K) {
    float *wide = widen_bf16(got, n), *want_f = xmalloc(sizeof(float) * (n ? n : 1));
    for (size_t i = 0; i < n; i++) {
        const double e = 2.0 * K * ldexp(mag[i], -23), bound = ldexp(fabs(want[i]) + e, -8) + e;
        const double err = fabs((double)wide[i] - want[i]);
        cr_assert(err <= bound, "%s: %s [%zu]: %.9g, want %.9g (|error| %.3g > %.3g: one bf16 rounding of an fp32 sum)",
                  LABEL, what, i, wide[i], want[i], err, bound);
        want_f[i] = (float)want[i];
    }
    compare(c, what, wide, want_f, n);
    free(wide);
    free(want_f);
}

// shape: E, n, Ie, D, stacked (each expert's gate and up in one allocation, one after the other:
// one [gate | up] problem; else two), skew. A first plan (other counts, another stream) runs on the
// same handle, then the plan checked: h (n, 2·Ie) = [x·gateᵀ | x·upᵀ] and y (n, D) = hb·downᵀ of
// every expert's rows vs float64 (check_rounded_sums), x and hb untouched, nothing written past
// the buffers.
void run_moe_grouped(const op_case *c) {
    const int E = c->shape[0], n = c->shape[1], Ie = c->shape[2], D = c->shape[3], stacked = c->shape[4], skew = c->shape[5];
    int *counts = random_counts(E, n, skew, seed_of(0)), *first = random_counts(E, n, !skew, seed_of(2));
    int *row_expert = xmalloc(sizeof(int) * (n ? n : 1));
    for (int e = 0, off = 0; e < E; off += counts[e], e++)
        for (int r = 0; r < counts[e]; r++) row_expert[off + r] = e;

    // Every expert's gate, up (Ie, D) and down (D, Ie), bf16, and the host table of their device copies.
    const size_t per = (size_t)Ie * D;
    uint16_t **w16 = xmalloc(sizeof(uint16_t *) * 3 * E);
    void **alloc = xmalloc(sizeof(void *) * 3 * E);
    sd_cuda_expert *table = xmalloc(sizeof(sd_cuda_expert) * E);
    for (int i = 0; i < 3 * E; i++) {
        float *f = rand_host(per, seed_of(10 + i), 1.7f / sqrtf((float)(i % 3 == 2 ? Ie : D)));
        w16[i] = bf16_of(f, per);
        free(f);
    }
    for (int e = 0; e < E; e++) {
        CU(cudaMalloc(&alloc[3 * e], 2 * per * (stacked ? 2 : 1)));
        alloc[3 * e + 1] = NULL;
        if (!stacked) CU(cudaMalloc(&alloc[3 * e + 1], 2 * per));
        CU(cudaMalloc(&alloc[3 * e + 2], 2 * per));
        uint16_t *gate = alloc[3 * e], *up = stacked ? gate + per : alloc[3 * e + 1], *down = alloc[3 * e + 2];
        CU(cudaMemcpy(gate, w16[3 * e], 2 * per, cudaMemcpyHostToDevice));
        CU(cudaMemcpy(up, w16[3 * e + 1], 2 * per, cudaMemcpyHostToDevice));
        CU(cudaMemcpy(down, w16[3 * e + 2], 2 * per, cudaMemcpyHostToDevice));
        table[e] = (sd_cuda_expert){.gate = gate, .up = up, .down = down, .gate_bf16 = 1, .up_bf16 = 1, .down_bf16 = 1};
    }

    const size_t nx = (size_t)n * D, nh = (size_t)n * 2 * Ie, nhb = (size_t)n * Ie;
    float *xf = rand_host(nx, seed_of(1), 1.0f), *hbf = rand_host(nhb, seed_of(3), 1.0f);
    uint16_t *x16 = bf16_of(xf, nx), *hb16 = bf16_of(hbf, nhb);
    float *x = widen_bf16(x16, nx), *hb = widen_bf16(hb16, nhb);
    double *h_want = xmalloc(sizeof(double) * (nh ? nh : 1)), *h_mag = xmalloc(sizeof(double) * (nh ? nh : 1));
    double *y_want = xmalloc(sizeof(double) * (nx ? nx : 1)), *y_mag = xmalloc(sizeof(double) * (nx ? nx : 1));
    sums(x, n, D, 2 * Ie, Ie, row_expert, w16, up_row, h_want, h_mag);
    sums(hb, n, Ie, D, Ie, row_expert, w16, down_row, y_want, y_mag);

    gbuf dx = gbuf_halves(x16, nx), dh = gbuf_halves(NULL, nh), dhb = gbuf_halves(hb16, nhb), dy = gbuf_halves(NULL, nx);
    sd_moe_grouped *g = NULL;
    OK(sd_cuda_moe_grouped_create(&g, E, &st_));
    cudaStream_t other;
    CU(cudaStreamCreate(&other));
    const int *plans[2] = {first, counts};
    const cudaStream_t streams[2] = {other, 0};
    for (int p = 0; p < 2; p++) {
        OK(sd_cuda_moe_grouped_plan(g, table, plans[p], E, D, Ie, (const uint16_t *)dx.p, (uint16_t *)dh.p,
                                    (const uint16_t *)dhb.p, (uint16_t *)dy.p, streams[p], &st_));
        OK(sd_cuda_moe_grouped_gemm(g, SD_MOE_GROUPED_UP, streams[p], &st_));
        OK(sd_cuda_moe_grouped_gemm(g, SD_MOE_GROUPED_DOWN, streams[p], &st_));
        CU(cudaStreamSynchronize(streams[p]));
    }
    uint16_t *got_h = read_halves(&dh, nh), *got_y = read_halves(&dy, nx);
    check_rounded_sums(c, "h = [x·gateᵀ | x·upᵀ]", got_h, h_want, h_mag, nh, D);
    check_rounded_sums(c, "y = hb·downᵀ", got_y, y_want, y_mag, nx, Ie);
    same_halves("x untouched", &dx, x16, nx);
    same_halves("hb untouched", &dhb, hb16, nhb);
    sd_moe_grouped_free(g);
    CU(cudaStreamDestroy(other));
    gbuf *all[] = {&dx, &dh, &dhb, &dy};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) gbuf_done(all[i], "grouped buffer");
    for (int i = 0; i < 3 * E; i++) {
        free(w16[i]);
        if (alloc[i]) CU(cudaFree(alloc[i]));
    }
    free(counts); free(first); free(row_expert); free(w16); free(alloc); free(table);
    free(xf); free(hbf); free(x16); free(hb16); free(x); free(hb);
    free(h_want); free(h_mag); free(y_want); free(y_mag); free(got_h); free(got_y);
}
