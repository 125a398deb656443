// moe_prefill.cu — the MoE block's kernels at prefill (moe_prefill.h): routing a warp a token, the
// grouping by expert (a warp an expert scans the entries in order, so a row's place never depends
// on timing), the gathers, the SwiGLU and the weighted combine (the last two over f32 or bf16 rows).
#include <cuda_bf16.h>
#include "common.cuh" // sd_dev_sigmoid, sd_dev_silu, SD_NVTX, sd_ceil_div
#include "moe_prefill.h"

#define WARPS 8

// ---------------------------------------------------------------------------- routing
// (value, index) a is beaten by b: the larger value, ties to the lower index; index < 0 is none.
static __device__ __forceinline__ bool beats(float bv, int bi, float av, int ai) {
    return bi >= 0 && (ai < 0 || bv > av || (bv == av && bi < ai));
}
static __device__ __forceinline__ void warp_best(float &v, int &i) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, v, off);
        const int oi = __shfl_xor_sync(0xffffffffu, i, off);
        if (beats(ov, oi, v, i)) { v = ov; i = oi; }
    }
}

static __global__ void __launch_bounds__(WARPS * 32)
select_kernel(const float *__restrict__ logits, const float *__restrict__ bias, int T, int E, int K, int G, int topk_group,
              int renormalize, float scaling, int *__restrict__ sel, float *__restrict__ wts) {
    extern __shared__ float sm[];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, t = blockIdx.x * WARPS + warp;
    float *s = sm + (size_t)warp * 2 * E, *sp = s + E;
    unsigned char *taken = (unsigned char *)(sm + (size_t)WARPS * 2 * E) + (size_t)warp * E;
    if (t >= T) return; // whole warps leave: nothing below synchronises the block
    for (int e = lane; e < E; e += 32) {
        s[e] = sd_dev_sigmoid(logits[(size_t)t * E + e]);
        sp[e] = s[e] + bias[e];
        taken[e] = 0;
    }
    __syncwarp();
    if (G > 1) { // keep the topk_group groups with the best top-2 sums (ties: lower group); mask the rest
        const int per = E / G;
        float gs = -INFINITY;
        if (lane < G) {
            const float *v = sp + lane * per;
            float top = v[0] > v[1] ? v[0] : v[1], second = v[0] > v[1] ? v[1] : v[0];
            for (int i = 2; i < per; i++) {
                if (v[i] > top) { second = top; top = v[i]; }
                else if (v[i] > second) second = v[i];
            }
            gs = top + second;
        }
        unsigned kept = 0;
        for (int k = 0; k < topk_group; k++) {
            float bv = lane < G && !(kept >> lane & 1u) ? gs : -INFINITY;
            int bi = lane < G && !(kept >> lane & 1u) ? lane : -1;
            warp_best(bv, bi);
            kept |= 1u << bi;
        }
        __syncwarp();
        for (int e = lane; e < E; e += 32)
            if (!(kept >> (e / per) & 1u)) sp[e] = -INFINITY;
        __syncwarp();
    }
    float sum = 0.0f, wj = 0.0f;
    for (int j = 0; j < K; j++) {
        float bv = -INFINITY;
        int bi = -1;
        for (int e = lane; e < E; e += 32)
            if (!taken[e] && beats(sp[e], e, bv, bi)) { bv = sp[e]; bi = e; }
        warp_best(bv, bi);
        __syncwarp();
        if (lane == 0) taken[bi] = 1;
        __syncwarp();
        const float wv = s[bi];
        sum += wv; // every lane the same chain, in selection order
        if (lane == j) wj = wv;
        if (lane == 0) sel[(size_t)t * K + j] = bi;
    }
    if (lane < K) {
        if (renormalize) wj = wj / sum;
        wts[(size_t)t * K + lane] = wj * scaling;
    }
}

extern "C" sd_code sd_cuda_moe_prefill_select(const float *logits, const float *bias, int T, int E, int K, int G,
                                              int topk_group, bool renormalize, float scaling, int *sel, float *w,
                                              cudaStream_t stream, sd_status *st) {
    SD_NVTX("sd_cuda_moe_prefill_select");
    if (T < 1) return SD_OK;
    if (K > 32 || G > 32 || (G > 1 && E / G < 2))
        return sd_fail(st, SD_ERR_UNSUPPORTED, "cuda moe prefill select: K = %d, %d groups of %d experts (K, G <= 32)", K, G,
                       G > 0 ? E / G : 0);
    const size_t smem = (size_t)WARPS * E * (2 * sizeof(float) + 1);
    if (smem > 48 * 1024) return sd_fail(st, SD_ERR_UNSUPPORTED, "cuda moe prefill select: %d experts need %zu bytes", E, smem);
    select_kernel<<<sd_ceil_div(T, WARPS), WARPS * 32, smem, stream>>>(logits, bias, T, E, K, G, topk_group,
                                                                       renormalize ? 1 : 0, scaling, sel, w);
    SD_LAUNCH_CHECK(st);
    return SD_OK;
}

// ---------------------------------------------------------------------------- grouping
// The entries in segments of SEG, a block a segment. Counting is a histogram per segment in shared
// memory, added to counts with integer atomics (exact in any order). The scatter's block s counts
// the entries of the segments before it per expert (its row base past offsets), then one warp walks
// its own segment in entry order, 32 entries a step: lanes that chose the same expert
// (__match_any_sync) take consecutive rows by lane — so a row's place never depends on timing.
#define SEG 512
#define GROUP_THREADS 256

static __global__ void __launch_bounds__(GROUP_THREADS) count_kernel(const int *__restrict__ sel, int n, int E, int *counts) {
    extern __shared__ int hist[];
    for (int e = threadIdx.x; e < E; e += GROUP_THREADS) hist[e] = 0;
    __syncthreads();
    const int i0 = blockIdx.x * SEG, i1 = n - i0 < SEG ? n : i0 + SEG;
    for (int i = i0 + threadIdx.x; i < i1; i += GROUP_THREADS) {
        const int e = sel[i];
        if ((unsigned)e < (unsigned)E) atomicAdd(&hist[e], 1);
    }
    __syncthreads();
    for (int e = threadIdx.x; e < E; e += GROUP_THREADS)
        if (hist[e]) atomicAdd(&counts[e], hist[e]);
}

static __global__ void __launch_bounds__(GROUP_THREADS)
scatter_kernel(const int *__restrict__ sel, int n, int K, int E, const int *__restrict__ offsets, int *__restrict__ row_tok,
               int *__restrict__ inv) {
    extern __shared__ int next[]; // the next row of each expert
    for (int e = threadIdx.x; e < E; e += GROUP_THREADS) next[e] = 0;
    __syncthreads();
    const int i0 = blockIdx.x * SEG, i1 = n - i0 < SEG ? n : i0 + SEG;
    for (int i = threadIdx.x; i < i0; i += GROUP_THREADS) {
        const int e = sel[i];
        if ((unsigned)e < (unsigned)E) atomicAdd(&next[e], 1);
    }
    __syncthreads();
    for (int e = threadIdx.x; e < E; e += GROUP_THREADS) next[e] += offsets[e];
    __syncthreads();
    if (threadIdx.x >= 32) return;
    const int lane = threadIdx.x;
    for (int base = i0; base < i1; base += 32) {
        const int i = base + lane;
        const int e = i < i1 ? sel[i] : -1;
        const unsigned same = __match_any_sync(0xffffffffu, e);
        if ((unsigned)e < (unsigned)E) {
            const int row = next[e] + __popc(same & ((1u << lane) - 1u));
            row_tok[row] = i / K;
            inv[i] = row;
        }
        __syncwarp();
        if ((unsigned)e < (unsigned)E && lane == __ffs(same) - 1) next[e] += __popc(same);
        __syncwarp();
    }
}

extern "C" sd_code sd_cuda_moe_prefill_count(const int *sel, int n, int E, int *counts, cudaStream_t stream, sd_status *st) {
    SD_CUDA_CHECK(st, cudaMemsetAsync(counts, 0, sizeof(int) * (size_t)E, stream));
    if (n < 1) return SD_OK;
    count_kernel<<<sd_ceil_div(n, SEG), GROUP_THREADS, sizeof(int) * (size_t)E, stream>>>(sel, n, E, counts);
    SD_LAUNCH_CHECK(st);
    return SD_OK;
}

extern "C" sd_code sd_cuda_moe_prefill_scatter(const int *sel, int n, int K, int E, const int *offsets, int *row_tok,
                                               int *inv, cudaStream_t stream, sd_status *st) {
    if (n < 1) return SD_OK;
    scatter_kernel<<<sd_ceil_div(n, SEG), GROUP_THREADS, sizeof(int) * (size_t)E, stream>>>(sel, n, K, E, offsets, row_tok,
                                                                                             inv);
    SD_LAUNCH_CHECK(st);
    return SD_OK;
}

// ---------------------------------------------------------------------------- rows
template <bool BF16>
static __device__ __forceinline__ void put(void *out, size_t i, float v) {
    if (BF16) ((__nv_bfloat16 *)out)[i] = __float2bfloat16_rn(v);
    else ((float *)out)[i] = v;
}

template <bool BF16>
static __global__ void gather_kernel(const float *__restrict__ x, int ld_x, const int *__restrict__ rows, int D, void *out) {
    const float *src = x + (size_t)rows[blockIdx.x] * ld_x;
    for (int c = threadIdx.x; c < D; c += blockDim.x) put<BF16>(out, (size_t)blockIdx.x * D + c, src[c]);
}

extern "C" sd_code sd_cuda_gather_rows(const float *x, int ld_x, const int *rows, int n, int D, void *out, bool out_bf16,
                                       cudaStream_t stream, sd_status *st) {
    if (n < 1) return SD_OK;
    if (out_bf16) gather_kernel<true><<<n, 256, 0, stream>>>(x, ld_x, rows, D, out);
    else gather_kernel<false><<<n, 256, 0, stream>>>(x, ld_x, rows, D, out);
    SD_LAUNCH_CHECK(st);
    return SD_OK;
}

// An element as stored, widened to fp32 (exact for bf16).
static __device__ __forceinline__ float wide(float v) { return v; }
static __device__ __forceinline__ float wide(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename In, bool BF16>
static __global__ void swiglu_kernel(const In *__restrict__ h, size_t n, int I, void *out) {
    for (size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x; idx < n * I; idx += (size_t)gridDim.x * blockDim.x) {
        const size_t r = idx / I, i = idx % I;
        const In *row = h + r * 2 * I;
        put<BF16>(out, idx, sd_dev_silu(wide(row[i])) * wide(row[I + i]));
    }
}

template <typename In>
static void swiglu_launch(const void *h, size_t n, int I, void *out, bool out_bf16, int blocks, cudaStream_t stream) {
    if (out_bf16) swiglu_kernel<In, true><<<blocks, 256, 0, stream>>>((const In *)h, n, I, out);
    else swiglu_kernel<In, false><<<blocks, 256, 0, stream>>>((const In *)h, n, I, out);
}

extern "C" sd_code sd_cuda_swiglu_rows(const void *h, bool h_bf16, int n, int I, void *out, bool out_bf16,
                                       cudaStream_t stream, sd_status *st) {
    SD_NVTX("sd_cuda_swiglu_rows");
    if (n < 1) return SD_OK;
    const size_t total = (size_t)n * I;
    const int blocks = (int)(total < (size_t)256 * 8192 ? (total + 255) / 256 : 8192);
    if (h_bf16) swiglu_launch<__nv_bfloat16>(h, (size_t)n, I, out, out_bf16, blocks, stream);
    else swiglu_launch<float>(h, (size_t)n, I, out, out_bf16, blocks, stream);
    SD_LAUNCH_CHECK(st);
    return SD_OK;
}

template <typename In>
static __global__ void combine_kernel(const In *__restrict__ y, const int *__restrict__ inv, const float *__restrict__ w,
                                      const float *__restrict__ shared, int K, int D, float *__restrict__ x) {
    const int t = blockIdx.x;
    for (int c = threadIdx.x; c < D; c += blockDim.x) {
        float acc = 0.0f;
        for (int j = 0; j < K; j++) acc += w[(size_t)t * K + j] * wide(y[(size_t)inv[(size_t)t * K + j] * D + c]);
        if (shared) acc += shared[(size_t)t * D + c];
        x[(size_t)t * D + c] += acc;
    }
}

extern "C" sd_code sd_cuda_moe_prefill_combine(const void *y, bool y_bf16, const int *inv, const float *w, const float *shared,
                                               int T, int K, int D, float *x, cudaStream_t stream, sd_status *st) {
    if (T < 1) return SD_OK;
    if (y_bf16) combine_kernel<<<T, 256, 0, stream>>>((const __nv_bfloat16 *)y, inv, w, shared, K, D, x);
    else combine_kernel<<<T, 256, 0, stream>>>((const float *)y, inv, w, shared, K, D, x);
    SD_LAUNCH_CHECK(st);
    return SD_OK;
}
