// mla.c — the op table's MLA decode cases (kernels/mla.h): sd_cuda_mla_attend's cache write and
// absorbed attention against the CPU twins; T one-token calls ≡ the T-token call.
#include "op_cases.h"
#include "cursor.h" // sd_cuda_cursor_advance, sd_pos_fixed, sd_pos_cursor
#include "mla.h"    // sd_cuda_mla_attend, sd_mla_write, SD_MLA_SPLIT
#include "ops.h"    // sd_rmsnorm, sd_dot_f32, sd_mat_row_f32, sd_mat_dot_row (CPU)

// One attend call's inputs (host).
typedef struct {
    int Hm, dn, dr, dv, R, T, pos0, cap;
    bool rope;
    double theta;
    float eps;
    tmat kvb;                             // (Hm·(dn+dv), R)
    float *mq, *kv, *kv_norm, *c, *kpe;   // (T, Hm·(dn+dr)), (T, R+dr), (R); cache (cap, R), (cap, dr)
} mla_in;
typedef struct { float *mq, *c, *kpe, *mo; } mla_out;

// The CPU twin of one head's attention (MODEL.md "MLA", absorbed; engine/cpu/mla.c attend, not
// separable from sd_mla_forward): q̃ = Σ_i qn[i]·W_UK,h[i] (i increasing); score_j =
// (q̃·c_j + qp·kpe_j)·(dn+dr)^-½ for j <= pos; p = softmax (max subtracted, sum in j order);
// lat = Σ_j p_j c_j; o = W_UV,h · lat.
static void attend_twin(const mla_in *in, const float *qh, const float *c, const float *kpe, int h, int pos, float *o) {
    const int R = in->R, dn = in->dn, dr = in->dr, row0 = h * (dn + in->dv);
    float *qabs = xmalloc(sizeof(float) * R), *lat = xmalloc(sizeof(float) * R), *wrow = xmalloc(sizeof(float) * R);
    float *scores = xmalloc(sizeof(float) * (pos + 1));
    for (int r = 0; r < R; r++) qabs[r] = lat[r] = 0.0f;
    for (int i = 0; i < dn; i++) {
        sd_mat_row_f32(&in->kvb.host, row0 + i, wrow);
        for (int r = 0; r < R; r++) qabs[r] += qh[i] * wrow[r];
    }
    const float scale = 1.0f / sqrtf((float)(dn + dr));
    float mx = -INFINITY, sum = 0.0f;
    for (int j = 0; j <= pos; j++) {
        scores[j] = (sd_dot_f32(qabs, c + (size_t)j * R, R) + sd_dot_f32(qh + dn, kpe + (size_t)j * dr, dr)) * scale;
        if (scores[j] > mx) mx = scores[j];
    }
    for (int j = 0; j <= pos; j++) {
        scores[j] = expf(scores[j] - mx);
        sum += scores[j];
    }
    const float inv = 1.0f / sum;
    for (int j = 0; j <= pos; j++) {
        const float p = scores[j] * inv;
        for (int r = 0; r < R; r++) lat[r] += p * c[(size_t)j * R + r];
    }
    for (int v = 0; v < in->dv; v++) o[v] = sd_mat_dot_row(&in->kvb.host, row0 + dn + v, lat);
    free(qabs); free(lat); free(wrow); free(scores);
}

// shape[7] & 2: settled, & 4: the position from a device cursor; per_token: T calls of one token.
static mla_out mla_on_device(const op_case *c, const mla_in *in, bool per_token) {
    const int settled = (c->shape[7] & 2) != 0, via_cursor = (c->shape[7] & 4) != 0;
    const int Hm = in->Hm, R = in->R, dr = in->dr, T = in->T, qw = in->dn + dr;
    const size_t nq = (size_t)T * Hm * qw, nkv = (size_t)T * (R + dr), nc = (size_t)in->cap * R, nk = (size_t)in->cap * dr;
    const size_t nmo = (size_t)T * Hm * in->dv;
    gbuf mq = gbuf_of(in->mq, nq), kv = gbuf_of(in->kv, nkv), kvn = gbuf_of(in->kv_norm, R), cc = gbuf_of(in->c, nc);
    gbuf kp = gbuf_of(in->kpe, nk), qabs = gbuf_new((size_t)T * Hm * R), mo = gbuf_new(nmo), cur = cursor_at(in->pos0);
    gbuf part = gbuf_new((size_t)T * Hm * SD_MLA_SPLIT * (R + 2)); // mla.h's (T, Hm, SD_MLA_SPLIT, R + 2)
    CU(cudaDeviceSynchronize());
    const int n = per_token ? 1 : T;
    for (int s = 0; s * n < T; s++) {
        const sd_dev_pos pos = via_cursor ? sd_pos_cursor(IP(cur)) : sd_pos_fixed(in->pos0 + s);
        const sd_mla_write wr = {.kv = kv.p + (size_t)s * (R + dr), .kv_norm = kvn.p, .eps = in->eps, .rope = in->rope,
                                 .theta = in->theta};
        OK(sd_cuda_mla_attend(mq.p + (size_t)s * Hm * qw, &in->kvb.dev, cc.p, kp.p, n, Hm, in->dn, dr, in->dv, R, pos, settled,
                              &wr, qabs.p, part.p, mo.p + (size_t)s * Hm * in->dv, 0, &st_));
        if (via_cursor) OK(sd_cuda_cursor_advance(IP(cur), n, 0, &st_));
        if (settled) CU(cudaDeviceSynchronize()); // mla.h: the next call's cache rows and cursor precede it
    }
    mla_out o = {gbuf_read(&mq, nq), gbuf_read(&cc, nc), gbuf_read(&kp, nk), gbuf_read(&mo, nmo)};
    gbuf *all[] = {&mq, &kv, &kvn, &cc, &kp, &qabs, &mo, &cur, &part};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) gbuf_done(all[i], "mla buffer");
    return o;
}
static void mla_out_free(mla_out *o) { free(o->mq); free(o->c); free(o->kpe); free(o->mo); }

// shape: Hm, dn, dr, dv, R, T, pos0, flags (1: RoPE, 2: settled, 4: position from a device
// cursor). The cache write (c = rmsnorm(kv[0..R)), kpe = kv[R..), RoPE of kpe and the queries'
// rope parts when set) and the absorbed attention vs the twin; the cache rows outside the call's
// untouched; T one-token calls ≡ the T-token call, bitwise.
void run_mla(const op_case *c) {
    mla_in in = {.Hm = c->shape[0], .dn = c->shape[1], .dr = c->shape[2], .dv = c->shape[3], .R = c->shape[4],
                 .T = c->shape[5], .pos0 = c->shape[6], .rope = (c->shape[7] & 1) != 0, .theta = 10000.0, .eps = 1e-5f};
    in.cap = in.pos0 + in.T + 1; // one row past the call's: must stay as it was
    const int Hm = in.Hm, dn = in.dn, dr = in.dr, dv = in.dv, R = in.R, T = in.T, pos0 = in.pos0, qw = dn + dr;
    const size_t nq = (size_t)T * Hm * qw, nc = (size_t)in.cap * R, nk = (size_t)in.cap * dr, nmo = (size_t)T * Hm * dv;
    in.kvb = tmat_rand(Hm * (dn + dv), R, c->dt, seed_of(0));
    in.mq = rand_host(nq, seed_of(1), 1.0f);
    in.kv = rand_host((size_t)T * (R + dr), seed_of(2), 1.0f);
    in.kv_norm = rand_in(R, seed_of(3), 0.5f, 1.5f);
    in.c = rand_host(nc, seed_of(4), 1.0f); // rows < pos0: an earlier forward's; the rest junk
    in.kpe = rand_host(nk ? nk : 1, seed_of(5), 1.0f);
    mla_out ref = {copy_floats(in.mq, nq), copy_floats(in.c, nc), copy_floats(in.kpe, nk), xmalloc(sizeof(float) * nmo)};
    for (int t = 0; t < T; t++) {
        const int pos = pos0 + t;
        const float *kvt = in.kv + (size_t)t * (R + dr);
        sd_rmsnorm(kvt, in.kv_norm, R, in.eps, ref.c + (size_t)pos * R);
        memcpy(ref.kpe + (size_t)pos * dr, kvt + R, sizeof(float) * dr);
        if (!in.rope) continue;
        rope_twin(ref.kpe + (size_t)pos * dr, dr, pos, in.theta);
        for (int h = 0; h < Hm; h++) rope_twin(ref.mq + (size_t)t * Hm * qw + (size_t)h * qw + dn, dr, pos, in.theta);
    }
    for (int t = 0; t < T; t++)
        for (int h = 0; h < Hm; h++)
            attend_twin(&in, ref.mq + (size_t)t * Hm * qw + (size_t)h * qw, ref.c, ref.kpe, h, pos0 + t,
                        ref.mo + ((size_t)t * Hm + h) * dv);
    mla_out all = mla_on_device(c, &in, false), one = mla_on_device(c, &in, true);
    compare(c, "mo", all.mo, ref.mo, nmo);
    const size_t c0 = (size_t)pos0 * R, c1 = (size_t)(pos0 + T) * R, k0 = (size_t)pos0 * dr, k1 = (size_t)(pos0 + T) * dr;
    check_close(TOL_ELEM, "latent rows c of the call", all.c + c0, ref.c + c0, c1 - c0);
    same_bits("latent rows before pos0", all.c, in.c, c0);
    same_bits("latent row past the call", all.c + c1, in.c + c1, nc - c1);
    same_bits("rope key rows before pos0", all.kpe, in.kpe, k0);
    same_bits("rope key row past the call", all.kpe + k1, in.kpe + k1, nk - k1);
    if (in.rope && dr > 1) {
        check_close(TOL_ELEM, "rope key rows of the call (rotated)", all.kpe + k0, ref.kpe + k0, k1 - k0);
        check_close(TOL_ELEM, "queries (rope parts rotated in place)", all.mq, ref.mq, nq);
    } else {
        same_bits("rope key rows of the call (copied)", all.kpe + k0, ref.kpe + k0, k1 - k0);
        same_bits("queries (untouched without RoPE)", all.mq, in.mq, nq);
    }
    same_bits("mo: one token at a time vs the T-token call", one.mo, all.mo, nmo);
    same_bits("latent cache: one token at a time", one.c, all.c, nc);
    same_bits("rope key cache: one token at a time", one.kpe, all.kpe, nk);
    same_bits("queries: one token at a time", one.mq, all.mq, nq);
    mla_out_free(&ref); mla_out_free(&all); mla_out_free(&one);
    free(in.mq); free(in.kv); free(in.kv_norm); free(in.c); free(in.kpe);
    tmat_free(&in.kvb);
}
