// rows.cu — embedding gather, RMSNorm over rows, residual add.
//   embed:   one block per token, threads stride the row; bf16 widened by a shift (exact). The
//            ids are read where the host wrote them (pinned memory): carrying up to 16 of them in
//            the launch's arguments instead changed nothing (2026-12-01, bench_gpu_e2e kimi decode,
//            three alternating pairs of stream launches: 2.520 ms either way). The layer walk's
//            embedding may also write a state's cursor (sd_cuda_embed_cursor): a host commit's
//            write, one launch fewer at the step boundary (engine/cuda/device.c).
//   rmsnorm: one block of 256 per row (sd_block_rmsnorm); the order depends on n only.
//   add:     grid-stride elementwise.
#include "rows.h"
#include "rows.cuh"

// cursor: a host commit's cursor write riding in this launch (sd_cuda_embed_cursor), or NULL.
template <bool BF16>
static __global__ void embed_kernel(const void *__restrict__ E, int cols, const int *__restrict__ tokens, float *__restrict__ x,
                                    int *cursor, int len, int pending) {
    sd_pdl_enter();
    if (cursor && blockIdx.x == 0 && threadIdx.x == 0) {
        cursor[0] = len;
        cursor[1] = pending;
    }
    const size_t row = (size_t)tokens[blockIdx.x];
    float *out = x + (size_t)blockIdx.x * cols;
    for (int i = threadIdx.x; i < cols; i += blockDim.x)
        out[i] = BF16 ? sd_dev_bf16(((const uint16_t *)E)[row * cols + i]) : ((const float *)E)[row * cols + i];
}

extern "C" sd_code sd_cuda_embed_cursor(const sd_mat *embed, const int *tokens, int T, float *x, int *cursor, int len,
                                        int pending, cudaStream_t stream, sd_status *st) {
    SD_NVTX("sd_cuda_embed");
    if (embed->dtype != SD_DT_BF16 && embed->dtype != SD_DT_F32)
        return sd_fail(st, SD_ERR_UNSUPPORTED, "cuda embed: dtype %d is not F32 or BF16", (int)embed->dtype);
    if (T < 1) return SD_OK;
    SD_CUDA_CHECK(st, sd_launch(embed->dtype == SD_DT_BF16 ? embed_kernel<true> : embed_kernel<false>, T, 256, 0, stream,
                                (const void *)embed->data, embed->cols, tokens, x, cursor, len, pending));
    SD_LAUNCH_CHECK(st);
    return SD_OK;
}

extern "C" sd_code sd_cuda_embed(const sd_mat *embed, const int *tokens, int T, float *x, cudaStream_t stream, sd_status *st) {
    return sd_cuda_embed_cursor(embed, tokens, T, x, NULL, 0, 0, stream, st);
}

static __global__ void __launch_bounds__(SD_NORM_THREADS)
rmsnorm_kernel(const float *x, const float *__restrict__ w, int n, float eps, float *out) {
    sd_pdl_enter();
    __shared__ float sh[32];
    const size_t off = (size_t)blockIdx.x * n;
    sd_block_rmsnorm(x + off, w, n, eps, out + off, sh);
}

extern "C" sd_code sd_cuda_rmsnorm(const float *x, const float *w, int rows, int n, float eps, float *out,
                                   cudaStream_t stream, sd_status *st) {
    SD_NVTX("sd_cuda_rmsnorm");
    if (rows < 1) return SD_OK;
    SD_CUDA_CHECK(st, sd_launch(rmsnorm_kernel, rows, SD_NORM_THREADS, 0, stream, x, w, n, eps, out));
    SD_LAUNCH_CHECK(st);
    return SD_OK;
}

static __global__ void add_kernel(float *__restrict__ x, const float *__restrict__ y, size_t n) {
    sd_pdl_enter();
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) x[i] += y[i];
}

extern "C" sd_code sd_cuda_add(float *x, const float *y, size_t n, cudaStream_t stream, sd_status *st) {
    SD_NVTX("sd_cuda_add");
    if (!n) return SD_OK;
    const int blocks = (int)(n < (size_t)256 * 1024 ? (n + 255) / 256 : 1024);
    SD_CUDA_CHECK(st, sd_launch(add_kernel, blocks, 256, 0, stream, x, y, n));
    SD_LAUNCH_CHECK(st);
    return SD_OK;
}
