// tp_head.cu — the head's pieces around its all-gathers (tp_head.h): pairs and their combine one
// thread per row; the lay-out one thread per gathered element.
#include "tp_head.h"
#include "common.cuh" // sd_launch, sd_pdl_*, SD_NVTX

static __global__ void pairs_kernel(const float *__restrict__ logits, int n, int count, int first, const int *__restrict__ idx,
                                    sd_cuda_tp_pick *out) {
    sd_pdl_enter();
    const int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= n) return;
    sd_cuda_tp_pick p = {__int_as_float(0x7fc00000), -1};
    if (count > 0) {
        const int i = idx[t];
        const float v = logits[(size_t)t * count + i];
        if (!isnan(v)) p = {v, first + i};
    }
    out[t] = p;
}

extern "C" sd_code sd_cuda_tp_argmax_pairs(const float *logits, int n, int count, int first, const int *idx, sd_cuda_tp_pick *out,
                                           cudaStream_t stream, sd_status *st) {
    SD_NVTX("sd_cuda_tp_argmax_pairs");
    if (n < 1) return SD_OK;
    SD_CUDA_CHECK(st, sd_launch(pairs_kernel, sd_ceil_div(n, 128), 128, 0, stream, logits, n, count, first, idx, out));
    SD_LAUNCH_CHECK(st);
    return SD_OK;
}

static __global__ void combine_kernel(const sd_cuda_tp_pick *__restrict__ all, int ranks, int n, int *out) {
    sd_pdl_enter();
    const int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= n) return;
    int best = -1;
    float bv = 0.0f;
    for (int r = 0; r < ranks; r++) {
        const sd_cuda_tp_pick p = all[(size_t)r * n + t];
        if (p.index >= 0 && (best < 0 || p.value > bv)) {
            best = p.index;
            bv = p.value;
        }
    }
    out[t] = best < 0 ? 0 : best;
}

extern "C" sd_code sd_cuda_tp_argmax_combine(const sd_cuda_tp_pick *all, int ranks, int n, int *out, cudaStream_t stream,
                                             sd_status *st) {
    SD_NVTX("sd_cuda_tp_argmax_combine");
    if (ranks < 1 || ranks > SD_CUDA_TP_MAX_RANKS) return sd_fail(st, SD_ERR_USAGE, "cuda tp head: %d ranks", ranks);
    if (n < 1) return SD_OK;
    SD_CUDA_CHECK(st, sd_launch(combine_kernel, sd_ceil_div(n, 128), 128, 0, stream, all, ranks, n, out));
    SD_LAUNCH_CHECK(st);
    return SD_OK;
}

// Grid: (blocks over the largest block's n · count, ranks).
static __global__ void lay_kernel(const float *__restrict__ g, const __grid_constant__ sd_cuda_tp_vocab v, int n, size_t block,
                                  int V, float *__restrict__ out) {
    sd_pdl_enter();
    const int r = blockIdx.y, count = v.count[r];
    const size_t total = (size_t)n * count;
    const float *from = g + (size_t)r * block;
    for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += (size_t)gridDim.x * blockDim.x) {
        const size_t t = e / count, i = e % count;
        out[t * V + v.first[r] + i] = from[e];
    }
}

extern "C" sd_code sd_cuda_tp_lay_rows(const float *g, const sd_cuda_tp_vocab *v, int n, size_t block, int V, float *out,
                                       cudaStream_t stream, sd_status *st) {
    SD_NVTX("sd_cuda_tp_lay_rows");
    if (v->ranks < 1 || v->ranks > SD_CUDA_TP_MAX_RANKS) return sd_fail(st, SD_ERR_USAGE, "cuda tp head: %d ranks", v->ranks);
    int most = 0;
    for (int r = 0; r < v->ranks; r++) {
        if (v->first[r] < 0 || v->count[r] < 0 || v->first[r] + v->count[r] > V || (size_t)n * v->count[r] > block)
            return sd_fail(st, SD_ERR_USAGE, "cuda tp head: rank %d's rows %d+%d of %d (block %zu floats, %d rows)", r, v->first[r],
                           v->count[r], V, block, n);
        if (v->count[r] > most) most = v->count[r];
    }
    if (n < 1 || most < 1) return SD_OK;
    const size_t per = (size_t)n * most;
    const int bx = (int)((per + 255) / 256 < 512 ? (per + 255) / 256 : 512);
    SD_CUDA_CHECK(st, sd_launch(lay_kernel, dim3(bx, v->ranks), 256, 0, stream, g, *v, n, block, V, out));
    SD_LAUNCH_CHECK(st);
    return SD_OK;
}
