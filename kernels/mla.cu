// mla.cu — the MLA cache write and the absorbed attention (the Linears around them are
// sd_cuda_linear).
//   cache write: one block per new token: RMSNorm of the latent (sd_block_rmsnorm), the rope key,
//                and RoPE of the key and the T queries' rope parts (double angles, as the CPU).
//   attend:      flash-decoding split, one thread-block cluster of MLA_CL = 8 blocks per (group of
//                HG heads, query token); no global scratch (the partials live in the blocks'
//                shared memory and are read across the cluster). Per block (rank b):
//                0. async copies of its W_UK,h columns [b·R/8, (b+1)·R/8) and W_UV,h rows
//                   [b·dv/8, (b+1)·dv/8) for its HG heads into shared memory (all of kv_b's
//                   bytes are in flight at once; W_UV is waited for only at step 4);
//                1. q̃ for its columns: partial sums over 8 consecutive i each (i increasing),
//                   then the dn/8 partials in order; the cluster gathers the full q̃;
//                2. chunk b of the token's rows (mla_chunking: at most 8 chunks whose size is a
//                   multiple of 8 rows, a function of the token's position alone): warp w takes
//                   rows a+w, a+w+8, ... with an online softmax per head (running max, sum and
//                   Σ e_j c_j in registers); the 8 warp states merged in warp order;
//                3. the chunks merged in chunk order (max, rescale, sum) for its columns of the
//                   latent sum, normalised; the cluster gathers the full latent;
//                4. its W_UV rows dotted with the latent (one warp per row, lane-strided).
//                Every sum's order depends on the position and the dims only, never on T or on
//                HG: verify ≡ decode holds bitwise. Differs from the CPU's two-pass softmax and
//                i-ordered q̃ by rounding (NMSE-level).
#include <cooperative_groups.h>
#include <cuda_pipeline.h>
#include "mla.h"
#include "rows.cuh"

#define ATT_WARPS 8 // warps per attend block
#define MLA_CL 8    // blocks per cluster = the most chunks a token's rows are cut into
#define MLA_TILE 8  // chunk sizes are multiples of this (= ATT_WARPS: every warp gets rows)
#define MLA_IG 8    // W_UK rows per partial sum of q̃

static __global__ void __launch_bounds__(SD_NORM_THREADS)
cache_write_kernel(const float *__restrict__ kv, const float *__restrict__ kv_norm, float eps, int R, int dr, sd_dev_pos at,
                   float *__restrict__ c, float *__restrict__ kpe, float *__restrict__ mq, int Hm, int dn, int rope,
                   double theta) {
    sd_pdl_enter();
    __shared__ float sh[32];
    const int t = blockIdx.x, pos = sd_pos_read(at) + t;
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

extern "C" sd_code sd_cuda_mla_cache_write(const float *kv, const float *kv_norm, float eps, int T, int R, int dr, sd_dev_pos pos0,
                                           float *c, float *kpe, float *mq, int Hm, int dn, bool rope, double theta,
                                           cudaStream_t stream, sd_status *st) {
    SD_NVTX("sd_cuda_mla_cache_write");
    if (T < 1) return SD_OK;
    SD_CUDA_CHECK(st, sd_launch(cache_write_kernel, T, SD_NORM_THREADS, 0, stream, kv, kv_norm, eps, R, dr, pos0, c, kpe, mq, Hm, dn,
                                rope ? 1 : 0, theta));
    return SD_OK;
}


// The token at `pos` sees rows 0..pos, cut into *nch <= MLA_CL chunks of *cs rows (the last one
// shorter): chunk k is rows [k·cs, min((k+1)·cs, pos+1)). A function of pos alone.
__host__ __device__ static inline void mla_chunking(int pos, int *nch, int *cs) {
    const int n = pos + 1, ntile = (n + MLA_TILE - 1) / MLA_TILE, tpc = (ntile + MLA_CL - 1) / MLA_CL;
    *cs = tpc * MLA_TILE;
    *nch = (n + *cs - 1) / *cs;
}

// Shared-memory layout of one attend block (byte offsets, 16-aligned), the same on both sides.
struct mla_smem {
    int wuk, wuv, qn, qp, qs, ls, qt, slot, sm, bytes;
};
__host__ __device__ static inline int mla_a16(int b) { return (b + 15) & ~15; }
__host__ __device__ static inline int mla_max(int a, int b) { return a > b ? a : b; }
__host__ __device__ static inline mla_smem mla_layout(int HG, int R, int dn, int dr, int dv, int es) {
    const int RC = (R + MLA_CL - 1) / MLA_CL, VC = (dv + MLA_CL - 1) / MLA_CL, NGI = (dn + MLA_IG - 1) / MLA_IG;
    mla_smem L;
    int off = 0;
    L.wuk = off; off += mla_a16(mla_max(HG * dn * RC * es, ATT_WARPS * HG * R * 4)); // W_UK slice, then warp states
    L.wuv = off; off += mla_a16(HG * VC * R * es);                                   // W_UV rows
    L.qn = off; off += mla_a16(HG * dn * 4);                                         // query nope parts
    L.qp = off; off += mla_a16(HG * dr * 4);                                         // query rope parts
    L.qs = off; off += mla_a16(HG * RC * 4);                                         // own q̃ columns (read by the cluster)
    L.ls = off; off += mla_a16(HG * RC * 4);                                         // own latent columns (read by the cluster)
    L.qt = off; off += mla_a16(mla_max(NGI * HG * RC, HG * R) * 4);                  // q̃ partials, full q̃, full latent
    L.slot = off; off += mla_a16(HG * R * 4);                                        // own chunk's Σ e_j c_j (read by the cluster)
    L.sm = off; off += mla_a16((2 * ATT_WARPS * HG + 2 * HG + 2 * HG * MLA_CL) * 4);  // warp m/l, chunk m/l, gathered m/l
    L.bytes = off;
    return L;
}

template <bool BF16> __device__ __forceinline__ float mla_ldw(const unsigned char *base, size_t i) {
    return BF16 ? sd_dev_bf16(((const uint16_t *)base)[i]) : ((const float *)base)[i];
}
template <bool BF16> __device__ __forceinline__ void mla_cpw(unsigned char *dst, size_t di, const void *src, size_t si) {
    if (BF16) ((uint16_t *)dst)[di] = ((const uint16_t *)src)[si];
    else ((float *)dst)[di] = ((const float *)src)[si];
}

// One cluster of MLA_CL blocks per (heads h0 .. h0+HG-1, token t): grid (MLA_CL, ceil(Hm/HG), T).
// NK = latent entries per lane (32·NK >= R). `vec`: kv_b rows and the column slices are 16-byte
// aligned (async 16-byte copies), else element copies.
template <int HG, int NK, bool BF16>
static __global__ void __cluster_dims__(MLA_CL, 1, 1) __launch_bounds__(ATT_WARPS * 32, HG >= 4 ? 1 : 2)
attend_kernel(const float *__restrict__ mq, const void *__restrict__ kvb, const float *__restrict__ c,
              const float *__restrict__ kpe, int Hm, int dn, int dr, int dv, int R, sd_dev_pos at, int vec,
              float *__restrict__ mo) {
    sd_pdl_trigger(); // a cluster launch, plain: it waits for its predecessor; its successor may start early
    namespace cg = cooperative_groups;
    constexpr int ES = BF16 ? 2 : 4;
    constexpr int RB0 = 32 / (NK * HG), RB = RB0 < 1 ? 1 : RB0 > 4 ? 4 : RB0; // rows a warp loads at once
    extern __shared__ __align__(16) unsigned char smraw[];
    cg::cluster_group cluster = cg::this_cluster();
    const mla_smem L = mla_layout(HG, R, dn, dr, dv, ES);
    unsigned char *wuk = smraw + L.wuk, *wuv = smraw + L.wuv;
    float *wbuf = (float *)(smraw + L.wuk), *qn = (float *)(smraw + L.qn), *qp = (float *)(smraw + L.qp);
    float *qs = (float *)(smraw + L.qs), *ls = (float *)(smraw + L.ls), *qt = (float *)(smraw + L.qt);
    float *slot = (float *)(smraw + L.slot), *wm = (float *)(smraw + L.sm), *wl = wm + ATT_WARPS * HG;
    float *slot_m = wl + ATT_WARPS * HG, *slot_l = slot_m + HG, *cm = slot_l + HG, *cl = cm + HG * MLA_CL;

    const int rank = (int)cluster.block_rank();
    const int h0 = blockIdx.y * HG, nh = min(HG, Hm - h0);
    const int t = blockIdx.z, pos = sd_pos_read(at) + t, qw = dn + dr, hs = dn + dv;
    const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5, bs = blockDim.x;
    const int RC = (R + MLA_CL - 1) / MLA_CL, VC = (dv + MLA_CL - 1) / MLA_CL, NGI = (dn + MLA_IG - 1) / MLA_IG;
    const int c0 = rank * RC, nc = max(0, min(RC, R - c0)); // this block's q̃ / latent columns
    const int v0 = rank * VC, nv = max(0, min(VC, dv - v0)); // this block's output rows
    const float *qtok = mq + (size_t)t * Hm * qw;

    // 0. Weights into shared memory: W_UK columns (group 1), W_UV rows (group 2, waited at 4).
    if (vec) {
        const int n16 = RC * ES / 16, m16 = R * ES / 16;
        for (int e = tid; e < nh * dn * n16; e += bs) {
            const int q = e % n16, hi = e / n16, i = hi % dn, h = hi / dn;
            const char *src = (const char *)kvb + ((size_t)((h0 + h) * hs + i) * R + c0) * ES + q * 16;
            __pipeline_memcpy_async(wuk + (size_t)(h * dn + i) * RC * ES + q * 16, src, 16);
        }
        __pipeline_commit();
        for (int e = tid; e < nh * nv * m16; e += bs) {
            const int q = e % m16, hv = e / m16, v = hv % nv, h = hv / nv;
            const char *src = (const char *)kvb + (size_t)((h0 + h) * hs + dn + v0 + v) * R * ES + q * 16;
            __pipeline_memcpy_async(wuv + (size_t)(h * VC + v) * R * ES + q * 16, src, 16);
        }
        __pipeline_commit();
    } else {
        for (int e = tid; e < nh * dn * nc; e += bs) {
            const int cc = e % nc, hi = e / nc, i = hi % dn, h = hi / dn;
            mla_cpw<BF16>(wuk, (size_t)(h * dn + i) * RC + cc, kvb, (size_t)((h0 + h) * hs + i) * R + c0 + cc);
        }
        for (int e = tid; e < nh * nv * R; e += bs) {
            const int r = e % R, hv = e / R, v = hv % nv, h = hv / nv;
            mla_cpw<BF16>(wuv, (size_t)(h * VC + v) * R + r, kvb, (size_t)((h0 + h) * hs + dn + v0 + v) * R + r);
        }
    }
    for (int e = tid; e < HG * dn; e += bs) {
        const int h = e / dn, i = e % dn;
        qn[e] = h < nh ? qtok[(size_t)(h0 + h) * qw + i] : 0.0f;
    }
    for (int e = tid; e < HG * dr; e += bs) {
        const int h = e / dr, i = e % dr;
        qp[e] = h < nh ? qtok[(size_t)(h0 + h) * qw + dn + i] : 0.0f;
    }
    if (vec) __pipeline_wait_prior(1);
    __syncthreads();

    // 1. q̃ columns c0 .. c0+nc-1: partials over MLA_IG consecutive i (i increasing), then the
    //    partials in order; the full q̃ gathered from the cluster.
    float *part = qt;
    for (int e = tid; e < nh * NGI * nc; e += bs) {
        const int cc = e % nc, g = (e / nc) % NGI, h = e / (nc * NGI);
        const int i1 = min(dn, (g + 1) * MLA_IG);
        float s = 0.0f;
        for (int i = g * MLA_IG; i < i1; i++) s = s + qn[h * dn + i] * mla_ldw<BF16>(wuk, (size_t)(h * dn + i) * RC + cc);
        part[(g * HG + h) * RC + cc] = s;
    }
    __syncthreads();
    for (int e = tid; e < nh * nc; e += bs) {
        const int cc = e % nc, h = e / nc;
        float s = part[h * RC + cc];
        for (int g = 1; g < NGI; g++) s = s + part[(g * HG + h) * RC + cc];
        qs[h * RC + cc] = s;
    }
    cluster.sync(); // (1) every block's q̃ columns written
    for (int e = tid; e < HG * R; e += bs) {
        const int h = e / R, r = e % R, src = r / RC;
        qt[e] = h < nh ? cluster.map_shared_rank(qs, src)[h * RC + r - src * RC] : 0.0f;
    }
    __syncthreads();

    // 2. Chunk `rank` of this token's rows: a per-warp online softmax, warps merged in order.
    int nch, cs;
    mla_chunking(pos, &nch, &cs);
    if (rank < nch) {
        const int a = rank * cs, b = min(a + cs, pos + 1);
        const float scale = 1.0f / sqrtf((float)(dn + dr));
        float qreg[HG][NK], acc[HG][NK], m[HG], l[HG];
#pragma unroll
        for (int h = 0; h < HG; h++) {
            m[h] = -INFINITY;
            l[h] = 0.0f;
#pragma unroll
            for (int k = 0; k < NK; k++) {
                const int r = lane + 32 * k;
                qreg[h][k] = r < R ? qt[h * R + r] : 0.0f;
                acc[h][k] = 0.0f;
            }
        }
        for (int j0 = a + w; j0 < b; j0 += ATT_WARPS * RB) {
            float cv[RB][NK], s[RB][HG];
#pragma unroll
            for (int u = 0; u < RB; u++) {
                const int j = j0 + ATT_WARPS * u;
                const float *cj = c + (size_t)j * R;
#pragma unroll
                for (int k = 0; k < NK; k++) {
                    const int r = lane + 32 * k;
                    cv[u][k] = (j < b && r < R) ? cj[r] : 0.0f;
                }
            }
#pragma unroll
            for (int u = 0; u < RB; u++) {
                const int j = j0 + ATT_WARPS * u;
#pragma unroll
                for (int h = 0; h < HG; h++) {
                    float p = 0.0f;
#pragma unroll
                    for (int k = 0; k < NK; k++)
                        if (lane + 32 * k < R) p = p + qreg[h][k] * cv[u][k];
                    s[u][h] = p;
                }
                if (j < b)
                    for (int r = lane; r < dr; r += 32) {
                        const float kv = kpe[(size_t)j * dr + r];
#pragma unroll
                        for (int h = 0; h < HG; h++) s[u][h] = s[u][h] + qp[h * dr + r] * kv;
                    }
            }
#pragma unroll
            for (int u = 0; u < RB; u++)
#pragma unroll
                for (int h = 0; h < HG; h++) s[u][h] = sd_warp_sum(s[u][h]) * scale;
#pragma unroll
            for (int u = 0; u < RB; u++) {
                if (j0 + ATT_WARPS * u >= b) break;
#pragma unroll
                for (int h = 0; h < HG; h++) {
                    const float sc = s[u][h];
                    if (sc > m[h]) {
                        const float f = expf(m[h] - sc); // 0 for the first row (m = -inf)
                        l[h] = l[h] * f + 1.0f;
#pragma unroll
                        for (int k = 0; k < NK; k++) acc[h][k] = acc[h][k] * f + cv[u][k];
                        m[h] = sc;
                    } else {
                        const float e = expf(sc - m[h]);
                        l[h] = l[h] + e;
#pragma unroll
                        for (int k = 0; k < NK; k++) acc[h][k] = acc[h][k] + e * cv[u][k];
                    }
                }
            }
        }
#pragma unroll
        for (int h = 0; h < HG; h++) {
            if (lane == 0) { wm[w * HG + h] = m[h]; wl[w * HG + h] = l[h]; }
#pragma unroll
            for (int k = 0; k < NK; k++) {
                const int r = lane + 32 * k;
                if (r < R) wbuf[(w * HG + h) * R + r] = acc[h][k];
            }
        }
        __syncthreads();
        // Warp states in warp order (warp 0 always has the chunk's first row: M is finite).
        for (int e = tid; e < nh * R; e += bs) {
            const int h = e / R, r = e % R;
            float M = -INFINITY;
            for (int v = 0; v < ATT_WARPS; v++) M = fmaxf(M, wm[v * HG + h]);
            float sum = 0.0f;
            for (int v = 0; v < ATT_WARPS; v++) {
                const float mv = wm[v * HG + h], f = mv == -INFINITY ? 0.0f : expf(mv - M);
                sum = sum + wbuf[(v * HG + h) * R + r] * f;
            }
            slot[h * R + r] = sum;
        }
        if (tid < nh) {
            const int h = tid;
            float M = -INFINITY;
            for (int v = 0; v < ATT_WARPS; v++) M = fmaxf(M, wm[v * HG + h]);
            float Ls = 0.0f;
            for (int v = 0; v < ATT_WARPS; v++) {
                const float mv = wm[v * HG + h], f = mv == -INFINITY ? 0.0f : expf(mv - M);
                Ls = Ls + wl[v * HG + h] * f;
            }
            slot_m[h] = M;
            slot_l[h] = Ls;
        }
    }
    cluster.sync(); // (2) every chunk's state written

    // 3. The chunks in chunk order for this block's latent columns, normalised; the full latent
    //    gathered from the cluster (into qt: q̃ is no longer needed).
    if (tid < nh * nch) {
        const int h = tid / nch, k = tid % nch;
        cm[h * MLA_CL + k] = cluster.map_shared_rank(slot_m, k)[h];
        cl[h * MLA_CL + k] = cluster.map_shared_rank(slot_l, k)[h];
    }
    __syncthreads();
    for (int e = tid; e < nh * nc; e += bs) {
        const int cc = e % nc, h = e / nc, r = c0 + cc;
        float M = -INFINITY;
        for (int k = 0; k < nch; k++) M = fmaxf(M, cm[h * MLA_CL + k]);
        float Ls = 0.0f, sum = 0.0f;
        for (int k = 0; k < nch; k++) {
            const float mk = cm[h * MLA_CL + k], f = mk == -INFINITY ? 0.0f : expf(mk - M);
            Ls = Ls + cl[h * MLA_CL + k] * f;
            sum = sum + cluster.map_shared_rank(slot, k)[h * R + r] * f;
        }
        ls[h * RC + cc] = sum * (1.0f / Ls);
    }
    cluster.sync(); // (3) every block's latent columns written
    for (int e = tid; e < HG * R; e += bs) {
        const int h = e / R, r = e % R, src = r / RC;
        if (h < nh) qt[e] = cluster.map_shared_rank(ls, src)[h * RC + r - src * RC];
    }
    if (vec) __pipeline_wait_prior(0);
    cluster.sync(); // (4) no block reads another's shared memory after this; W_UV and the latent are in

    // 4. mo[t][h][v] = W_UV,h[v] · lat for this block's rows, one warp per row.
    float *out = mo + (size_t)t * Hm * dv;
    for (int it = w; it < nh * nv; it += ATT_WARPS) {
        const int h = it / nv, v = it % nv;
        const unsigned char *wrow = wuv + (size_t)(h * VC + v) * R * ES;
        float p = 0.0f;
        for (int r = lane; r < R; r += 32) p = p + mla_ldw<BF16>(wrow, r) * qt[h * R + r];
        p = sd_warp_sum(p);
        if (lane == 0) out[(size_t)(h0 + h) * dv + v0 + v] = p;
    }
}

// Per-device cached attributes (0: multiprocessors, 1: opt-in shared memory per block); the
// largest dynamic shared memory each kernel instance was allowed is cached in attend_go.
#define MLA_MAX_DEV 64
static int mla_dev_attr(int which, cudaDeviceAttr attr) {
    static int cache[2][MLA_MAX_DEV];
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= MLA_MAX_DEV) dev = 0;
    if (!cache[which][dev]) {
        int v = 0;
        if (cudaDeviceGetAttribute(&v, attr, dev) != cudaSuccess || v <= 0) v = which ? 48 * 1024 : 1;
        cache[which][dev] = v;
    }
    return cache[which][dev];
}

// Head-group override for the lab (1, 2 or 4; 0: the launcher's choice). Any value gives the same bits.
static int g_mla_force_hg = 0;

template <int HG, int NK, bool BF16>
static sd_code attend_go(dim3 grid, size_t smem, cudaStream_t stream, const float *mq, const void *kvb, const float *c,
                         const float *kpe, int Hm, int dn, int dr, int dv, int R, sd_dev_pos pos0, int vec, float *mo,
                         sd_status *st) {
    static size_t allowed[MLA_MAX_DEV];
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= MLA_MAX_DEV) dev = 0;
    if (smem > 48 * 1024 && smem > allowed[dev]) {
        SD_CUDA_CHECK(st, cudaFuncSetAttribute(attend_kernel<HG, NK, BF16>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                               (int)smem));
        allowed[dev] = smem;
    }
    attend_kernel<HG, NK, BF16><<<grid, ATT_WARPS * 32, smem, stream>>>(mq, kvb, c, kpe, Hm, dn, dr, dv, R, pos0, vec, mo);
    return SD_OK;
}

template <int HG, bool BF16>
static sd_code attend_nk(int nk, dim3 grid, size_t smem, cudaStream_t stream, const float *mq, const void *kvb,
                         const float *c, const float *kpe, int Hm, int dn, int dr, int dv, int R, sd_dev_pos pos0, int vec,
                         float *mo, sd_status *st) {
    switch (nk) {
    case 1: return attend_go<HG, 1, BF16>(grid, smem, stream, mq, kvb, c, kpe, Hm, dn, dr, dv, R, pos0, vec, mo, st);
    case 2: return attend_go<HG, 2, BF16>(grid, smem, stream, mq, kvb, c, kpe, Hm, dn, dr, dv, R, pos0, vec, mo, st);
    case 4: return attend_go<HG, 4, BF16>(grid, smem, stream, mq, kvb, c, kpe, Hm, dn, dr, dv, R, pos0, vec, mo, st);
    case 8: return attend_go<HG, 8, BF16>(grid, smem, stream, mq, kvb, c, kpe, Hm, dn, dr, dv, R, pos0, vec, mo, st);
    default: return attend_go<HG, 16, BF16>(grid, smem, stream, mq, kvb, c, kpe, Hm, dn, dr, dv, R, pos0, vec, mo, st);
    }
}

template <bool BF16>
static sd_code attend_hg(int hg, int nk, dim3 grid, size_t smem, cudaStream_t stream, const float *mq, const void *kvb,
                         const float *c, const float *kpe, int Hm, int dn, int dr, int dv, int R, sd_dev_pos pos0, int vec,
                         float *mo, sd_status *st) {
    switch (hg) {
    case 4: return attend_nk<4, BF16>(nk, grid, smem, stream, mq, kvb, c, kpe, Hm, dn, dr, dv, R, pos0, vec, mo, st);
    case 2: return attend_nk<2, BF16>(nk, grid, smem, stream, mq, kvb, c, kpe, Hm, dn, dr, dv, R, pos0, vec, mo, st);
    default: return attend_nk<1, BF16>(nk, grid, smem, stream, mq, kvb, c, kpe, Hm, dn, dr, dv, R, pos0, vec, mo, st);
    }
}

extern "C" sd_code sd_cuda_mla_attend(const float *mq, const sd_mat *kv_b, const float *c, const float *kpe, int T, int Hm,
                                      int dn, int dr, int dv, int R, sd_dev_pos pos0, float *mo, cudaStream_t stream, sd_status *st) {
    SD_NVTX("sd_cuda_mla_attend");
    if (R < 1 || R > 512) return sd_fail(st, SD_ERR_UNSUPPORTED, "cuda mla: kv_lora_rank %d outside 1..512", R);
    if (kv_b->dtype != SD_DT_BF16 && kv_b->dtype != SD_DT_F32)
        return sd_fail(st, SD_ERR_UNSUPPORTED, "cuda mla: kv_b dtype %d is not F32 or BF16", (int)kv_b->dtype);
    if (T < 1) return SD_OK;
    const bool bf16 = kv_b->dtype == SD_DT_BF16;
    const int es = bf16 ? 2 : 4, RC = (R + MLA_CL - 1) / MLA_CL;
    const int per = (R + 31) / 32, nk = per <= 1 ? 1 : per <= 2 ? 2 : per <= 4 ? 4 : per <= 8 ? 8 : 16;
    const int vec = R % MLA_CL == 0 && (RC * es) % 16 == 0 && ((uintptr_t)kv_b->data & 15) == 0;
    // Head group: 1 head a cluster (bench/mla_lab: fastest of 1, 2, 4 at every ctx 512..32K and
    // T = 1, 5 on an H200; the choice never changes the bits); smaller while the shared memory
    // does not fit.
    const int optin = mla_dev_attr(1, cudaDevAttrMaxSharedMemoryPerBlockOptin);
    int hg = g_mla_force_hg;
    if (hg != 1 && hg != 2 && hg != 4) hg = 1;
    while (hg > 1 && mla_layout(hg, R, dn, dr, dv, es).bytes > optin) hg /= 2;
    const size_t smem = (size_t)mla_layout(hg, R, dn, dr, dv, es).bytes;
    if (smem > (size_t)optin)
        return sd_fail(st, SD_ERR_UNSUPPORTED, "cuda mla: %zu bytes of shared memory per block > %d", smem, optin);
    const dim3 grid(MLA_CL, (Hm + hg - 1) / hg, T);
    sd_code rc = bf16 ? attend_hg<true>(hg, nk, grid, smem, stream, mq, kv_b->data, c, kpe, Hm, dn, dr, dv, R, pos0, vec, mo, st)
                      : attend_hg<false>(hg, nk, grid, smem, stream, mq, kv_b->data, c, kpe, Hm, dn, dr, dv, R, pos0, vec, mo, st);
    if (rc != SD_OK) return rc;
    SD_LAUNCH_CHECK(st);
    return SD_OK;
}
