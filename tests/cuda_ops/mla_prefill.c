// mla_prefill.c — the op table's MLA prefill cases (kernels/mla_prefill.h): the cache write, the
// packing to bf16, the flash attention of each head over its packed keys and values.
#include "op_cases.h"
#include "mla_prefill.h" // sd_cuda_mla_prefill_cache, _pack_queries, _pack_kv, _flash, sd_mla_*_width
#include "ops.h"         // sd_rmsnorm (CPU)
#include "rows.h"        // sd_cuda_rmsnorm

// shape: T, Hm, dn, dr, R, pos0, rope, shared (the prefill's layout: kv inside the query rows at
// Hm·(dn+dr), one row stride for both; else two buffers). Cache rows pos0 .. pos0+T−1: c vs sd_rmsnorm
// (TOL_ELEM) and bitwise sd_cuda_rmsnorm of the same rows (mla_prefill.h: the decode path's norm); kpe
// the rope key, with rope rotated vs rope_twin of op_cases.h (TOL_ELEM; an odd dr's last entry has no
// pair and is copied, as engine/cpu/mla.c and kernels/mla.cu do), else copied (bitwise); with rope
// every head's rope part of mq rotated in place (TOL_ELEM); every other value of mq, kv and the cache
// as it was.
void run_mla_prefill_cache(const op_case *c) {
    const int T = c->shape[0], Hm = c->shape[1], dn = c->shape[2], dr = c->shape[3], R = c->shape[4], pos0 = c->shape[5];
    const bool rope = c->shape[6] != 0, shared = c->shape[7] != 0;
    const int qw = dn + dr, Nq = Hm * qw, cap = pos0 + T + 1; // one cache row past the call's
    const int ld_mq = shared ? Nq + R + dr + 3 : Nq + 5, ld_kv = shared ? ld_mq : R + dr + 2;
    const size_t nm = (size_t)T * ld_mq, nkv = (size_t)T * ld_kv, nc = (size_t)cap * R, nk = (size_t)cap * dr;
    const double theta = 50000.0;
    const float eps = 1e-5f;
    float *mq = rand_host(nm, seed_of(0), 1.0f), *kvs = shared ? NULL : rand_host(nkv, seed_of(1), 1.0f);
    const float *kv = shared ? mq + Nq : kvs;
    float *kvn = rand_in(R, seed_of(2), 0.5f, 1.5f), *cc = rand_host(nc, seed_of(3), 1.0f), *kpe = rand_host(nk, seed_of(4), 1.0f);
    float *ref_c = copy_floats(cc, nc), *ref_k = copy_floats(kpe, nk), *ref_m = copy_floats(mq, nm);
    for (int t = 0; t < T; t++) {
        const int pos = pos0 + t;
        const float *kvt = kv + (size_t)t * ld_kv;
        sd_rmsnorm(kvt, kvn, R, eps, ref_c + (size_t)pos * R);
        memcpy(ref_k + (size_t)pos * dr, kvt + R, sizeof(float) * dr);
        if (!rope) continue;
        rope_twin(ref_k + (size_t)pos * dr, dr, pos, theta);
        for (int h = 0; h < Hm; h++) rope_twin(ref_m + (size_t)t * ld_mq + (size_t)h * qw + dn, dr, pos, theta);
    }
    gbuf dm = gbuf_of(mq, nm), dkv = shared ? dm : gbuf_of(kvs, nkv), dnw = gbuf_of(kvn, R), dc = gbuf_of(cc, nc);
    gbuf dk = gbuf_of(kpe, nk), dnorm = gbuf_new((size_t)T * R);
    const float *kv_dev = shared ? dm.p + Nq : dkv.p;
    OK(sd_cuda_mla_prefill_cache(kv_dev, ld_kv, dnw.p, eps, rope, theta, pos0, T, Hm, dn, dr, R, dm.p, ld_mq, dc.p, dk.p, 0,
                                 &st_));
    for (int t = 0; t < T; t++) // the decode path's norm of the same rows (the cache write leaves them as they were)
        OK(sd_cuda_rmsnorm(kv_dev + (size_t)t * ld_kv, dnw.p, 1, R, eps, dnorm.p + (size_t)t * R, 0, &st_));
    float *got_m = gbuf_read(&dm, nm), *got_c = gbuf_read(&dc, nc), *got_k = gbuf_read(&dk, nk);
    float *norm = gbuf_read(&dnorm, (size_t)T * R);
    const size_t c0 = (size_t)pos0 * R, k0 = (size_t)pos0 * dr;
    compare(c, "latent rows c of the call", got_c + c0, ref_c + c0, (size_t)T * R);
    same_bits("latent rows: bitwise sd_cuda_rmsnorm's", got_c + c0, norm, (size_t)T * R);
    float *c_rest = copy_floats(cc, nc);
    memcpy(c_rest + c0, got_c + c0, sizeof(float) * T * R);
    same_bits("latent rows outside the call untouched", got_c, c_rest, nc);
    if (rope) {
        compare(c, "rope key rows of the call (rotated)", got_k + k0, ref_k + k0, (size_t)T * dr);
        float *k_rest = copy_floats(kpe, nk), *rot = xmalloc(sizeof(float) * T * Hm * dr), *rot_ref = xmalloc(sizeof(float) * T * Hm * dr);
        float *m_rest = copy_floats(mq, nm);
        memcpy(k_rest + k0, got_k + k0, sizeof(float) * T * dr);
        same_bits("rope key rows outside the call untouched", got_k, k_rest, nk);
        for (int t = 0; t < T; t++)
            for (int h = 0; h < Hm; h++) {
                const size_t o = (size_t)t * ld_mq + (size_t)h * qw + dn, r = ((size_t)t * Hm + h) * dr;
                memcpy(rot + r, got_m + o, sizeof(float) * dr);
                memcpy(rot_ref + r, ref_m + o, sizeof(float) * dr);
                memcpy(m_rest + o, got_m + o, sizeof(float) * dr);
            }
        compare(c, "queries' rope parts (rotated in place)", rot, rot_ref, (size_t)T * Hm * dr);
        same_bits(shared ? "query rows outside the rope parts (the kv columns too) untouched"
                         : "query rows outside the rope parts untouched", got_m, m_rest, nm);
        free(k_rest); free(rot); free(rot_ref); free(m_rest);
    } else {
        same_bits("rope key cache (the call's rows copied)", got_k, ref_k, nk);
        same_bits("query rows untouched without RoPE", got_m, mq, nm);
    }
    if (!shared) {
        float *kv_back = gbuf_read(&dkv, nkv);
        same_bits("kv untouched", kv_back, kvs, nkv);
        free(kv_back);
        gbuf_done(&dkv, "kv");
    }
    gbuf *all[] = {&dm, &dnw, &dc, &dk, &dnorm};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) gbuf_done(all[i], "cache buffer");
    free(mq); free(kvs); free(kvn); free(cc); free(kpe); free(ref_c); free(ref_k); free(ref_m);
    free(got_m); free(got_c); free(got_k); free(norm); free(c_rest);
}

// shape: T, Hm, dn, dr, dv, j0, n, mqpad. The T·Hm queries (each head's [qn | rotated rope part]
// from mq rows of Hm·(dn+dr) + mqpad) packed to sd_mla_head_width; the keys and values of cache
// rows j0 .. j0+n−1 from kvb rows of Hm·(dn+dv) and the rope keys, packed to the head and value
// widths: bitwise vs the host's rounding, zeros past each part, the rows before j0 untouched.
void run_mla_pack(const op_case *c) {
    const int T = c->shape[0], Hm = c->shape[1], dn = c->shape[2], dr = c->shape[3], dv = c->shape[4], j0 = c->shape[5];
    const int n = c->shape[6], ld_mq = Hm * (dn + dr) + c->shape[7], rows = j0 + n;
    const int W = sd_mla_head_width(dn, dr), VW = sd_mla_value_width(dv), nq = T * Hm;
    cr_assert_eq(W, (dn + dr + 15) / 16 * 16, "%s: head width %d", LABEL, W);
    cr_assert(VW >= dv && VW >= 8 && (VW & (VW - 1)) == 0 && VW < 2 * dv + 8, "%s: value width %d for %d", LABEL, VW, dv);
    float *mq = rand_host((size_t)T * ld_mq, seed_of(0), 1.0f), *kvb = rand_host((size_t)n * Hm * (dn + dv), seed_of(1), 2.0f);
    float *kpe = rand_host((size_t)rows * dr, seed_of(2), 1.0f);
    uint16_t *wq = xmalloc(2 * (size_t)nq * W), *wk = xmalloc(2 * (size_t)rows * Hm * W), *wv = xmalloc(2 * (size_t)rows * Hm * VW);
    for (int r = 0; r < nq; r++)
        for (int col = 0; col < W; col++)
            wq[(size_t)r * W + col] =
                sd_f32_to_bf16(col < dn + dr ? mq[(size_t)(r / Hm) * ld_mq + (size_t)(r % Hm) * (dn + dr) + col] : 0.0f);
    for (size_t e = 0; e < (size_t)j0 * Hm * W; e++) wk[e] = e & 1 ? 0x7fa5u : 0xa5a5u; // the sentinel's halves
    for (size_t e = 0; e < (size_t)j0 * Hm * VW; e++) wv[e] = e & 1 ? 0x7fa5u : 0xa5a5u;
    for (int j = j0; j < rows; j++)
        for (int h = 0; h < Hm; h++) {
            const float *src = kvb + ((size_t)(j - j0) * Hm + h) * (dn + dv);
            const size_t r = (size_t)j * Hm + h;
            for (int col = 0; col < W; col++)
                wk[r * W + col] = sd_f32_to_bf16(col < dn ? src[col] : col < dn + dr ? kpe[(size_t)j * dr + col - dn] : 0.0f);
            for (int col = 0; col < VW; col++) wv[r * VW + col] = sd_f32_to_bf16(col < dv ? src[dn + col] : 0.0f);
        }
    gbuf dmq = gbuf_of(mq, (size_t)T * ld_mq), dkvb = gbuf_of(kvb, (size_t)n * Hm * (dn + dv)), dkpe = gbuf_of(kpe, (size_t)rows * dr);
    gbuf dqp = gbuf_halves(NULL, (size_t)nq * W), dkp = gbuf_halves(NULL, (size_t)rows * Hm * W);
    gbuf dvp = gbuf_halves(NULL, (size_t)rows * Hm * VW);
    OK(sd_cuda_mla_pack_queries(dmq.p, ld_mq, T, Hm, dn, dr, (uint16_t *)dqp.p, 0, &st_));
    OK(sd_cuda_mla_pack_kv(dkvb.p, dkpe.p, j0, n, Hm, dn, dr, dv, (uint16_t *)dkp.p, (uint16_t *)dvp.p, 0, &st_));
    same_halves(fmt("packed queries (%d rows of %d)", nq, W), &dqp, wq, (size_t)nq * W);
    same_halves(fmt("packed keys (%d rows of %d)", rows * Hm, W), &dkp, wk, (size_t)rows * Hm * W);
    same_halves(fmt("packed values (%d rows of %d)", rows * Hm, VW), &dvp, wv, (size_t)rows * Hm * VW);
    gbuf *all[] = {&dmq, &dkvb, &dkpe, &dqp, &dkp, &dvp};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) gbuf_done(all[i], "pack buffer");
    free(mq); free(kvb); free(kpe); free(wq); free(wk); free(wv);
}

// shape: T, Hm, dn, dr, dv, pos0. Packed bf16 rows of random values (zeros past each part, as the
// packing leaves them), 64 rows of NaN past the last key, value and query, which the kernel must
// never read: o vs the float64 causal softmax over the same bf16 values (TOL_BF16: the
// probabilities enter P·V rounded to bf16); the same call again, the same bits.
void run_mla_flash(const op_case *c) {
    const int T = c->shape[0], Hm = c->shape[1], dn = c->shape[2], dr = c->shape[3], dv = c->shape[4], pos0 = c->shape[5];
    const int W = sd_mla_head_width(dn, dr), VW = sd_mla_value_width(dv), nk = pos0 + T, junk = 64;
    const float scale = 1.0f / sqrtf((float)(dn + dr));
    const size_t aq = (size_t)(T * Hm + junk) * W, ak = (size_t)(nk * Hm + junk) * W, av = (size_t)(nk * Hm + junk) * VW;
    const size_t no = (size_t)T * Hm * dv;
    float *qf = rand_host(aq, seed_of(0), 1.0f), *kf = rand_host(ak, seed_of(1), 1.0f), *vf = rand_host(av, seed_of(2), 1.0f);
    uint16_t *qb = xmalloc(2 * aq), *kb = xmalloc(2 * ak), *vb = xmalloc(2 * av);
    for (size_t i = 0; i < aq; i++) qb[i] = i >= (size_t)T * Hm * W ? 0x7fc0u : (int)(i % W) < dn + dr ? sd_f32_to_bf16(qf[i]) : 0;
    for (size_t i = 0; i < ak; i++) kb[i] = i >= (size_t)nk * Hm * W ? 0x7fc0u : (int)(i % W) < dn + dr ? sd_f32_to_bf16(kf[i]) : 0;
    for (size_t i = 0; i < av; i++) vb[i] = i >= (size_t)nk * Hm * VW ? 0x7fc0u : (int)(i % VW) < dv ? sd_f32_to_bf16(vf[i]) : 0;
    float *ref = xmalloc(sizeof(float) * no);
    double *p = xmalloc(sizeof(double) * nk), *acc = xmalloc(sizeof(double) * dv);
    for (int t = 0; t < T; t++)
        for (int h = 0; h < Hm; h++) {
            const int lim = pos0 + t;
            const uint16_t *q = qb + ((size_t)t * Hm + h) * W;
            double mx = -INFINITY, sum = 0;
            for (int j = 0; j <= lim; j++) {
                const uint16_t *k = kb + ((size_t)j * Hm + h) * W;
                double s = 0;
                for (int i = 0; i < dn + dr; i++) s += (double)sd_bf16_to_f32(q[i]) * sd_bf16_to_f32(k[i]);
                p[j] = s * scale;
                if (p[j] > mx) mx = p[j];
            }
            for (int v = 0; v < dv; v++) acc[v] = 0;
            for (int j = 0; j <= lim; j++) {
                const uint16_t *vr = vb + ((size_t)j * Hm + h) * VW;
                p[j] = exp(p[j] - mx);
                sum += p[j];
                for (int v = 0; v < dv; v++) acc[v] += p[j] * sd_bf16_to_f32(vr[v]);
            }
            for (int v = 0; v < dv; v++) ref[((size_t)t * Hm + h) * dv + v] = (float)(acc[v] / sum);
        }
    gbuf dq = gbuf_halves(qb, aq), dk = gbuf_halves(kb, ak), dvv = gbuf_halves(vb, av), dout = gbuf_new(no);
    const uint16_t *q16 = (const uint16_t *)dq.p, *k16 = (const uint16_t *)dk.p, *v16 = (const uint16_t *)dvv.p;
    OK(sd_cuda_mla_flash(q16, k16, v16, T, Hm, dn, dr, dv, pos0, scale, dout.p, 0, &st_));
    float *got = gbuf_read(&dout, no);
    compare(c, "o", got, ref, no);
    OK(sd_cuda_mla_flash(q16, k16, v16, T, Hm, dn, dr, dv, pos0, scale, dout.p, 0, &st_));
    float *again = gbuf_read(&dout, no);
    same_bits("o: the same call again", again, got, no);
    gbuf_done(&dq, "packed queries");
    gbuf_done(&dk, "packed keys");
    gbuf_done(&dvv, "packed values");
    gbuf_done(&dout, "o");
    free(qf); free(kf); free(vf); free(qb); free(kb); free(vb); free(ref); free(p); free(acc); free(got); free(again);
}
