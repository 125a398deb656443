// mla_prefill.c — the op table's MLA prefill cases (kernels/mla_prefill.h): the cache write, the
// packing to bf16, the flash attention over the packed rows.
#include "op_cases.h"
#include "mla_prefill.h" // sd_cuda_mla_prefill_cache, _pack_keys, _pack_queries, _flash
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

// shape: T, Hm, dn, dr, R, pos0, mqpad. The keys of pos0 + T cache rows and the T·Hm queries (q̃ from
// qabs, the rope part from mq rows of Hm·(dn+dr) + mqpad) packed to sd_mla_packed_width (R + dr up to
// a multiple of 16): bitwise vs the host's rounding, zeros past R + dr, nothing past the rows.
void run_mla_pack(const op_case *c) {
    const int T = c->shape[0], Hm = c->shape[1], dn = c->shape[2], dr = c->shape[3], R = c->shape[4], pos0 = c->shape[5];
    const int ld_mq = Hm * (dn + dr) + c->shape[6], W = sd_mla_packed_width(R, dr), n = pos0 + T, nq = T * Hm;
    cr_assert_eq(W, (R + dr + 15) / 16 * 16, "%s: packed width %d", LABEL, W);
    float *cc = rand_host((size_t)n * R, seed_of(0), 1.0f), *kpe = rand_host((size_t)n * dr, seed_of(1), 1.0f);
    float *qabs = rand_host((size_t)nq * R, seed_of(2), 3.0f), *mq = rand_host((size_t)T * ld_mq, seed_of(3), 1.0f);
    uint16_t *wk = xmalloc(2 * (size_t)n * W), *wq = xmalloc(2 * (size_t)nq * W);
    for (int j = 0; j < n; j++)
        for (int col = 0; col < W; col++)
            wk[(size_t)j * W + col] = sd_f32_to_bf16(col < R ? cc[(size_t)j * R + col] : col < R + dr ? kpe[(size_t)j * dr + col - R] : 0.0f);
    for (int r = 0; r < nq; r++) {
        const float *rope_part = mq + (size_t)(r / Hm) * ld_mq + (size_t)(r % Hm) * (dn + dr) + dn;
        for (int col = 0; col < W; col++)
            wq[(size_t)r * W + col] = sd_f32_to_bf16(col < R ? qabs[(size_t)r * R + col] : col < R + dr ? rope_part[col - R] : 0.0f);
    }
    gbuf dc = gbuf_of(cc, (size_t)n * R), dkpe = gbuf_of(kpe, (size_t)n * dr), dqa = gbuf_of(qabs, (size_t)nq * R);
    gbuf dmq = gbuf_of(mq, (size_t)T * ld_mq), dkp = gbuf_halves(NULL, (size_t)n * W), dqp = gbuf_halves(NULL, (size_t)nq * W);
    OK(sd_cuda_mla_pack_keys(dc.p, dkpe.p, n, R, dr, (uint16_t *)dkp.p, 0, &st_));
    OK(sd_cuda_mla_pack_queries(dqa.p, dmq.p, ld_mq, T, Hm, dn, dr, R, (uint16_t *)dqp.p, 0, &st_));
    same_halves(fmt("packed keys (%d rows of %d)", n, W), &dkp, wk, (size_t)n * W);
    same_halves(fmt("packed queries (%d rows of %d)", nq, W), &dqp, wq, (size_t)nq * W);
    gbuf *all[] = {&dc, &dkpe, &dqa, &dmq, &dkp, &dqp};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) gbuf_done(all[i], "pack buffer");
    free(cc); free(kpe); free(qabs); free(mq); free(wk); free(wq);
}

// shape: T, Hm, R, dr, pos0, dn (the scale (dn + dr)^-½). Packed bf16 rows of random values (zeros
// past R + dr, as the packing leaves them), 64 rows of NaN past the last key and the last query,
// which the kernel must never read: lat vs the float64 causal softmax over the same bf16 values
// (TOL_BF16: the probabilities enter P·V rounded to bf16); the same call again, the same bits.
void run_mla_flash(const op_case *c) {
    const int T = c->shape[0], Hm = c->shape[1], R = c->shape[2], dr = c->shape[3], pos0 = c->shape[4], dn = c->shape[5];
    const int W = sd_mla_packed_width(R, dr), nq = T * Hm, nk = pos0 + T, junk = 64;
    const float scale = 1.0f / sqrtf((float)(dn + dr));
    const size_t aq = (size_t)(nq + junk) * W, ak = (size_t)(nk + junk) * W, nl = (size_t)nq * R;
    float *qf = rand_host(aq, seed_of(0), 1.0f), *kf = rand_host(ak, seed_of(1), 1.0f);
    uint16_t *qb = xmalloc(2 * aq), *kb = xmalloc(2 * ak);
    for (size_t i = 0; i < aq; i++) qb[i] = i >= (size_t)nq * W ? 0x7fc0u : (int)(i % W) < R + dr ? sd_f32_to_bf16(qf[i]) : 0;
    for (size_t i = 0; i < ak; i++) kb[i] = i >= (size_t)nk * W ? 0x7fc0u : (int)(i % W) < R + dr ? sd_f32_to_bf16(kf[i]) : 0;
    float *ref = xmalloc(sizeof(float) * nl);
    double *p = xmalloc(sizeof(double) * nk), *acc = xmalloc(sizeof(double) * R);
    for (int r = 0; r < nq; r++) {
        const int lim = pos0 + r / Hm;
        double mx = -INFINITY, sum = 0;
        for (int j = 0; j <= lim; j++) {
            double s = 0;
            for (int i = 0; i < R + dr; i++) s += (double)sd_bf16_to_f32(qb[(size_t)r * W + i]) * sd_bf16_to_f32(kb[(size_t)j * W + i]);
            p[j] = s * scale;
            if (p[j] > mx) mx = p[j];
        }
        for (int v = 0; v < R; v++) acc[v] = 0;
        for (int j = 0; j <= lim; j++) {
            p[j] = exp(p[j] - mx);
            sum += p[j];
            for (int v = 0; v < R; v++) acc[v] += p[j] * sd_bf16_to_f32(kb[(size_t)j * W + v]);
        }
        for (int v = 0; v < R; v++) ref[(size_t)r * R + v] = (float)(acc[v] / sum);
    }
    gbuf dq = gbuf_halves(qb, aq), dk = gbuf_halves(kb, ak), dl = gbuf_new(nl);
    OK(sd_cuda_mla_flash((const uint16_t *)dq.p, (const uint16_t *)dk.p, T, Hm, R, dr, pos0, scale, dl.p, 0, &st_));
    float *got = gbuf_read(&dl, nl);
    compare(c, "lat", got, ref, nl);
    OK(sd_cuda_mla_flash((const uint16_t *)dq.p, (const uint16_t *)dk.p, T, Hm, R, dr, pos0, scale, dl.p, 0, &st_));
    float *again = gbuf_read(&dl, nl);
    same_bits("lat: the same call again", again, got, nl);
    gbuf_done(&dq, "packed queries");
    gbuf_done(&dk, "packed keys");
    gbuf_done(&dl, "lat");
    free(qf); free(kf); free(qb); free(kb); free(ref); free(p); free(acc); free(got); free(again);
}
