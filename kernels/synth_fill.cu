// synth_fill.cu — one thread per 4-element block of the Philox counter (one generator call, four
// values), grid-stride; the arithmetic of engine/synth.c's fill() with explicit round-to-nearest
// intrinsics (exact u, then one rounding for the product and one for the sum) and the bf16
// rounding of tensor.h's sd_f32_to_bf16.
#include "synth_fill.h"
#include "common.cuh"
#include "philox.h" // sd_philox4x32_10, sd_u32_to_unit, SD_DRAW_INIT

// tensor.h sd_f32_to_bf16 on the device.
__device__ __forceinline__ uint16_t synth_bf16(float f) {
    const uint32_t u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

template <bool BF16>
static __global__ void synth_fill_kernel(void *__restrict__ dst, int64_t n, uint32_t k0, uint32_t k1, uint32_t name_hash,
                                         float scale, float offset) {
    const int64_t nblk = (n + 3) / 4;
    const uint32_t key[2] = {k0, k1};
    for (int64_t blk = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; blk < nblk; blk += (int64_t)gridDim.x * blockDim.x) {
        const uint32_t ctr[4] = {(uint32_t)blk, (uint32_t)((uint64_t)blk >> 32), name_hash, SD_DRAW_INIT};
        const sd_philox_out r = sd_philox4x32_10(ctr, key);
        float v[4];
#pragma unroll
        for (int l = 0; l < 4; l++) {
            const float u = __fsub_rn(__fmul_rn(2.0f, sd_u32_to_unit(r.v[l])), 1.0f);
            v[l] = __fadd_rn(__fmul_rn(u, scale), offset);
        }
        const int64_t e0 = blk * 4;
        if (e0 + 4 <= n) {
            if (BF16) {
                const uint2 p = {(uint32_t)synth_bf16(v[0]) | (uint32_t)synth_bf16(v[1]) << 16,
                                 (uint32_t)synth_bf16(v[2]) | (uint32_t)synth_bf16(v[3]) << 16};
                ((uint2 *)dst)[blk] = p;
            } else {
                ((float4 *)dst)[blk] = make_float4(v[0], v[1], v[2], v[3]);
            }
        } else {
            for (int l = 0; e0 + l < n; l++) {
                if (BF16) ((uint16_t *)dst)[e0 + l] = synth_bf16(v[l]);
                else ((float *)dst)[e0 + l] = v[l];
            }
        }
    }
}

extern "C" sd_code sd_cuda_synth_fill(void *dst, int64_t n, bool bf16, uint64_t seed, uint32_t name_hash, float scale,
                                      float offset, cudaStream_t stream, sd_status *st) {
    SD_NVTX("sd_cuda_synth_fill");
    if (n <= 0) return SD_OK;
    if (((uintptr_t)dst & (bf16 ? 7 : 15)) != 0)
        return sd_fail(st, SD_ERR_USAGE, "cuda synth: destination %p is not %d-byte aligned", dst, bf16 ? 8 : 16);
    const int64_t nblk = (n + 3) / 4;
    const int blocks = (int)(nblk < (int64_t)4096 * 256 ? (nblk + 255) / 256 : 4096);
    const uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
    if (bf16) synth_fill_kernel<true><<<blocks, 256, 0, stream>>>(dst, n, k0, k1, name_hash, scale, offset);
    else synth_fill_kernel<false><<<blocks, 256, 0, stream>>>(dst, n, k0, k1, name_hash, scale, offset);
    SD_LAUNCH_CHECK(st);
    return SD_OK;
}

// One thread per destination element: its source element's Philox block, the word it needs.
template <bool BF16>
static __global__ void synth_slice_kernel(void *__restrict__ dst, int64_t n, uint32_t k0, uint32_t k1, uint32_t name_hash,
                                          float scale, float offset, int64_t base, int64_t width, int64_t stride) {
    const uint32_t key[2] = {k0, k1};
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t e = base + (i / width) * stride + i % width, blk = e / 4;
        const uint32_t ctr[4] = {(uint32_t)blk, (uint32_t)((uint64_t)blk >> 32), name_hash, SD_DRAW_INIT};
        const sd_philox_out r = sd_philox4x32_10(ctr, key);
        const float u = __fsub_rn(__fmul_rn(2.0f, sd_u32_to_unit(r.v[e % 4])), 1.0f);
        const float v = __fadd_rn(__fmul_rn(u, scale), offset);
        if (BF16) ((uint16_t *)dst)[i] = synth_bf16(v);
        else ((float *)dst)[i] = v;
    }
}

extern "C" sd_code sd_cuda_synth_fill_slice(void *dst, int64_t n, bool bf16, uint64_t seed, uint32_t name_hash, float scale,
                                            float offset, int64_t base, int64_t width, int64_t stride, cudaStream_t stream,
                                            sd_status *st) {
    SD_NVTX("sd_cuda_synth_fill_slice");
    if (n <= 0) return SD_OK;
    if (base < 0 || width < 1 || stride < width)
        return sd_fail(st, SD_ERR_USAGE, "cuda synth: slice base %lld width %lld stride %lld", (long long)base, (long long)width,
                       (long long)stride);
    if (base == 0 && width == stride) return sd_cuda_synth_fill(dst, n, bf16, seed, name_hash, scale, offset, stream, st);
    const int blocks = (int)(n < (int64_t)4096 * 256 ? (n + 255) / 256 : 4096);
    const uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
    if (bf16) synth_slice_kernel<true><<<blocks, 256, 0, stream>>>(dst, n, k0, k1, name_hash, scale, offset, base, width, stride);
    else synth_slice_kernel<false><<<blocks, 256, 0, stream>>>(dst, n, k0, k1, name_hash, scale, offset, base, width, stride);
    SD_LAUNCH_CHECK(st);
    return SD_OK;
}
