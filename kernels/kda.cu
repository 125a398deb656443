// kda.cu — the KDA steps that are not Linears.
//   conv:  kernel 1 copies the T new raw rows into the conv ring; kernel 2, one block per
//          (head, q|k|v, token), one thread per channel: W-tap causal conv + silu, then the
//          head's L2 norm for q and k by a fixed-order block sum.
//   gates: elementwise.
//   scan:  the sums over the key index i are serial chains in increasing i (the CPU's order), one
//          thread per chain. d >= 32: a block owns 32 value columns of one head (H·d/32 blocks);
//          producer warps hold the state rows in registers, update and store them, and hand
//          per-row terms through shared memory to a ks warp and an acc warp that run the chains;
//          u goes back by a named barrier, no block barrier per token. d < 32: one thread per
//          column does everything. Other d: one block per head, the column updated in the
//          destination slot in global memory. k, exp(g), q·d^-0.5 are staged in shared memory
//          by cp.async. The per-element arithmetic is the CPU kda_step's, operation for
//          operation (the device expf is the only difference), and does not depend on T.
//          bench/kda_lab.cu times the versions.
//   out:   one block per (head, token): RMSNorm over d (fixed-order block sum) ⊙ sigmoid(gb).
#include "kda.h"
#include "common.cuh"
#include <cuda_pipeline.h> // __pipeline_memcpy_async, _commit, _wait_prior

static __global__ void conv_store_kernel(float *__restrict__ rows, int n_rows, const float *__restrict__ q,
                                         const float *__restrict__ k, const float *__restrict__ v, int T, int P, int pos0) {
    const size_t n = (size_t)T * 3 * P;
    for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += (size_t)gridDim.x * blockDim.x) {
        const int t = (int)(e / (3 * (size_t)P)), r = (int)(e % (3 * (size_t)P)), which = r / P, ch = r % P;
        const float *src = which == 0 ? q : which == 1 ? k : v;
        rows[(size_t)((pos0 + t) % n_rows) * 3 * P + r] = src[(size_t)t * P + ch];
    }
}

static __global__ void conv_kernel(const float *__restrict__ rows, int n_rows, const float *__restrict__ tq,
                                   const float *__restrict__ tk, const float *__restrict__ tv, int P, int d, int W,
                                   int pos0, float *__restrict__ qc, float *__restrict__ kc, float *__restrict__ vc) {
    __shared__ float sh[32];
    const int h = blockIdx.x, which = blockIdx.y, t = blockIdx.z, c = threadIdx.x;
    const int ch = h * d + c, pos = pos0 + t;
    const float *taps = which == 0 ? tq : which == 1 ? tk : tv;
    float val = 0.0f;
    if (c < d) {
        float acc = 0.0f;
        for (int j = 0; j < W; j++) {
            const int p = pos - (W - 1) + j;
            if (p < 0) continue;
            acc += taps[(size_t)ch * W + j] * rows[(size_t)(p % n_rows) * 3 * P + (size_t)which * P + ch];
        }
        val = sd_dev_silu(acc);
    }
    if (which < 2) { // block-uniform: q and k are L2-normalised per head
        const float ss = sd_block_sum(val * val, sh);
        const float inv = 1.0f / sqrtf(ss + 1e-6f);
        val *= inv;
    }
    float *out = which == 0 ? qc : which == 1 ? kc : vc;
    if (c < d) out[(size_t)t * P + ch] = val;
}

extern "C" sd_code sd_cuda_kda_conv(float *conv_rows, int n_rows, const float *q, const float *k, const float *v,
                                    const float *q_conv, const float *k_conv, const float *v_conv, int T, int H, int d,
                                    int W, int pos0, float *qc, float *kc, float *vc, cudaStream_t stream, sd_status *st) {
    SD_NVTX("sd_cuda_kda_conv");
    if (d < 1 || d > 1024) return sd_fail(st, SD_ERR_UNSUPPORTED, "cuda kda: head_dim %d outside 1..1024", d);
    if (T < 1) return SD_OK;
    const int P = H * d;
    const size_t n = (size_t)T * 3 * P;
    conv_store_kernel<<<(int)(n < 256 * 1024 ? (n + 255) / 256 : 1024), 256, 0, stream>>>(conv_rows, n_rows, q, k, v, T, P, pos0);
    SD_LAUNCH_CHECK(st);
    conv_kernel<<<dim3(H, 3, T), sd_round32(d), 0, stream>>>(conv_rows, n_rows, q_conv, k_conv, v_conv, P, d, W, pos0, qc, kc, vc);
    SD_LAUNCH_CHECK(st);
    return SD_OK;
}

static __global__ void gates_kernel(float *__restrict__ gate, float *__restrict__ beta, const float *__restrict__ A_log,
                                    const float *__restrict__ dt_bias, int T, int H, int d) {
    const size_t P = (size_t)H * d, ng = (size_t)T * P, n = ng + (size_t)T * H;
    for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += (size_t)gridDim.x * blockDim.x) {
        if (e < ng) {
            const int ch = (int)(e % P);
            gate[e] = -expf(A_log[ch / d]) * sd_dev_softplus(gate[e] + dt_bias[ch]);
        } else {
            beta[e - ng] = sd_dev_sigmoid(beta[e - ng]);
        }
    }
}

extern "C" sd_code sd_cuda_kda_gates(float *gate, float *beta, const float *A_log, const float *dt_bias, int T, int H,
                                     int d, cudaStream_t stream, sd_status *st) {
    SD_NVTX("sd_cuda_kda_gates");
    if (T < 1) return SD_OK;
    const size_t n = (size_t)T * H * d + (size_t)T * H;
    gates_kernel<<<(int)(n < 256 * 1024 ? (n + 255) / 256 : 1024), 256, 0, stream>>>(gate, beta, A_log, dt_bias, T, H, d);
    SD_LAUNCH_CHECK(st);
    return SD_OK;
}

// Stage token t's k, exp(g), q·scale for head h (thread j loads entry j; d threads).
__device__ __forceinline__ void scan_stage(int j, size_t o, const float *kc, const float *gate, const float *qc,
                                           float scale, float *ksh, float *esh, float *qsh) {
    ksh[j] = kc[o + j];
    esh[j] = expf(gate[o + j]);
    qsh[j] = qc[o + j] * scale;
}

// k, q·scale, exp(g) of up to SC+1 tokens in shared memory, row tt holding token tt + c0 - 1 of
// head h, plus v of the block's NC columns and β; copied by cp.async (so the copies overlap the
// state's loads), then exp and scale applied in place. Every thread of the block calls it.
template <int D, int SC, int NC>
struct scan_tokens {
    float k[SC + 1][D], q[SC + 1][D], e[SC + 1][D];
    float v[SC + 1][NC], b[SC + 1];
};

// Copies n floats (n a multiple of 4) from global to shared, 16 bytes a copy when both are aligned.
__device__ __forceinline__ void scan_copy(float *dst, const float *src, int n, int tid, int nthr, bool vec) {
    if (vec)
        for (int e = 4 * tid; e < n; e += 4 * nthr) __pipeline_memcpy_async(dst + e, src + e, 16);
    else
        for (int e = tid; e < n; e += nthr) __pipeline_memcpy_async(dst + e, src + e, 4);
}

template <int D, int SC, int NC>
__device__ __forceinline__ void scan_stage_chunk(scan_tokens<D, SC, NC> &x, int t_lo, int tt_lo, int ntok, int h,
                                                 int j0, size_t P, int H, const float *qc, const float *kc,
                                                 const float *vc, const float *gate, const float *beta, float scale,
                                                 bool vec) {
    const int tid = threadIdx.x, nthr = blockDim.x;
    for (int t = 0; t < ntok; t++) {
        const size_t o = (size_t)(t_lo + t) * P + (size_t)h * D;
        scan_copy(x.k[tt_lo + t], kc + o, D, tid, nthr, vec);
        scan_copy(x.q[tt_lo + t], qc + o, D, tid, nthr, vec);
        scan_copy(x.e[tt_lo + t], gate + o, D, tid, nthr, vec);
        for (int c = tid; c < NC; c += nthr) __pipeline_memcpy_async(&x.v[tt_lo + t][c], vc + o + j0 + c, 4);
    }
    for (int t = tid; t < ntok; t += nthr) __pipeline_memcpy_async(&x.b[tt_lo + t], beta + (size_t)(t_lo + t) * H + h, 4);
    __pipeline_commit();
    __pipeline_wait_prior(0);
    __syncthreads();
    for (int e = tid; e < ntok * D; e += nthr) {
        const int tt = tt_lo + e / D, i = e % D;
        x.e[tt][i] = expf(x.e[tt][i]);
        x.q[tt][i] = x.q[tt][i] * scale;
    }
    __syncthreads();
}

// Both scans run T+1 steps: step st finishes token st-1 (pass 2: S += k uᵀ, o = Sᵀq, store slot
// n0+st) and starts token st (pass 1: decay, ks = Sᵀk). Steps c0 .. c0+n-1 of a chunk need tokens
// c0-1 .. c0+n-1 (those within 0..T-1): token st-1 sits in row st-c0, token st in row st-c0+1.
struct scan_chunk {
    int n, t_lo, tt_lo, ntok;
    __device__ scan_chunk(int c0, int SC, int T) {
        n = min(SC, T + 1 - c0);
        t_lo = max(c0 - 1, 0);
        tt_lo = t_lo - (c0 - 1);
        ntok = min(c0 + n - 1, T - 1) - t_lo + 1;
    }
};

// d >= 32: a block owns 32 consecutive value columns of one head (grid H·d/32: 128 blocks at
// H = 32, d = 128); lane = column in every warp. Warp 0 (ks) and warp 1 (acc) run the two sums,
// each one thread's serial chain over i in the CPU's order; warps 2 .. NP+1 (producers) hold
// rows R0 .. d-1 of the state in registers, (d-R0)/NP rows each. Per step a producer waits for u
// (named barrier U), applies pass 2 and pass 1 to its rows, stores them, writes each row's terms
// S_ij·k_i and S_ij·q_i to shared memory and arrives on barrier T. The ks warp holds rows
// 0 .. R0-1 itself: as soon as it has u it publishes it (arrives on U), updates its own rows and
// starts the chain on them while the producers work, then waits on T, adds the producers' terms
// in order and computes the next u. The acc warp waits on T and adds the S·q terms (double-
// buffered by step parity, so it may trail by a step). The only serial part of a token is the
// ks chain: d dependent adds plus one hand-off of u.
template <int D>
struct scan_pa_smem {
    static constexpr int SC = 16;
    scan_tokens<D, SC, 32> x;
    float4 tk[D / 4][32];    // S·k terms of this step: rows 4r .. 4r+3 of column c at [r][c]
    float4 tq[2][D / 4][32]; // S·q terms, by step parity
    float u[32];
};

enum { SCAN_BAR_U = 1, SCAN_BAR_T = 2 }; // named barriers (0 is __syncthreads)
__device__ __forceinline__ void scan_bar_arrive(int id, int n) { asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(n) : "memory"); }
__device__ __forceinline__ void scan_bar_sync(int id, int n) { asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(n) : "memory"); }

// Rows r0 .. r0+N-1 of the column for one step (P2: finish the previous token with u, store into
// dst, write the S·q terms; P1: start the next token, write the S·k terms, or with CHAIN add them
// to ks in row order). Per element, the operations of kda_step.
template <int D, int N, int RM, bool P2, bool P1, bool CHAIN>
__device__ __forceinline__ void scan_produce(float (&s)[RM], int r0, const float *k0, const float *q0, const float *e1,
                                             const float *k1, float u, float *dst, float4 (*tq)[32],
                                             float4 (*tk)[32], float &ks, int lane) {
#pragma unroll
    for (int r4 = 0; r4 < N; r4 += 4) {
        const int i4 = r0 + r4;
        float4 kk0 = {}, qq0 = {}, ee1 = {}, kk1 = {};
        if (P2) kk0 = *(const float4 *)(k0 + i4), qq0 = *(const float4 *)(q0 + i4);
        if (P1) ee1 = *(const float4 *)(e1 + i4), kk1 = *(const float4 *)(k1 + i4);
        const float ka[4] = {kk0.x, kk0.y, kk0.z, kk0.w}, qa[4] = {qq0.x, qq0.y, qq0.z, qq0.w};
        const float ea[4] = {ee1.x, ee1.y, ee1.z, ee1.w}, kb[4] = {kk1.x, kk1.y, kk1.z, kk1.w};
        float oq[4], ok[4];
#pragma unroll
        for (int r = 0; r < 4; r++) {
            float &sv = s[r4 + r];
            if (P2) {
                sv += ka[r] * u;
                oq[r] = sv * qa[r];
                dst[(size_t)(r4 + r) * D] = sv;
            }
            if (P1) {
                sv = sv * ea[r];
                ok[r] = sv * kb[r];
                if (CHAIN) ks += ok[r];
            }
        }
        if (P2) tq[i4 / 4][lane] = make_float4(oq[0], oq[1], oq[2], oq[3]);
        if (P1 && !CHAIN) tk[i4 / 4][lane] = make_float4(ok[0], ok[1], ok[2], ok[3]);
    }
}

// The step's three shapes: st == 0 starts token 0 only, st == T finishes token T-1 only.
template <int D, int N, int RM, bool CHAIN>
__device__ __forceinline__ void scan_produce_step(int st, int T, int q, float (&s)[RM], int r0,
                                                  const scan_tokens<D, scan_pa_smem<D>::SC, 32> &x, float u, float *dst,
                                                  float4 (*tq)[32], float4 (*tk)[32], float &ks, int lane) {
    if (st == 0)
        scan_produce<D, N, RM, false, true, CHAIN>(s, r0, nullptr, nullptr, x.e[q + 1], x.k[q + 1], 0.0f, dst, tq, tk, ks, lane);
    else if (st < T)
        scan_produce<D, N, RM, true, true, CHAIN>(s, r0, x.k[q], x.q[q], x.e[q + 1], x.k[q + 1], u, dst, tq, tk, ks, lane);
    else
        scan_produce<D, N, RM, true, false, CHAIN>(s, r0, x.k[q], x.q[q], nullptr, nullptr, u, dst, tq, tk, ks, lane);
}

// sum += terms of rows r_lo .. D-1 of column lane, in increasing row order.
template <int D, int R_LO>
__device__ __forceinline__ float scan_chain(float sum, const float4 (*t)[32], int lane) {
#pragma unroll
    for (int i4 = R_LO; i4 < D; i4 += 4) {
        const float4 v = t[i4 / 4][lane];
        sum += v.x;
        sum += v.y;
        sum += v.z;
        sum += v.w;
    }
    return sum;
}

template <int D, int NP, int R0>
static __global__ void __launch_bounds__(32 * (NP + 2), 1)
scan_pa_kernel(float *S, int n_slots, int n0, int T, int H, const float *__restrict__ qc, const float *__restrict__ kc,
               const float *__restrict__ vc, const float *__restrict__ gate, const float *__restrict__ beta,
               float *__restrict__ y, bool vec) {
    using sm = scan_pa_smem<D>;
    constexpr int SC = sm::SC, R = (D - R0) / NP, RM = R > R0 ? R : R0, NPT = 32 * NP;
    static_assert(D % 32 == 0 && (D - R0) % NP == 0 && R % 4 == 0 && R0 % 4 == 0 && NP + 2 <= 32,
                  "32 columns a block, whole 4-row term vectors, at most 1024 threads");
    extern __shared__ __align__(16) unsigned char scan_smem[];
    sm &sh = *reinterpret_cast<sm *>(scan_smem);
    const int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int h = blockIdx.x / (D / 32), j0 = blockIdx.x % (D / 32) * 32, j = j0 + lane;
    const int r0 = w >= 2 ? R0 + (w - 2) * R : 0; // first state row this warp holds
    const size_t P = (size_t)H * D, per_slot = P * D, col = (size_t)h * D * D + j;
    float s[RM];
    const float *src = S + (size_t)(n0 % n_slots) * per_slot + col + (size_t)r0 * D;
    if (w >= 2) {
#pragma unroll
        for (int r = 0; r < R; r++) s[r] = src[(size_t)r * D];
    } else if (w == 0) {
#pragma unroll
        for (int r = 0; r < R0; r++) s[r] = src[(size_t)r * D];
    }
    float u = 0.0f; // ks warp: u of the last token it finished
    for (int c0 = 0; c0 <= T; c0 += SC) {
        const scan_chunk ch(c0, SC, T);
        if (c0 > 0) __syncthreads(); // the last chunk's readers are done
        scan_stage_chunk(sh.x, ch.t_lo, ch.tt_lo, ch.ntok, h, j0, P, H, qc, kc, vc, gate, beta, 1.0f / sqrtf((float)D), vec);
        for (int q = 0; q < ch.n; q++) {
            const int st = c0 + q;
            float4 (*tq)[32] = sh.tq[st & 1];
            float *dst = S + (size_t)((n0 + st) % n_slots) * per_slot + col + (size_t)r0 * D;
            float ks = 0.0f;
            if (w >= 2) {
                if (st > 0) scan_bar_sync(SCAN_BAR_U, 32 + NPT);
                scan_produce_step<D, R, RM, false>(st, T, q, s, r0, sh.x, st > 0 ? sh.u[lane] : 0.0f, dst, tq, sh.tk, ks, lane);
                scan_bar_arrive(SCAN_BAR_T, NPT + 64);
            } else if (w == 0) {
                if (st > 0) {
                    sh.u[lane] = u;
                    scan_bar_arrive(SCAN_BAR_U, 32 + NPT);
                }
                if (R0 > 0) scan_produce_step<D, R0, RM, true>(st, T, q, s, 0, sh.x, u, dst, tq, sh.tk, ks, lane);
                scan_bar_sync(SCAN_BAR_T, NPT + 64);
                if (st < T) {
                    ks = scan_chain<D, R0>(ks, sh.tk, lane);
                    u = sh.x.b[q + 1] * (sh.x.v[q + 1][lane] - ks);
                }
            } else {
                scan_bar_sync(SCAN_BAR_T, NPT + 64);
                if (st > 0) y[(size_t)(st - 1) * P + (size_t)h * D + j] = scan_chain<D, 0>(0.0f, tq, lane);
            }
        }
    }
}

// d < 32: one block of d threads per head (lane = column, all rows in registers), both passes and
// both sums in the one thread; pass 2 of token st-1 and pass 1 of token st share one sweep.
template <int D, bool P2, bool P1>
__device__ __forceinline__ void scan_col_step(float (&s)[D], const float *k0, const float *q0, const float *e1,
                                              const float *k1, float u, float *dst, float &acc, float &ks) {
    if (P2) acc = 0.0f;
    if (P1) ks = 0.0f;
#pragma unroll
    for (int i4 = 0; i4 < D; i4 += 4) {
        float4 kk0 = {}, qq0 = {}, ee1 = {}, kk1 = {};
        if (P2) kk0 = *(const float4 *)(k0 + i4), qq0 = *(const float4 *)(q0 + i4);
        if (P1) ee1 = *(const float4 *)(e1 + i4), kk1 = *(const float4 *)(k1 + i4);
        const float ka[4] = {kk0.x, kk0.y, kk0.z, kk0.w}, qa[4] = {qq0.x, qq0.y, qq0.z, qq0.w};
        const float ea[4] = {ee1.x, ee1.y, ee1.z, ee1.w}, kb[4] = {kk1.x, kk1.y, kk1.z, kk1.w};
#pragma unroll
        for (int r = 0; r < 4; r++) {
            const int i = i4 + r;
            if (P2) {
                s[i] += ka[r] * u;
                acc += s[i] * qa[r];
                dst[(size_t)i * D] = s[i];
            }
            if (P1) {
                s[i] = s[i] * ea[r];
                ks += s[i] * kb[r];
            }
        }
    }
}

template <int D>
static __global__ void __launch_bounds__(D)
scan_col_kernel(float *S, int n_slots, int n0, int T, int H, const float *__restrict__ qc, const float *__restrict__ kc,
                const float *__restrict__ vc, const float *__restrict__ gate, const float *__restrict__ beta,
                float *__restrict__ y, bool vec) {
    constexpr int SC = 32;
    __shared__ __align__(16) scan_tokens<D, SC, D> sh;
    const int h = blockIdx.x, j = threadIdx.x;
    const size_t P = (size_t)H * D, per_slot = P * D, col = (size_t)h * D * D + j;
    float s[D];
    const float *src = S + (size_t)(n0 % n_slots) * per_slot + col;
#pragma unroll
    for (int i = 0; i < D; i++) s[i] = src[(size_t)i * D];
    float ks = 0.0f, acc = 0.0f;
    for (int c0 = 0; c0 <= T; c0 += SC) {
        const scan_chunk ch(c0, SC, T);
        if (c0 > 0) __syncthreads(); // the last chunk's readers are done
        scan_stage_chunk(sh, ch.t_lo, ch.tt_lo, ch.ntok, h, 0, P, H, qc, kc, vc, gate, beta, 1.0f / sqrtf((float)D), vec);
        for (int q = 0; q < ch.n; q++) {
            const int st = c0 + q;
            if (st == 0) {
                scan_col_step<D, false, true>(s, nullptr, nullptr, sh.e[q + 1], sh.k[q + 1], 0.0f, nullptr, acc, ks);
                continue;
            }
            const float u = sh.b[q] * (sh.v[q][j] - ks);
            float *dst = S + (size_t)((n0 + st) % n_slots) * per_slot + col;
            if (st < T)
                scan_col_step<D, true, true>(s, sh.k[q], sh.q[q], sh.e[q + 1], sh.k[q + 1], u, dst, acc, ks);
            else
                scan_col_step<D, true, false>(s, sh.k[q], sh.q[q], nullptr, nullptr, u, dst, acc, ks);
            y[(size_t)(st - 1) * P + (size_t)h * D + j] = acc;
        }
    }
}

// Any d: the column is updated in place in each destination slot (same arithmetic as above).
static __global__ void scan_global_kernel(float *S, int n_slots, int n0, int T, int H, int d, const float *__restrict__ qc,
                                          const float *__restrict__ kc, const float *__restrict__ vc,
                                          const float *__restrict__ gate, const float *__restrict__ beta, float *__restrict__ y) {
    extern __shared__ float smem[];
    float *ksh = smem, *esh = smem + d, *qsh = smem + 2 * d;
    const int h = blockIdx.x, j = threadIdx.x;
    const size_t P = (size_t)H * d, per_slot = P * d, head = (size_t)h * d * d;
    const float scale = 1.0f / sqrtf((float)d);
    for (int t = 0; t < T; t++) {
        const size_t o = (size_t)t * P + (size_t)h * d;
        scan_stage(j, o, kc, gate, qc, scale, ksh, esh, qsh);
        __syncthreads();
        const float *src = S + (size_t)((n0 + t) % n_slots) * per_slot + head;
        float *dst = S + (size_t)((n0 + t + 1) % n_slots) * per_slot + head;
        float ks = 0.0f;
        for (int i = 0; i < d; i++) {
            const float sv = src[(size_t)i * d + j] * esh[i];
            dst[(size_t)i * d + j] = sv;
            ks += sv * ksh[i];
        }
        const float u = beta[(size_t)t * H + h] * (vc[o + j] - ks);
        float acc = 0.0f;
        for (int i = 0; i < d; i++) {
            const float sv = dst[(size_t)i * d + j] + ksh[i] * u;
            dst[(size_t)i * d + j] = sv;
            acc += sv * qsh[i];
        }
        y[o + j] = acc;
        __syncthreads();
    }
}

template <int D>
static void scan_col(float *S, int n_slots, int n0, int T, int H, const float *qc, const float *kc, const float *vc,
                     const float *gate, const float *beta, float *y, bool vec, cudaStream_t stream) {
    scan_col_kernel<D><<<H, D, 0, stream>>>(S, n_slots, n0, T, H, qc, kc, vc, gate, beta, y, vec);
}

template <int D, int NP, int R0>
static cudaError_t scan_pa(float *S, int n_slots, int n0, int T, int H, const float *qc, const float *kc,
                           const float *vc, const float *gate, const float *beta, float *y, bool vec,
                           cudaStream_t stream) {
    const int smem = (int)sizeof(scan_pa_smem<D>);
    static bool attr_set[64]; // over 48 KB of shared memory: raise the limit once a device
    int dev = 0;
    cudaError_t e = cudaGetDevice(&dev);
    if (e != cudaSuccess) return e;
    if (dev >= 64 || !attr_set[dev]) {
        e = cudaFuncSetAttribute(scan_pa_kernel<D, NP, R0>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
        if (e != cudaSuccess) return e;
        if (dev < 64) attr_set[dev] = true;
    }
    scan_pa_kernel<D, NP, R0><<<H * (D / 32), 32 * (NP + 2), smem, stream>>>(S, n_slots, n0, T, H, qc, kc, vc, gate,
                                                                            beta, y, vec);
    return cudaSuccess;
}

extern "C" sd_code sd_cuda_kda_scan(float *S, int n_slots, int n0, int T, int H, int d, const float *qc, const float *kc,
                                    const float *vc, const float *gate, const float *beta, float *y, cudaStream_t stream,
                                    sd_status *st) {
    SD_NVTX("sd_cuda_kda_scan");
    if (d < 1 || d > 1024) return sd_fail(st, SD_ERR_UNSUPPORTED, "cuda kda: head_dim %d outside 1..1024", d);
    if (T < 1) return SD_OK;
    if (T >= n_slots) return sd_fail(st, SD_ERR_USAGE, "cuda kda scan: %d tokens need more than %d state slots", T, n_slots);
    const bool vec = (((uintptr_t)qc | (uintptr_t)kc | (uintptr_t)gate) & 15) == 0;
    switch (d) {
    case 8: scan_col<8>(S, n_slots, n0, T, H, qc, kc, vc, gate, beta, y, vec, stream); break;
    case 16: scan_col<16>(S, n_slots, n0, T, H, qc, kc, vc, gate, beta, y, vec, stream); break;
    // (producer warps, rows the ks warp holds): 8 rows a producer, 16 for the ks warp.
    case 32: SD_CUDA_CHECK(st, (scan_pa<32, 2, 16>(S, n_slots, n0, T, H, qc, kc, vc, gate, beta, y, vec, stream))); break;
    case 64: SD_CUDA_CHECK(st, (scan_pa<64, 6, 16>(S, n_slots, n0, T, H, qc, kc, vc, gate, beta, y, vec, stream))); break;
    case 128: SD_CUDA_CHECK(st, (scan_pa<128, 14, 16>(S, n_slots, n0, T, H, qc, kc, vc, gate, beta, y, vec, stream))); break;
    default:
        scan_global_kernel<<<H, d, 3 * (size_t)d * sizeof(float), stream>>>(S, n_slots, n0, T, H, d, qc, kc, vc, gate, beta, y);
    }
    SD_LAUNCH_CHECK(st);
    return SD_OK;
}

static __global__ void out_kernel(float *__restrict__ y, const float *__restrict__ gb, const float *__restrict__ o_norm,
                                  float eps, int H, int d) {
    __shared__ float sh[32];
    const int h = blockIdx.x, t = blockIdx.y, c = threadIdx.x;
    const size_t o = ((size_t)t * H + h) * d + c;
    const float yv = c < d ? y[o] : 0.0f;
    const float ss = sd_block_sum(yv * yv, sh);
    const float scale = 1.0f / sqrtf(ss / (float)d + eps);
    if (c < d) {
        const float r = (yv * scale) * o_norm[c];
        y[o] = r * sd_dev_sigmoid(gb[o]);
    }
}

extern "C" sd_code sd_cuda_kda_out(float *y, const float *gb, const float *o_norm, float eps, int T, int H, int d,
                                   cudaStream_t stream, sd_status *st) {
    SD_NVTX("sd_cuda_kda_out");
    if (d < 1 || d > 1024) return sd_fail(st, SD_ERR_UNSUPPORTED, "cuda kda: head_dim %d outside 1..1024", d);
    if (T < 1) return SD_OK;
    out_kernel<<<dim3(H, T), sd_round32(d), 0, stream>>>(y, gb, o_norm, eps, H, d);
    SD_LAUNCH_CHECK(st);
    return SD_OK;
}
