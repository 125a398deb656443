// philox.h — Philox-4x32-10 (Salmon et al., SC'11; the generator of cuRAND and JAX), a
// counter-based generator: the draw for (seed, round, position, purpose) is a pure function of
// those four numbers, so the CPU and the GPU backends draw the same uniforms in any order.
#pragma once
#include <stdint.h>

#ifdef __CUDACC__
#define SD_HD __host__ __device__
#else
#define SD_HD
#endif

typedef enum {
    SD_DRAW_DRAFT = 0,  // the draft samples d_i from q_i
    SD_DRAW_ACCEPT = 1, // the accept/reject test of d_i
    SD_DRAW_BONUS = 2,  // the bonus token (residual or p_k)
    SD_DRAW_DECODE = 3, // plain sampled decode
    SD_DRAW_INIT = 4,   // `specdec init` weight synthesis
} sd_draw_purpose;

typedef struct { uint32_t v[4]; } sd_philox_out;

static inline SD_HD uint32_t sd_mulhilo32(uint32_t a, uint32_t b, uint32_t *hi) {
    uint64_t p = (uint64_t)a * b;
    *hi = (uint32_t)(p >> 32);
    return (uint32_t)p;
}

// Ten rounds of Philox-4x32 on counter c with key k (the reference constants).
static inline SD_HD sd_philox_out sd_philox4x32_10(const uint32_t c_in[4], const uint32_t k_in[2]) {
    uint32_t c0 = c_in[0], c1 = c_in[1], c2 = c_in[2], c3 = c_in[3];
    uint32_t k0 = k_in[0], k1 = k_in[1];
    for (int r = 0; r < 10; r++) {
        uint32_t hi0, hi1;
        uint32_t lo0 = sd_mulhilo32(0xD2511F53u, c0, &hi0);
        uint32_t lo1 = sd_mulhilo32(0xCD9E8D57u, c2, &hi1);
        uint32_t n0 = hi1 ^ c1 ^ k0, n1 = lo1, n2 = hi0 ^ c3 ^ k1, n3 = lo0;
        c0 = n0; c1 = n1; c2 = n2; c3 = n3;
        k0 += 0x9E3779B9u;
        k1 += 0xBB67AE85u;
    }
    sd_philox_out o = {{c0, c1, c2, c3}};
    return o;
}

// A uniform float in [0, 1) with 24 random bits (exact in float on every machine).
static inline SD_HD float sd_u32_to_unit(uint32_t x) { return (float)(x >> 8) * (1.0f / 16777216.0f); }

// The draw keyed by (seed, round, position, purpose): counter = (round, position, purpose, 0),
// key = the seed's two 32-bit halves; the first output word.
static inline SD_HD float sd_uniform(uint64_t seed, uint32_t round, uint32_t pos, uint32_t purpose) {
    uint32_t c[4] = {round, pos, purpose, 0};
    uint32_t k[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
    return sd_u32_to_unit(sd_philox4x32_10(c, k).v[0]);
}
