// common.cuh — device helpers every kernel shares: NVTX ranges, activations, bf16 widening,
// fixed-order warp/block sums, and the row dot product every matrix-vector kernel is built on.
//
// Reduction orders are the contract behind verify ≡ decode (MODEL.md "Exactness"): every sum
// here has an order fixed by the data's shape and the launch's block size, never by how many
// tokens share a launch. Device code is built with --fmad=false (CMakeLists.txt), so a*b+c
// is two roundings, as in the CPU reference.
#pragma once
#include <cuda_pipeline.h> // __pipeline_memcpy_async (sd_cp_async16_pol)
#include <cuda_runtime.h>
#include <math.h>
#include <nvtx3/nvToolsExt.h>
#include <stdint.h>
extern "C" {
#include "tensor.h"    // sd_mat
#include "status.h" // sd_code, sd_status
}
#include "check.h" // SD_CUDA_CHECK, SD_LAUNCH_CHECK
#include "pdl.h"   // sd_cuda_pdl_on
#include <utility> // std::forward

// Programmatic dependent launch (pdl.h). A kernel launched by sd_launch starts with
// sd_pdl_enter() (or sd_pdl_trigger(), its own prologue on never-written or settled data — pdl.h
// — then sd_pdl_wait()) before its first read of anything this forward's kernels wrote and its
// first write.
__device__ __forceinline__ void sd_pdl_trigger() { asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); }
__device__ __forceinline__ void sd_pdl_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
__device__ __forceinline__ void sd_pdl_enter() {
    sd_pdl_trigger();
    sd_pdl_wait();
}
// The wait, then the trigger: a kernel whose successor should start only once this kernel's
// predecessor is complete (pdl.h: the Linear, the KDA conv and scan).
__device__ __forceinline__ void sd_pdl_wait_trigger() {
    sd_pdl_wait();
    sd_pdl_trigger();
}

// kernel<<<grid, block, smem, stream>>>(args...), with the programmatic-serialization attribute
// while sd_cuda_pdl_on(). Returns the launch's error.
template <class... KArgs, class... Args>
static inline cudaError_t sd_launch(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                                    Args &&...args) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    cudaLaunchAttribute at[1];
    unsigned n = 0;
    if (sd_cuda_pdl_on()) {
        at[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        at[n++].val.programmaticStreamSerializationAllowed = 1;
    }
    cfg.attrs = at;
    cfg.numAttrs = n;
    return cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
}

// Sets `attr` of `kernel` on the current device to at least `value`: the runtime is asked once per
// kernel, device, attribute and larger value, not on every launch (a cache per translation unit,
// for the kernels it launches).
static inline cudaError_t sd_func_attr_at_least(const void *kernel, cudaFuncAttribute attr, int value) {
    struct grant {
        const void *kernel;
        int dev;
        cudaFuncAttribute attr;
        int value;
    };
    static grant seen[48];
    static int n_seen;
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess) dev = -1;
    grant *g = nullptr;
    for (int i = 0; i < n_seen && !g; i++)
        if (seen[i].kernel == kernel && seen[i].dev == dev && seen[i].attr == attr) g = &seen[i];
    if (g && g->value >= value) return cudaSuccess;
    const cudaError_t e = cudaFuncSetAttribute(kernel, attr, value);
    if (e != cudaSuccess) return e;
    if (!g && n_seen < 48) g = &seen[n_seen++];
    if (g) *g = {kernel, dev, attr, value};
    return cudaSuccess;
}

// Lets `kernel` take `smem` bytes of dynamic shared memory (the opt-in: the default is 48 KB less
// the kernel's static shared memory, so anything above 32 KB asks).
static inline cudaError_t sd_allow_smem(const void *kernel, size_t smem) {
    if (smem <= 32 * 1024) return cudaSuccess; // within the default for any kernel of at most 16 KB static
    return sd_func_attr_at_least(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
}

// Asks for `kernel`'s multiprocessors to get the largest shared-memory carveout
// (cudaSharedmemCarveoutMaxShared) rather than the L1-heavy one the runtime picks for a kernel
// with little shared memory: the launches after it, which need shared memory, can then share a
// multiprocessor with its blocks (moe_experts.cu's one-token up launch, mla.cu).
static inline cudaError_t sd_prefer_shared(const void *kernel) {
    return sd_func_attr_at_least(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared);
}

// An NVTX range for the lifetime of a launcher (closed on every return path).
struct sd_nvtx_scope {
    explicit sd_nvtx_scope(const char *name) { nvtxRangePushA(name); }
    ~sd_nvtx_scope() { nvtxRangePop(); }
    sd_nvtx_scope(const sd_nvtx_scope &) = delete;
    sd_nvtx_scope &operator=(const sd_nvtx_scope &) = delete;
};
#define SD_NVTX(name) sd_nvtx_scope sd_nvtx_scope_(name)

static inline int sd_ceil_div(long a, long b) { return (int)((a + b - 1) / b); }
__host__ __device__ static inline bool sd_aligned16(const void *p) { return ((uintptr_t)p & 15) == 0; }
static inline int sd_round32(int n) { return (n + 31) / 32 * 32; }

// Activations: the CPU definitions (ops.h) with the device's expf/log1pf (≤ 2 ulp apart from
// glibc's; that is the only cross-backend difference these introduce).
__device__ __forceinline__ float sd_dev_bf16(uint16_t h) { return __uint_as_float((uint32_t)h << 16); }
__device__ __forceinline__ float sd_dev_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }
__device__ __forceinline__ float sd_dev_silu(float x) { return x * sd_dev_sigmoid(x); }
__device__ __forceinline__ float sd_dev_softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

// Warp sum, fixed tree: lane l adds lane l+16, then +8, +4, +2, +1; lane 0's value is broadcast.
// The whole warp must call it.
__device__ __forceinline__ float sd_warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
    return __shfl_sync(0xffffffffu, v, 0);
}

// Block sum (blockDim.x a multiple of 32, at most 1024): each warp's tree, then the warp totals
// in one more tree (missing warps add 0). Every thread returns the same bits. `sh` holds 32
// floats; the call ends with a barrier so `sh` may be reused at once.
__device__ __forceinline__ float sd_block_sum(float v, float *sh) {
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = sd_warp_sum(v);
    if (lane == 0) sh[wid] = v;
    __syncthreads();
    float r = lane < nw ? sh[lane] : 0.0f;
    r = sd_warp_sum(r);
    __syncthreads();
    return r;
}

// 16 bytes of weights widened to f32: 8 bf16 (exact: the 16 bits become the high half) or 4 f32.
template <bool BF16>
__device__ __forceinline__ void sd_widen16(const uint4 u, float *wf) {
    if (BF16) {
        const uint32_t p[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
        for (int e = 0; e < 4; e++) {
            wf[2 * e] = __uint_as_float(p[e] << 16);
            wf[2 * e + 1] = __uint_as_float(p[e] & 0xffff0000u);
        }
    } else {
        wf[0] = __uint_as_float(u.x); wf[1] = __uint_as_float(u.y);
        wf[2] = __uint_as_float(u.z); wf[3] = __uint_as_float(u.w);
    }
}

// The L2 policy of every weight stream: evict_first. A decode step reads each weight byte once
// and the next step reads it again only after the rest of the model (gigabytes later), so no
// weight survives in L2 between steps; what can survive is the step's own working set — the KDA
// states and MLA cache rows written one step and read the next, the activations, the routing —
// and weights streamed at evict_first give way to it (docs/EXPERIMENTS.md#l2-weights-evict-first).
// A policy is one register, made once per thread; pol 0 below means no hint (the plain load or
// copy), for streams that are not weights.
__device__ __forceinline__ uint64_t sd_l2_evict_first() {
    uint64_t pol;
    asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
    return pol;
}

// A read-only 16-byte load under an L2 policy (__ldg when pol is 0).
__device__ __forceinline__ uint4 sd_ldg_pol(const uint4 *p, uint64_t pol) {
    if (!pol) return __ldg(p);
    uint4 v;
    asm("ld.global.nc.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
        : "l"(p), "l"(pol));
    return v;
}

// A 16-byte asynchronous copy global -> shared (__pipeline_memcpy_async's cp.async; committed and
// waited on with __pipeline_commit / __pipeline_wait_prior) under an L2 policy.
__device__ __forceinline__ void sd_cp_async16_pol(void *dst, const void *src, uint64_t pol) {
    if (!pol) return __pipeline_memcpy_async(dst, src, 16);
    asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2;" ::"r"((uint32_t)__cvta_generic_to_shared(dst)),
                 "l"(src), "l"(pol)
                 : "memory");
}

// One row of a Linear against T vectors, one warp per row. The row is cut into 16-byte chunks
// (8 bf16 or 4 f32 weights); lane l takes chunks l, l+32, l+64, ... and adds each element's
// product into its partial in element order (a short last chunk adds only its real elements).
// acc[t] holds lane partials; the caller folds them with sd_warp_sum. The order depends on the
// row length only: the same for 1 token or 32, vector loads or scalar ones (chosen by alignment).
// x rows are t·xs floats apart, in global or shared memory (plain loads, never __ldg).
template <int TMAX, bool BF16>
__device__ __forceinline__ void sd_row_dot(const void *W, int cols, int row, const float *x, size_t xs, int T,
                                           float acc[TMAX]) {
    constexpr int VEC = BF16 ? 8 : 4;
    const int lane = threadIdx.x & 31;
    const size_t esize = BF16 ? 2 : 4;
    const char *wrow = (const char *)W + (size_t)row * cols * esize;
    const bool wvec = ((uintptr_t)wrow & 15) == 0;
    const bool xvec = ((uintptr_t)x & 15) == 0 && (xs & 3) == 0;
    const int nchunk = (cols + VEC - 1) / VEC;
    for (int c = lane; c < nchunk; c += 32) {
        const int i0 = c * VEC, n = cols - i0 < VEC ? cols - i0 : VEC;
        float wf[VEC];
        if (n == VEC && wvec) {
            sd_widen16<BF16>(__ldg((const uint4 *)(wrow + (size_t)i0 * esize)), wf);
        } else {
#pragma unroll
            for (int e = 0; e < VEC; e++)
                wf[e] = e < n ? (BF16 ? sd_dev_bf16(((const uint16_t *)wrow)[i0 + e]) : ((const float *)wrow)[i0 + e]) : 0.0f;
        }
#pragma unroll
        for (int t = 0; t < TMAX; t++) {
            if (t >= T) break;
            const float *xt = x + (size_t)t * xs + i0;
            float xv[VEC];
            if (n == VEC && xvec) {
#pragma unroll
                for (int e = 0; e < VEC; e += 4) {
                    const float4 f = *(const float4 *)(xt + e);
                    xv[e] = f.x; xv[e + 1] = f.y; xv[e + 2] = f.z; xv[e + 3] = f.w;
                }
            } else {
#pragma unroll
                for (int e = 0; e < VEC; e++) xv[e] = e < n ? xt[e] : 0.0f;
            }
#pragma unroll
            for (int e = 0; e < VEC; e++)
                if (e < n) acc[t] += wf[e] * xv[e];
        }
    }
}

// One full dot (a single vector): the lane partials of sd_row_dot folded by sd_warp_sum. Every
// lane returns the value. Whole warp must call it.
template <bool BF16>
__device__ __forceinline__ float sd_warp_dot(const void *W, int cols, int row, const float *x) {
    float acc[1] = {0.0f};
    sd_row_dot<1, BF16>(W, cols, row, x, 0, 1, acc);
    return sd_warp_sum(acc[0]);
}
// The same with the weight dtype known only at run time (warp-uniform branch).
__device__ __forceinline__ float sd_warp_dot_dt(const void *W, bool bf16, int cols, int row, const float *x) {
    return bf16 ? sd_warp_dot<true>(W, cols, row, x) : sd_warp_dot<false>(W, cols, row, x);
}
