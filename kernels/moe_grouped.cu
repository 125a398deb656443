// moe_grouped.cu — the grouped expert GEMMs of moe_grouped.h.
//
// A block computes one output tile: BM grouped rows (one expert's) × BN output columns, over K in
// steps of BK. The rows' activations and the expert's weight rows stream through shared memory in
// a ring of STAGES buffers (cp.async, 16 bytes a copy, zero-filled past the ends), and WARPS_M ×
// WARPS_N warps each hold a corner of the tile as FRAG_M × FRAG_N WMMA accumulators. The tile goes back through shared
// memory so only the expert's own rows are written. The launch is one-dimensional: block b is
// output tile b % nN of row tile b / nN, so the output tiles of one row tile run side by side and
// read its activations from L2, and the row tiles of one expert follow each other and share its
// weights there. Blocks past the device's tile count leave at once.
#include <cuda_bf16.h>
#include <mma.h>
#include "common.cuh" // SD_NVTX, sd_ceil_div, SD_LAUNCH_CHECK
#include "moe_grouped.h"

#define BM SD_MOE_GROUPED_BM
#define BN 128
#define BK 32
#define LDS (BK + 8)  // shared row pitch in bf16 elements: 80 bytes, so the 8 rows of a fragment load fall in distinct banks
#define LDC (BN + 4)  // the accumulator tile's row pitch in floats
#define STAGES 3
#define WARPS_M 2 // warps along the rows; each warp holds FRAG_M × FRAG_N accumulators of 16 × 16
#define WARPS_N 2
#define FRAG_M (BM / WARPS_M / 16)
#define FRAG_N (BN / WARPS_N / 16)
#define THREADS (WARPS_M * WARPS_N * 32)
#define STAGE_ELEMS ((BM + BN) * LDS)

static_assert(BM % (WARPS_M * 16) == 0 && BN % (WARPS_N * 16) == 0, "whole fragments a warp");
static_assert((size_t)STAGES * STAGE_ELEMS * 2 >= (size_t)BM * LDC * 4, "the accumulator tile reuses the stage ring");

// ---------------------------------------------------------------------------- tile list
// One thread: the experts in order, so the list (and each row's tile) never depends on timing.
static __global__ void tiles_kernel(const int *__restrict__ counts, int E, int *__restrict__ offsets, int *__restrict__ tiles,
                                    int *__restrict__ n_tiles) {
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

extern "C" sd_code sd_cuda_moe_grouped_tiles(const int *counts, int E, int *offsets, int *tiles, int *n_tiles,
                                             cudaStream_t stream, sd_status *st) {
    tiles_kernel<<<1, 32, 0, stream>>>(counts, E, offsets, tiles, n_tiles);
    SD_LAUNCH_CHECK(st);
    return SD_OK;
}

// ---------------------------------------------------------------------------- GEMM
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

// Stage s of the ring: the tile's BM activation rows, then its BN weight rows, columns k0 .. k0+BK.
__device__ __forceinline__ void load_stage(__nv_bfloat16 *s, const __nv_bfloat16 *__restrict__ x, int row0, int rows,
                                           const __nv_bfloat16 *const *wrow, int k0, int K) {
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
        copy16(s + r * LDS + (i % CH) * 8, src, valid);
    }
}

static __global__ void __launch_bounds__(THREADS)
grouped_kernel(int op, const sd_cuda_expert *__restrict__ table, const int *__restrict__ tiles, const int *__restrict__ n_tiles,
               const __nv_bfloat16 *__restrict__ x, int N, int K, int Ie, float *__restrict__ y) {
    using namespace nvcuda;
    __shared__ __align__(128) __nv_bfloat16 ring[STAGES * STAGE_ELEMS];
    __shared__ const __nv_bfloat16 *wrow[BN];
    const int nN = (N + BN - 1) / BN, tile = blockIdx.x / nN, n0 = (blockIdx.x % nN) * BN;
    if (tile >= *n_tiles) return; // the whole block: nothing below has synchronised yet
    const int e = tiles[3 * tile], row0 = tiles[3 * tile + 1], rows = tiles[3 * tile + 2];
    const sd_cuda_expert ex = table[e];
    for (int i = threadIdx.x; i < BN; i += THREADS) wrow[i] = n0 + i < N ? weight_row(op, ex, n0 + i, Ie, K) : nullptr;
    __syncthreads();

    const int warp = threadIdx.x >> 5, wm = warp / WARPS_N, wn = warp % WARPS_N; // each FRAG_M·16 rows × FRAG_N·16 columns
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[FRAG_M][FRAG_N];
#pragma unroll
    for (int i = 0; i < FRAG_M; i++)
#pragma unroll
        for (int j = 0; j < FRAG_N; j++) wmma::fill_fragment(acc[i][j], 0.0f);

    const int nk = (K + BK - 1) / BK;
#pragma unroll
    for (int s = 0; s < STAGES - 1; s++) {
        if (s < nk) load_stage(ring + s * STAGE_ELEMS, x, row0, rows, wrow, s * BK, K);
        copy_commit();
    }
    for (int kt = 0; kt < nk; kt++) {
        copy_wait<STAGES - 2>(); // stage kt has landed (this thread's copies) ...
        __syncthreads();         // ... everyone's; and everyone is done with the stage refilled below
        const int next = kt + STAGES - 1;
        if (next < nk) load_stage(ring + (next % STAGES) * STAGE_ELEMS, x, row0, rows, wrow, next * BK, K);
        copy_commit();
        const __nv_bfloat16 *sa = ring + (kt % STAGES) * STAGE_ELEMS, *sb = sa + BM * LDS;
#pragma unroll
        for (int kk = 0; kk < BK; kk += 16) {
            wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> a[FRAG_M];
            wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> b[FRAG_N];
#pragma unroll
            for (int i = 0; i < FRAG_M; i++) wmma::load_matrix_sync(a[i], sa + ((wm * FRAG_M + i) * 16) * LDS + kk, LDS);
#pragma unroll
            for (int j = 0; j < FRAG_N; j++) wmma::load_matrix_sync(b[j], sb + ((wn * FRAG_N + j) * 16) * LDS + kk, LDS);
#pragma unroll
            for (int i = 0; i < FRAG_M; i++)
#pragma unroll
                for (int j = 0; j < FRAG_N; j++) wmma::mma_sync(acc[i][j], a[i], b[j], acc[i][j]);
        }
    }
    copy_wait<0>();
    __syncthreads(); // the ring is free: the accumulators go through it
    float *ct = (float *)ring;
#pragma unroll
    for (int i = 0; i < FRAG_M; i++)
#pragma unroll
        for (int j = 0; j < FRAG_N; j++)
            wmma::store_matrix_sync(ct + ((wm * FRAG_M + i) * 16) * LDC + (wn * FRAG_N + j) * 16, acc[i][j], LDC,
                                    wmma::mem_row_major);
    __syncthreads();
    for (int i = threadIdx.x; i < BM * BN; i += THREADS) {
        const int r = i / BN, c = i % BN;
        if (r < rows && n0 + c < N) y[(size_t)(row0 + r) * N + n0 + c] = ct[r * LDC + c];
    }
}

extern "C" sd_code sd_cuda_moe_grouped_gemm(sd_moe_grouped_op op, const sd_cuda_expert *table, const int *tiles,
                                            const int *n_tiles, int max_tiles, const uint16_t *x, int N, int K, int Ie,
                                            float *y, cudaStream_t stream, sd_status *st) {
    SD_NVTX("sd_cuda_moe_grouped_gemm");
    if (N < 1 || K < 8 || K % 8 || max_tiles < 0 || (op == SD_MOE_GROUPED_UP && N != 2 * Ie))
        return sd_fail(st, SD_ERR_UNSUPPORTED, "cuda moe grouped gemm: N = %d, K = %d, Ie = %d (K a multiple of 8; up: N = 2·Ie)",
                       N, K, Ie);
    const long long blocks = (long long)max_tiles * sd_ceil_div(N, BN);
    if (blocks < 1) return SD_OK;
    if (blocks > 0x7fffffffLL)
        return sd_fail(st, SD_ERR_UNSUPPORTED, "cuda moe grouped gemm: %d tiles × %d columns is too many blocks", max_tiles, N);
    grouped_kernel<<<(unsigned)blocks, THREADS, 0, stream>>>((int)op, table, tiles, n_tiles, (const __nv_bfloat16 *)x, N, K,
                                                            Ie, y);
    SD_LAUNCH_CHECK(st);
    return SD_OK;
}
