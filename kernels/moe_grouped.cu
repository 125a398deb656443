// moe_grouped.cu — the grouped expert GEMMs of moe_grouped.h: the product's tiling of
// moe_grouped.cuh's template (docs/EXPERIMENTS.md#prefill-grouped-tiles has the shapes timed).
#include "common.cuh" // SD_NVTX, sd_ceil_div, SD_LAUNCH_CHECK
#include "moe_grouped.cuh"

// SD_MOE_GROUPED_BM rows × 128 columns a block, k steps of 64, 8 warps of 32 × 64, a ring of three.
#define BN 128
#define BK 64
#define WARPS_M 4
#define WARPS_N 2
#define STAGES 3

extern "C" sd_code sd_cuda_moe_grouped_tiles(const int *counts, int E, int *offsets, int *tiles, int *n_tiles,
                                             cudaStream_t stream, sd_status *st) {
    sd_grouped_tiles_kernel<SD_MOE_GROUPED_BM><<<1, 32, 0, stream>>>(counts, E, offsets, tiles, n_tiles);
    SD_LAUNCH_CHECK(st);
    return SD_OK;
}

extern "C" sd_code sd_cuda_moe_grouped_gemm(sd_moe_grouped_op op, const sd_cuda_expert *table, const int *tiles,
                                            const int *n_tiles, int max_tiles, const uint16_t *x, int N, int K, int Ie,
                                            float *y, cudaStream_t stream, sd_status *st) {
    SD_NVTX("sd_cuda_moe_grouped_gemm");
    if (N < 1 || K < 8 || K % 8 || max_tiles < 0 || (op == SD_MOE_GROUPED_UP && N != 2 * Ie))
        return sd_fail(st, SD_ERR_UNSUPPORTED, "cuda moe grouped gemm: N = %d, K = %d, Ie = %d (K a multiple of 8; up: N = 2·Ie)",
                       N, K, Ie);
    if ((long long)max_tiles * sd_ceil_div(N, BN) > 0x7fffffffLL)
        return sd_fail(st, SD_ERR_UNSUPPORTED, "cuda moe grouped gemm: %d tiles × %d columns is too many blocks", max_tiles, N);
    const cudaError_t e = sd_grouped_gemm_launch<SD_MOE_GROUPED_BM, BN, BK, WARPS_M, WARPS_N, STAGES>(
        (int)op, table, tiles, n_tiles, max_tiles, (const __nv_bfloat16 *)x, N, K, Ie, y, stream);
    if (e != cudaSuccess) return sd_fail(st, SD_ERR_SYS, "cuda moe grouped gemm: %s", cudaGetErrorString(e));
    return SD_OK;
}
