// linear.cu — the Linear op for decode and verify token counts (T <= 32 per launch).
//
// Memory-bound design: one warp per weight row, 16-byte weight loads (8 bf16 or 4 f32 per lane
// per step), the T tokens looped inside so every weight byte is read once per launch; x rows are
// small and come from L1. 8 warps per block. Order per output element: sd_row_dot (common.cuh)
// then the fixed warp tree — independent of T by construction.
#include "linear.h"
#include "common.cuh"

#define LINEAR_WARPS 8
#define LINEAR_TILE 32

template <int TMAX, bool BF16>
static __global__ void __launch_bounds__(LINEAR_WARPS * 32)
linear_kernel(const void *__restrict__ W, int rows, int cols, const float *__restrict__ x, int T, float *__restrict__ y) {
    const int row = blockIdx.x * LINEAR_WARPS + (threadIdx.x >> 5);
    if (row >= rows) return; // whole warp
    float acc[TMAX];
#pragma unroll
    for (int t = 0; t < TMAX; t++) acc[t] = 0.0f;
    sd_row_dot<TMAX, BF16>(W, cols, row, x, (size_t)cols, T, acc);
#pragma unroll
    for (int t = 0; t < TMAX; t++) {
        if (t >= T) break;
        const float s = sd_warp_sum(acc[t]);
        if ((threadIdx.x & 31) == 0) y[(size_t)t * rows + row] = s;
    }
}

template <bool BF16>
static void linear_launch(const sd_mat *w, const float *x, int T, float *y, cudaStream_t stream) {
    const dim3 grid(sd_ceil_div(w->rows, LINEAR_WARPS)), block(LINEAR_WARPS * 32);
    if (T <= 1) linear_kernel<1, BF16><<<grid, block, 0, stream>>>(w->data, w->rows, w->cols, x, T, y);
    else if (T <= 2) linear_kernel<2, BF16><<<grid, block, 0, stream>>>(w->data, w->rows, w->cols, x, T, y);
    else if (T <= 4) linear_kernel<4, BF16><<<grid, block, 0, stream>>>(w->data, w->rows, w->cols, x, T, y);
    else if (T <= 8) linear_kernel<8, BF16><<<grid, block, 0, stream>>>(w->data, w->rows, w->cols, x, T, y);
    else if (T <= 16) linear_kernel<16, BF16><<<grid, block, 0, stream>>>(w->data, w->rows, w->cols, x, T, y);
    else linear_kernel<32, BF16><<<grid, block, 0, stream>>>(w->data, w->rows, w->cols, x, T, y);
}

extern "C" sd_code sd_cuda_linear(const sd_mat *w, const float *x, int T, float *y, cudaStream_t stream, sd_status *st) {
    SD_NVTX("sd_cuda_linear");
    if (w->dtype != SD_DT_BF16 && w->dtype != SD_DT_F32)
        return sd_fail(st, SD_ERR_UNSUPPORTED, "cuda linear: weight dtype %d is not F32 or BF16", (int)w->dtype);
    if (T < 1 || w->rows < 1 || w->cols < 1) return SD_OK;
    for (int t0 = 0; t0 < T; t0 += LINEAR_TILE) {
        const int n = T - t0 < LINEAR_TILE ? T - t0 : LINEAR_TILE;
        const float *xt = x + (size_t)t0 * w->cols;
        float *yt = y + (size_t)t0 * w->rows;
        if (w->dtype == SD_DT_BF16) linear_launch<true>(w, xt, n, yt, stream);
        else linear_launch<false>(w, xt, n, yt, stream);
        SD_LAUNCH_CHECK(st);
    }
    return SD_OK;
}
