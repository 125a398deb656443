// finite.cu — the non-finite flag (finite.h): a reset thread and a grid-stride check whose blocks
// each vote once (__syncthreads_or), so a tensor full of NaN costs one atomic per block.
#include <climits>
#include "finite.h"
#include "common.cuh" // SD_NVTX, SD_LAUNCH_CHECK

static __global__ void finite_reset_kernel(int *flag) { *flag = INT_MAX; }

static __global__ void finite_check_kernel(const float *x, size_t n, int site, int *flag) {
    bool bad = false;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        bad |= !isfinite(x[i]);
    if (__syncthreads_or(bad) && threadIdx.x == 0) atomicMin(flag, site);
}

extern "C" sd_code sd_cuda_finite_reset(int *flag, cudaStream_t stream, sd_status *st) {
    finite_reset_kernel<<<1, 1, 0, stream>>>(flag);
    SD_LAUNCH_CHECK(st);
    return SD_OK;
}

extern "C" sd_code sd_cuda_finite_check(const float *x, size_t n, int site, int *flag, cudaStream_t stream, sd_status *st) {
    if (!n) return SD_OK;
    const int threads = 256;
    const size_t want = (n + threads - 1) / threads;
    const int blocks = want < 132 ? (int)want : 132; // one wave on an H200 is plenty for (T, D)
    finite_check_kernel<<<blocks, threads, 0, stream>>>(x, n, site, flag);
    SD_LAUNCH_CHECK(st);
    return SD_OK;
}
