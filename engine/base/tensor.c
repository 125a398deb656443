// tensor.c — dtype sizes and names, f16 widening (tensor.h).
#include "tensor.h"

size_t sd_dtype_size(sd_dtype dt) {
    switch (dt) {
    case SD_DT_BF16: case SD_DT_F16: return 2;
    case SD_DT_F32: case SD_DT_I32: return 4;
    case SD_DT_F64: case SD_DT_I64: return 8;
    }
    return 0; // not a dtype
}

const char *sd_dtype_name(sd_dtype dt) {
    switch (dt) {
    case SD_DT_F32: return "F32";
    case SD_DT_BF16: return "BF16";
    case SD_DT_F16: return "F16";
    case SD_DT_F64: return "F64";
    case SD_DT_I32: return "I32";
    case SD_DT_I64: return "I64";
    }
    return "?";
}

float sd_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h >> 15) << 31, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
    union { uint32_t u; float f; } v;
    if (exp == 0) { // zero or subnormal: man · 2^-24, exact in f32
        float f = (float)man * (1.0f / 16777216.0f);
        return sign ? -f : f;
    }
    if (exp == 31) v.u = sign | 0x7f800000u | (man << 13);
    else v.u = sign | ((exp + 112) << 23) | (man << 13);
    return v.f;
}
