// kda_scan.h — the KDA recurrence of one head (MODEL.md "KDA", after the gates) in its two forms:
// token by token (sd_kda_step, kda.c: what decode and verify run) and chunk-wise (sd_kda_chunk_head,
// kda_chunk.c: the WY form a long prompt runs, equal to the token form within fp32 rounding).
//
// Per token t, with q_t, k_t already L2-normalised, g_t ≤ 0 the log decay along the key dimension
// and β_t the post-sigmoid gate:
//     S ← Diag(exp(g_t)) S;   u = β_t (v_t − Sᵀ k_t);   S ← S + k_t uᵀ;   o_t = Sᵀ (q_t · d^-0.5)
// S is d×d fp32, S[i][j]: key dimension i, value dimension j.
#pragma once
#include <stddef.h>

// One token of one head: S_dst = decay(S_src) + the rank-1 correction (S_dst may not alias S_src),
// o = S_dstᵀ (q · d^-0.5). Sums over the key index i run in increasing i.
void sd_kda_step(const float *S_src, float *S_dst, const float *q, const float *k, const float *v, const float *g,
                 float beta, int d, float *o);

// T tokens of one head chunk-wise, `chunk` tokens a chunk (the last may be shorter). S (d×d) holds
// the state before the first token and is left holding the state after the last. Token t's q, k,
// v, g are rows of stride ld (q + t·ld ...), its β is beta[t·ldb], its output row o + t·ld.
//
// Within a chunk, positions r = 0..L-1, G_r = Σ_{s≤r} g_s (per key dimension, ≤ 0 and
// decreasing), S_0 the state before the chunk:
//   A_rs   = β_r Σ_i k_r,i k_s,i exp(G_r,i − G_s,i)           s < r  (strictly lower)
//   Aqk_rs =     Σ_i q_r,i k_s,i exp(G_r,i − G_s,i)           s ≤ r
//   (I + A) [U0 | W] = [β v | β exp(G) ⊙ k]                    (forward substitution)
//   U   = U0 − W S_0                                            (the chunk's delta-rule corrections u_r)
//   o_r = d^-0.5 (Σ_i exp(G_r,i) q_r,i S_0[i][·] + Σ_{s≤r} Aqk_rs U_s)
//   S_L = Diag(exp(G_L−1)) S_0 + Σ_s (exp(G_L−1 − G_s) ⊙ k_s) U_sᵀ
// Every exponent is ≤ 0 (differences of G taken per element, never exp(−G)), so nothing
// overflows however strong the decay. Work buffers are the caller's: sd_kda_chunk_work_floats.
void sd_kda_chunk_head(float *S, const float *q, const float *k, const float *v, const float *g, const float *beta,
                       int T, int d, int chunk, size_t ld, size_t ldb, float *o, float *work);
size_t sd_kda_chunk_work_floats(int d, int chunk);
