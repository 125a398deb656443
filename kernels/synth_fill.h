// synth_fill.h — engine/synth.c's weight generator on the GPU: one tensor's elements written
// straight into device memory (no host copy), the same bytes as the host's fill().
#pragma once
#include <cuda_runtime_api.h> // cudaStream_t
#include <stdbool.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif
#include "status.h" // sd_code, sd_status

// Element e of n: Philox-4x32-10 with key = (seed low, seed high) and counter = (e/4 low, e/4
// high, name_hash, SD_DRAW_INIT), word e%4 → u = 2·(x>>8)·2^-24 − 1 → v = u·scale + offset (two
// roundings), stored as bf16 (round to nearest even, NaN kept) when bf16, else f32.
// dst: device memory, 8-byte aligned (bf16) or 16-byte aligned (f32) for the vector stores.
sd_code sd_cuda_synth_fill(void *dst, int64_t n, bool bf16, uint64_t seed, uint32_t name_hash, float scale,
                           float offset, cudaStream_t stream, sd_status *st);

// A slice of a larger tensor (a tensor-parallel rank's shard, synthesised where it lives): dst
// element i of n gets the value the whole tensor's fill gives its element
// e = base + (i / width) · stride + i % width — a row range (width = stride = the row length,
// base = first row · stride), a column range (width: the slice's columns, stride: the tensor's,
// base: the first column) or a span of a vector (width = stride). The same bytes as the whole
// tensor's sd_cuda_synth_fill (and the host's fill) at those elements.
sd_code sd_cuda_synth_fill_slice(void *dst, int64_t n, bool bf16, uint64_t seed, uint32_t name_hash, float scale,
                                 float offset, int64_t base, int64_t width, int64_t stride, cudaStream_t stream,
                                 sd_status *st);

#ifdef __cplusplus
}
#endif
