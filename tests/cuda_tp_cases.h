// cuda_tp_cases.h — the op cases of a device rank's kernels (kernels/tp_reduce.h, tp_head.h) and
// of a shard's synthesis (synth_fill.h's slice), for test_cuda_ops.c's table: each against its CPU
// twin in engine/parallel/ bit for bit, on host-built inputs (N ranks emulated as slices: no
// NCCL needed for the kernels themselves). Included by test_cuda_ops.c only (its harness).
#pragma once
#include "parallel/comm.h"  // sd_comm_sum_ranks
#include "parallel/head.h"  // sd_tp_argmax, sd_tp_argmax_combine
#include "parallel/plan.h"  // sd_tp_split
#include "tp_head.h"        // sd_cuda_tp_argmax_pairs, _combine, _lay_rows
#include "tp_reduce.h"      // sd_cuda_tp_reduce

_Static_assert(sizeof(sd_cuda_tp_pick) == sizeof(sd_tp_argmax), "the device pair is the host's");
_Static_assert(SD_CUDA_TP_MAX_RANKS == SD_TP_MAX_RANKS, "one rank limit");

// Rank r's partial of row j, element i: values whose sum depends on the order of the adds.
static float tp_partial(int r, int j, int i) {
    static const float big[] = {1e8f, -1e8f, 1.0f, 3e-1f, -7.0f};
    return big[(r + j) % 5] * (1.0f + 0.125f * (float)((j + i) % 4)) + (float)(r * 3 + j) * 1e-3f + (float)i * 1e-6f;
}

// shape: ranks N, rows T, D, accumulate. The gathered (N, T, D) partials summed in rank order
// bitwise as sd_comm_sum_ranks (then added into a residual row with accumulate, as the CPU's
// x += mix); and every row alone (a decode step's one-row message) gives the bits it has inside
// the T-row message (a verify's).
static void run_tp_reduce(const op_case *c) {
    const int N = c->shape[0], T = c->shape[1], D = c->shape[2], acc = c->shape[3];
    const size_t n = (size_t)T * D;
    float *g = xmalloc(sizeof(float) * N * n), *ref = xmalloc(sizeof(float) * n);
    for (int r = 0; r < N; r++)
        for (int j = 0; j < T; j++)
            for (int i = 0; i < D; i++) g[(size_t)r * n + (size_t)j * D + i] = tp_partial(r, j, i);
    float *h = rand_host(n, seed_of(0), 1.0f);
    sd_comm_sum_ranks(g, N, n, ref);
    for (size_t i = 0; acc && i < n; i++) ref[i] = h[i] + ref[i];
    gbuf dg = gbuf_of(g, (size_t)N * n), dout = acc ? gbuf_of(h, n) : gbuf_new(n);
    OK(sd_cuda_tp_reduce(dg.p, N, n, dout.p, acc, 0, &st_));
    float *got = gbuf_read(&dout, n);
    compare(c, fmt("%d ranks' sum of %d rows", N, T), got, ref, n);
    float *one = xmalloc(sizeof(float) * N * D);
    for (int j = 0; j < T; j++) { // row j alone: its N slices, one row each
        for (int r = 0; r < N; r++) memcpy(one + (size_t)r * D, g + (size_t)r * n + (size_t)j * D, sizeof(float) * D);
        gbuf d1 = gbuf_of(one, (size_t)N * D), o1 = acc ? gbuf_of(h + (size_t)j * D, D) : gbuf_new(D);
        OK(sd_cuda_tp_reduce(d1.p, N, D, o1.p, acc, 0, &st_));
        float *alone = gbuf_read(&o1, D);
        same_bits(fmt("row %d alone vs inside %d rows", j, T), alone, got + (size_t)j * D, D);
        free(alone);
        gbuf_done(&d1, "one row's partials");
        gbuf_done(&o1, "one row");
    }
    gbuf_done(&dg, "partials");
    gbuf_done(&dout, "sum");
    free(g); free(ref); free(h); free(got); free(one);
}

// n rows of V logits with what the combine must get right: ties inside a slice and across a
// slice boundary (the lower id wins), a row whose maximum is in the last rank, an all-NaN row
// (0), NaN beside the maximum.
static float *tp_logit_rows(int n, int V, uint64_t seed) {
    float *x = rand_host((size_t)n * V, seed, 4.0f);
    for (int t = 0; t < n; t++) {
        float *row = x + (size_t)t * V;
        switch (t % 5) {
        case 0: row[V / 2] = row[V / 2 + 1] = 9.0f; break;              // a tie straddling the middle
        case 1: row[V - 1] = 9.0f; break;                                // in the last slice
        case 2: for (int v = 0; v < V; v++) row[v] = NAN; break;         // all NaN: 0
        case 3: row[0] = NAN; row[1] = 9.0f; row[V - 1] = 9.0f; break;  // NaN never wins; the tie to id 1
        default: break;
        }
    }
    return x;
}

// shape: ranks N, rows n, V. Each rank's slice (sd_tp_split) through the local argmax and
// sd_cuda_tp_argmax_pairs, the N ranks' pairs gathered, sd_cuda_tp_argmax_combine: each row's
// result is sd_argmax of the whole row, and the pairs are the host's (value, global id) rule.
static void run_tp_argmax(const op_case *c) {
    const int N = c->shape[0], n = c->shape[1], V = c->shape[2];
    float *x = tp_logit_rows(n, V, seed_of(0));
    sd_cuda_tp_pick *all = xmalloc(sizeof *all * (size_t)N * n);
    int *want = xmalloc(sizeof(int) * n);
    for (int r = 0; r < N; r++) {
        const sd_tp_range v = sd_tp_split(V, N, r);
        float *slice = xmalloc(sizeof(float) * ((size_t)n * v.count + 1));
        for (int t = 0; t < n; t++) memcpy(slice + (size_t)t * v.count, x + (size_t)t * V + v.first, sizeof(float) * v.count);
        gbuf ds = gbuf_of(slice, (size_t)n * v.count), di = gbuf_zero(n), dp = gbuf_new(2 * (size_t)n);
        gbuf ws = gbuf_zero(SD_ARGMAX_WS_INTS(n));
        OK(sd_cuda_argmax(ds.p, n, v.count, IP(di), IP(ws), 0, &st_));
        OK(sd_cuda_tp_argmax_pairs(ds.p, n, v.count, v.first, IP(di), (sd_cuda_tp_pick *)dp.p, 0, &st_));
        gbuf_get(&dp, all + (size_t)r * n, 2 * (size_t)n);
        for (int t = 0; t < n; t++) { // the host's rule for the pair
            const sd_cuda_tp_pick p = all[(size_t)r * n + t];
            if (!v.count) { cr_assert_eq(p.index, -1, "%s: rank %d holds no row, row %d's pair %d", LABEL, r, t, p.index); continue; }
            const float *row = slice + (size_t)t * v.count;
            const int i = sd_argmax(row, v.count);
            const int id = isnan(row[i]) ? -1 : v.first + i;
            cr_assert_eq(p.index, id, "%s: rank %d row %d: pair id %d, want %d", LABEL, r, t, p.index, id);
            if (id >= 0) same_bits(fmt("rank %d row %d: pair value", r, t), &p.value, &row[i], 1);
        }
        gbuf_done(&ds, "slice");
        gbuf_done(&di, "local argmax");
        gbuf_done(&dp, "pairs");
        gbuf_done(&ws, "argmax workspace");
        free(slice);
    }
    for (int t = 0; t < n; t++) {
        want[t] = sd_argmax(x + (size_t)t * V, V);
        sd_tp_argmax col[SD_TP_MAX_RANKS];
        for (int r = 0; r < N; r++) memcpy(&col[r], &all[(size_t)r * n + t], sizeof col[r]);
        cr_assert_eq(sd_tp_argmax_combine(col, N), want[t], "%s: the host combine of row %d", LABEL, t);
    }
    gbuf da = gbuf_of(all, 2 * (size_t)N * n), dout = gbuf_new(n);
    OK(sd_cuda_tp_argmax_combine((const sd_cuda_tp_pick *)da.p, N, n, IP(dout), 0, &st_));
    int *got = gbuf_read(&dout, n);
    compare(c, fmt("%d rows' combined argmax over %d ranks vs sd_argmax of the whole row", n, N), got, want, n);
    gbuf_done(&da, "gathered pairs");
    gbuf_done(&dout, "argmax");
    free(x); free(all); free(want); free(got);
}

// shape: ranks N, rows n, V. Every rank's n × count slice in its block of n × vocab_max floats
// (the gathered head logits), laid into whole rows: the whole rows, bitwise.
static void run_tp_lay_rows(const op_case *c) {
    const int N = c->shape[0], n = c->shape[1], V = c->shape[2];
    const int vmax = sd_tp_split(V, N, 0).count;
    const size_t block = (size_t)n * vmax;
    float *x = rand_host((size_t)n * V, seed_of(0), 4.0f), *g = rand_host((size_t)N * block, seed_of(1), 1.0f);
    sd_cuda_tp_vocab v = {.ranks = N};
    for (int r = 0; r < N; r++) {
        const sd_tp_range s = sd_tp_split(V, N, r);
        v.first[r] = s.first;
        v.count[r] = s.count;
        for (int t = 0; t < n; t++) memcpy(g + r * block + (size_t)t * s.count, x + (size_t)t * V + s.first, sizeof(float) * s.count);
    }
    gbuf dg = gbuf_of(g, (size_t)N * block), dout = gbuf_new((size_t)n * V);
    OK(sd_cuda_tp_lay_rows(dg.p, &v, n, block, V, dout.p, 0, &st_));
    float *got = gbuf_read(&dout, (size_t)n * V);
    compare(c, "whole rows", got, x, (size_t)n * V);
    gbuf_done(&dg, "gathered slices");
    gbuf_done(&dout, "rows");
    free(x); free(g); free(got);
}

// shape: bf16, the slice (0 rows, 1 columns, 2 a vector span), ranks N, rank r. The slice of a
// synthesised tensor of configs/tiny.json that rank r of N would hold (sd_tp_split of its rows,
// columns or floats), generated alone: the whole tensor's bytes there (the host generator's).
static void run_synth_fill_slice(const op_case *c) {
    const bool bf16 = c->shape[0] != 0;
    const int kind = c->shape[1], N = c->shape[2], r = c->shape[3];
    const sd_dtype dt = bf16 ? SD_DT_BF16 : SD_DT_F32;
    sd_config cfg;
    load_config("configs/tiny.json", &cfg);
    const sd_synth_opts o = {.seed = 0x0ddba11ull ^ case_seed, .dtype = dt, .tail_from = SD_MAX_LAYERS, .tail_scale = 1.0f};
    sd_model m;
    sd_status st = {0};
    cr_assert_eq(sd_synth_model(&m, &cfg, &o, &st), SD_OK, "%s", st.msg);
    const sd_weight_spec *pick = NULL; // the largest matrix (kind 0, 1) or vector (kind 2) of the dtype
    for (int i = 0; i < m.w.n_specs; i++) {
        const sd_weight_spec *s = &m.w.specs[i];
        const bool want = kind == 2 ? !s->keep_dtype : s->keep_dtype && s->dtype == dt;
        if (want && (!pick || s->shape[0] * (s->ndim == 2 ? s->shape[1] : 1) > pick->shape[0] * (pick->ndim == 2 ? pick->shape[1] : 1)))
            pick = s;
    }
    cr_assert(pick, "%s: no such tensor", LABEL);
    const int64_t rows = pick->shape[0], cols = pick->ndim == 2 ? pick->shape[1] : 1, total = rows * cols;
    const sd_tp_range s = sd_tp_split((int)(kind == 0 ? rows : kind == 1 ? cols : total), N, r);
    const int64_t n = kind == 0 ? s.count * cols : kind == 1 ? rows * s.count : s.count;
    const int64_t base = kind == 0 ? s.first * cols : s.first, width = kind == 1 ? s.count : n, stride = kind == 1 ? cols : n;
    const size_t es = kind == 2 ? 4 : sd_dtype_size(dt), words = ((size_t)n * es + 3) / 4;
    unsigned char *want = xmalloc((size_t)n * es + 4);
    const unsigned char *src = sd_weight_data(pick);
    for (int64_t i = 0; i < n; i++) memcpy(want + i * es, src + (base + (i / width) * stride + i % width) * es, es);
    const sd_synth_tensor p = sd_synth_tensor_params(pick, &m.cfg, &o);
    gbuf d = gbuf_new(words ? words : 1);
    OK(sd_cuda_synth_fill_slice(d.p, n, kind != 2 && bf16, o.seed, p.name_hash, p.scale, p.offset, base, width ? width : 1,
                                stride ? stride : 1, 0, &st_));
    unsigned char *got = gbuf_read(&d, words ? words : 1);
    cr_log_info("%s: %s, rank %d of %d holds %lld of %lld elements", LABEL, pick->name, r, N, (long long)n, (long long)total);
    cr_assert(memcmp(got, want, (size_t)n * es) == 0, "%s: %s: the slice differs from the whole tensor's elements", LABEL, pick->name);
    gbuf_done(&d, "slice");
    free(got); free(want);
    sd_model_free(&m);
}
