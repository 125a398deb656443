// rows.cu — embedding gather and RMSNorm over rows.
//   embed:   one block per token, threads stride the row; bf16 widened by a shift (exact). The
//            ids are read where the host wrote them (pinned memory).
//   rmsnorm: one block of 256 per row (sd_block_rmsnorm); the order depends on n only.
#include "rows.h"
#include "rows.cuh"

template <bool BF16>
static __global__ void embed_kernel(const void *__restrict__ E, int cols, const int *__restrict__ tokens, float *__restrict__ x) {
    sd_pdl_enter();
    const size_t row = (size_t)tokens[blockIdx.x];
    float *out = x + (size_t)blockIdx.x * cols;
    for (int i = threadIdx.x; i < cols; i += blockDim.x)
        out[i] = BF16 ? sd_dev_bf16(((const uint16_t *)E)[row * cols + i]) : ((const float *)E)[row * cols + i];
}

extern "C" sd_code sd_cuda_embed(const sd_mat *embed, const int *tokens, int T, float *x, cudaStream_t stream, sd_status *st) {
    SD_NVTX("sd_cuda_embed");
    if (embed->dtype != SD_DT_BF16 && embed->dtype != SD_DT_F32)
        return sd_fail(st, SD_ERR_UNSUPPORTED, "cuda embed: dtype %d is not F32 or BF16", (int)embed->dtype);
    if (T < 1) return SD_OK;
    SD_CUDA_CHECK(st, sd_launch(embed->dtype == SD_DT_BF16 ? embed_kernel<true> : embed_kernel<false>, T, 256, 0, stream,
                                (const void *)embed->data, embed->cols, tokens, x));
    SD_LAUNCH_CHECK(st);
    return SD_OK;
}

static __global__ void __launch_bounds__(SD_NORM_THREADS)
rmsnorm_kernel(const float *x, const float *__restrict__ w, int n, float eps, float *out, int *flag, int site) {
    sd_pdl_enter();
    __shared__ float sh[32];
    const size_t off = (size_t)blockIdx.x * n;
    sd_block_rmsnorm(x + off, w, n, eps, out + off, sh, flag, site);
}

extern "C" sd_code sd_cuda_rmsnorm(const float *x, const float *w, int rows, int n, float eps, float *out,
                                   cudaStream_t stream, sd_status *st) {
    return sd_cuda_rmsnorm_flagged(x, w, rows, n, eps, out, NULL, 0, stream, st);
}

extern "C" sd_code sd_cuda_rmsnorm_flagged(const float *x, const float *w, int rows, int n, float eps, float *out,
                                           int *flag, int site, cudaStream_t stream, sd_status *st) {
    SD_NVTX("sd_cuda_rmsnorm");
    if (rows < 1) return SD_OK;
    int *f = flag;
    SD_CUDA_CHECK(st, sd_launch(rmsnorm_kernel, rows, SD_NORM_THREADS, 0, stream, x, w, n, eps, out, f, site));
    SD_LAUNCH_CHECK(st);
    return SD_OK;
}
