// moe_grouped.c — the op table's cases for the prefill's grouped expert GEMMs (kernels/moe_grouped.h):
// the tile list from the counts, and both GEMMs over it against float64 of the same bf16 values.
#include "op_cases.h"
#include "moe_grouped.h" // sd_cuda_moe_grouped_tiles, sd_cuda_moe_grouped_gemm

// Counts of E experts summing to n, at random; with `skew` expert 0 takes a third of the rows (an
// expert of several tiles) and every third expert none.
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

// shape: E, n, Ie, D, op (SD_MOE_GROUPED_UP or _DOWN), skew. The offsets and the tile list vs the
// host's (experts ascending, tiles of SD_MOE_GROUPED_BM rows), bitwise; then y (n, N) vs float64 of
// the same bf16 activations and weights (TOL_MMA), nothing written past its n rows.
void run_moe_grouped(const op_case *c) {
    const int E = c->shape[0], n = c->shape[1], Ie = c->shape[2], D = c->shape[3], skew = c->shape[5];
    const sd_moe_grouped_op op = (sd_moe_grouped_op)c->shape[4];
    const int N = op == SD_MOE_GROUPED_UP ? 2 * Ie : D, K = op == SD_MOE_GROUPED_UP ? D : Ie;
    const int max_tiles = sd_moe_grouped_max_tiles(n, E);
    int *counts = random_counts(E, n, skew, seed_of(0)), *offsets = xmalloc(sizeof(int) * E);
    int *tiles = xmalloc(sizeof(int) * 3 * (size_t)max_tiles), n_tiles = 0;
    int *row_expert = xmalloc(sizeof(int) * (n ? n : 1));
    for (int e = 0, off = 0; e < E; off += counts[e], e++) {
        offsets[e] = off;
        for (int r = 0; r < counts[e]; r++) row_expert[off + r] = e;
        for (int r = 0; r < counts[e]; r += SD_MOE_GROUPED_BM, n_tiles++) {
            tiles[3 * n_tiles] = e;
            tiles[3 * n_tiles + 1] = off + r;
            tiles[3 * n_tiles + 2] = counts[e] - r < SD_MOE_GROUPED_BM ? counts[e] - r : SD_MOE_GROUPED_BM;
        }
    }
    gbuf dcounts = gbuf_of(counts, E), doff = gbuf_new(E), dtiles = gbuf_new(3 * (size_t)max_tiles), dn = gbuf_new(1);
    OK(sd_cuda_moe_grouped_tiles(IP(dcounts), E, IP(doff), IP(dtiles), IP(dn), 0, &st_));
    int *got_off = gbuf_read(&doff, E), *got_n = gbuf_read(&dn, 1), *got_t = gbuf_read(&dtiles, 3 * (size_t)n_tiles);
    same_bits("offsets", got_off, offsets, E);
    cr_assert_eq(*got_n, n_tiles, "%s: %d tiles, want %d", LABEL, *got_n, n_tiles);
    same_bits("tiles", got_t, tiles, 3 * (size_t)n_tiles);

    // Every expert's gate, up (Ie, D) and down (D, Ie), bf16, and the device table of them.
    const size_t per = (size_t)Ie * D;
    uint16_t **w16 = xmalloc(sizeof(uint16_t *) * 3 * E);
    void **wdev = xmalloc(sizeof(void *) * 3 * E);
    sd_cuda_expert *table = xmalloc(sizeof(sd_cuda_expert) * E);
    for (int i = 0; i < 3 * E; i++) {
        float *f = rand_host(per, seed_of(10 + i), 1.7f / sqrtf((float)(i % 3 == 2 ? Ie : D)));
        w16[i] = bf16_of(f, per);
        free(f);
        CU(cudaMalloc(&wdev[i], 2 * per));
        CU(cudaMemcpy(wdev[i], w16[i], 2 * per, cudaMemcpyHostToDevice));
    }
    for (int e = 0; e < E; e++)
        table[e] = (sd_cuda_expert){.gate = wdev[3 * e], .up = wdev[3 * e + 1], .down = wdev[3 * e + 2],
                                    .gate_bf16 = 1, .up_bf16 = 1, .down_bf16 = 1};
    sd_cuda_expert *dtable;
    CU(cudaMalloc((void **)&dtable, sizeof *table * E));
    CU(cudaMemcpy(dtable, table, sizeof *table * E, cudaMemcpyHostToDevice));

    const size_t nx = (size_t)n * K, ny = (size_t)n * N;
    float *xf = rand_host(nx, seed_of(1), 1.0f);
    uint16_t *x16 = bf16_of(xf, nx);
    float *x = widen_bf16(x16, nx), *want = xmalloc(sizeof(float) * (ny ? ny : 1));
    for (int r = 0; r < n; r++) {
        const int e = row_expert[r];
        for (int o = 0; o < N; o++) {
            const uint16_t *wr = op == SD_MOE_GROUPED_DOWN ? w16[3 * e + 2] + (size_t)o * K
                                 : o < Ie                  ? w16[3 * e] + (size_t)o * K
                                                           : w16[3 * e + 1] + (size_t)(o - Ie) * K;
            double acc = 0;
            for (int k = 0; k < K; k++) acc += (double)x[(size_t)r * K + k] * sd_bf16_to_f32(wr[k]);
            want[(size_t)r * N + o] = (float)acc;
        }
    }
    gbuf dx = gbuf_halves(x16, nx), dy = gbuf_new(ny);
    OK(sd_cuda_moe_grouped_gemm(op, dtable, IP(dtiles), IP(dn), max_tiles, (const uint16_t *)dx.p, N, K, Ie, dy.p, 0, &st_));
    float *got = gbuf_read(&dy, ny);
    compare(c, "y", got, want, ny);
    gbuf *all[] = {&dcounts, &doff, &dtiles, &dn, &dx, &dy};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) gbuf_done(all[i], "grouped buffer");
    for (int i = 0; i < 3 * E; i++) {
        free(w16[i]);
        CU(cudaFree(wdev[i]));
    }
    CU(cudaFree(dtable));
    free(counts); free(offsets); free(tiles); free(row_expert); free(got_off); free(got_n); free(got_t);
    free(w16); free(wdev); free(table); free(xf); free(x16); free(x); free(want); free(got);
}
