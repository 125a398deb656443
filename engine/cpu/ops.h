// ops.h — the CPU reference ops. Plain C, fp32 arithmetic, and one fixed accumulation order per
// op (stated beside each), so that a token's result never depends on how many tokens share the
// call or how many threads run it: the verify ≡ decode law holds bit for bit on the CPU.
#pragma once
#include <math.h>
#include <stdint.h>
#include "tensor.h" // sd_mat, sd_dtype, bf16/f16 conversions

// Dot products. Accumulation order (the contract every caller relies on): 16 partial sums,
// element i added to partial i % 16 in increasing i; then the partials are folded as a tree
// (p[l] += p[l+8], then +4, +2, +1). No FMA contraction (the build passes -ffp-contract=off).
float sd_dot_f32(const float *a, const float *b, int n);
float sd_dot_bf16(const uint16_t *w, const float *x, int n);
float sd_mat_dot_row(const sd_mat *m, int row, const float *x); // row · x

// Widen one row to f32.
void sd_mat_row_f32(const sd_mat *m, int row, float *out);

// y[t, o] = W[o] · x[t] for t < T: every element is one sd_mat_dot_row, whatever T and the
// thread count (threads split the rows; each row's weights are read once for all T tokens).
void sd_linear(const sd_mat *w, const float *x, int T, float *y);

// out = x / sqrt(sum(x²)/n + eps) ⊙ w, with sum(x²) = sd_dot_f32(x, x, n); out may alias x.
void sd_rmsnorm(const float *x, const float *w, int n, float eps, float *out);

// Scalar activations, one definition each so every op rounds alike.
static inline float sd_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }
static inline float sd_silu(float x) { return x * sd_sigmoid(x); }
// log(1 + e^x); for x > 20 it equals x in fp32.
static inline float sd_softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

// Work (multiply-adds) below which an op stays on the calling thread: waking the team and the
// closing barrier cost more than they save. Measured on the 2-core machine (toy plain decode,
// quiet machine): 2^14 ~250, 2^16 ~290-320, 2^17 ~170, 2^20 ~145 tokens/s. A machine whose cores
// are busy with other work loses much more to the team's barriers. Results never depend on
// this (threads only split independent outputs).
#define SD_PARALLEL_MIN_WORK (1L << 16)
