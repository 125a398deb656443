// mma.cuh — the tensor-core pieces of the prefill's flash attention (mla_prefill.cu):
// ldmatrix loads of 8 × 8 bf16 matrices from shared memory and mma.sync.m16n8k16 with bf16
// operands and f32 accumulation. Fragment layouts (PTX ISA, "mma.m16n8k16"): lane = 4g + t;
//   A (16 × 16, row): a0 = (g, 2t..2t+1), a1 = (g+8, 2t..), a2 = (g, 2t+8..), a3 = (g+8, 2t+8..)
//   B (16 × 8, col):  b0 = (k 2t..2t+1, n g), b1 = (k 2t+8..2t+9, n g)
//   C (16 × 8):       c0, c1 = (g, 2t..2t+1), c2, c3 = (g+8, 2t..2t+1)
// (the lower k index in the lower 16 bits of each 32-bit register).
#pragma once
#include <stdint.h>

// Four 8 × 8 matrices, lane l giving the address of row l % 8 of matrix l / 8 (16-byte aligned);
// register i holds matrix i's (row g, columns 2t..2t+1).
__device__ __forceinline__ void sd_ldsm_x4(uint32_t (&r)[4], const void *p) {
    const unsigned a = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
}
// The same transposed: register i holds matrix i's (rows 2t..2t+1, column g).
__device__ __forceinline__ void sd_ldsm_x4_trans(uint32_t (&r)[4], const void *p) {
    const unsigned a = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
}
// Two matrices transposed (lanes 0..15's addresses).
__device__ __forceinline__ void sd_ldsm_x2_trans(uint32_t (&r)[2], const void *p) {
    const unsigned a = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];" : "=r"(r[0]), "=r"(r[1]) : "r"(a));
}
// d += A · B for one 16 × 8 × 16 step.
__device__ __forceinline__ void sd_mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
                 "{%0, %1, %2, %3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
