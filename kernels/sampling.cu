// sampling.cu — argmax, softmax and inverse-CDF sampling.
//   argmax:  one block of 1024 per row; per-thread first max in index order, then a tree merge
//            by (value, index) — exact comparisons, so any merge order gives the CPU's answer.
//   softmax: the argmax block, then e_i in parallel, the sum by one thread in index order (the
//            CPU's rounding), the scale in parallel.
//   sample:  one thread, the CPU loop as written (a float running sum is inherently sequential).
#include "sampling.h"
#include "common.cuh"
#include "philox.h" // sd_uniform (host and device)

#define SAMPLE_THREADS 1024

// (value, index) of the first maximum of x[0..n), NaN skipped; index -1 when every entry is NaN.
// All threads return the result. sv, si hold SAMPLE_THREADS entries.
__device__ static void block_argmax(const float *x, int n, float *sv, int *si, float *mv, int *mi) {
    const int tid = threadIdx.x;
    float bv = 0.0f;
    int bi = -1;
    for (int i = tid; i < n; i += blockDim.x) {
        const float v = x[i];
        if (isnan(v)) continue;
        if (bi < 0 || v > bv) { bv = v; bi = i; }
    }
    sv[tid] = bv;
    si[tid] = bi;
    __syncthreads();
    for (int half = blockDim.x / 2; half > 0; half >>= 1) {
        if (tid < half) {
            const float ov = sv[tid + half];
            const int oi = si[tid + half];
            const int ci = si[tid];
            if (oi >= 0 && (ci < 0 || ov > sv[tid] || (ov == sv[tid] && oi < ci))) { sv[tid] = ov; si[tid] = oi; }
        }
        __syncthreads();
    }
    *mv = sv[0];
    *mi = si[0];
    __syncthreads();
}

static __global__ void __launch_bounds__(SAMPLE_THREADS) argmax_kernel(const float *__restrict__ x, int n, int *__restrict__ out) {
    __shared__ float sv[SAMPLE_THREADS];
    __shared__ int si[SAMPLE_THREADS];
    float m;
    int i;
    block_argmax(x + (size_t)blockIdx.x * n, n, sv, si, &m, &i);
    if (threadIdx.x == 0) out[blockIdx.x] = i < 0 ? 0 : i;
}

extern "C" sd_code sd_cuda_argmax(const float *x, int rows, int n, int *out, cudaStream_t stream, sd_status *st) {
    SD_NVTX("sd_cuda_argmax");
    if (rows < 1 || n < 1) return SD_OK;
    argmax_kernel<<<rows, SAMPLE_THREADS, 0, stream>>>(x, n, out);
    SD_LAUNCH_CHECK(st);
    return SD_OK;
}

static __global__ void __launch_bounds__(SAMPLE_THREADS)
softmax_kernel(const float *logits, int n, float temperature, float *p) {
    __shared__ float sv[SAMPLE_THREADS];
    __shared__ int si[SAMPLE_THREADS];
    __shared__ float inv_sh;
    const float *l = logits + (size_t)blockIdx.x * n;
    float *pr = p + (size_t)blockIdx.x * n;
    float m;
    int top;
    block_argmax(l, n, sv, si, &m, &top);
    if (top < 0) { top = 0; m = l[0]; }
    if (!(temperature > 0) || !isfinite(m)) {
        for (int i = threadIdx.x; i < n; i += blockDim.x) pr[i] = i == top ? 1.0f : 0.0f;
        return;
    }
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        const float v = l[i];
        pr[i] = isnan(v) ? 0.0f : expf((v - m) / temperature);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        float s = 0.0f;
        for (int i = 0; i < n; i++) s += pr[i];
        inv_sh = 1.0f / s; // s >= 1: the max contributes expf(0) = 1
    }
    __syncthreads();
    const float inv = inv_sh;
    for (int i = threadIdx.x; i < n; i += blockDim.x) pr[i] *= inv;
}

extern "C" sd_code sd_cuda_softmax(const float *logits, int rows, int n, float temperature, float *p, cudaStream_t stream,
                                   sd_status *st) {
    SD_NVTX("sd_cuda_softmax");
    if (rows < 1 || n < 1) return SD_OK;
    softmax_kernel<<<rows, SAMPLE_THREADS, 0, stream>>>(logits, n, temperature, p);
    SD_LAUNCH_CHECK(st);
    return SD_OK;
}

static __global__ void sample_kernel(const float *__restrict__ p, int n, uint64_t seed, uint32_t round, uint32_t pos,
                                     uint32_t purpose, int *__restrict__ out) {
    const float u = sd_uniform(seed, round, pos, purpose);
    float total = 0.0f;
    int last = -1;
    for (int i = 0; i < n; i++)
        if (p[i] > 0) { total += p[i]; last = i; }
    if (last < 0) { *out = -1; return; }
    const float target = u * total;
    float c = 0.0f;
    for (int i = 0; i < n; i++) {
        if (!(p[i] > 0)) continue;
        c += p[i];
        if (c > target) { *out = i; return; }
    }
    *out = last;
}

extern "C" sd_code sd_cuda_sample(const float *p, int n, uint64_t seed, uint32_t round, uint32_t pos, uint32_t purpose,
                                  int *out, cudaStream_t stream, sd_status *st) {
    SD_NVTX("sd_cuda_sample");
    sample_kernel<<<1, 1, 0, stream>>>(p, n, seed, round, pos, purpose, out);
    SD_LAUNCH_CHECK(st);
    return SD_OK;
}
