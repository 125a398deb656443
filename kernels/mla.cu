// mla.cu — the MLA cache write and the absorbed attention (the Linears around them are
// sd_cuda_linear).
//   cache write: one block per new token: RMSNorm of the latent (sd_block_rmsnorm), the rope key,
//                and RoPE of the key and the T queries' rope parts (double angles, as the CPU).
//   attend:      one block of 8 warps per (head, query token). q̃ = W_UK,hᵀ qn by one thread per
//                latent index, i increasing (the CPU order). Warp w scores rows j ≡ w (mod 8) with
//                lane-strided dots + fixed warp trees and keeps an online softmax (running max,
//                sum, and Σ e_j c_j in registers — each lane holds the latent entries it dotted);
//                the 8 warp states are merged in warp order; W_UV,h is applied once to the
//                normalised latent sum, one warp per output row. The order depends on the
//                position only, never on T: verify ≡ decode holds bitwise. Differs from the CPU's
//                two-pass softmax by rounding (NMSE-level).
#include "mla.h"
#include "rows.cuh"

#define ATT_WARPS 8

static __global__ void __launch_bounds__(SD_NORM_THREADS)
cache_write_kernel(const float *__restrict__ kv, const float *__restrict__ kv_norm, float eps, int R, int dr, int pos0,
                   float *__restrict__ c, float *__restrict__ kpe, float *__restrict__ mq, int Hm, int dn, int rope,
                   double theta) {
    __shared__ float sh[32];
    const int t = blockIdx.x, pos = pos0 + t;
    const float *kvt = kv + (size_t)t * (R + dr);
    sd_block_rmsnorm(kvt, kv_norm, R, eps, c + (size_t)pos * R, sh);
    float *kp = kpe + (size_t)pos * dr;
    if (!rope) {
        for (int i = threadIdx.x; i < dr; i += blockDim.x) kp[i] = kvt[R + i];
        return;
    }
    const int half = dr / 2, qw = dn + dr;
    // Pair i of the key, then pair i of every head's query rope part: (1 + Hm) · half rotations.
    for (int e = threadIdx.x; e < (1 + Hm) * half; e += blockDim.x) {
        const int i = e % half, who = e / half;
        const double ang = (double)pos * pow(theta, -2.0 * i / dr);
        const float cs = (float)cos(ang), sn = (float)sin(ang);
        const float *src = who == 0 ? kvt + R : mq + (size_t)t * Hm * qw + (size_t)(who - 1) * qw + dn;
        float *dst = who == 0 ? kp : mq + (size_t)t * Hm * qw + (size_t)(who - 1) * qw + dn;
        const float x0 = src[2 * i], x1 = src[2 * i + 1];
        dst[2 * i] = x0 * cs - x1 * sn;
        dst[2 * i + 1] = x0 * sn + x1 * cs;
    }
    if ((dr & 1) && threadIdx.x == 0) kp[dr - 1] = kvt[R + dr - 1]; // odd dr: the last entry has no pair
}

extern "C" sd_code sd_cuda_mla_cache_write(const float *kv, const float *kv_norm, float eps, int T, int R, int dr, int pos0,
                                           float *c, float *kpe, float *mq, int Hm, int dn, bool rope, double theta,
                                           cudaStream_t stream, sd_status *st) {
    SD_NVTX("sd_cuda_mla_cache_write");
    if (T < 1) return SD_OK;
    cache_write_kernel<<<T, SD_NORM_THREADS, 0, stream>>>(kv, kv_norm, eps, R, dr, pos0, c, kpe, mq, Hm, dn, rope ? 1 : 0, theta);
    SD_LAUNCH_CHECK(st);
    return SD_OK;
}

static inline int pad4(int n) { return (n + 3) & ~3; }

template <int NK, bool BF16>
static __global__ void __launch_bounds__(ATT_WARPS * 32)
attend_kernel(const float *__restrict__ mq, const void *__restrict__ kvb, const float *__restrict__ c,
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
static void attend_launch(int nk, dim3 grid, size_t smem, cudaStream_t stream, const float *mq, const void *kvb,
                          const float *c, const float *kpe, int Hm, int dn, int dr, int dv, int R, int pos0, float *mo) {
    const dim3 block(ATT_WARPS * 32);
    switch (nk) {
    case 1: attend_kernel<1, BF16><<<grid, block, smem, stream>>>(mq, kvb, c, kpe, Hm, dn, dr, dv, R, pos0, mo); break;
    case 2: attend_kernel<2, BF16><<<grid, block, smem, stream>>>(mq, kvb, c, kpe, Hm, dn, dr, dv, R, pos0, mo); break;
    case 4: attend_kernel<4, BF16><<<grid, block, smem, stream>>>(mq, kvb, c, kpe, Hm, dn, dr, dv, R, pos0, mo); break;
    case 8: attend_kernel<8, BF16><<<grid, block, smem, stream>>>(mq, kvb, c, kpe, Hm, dn, dr, dv, R, pos0, mo); break;
    default: attend_kernel<16, BF16><<<grid, block, smem, stream>>>(mq, kvb, c, kpe, Hm, dn, dr, dv, R, pos0, mo); break;
    }
}

extern "C" sd_code sd_cuda_mla_attend(const float *mq, const sd_mat *kv_b, const float *c, const float *kpe, int T, int Hm,
                                      int dn, int dr, int dv, int R, int pos0, float *mo, cudaStream_t stream, sd_status *st) {
    SD_NVTX("sd_cuda_mla_attend");
    if (R < 1 || R > 512) return sd_fail(st, SD_ERR_UNSUPPORTED, "cuda mla: kv_lora_rank %d outside 1..512", R);
    if (kv_b->dtype != SD_DT_BF16 && kv_b->dtype != SD_DT_F32)
        return sd_fail(st, SD_ERR_UNSUPPORTED, "cuda mla: kv_b dtype %d is not F32 or BF16", (int)kv_b->dtype);
    if (T < 1) return SD_OK;
    const int per = (R + 31) / 32, nk = per <= 1 ? 1 : per <= 2 ? 2 : per <= 4 ? 4 : per <= 8 ? 8 : 16;
    const size_t smem = sizeof(float) * ((size_t)pad4(R) * (ATT_WARPS + 2) + pad4(dr) + 2 * ATT_WARPS);
    const dim3 grid(Hm, T);
    if (kv_b->dtype == SD_DT_BF16) attend_launch<true>(nk, grid, smem, stream, mq, kv_b->data, c, kpe, Hm, dn, dr, dv, R, pos0, mo);
    else attend_launch<false>(nk, grid, smem, stream, mq, kv_b->data, c, kpe, Hm, dn, dr, dv, R, pos0, mo);
    SD_LAUNCH_CHECK(st);
    return SD_OK;
}
