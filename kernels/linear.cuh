// linear.cuh — the row dots every weight-streaming kernel is built on (linear.cu, moe_route.cu,
// moe_experts.cu).
//
// Order per output element (the contract behind verify ≡ decode and eager ≡ device-table): a
// row is cut into 16-byte chunks (8 bf16 or 4 f32 weights); lane l takes chunks l, l+32, l+64,
// ... in increasing order and folds each element into its partial with one fused multiply-add
// (fmaf, element order); the 32 lane partials are then summed by sd_warp_sum's fixed tree. That
// order depends on the row length only — never on how many tokens share the launch, which other
// rows or experts share the warp, or whether the loads were 16-byte vectors (fast path) or
// scalars (any alignment). It differs from the CPU's order and rounding (fused multiply-add:
// one rounding per element instead of two); both are within the tolerances of MODEL.md.
//
// Memory-bound design: the weight chunks of up to U iterations are loaded before the first is
// used (U·16 bytes in flight per lane), each weight chunk is read once and applied to every token
// of the call; the fp32 inputs come from L1.
#pragma once
#include <cuda/ptx> // cp_async_bulk, mbarrier_*
#include "common.cuh"

#define SD_LIN_WARPS 8 // warps per block of the Linear kernels

// Start streaming [p, p + bytes) from device memory into L2 without waiting (Hopper's bulk
// prefetch; p 16-byte aligned, bytes a multiple of 16). A warp that prefetches the rows it is
// about to read has all of them in flight at once, whatever its registers hold; the loads that
// follow hit L2. Pieces of at most 32 KiB.
__device__ __forceinline__ void sd_prefetch_l2(const void *p, size_t bytes) {
    if (((uintptr_t)p & 15) || (bytes & 15)) return;
    for (size_t o = 0; o < bytes; o += 32768) {
        const uint32_t n = (uint32_t)(bytes - o < 32768 ? bytes - o : 32768);
        asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"((const char *)p + o), "r"(n) : "memory");
    }
}

// Weight rows into shared memory by Hopper's bulk copy (cp.async.bulk: the copy engine moves
// them and no register holds them, so a block can keep a stream of tiles in flight), each
// stage's completion counted on its own mbarrier. Thread 0 initialises the barriers (a block
// barrier must follow before any thread waits), then per use of a stage: sd_bulk_expect(bar,
// total bytes) and one sd_bulk_copy per contiguous range (16-byte aligned, sizes multiples of
// 16); every thread waits with the use's parity (use u of a stage: u & 1).
__device__ __forceinline__ void sd_bulk_init(uint64_t *bar) {
    cuda::ptx::mbarrier_init(bar, 1);
    cuda::ptx::fence_mbarrier_init(cuda::ptx::sem_release, cuda::ptx::scope_cluster);
}
__device__ __forceinline__ void sd_bulk_expect(uint64_t *bar, uint32_t bytes) {
    cuda::ptx::mbarrier_arrive_expect_tx(cuda::ptx::sem_release, cuda::ptx::scope_cta, cuda::ptx::space_shared, bar, bytes);
}
__device__ __forceinline__ void sd_bulk_copy(void *dst, const void *src, uint32_t bytes, uint64_t *bar) {
    cuda::ptx::cp_async_bulk(cuda::ptx::space_cluster, cuda::ptx::space_global, dst, src, bytes, bar);
}
__device__ __forceinline__ void sd_bulk_wait(uint64_t *bar, uint32_t parity) {
    while (!cuda::ptx::mbarrier_try_wait_parity(bar, parity)) {
    }
}

// sd_bulk_copy under an L2 policy (common.cuh's sd_l2_evict_first; 0: none).
__device__ __forceinline__ void sd_bulk_copy_pol(void *dst, const void *src, uint32_t bytes, uint64_t *bar, uint64_t pol) {
    if (!pol) return sd_bulk_copy(dst, src, bytes, bar);
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], %4;"
                 ::"r"((uint32_t)__cvta_generic_to_shared(dst)), "l"(src), "r"(bytes),
                 "r"((uint32_t)__cvta_generic_to_shared(bar)), "l"(pol)
                 : "memory");
}

// Elements per 16-byte chunk.
template <bool BF16> struct sd_lin_vec { static constexpr int n = BF16 ? 8 : 4; };

// acc += w[e]·x[e] for the chunk's VEC elements in order (x 16-byte aligned).
template <int VEC>
__device__ __forceinline__ float sd_lin_fold(float acc, const float *wf, const float *x) {
#pragma unroll
    for (int e = 0; e < VEC; e += 4) {
        const float4 f = *(const float4 *)(x + e);
        acc = fmaf(wf[e], f.x, acc);
        acc = fmaf(wf[e + 1], f.y, acc);
        acc = fmaf(wf[e + 2], f.z, acc);
        acc = fmaf(wf[e + 3], f.w, acc);
    }
    return acc;
}

// Where token t's input row starts: x + t·ld (a Linear), or x + idx[t]·ld (gathered tokens).
struct sd_lin_rows {
    const float *x;
    size_t ld;
    __device__ __forceinline__ const float *row(int t) const { return x + (size_t)t * ld; }
};
template <int TMAX> struct sd_lin_gather {
    const float *x;
    size_t ld;
    int idx[TMAX];
    __device__ __forceinline__ const float *row(int t) const { return x + (size_t)idx[t] * ld; }
};

// Fast path: NW weight rows (16-byte aligned, cols a multiple of VEC) against the same n <= TMAX
// input rows (16-byte aligned). acc[r][t] += row r · x_t, lane partials (caller folds them).
// SH: the rows are in shared memory (plain loads instead of the read-only global path).
// PIPE: the next iteration's weight chunks are loaded before this iteration's are used, so a
// many-token warp (whose folds take longer than a load) keeps its loads in flight while it folds.
template <int TMAX, int NW, bool BF16, int U, class X, bool SH = false, bool PIPE = false>
__device__ __forceinline__ void sd_lin_dot_fast(const char *const *w, int cols, const X &xs, int n,
                                                float (*acc)[TMAX], uint64_t pol = 0) {
    constexpr int VEC = sd_lin_vec<BF16>::n;
    const int lane = threadIdx.x & 31, nchunk = cols / VEC;
    uint4 wv[NW][U], nx[NW][U];
    auto load = [&](uint4 (*dst)[U], int c0) {
#pragma unroll
        for (int u = 0; u < U; u++)
#pragma unroll
            for (int r = 0; r < NW; r++)
                if (c0 + 32 * u < nchunk)
                    dst[r][u] = SH ? ((const uint4 *)w[r])[c0 + 32 * u] : sd_ldg_pol((const uint4 *)w[r] + c0 + 32 * u, pol);
    };
    if (PIPE) load(nx, lane);
    for (int c0 = lane; c0 < nchunk; c0 += 32 * U) {
        if (PIPE) {
#pragma unroll
            for (int u = 0; u < U; u++)
#pragma unroll
                for (int r = 0; r < NW; r++) wv[r][u] = nx[r][u];
            load(nx, c0 + 32 * U);
        } else {
            load(wv, c0);
        }
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int c = c0 + 32 * u;
            if (c >= nchunk) break;
            float wf[NW][VEC];
#pragma unroll
            for (int r = 0; r < NW; r++) sd_widen16<BF16>(wv[r][u], wf[r]);
#pragma unroll
            for (int t = 0; t < TMAX; t++) {
                if (t >= n) break;
                const float *xt = xs.row(t) + (size_t)c * VEC;
#pragma unroll
                for (int r = 0; r < NW; r++) acc[r][t] = sd_lin_fold<VEC>(acc[r][t], wf[r], xt);
            }
        }
    }
}

// Any alignment, any cols: the same chunks, elements and order with scalar loads (a short last
// chunk adds only its real elements).
template <int TMAX, bool BF16, class X>
__device__ __forceinline__ void sd_lin_dot_any(const void *w, int cols, const X &xs, int n, float *acc) {
    constexpr int VEC = sd_lin_vec<BF16>::n;
    const int lane = threadIdx.x & 31, nchunk = (cols + VEC - 1) / VEC;
    for (int c = lane; c < nchunk; c += 32) {
        const int i0 = c * VEC, m = cols - i0 < VEC ? cols - i0 : VEC;
        float wf[VEC];
#pragma unroll
        for (int e = 0; e < VEC; e++)
            wf[e] = e < m ? (BF16 ? sd_dev_bf16(((const uint16_t *)w)[i0 + e]) : ((const float *)w)[i0 + e]) : 0.0f;
#pragma unroll
        for (int t = 0; t < TMAX; t++) {
            if (t >= n) break;
            const float *xt = xs.row(t) + i0;
#pragma unroll
            for (int e = 0; e < VEC; e++)
                if (e < m) acc[t] = fmaf(wf[e], xt[e], acc[t]);
        }
    }
}

// Is a weight row start usable by the fast path (16-byte aligned rows, whole chunks)?
template <bool BF16>
__device__ __forceinline__ bool sd_lin_fast_w(const void *w, int cols) {
    return ((uintptr_t)w & 15) == 0 && cols % sd_lin_vec<BF16>::n == 0;
}

// Chunks per lane in flight per iteration, for one weight row and for two sharing x: 4 keeps four
// blocks a multiprocessor resident at one token, and more chunks cost more residency than they
// add bytes in flight (docs/EXPERIMENTS.md#linear-unroll); from 4 tokens up the Linear kernel
// also bulk-prefetches into L2.
template <int TMAX> struct sd_lin_unroll {
    static constexpr int one = TMAX <= 9 ? 4 : 2;
    static constexpr int two = TMAX <= 9 ? 2 : 1;
};

// One or two weight rows (dtype known at run time, warp-uniform) against n input rows: the
// entry point the kernels use. w1 may be NULL (one row). xfast: every input row 16-byte aligned.
// pol: the weight loads' L2 policy (common.cuh's sd_l2_evict_first; 0: none). PIPE: as
// sd_lin_dot_fast's, on its fast paths.
template <int TMAX, class X, int U1 = sd_lin_unroll<TMAX>::one, int U2 = sd_lin_unroll<TMAX>::two, bool PIPE = false>
__device__ __forceinline__ void sd_lin_dot(const void *w0, bool bf0, const void *w1, bool bf1, int cols, const X &xs,
                                           int n, bool xfast, float (*acc)[TMAX], uint64_t pol = 0) {
    if (w1 && bf0 == bf1 && xfast) {
        const char *w[2] = {(const char *)w0, (const char *)w1};
        if (bf0 && sd_lin_fast_w<true>(w0, cols) && sd_lin_fast_w<true>(w1, cols))
            return sd_lin_dot_fast<TMAX, 2, true, U2, X, false, PIPE>(w, cols, xs, n, acc, pol);
        if (!bf0 && sd_lin_fast_w<false>(w0, cols) && sd_lin_fast_w<false>(w1, cols))
            return sd_lin_dot_fast<TMAX, 2, false, U2, X, false, PIPE>(w, cols, xs, n, acc, pol);
    }
    const void *ws[2] = {w0, w1};
    const bool bs[2] = {bf0, bf1};
#pragma unroll
    for (int r = 0; r < 2; r++) {
        if (r == 1 && !w1) break;
        const char *w[1] = {(const char *)ws[r]};
        if (bs[r]) {
            if (xfast && sd_lin_fast_w<true>(ws[r], cols)) sd_lin_dot_fast<TMAX, 1, true, U1, X, false, PIPE>(w, cols, xs, n, acc + r, pol);
            else sd_lin_dot_any<TMAX, true>(ws[r], cols, xs, n, acc[r]);
        } else {
            if (xfast && sd_lin_fast_w<false>(ws[r], cols)) sd_lin_dot_fast<TMAX, 1, false, U1, X, false, PIPE>(w, cols, xs, n, acc + r, pol);
            else sd_lin_dot_any<TMAX, false>(ws[r], cols, xs, n, acc[r]);
        }
    }
}

// Pairs: dot i is weight row w[i] (its own matrix) · its own input row x[i], for i < n <= NP,
// all rows of one dtype; loads of all NP rows in flight together. Same per-dot order as above.
template <int NP, bool BF16, int U>
__device__ __forceinline__ void sd_lin_pairs_fast(const char *const *w, const float *const *x, int n, int cols,
                                                  float *acc) {
    constexpr int VEC = sd_lin_vec<BF16>::n;
    const int lane = threadIdx.x & 31, nchunk = cols / VEC;
    for (int c0 = lane; c0 < nchunk; c0 += 32 * U) {
        uint4 wv[NP][U];
#pragma unroll
        for (int u = 0; u < U; u++)
#pragma unroll
            for (int i = 0; i < NP; i++)
                if (i < n && c0 + 32 * u < nchunk) wv[i][u] = __ldg((const uint4 *)w[i] + c0 + 32 * u);
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int c = c0 + 32 * u;
            if (c >= nchunk) break;
#pragma unroll
            for (int i = 0; i < NP; i++) {
                if (i >= n) break;
                float wf[VEC];
                sd_widen16<BF16>(wv[i][u], wf);
                acc[i] = sd_lin_fold<VEC>(acc[i], wf, x[i] + (size_t)c * VEC);
            }
        }
    }
}

// One full dot of a single input row, folded (every lane returns the value). Whole warp.
__device__ __forceinline__ float sd_lin_warp_dot(const void *w, bool bf16, int cols, const float *x) {
    float acc[1][1] = {{0.0f}};
    const sd_lin_rows xs = {x, 0};
    sd_lin_dot<1>(w, bf16, nullptr, false, cols, xs, 1, ((uintptr_t)x & 15) == 0, acc);
    return sd_warp_sum(acc[0][0]);
}
