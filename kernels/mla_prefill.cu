// mla_prefill.cu — MLA over a long prompt (mla_prefill.h): the cache write, the packing of the
// attention operands to bf16, and the causal flash attention of each head over its own keys and
// values (the non-absorbed form: the keys' and values' per-head parts expanded from the latents).
//
// Flash attention (one block: 64 query rows of one head, 4 warps of 16 rows):
//   the block's queries stay in shared memory; per 64-key tile (keys 0 .. the block's last row's
//   position, zero rows past the end) the head's key and value rows are copied in (cp.async; with
//   KBUF = 2 the next tile is in flight while this one is used, where it fits in shared memory),
//   each warp computes its 16 × 64 scores S = Q Kᵀ with mma.sync.m16n8k16 (bf16 in, f32 out) over
//   the packed width, masks keys past each row's position to -inf, updates its rows' running max m
//   and sum l (online softmax in base 2: p = 2^((s − m)·scale·log2 e)), rescales its accumulators
//   and adds P·V. The P fragment is the score accumulator re-packed to bf16 (the C layout of two
//   n8 tiles is the A layout of one k16 step). A warp holds every value column of its rows (VT n8
//   tiles, 4·VT accumulators a thread), so each score is computed once.
// Fragment layouts: mma.cuh (lane = 4·g + tq here). The fragments come from shared memory by
// ldmatrix.x4 (the V operand by its .trans form: keys run down the tile's rows); shared rows are
// padded by 8 elements so the 8 row addresses of each 8 × 8 matrix fall in distinct banks.
#include <cuda_bf16.h>
#include "common.cuh" // SD_NVTX, sd_allow_smem
#include "mla_prefill.h"
#include "mma.cuh"    // sd_ldsm_x4, sd_ldsm_x4_trans, sd_ldsm_x2_trans, sd_mma_bf16
#include "rows.cuh"   // sd_block_rmsnorm, SD_NORM_THREADS

// ---------------------------------------------------------------------------- cache write
static __global__ void __launch_bounds__(SD_NORM_THREADS)
cache_kernel(const float *kv, int ld_kv, const float *__restrict__ kv_norm, float eps, int rope, double theta, int pos0,
             int Hm, int dn, int dr, int R, float *mq, int ld_mq, float *c, float *kpe) {
    __shared__ float sh[32];
    const int t = blockIdx.x, pos = pos0 + t;
    const float *row = kv + (size_t)t * ld_kv;
    sd_block_rmsnorm(row, kv_norm, R, eps, c + (size_t)pos * R, sh);
    float *kp = kpe + (size_t)pos * dr;
    if (!rope) {
        for (int i = threadIdx.x; i < dr; i += blockDim.x) kp[i] = row[R + i];
        return;
    }
    // Pair i of the keys and of every head's query: (1 + Hm) · dr/2 rotations, one per thread.
    const int pairs = dr / 2, qw = dn + dr;
    for (int idx = threadIdx.x; idx < (Hm + 1) * pairs; idx += blockDim.x) {
        const int who = idx / pairs, i = idx % pairs; // who == Hm: the key
        const double ang = (double)pos * pow(theta, -2.0 * i / dr);
        const float cs = (float)cos(ang), sn = (float)sin(ang);
        const float *src = who == Hm ? row + R : mq + (size_t)t * ld_mq + (size_t)who * qw + dn;
        float *dst = who == Hm ? kp : mq + (size_t)t * ld_mq + (size_t)who * qw + dn;
        const float x0 = src[2 * i], x1 = src[2 * i + 1];
        dst[2 * i] = x0 * cs - x1 * sn;
        dst[2 * i + 1] = x0 * sn + x1 * cs;
    }
    // An odd dr leaves the last element unpaired: it is not rotated (the queries keep theirs in
    // place), and the key's is copied, as the decode path and the CPU do.
    if ((dr & 1) && threadIdx.x == 0) kp[dr - 1] = row[R + dr - 1];
}

extern "C" sd_code sd_cuda_mla_prefill_cache(const float *kv, int ld_kv, const float *kv_norm, float eps, bool rope,
                                             double theta, int pos0, int T, int Hm, int dn, int dr, int R, float *mq,
                                             int ld_mq, float *c, float *kpe, cudaStream_t stream, sd_status *st) {
    SD_NVTX("sd_cuda_mla_prefill_cache");
    if (T < 1) return SD_OK;
    cache_kernel<<<T, SD_NORM_THREADS, 0, stream>>>(kv, ld_kv, kv_norm, eps, rope ? 1 : 0, theta, pos0, Hm, dn, dr, R, mq,
                                                    ld_mq, c, kpe);
    SD_LAUNCH_CHECK(st);
    return SD_OK;
}

// ---------------------------------------------------------------------------- packing
extern "C" int sd_mla_head_width(int dn, int dr) { return (dn + dr + 15) / 16 * 16; }
extern "C" int sd_mla_value_width(int dv) {
    int w = 8;
    while (w < dv) w *= 2;
    return w;
}

static __global__ void pack_queries_kernel(const float *__restrict__ mq, int ld_mq, size_t n, int Hm, int qw, int width,
                                           __nv_bfloat16 *__restrict__ qp) {
    for (size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x; idx < n * width; idx += (size_t)gridDim.x * blockDim.x) {
        const size_t r = idx / width, t = r / Hm, h = r % Hm;
        const int col = (int)(idx % width);
        qp[idx] = __float2bfloat16_rn(col < qw ? mq[t * ld_mq + h * qw + col] : 0.0f);
    }
}

// Row i of kvb is cache row j0 + i; its head h holds [k_nope (dn) | v (dv)] at h·(dn+dv).
static __global__ void pack_kv_kernel(const float *__restrict__ kvb, const float *__restrict__ kpe, size_t j0, size_t n,
                                      int Hm, int dn, int dr, int dv, int width, int vwidth, __nv_bfloat16 *__restrict__ kp,
                                      __nv_bfloat16 *__restrict__ vp) {
    const int both = width + vwidth;
    for (size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x; idx < n * Hm * both; idx += (size_t)gridDim.x * blockDim.x) {
        const size_t r = idx / both, i = r / Hm, h = r % Hm, out = (j0 + i) * Hm + h;
        const int col = (int)(idx % both);
        const float *src = kvb + (i * Hm + h) * (dn + dv);
        if (col < width) {
            const float v = col < dn ? src[col] : col < dn + dr ? kpe[(j0 + i) * dr + col - dn] : 0.0f;
            kp[out * width + col] = __float2bfloat16_rn(v);
        } else {
            const int c = col - width;
            vp[out * vwidth + c] = __float2bfloat16_rn(c < dv ? src[dn + c] : 0.0f);
        }
    }
}

static int grid_for(size_t n) { return (int)(n < (size_t)256 * 4096 ? (n + 255) / 256 : 4096); }

extern "C" sd_code sd_cuda_mla_pack_queries(const float *mq, int ld_mq, int T, int Hm, int dn, int dr, uint16_t *qp,
                                            cudaStream_t stream, sd_status *st) {
    if (T < 1) return SD_OK;
    const int width = sd_mla_head_width(dn, dr);
    const size_t n = (size_t)T * Hm;
    pack_queries_kernel<<<grid_for(n * width), 256, 0, stream>>>(mq, ld_mq, n, Hm, dn + dr, width, (__nv_bfloat16 *)qp);
    SD_LAUNCH_CHECK(st);
    return SD_OK;
}

extern "C" sd_code sd_cuda_mla_pack_kv(const float *kvb, const float *kpe, int j0, int n, int Hm, int dn, int dr, int dv,
                                       uint16_t *kp, uint16_t *vp, cudaStream_t stream, sd_status *st) {
    if (n < 1) return SD_OK;
    const int width = sd_mla_head_width(dn, dr), vwidth = sd_mla_value_width(dv);
    pack_kv_kernel<<<grid_for((size_t)n * Hm * (width + vwidth)), 256, 0, stream>>>(
        kvb, kpe, (size_t)j0, (size_t)n, Hm, dn, dr, dv, width, vwidth, (__nv_bfloat16 *)kp, (__nv_bfloat16 *)vp);
    SD_LAUNCH_CHECK(st);
    return SD_OK;
}

// ---------------------------------------------------------------------------- flash attention
#define FA_BM 64      // query rows a block
#define FA_BN 64      // keys a tile
#define FA_THREADS 128 // 4 warps × 16 rows
#define FA_PAD 8      // elements of padding a shared row

static __device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi); // .x (lo) in the low 16 bits
    return *(const uint32_t *)&v;
}

// A tile of `rows` rows starting at row `first` (rows `stride` elements apart in global memory,
// `width` elements each) into shared memory (row stride lds): 16-byte asynchronous copies; rows at
// or past `limit` are zero.
static __device__ __forceinline__ void load_tile(__nv_bfloat16 *dst, const __nv_bfloat16 *src, size_t stride, int rows,
                                                 int first, int limit, int width, int lds) {
    const int chunks = width / 8;
    for (int idx = threadIdx.x; idx < rows * chunks; idx += FA_THREADS) {
        const int r = idx / chunks, ch = idx % chunks;
        __nv_bfloat16 *d = dst + (size_t)r * lds + ch * 8;
        if (first + r < limit) __pipeline_memcpy_async(d, src + (size_t)(first + r) * stride + ch * 8, 16);
        else *(uint4 *)d = make_uint4(0, 0, 0, 0);
    }
}

template <int VT, int KBUF>
static __global__ void __launch_bounds__(FA_THREADS, 1)
flash_kernel(const __nv_bfloat16 *__restrict__ Q, const __nv_bfloat16 *__restrict__ K, const __nv_bfloat16 *__restrict__ V,
             int T, int Hm, int width, int dv, int pos0, float sl2, float *__restrict__ out) {
    extern __shared__ __align__(16) unsigned char smem_raw[];
    const int lds = width + FA_PAD, ldv = 8 * VT + FA_PAD;
    __nv_bfloat16 *Qs = (__nv_bfloat16 *)smem_raw, *Kbuf = Qs + (size_t)FA_BM * lds; // [64][lds] each, KBUF key tiles
    __nv_bfloat16 *Vbuf = Kbuf + (size_t)KBUF * FA_BN * lds;                          // KBUF value tiles [64][ldv]
    // Every head's block of the rows with the most keys (the last rows) first, so the short ones
    // fill the tail.
    const int h = blockIdx.x, t0 = (gridDim.y - 1 - blockIdx.y) * FA_BM;
    const size_t stride = (size_t)Hm * width, vstride = (size_t)Hm * 8 * VT;
    const __nv_bfloat16 *Qh = Q + (size_t)h * width, *Kh = K + (size_t)h * width, *Vh = V + (size_t)h * 8 * VT;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tq = lane & 3;
    const int last_row = T - 1 < t0 + FA_BM - 1 ? T - 1 : t0 + FA_BM - 1;
    const int n_keys = pos0 + last_row + 1;
    load_tile(Qs, Qh, stride, FA_BM, t0, T, width, lds);
    // This thread's two rows and the last key each may see (rows past the end: key 0 only).
    const int ta = t0 + warp * 16 + g, tb = ta + 8;
    const int lim_a = ta < T ? pos0 + ta : 0, lim_b = tb < T ? pos0 + tb : 0;
    float o[VT][4];
#pragma unroll
    for (int vt = 0; vt < VT; vt++) o[vt][0] = o[vt][1] = o[vt][2] = o[vt][3] = 0.0f;
    float m_a = -INFINITY, m_b = -INFINITY, l_a = 0.0f, l_b = 0.0f;
    // This lane's ldmatrix rows: of the warp's 16 query rows (A), of a pair of 8-key tiles (B of
    // Q·Kᵀ), of 16 keys down a pair of 8-column value tiles (B of P·V, transposed).
    const __nv_bfloat16 *qw = Qs + (size_t)(warp * 16 + lane % 16) * lds + (lane / 16) * 8;
    const int kb_row = lane % 8 + (lane / 16) * 8, kb_col = (lane / 8) % 2 * 8;
    const int vb_row = lane % 16, vb_col = (lane / 16) * 8;
    if (KBUF == 2) { // the first tile in flight; each iteration sends the next one before it waits
        load_tile(Kbuf, Kh, stride, FA_BN, 0, n_keys, width, lds);
        load_tile(Vbuf, Vh, vstride, FA_BN, 0, n_keys, 8 * VT, ldv);
        __pipeline_commit();
    }
    for (int k0 = 0, it = 0; k0 < n_keys; k0 += FA_BN, it++) {
        const int buf = KBUF == 2 ? it & 1 : 0;
        const __nv_bfloat16 *Ks = Kbuf + (size_t)buf * FA_BN * lds, *Vs = Vbuf + (size_t)buf * FA_BN * ldv;
        if (KBUF == 2) {
            if (k0 + FA_BN < n_keys) {
                load_tile(Kbuf + (size_t)(buf ^ 1) * FA_BN * lds, Kh, stride, FA_BN, k0 + FA_BN, n_keys, width, lds);
                load_tile(Vbuf + (size_t)(buf ^ 1) * FA_BN * ldv, Vh, vstride, FA_BN, k0 + FA_BN, n_keys, 8 * VT, ldv);
            }
            __pipeline_commit();
            __pipeline_wait_prior(1); // this tile (and the queries) landed; the next may still fly
        } else {
            load_tile(Kbuf, Kh, stride, FA_BN, k0, n_keys, width, lds);
            load_tile(Vbuf, Vh, vstride, FA_BN, k0, n_keys, 8 * VT, ldv);
            __pipeline_commit();
            __pipeline_wait_prior(0);
        }
        __syncthreads();
        float s[8][4];
#pragma unroll
        for (int nt = 0; nt < 8; nt++) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
        for (int kk = 0; kk < width; kk += 16) {
            uint32_t a[4];
            sd_ldsm_x4(a, qw + kk);
#pragma unroll
            for (int np = 0; np < 4; np++) {
                uint32_t b[4];
                sd_ldsm_x4(b, Ks + (size_t)(np * 16 + kb_row) * lds + kk + kb_col);
                sd_mma_bf16(s[2 * np], a, b[0], b[1]);
                sd_mma_bf16(s[2 * np + 1], a, b[2], b[3]);
            }
        }
        // Mask, then the online softmax of rows a (c0, c1) and b (c2, c3).
        float mx_a = -INFINITY, mx_b = -INFINITY;
#pragma unroll
        for (int nt = 0; nt < 8; nt++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const int key = k0 + nt * 8 + 2 * tq + e;
                if (key > lim_a) s[nt][e] = -INFINITY;
                if (key > lim_b) s[nt][2 + e] = -INFINITY;
                mx_a = fmaxf(mx_a, s[nt][e]);
                mx_b = fmaxf(mx_b, s[nt][2 + e]);
            }
#pragma unroll
        for (int off = 1; off <= 2; off <<= 1) {
            mx_a = fmaxf(mx_a, __shfl_xor_sync(0xffffffffu, mx_a, off));
            mx_b = fmaxf(mx_b, __shfl_xor_sync(0xffffffffu, mx_b, off));
        }
        // Key 0 is in the first tile and visible to every row, so m is finite from the first tile on.
        const float mn_a = fmaxf(m_a, mx_a), mn_b = fmaxf(m_b, mx_b);
        const float ca = exp2f((m_a - mn_a) * sl2), cb = exp2f((m_b - mn_b) * sl2);
        m_a = mn_a;
        m_b = mn_b;
        float ps_a = 0.0f, ps_b = 0.0f;
#pragma unroll
        for (int nt = 0; nt < 8; nt++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                s[nt][e] = exp2f((s[nt][e] - mn_a) * sl2);
                s[nt][2 + e] = exp2f((s[nt][2 + e] - mn_b) * sl2);
                ps_a += s[nt][e];
                ps_b += s[nt][2 + e];
            }
        l_a = l_a * ca + ps_a;
        l_b = l_b * cb + ps_b;
#pragma unroll
        for (int vt = 0; vt < VT; vt++) {
            o[vt][0] *= ca;
            o[vt][1] *= ca;
            o[vt][2] *= cb;
            o[vt][3] *= cb;
        }
        // O += P·V over the tile's 64 keys (four k16 steps).
#pragma unroll
        for (int ks = 0; ks < 4; ks++) {
            const uint32_t a[4] = {pack_bf16(s[2 * ks][0], s[2 * ks][1]), pack_bf16(s[2 * ks][2], s[2 * ks][3]),
                                   pack_bf16(s[2 * ks + 1][0], s[2 * ks + 1][1]),
                                   pack_bf16(s[2 * ks + 1][2], s[2 * ks + 1][3])};
            const __nv_bfloat16 *vr = Vs + (size_t)(ks * 16 + vb_row) * ldv + vb_col;
#pragma unroll
            for (int vp = 0; vp < VT / 2; vp++) {
                uint32_t b[4];
                sd_ldsm_x4_trans(b, vr + vp * 16);
                sd_mma_bf16(o[2 * vp], a, b[0], b[1]);
                sd_mma_bf16(o[2 * vp + 1], a, b[2], b[3]);
            }
            if (VT % 2) { // the last 8 columns alone
                uint32_t b[2];
                sd_ldsm_x2_trans(b, Vs + (size_t)(ks * 16 + vb_row) * ldv + (VT - 1) * 8);
                sd_mma_bf16(o[VT - 1], a, b[0], b[1]);
            }
        }
        __syncthreads(); // every warp is done with this tile before a later iteration refills it
    }
#pragma unroll
    for (int off = 1; off <= 2; off <<= 1) {
        l_a += __shfl_xor_sync(0xffffffffu, l_a, off);
        l_b += __shfl_xor_sync(0xffffffffu, l_b, off);
    }
    const float ia = 1.0f / l_a, ib = 1.0f / l_b;
    float *oa = out + (size_t)ta * Hm * dv + (size_t)h * dv, *ob = out + (size_t)tb * Hm * dv + (size_t)h * dv;
#pragma unroll
    for (int vt = 0; vt < VT; vt++)
#pragma unroll
        for (int e = 0; e < 2; e++) {
            const int col = vt * 8 + 2 * tq + e;
            if (col >= dv) continue;
            if (ta < T) oa[col] = o[vt][e] * ia;
            if (tb < T) ob[col] = o[vt][2 + e] * ib;
        }
}

// The queries' tile and one key and value tile, or two of each where they fit.
#define FA_SMEM_MAX (227 * 1024)
static size_t flash_smem(int width, int vwidth, int kbuf) {
    return ((size_t)(1 + kbuf) * (width + FA_PAD) + (size_t)kbuf * (vwidth + FA_PAD)) * FA_BM * sizeof(__nv_bfloat16);
}

template <int VT, int KBUF>
static sd_code launch_flash_buf(const uint16_t *qp, const uint16_t *kp, const uint16_t *vp, int T, int Hm, int width, int dv,
                                int pos0, float sl2, float *o, cudaStream_t stream, sd_status *st) {
    const size_t smem = flash_smem(width, 8 * VT, KBUF);
    SD_CUDA_CHECK(st, sd_allow_smem((const void *)flash_kernel<VT, KBUF>, smem));
    const dim3 grid((unsigned)Hm, (unsigned)((T + FA_BM - 1) / FA_BM));
    flash_kernel<VT, KBUF><<<grid, FA_THREADS, smem, stream>>>((const __nv_bfloat16 *)qp, (const __nv_bfloat16 *)kp,
                                                               (const __nv_bfloat16 *)vp, T, Hm, width, dv, pos0, sl2, o);
    SD_LAUNCH_CHECK(st);
    return SD_OK;
}
template <int VT>
static sd_code launch_flash(const uint16_t *qp, const uint16_t *kp, const uint16_t *vp, int T, int Hm, int width, int dv,
                            int pos0, float sl2, float *o, cudaStream_t stream, sd_status *st) {
    if (flash_smem(width, 8 * VT, 2) <= FA_SMEM_MAX)
        return launch_flash_buf<VT, 2>(qp, kp, vp, T, Hm, width, dv, pos0, sl2, o, stream, st);
    return launch_flash_buf<VT, 1>(qp, kp, vp, T, Hm, width, dv, pos0, sl2, o, stream, st);
}

extern "C" sd_code sd_cuda_mla_flash(const uint16_t *qp, const uint16_t *kp, const uint16_t *vp, int T, int Hm, int dn, int dr,
                                     int dv, int pos0, float scale, float *o, cudaStream_t stream, sd_status *st) {
    SD_NVTX("sd_cuda_mla_flash");
    if (T < 1) return SD_OK;
    const int width = sd_mla_head_width(dn, dr), vwidth = sd_mla_value_width(dv);
    if (dv < 1 || vwidth > 256 || flash_smem(width, vwidth, 1) > FA_SMEM_MAX)
        return sd_fail(st, SD_ERR_UNSUPPORTED,
                       "cuda mla flash: head dims %d + %d, value dim %d (needs the value dim <= 256 and the query, one key "
                       "and one value tile of 64 rows in 227 KB)", dn, dr, dv);
    const float sl2 = scale * 1.4426950408889634f; // scores in base 2
    switch (vwidth) {
    case 8: return launch_flash<1>(qp, kp, vp, T, Hm, width, dv, pos0, sl2, o, stream, st);
    case 16: return launch_flash<2>(qp, kp, vp, T, Hm, width, dv, pos0, sl2, o, stream, st);
    case 32: return launch_flash<4>(qp, kp, vp, T, Hm, width, dv, pos0, sl2, o, stream, st);
    case 64: return launch_flash<8>(qp, kp, vp, T, Hm, width, dv, pos0, sl2, o, stream, st);
    case 128: return launch_flash<16>(qp, kp, vp, T, Hm, width, dv, pos0, sl2, o, stream, st);
    default: return launch_flash<32>(qp, kp, vp, T, Hm, width, dv, pos0, sl2, o, stream, st);
    }
}
