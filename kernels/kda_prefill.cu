// kda_prefill.cu — KDA over a long prompt (kda_prefill.h): conv + gates, the conv ring write, the
// chunked recurrence in two launches, the gated output norm.
//
// The chunked recurrence mirrors engine/cpu/kda_chunk.c step for step (kda_scan.h: the algebra):
//   prep (grid chunks × heads, 256 threads): G = cumsum(g) per key dimension, the pairs s ≤ r of
//        A = β k̃·k̂ and Aqk = q̃·k̂ in 2 × 2 tiles with exp(G_r − G_s) taken per element (never
//        exp(−G): no overflow at any decay), the decayed queries exp(G) ⊙ q, keys exp(G_last − G)
//        ⊙ k and the chunk's decay exp(G_last) to global memory; then the forward substitution
//        (I + A)[U0 | W] = [βv | β exp(G) ⊙ k], its right-hand sides written in place first (U0's
//        over the queries' rows, done with by then; W's over the keys they are made from) and one
//        thread per column after, so the solve needs no barrier and two blocks share a
//        multiprocessor;
//   scan (grid heads × value-column blocks of BV, chunk after chunk): S[:, block] in shared
//        memory; U = U0 − W S, o = d^-0.5 (q̃ S + Aqk U), S ← Diag(exp(G_last)) S + K̄ᵀ U. Each
//        thread owns one column and a set of rows, so every weight-like operand read from shared
//        memory is a broadcast within a warp; the next chunk's tiles are copied in
//        (cp.async) while the current one is used.
// Sums run in the CPU twin's index order; the hot loops use fmaf (one rounding, twice the rate of
// the mul + add that --fmad=false would otherwise give).
#include "common.cuh" // sd_block_sum, sd_dev_silu, sd_dev_sigmoid, sd_dev_softplus, SD_NVTX, sd_ceil_div
#include <cuda_bf16.h>
#include <cuda_pipeline.h> // __pipeline_memcpy_async
#include "kda_prefill.h"

#define KDA_CHUNK SD_KDA_CHUNK

// ---------------------------------------------------------------------------- (a) conv + gates
#define CONV_THREADS 128

static __global__ void __launch_bounds__(CONV_THREADS)
conv_kernel(const float *__restrict__ qkv, const float *__restrict__ ring, int n_rows, int pos0, int H, int d, int W,
            const float *__restrict__ q_conv, const float *__restrict__ k_conv, const float *__restrict__ v_conv,
            const float *__restrict__ A_log, const float *__restrict__ dt_bias, float *gate, float *beta, int ld_b,
            float *__restrict__ qkvc) {
    __shared__ float sh[32];
    const int t = blockIdx.x, h = blockIdx.y, P = H * d, pos = pos0 + t;
    const size_t row3 = (size_t)3 * P;
    const float *taps[3] = {q_conv, k_conv, v_conv};
    float ssq = 0.0f, ssk = 0.0f;
    const float decay_scale = -expf(A_log[h]);
    for (int c = threadIdx.x; c < d; c += CONV_THREADS) {
        const int ch = h * d + c;
        for (int which = 0; which < 3; which++) {
            float acc = 0.0f;
            for (int j = 0; j < W; j++) {
                const int p = pos - (W - 1) + j;
                if (p < 0) continue;
                const float *row = p >= pos0 ? qkv + (size_t)(p - pos0) * row3 : ring + (size_t)(p % n_rows) * row3;
                acc += taps[which][(size_t)ch * W + j] * row[which * P + ch];
            }
            const float y = sd_dev_silu(acc);
            qkvc[(size_t)t * row3 + which * P + ch] = y;
            if (which == 0) ssq += y * y;
            if (which == 1) ssk += y * y;
        }
        float *gp = gate + (size_t)t * P + ch;
        *gp = decay_scale * sd_dev_softplus(*gp + dt_bias[ch]);
    }
    const float inv_q = 1.0f / sqrtf(sd_block_sum(ssq, sh) + 1e-6f);
    const float inv_k = 1.0f / sqrtf(sd_block_sum(ssk, sh) + 1e-6f);
    for (int c = threadIdx.x; c < d; c += CONV_THREADS) { // each thread rescales what it wrote
        float *qk = qkvc + (size_t)t * row3 + h * d + c;
        qk[0] *= inv_q;
        qk[P] *= inv_k;
    }
    if (threadIdx.x == 0) beta[(size_t)t * ld_b + h] = sd_dev_sigmoid(beta[(size_t)t * ld_b + h]);
}

extern "C" sd_code sd_cuda_kda_prefill_conv(const float *qkv, const float *ring, int n_rows, int pos0, int T, int H, int d,
                                            int W, const float *q_conv, const float *k_conv, const float *v_conv,
                                            const float *A_log, const float *dt_bias, float *gate, float *beta, int ld_b,
                                            float *qkvc, cudaStream_t stream, sd_status *st) {
    SD_NVTX("sd_cuda_kda_prefill_conv");
    if (T < 1) return SD_OK;
    conv_kernel<<<dim3(T, H), CONV_THREADS, 0, stream>>>(qkv, ring, n_rows, pos0, H, d, W, q_conv, k_conv, v_conv, A_log,
                                                          dt_bias, gate, beta, ld_b, qkvc);
    SD_LAUNCH_CHECK(st);
    return SD_OK;
}

// ---------------------------------------------------------------------------- (b) ring rows
static __global__ void ring_kernel(const float *__restrict__ qkv, float *__restrict__ ring, int n_rows, int pos0, int t_first,
                                   int P) {
    const int t = t_first + blockIdx.x;
    const size_t n = (size_t)3 * P;
    const float *src = qkv + (size_t)t * n;
    float *dst = ring + (size_t)((pos0 + t) % n_rows) * n;
    for (size_t i = threadIdx.x; i < n; i += blockDim.x) dst[i] = src[i];
}

extern "C" sd_code sd_cuda_kda_prefill_ring(const float *qkv, float *ring, int n_rows, int pos0, int T, int P, int W,
                                            cudaStream_t stream, sd_status *st) {
    const int keep = T < W - 1 ? T : W - 1;
    if (keep < 1) return SD_OK;
    ring_kernel<<<keep, 256, 0, stream>>>(qkv, ring, n_rows, pos0, T - keep, P);
    SD_LAUNCH_CHECK(st);
    return SD_OK;
}

// ---------------------------------------------------------------------------- (c) the chunks
// Work layout (floats): W, U0, K̄, q̃ (T, P) each at head h column h·d; Aqk (chunks, H, 64, 64);
// the chunks' decays exp(G_last) (chunks, H, d).
static size_t n_chunks(int T) { return (size_t)(T + KDA_CHUNK - 1) / KDA_CHUNK; }
extern "C" size_t sd_cuda_kda_chunk_work_floats(int T, int H, int d) {
    const size_t P = (size_t)H * d, nc = n_chunks(T);
    return 4 * (size_t)T * P + nc * H * KDA_CHUNK * KDA_CHUNK + nc * H * d;
}

#define PREP_THREADS 256

static size_t prep_smem(int d) {
    const size_t L = KDA_CHUNK;
    return sizeof(float) * (3 * L * (d + 1) + L * L);
}

static __global__ void __launch_bounds__(PREP_THREADS, 2)
prep_kernel(const float *__restrict__ q, const float *__restrict__ k, const float *__restrict__ v, int ld,
            const float *__restrict__ g, int ld_g, const float *__restrict__ beta, int ld_b, int T, int H, int d,
            float *__restrict__ Wm, float *__restrict__ U0, float *__restrict__ Kbar, float *__restrict__ Qt,
            float *__restrict__ Aqk, float *__restrict__ GL) {
    extern __shared__ float sm[];
    constexpr int L = KDA_CHUNK;
    const int c = blockIdx.x, h = blockIdx.y, t0 = c * L, Lc = T - t0 < L ? T - t0 : L, P = H * d, dp = d + 1;
    float *Ks = sm, *Qs = Ks + L * dp, *Gs = Qs + L * dp, *As = Gs + L * dp;
    const int tid = threadIdx.x;
    for (int idx = tid; idx < Lc * d; idx += PREP_THREADS) {
        const int r = idx / d, i = idx % d;
        const size_t o = (size_t)(t0 + r) * ld + (size_t)h * d + i;
        Ks[r * dp + i] = k[o];
        Qs[r * dp + i] = q[o];
        Gs[r * dp + i] = g[(size_t)(t0 + r) * ld_g + (size_t)h * d + i];
    }
    __syncthreads();
    for (int i = tid; i < d; i += PREP_THREADS) { // G_r = Σ_{s≤r} g_s
        float acc = 0.0f;
        for (int r = 0; r < Lc; r++) {
            acc += Gs[r * dp + i];
            Gs[r * dp + i] = acc;
        }
    }
    __syncthreads();
    // Pairs s ≤ r in 2 × 2 tiles (rows 2a, 2a+1 against 2b, 2b+1, b ≤ a), numbered row by row:
    // u = a(a+1)/2 + b. Each element's row operands serve two pairs and its column operands two.
    const int na = (Lc + 1) / 2, n_units = na * (na + 1) / 2;
    float *aqk_out = Aqk + ((size_t)c * H + h) * L * L;
    for (int u = tid; u < n_units; u += PREP_THREADS) {
        int a = (int)((sqrtf(8.0f * u + 1.0f) - 1.0f) * 0.5f);
        while (a * (a + 1) / 2 > u) a--;
        while ((a + 1) * (a + 2) / 2 <= u) a++;
        const int b = u - a * (a + 1) / 2, r0 = 2 * a, s0 = 2 * b;
        const int r1 = r0 + 1 < Lc ? r0 + 1 : r0, s1 = s0 + 1 < Lc ? s0 + 1 : s0; // a dead row or column repeats its twin
        const float *K0 = Ks + r0 * dp, *K1 = Ks + r1 * dp, *Q0 = Qs + r0 * dp, *Q1 = Qs + r1 * dp, *G0 = Gs + r0 * dp,
                    *G1 = Gs + r1 * dp, *Kc0 = Ks + s0 * dp, *Kc1 = Ks + s1 * dp, *Gc0 = Gs + s0 * dp, *Gc1 = Gs + s1 * dp;
        float akk00 = 0.0f, akk01 = 0.0f, akk10 = 0.0f, akk11 = 0.0f, aqk00 = 0.0f, aqk01 = 0.0f, aqk10 = 0.0f, aqk11 = 0.0f;
        for (int i = 0; i < d; i++) {
            const float k0 = K0[i], k1 = K1[i], q0 = Q0[i], q1 = Q1[i], g0 = G0[i], g1 = G1[i], kc0 = Kc0[i], kc1 = Kc1[i];
            const float gc0 = Gc0[i], gc1 = Gc1[i];
            const float e00 = __expf(g0 - gc0) * kc0, e01 = __expf(g0 - gc1) * kc1;
            const float e10 = __expf(g1 - gc0) * kc0, e11 = __expf(g1 - gc1) * kc1;
            akk00 = fmaf(k0, e00, akk00);
            aqk00 = fmaf(q0, e00, aqk00);
            akk01 = fmaf(k0, e01, akk01);
            aqk01 = fmaf(q0, e01, aqk01);
            akk10 = fmaf(k1, e10, akk10);
            aqk10 = fmaf(q1, e10, aqk10);
            akk11 = fmaf(k1, e11, akk11);
            aqk11 = fmaf(q1, e11, aqk11);
        }
        const float b0 = beta[(size_t)(t0 + r0) * ld_b + h], b1 = beta[(size_t)(t0 + r1) * ld_b + h];
        const float akk[2][2] = {{akk00, akk01}, {akk10, akk11}}, aqk[2][2] = {{aqk00, aqk01}, {aqk10, aqk11}};
        const float bb[2] = {b0, b1};
#pragma unroll
        for (int x = 0; x < 2; x++) {
            const int r = r0 + x;
            if (r >= Lc) continue;
#pragma unroll
            for (int y = 0; y < 2; y++) {
                const int sc = s0 + y;
                if (sc >= Lc || sc > r) continue;
                As[r * L + sc] = sc < r ? bb[x] * akk[x][y] : 0.0f;
                aqk_out[r * L + sc] = aqk[x][y];
            }
        }
    }
    // The decayed queries and keys and the chunk's decay (G only: no barrier needed).
    const float *Glast = Gs + (Lc - 1) * dp;
    for (int idx = tid; idx < Lc * d; idx += PREP_THREADS) {
        const int r = idx / d, i = idx % d;
        const size_t o = (size_t)(t0 + r) * P + (size_t)h * d + i;
        Qt[o] = __expf(Gs[r * dp + i]) * Qs[r * dp + i];
        Kbar[o] = __expf(Glast[i] - Gs[r * dp + i]) * Ks[r * dp + i];
    }
    for (int i = tid; i < d; i += PREP_THREADS) GL[((size_t)c * H + h) * d + i] = __expf(Glast[i]);
    __syncthreads(); // A complete; the queries' rows are free
    // The right-hand sides [βv | β exp(G) ⊙ k] in place, all rows at once: column j < d in Qs (row
    // pitch d), column d + i over Ks's column i (the key it is made from).
    for (int idx = tid; idx < Lc * d; idx += PREP_THREADS) {
        const int r = idx / d, i = idx % d;
        const float b = beta[(size_t)(t0 + r) * ld_b + h];
        Qs[r * d + i] = b * v[(size_t)(t0 + r) * ld + (size_t)h * d + i];
        Ks[r * dp + i] = b * (__expf(Gs[r * dp + i]) * Ks[r * dp + i]);
    }
    __syncthreads();
    // X_r = B_r − Σ_{s<r} A_rs X_s, one thread per column, in place over its right-hand side: only
    // the column's own thread reads or writes it from here on.
    for (int j = tid; j < 2 * d; j += PREP_THREADS) {
        float *X = j < d ? Qs + j : Ks + (j - d);
        const int xp = j < d ? d : dp;
        float *out = (j < d ? U0 + j : Wm + (j - d)) + (size_t)t0 * P + (size_t)h * d;
        for (int r = 0; r < Lc; r++) {
            float x = X[r * xp];
            const float *Ar = As + r * L;
            for (int s = 0; s < r; s++) x = fmaf(-Ar[s], X[s * xp], x);
            X[r * xp] = x;
            out[(size_t)r * P] = x;
        }
    }
}

// Sequential over chunks. NT threads: column col = tid % BV, row group rg = tid / BV of NG.
template <int D, int BV>
struct scan_shape {
    static constexpr int L = KDA_CHUNK;
    static constexpr int NT = D * BV < 256 ? D * BV : 256;
    static constexpr int NG = NT / BV;
    static constexpr int RU = L / NG; // rows of U (and o) a thread owns
    static constexpr int RS = D / NG; // rows of S a thread owns
    static constexpr int DP = D + 4;  // padded row of W, q̃, K̄ (16-byte aligned, rows 4 banks apart)
    static constexpr size_t smem() {
        return sizeof(float) * ((size_t)D * BV + 3 * (size_t)L * DP + (size_t)L * L + (size_t)L * BV + D);
    }
};

// Rows 0 .. Lc-1 of a chunk's (L, cols) tile of src (row stride ld) copied asynchronously into dst
// (row pitch pitch); rows past Lc zeroed. cols and both strides are multiples of 4 floats.
template <int NT>
static __device__ __forceinline__ void tile_async(float *dst, int pitch, const float *src, size_t ld, int cols, int Lc) {
    const int q = cols / 4;
    for (int idx = threadIdx.x; idx < KDA_CHUNK * q; idx += NT) {
        const int r = idx / q, c4 = (idx % q) * 4;
        if (r < Lc) __pipeline_memcpy_async(dst + r * pitch + c4, src + (size_t)r * ld + c4, 16);
        else *(float4 *)(dst + r * pitch + c4) = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
}

// Per chunk: phase 1 (U = U0 − W·S, q̃·S), phase 2 (the outputs), phase 3 (the state). The next
// chunk's W and q̃ are copied in while phases 2 and 3 run, its Aqk, K̄ and decay while phase 1 runs:
// each buffer is refilled once the phase that reads it is past a barrier.
template <int D, int BV>
static __global__ void __launch_bounds__(scan_shape<D, BV>::NT)
scan_kernel(const float *__restrict__ Wm, const float *__restrict__ U0, const float *__restrict__ Kbar,
            const float *__restrict__ Qt, const float *__restrict__ Aqk, const float *__restrict__ GL, int T, int H,
            const float *S_in, float *S_out, float *__restrict__ y, int ld_y, float scale) {
    using sh = scan_shape<D, BV>;
    constexpr int L = sh::L, NT = sh::NT, NG = sh::NG, RU = sh::RU, RS = sh::RS, DP = sh::DP;
    extern __shared__ __align__(16) float sm[];
    float *Ss = sm, *Ws = Ss + D * BV, *Qs = Ws + L * DP, *Kb = Qs + L * DP, *As = Kb + L * DP, *Us = As + L * L,
          *Gl = Us + L * BV;
    const int h = blockIdx.x, j0 = blockIdx.y * BV, tid = threadIdx.x, col = tid % BV, rg = tid / BV, P = H * D;
    const size_t S_off = (size_t)h * D * D;
    const int nc = (T + L - 1) / L;
    auto rows_of = [&](int c) { return T - c * L < L ? T - c * L : L; };
    auto load_wq = [&](int c) { // group A of chunk c: W, q̃
        const size_t o = (size_t)c * L * P + (size_t)h * D;
        tile_async<NT>(Ws, DP, Wm + o, P, D, rows_of(c));
        tile_async<NT>(Qs, DP, Qt + o, P, D, rows_of(c));
        __pipeline_commit();
    };
    auto load_akg = [&](int c) { // group B of chunk c: Aqk, K̄, the decay
        tile_async<NT>(As, L, Aqk + ((size_t)c * H + h) * L * L, L, L, rows_of(c));
        tile_async<NT>(Kb, DP, Kbar + (size_t)c * L * P + (size_t)h * D, P, D, rows_of(c));
        for (int i = tid; i < D / 4; i += NT) __pipeline_memcpy_async(Gl + 4 * i, GL + ((size_t)c * H + h) * D + 4 * i, 16);
        __pipeline_commit();
    };
    for (int idx = tid; idx < D * BV; idx += NT) Ss[idx] = S_in[S_off + (size_t)(idx / BV) * D + j0 + idx % BV];
    load_wq(0);
    load_akg(0);
    for (int c = 0; c < nc; c++) {
        const int t0 = c * L, Lc = rows_of(c);
        __pipeline_wait_prior(1); // this chunk's W and q̃ (its Aqk, K̄ may be in flight)
        __syncthreads();          // ... and every thread's copies of them, the state's last writes
        // U = U0 − W·S and q̃·S for the rows this thread owns.
        float u0[RU], u[RU], qs[RU];
#pragma unroll
        for (int m = 0; m < RU; m++) {
            const int r = rg + m * NG;
            u0[m] = r < Lc ? U0[(size_t)(t0 + r) * P + (size_t)h * D + j0 + col] : 0.0f;
            u[m] = qs[m] = 0.0f;
        }
        for (int i = 0; i < D; i += 4) { // four of S's rows a step: W's and q̃'s as one 16-byte broadcast
            const float s0 = Ss[i * BV + col], s1 = Ss[(i + 1) * BV + col], s2 = Ss[(i + 2) * BV + col],
                        s3 = Ss[(i + 3) * BV + col];
#pragma unroll
            for (int m = 0; m < RU; m++) {
                const int r = rg + m * NG;
                const float4 w = *(const float4 *)(Ws + r * DP + i), qv = *(const float4 *)(Qs + r * DP + i);
                u[m] = fmaf(w.w, s3, fmaf(w.z, s2, fmaf(w.y, s1, fmaf(w.x, s0, u[m]))));
                qs[m] = fmaf(qv.w, s3, fmaf(qv.z, s2, fmaf(qv.y, s1, fmaf(qv.x, s0, qs[m]))));
            }
        }
#pragma unroll
        for (int m = 0; m < RU; m++) {
            const int r = rg + m * NG;
            Us[r * BV + col] = r < Lc ? u0[m] - u[m] : 0.0f;
        }
        __pipeline_wait_prior(0); // this chunk's Aqk, K̄, decay
        __syncthreads();          // U complete; W, q̃ and every thread's reads of S done
        if (c + 1 < nc) load_wq(c + 1);
#pragma unroll
        for (int m = 0; m < RU; m++) {
            const int r = rg + m * NG;
            if (r >= Lc) continue;
            float acc = qs[m];
            for (int s = 0; s <= r; s++) acc = fmaf(As[r * L + s], Us[s * BV + col], acc);
            y[(size_t)(t0 + r) * ld_y + (size_t)h * D + j0 + col] = scale * acc;
        }
        // S ← exp(G_last) ⊙ S + K̄ᵀ U, each thread its own RS consecutive rows of its column (K̄'s
        // as 16-byte broadcasts where RS allows).
        float sn[RS];
        const int i0 = rg * RS;
#pragma unroll
        for (int m = 0; m < RS; m++) sn[m] = Gl[i0 + m] * Ss[(i0 + m) * BV + col];
        for (int s = 0; s < Lc; s++) {
            const float us = Us[s * BV + col];
            if constexpr (RS % 4 == 0) {
#pragma unroll
                for (int m = 0; m < RS; m += 4) {
                    const float4 kb = *(const float4 *)(Kb + s * DP + i0 + m);
                    sn[m] = fmaf(kb.x, us, sn[m]);
                    sn[m + 1] = fmaf(kb.y, us, sn[m + 1]);
                    sn[m + 2] = fmaf(kb.z, us, sn[m + 2]);
                    sn[m + 3] = fmaf(kb.w, us, sn[m + 3]);
                }
            } else {
#pragma unroll
                for (int m = 0; m < RS; m++) sn[m] = fmaf(Kb[s * DP + i0 + m], us, sn[m]);
            }
        }
#pragma unroll
        for (int m = 0; m < RS; m++) Ss[(i0 + m) * BV + col] = sn[m];
        __syncthreads(); // Aqk, K̄, the decay and U read
        if (c + 1 < nc) load_akg(c + 1);
    }
    for (int idx = tid; idx < D * BV; idx += NT) S_out[S_off + (size_t)(idx / BV) * D + j0 + idx % BV] = Ss[idx];
}

template <int D>
static sd_code launch_scan(const float *Wm, const float *U0, const float *Kbar, const float *Qt, const float *Aqk,
                           const float *GL, int T, int H, const float *S_in, float *S_out, float *y, int ld_y,
                           cudaStream_t stream, sd_status *st) {
    constexpr int BV = D < 32 ? D : 32;
    using sh = scan_shape<D, BV>;
    SD_CUDA_CHECK(st, sd_allow_smem((const void *)scan_kernel<D, BV>, sh::smem()));
    scan_kernel<D, BV><<<dim3(H, D / BV), sh::NT, sh::smem(), stream>>>(Wm, U0, Kbar, Qt, Aqk, GL, T, H, S_in, S_out, y,
                                                                        ld_y, 1.0f / sqrtf((float)D));
    SD_LAUNCH_CHECK(st);
    return SD_OK;
}

extern "C" sd_code sd_cuda_kda_chunk(const float *q, const float *k, const float *v, int ld, const float *g, int ld_g,
                                     const float *beta, int ld_b, int T, int H, int d, const float *S_in, float *S_out,
                                     float *y, int ld_y, float *work, cudaStream_t stream, sd_status *st) {
    SD_NVTX("sd_cuda_kda_chunk");
    if (T < 1) return SD_OK;
    if (d != 8 && d != 16 && d != 32 && d != 64 && d != 128)
        return sd_fail(st, SD_ERR_UNSUPPORTED, "cuda kda chunk: head dimension %d (supported: 8, 16, 32, 64, 128)", d);
    const size_t TP = (size_t)T * H * d, nc = n_chunks(T);
    float *Wm = work, *U0 = Wm + TP, *Kbar = U0 + TP, *Qt = Kbar + TP, *Aqk = Qt + TP, *GL = Aqk + nc * H * KDA_CHUNK * KDA_CHUNK;
    SD_CUDA_CHECK(st, sd_allow_smem((const void *)prep_kernel, prep_smem(d)));
    prep_kernel<<<dim3((unsigned)nc, H), PREP_THREADS, prep_smem(d), stream>>>(q, k, v, ld, g, ld_g, beta, ld_b, T, H, d, Wm,
                                                                              U0, Kbar, Qt, Aqk, GL);
    SD_LAUNCH_CHECK(st);
    switch (d) {
    case 8: return launch_scan<8>(Wm, U0, Kbar, Qt, Aqk, GL, T, H, S_in, S_out, y, ld_y, stream, st);
    case 16: return launch_scan<16>(Wm, U0, Kbar, Qt, Aqk, GL, T, H, S_in, S_out, y, ld_y, stream, st);
    case 32: return launch_scan<32>(Wm, U0, Kbar, Qt, Aqk, GL, T, H, S_in, S_out, y, ld_y, stream, st);
    case 64: return launch_scan<64>(Wm, U0, Kbar, Qt, Aqk, GL, T, H, S_in, S_out, y, ld_y, stream, st);
    default: return launch_scan<128>(Wm, U0, Kbar, Qt, Aqk, GL, T, H, S_in, S_out, y, ld_y, stream, st);
    }
}

// ---------------------------------------------------------------------------- (d) output norm
#define OUT_THREADS 128

template <bool BF16>
static __global__ void __launch_bounds__(OUT_THREADS)
out_kernel(const float *__restrict__ y, const float *__restrict__ gb, const float *__restrict__ o_norm, float eps, int H,
           int d, void *out) {
    __shared__ float sh[32];
    const size_t base = ((size_t)blockIdx.x * H + blockIdx.y) * d;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < d; i += OUT_THREADS) ss += y[base + i] * y[base + i];
    const float scale = 1.0f / sqrtf(sd_block_sum(ss, sh) / (float)d + eps);
    for (int i = threadIdx.x; i < d; i += OUT_THREADS) {
        const float r = ((y[base + i] * scale) * o_norm[i]) * sd_dev_sigmoid(gb[base + i]);
        if (BF16) ((__nv_bfloat16 *)out)[base + i] = __float2bfloat16_rn(r);
        else ((float *)out)[base + i] = r;
    }
}

extern "C" sd_code sd_cuda_kda_prefill_out(const float *y, const float *gb, const float *o_norm, float eps, int T, int H,
                                           int d, void *out, bool out_bf16, cudaStream_t stream, sd_status *st) {
    SD_NVTX("sd_cuda_kda_prefill_out");
    if (T < 1) return SD_OK;
    if (out_bf16) out_kernel<true><<<dim3(T, H), OUT_THREADS, 0, stream>>>(y, gb, o_norm, eps, H, d, out);
    else out_kernel<false><<<dim3(T, H), OUT_THREADS, 0, stream>>>(y, gb, o_norm, eps, H, d, out);
    SD_LAUNCH_CHECK(st);
    return SD_OK;
}
