// sampling.c — the op table's cases for a round's token work: argmax, softmax and sampling
// (kernels/sampling.h), acceptance (acceptance.h), the round's bookkeeping (round.h) and the
// weight synthesis (synth_fill.h), each bitwise or within TOL_ELEM of the CPU.
#include "op_cases.h"
#include "accept.h"     // sd_accept_ref (CPU)
#include "acceptance.h" // sd_cuda_accept
#include "philox.h"     // sd_uniform
#include "round.h"      // sd_cuda_round_publish
#include "sample.h"     // sd_argmax, sd_softmax, sd_sample (CPU)
#include "sampling.h"   // sd_cuda_argmax, sd_cuda_softmax, sd_cuda_sample_rows, sd_draw_fixed
#include "synth_fill.h" // sd_cuda_synth_fill

// shape: rows, n, pattern, pinned (out in pinned host memory). Pattern 0 (rows >= 4): random rows,
// a tie (the first index wins), all NaN (index 0), NaN with a later maximum (NaN never wins).
// Pattern 1 (rows == 2, vocabulary-sized): the maximum in the last slice after a NaN, a tie across
// slices; all rows, then one, with the same workspace (a verify, then a decode), so each call's
// tickets sit where earlier calls left partials. Bitwise vs sd_argmax; the tickets left zero.
void run_argmax(const op_case *c) {
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
void run_softmax(const op_case *c) {
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
void run_sample_rows(const op_case *c) {
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
void run_accept(const op_case *c) {
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
void run_round_publish(const op_case *c) {
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
void run_synth_fill(const op_case *c) {
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
