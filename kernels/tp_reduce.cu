// tp_reduce.cu — the rank-order sum of an all-reduce (tp_reduce.h): one thread per element,
// grid-stride, the adds in rank order with explicit round-to-nearest (never contracted).
#include "tp_reduce.h"
#include "common.cuh" // sd_launch, sd_pdl_*, SD_NVTX

#define REDUCE_THREADS 256

static __global__ void __launch_bounds__(REDUCE_THREADS)
tp_reduce_kernel(const float *__restrict__ g, int ranks, size_t n, float *out, int accumulate) {
    sd_pdl_enter(); // the gathered partials are the predecessor's (the all-gather)
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float s = g[i];
        for (int r = 1; r < ranks; r++) s = __fadd_rn(s, g[(size_t)r * n + i]);
        out[i] = accumulate ? __fadd_rn(out[i], s) : s;
    }
}

extern "C" sd_code sd_cuda_tp_reduce(const float *g, int ranks, size_t n, float *out, bool accumulate, cudaStream_t stream,
                                     sd_status *st) {
    SD_NVTX("sd_cuda_tp_reduce");
    if (ranks < 1) return sd_fail(st, SD_ERR_USAGE, "cuda tp reduce: %d ranks", ranks);
    if (n == 0) return SD_OK;
    const size_t blocks = (n + REDUCE_THREADS - 1) / REDUCE_THREADS;
    SD_CUDA_CHECK(st, sd_launch(tp_reduce_kernel, (unsigned)(blocks < 1024 ? blocks : 1024), REDUCE_THREADS, 0, stream, g, ranks,
                                n, out, accumulate ? 1 : 0));
    SD_LAUNCH_CHECK(st);
    return SD_OK;
}
