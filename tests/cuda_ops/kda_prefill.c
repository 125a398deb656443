// kda_prefill.c — the op table's KDA prefill cases (kernels/kda_prefill.h): the conv and the ring
// write, the chunked recurrence against both CPU forms, the gated output norm.
#include "op_cases.h"
#include "kda_prefill.h" // sd_cuda_kda_prefill_conv, _ring, _out, sd_cuda_kda_chunk, SD_KDA_CHUNK
#include "kda_scan.h"    // sd_kda_step, sd_kda_chunk_head (CPU)
#include "ops.h"         // sd_rmsnorm, sd_softplus, sd_sigmoid (CPU)

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
// ring holding earlier positions' rows: qkvc vs conv_twin (op_cases.h); the gate and β in place vs
// −exp(A_log)·softplus(gate + dt_bias) and sigmoid (TOL_ELEM); β's padding (ld_b = H + bpad) and the
// ring bitwise (the last min(T, W−1) raw rows at their positions, every other row as it was). With
// split: the same tokens as two pieces, split then T − split (the second's history from the first's
// ring rows), ≡ the one call, bitwise — a piece boundary changes nothing.
void run_kda_prefill_conv(const op_case *c) {
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
void run_kda_chunk(const op_case *c) {
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
void run_kda_prefill_out(const op_case *c) {
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
