// mla_lab.cu — kernel lab for the absorbed MLA attention (MODEL.md "MLA"; kernels/mla.h
// sd_cuda_mla_attend; CPU: engine/cpu/mla.c attend). T query tokens at positions pos0 .. pos0+T-1,
// each over latent-cache rows 0 .. its own position, per head h:
//     q̃_h = W_UK,hᵀ qn_h;  s_j = (q̃_h·c_j + qp_h·kpe_j)·(dn+dr)^-0.5;  p = softmax(s);
//     o_h = W_UV,h · Σ_j p_j c_j          (kv_b = [W_UK,h; W_UV,h] per head, bf16 here)
// at Kimi-Linear dims: Hm = 32 heads, R = kv_lora_rank 512, dn = 128, dr = 64, dv = 128.
//
// Versions (µs per call, cold = L2 flushed before each; H200 of this workplace, 2026-11-29)
//   1  the original kernel (copied here): one 8-warp block per (head, token) walking all of the
//      token's rows; q̃ by one thread per latent column (i increasing); warp w takes rows j ≡ w
//      (mod 8) with an online softmax. Only Hm·T blocks, every head re-reads the whole cache, and
//      each block reads its head's 256 kv_b rows itself. ctx 512 T = 1: 144.3 cold / 82.1 hot.
//   2  sd_cuda_mla_attend (kernels/mla.cu, compiled into this lab by #include): three launches
//      over every head at once — absorb (q̃, weights loaded before the wait for the predecessor),
//      split (block = chunk of rows × 4 heads, rows in 16-row tiles shared by the heads, async
//      copies double-buffered; at most 32 chunks per token, fixed by its position), merge (chunk
//      states in chunk order, then W_UV from shared memory).
//
// Replaced designs (measured here, 2026-11-29): a flash-decoding split in 8-block thread-block
// clusters per (group of HG heads, token) with no global scratch — ctx 512 T = 1 37.3 hot / 43.5
// cold, T = 5 128 cold, 32K T = 1 1247: at most 30 clusters resident on the H200, ~20 µs per
// cluster of serial distributed-shared-memory chains and barriers, rows never shared across
// heads or tokens. Before it, three launches with one warp per head per chunk walking its rows
// as a serial chain: 55.5 hot / 87.5 cold.
//
// Checks: max relative error (max |gpu − cpu| / max |cpu| over the call's outputs) against the CPU
// reference (engine/cpu/mla.c's attend in float: i-ordered q̃, sequential dots, two-pass softmax) for
// T = 1..9 with pos0 = ctx − 1 at ctx 1, 100, 512, 4096, 32768; and bitwise: version 2's output for
// token t inside a T-token call equals a 1-token call at pos0 + t (verify ≡ decode), and versions
// 3..5 equal version 2.
//
// Timing: CUDA events; "hot" = back-to-back launches (average), "cold" = a 256 MB memset before
// each launch evicts the 60 MB L2 (median of per-launch events). Bytes = cache rows read once
// ((pos0+T)·(R+dr)·4) + kv_b (Hm·(dn+dv)·R·2) + q in + outputs out, against ~4.2 TB/s.
//
// Usage: mla_lab [quick]   (quick: skip ctx 32768 validation)
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <algorithm>
#include <thread>
#include <vector>
#include "mla.cu" // sd_cuda_mla_attend (version 2): the production source

#include "lab.cuh" // CK, median, lab_copy_gbs

#define ATT_WARPS 8 // version 1's warps per block
static const int HM = 32, RR = 512, DN = 128, DR = 64, DV = 128, QW = DN + DR, MAXT = 9;

// ---------------------------------------------------------------------------------------------
// Version 1: the original kernel (kernels/mla.cu before the split), verbatim but renamed.
static inline int pad4(int n) { return (n + 3) & ~3; }

template <int NK, bool BF16>
static __global__ void __launch_bounds__(ATT_WARPS * 32)
v1_attend_kernel(const float *__restrict__ mq, const void *__restrict__ kvb, const float *__restrict__ c,
              const float *__restrict__ kpe, int Hm, int dn, int dr, int dv, int R, int pos0, float *__restrict__ mo) {
    extern __shared__ __align__(16) float sm[];
    const int R4 = (R + 3) & ~3, dr4 = (dr + 3) & ~3;
    float *qt = sm, *qp = qt + R4, *accw = qp + dr4, *lat = accw + ATT_WARPS * R4, *mw = lat + R4, *lw = mw + ATT_WARPS;
    const int h = blockIdx.x, t = blockIdx.y, pos = pos0 + t, qw = dn + dr, row0 = h * (dn + dv);
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    const float *qh = mq + (size_t)t * Hm * qw + (size_t)h * qw;

    // q̃[r] = Σ_i qn[i] · W_UK,h[i][r], i increasing.
    for (int r = threadIdx.x; r < R; r += blockDim.x) {
        float acc = 0.0f;
        for (int i = 0; i < dn; i++) {
            const size_t e = (size_t)(row0 + i) * R + r;
            const float wv = BF16 ? sd_dev_bf16(((const uint16_t *)kvb)[e]) : ((const float *)kvb)[e];
            acc += qh[i] * wv;
        }
        qt[r] = acc;
    }
    for (int r = threadIdx.x; r < dr; r += blockDim.x) qp[r] = qh[dn + r];
    __syncthreads();

    // Online softmax over this warp's rows.
    const float scale = 1.0f / sqrtf((float)(dn + dr));
    float qreg[NK], acc[NK];
#pragma unroll
    for (int k = 0; k < NK; k++) {
        const int r = lane + 32 * k;
        qreg[k] = r < R ? qt[r] : 0.0f;
        acc[k] = 0.0f;
    }
    float m = -INFINITY, l = 0.0f;
    for (int j = w; j <= pos; j += ATT_WARPS) {
        const float *cj = c + (size_t)j * R;
        float cv[NK], p1 = 0.0f, p2 = 0.0f;
#pragma unroll
        for (int k = 0; k < NK; k++) {
            const int r = lane + 32 * k;
            cv[k] = r < R ? cj[r] : 0.0f;
            if (r < R) p1 += qreg[k] * cv[k];
        }
        for (int r = lane; r < dr; r += 32) p2 += qp[r] * kpe[(size_t)j * dr + r];
        const float sc = (sd_warp_sum(p1) + sd_warp_sum(p2)) * scale;
        if (sc > m) {
            const float f = expf(m - sc); // 0 for the first row (m = -inf)
            l = l * f + 1.0f;
#pragma unroll
            for (int k = 0; k < NK; k++) acc[k] = acc[k] * f + cv[k];
            m = sc;
        } else {
            const float e = expf(sc - m);
            l = l + e;
#pragma unroll
            for (int k = 0; k < NK; k++) acc[k] = acc[k] + e * cv[k];
        }
    }
#pragma unroll
    for (int k = 0; k < NK; k++) {
        const int r = lane + 32 * k;
        if (r < R) accw[w * R4 + r] = acc[k];
    }
    if (lane == 0) { mw[w] = m; lw[w] = l; }
    __syncthreads();

    // Merge the warp states in warp order (warp 0 always holds row 0, so M is its max or more).
    float M = -INFINITY;
    for (int v = 0; v < ATT_WARPS; v++) M = fmaxf(M, mw[v]);
    float f[ATT_WARPS], L = 0.0f;
#pragma unroll
    for (int v = 0; v < ATT_WARPS; v++) {
        f[v] = mw[v] == -INFINITY ? 0.0f : expf(mw[v] - M);
        L = L + lw[v] * f[v];
    }
    const float inv = 1.0f / L;
    for (int r = threadIdx.x; r < R; r += blockDim.x) {
        float s = 0.0f;
#pragma unroll
        for (int v = 0; v < ATT_WARPS; v++) s = s + accw[v * R4 + r] * f[v];
        lat[r] = s * inv;
    }
    __syncthreads();

    // mo[t][h][v] = W_UV,h[v] · lat.
    float *out = mo + (size_t)t * Hm * dv + (size_t)h * dv;
    for (int v = w; v < dv; v += ATT_WARPS) {
        const float o = sd_warp_dot<BF16>(kvb, R, row0 + dn + v, lat);
        if (lane == 0) out[v] = o;
    }
}

template <bool BF16>
static void v1_attend_launch(int nk, dim3 grid, size_t smem, cudaStream_t stream, const float *mq, const void *kvb,
                          const float *c, const float *kpe, int Hm, int dn, int dr, int dv, int R, int pos0, float *mo) {
    const dim3 block(ATT_WARPS * 32);
    switch (nk) {
    case 1: v1_attend_kernel<1, BF16><<<grid, block, smem, stream>>>(mq, kvb, c, kpe, Hm, dn, dr, dv, R, pos0, mo); break;
    case 2: v1_attend_kernel<2, BF16><<<grid, block, smem, stream>>>(mq, kvb, c, kpe, Hm, dn, dr, dv, R, pos0, mo); break;
    case 4: v1_attend_kernel<4, BF16><<<grid, block, smem, stream>>>(mq, kvb, c, kpe, Hm, dn, dr, dv, R, pos0, mo); break;
    case 8: v1_attend_kernel<8, BF16><<<grid, block, smem, stream>>>(mq, kvb, c, kpe, Hm, dn, dr, dv, R, pos0, mo); break;
    default: v1_attend_kernel<16, BF16><<<grid, block, smem, stream>>>(mq, kvb, c, kpe, Hm, dn, dr, dv, R, pos0, mo); break;
    }
}


static void v1_attend(const float *mq, const void *kvb, const float *c, const float *kpe, int T, int pos0, float *mo,
                      cudaStream_t s) {
    const size_t smem = sizeof(float) * ((size_t)pad4(RR) * (ATT_WARPS + 2) + pad4(DR) + 2 * ATT_WARPS);
    v1_attend_launch<true>(16, dim3(HM, T), smem, s, mq, kvb, c, kpe, HM, DN, DR, DV, RR, pos0, mo);
}

// ---------------------------------------------------------------------------------------------
// CPU reference: engine/cpu/mla.c attend, transcribed in float (its dots as plain sequential sums),
// the weights already widened from bf16.
static void attend_cpu(const float *kvf, const float *c, const float *kpe, const float *qh, int h, int pos, float *o) {
    const int row0 = h * (DN + DV);
    std::vector<float> qabs(RR, 0.0f), lat(RR, 0.0f), sc(pos + 1);
    for (int i = 0; i < DN; i++) {
        const float *wr = kvf + (size_t)(row0 + i) * RR;
        for (int r = 0; r < RR; r++) qabs[r] += qh[i] * wr[r];
    }
    const float scale = 1.0f / sqrtf((float)(DN + DR));
    float mx = -INFINITY;
    for (int j = 0; j <= pos; j++) {
        const float *cj = c + (size_t)j * RR, *kj = kpe + (size_t)j * DR;
        float a = 0.0f, b = 0.0f;
        for (int r = 0; r < RR; r++) a += qabs[r] * cj[r];
        for (int r = 0; r < DR; r++) b += qh[DN + r] * kj[r];
        sc[j] = (a + b) * scale;
        if (sc[j] > mx) mx = sc[j];
    }
    float sum = 0.0f;
    for (int j = 0; j <= pos; j++) {
        sc[j] = expf(sc[j] - mx);
        sum += sc[j];
    }
    const float inv = 1.0f / sum;
    for (int j = 0; j <= pos; j++) {
        const float p = sc[j] * inv;
        const float *cj = c + (size_t)j * RR;
        for (int r = 0; r < RR; r++) lat[r] += p * cj[r];
    }
    for (int v = 0; v < DV; v++) {
        const float *wr = kvf + (size_t)(row0 + DN + v) * RR;
        float a = 0.0f;
        for (int r = 0; r < RR; r++) a += wr[r] * lat[r];
        o[v] = a;
    }
}

// ref[t][h][v] for tokens t = 0..nt-1 at positions pos0 + t (q row t), over all cores.
static void ref_cpu(const float *kvf, const float *c, const float *kpe, const float *q, int nt, int pos0, float *ref) {
    const int jobs = nt * HM;
    int nth = (int)std::thread::hardware_concurrency();
    if (nth < 1) nth = 1;
    if (nth > 64) nth = 64;
    std::vector<std::thread> th;
    for (int k = 0; k < nth; k++)
        th.emplace_back([=]() {
            for (int e = k; e < jobs; e += nth) {
                const int t = e / HM, h = e % HM;
                attend_cpu(kvf, c, kpe, q + (size_t)t * HM * QW + (size_t)h * QW, h, pos0 + t,
                           ref + (size_t)t * HM * DV + (size_t)h * DV);
            }
        });
    for (auto &x : th) x.join();
}

// ---------------------------------------------------------------------------------------------
static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static float urand() { // uniform in [-1, 1)
    rng_state ^= rng_state << 13; rng_state ^= rng_state >> 7; rng_state ^= rng_state << 17;
    return (float)((rng_state >> 40) * (1.0 / (1ull << 24))) * 2.0f - 1.0f;
}
static uint16_t to_bf16(float f) { // round to nearest even
    uint32_t u; memcpy(&u, &f, 4);
    u += 0x7fff + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}
static float from_bf16(uint16_t h) { uint32_t u = (uint32_t)h << 16; float f; memcpy(&f, &u, 4); return f; }

struct dev_bufs {
    float *q = nullptr, *c = nullptr, *kpe = nullptr, *mo = nullptr, *qabs = nullptr, *part = nullptr;
    uint16_t *kvb = nullptr;
    sd_mat kv_b{};
};

static void run_v(int version, dev_bufs &d, int T, int pos0, float *mo, cudaStream_t s) {
    if (version == 1) {
        v1_attend(d.q, d.kvb, d.c, d.kpe, T, pos0, mo, s);
        CK(cudaGetLastError());
        return;
    }
    sd_status st = {};
    if (sd_cuda_mla_attend(d.q, &d.kv_b, d.c, d.kpe, T, HM, DN, DR, DV, RR, sd_pos_fixed(pos0), false, nullptr, d.qabs, d.part, mo, s,
                           &st) != SD_OK) {
        fprintf(stderr, "sd_cuda_mla_attend: %s\n", st.msg);
        exit(1);
    }
}

static double max_rel(const float *g, const float *r, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        if (!std::isfinite(g[i])) return INFINITY;
        num = std::max(num, fabs((double)g[i] - r[i]));
        den = std::max(den, fabs((double)r[i]));
    }
    return den > 0 ? num / den : num;
}

int main(int argc, char **argv) {
    const bool quick = argc > 1 && !strcmp(argv[1], "quick");
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    printf("mla_lab: %s, %d SMs, L2 %d MB; Hm %d R %d dn %d dr %d dv %d, kv_b bf16\n", prop.name,
           prop.multiProcessorCount, prop.l2CacheSize >> 20, HM, RR, DN, DR, DV);
    {
        cudaFuncAttributes fa, fs, fm;
        CK(cudaFuncGetAttributes(&fa, absorb_kernel<true, true>));
        CK(cudaFuncGetAttributes(&fs, split_kernel<16, 512, 64>));
        CK(cudaFuncGetAttributes(&fm, merge_kernel<true>));
        printf("  registers: absorb %d, split %d, merge %d; split %zu B shared/block\n", fa.numRegs, fs.numRegs, fm.numRegs,
               split_smem(RR, DR));
    }

    // Weights: kv_b uniform in ±0.5 rounded to bf16 (scores of std ~1 with unit-scale latents).
    const size_t nW = (size_t)HM * (DN + DV) * RR;
    std::vector<uint16_t> kvh(nW);
    std::vector<float> kvf(nW);
    for (size_t i = 0; i < nW; i++) { kvh[i] = to_bf16(0.5f * urand()); kvf[i] = from_bf16(kvh[i]); }
    const int CMAX = 32768 + MAXT;
    dev_bufs d;
    CK(cudaMalloc(&d.kvb, nW * 2));
    CK(cudaMalloc(&d.c, sizeof(float) * (size_t)CMAX * RR));
    CK(cudaMalloc(&d.kpe, sizeof(float) * (size_t)CMAX * DR));
    CK(cudaMalloc(&d.q, sizeof(float) * MAXT * HM * QW));
    CK(cudaMalloc(&d.mo, sizeof(float) * MAXT * HM * DV * 8));
    CK(cudaMalloc(&d.qabs, sizeof(float) * MAXT * HM * RR));
    CK(cudaMalloc(&d.part, sizeof(float) * MAXT * HM * SD_MLA_SPLIT * (RR + 2)));
    CK(cudaMemcpy(d.kvb, kvh.data(), nW * 2, cudaMemcpyHostToDevice));
    d.kv_b.data = d.kvb;
    d.kv_b.dtype = SD_DT_BF16;
    d.kv_b.rows = HM * (DN + DV);
    d.kv_b.cols = RR;
    // Cache rows: latents ~ unit RMS (as after the kv_a RMSNorm), rope keys uniform; queries uniform.
    std::vector<float> ch((size_t)CMAX * RR), kh((size_t)CMAX * DR), qh((size_t)MAXT * HM * QW);
    for (auto &x : ch) x = 1.7f * urand();
    for (auto &x : kh) x = urand();
    for (auto &x : qh) x = urand();
    CK(cudaMemcpy(d.c, ch.data(), sizeof(float) * ch.size(), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d.kpe, kh.data(), sizeof(float) * kh.size(), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d.q, qh.data(), sizeof(float) * qh.size(), cudaMemcpyHostToDevice));
    cudaStream_t s;
    CK(cudaStreamCreate(&s));

    // ------------------------------------------------------------------ validation
    printf("\nvalidation: max |gpu-cpu| / max |cpu| over T = 1..9 (pos0 = ctx-1); bitwise checks on version 2\n");
    bool all_ok = true;
    const int ctxs[] = {1, 100, 512, 4096, 32768};
    const size_t per_tok = (size_t)HM * DV;
    std::vector<float> ref(MAXT * per_tok), got(MAXT * per_tok), one(MAXT * per_tok);
    for (int ctx : ctxs) {
        if (quick && ctx > 4096) continue;
        const int pos0 = ctx - 1;
        ref_cpu(kvf.data(), ch.data(), kh.data(), qh.data(), MAXT, pos0, ref.data());
        // decode: each token alone at its position (q row t as row 0 of a 1-token call)
        dev_bufs dt = d;
        for (int t = 0; t < MAXT; t++) {
            dt.q = d.q + (size_t)t * HM * QW;
            run_v(2, dt, 1, pos0 + t, d.mo + (size_t)t * per_tok, s);
        }
        CK(cudaMemcpy(one.data(), d.mo, sizeof(float) * MAXT * per_tok, cudaMemcpyDeviceToHost));
        double e1 = 0, e2 = 0, eone = max_rel(one.data(), ref.data(), MAXT * per_tok);
        bool tind = true;
        for (int T = 1; T <= MAXT; T++) {
            run_v(1, d, T, pos0, d.mo, s);
            CK(cudaMemcpy(got.data(), d.mo, sizeof(float) * T * per_tok, cudaMemcpyDeviceToHost));
            e1 = std::max(e1, max_rel(got.data(), ref.data(), T * per_tok));
            run_v(2, d, T, pos0, d.mo, s);
            CK(cudaMemcpy(got.data(), d.mo, sizeof(float) * T * per_tok, cudaMemcpyDeviceToHost));
            e2 = std::max(e2, max_rel(got.data(), ref.data(), T * per_tok));
            if (memcmp(got.data(), one.data(), sizeof(float) * T * per_tok)) {
                tind = false;
                for (int t = 0; t < T; t++)
                    if (memcmp(got.data() + t * per_tok, one.data() + t * per_tok, sizeof(float) * per_tok))
                        printf("  ctx %d T %d: token %d differs from its 1-token call\n", ctx, T, t);
            }
        }
        const bool ok = e2 <= 1e-4 && eone <= 1e-4 && tind;
        all_ok = all_ok && ok;
        printf("ctx %5d: v1 %.2e  v2 %.2e (decode %.2e)  v2 token-alone ≡ in-call: %s  %s\n", ctx, e1, e2, eone,
               tind ? "yes" : "NO", ok ? "ok" : "FAIL");
    }

    // ------------------------------------------------------------------ timing
    printf("\ntiming (µs per call; hot = back-to-back average, cold = L2 flushed before each, median)\n");
    const size_t flush_bytes = 256ull << 20;
    void *flush;
    CK(cudaMalloc(&flush, flush_bytes));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    const int tctx[] = {512, 2048, 8192, 32768};
    const int tT[] = {1, 5};
    struct row { int ctx, T, v; double hot, cold; };
    std::vector<row> rows;
    for (int ctx : tctx)
        for (int T : tT)
            for (int v = 1; v <= 2; v++) {
                const int pos0 = ctx - 1;
                run_v(v, d, T, pos0, d.mo, s); // warm-up (and kernel attributes)
                CK(cudaStreamSynchronize(s));
                CK(cudaEventRecord(e0, s));
                run_v(v, d, T, pos0, d.mo, s);
                CK(cudaEventRecord(e1, s));
                CK(cudaEventSynchronize(e1));
                float one_ms;
                CK(cudaEventElapsedTime(&one_ms, e0, e1));
                const int reps = std::max(3, std::min(200, (int)(20.0 / std::max(one_ms, 1e-3f))));
                CK(cudaEventRecord(e0, s));
                for (int i = 0; i < reps; i++) run_v(v, d, T, pos0, d.mo, s);
                CK(cudaEventRecord(e1, s));
                CK(cudaEventSynchronize(e1));
                float ms;
                CK(cudaEventElapsedTime(&ms, e0, e1));
                const double hot = 1000.0 * ms / reps;
                const int creps = std::max(3, std::min(30, reps));
                std::vector<float> cs;
                for (int i = 0; i < creps; i++) {
                    CK(cudaMemsetAsync(flush, i & 0xff, flush_bytes, s));
                    CK(cudaEventRecord(e0, s));
                    run_v(v, d, T, pos0, d.mo, s);
                    CK(cudaEventRecord(e1, s));
                    CK(cudaEventSynchronize(e1));
                    float m;
                    CK(cudaEventElapsedTime(&m, e0, e1));
                    cs.push_back(1000.0f * m);
                }
                rows.push_back({ctx, T, v, hot, median(cs)});
            }
    CK(cudaGetLastError());
    printf("  ctx     T |   v1 hot   cold |   v2 hot   cold | v2 cold GB/s (%% of 4.2 TB/s)  v1/v2\n");
    for (size_t i = 0; i < rows.size(); i += 2) {
        const row *r = &rows[i];
        const int ctx = r[0].ctx, T = r[0].T;
        const double bytes = (double)(ctx - 1 + T) * (RR + DR) * 4 + (double)HM * (DN + DV) * RR * 2 +
                             (double)T * HM * QW * 4 + (double)T * HM * DV * 4;
        const double gbs = bytes / (r[1].cold * 1e-6) / 1e9;
        printf("%6d %5d | %8.1f %6.1f | %8.2f %6.2f | %8.0f (%4.1f%%)  %6.1fx\n", ctx, T, r[0].hot, r[0].cold, r[1].hot,
               r[1].cold, gbs, 100.0 * gbs / 4200.0,
               r[0].cold / r[1].cold);
    }
    printf("\n%s\n", all_ok ? "mla_lab: all checks passed" : "mla_lab: CHECKS FAILED");
    return all_ok ? 0 : 1;
}
