// kda.c — the op table's KDA decode cases (kernels/kda.h): the conv against its twin (op_cases.h),
// the scan against sd_kda_step, the output norm and gate; T one-token calls ≡ the T-token call.
#include "op_cases.h"
#include "cursor.h"   // sd_cuda_cursor_advance, sd_pos_fixed, sd_pos_cursor
#include "kda.h"      // sd_cuda_kda_conv, sd_cuda_kda_scan, sd_cuda_kda_out
#include "kda_scan.h" // sd_kda_step (CPU)
#include "ops.h"      // sd_linear, sd_rmsnorm, sd_softplus, sd_sigmoid (CPU)

typedef struct { float *ring, *qc, *kc, *vc, *gate, *gb; } conv_out;

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
void run_kda_conv(const op_case *c) {
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
void run_kda_scan(const op_case *c) {
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
void run_kda_out(const op_case *c) {
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
