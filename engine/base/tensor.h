// tensor.h — the element types and the matrix view every layer shares: the CPU ops, the weight
// table, the file formats and the GPU kernels. Plain C, no dependencies.
#pragma once
#include <stddef.h>
#include <stdint.h>

// The dtypes a safetensors file may hold that specdec reads or writes.
typedef enum { SD_DT_F32, SD_DT_BF16, SD_DT_F16, SD_DT_F64, SD_DT_I32, SD_DT_I64 } sd_dtype;

size_t sd_dtype_size(sd_dtype dt);
const char *sd_dtype_name(sd_dtype dt); // "F32", "BF16", ...

// A Linear weight [rows = out, cols = in], row-major, F32 or BF16 as loaded (BF16 is widened
// exactly to f32 inside the dot). data is host or device memory, as the owner says.
typedef struct {
    sd_dtype dtype; // SD_DT_F32 or SD_DT_BF16
    const void *data;
    int rows, cols;
} sd_mat;

// bf16 ↔ f32 (round to nearest even; NaN stays NaN).
static inline float sd_bf16_to_f32(uint16_t h) {
    union { uint32_t u; float f; } v = {.u = (uint32_t)h << 16};
    return v.f;
}
static inline uint16_t sd_f32_to_bf16(float f) {
    union { float f; uint32_t u; } v = {.f = f};
    if ((v.u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((v.u >> 16) | 0x40);
    return (uint16_t)((v.u + 0x7fffu + ((v.u >> 16) & 1u)) >> 16);
}
// f16 → f32, exact (subnormals included).
float sd_f16_to_f32(uint16_t h);
