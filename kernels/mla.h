// mla.h — multi-head latent attention on the GPU, absorbed form (MODEL.md "MLA"; the CPU op:
// engine/cpu/mla.c). Every pointer is device memory; cache rows are absolute positions (state.h).
#pragma once
#include <cuda_runtime_api.h> // cudaStream_t
#include <stdbool.h>

#ifdef __cplusplus
extern "C" {
#endif
#include "cursor.h" // sd_dev_pos
#include "tensor.h"    // sd_mat
#include "status.h" // sd_code, sd_status

// The most chunks the attention cuts a token's cache rows into: sizes the partials `part` below.
#define SD_MLA_SPLIT 32

// Positions come from device memory (sd_dev_pos: a state's cursor, cursor.h), read by the kernels.
//
// The cache write for positions pos0 .. pos0+T-1, folded into the attention's first launch:
// c[pos] = rmsnorm(kv[t][0..R), kv_norm, eps), kpe[pos] = kv[t][R..R+dr); with rope
// (mla_use_nope false) kpe[pos] and every head's rope part of mq[t] (T, Hm·(dn+dr)) are rotated
// in place: interleaved pairs (2i, 2i+1) by the angle pos·θ^(-2i/dr), computed in double on the
// device and rounded to float once — the CPU's formula (engine/cpu/mla.c rope), evaluated with the
// device's double pow/cos/sin.
typedef struct {
    const float *kv;      // (T, R + dr) the kv_a projection
    const float *kv_norm; // (R)
    float eps;
    bool rope;
    double theta;
} sd_mla_write;

// Attention of the T query tokens at pos0 .. pos0+T-1 over cache rows 0 .. their own position
// (after the cache write `write`, or none when NULL):
// q̃_h = W_UK,hᵀ qn_h; score_j = (q̃_h·c_j + qp_h·kpe_j)·(dn+dr)^-0.5; softmax; lat = Σ_j p_j c_j;
// mo[t][h] = W_UV,h · lat (dv). kv_b (Hm·(dn+dv), R), R <= 512, dr <= 128, dn <= 512. Three
// launches (kernels/mla.cu): q̃ into qabs (T, Hm, R); a flash-decoding split of each token's rows
// into at most SD_MLA_SPLIT chunks by its position alone, partials into part
// (T, Hm, SD_MLA_SPLIT, R + 2); the chunks merged in chunk order and W_UV applied. Bitwise the
// same for a token alone or inside a T-token call. Hm = 0 (a tensor-parallel rank holding no MLA
// head) launches nothing, the cache write included: no head of the rank ever reads those rows. settled: the cursor and the cache rows before
// pos0 were written before the forward began (its stream drained: the layer walk), so the split
// starts copying those rows before it waits for its predecessor (pdl.h); false: after.
sd_code sd_cuda_mla_attend(float *mq, const sd_mat *kv_b, float *c, float *kpe, int T, int Hm, int dn, int dr, int dv, int R,
                           sd_dev_pos pos0, bool settled, const sd_mla_write *write, float *qabs, float *part, float *mo,
                           cudaStream_t stream, sd_status *st);

#ifdef __cplusplus
}
#endif
