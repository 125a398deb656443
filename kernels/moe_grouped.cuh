// moe_grouped.cuh — the grouped expert GEMM of moe_grouped.h as a template over its tiling, so the
// product's shape (moe_grouped.cu) and the lab's alternatives (bench/grouped_lab.cu) are one code.
//
// A block computes one output tile: BM grouped rows (one expert's) × BN output columns, over K in
// steps of BK. The rows' activations and the expert's weight rows stream through shared memory in
// a ring of STAGES buffers (cp.async, 16 bytes a copy, zero-filled past the ends), and WARPS_M ×
// WARPS_N warps each hold a corner of the tile as 16 × 8 accumulators of mma.sync.m16n8k16 (bf16
// in, f32 accumulate), their operands loaded with ldmatrix.x4 (WMMA's loads compile to plain
// shared loads: docs/EXPERIMENTS.md#prefill-grouped-tiles). A warp skips the fragments whose 16
// rows all lie past the tile's rows (an expert's last tile is partial), so a tall tile costs
// tensor work only for the rows it has; only the expert's own rows are stored, from the
// registers. The launch is one-dimensional: block b is
// output tile b % nN of row tile b / nN, so the output tiles of one row tile run side by side and
// read its activations from L2, and the row tiles of one expert follow each other and share its
// weights there. Blocks past the device's tile count leave at once.
//
// Every output element is the same chain of 16-wide tensor-core steps over k ascending whatever
// the tiling, so the shapes differ in speed, not in the bits (the lab checks it).
#pragma once
#include <cuda_bf16.h>
#include "moe_grouped.h" // sd_moe_grouped_op, sd_cuda_expert
#include "mma.cuh"        // sd_ldsm_x4, sd_mma_bf16

// One thread: the experts in order, so the list (and each row's tile) never depends on timing.
template <int BM>
__global__ void sd_grouped_tiles_kernel(const int *__restrict__ counts, int E, int *__restrict__ offsets,
                                        int *__restrict__ tiles, int *__restrict__ n_tiles) {
    if (threadIdx.x != 0) return;
    int off = 0, t = 0;
    for (int e = 0; e < E; e++) {
        const int c = counts[e];
        offsets[e] = off;
        for (int r = 0; r < c; r += BM, t++) {
            tiles[3 * t] = e;
            tiles[3 * t + 1] = off + r;
            tiles[3 * t + 2] = c - r < BM ? c - r : BM;
        }
        off += c;
    }
    *n_tiles = t;
}

namespace sd_grouped {

// 16 bytes global -> shared, or 16 zero bytes when !valid (the source is then not read).
__device__ __forceinline__ void copy16(void *dst, const void *src, bool valid) {
    const unsigned d = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(d), "l"(src), "r"(valid ? 16 : 0) : "memory");
}
__device__ __forceinline__ void copy_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void copy_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory"); }

// Weight row n of expert x for op (UP: gate rows, then up rows).
__device__ __forceinline__ const __nv_bfloat16 *weight_row(int op, const sd_cuda_expert &x, int n, int Ie, int K) {
    const void *w = op == SD_MOE_GROUPED_DOWN ? x.down : n < Ie ? x.gate : x.up;
    const int r = op == SD_MOE_GROUPED_UP && n >= Ie ? n - Ie : n;
    return (const __nv_bfloat16 *)w + (size_t)r * K;
}

} // namespace sd_grouped

template <int BM, int BN, int BK, int WARPS_M, int WARPS_N, int STAGES>
struct sd_grouped_shape {
    static constexpr int LDS = BK + 8; // shared row pitch in bf16: 16 bytes past BK, so a fragment's 8 rows fall in distinct banks
    static constexpr int THREADS = WARPS_M * WARPS_N * 32;
    static constexpr int STAGE_ELEMS = (BM + BN) * LDS;
    static constexpr size_t RING_BYTES = (size_t)STAGES * STAGE_ELEMS * 2; // the kernel's dynamic shared memory
    static_assert(BM % (WARPS_M * 16) == 0 && BN % (WARPS_N * 16) == 0, "whole fragments a warp, n tiles in pairs");
    static_assert(BK % 16 == 0 && STAGES >= 2, "16-wide k steps, a ring of two or more");
};

// Stage s of the ring: the tile's BM activation rows, then its BN weight rows, columns k0 .. k0+BK.
template <int BM, int BN, int BK, int THREADS, int LDS>
__device__ __forceinline__ void sd_grouped_load_stage(__nv_bfloat16 *s, const __nv_bfloat16 *__restrict__ x, int row0,
                                                      int rows, const __nv_bfloat16 *const *wrow, int k0, int K) {
    constexpr int CH = BK / 8; // 16-byte chunks a row
    for (int i = threadIdx.x; i < (BM + BN) * CH; i += THREADS) {
        const int r = i / CH, k = k0 + (i % CH) * 8;
        const bool in_k = k < K;
        const __nv_bfloat16 *src;
        bool valid;
        if (r < BM) {
            valid = in_k && r < rows;
            src = x + (size_t)(row0 + (valid ? r : 0)) * K + (in_k ? k : 0);
        } else {
            const __nv_bfloat16 *w = wrow[r - BM];
            valid = in_k && w;
            src = valid ? w + k : x;
        }
        sd_grouped::copy16(s + r * LDS + (i % CH) * 8, src, valid);
    }
}


template <int BM, int BN, int BK, int WARPS_M, int WARPS_N, int STAGES>
__global__ void __launch_bounds__(WARPS_M *WARPS_N * 32)
sd_grouped_gemm_kernel(int op, const sd_cuda_expert *__restrict__ table, const int *__restrict__ tiles,
                       const int *__restrict__ n_tiles, const __nv_bfloat16 *__restrict__ x, int N, int K, int Ie,
                       float *__restrict__ y) {
    using S = sd_grouped_shape<BM, BN, BK, WARPS_M, WARPS_N, STAGES>;
    constexpr int LDS = S::LDS, THREADS = S::THREADS, FM = BM / WARPS_M / 16, FN = BN / WARPS_N / 8;
    static_assert(FN % 2 == 0, "n tiles in pairs (one ldmatrix.x4 each)");
    extern __shared__ __align__(128) unsigned char sd_grouped_smem[];
    __nv_bfloat16 *ring = (__nv_bfloat16 *)sd_grouped_smem;
    __shared__ const __nv_bfloat16 *wrow[BN];
    const int nN = (N + BN - 1) / BN, tile = blockIdx.x / nN, n0 = (blockIdx.x % nN) * BN;
    if (tile >= *n_tiles) return;
    const int e = tiles[3 * tile], row0 = tiles[3 * tile + 1], rows = tiles[3 * tile + 2];
    const sd_cuda_expert ex = table[e];
    for (int i = threadIdx.x; i < BN; i += THREADS)
        wrow[i] = n0 + i < N ? sd_grouped::weight_row(op, ex, n0 + i, Ie, K) : nullptr;
    __syncthreads();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, wm = warp / WARPS_N, wn = warp % WARPS_N;
    const int row_base = wm * FM * 16, col_base = wn * FN * 8;
    float acc[FM][FN][4];
#pragma unroll
    for (int i = 0; i < FM; i++)
#pragma unroll
        for (int j = 0; j < FN; j++) acc[i][j][0] = acc[i][j][1] = acc[i][j][2] = acc[i][j][3] = 0.0f;
    const int nk = (K + BK - 1) / BK;
#pragma unroll
    for (int s = 0; s < STAGES - 1; s++) {
        if (s < nk) sd_grouped_load_stage<BM, BN, BK, THREADS, LDS>(ring + s * S::STAGE_ELEMS, x, row0, rows, wrow, s * BK, K);
        sd_grouped::copy_commit();
    }
    // This lane's ldmatrix rows: A (16 rows × 16 k) and B pairs (16 columns × 16 k).
    const int a_row = lane % 16, a_k = (lane / 16) * 8, b_row = (lane % 8) + (lane / 16) * 8, b_k = ((lane / 8) % 2) * 8;
    for (int kt = 0; kt < nk; kt++) {
        sd_grouped::copy_wait<STAGES - 2>();
        __syncthreads();
        const int next = kt + STAGES - 1;
        if (next < nk)
            sd_grouped_load_stage<BM, BN, BK, THREADS, LDS>(ring + (next % STAGES) * S::STAGE_ELEMS, x, row0, rows, wrow,
                                                            next * BK, K);
        sd_grouped::copy_commit();
        const __nv_bfloat16 *sa = ring + (kt % STAGES) * S::STAGE_ELEMS, *sb = sa + BM * LDS;
#pragma unroll
        for (int kk = 0; kk < BK; kk += 16) {
            uint32_t b[FN / 2][4];
#pragma unroll
            for (int jp = 0; jp < FN / 2; jp++) sd_ldsm_x4(b[jp], sb + (col_base + jp * 16 + b_row) * LDS + kk + b_k);
#pragma unroll
            for (int i = 0; i < FM; i++) {
                if (row_base + i * 16 >= rows) continue;
                uint32_t a[4];
                sd_ldsm_x4(a, sa + (row_base + i * 16 + a_row) * LDS + kk + a_k);
#pragma unroll
                for (int jp = 0; jp < FN / 2; jp++) {
                    sd_mma_bf16(acc[i][2 * jp], a, b[jp][0], b[jp][1]);
                    sd_mma_bf16(acc[i][2 * jp + 1], a, b[jp][2], b[jp][3]);
                }
            }
        }
    }
    sd_grouped::copy_wait<0>();
    const int g = lane / 4, t = lane % 4;
#pragma unroll
    for (int i = 0; i < FM; i++)
#pragma unroll
        for (int j = 0; j < FN; j++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int r = row_base + i * 16 + g + 8 * h, c = n0 + col_base + j * 8 + 2 * t;
                if (r >= rows) continue;
                float *o = y + (size_t)(row0 + r) * N + c;
                if (c < N) o[0] = acc[i][j][2 * h];
                if (c + 1 < N) o[1] = acc[i][j][2 * h + 1];
            }
}

// The launch of one shape: max_tiles · ceil(N / BN) blocks.
template <int BM, int BN, int BK, int WARPS_M, int WARPS_N, int STAGES>
cudaError_t sd_grouped_gemm_launch(int op, const sd_cuda_expert *table, const int *tiles, const int *n_tiles, int max_tiles,
                                   const __nv_bfloat16 *x, int N, int K, int Ie, float *y, cudaStream_t stream) {
    using S = sd_grouped_shape<BM, BN, BK, WARPS_M, WARPS_N, STAGES>;
    auto kernel = sd_grouped_gemm_kernel<BM, BN, BK, WARPS_M, WARPS_N, STAGES>;
    // Per device, so at every launch (two a MoE layer: a driver call is nothing beside the GEMM).
    const cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)S::RING_BYTES);
    if (e != cudaSuccess) return e;
    const long long blocks = (long long)max_tiles * ((N + BN - 1) / BN);
    if (blocks < 1) return cudaSuccess;
    kernel<<<(unsigned)blocks, S::THREADS, S::RING_BYTES, stream>>>(op, table, tiles, n_tiles, x, N, K, Ie, y);
    return cudaGetLastError();
}
