// kda_chunk.c — the KDA recurrence of one head in its chunked (WY) form on the CPU (kda_scan.h
// states the algebra). The reference the device's chunked kernels (kernels/kda_prefill.cu) mirror,
// step for step: fp32 throughout, every sum in increasing index order.
#include <math.h>
#include "kda_scan.h"

size_t sd_kda_chunk_work_floats(int d, int chunk) {
    const size_t L = (size_t)chunk, D = (size_t)d;
    return L * D        // G
           + 2 * L * L  // A, Aqk
           + 2 * L * D  // X = [U0 | W] (L × 2d)
           + L * D;     // U
}

// One chunk of L tokens (rows of stride ld), S in place.
static void chunk_step(float *S, const float *q, const float *k, const float *v, const float *g, const float *beta,
                       int L, int d, size_t ld, size_t ldb, float *o, float *work) {
    float *G = work, *A = G + (size_t)L * d, *Aqk = A + (size_t)L * L, *X = Aqk + (size_t)L * L, *U = X + (size_t)L * 2 * d;
    const float scale = 1.0f / sqrtf((float)d);
    // G_r = Σ_{s≤r} g_s, per key dimension.
    for (int r = 0; r < L; r++)
        for (int i = 0; i < d; i++) G[(size_t)r * d + i] = (r ? G[(size_t)(r - 1) * d + i] : 0.0f) + g[r * ld + i];
    // A (strictly lower, β_r folded in) and Aqk (lower with the diagonal).
    for (int r = 0; r < L; r++) {
        const float *Gr = G + (size_t)r * d, *kr = k + r * ld, *qr = q + r * ld;
        for (int s = 0; s <= r; s++) {
            const float *Gs = G + (size_t)s * d, *ks = k + s * ld;
            float akk = 0.0f, aqk = 0.0f;
            for (int i = 0; i < d; i++) {
                const float e = expf(Gr[i] - Gs[i]) * ks[i];
                akk += kr[i] * e;
                aqk += qr[i] * e;
            }
            A[(size_t)r * L + s] = s < r ? beta[r * ldb] * akk : 0.0f;
            Aqk[(size_t)r * L + s] = aqk;
        }
    }
    // (I + A) X = [β v | β exp(G) ⊙ k], by forward substitution: X_r = B_r − Σ_{s<r} A_rs X_s.
    for (int r = 0; r < L; r++) {
        float *Xr = X + (size_t)r * 2 * d;
        const float b = beta[r * ldb];
        for (int j = 0; j < d; j++) {
            Xr[j] = b * v[r * ld + j];
            Xr[d + j] = b * (expf(G[(size_t)r * d + j]) * k[r * ld + j]);
        }
        for (int s = 0; s < r; s++) {
            const float a = A[(size_t)r * L + s];
            const float *Xs = X + (size_t)s * 2 * d;
            for (int j = 0; j < 2 * d; j++) Xr[j] -= a * Xs[j];
        }
    }
    // U = U0 − W S_0, then the outputs from S_0 and U.
    for (int r = 0; r < L; r++) {
        const float *Xr = X + (size_t)r * 2 * d, *Wr = Xr + d, *Gr = G + (size_t)r * d, *qr = q + r * ld;
        float *Ur = U + (size_t)r * d;
        for (int j = 0; j < d; j++) Ur[j] = 0.0f;
        for (int i = 0; i < d; i++)
            for (int j = 0; j < d; j++) Ur[j] += Wr[i] * S[(size_t)i * d + j];
        for (int j = 0; j < d; j++) Ur[j] = Xr[j] - Ur[j];
        float *orow = o + r * ld;
        for (int j = 0; j < d; j++) orow[j] = 0.0f;
        for (int i = 0; i < d; i++) {
            const float qi = expf(Gr[i]) * qr[i];
            for (int j = 0; j < d; j++) orow[j] += qi * S[(size_t)i * d + j];
        }
        for (int s = 0; s <= r; s++) {
            const float a = Aqk[(size_t)r * L + s];
            const float *Us = U + (size_t)s * d;
            for (int j = 0; j < d; j++) orow[j] += a * Us[j];
        }
        for (int j = 0; j < d; j++) orow[j] *= scale;
    }
    // S_L = Diag(exp(G_L−1)) S_0 + Σ_s (exp(G_L−1 − G_s) ⊙ k_s) U_sᵀ, element by element in place.
    const float *GL = G + (size_t)(L - 1) * d;
    for (int i = 0; i < d; i++) {
        float *Si = S + (size_t)i * d;
        const float decay = expf(GL[i]);
        for (int j = 0; j < d; j++) Si[j] *= decay;
        for (int s = 0; s < L; s++) {
            const float kb = expf(GL[i] - G[(size_t)s * d + i]) * k[s * ld + i];
            const float *Us = U + (size_t)s * d;
            for (int j = 0; j < d; j++) Si[j] += kb * Us[j];
        }
    }
}

void sd_kda_chunk_head(float *S, const float *q, const float *k, const float *v, const float *g, const float *beta,
                       int T, int d, int chunk, size_t ld, size_t ldb, float *o, float *work) {
    for (int t0 = 0; t0 < T; t0 += chunk) {
        const int L = T - t0 < chunk ? T - t0 : chunk;
        const size_t r0 = (size_t)t0 * ld;
        chunk_step(S, q + r0, k + r0, v + r0, g + r0, beta + (size_t)t0 * ldb, L, d, ld, ldb, o + r0, work);
    }
}
