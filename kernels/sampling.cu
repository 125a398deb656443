// sampling.cu — argmax, softmax and inverse-CDF sampling.
//   argmax:  a row cut into up to SD_ARGMAX_SLICES slices of contiguous indices, a block of 256
//            per slice: per-thread first max in index order, then a tree merge by (value, index);
//            the row's last slice block to finish (an atomic ticket) merges the slices' results
//            the same way. Exact comparisons, so any merge order gives the CPU's answer. A row
//            needs many blocks (one block is one multiprocessor's bandwidth), and the argmax stays
//            a launch of its own rather than a tail of lm_head's (docs/EXPERIMENTS.md#argmax-slices,
//            #argmax-in-lm-head).
//   softmax: the argmax block, then e_i in parallel, the sum by one thread in index order (the
//            CPU's rounding), the scale in parallel.
//   sample:  one thread per row, the CPU loop as written (sd_dev_sample in sampling.cuh, shared
//            with acceptance.cu; a float running sum is inherently sequential). Row r draws at
//            position pos + r, so a forward's rows draw what the CPU's per-row loop draws.
#include "sampling.h"
#include "philox.h"       // sd_uniform (host and device)
#include "sampling.cuh"   // sd_dev_sample

#define SAMPLE_THREADS 1024
#define ARGMAX_U 8 // float4 chunks a thread has in flight in block_argmax
#define ARGMAX_THREADS 256 // a slice block
#define ARGMAX_MIN_SLICE 1024 // entries: rows shorter than two of these are one slice
static_assert(SD_ARGMAX_SLICES <= ARGMAX_THREADS, "argmax: the last block merges a slice a thread");

// The block's (value, index) candidates, one a thread (index -1: none), merged by a tree: the larger
// value, on equal values the lower index. blockDim.x a power of two; all threads return the result.
__device__ static void block_merge(float bv, int bi, float *sv, int *si, float *mv, int *mi) {
    const int tid = threadIdx.x;
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

// (value, index) of the first maximum of x[0..n), NaN skipped; index -1 when every entry is NaN.
// All threads return the result. sv, si hold blockDim.x entries.
__device__ static void block_argmax(const float *x, int n, float *sv, int *si, float *mv, int *mi) {
    const int tid = threadIdx.x;
    float bv = 0.0f;
    int bi = -1;
    // Each thread visits its entries in increasing index order (the first max wins within a
    // thread; the merge below breaks ties by index). 16-byte rows: float4 chunks tid, tid + bs,
    // ..., ARGMAX_U of them loaded before any is compared, so a row of 160K entries is a few
    // round trips, not one per entry.
    if (((uintptr_t)x & 15) == 0 && n % 4 == 0) {
        const float4 *x4 = (const float4 *)x;
        const int n4 = n / 4, bs = (int)blockDim.x;
        for (int c0 = tid; c0 < n4; c0 += ARGMAX_U * bs) {
            float4 f[ARGMAX_U];
#pragma unroll
            for (int u = 0; u < ARGMAX_U; u++)
                if (c0 + u * bs < n4) f[u] = __ldg(x4 + c0 + u * bs);
#pragma unroll
            for (int u = 0; u < ARGMAX_U; u++) {
                const int c = c0 + u * bs;
                if (c >= n4) break;
                const float v[4] = {f[u].x, f[u].y, f[u].z, f[u].w};
#pragma unroll
                for (int e = 0; e < 4; e++)
                    if (!isnan(v[e]) && (bi < 0 || v[e] > bv)) { bv = v[e]; bi = 4 * c + e; }
            }
        }
    } else {
        for (int i = tid; i < n; i += blockDim.x) {
            const float v = x[i];
            if (isnan(v)) continue;
            if (bi < 0 || v > bv) { bv = v; bi = i; }
        }
    }
    block_merge(bv, bi, sv, si, mv, mi);
}

// Grid (slices, rows): block (s, r) takes entries [s·len, min((s+1)·len, n)) of row r; the row's
// last block to finish merges the slices' results and writes out[r]. Row r's workspace, at
// r·(2·SD_ARGMAX_SLICES + 1) whatever the call's rows and slices (so a ticket never lands where
// another call left a partial): its ticket (re-zeroed by that last block), then part_v and part_i.
static __global__ void __launch_bounds__(ARGMAX_THREADS)
argmax_kernel(const float *__restrict__ x, int n, int len, int *ws, int *__restrict__ out) {
    sd_pdl_enter();
    __shared__ float sv[ARGMAX_THREADS];
    __shared__ int si[ARGMAX_THREADS];
    __shared__ bool last;
    const int s = blockIdx.x, S = gridDim.x, r = blockIdx.y, lo = s * len;
    float m;
    int i;
    block_argmax(x + (size_t)r * n + lo, min(len, n - lo), sv, si, &m, &i);
    int *ticket = ws + (size_t)r * (2 * SD_ARGMAX_SLICES + 1), *part_i = ticket + 1 + SD_ARGMAX_SLICES;
    float *part_v = (float *)(ticket + 1);
    if (threadIdx.x == 0) {
        part_v[s] = m;
        part_i[s] = i < 0 ? -1 : lo + i;
        __threadfence(); // the partial is visible before the ticket counts it
        last = atomicAdd(ticket, 1) == S - 1;
    }
    __syncthreads();
    if (!last) return;
    const int t = threadIdx.x;
    const float v = t < S ? __ldcg(part_v + t) : 0.0f;
    const int vi = t < S ? __ldcg(part_i + t) : -1;
    block_merge(v, vi, sv, si, &m, &i);
    if (t == 0) {
        out[r] = i < 0 ? 0 : i;
        *ticket = 0;
    }
}

// The slice length of an n-entry row: a multiple of 4 (16-byte aligned slices of an aligned row),
// at least ARGMAX_MIN_SLICE, at most SD_ARGMAX_SLICES slices.
static int argmax_slice(int n) {
    int len = sd_ceil_div(n, SD_ARGMAX_SLICES);
    if (len < ARGMAX_MIN_SLICE) len = ARGMAX_MIN_SLICE;
    return (len + 3) & ~3;
}

extern "C" sd_code sd_cuda_argmax(const float *x, int rows, int n, int *out, int *ws, cudaStream_t stream, sd_status *st) {
    SD_NVTX("sd_cuda_argmax");
    if (rows < 1 || n < 1) return SD_OK;
    const int len = argmax_slice(n);
    SD_CUDA_CHECK(st, sd_launch(argmax_kernel, dim3(sd_ceil_div(n, len), rows), ARGMAX_THREADS, 0, stream, x, n, len, ws, out));
    SD_LAUNCH_CHECK(st);
    return SD_OK;
}

static __global__ void __launch_bounds__(SAMPLE_THREADS)
softmax_kernel(const float *logits, int n, float temperature, float *p) {
    sd_pdl_enter();
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
    SD_CUDA_CHECK(st, sd_launch(softmax_kernel, rows, SAMPLE_THREADS, 0, stream, logits, n, temperature, p));
    SD_LAUNCH_CHECK(st);
    return SD_OK;
}

// One thread per row (blockIdx.x): the row's draw at position pos + r (read after the wait: the
// round and position may be this forward's).
static __global__ void sample_kernel(const float *__restrict__ p, int n, uint64_t seed, sd_dev_draw at, uint32_t purpose,
                                     int *__restrict__ out) {
    sd_pdl_enter();
    const int r = blockIdx.x;
    const uint32_t round = at.round_dev ? *at.round_dev : at.round, pos = (uint32_t)sd_pos_read(at.pos);
    out[r] = sd_dev_sample(p + (size_t)r * n, n, sd_uniform(seed, round, pos + (uint32_t)r, purpose));
}

extern "C" sd_code sd_cuda_sample_rows(const float *p, int rows, int n, uint64_t seed, sd_dev_draw at, uint32_t purpose,
                                       int *out, cudaStream_t stream, sd_status *st) {
    SD_NVTX("sd_cuda_sample_rows");
    if (rows < 1) return SD_OK;
    SD_CUDA_CHECK(st, sd_launch(sample_kernel, rows, 1, 0, stream, p, n, seed, at, purpose, out));
    SD_LAUNCH_CHECK(st);
    return SD_OK;
}
