// gemm.c — the op table's cases for the cuBLASLt wrapper (kernels/gemm.h): its bf16 conversion,
// sd_cuda_to_bf16, bitwise; the GEMMs against float64, both weight dtypes a case.
#include "op_cases.h"
#include "gemm.h" // sd_gemm_create, sd_gemm_run, sd_gemm_linear, sd_gemm_linear_bf16, sd_cuda_to_bf16

// shape: n, edges (1: the first entries are the values below). y bitwise vs sd_f32_to_bf16 (nearest
// even on the bits: ties, overflow to ±inf, subnormals kept), except that a NaN is checked as a NaN
// (its payload is the device's); nothing past the n halves written (n = 0: nothing at all).
void run_to_bf16(const op_case *c) {
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

// A case's .op names the wrapper's calls it makes: sd_gemm_create, sd_gemm_run and sd_cuda_to_bf16;
// sd_gemm_linear and sd_gemm_linear_bf16 too where the shape is a Linear's (batch 1, WT).
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
void run_gemm(const op_case *c) {
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
