// mla.cu — the MLA cache write and the absorbed attention (the Linears around them are
// sd_cuda_linear). Three launches over every head at once (mla.h), a flash-decoding split whose
// per-chunk partials live in the state's scratch:
//   absorb: block (64 latent columns, head, token): q̃ = W_UK,hᵀ qn. Each thread loads its 32
//           weights before it waits for the predecessor (weights are never written), so the
//           weight reads overlap the previous kernel's tail. With a cache write folded in, one
//           more block per token runs it (RMSNorm of the latent, the rope key, RoPE of the key and
//           of the T queries' rope parts in double angles, as the CPU) — absorb reads only the
//           queries' nope parts, so the two never touch the same bytes.
//   split:  block (chunk k, 4 heads, token): the chunk's rows in tiles of 16 (async copies,
//           double-buffered) shared by the 4 heads; per head the scores, then the chunk's state
//           (running max, sum of exps, Σ e_j c_j) tile by tile. Chunks: mla_chunking, a function
//           of the token's position alone.
//   merge:  block (16 output rows, head, token): the chunk states merged in chunk order into the
//           normalised latent, then its W_UV rows (copied into shared memory before the wait)
//           dotted with it, one warp per row.
// Order per output, independent of T (verify ≡ decode bitwise) and of the grid shapes:
//   q̃[r]    Σ over groups of 8 consecutive i (in order) of the group's fmaf chain, i increasing;
//   score_j  lane partials (fmaf over r = lane + 32k, k increasing, then the rope part the same
//            way), sd_warp_sum's tree, times (dn+dr)^-½;
//   chunk    per tile of 16 rows from the chunk start: M' = max(M, tile max), f = e^(M−M'),
//            l = l·f + e_j (j increasing), acc_r = fmaf(e_j, c_j[r], acc_r·f) (j increasing);
//   merge    M = max_k m_k, f_k = e^(m_k−M), L = Σ_k l_k f_k, lat_r = (Σ_k fmaf acc_k[r]·f_k)·(1/L),
//            k increasing;
//   out      lane partials (fmaf over r = lane + 32i), sd_warp_sum's tree.
// Differs from the CPU's i-ordered q̃ and two-pass softmax by rounding (NMSE-level). A split
// through scratch, not one thread-block cluster per head group: docs/EXPERIMENTS.md#mla-attend-cluster.
#include <cuda_pipeline.h>
#include "mla.h"
#include "rows.cuh"

#define MLA_COLS 64 // absorb: latent columns per block
#define MLA_IG 4    // absorb: W_UK rows per partial sum of q̃
#define MLA_PRE 8   // absorb, scalar path: i-groups per thread loaded before the wait (dn <= 128)
#define MLA_TILE 16 // split: rows per tile; chunk sizes are multiples of it
#define MLA_HB 4    // split: heads per block (two warps each, 8 rows of a tile per warp)
#define MLA_NK 16   // split: the most latent entries per lane (R <= 512)
#define MLA_NP 4    // split: rope entries per lane (dr <= 128)
#define MLA_VR 16   // merge: W_UV rows per block
#define MLA_THREADS 256
static_assert(MLA_THREADS == SD_NORM_THREADS, "the folded cache write runs sd_block_rmsnorm with the absorb block");
static_assert(SD_MLA_SPLIT <= 32, "merge: one lane per chunk");
static_assert(MLA_HB == 4 && MLA_TILE % (MLA_THREADS / 32) == 0 && MLA_TILE <= 32, "split: thread roles (a float4 of head factors a row)");

// The token at `pos` sees rows 0..pos, cut into *nch <= SD_MLA_SPLIT chunks of *cs rows (the last
// one shorter): chunk k is rows [k·cs, min((k+1)·cs, pos+1)). A function of pos alone. Chunks
// are as short as SD_MLA_SPLIT allows, since a split block's tiles are serial
// (docs/EXPERIMENTS.md#mla-chunk-tiles).
__host__ __device__ static inline void mla_chunking(int pos, int *nch, int *cs) {
    const int n = pos + 1, ntile = (n + MLA_TILE - 1) / MLA_TILE, tpc = (ntile + SD_MLA_SPLIT - 1) / SD_MLA_SPLIT;
    *cs = tpc * MLA_TILE;
    *nch = (n + *cs - 1) / *cs;
}

template <bool BF16> __device__ __forceinline__ float mla_ldw(const void *base, size_t i) {
    return BF16 ? sd_dev_bf16(((const uint16_t *)base)[i]) : ((const float *)base)[i];
}

// ---------------------------------------------------------------------------- cache write
// Token t of the call (one block): c[pos] = rmsnorm(latent), kpe[pos] = the rope key; with rope,
// the key and every head's query rope part rotated in place.
__device__ static void cache_write_token(const sd_mla_write &wr, int t, int pos, int R, int dr, float *c, float *kpe, float *mq,
                                         int Hm, int dn) {
    __shared__ float sh[32];
    const float *kvt = wr.kv + (size_t)t * (R + dr);
    sd_block_rmsnorm(kvt, wr.kv_norm, R, wr.eps, c + (size_t)pos * R, sh);
    float *kp = kpe + (size_t)pos * dr;
    if (!wr.rope) {
        for (int i = threadIdx.x; i < dr; i += blockDim.x) kp[i] = kvt[R + i];
        return;
    }
    const int half = dr / 2, qw = dn + dr;
    // Pair i of the key, then pair i of every head's query rope part: (1 + Hm) · half rotations.
    for (int e = threadIdx.x; e < (1 + Hm) * half; e += blockDim.x) {
        const int i = e % half, who = e / half;
        const double ang = (double)pos * pow(wr.theta, -2.0 * i / dr);
        const float cs = (float)cos(ang), sn = (float)sin(ang);
        const float *src = who == 0 ? kvt + R : mq + (size_t)t * Hm * qw + (size_t)(who - 1) * qw + dn;
        float *dst = who == 0 ? kp : mq + (size_t)t * Hm * qw + (size_t)(who - 1) * qw + dn;
        const float x0 = src[2 * i], x1 = src[2 * i + 1];
        dst[2 * i] = x0 * cs - x1 * sn;
        dst[2 * i + 1] = x0 * sn + x1 * cs;
    }
    if ((dr & 1) && threadIdx.x == 0) kp[dr - 1] = kvt[R + dr - 1]; // odd dr: the last entry has no pair
}

// ---------------------------------------------------------------------------- absorb
// Grid (ceil(R/64) [+ 1 with the cache write], Hm, T). q̃ column r of block (c0, h, t):
// part_g = fmaf chain over i = 4g .. 4g+3 (increasing), q̃ = Σ_g part_g, g increasing. Each thread's
// weights of its first groups are loaded before the wait (weights are never written).
//   vec (bf16, R % 8 == 0, 16-byte aligned): thread (c8 = tid % 8, gq = tid / 8) loads 8 columns
//        of the 4 rows of groups gq, gq+32, ... as one 16-byte load per row;
//   else: thread (cc = tid % 64, g4 = tid / 64) loads column cc of groups g4, g4+4, ... one value
//        at a time.
template <bool BF16, bool VEC>
static __global__ void __launch_bounds__(MLA_THREADS)
absorb_kernel(float *__restrict__ mq, const void *__restrict__ kvb, int Hm, int dn, int dr, int dv, int R, sd_dev_pos at,
              sd_mla_write wr, int fold, float *__restrict__ c, float *__restrict__ kpe, float *__restrict__ qabs) {
    sd_pdl_trigger();
    const int t = blockIdx.z, h = blockIdx.y, tid = threadIdx.x;
    if (fold && (int)blockIdx.x == (int)gridDim.x - 1) { // the cache write of token t (head 0's spare block)
        if (h != 0) return;
        sd_pdl_wait();
        cache_write_token(wr, t, sd_pos_read(at) + t, R, dr, c, kpe, mq, Hm, dn);
        return;
    }
    __shared__ float qn[512], part[512 / MLA_IG][MLA_COLS];
    const int c0 = blockIdx.x * MLA_COLS, hs = dn + dv, NGI = (dn + MLA_IG - 1) / MLA_IG;
    const size_t row0 = (size_t)h * hs; // W_UK,h row i is kv_b row h·hs + i
    if (VEC) {
        const int c8 = tid % 8, gq = tid / 8, col = c0 + 8 * c8;
        const bool live = col < R; // R % 8 == 0: all 8 columns or none
        const uint64_t pol = sd_l2_evict_first();
        uint4 wv[MLA_IG];
#pragma unroll
        for (int e = 0; e < MLA_IG; e++) {
            const int i = gq * MLA_IG + e;
            wv[e] = live && i < dn ? sd_ldg_pol((const uint4 *)((const uint16_t *)kvb + (row0 + i) * R + col), pol) : make_uint4(0, 0, 0, 0);
        }
        sd_pdl_wait();
        const float *qh = mq + ((size_t)t * Hm + h) * (dn + dr);
        for (int i = tid; i < dn; i += MLA_THREADS) qn[i] = qh[i];
        __syncthreads();
        for (int g = gq; g < NGI; g += 32) {
            float acc[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
            for (int e = 0; e < MLA_IG; e++) {
                const int i = g * MLA_IG + e;
                if (i >= dn) break;
                const uint4 u = g == gq ? wv[e] : (live ? sd_ldg_pol((const uint4 *)((const uint16_t *)kvb + (row0 + i) * R + col), pol)
                                                        : make_uint4(0, 0, 0, 0));
                float wf[8];
                sd_widen16<true>(u, wf);
#pragma unroll
                for (int k = 0; k < 8; k++) acc[k] = fmaf(qn[i], wf[k], acc[k]);
            }
#pragma unroll
            for (int k = 0; k < 8; k++) part[g][8 * c8 + k] = acc[k];
        }
    } else {
        const int cc = tid % MLA_COLS, g4 = tid / MLA_COLS, r = c0 + cc;
        const bool live = r < R;
        float wv[MLA_PRE][MLA_IG];
#pragma unroll
        for (int q = 0; q < MLA_PRE; q++)
#pragma unroll
            for (int e = 0; e < MLA_IG; e++) {
                const int i = (g4 + 4 * q) * MLA_IG + e;
                wv[q][e] = live && i < dn ? mla_ldw<BF16>(kvb, (row0 + i) * R + r) : 0.0f;
            }
        sd_pdl_wait();
        const float *qh = mq + ((size_t)t * Hm + h) * (dn + dr);
        for (int i = tid; i < dn; i += MLA_THREADS) qn[i] = qh[i];
        __syncthreads();
        for (int g = g4, q = 0; g < NGI; g += 4, q++) {
            float a = 0.0f;
#pragma unroll
            for (int e = 0; e < MLA_IG; e++) {
                const int i = g * MLA_IG + e;
                if (i >= dn) break;
                float wgt = 0.0f;
#pragma unroll
                for (int qq = 0; qq < MLA_PRE; qq++)
                    if (qq == q) wgt = wv[qq][e];
                if (q >= MLA_PRE) wgt = live ? mla_ldw<BF16>(kvb, (row0 + i) * R + r) : 0.0f;
                a = fmaf(qn[i], wgt, a);
            }
            part[g][cc] = a;
        }
    }
    __syncthreads();
    if (tid < MLA_COLS && c0 + tid < R) {
        float s = part[0][tid];
        for (int g = 1; g < NGI; g++) s = s + part[g][tid];
        qabs[((size_t)t * Hm + h) * R + c0 + tid] = s;
    }
}

// ---------------------------------------------------------------------------- split
// Rows [j0, j0+n) of c and kpe into shared memory (contiguous in both): async 16-byte copies when
// vec, else plain loads (synchronous; the caller's barrier publishes either).
__device__ __forceinline__ void split_load(float *ct, float *kt, const float *c, const float *kpe, int j0, int n, int R, int dr,
                                           bool vec) {
    const float *cs = c + (size_t)j0 * R, *ks = kpe + (size_t)j0 * dr;
    if (vec) {
        for (int e = threadIdx.x; e < n * R / 4; e += MLA_THREADS) __pipeline_memcpy_async(ct + 4 * e, cs + 4 * e, 16);
        for (int e = threadIdx.x; e < n * dr / 4; e += MLA_THREADS) __pipeline_memcpy_async(kt + 4 * e, ks + 4 * e, 16);
    } else {
        for (int e = threadIdx.x; e < n * R; e += MLA_THREADS) ct[e] = cs[e];
        for (int e = threadIdx.x; e < n * dr; e += MLA_THREADS) kt[e] = ks[e];
    }
    __pipeline_commit();
}

static size_t split_smem(int R, int dr) {
    return sizeof(float) * (2 * (size_t)MLA_TILE * (R + dr) + 2 * MLA_HB * MLA_TILE + MLA_HB);
}

// Grid (SD_MLA_SPLIT, ceil(Hm/4), T); blocks past the token's chunk count exit. Per tile: all 8
// warps score (warp w: rows 2w and 2w+1, the block's 4 heads), warp hl updates head hl's state
// and writes the tile's e_j and rescale factor, then every thread folds them into its latent
// columns of the 4 heads. Each value of C read from shared memory feeds the 4 heads: the
// kernel is bound by shared-memory bandwidth, and per output the order is the one above.
// part[t][h][k] = (acc[0..R), m, l). NK: latent entries per lane (32·NK >= R). Two blocks a
// multiprocessor (docs/EXPERIMENTS.md#mla-split-blocks-per-sm).
template <int NK, int RX, int DRX>
static __global__ void __launch_bounds__(MLA_THREADS, 2)
split_kernel(const float *__restrict__ mq, const float *__restrict__ qabs, const float *__restrict__ c,
             const float *__restrict__ kpe, int Hm, int dn, int dr_, int R_, sd_dev_pos at, int vec, int settled,
             float *__restrict__ part) {
    // RX, DRX: R and dr known at compile time (0: read at run time) — Kimi's 512 and 64 fold the
    // bounds checks and the shared-memory strides into the instructions.
    const int R = RX ? RX : R_, dr = DRX ? DRX : dr_;
    constexpr int NP = DRX ? (DRX + 31) / 32 : MLA_NP;
    sd_pdl_trigger();
    if (!settled) sd_pdl_wait();
    extern __shared__ __align__(16) float sm[];
    const int t = blockIdx.z, k = blockIdx.x, pos0 = sd_pos_read(at), pos = pos0 + t;
    int nch, cs;
    mla_chunking(pos, &nch, &cs);
    if (k >= nch) return;
    const int a = k * cs, b = min(a + cs, pos + 1), ntile = (b - a + MLA_TILE - 1) / MLA_TILE;
    float *ct = sm, *kt = ct + 2 * MLA_TILE * R, *sc = kt + 2 * MLA_TILE * dr, *es = sc + MLA_HB * MLA_TILE;
    float *fs = es + MLA_HB * MLA_TILE;
    const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5;
    // Settled (mla.h): rows before pos0 are older than the forward, so the first two tiles start
    // streaming before the wait when they hold none of this call's rows; the rest after it.
    int issued = 0; // tiles whose copies are committed
    for (; settled && issued < 2 && issued < ntile; issued++) {
        const int j = a + issued * MLA_TILE, n = min(MLA_TILE, b - j);
        if (j + n > pos0) break;
        split_load(ct + (issued & 1) * MLA_TILE * R, kt + (issued & 1) * MLA_TILE * dr, c, kpe, j, n, R, dr, vec);
    }
    if (settled) sd_pdl_wait();
    if (!issued) {
        split_load(ct, kt, c, kpe, a, min(MLA_TILE, b - a), R, dr, vec);
        issued = 1;
    }

    // Score role: warp w, tile rows RW·w .. RW·w+RW-1, for every head of the block — each value of
    // C loaded from shared memory feeds MLA_HB heads' dots: shared-memory bandwidth bounds this
    // kernel. The serial sums (L here, merge's L) take their shuffles first and only the adds in
    // order (docs/EXPERIMENTS.md#mla-split-heads-share-c).
    constexpr int RW = MLA_TILE / (MLA_THREADS / 32);
    const int r0 = w * RW;
    float qr[MLA_HB][NK], qp[MLA_HB][NP];
#pragma unroll
    for (int hl = 0; hl < MLA_HB; hl++) {
        const int h = blockIdx.y * MLA_HB + hl;
#pragma unroll
        for (int i = 0; i < NK; i++) {
            const int r = lane + 32 * i;
            qr[hl][i] = h < Hm && r < R ? qabs[((size_t)t * Hm + h) * R + r] : 0.0f;
        }
#pragma unroll
        for (int i = 0; i < NP; i++) {
            const int r = lane + 32 * i;
            qp[hl][i] = h < Hm && r < dr ? mq[((size_t)t * Hm + h) * (dn + dr) + dn + r] : 0.0f;
        }
    }
    // State role (warps 0..3, head w; every lane holds the same M, L).
    float M = -INFINITY, L = 0.0f;
    // Accumulator role: thread tid, latent columns tid + 256·i, for every head of the block (one
    // load of C a row feeds MLA_HB heads).
    constexpr int NC = (32 * NK + MLA_THREADS - 1) / MLA_THREADS;
    float acc[MLA_HB][NC];
#pragma unroll
    for (int hl = 0; hl < MLA_HB; hl++)
#pragma unroll
        for (int i = 0; i < NC; i++) acc[hl][i] = 0.0f;
    const float scale = 1.0f / sqrtf((float)(dn + dr));

    for (int it = 0; it < ntile; it++) {
        const int j0 = a + it * MLA_TILE, nj = min(MLA_TILE, b - j0);
        if (it + 1 < ntile) { // the next tile streams in while this one is used
            const int j1 = j0 + MLA_TILE;
            if (issued == it + 1) {
                split_load(ct + ((it + 1) & 1) * MLA_TILE * R, kt + ((it + 1) & 1) * MLA_TILE * dr, c, kpe, j1,
                           min(MLA_TILE, b - j1), R, dr, vec);
                issued++;
            }
            __pipeline_wait_prior(1);
        } else {
            __pipeline_wait_prior(0);
        }
        __syncthreads();
        const float *C = ct + (it & 1) * MLA_TILE * R, *KP = kt + (it & 1) * MLA_TILE * dr;
        float s[RW][MLA_HB];
#pragma unroll
        for (int jj = 0; jj < RW; jj++) {
            const int j = r0 + jj;
            float p[MLA_HB];
#pragma unroll
            for (int hl = 0; hl < MLA_HB; hl++) p[hl] = 0.0f;
            if (j < nj) {
#pragma unroll
                for (int i = 0; i < NK; i++)
                    if (lane + 32 * i < R) {
                        const float cv = C[j * R + lane + 32 * i];
#pragma unroll
                        for (int hl = 0; hl < MLA_HB; hl++) p[hl] = fmaf(qr[hl][i], cv, p[hl]);
                    }
#pragma unroll
                for (int i = 0; i < NP; i++)
                    if (lane + 32 * i < dr) {
                        const float kv = KP[j * dr + lane + 32 * i];
#pragma unroll
                        for (int hl = 0; hl < MLA_HB; hl++) p[hl] = fmaf(qp[hl][i], kv, p[hl]);
                    }
            }
#pragma unroll
            for (int hl = 0; hl < MLA_HB; hl++) s[jj][hl] = sd_warp_sum(p[hl]);
        }
        if (lane == 0)
#pragma unroll
            for (int jj = 0; jj < RW; jj++)
#pragma unroll
                for (int hl = 0; hl < MLA_HB; hl++) sc[hl * MLA_TILE + r0 + jj] = s[jj][hl] * scale;
        __syncthreads();
        if (w < MLA_HB) { // head w's state: M' = max(M, tile max), f = e^(M−M'), l = l·f + e_j (j increasing)
            const bool in = lane < nj;
            const float sj = in ? sc[w * MLA_TILE + lane] : -INFINITY;
            float tm = sj;
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) tm = fmaxf(tm, __shfl_xor_sync(0xffffffffu, tm, o));
            const float Mn = fmaxf(M, tm), f = M == -INFINITY ? 0.0f : expf(M - Mn), e = in ? expf(sj - Mn) : 0.0f;
            if (lane < MLA_TILE) es[lane * MLA_HB + w] = e; // (row, head): a row's MLA_HB factors in one load
            if (lane == 0) fs[w] = f;
            L = L * f;
            float ej[MLA_TILE]; // every lane's e at once, then the adds in row order
#pragma unroll
            for (int j = 0; j < MLA_TILE; j++) ej[j] = __shfl_sync(0xffffffffu, e, j);
#pragma unroll
            for (int j = 0; j < MLA_TILE; j++)
                if (j < nj) L = L + ej[j];
            M = Mn;
        }
        __syncthreads();
        const float4 f4 = *(const float4 *)fs;
#pragma unroll
        for (int i = 0; i < NC; i++) {
            const int r = tid + MLA_THREADS * i;
            if (r >= R) break;
            float v0 = acc[0][i] * f4.x, v1 = acc[1][i] * f4.y, v2 = acc[2][i] * f4.z, v3 = acc[3][i] * f4.w;
#pragma unroll
            for (int j = 0; j < MLA_TILE; j++)
                if (j < nj) {
                    const float cv = C[j * R + r];
                    const float4 e4 = *(const float4 *)(es + j * MLA_HB);
                    v0 = fmaf(e4.x, cv, v0);
                    v1 = fmaf(e4.y, cv, v1);
                    v2 = fmaf(e4.z, cv, v2);
                    v3 = fmaf(e4.w, cv, v3);
                }
            acc[0][i] = v0;
            acc[1][i] = v1;
            acc[2][i] = v2;
            acc[3][i] = v3;
        }
        __syncthreads(); // this tile's buffers, scores and factors are free again
    }
    if (w < MLA_HB && lane == 0 && blockIdx.y * MLA_HB + w < Hm) {
        float *o = part + (((size_t)t * Hm + blockIdx.y * MLA_HB + w) * SD_MLA_SPLIT + k) * (R + 2);
        o[R] = M;
        o[R + 1] = L;
    }
#pragma unroll
    for (int hl = 0; hl < MLA_HB; hl++) {
        const int h = blockIdx.y * MLA_HB + hl;
        if (h >= Hm) break;
        float *out = part + (((size_t)t * Hm + h) * SD_MLA_SPLIT + k) * (R + 2);
#pragma unroll
        for (int i = 0; i < NC; i++)
            if (tid + MLA_THREADS * i < R) out[tid + MLA_THREADS * i] = acc[hl][i];
    }
}

// ---------------------------------------------------------------------------- merge
static size_t merge_smem(int R, int es) { return ((size_t)MLA_VR * R * es + 15) / 16 * 16 + sizeof(float) * ((size_t)R + 32 + 1); }

// Grid (ceil(dv/16), Hm, T).
template <bool BF16>
static __global__ void __launch_bounds__(MLA_THREADS)
merge_kernel(const void *__restrict__ kvb, const float *__restrict__ part, int Hm, int dn, int dv, int R, sd_dev_pos at,
             int vec, float *__restrict__ mo) {
    sd_pdl_trigger();
    constexpr int ES = BF16 ? 2 : 4;
    extern __shared__ __align__(16) unsigned char smb[];
    const int t = blockIdx.z, h = blockIdx.y, v0 = blockIdx.x * MLA_VR, nv = min(MLA_VR, dv - v0);
    const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5;
    unsigned char *wuv = smb;
    float *lat = (float *)(smb + ((size_t)MLA_VR * R * ES + 15) / 16 * 16), *fk = lat + R, *inv = fk + 32;
    // This block's W_UV rows (contiguous in kv_b) into shared memory, before the wait.
    const unsigned char *src = (const unsigned char *)kvb + (size_t)(h * (dn + dv) + dn + v0) * R * ES;
    if (vec) {
        const uint64_t pol = sd_l2_evict_first();
        for (int e = tid; e < nv * R * ES / 16; e += MLA_THREADS) sd_cp_async16_pol(wuv + 16 * e, src + 16 * e, pol);
        __pipeline_commit();
    } else {
        for (int e = tid; e < nv * R * ES; e += MLA_THREADS) wuv[e] = src[e];
    }
    sd_pdl_wait();
    int nch, cs;
    mla_chunking(sd_pos_read(at) + t, &nch, &cs);
    const float *pb = part + ((size_t)t * Hm + h) * SD_MLA_SPLIT * (R + 2);
    // The first of this thread's latent columns: every chunk's value in flight before the chunk
    // factors are known (one memory latency for both). Wider R loops below.
    float v[SD_MLA_SPLIT];
#pragma unroll
    for (int k = 0; k < SD_MLA_SPLIT; k++) v[k] = tid < R ? pb[(size_t)min(k, nch - 1) * (R + 2) + tid] : 0.0f;
    if (w == 0) { // chunk factors and 1/L: lane k holds chunk k
        const float mk = lane < nch ? pb[(size_t)lane * (R + 2) + R] : -INFINITY;
        const float lk = lane < nch ? pb[(size_t)lane * (R + 2) + R + 1] : 0.0f;
        float M = mk;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) M = fmaxf(M, __shfl_xor_sync(0xffffffffu, M, o));
        const float f = lane < nch ? expf(mk - M) : 0.0f, lf = lk * f;
        fk[lane] = f;
        float lfs[SD_MLA_SPLIT]; // every chunk's l·f at once, then the adds in chunk order
#pragma unroll
        for (int k = 0; k < SD_MLA_SPLIT; k++) lfs[k] = __shfl_sync(0xffffffffu, lf, k);
        float Ls = 0.0f;
#pragma unroll
        for (int k = 0; k < SD_MLA_SPLIT; k++)
            if (k < nch) Ls = Ls + lfs[k];
        if (lane == 0) *inv = 1.0f / Ls;
    }
    __syncthreads();
    for (int r = tid; r < R; r += MLA_THREADS) { // every chunk's value loaded before the first is used
        if (r != tid)
#pragma unroll
            for (int k = 0; k < SD_MLA_SPLIT; k++) v[k] = pb[(size_t)min(k, nch - 1) * (R + 2) + r]; // unconditional: all in flight
        float s = 0.0f;
#pragma unroll
        for (int k = 0; k < SD_MLA_SPLIT; k++)
            if (k < nch) s = fmaf(v[k], fk[k], s);
        lat[r] = s * *inv;
    }
    if (vec) __pipeline_wait_prior(0);
    __syncthreads();
    float *out = mo + ((size_t)t * Hm + h) * dv + v0;
    for (int v = w; v < nv; v += MLA_THREADS / 32) {
        const unsigned char *row = wuv + (size_t)v * R * ES;
        float p = 0.0f;
        for (int r = lane; r < R; r += 32) p = fmaf(mla_ldw<BF16>(row, r), lat[r], p);
        p = sd_warp_sum(p);
        if (lane == 0) out[v] = p;
    }
}

// ---------------------------------------------------------------------------- launcher
extern "C" sd_code sd_cuda_mla_attend(float *mq, const sd_mat *kv_b, float *c, float *kpe, int T, int Hm, int dn, int dr,
                                      int dv, int R, sd_dev_pos pos0, bool settled, const sd_mla_write *write, float *qabs,
                                      float *part, float *mo, cudaStream_t stream, sd_status *st) {
    SD_NVTX("sd_cuda_mla_attend");
    if (R < 1 || R > 32 * MLA_NK) return sd_fail(st, SD_ERR_UNSUPPORTED, "cuda mla: kv_lora_rank %d outside 1..%d", R, 32 * MLA_NK);
    if (dr < 0 || dr > 32 * MLA_NP) return sd_fail(st, SD_ERR_UNSUPPORTED, "cuda mla: qk_rope_head_dim %d outside 0..%d", dr, 32 * MLA_NP);
    if (dn < 1 || dn > 512) return sd_fail(st, SD_ERR_UNSUPPORTED, "cuda mla: qk_nope_head_dim %d outside 1..512", dn);
    if (kv_b->dtype != SD_DT_BF16 && kv_b->dtype != SD_DT_F32)
        return sd_fail(st, SD_ERR_UNSUPPORTED, "cuda mla: kv_b dtype %d is not F32 or BF16", (int)kv_b->dtype);
    if (T < 1 || Hm < 1) return SD_OK; // a rank holding no head: no attention, and no reader of the cache rows
    const bool bf16 = kv_b->dtype == SD_DT_BF16;
    const int es = bf16 ? 2 : 4;
    const sd_mla_write none = {0};
    const int fold = write != NULL;
    const dim3 ga(sd_ceil_div(R, MLA_COLS) + fold, Hm, T);
    const bool avec = bf16 && R % 8 == 0 && ((uintptr_t)kv_b->data & 15) == 0;
    void (*absorb)(float *, const void *, int, int, int, int, int, sd_dev_pos, sd_mla_write, int, float *, float *, float *) =
        avec ? absorb_kernel<true, true> : bf16 ? absorb_kernel<true, false> : absorb_kernel<false, false>;
    // Each of the three launches asks for the largest shared-memory carveout, so the blocks of the
    // launch after it (the next MLA step, then o_proj's 64 KB weight copies) can become resident
    // beside its own; only here (docs/EXPERIMENTS.md#mla-carveout).
    SD_CUDA_CHECK(st, sd_prefer_shared((const void *)absorb));
    SD_CUDA_CHECK(st, sd_launch(absorb, ga, MLA_THREADS, 0, stream, mq, kv_b->data, Hm, dn, dr, dv, R, pos0, write ? *write : none,
                                fold, c, kpe, qabs));
    const size_t ss = split_smem(R, dr);
    const int vec = R % 4 == 0 && dr % 4 == 0 && ((uintptr_t)c & 15) == 0 && ((uintptr_t)kpe & 15) == 0;
    const int per = (R + 31) / 32;
    void (*split)(const float *, const float *, const float *, const float *, int, int, int, int, sd_dev_pos, int, int, float *) =
        R == 512 && dr == 64 ? split_kernel<16, 512, 64>
        : per <= 1           ? split_kernel<1, 0, 0>
        : per <= 2           ? split_kernel<2, 0, 0>
        : per <= 4           ? split_kernel<4, 0, 0>
        : per <= 8           ? split_kernel<8, 0, 0>
                             : split_kernel<16, 0, 0>;
    SD_CUDA_CHECK(st, sd_allow_smem((const void *)split, ss));
    SD_CUDA_CHECK(st, sd_prefer_shared((const void *)split));
    SD_CUDA_CHECK(st, sd_launch(split, dim3(SD_MLA_SPLIT, sd_ceil_div(Hm, MLA_HB), T), MLA_THREADS, ss, stream, (const float *)mq,
                                (const float *)qabs, (const float *)c, (const float *)kpe, Hm, dn, dr, R, pos0, vec, settled ? 1 : 0, part));
    const int mvec = ((size_t)R * es) % 16 == 0 && ((uintptr_t)kv_b->data & 15) == 0;
    const dim3 gm(sd_ceil_div(dv, MLA_VR), Hm, T);
    SD_CUDA_CHECK(st, sd_prefer_shared(bf16 ? (const void *)merge_kernel<true> : (const void *)merge_kernel<false>));
    const cudaError_t e = bf16 ? sd_launch(merge_kernel<true>, gm, MLA_THREADS, merge_smem(R, es), stream, kv_b->data, (const float *)part, Hm, dn,
                                   dv, R, pos0, mvec, mo)
                       : sd_launch(merge_kernel<false>, gm, MLA_THREADS, merge_smem(R, es), stream, kv_b->data, (const float *)part, Hm, dn,
                         dv, R, pos0, mvec, mo);
    SD_CUDA_CHECK(st, e);
    SD_LAUNCH_CHECK(st);
    return SD_OK;
}
