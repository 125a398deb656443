// kda.cu — the KDA steps that are not Linears.
//   conv:  one block per (head, q|k|v, token), one thread per channel: W-tap causal conv (this
//          call's positions from the fresh projections, earlier ones from the ring) + silu, the
//          raw input stored into the ring, then the head's L2 norm for q and k by a fixed-order
//          block sum. The same launch computes the gates' low-rank second halves (f_b·fa into
//          gate, g_b·ga into gb): one block per (head, f|g, token), a thread per row — its d
//          weights loaded before the wait, then one chain over j increasing. Both read only the
//          in-projection, so neither waits for the other: the launch costs the chain one
//          dependency instead of two. It lets the scan start only after its own wait, as the scan
//          lets the out kernel (pdl.h: shorter chains of waiting launches).
//   gates: applied by the scan while it stages each token (kda_gate, sigmoid for β), from the raw
//          projections, when given A_log and dt_bias.
//   scan:  d = 32, 64, 96, 128 (the tiled scan): a block owns 32 value columns of one head
//          (H·d/32 blocks) and d/32 warps; warp w keeps state rows 32w .. 32w+31 of the block's
//          columns in registers (lane = column), so each sum over the key index i is d/32 partial
//          chains (i increasing) added in warp order — two 32-long chains and two block barriers
//          a token. d < 32: one thread per column runs the whole chain (the CPU's order). Other
//          d: one block per head, the column updated in the destination slot in global memory
//          (the CPU's order). k, exp(g), q·d^-0.5 are staged in shared memory by cp.async. The
//          per-element operations are the CPU kda_step's (the device expf is the only
//          difference); every order depends on d alone, never on T (verify ≡ decode bit for bit).
//          bench/kda_lab.cu times the scan at other shapes.
//   out:   one block per (head, token): RMSNorm over d (fixed-order block sum) ⊙ sigmoid(gb).
// The conv, the gates and the scan stay three launches: folding them into one serialises conv,
// dots and recurrence after the wait (docs/EXPERIMENTS.md#kda-one-launch).
#include "kda.h"
#include "common.cuh"
#include <cuda_pipeline.h>      // __pipeline_memcpy_async, _commit, _wait_prior

// One block per (head, q|k|v, token), a thread per channel: the W-tap window over positions
// pos-W+1 .. pos reads this call's positions (>= pos0) from the fresh projections and earlier
// ones from the ring, then the thread stores its own raw input into the ring row of pos. A call
// touches T + W - 1 <= n_rows distinct positions, so no block's store lands in a row another
// block still reads.
#define CONV_WMAX 8 // windows up to this many taps load every tap and input at once
#define LOWRANK_PRE 16 // gate rows: bf16 rows up to 16·8 entries held in registers from before the wait

// The gates' low-rank second halves: gate = f_b·fa, gb = g_b·ga (f_b, g_b [P, d]; fa, ga (T, d)).
struct kda_lowrank {
    const void *f_b, *g_b;
    int f_bf16, g_bf16, pre; // pre: both bf16, d % 8 == 0, d <= 8·LOWRANK_PRE, 16-byte aligned rows
    const float *fa, *ga;
    float *gate, *gb;
};

// Block (head h, f|g, token t): thread c owns row h·d + c of f_b or g_b: Σ_j w[j]·x_t[j], one
// chain with j increasing (an order of d alone: verify ≡ decode). The row is loaded before the
// wait (weights are never written); x_t is staged in shared memory after it.
__device__ static void lowrank_row(const kda_lowrank &lr, int h, bool g, int t, int d, int P, float *xs) {
    const int c = threadIdx.x, row = h * d + c;
    const void *W = g ? lr.g_b : lr.f_b;
    const bool bf = g ? lr.g_bf16 : lr.f_bf16;
    uint4 wv[LOWRANK_PRE];
    if (lr.pre && c < d) {
        const uint4 *src = (const uint4 *)((const uint16_t *)W + (size_t)row * d);
        const uint64_t pol = sd_l2_evict_first();
#pragma unroll
        for (int i = 0; i < LOWRANK_PRE; i++)
            if (i < d / 8) wv[i] = sd_ldg_pol(src + i, pol);
    }
    sd_pdl_wait_trigger();
    const float *x = (g ? lr.ga : lr.fa) + (size_t)t * d;
    for (int j = c; j < d; j += blockDim.x) xs[j] = x[j];
    __syncthreads();
    if (c >= d) return;
    float acc = 0.0f;
    if (lr.pre) {
#pragma unroll
        for (int i = 0; i < LOWRANK_PRE; i++) {
            if (i >= d / 8) break;
            const uint32_t u[4] = {wv[i].x, wv[i].y, wv[i].z, wv[i].w};
#pragma unroll
            for (int e = 0; e < 8; e++) { // bf16 pairs: entry 2k in the low half (little-endian)
                const float w = __uint_as_float(e & 1 ? u[e / 2] & 0xffff0000u : u[e / 2] << 16);
                acc = acc + w * xs[8 * i + e];
            }
        }
    } else {
        for (int j = 0; j < d; j++) {
            const size_t o = (size_t)row * d + j;
            acc = acc + (bf ? sd_dev_bf16(((const uint16_t *)W)[o]) : ((const float *)W)[o]) * xs[j];
        }
    }
    (g ? lr.gb : lr.gate)[(size_t)t * P + row] = acc;
}

static __global__ void conv_kernel(float *__restrict__ rows, int n_rows, const float *__restrict__ q,
                                   const float *__restrict__ k, const float *__restrict__ v, const float *__restrict__ tq,
                                   const float *__restrict__ tk, const float *__restrict__ tv, int P, int d, int W,
                                   sd_dev_pos at, int settled, float *__restrict__ qc, float *__restrict__ kc,
                                   float *__restrict__ vc, const __grid_constant__ kda_lowrank lr) {
    __shared__ float sh[32];
    extern __shared__ float conv_xs[]; // gate blocks: a token's x row (d floats)
    const int h = blockIdx.x, which = blockIdx.y, t = blockIdx.z, c = threadIdx.x;
    if (which >= 3) return lowrank_row(lr, h, which == 4, t, d, P, conv_xs); // the gate rows of head h
    const int ch = h * d + c;
    const float *taps = which == 0 ? tq : which == 1 ? tk : tv;
    const float *fresh = which == 0 ? q : which == 1 ? k : v;
    const float *ring = rows + (size_t)which * P + ch;
    // Settled: the position and the ring rows before it are older than the forward, so they are
    // read before the wait with the taps (never written); else after it.
    int pos0 = settled ? sd_pos_read(at) : 0, pos = pos0 + t;
    float val = 0.0f;
    if (W <= CONV_WMAX) { // every tap and input loaded before the first is used
        float tw[CONV_WMAX], xv[CONV_WMAX];
#pragma unroll
        for (int j = 0; j < CONV_WMAX; j++) tw[j] = c < d && j < W ? taps[(size_t)ch * W + j] : 0.0f;
        auto load_ring = [&]() { // the window's positions before pos0
#pragma unroll
            for (int j = 0; j < CONV_WMAX; j++) {
                const int p = pos - (W - 1) + j;
                xv[j] = c < d && j < W && p >= 0 && p < pos0 ? ring[(size_t)(p % n_rows) * 3 * P] : 0.0f;
            }
        };
        if (settled) load_ring();
        sd_pdl_wait_trigger();
        if (!settled) {
            pos0 = sd_pos_read(at), pos = pos0 + t;
            load_ring();
        }
#pragma unroll
        for (int j = 0; j < CONV_WMAX; j++) {
            const int p = pos - (W - 1) + j;
            if (c < d && j < W && p >= pos0) xv[j] = fresh[(size_t)(p - pos0) * P + ch];
        }
        if (c < d) {
            float acc = 0.0f;
#pragma unroll
            for (int j = 0; j < CONV_WMAX; j++)
                if (j < W && pos - (W - 1) + j >= 0) acc += tw[j] * xv[j];
            val = sd_dev_silu(acc);
        }
    } else {
        sd_pdl_wait_trigger();
        pos0 = sd_pos_read(at), pos = pos0 + t;
        if (c < d) {
            float acc = 0.0f;
            for (int j = 0; j < W; j++) {
                const int p = pos - (W - 1) + j;
                if (p < 0) continue;
                const float x = p >= pos0 ? fresh[(size_t)(p - pos0) * P + ch] : ring[(size_t)(p % n_rows) * 3 * P];
                acc += taps[(size_t)ch * W + j] * x;
            }
            val = sd_dev_silu(acc);
        }
    }
    if (c < d) rows[(size_t)(pos % n_rows) * 3 * P + (size_t)which * P + ch] = fresh[(size_t)t * P + ch];
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
                                    int W, sd_dev_pos pos0, bool settled, const sd_mat *f_b, const float *fa, float *gate,
                                    const sd_mat *g_b, const float *ga, float *gb, float *qc, float *kc, float *vc,
                                    cudaStream_t stream, sd_status *st) {
    SD_NVTX("sd_cuda_kda_conv");
    if (d < 1 || d > 1024) return sd_fail(st, SD_ERR_UNSUPPORTED, "cuda kda: head_dim %d outside 1..1024", d);
    if (T < 1 || H < 1) return SD_OK; // a rank holding no head: nothing to compute
    if (T + W - 1 > n_rows)
        return sd_fail(st, SD_ERR_USAGE, "cuda kda conv: %d tokens and a %d-tap window need %d ring rows, the state has %d", T, W,
                       T + W - 1, n_rows);
    const int P = H * d;
    for (const sd_mat *m : {f_b, g_b}) {
        if (m->dtype != SD_DT_BF16 && m->dtype != SD_DT_F32)
            return sd_fail(st, SD_ERR_UNSUPPORTED, "cuda kda: gate weight dtype %d is not F32 or BF16", (int)m->dtype);
        if (m->rows != P || m->cols != d)
            return sd_fail(st, SD_ERR_USAGE, "cuda kda: gate weight %dx%d, want %dx%d", m->rows, m->cols, P, d);
    }
    const bool pre = f_b->dtype == SD_DT_BF16 && g_b->dtype == SD_DT_BF16 && d % 8 == 0 && d <= 8 * LOWRANK_PRE &&
                     (((uintptr_t)f_b->data | (uintptr_t)g_b->data) & 15) == 0;
    const kda_lowrank lr = {f_b->data, g_b->data, f_b->dtype == SD_DT_BF16, g_b->dtype == SD_DT_BF16, pre, fa, ga, gate, gb};
    SD_CUDA_CHECK(st, sd_launch(conv_kernel, dim3(H, 5, T), sd_round32(d), sizeof(float) * (size_t)d, stream, conv_rows, n_rows,
                                q, k, v, q_conv, k_conv, v_conv, P, d, W, pos0, settled ? 1 : 0, qc, kc, vc, lr));
    return SD_OK;
}

// The gate and β of MODEL.md's KDA from their raw projections (the CPU's kda gates): applied by
// the scan while it stages a token, when given the raw values (A_log non-NULL).
__device__ __forceinline__ float kda_gate(float g, float a_log, float dt_bias) {
    return -expf(a_log) * sd_dev_softplus(g + dt_bias);
}

// Stage token t's k, exp(g), q·scale for head h (thread j loads entry j; d threads).
__device__ __forceinline__ void scan_stage(int j, size_t o, const float *kc, const float *gate, const float *qc,
                                           float scale, const float *A_log, const float *dt_bias, int h, int d, float *ksh,
                                           float *esh, float *qsh) {
    ksh[j] = kc[o + j];
    esh[j] = expf(A_log ? kda_gate(gate[o + j], A_log[h], dt_bias[h * d + j]) : gate[o + j]);
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
                                                 const float *A_log, const float *dt_bias, bool vec) {
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
        x.e[tt][i] = expf(A_log ? kda_gate(x.e[tt][i], A_log[h], dt_bias[h * D + i]) : x.e[tt][i]);
        x.q[tt][i] = x.q[tt][i] * scale;
    }
    if (A_log)
        for (int t = tid; t < ntok; t += nthr) x.b[tt_lo + t] = sd_dev_sigmoid(x.b[tt_lo + t]);
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
scan_col_kernel(float *S, int n_slots, sd_dev_pos at, int T, int H, const float *__restrict__ qc, const float *__restrict__ kc,
                const float *__restrict__ vc, const float *__restrict__ gate, const float *__restrict__ beta,
                const float *__restrict__ A_log, const float *__restrict__ dt_bias, float *__restrict__ y, bool vec) {
    sd_pdl_wait_trigger();
    const int n0 = sd_pos_read(at);
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
        scan_stage_chunk(sh, ch.t_lo, ch.tt_lo, ch.ntok, h, 0, P, H, qc, kc, vc, gate, beta, 1.0f / sqrtf((float)D), A_log,
                         dt_bias, vec);
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
static __global__ void scan_global_kernel(float *S, int n_slots, sd_dev_pos at, int T, int H, int d, const float *__restrict__ qc,
                                          const float *__restrict__ kc, const float *__restrict__ vc,
                                          const float *__restrict__ gate, const float *__restrict__ beta,
                                          const float *__restrict__ A_log, const float *__restrict__ dt_bias,
                                          float *__restrict__ y) {
    sd_pdl_wait_trigger();
    const int n0 = sd_pos_read(at);
    extern __shared__ float smem[];
    float *ksh = smem, *esh = smem + d, *qsh = smem + 2 * d;
    const int h = blockIdx.x, j = threadIdx.x;
    const size_t P = (size_t)H * d, per_slot = P * d, head = (size_t)h * d * d;
    const float scale = 1.0f / sqrtf((float)d);
    for (int t = 0; t < T; t++) {
        const size_t o = (size_t)t * P + (size_t)h * d;
        scan_stage(j, o, kc, gate, qc, scale, A_log, dt_bias, h, d, ksh, esh, qsh);
        __syncthreads();
        const float *src = S + (size_t)((n0 + t) % n_slots) * per_slot + head;
        float *dst = S + (size_t)((n0 + t + 1) % n_slots) * per_slot + head;
        float ks = 0.0f;
        for (int i = 0; i < d; i++) {
            const float sv = src[(size_t)i * d + j] * esh[i];
            dst[(size_t)i * d + j] = sv;
            ks += sv * ksh[i];
        }
        const float bt = beta[(size_t)t * H + h], u = (A_log ? sd_dev_sigmoid(bt) : bt) * (vc[o + j] - ks);
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

// (c) of one element, given its row's sum of squares ss: the CPU's formula.
__device__ __forceinline__ float gated_norm_of(float yv, float ss, float w, float g, float eps, int d) {
    const float scale = 1.0f / sqrtf(ss / (float)d + eps);
    return ((yv * scale) * w) * sd_dev_sigmoid(g);
}

// Tiled scan (d = 32, 64, 96, 128; KW divides d): a block owns 32 value
// columns of one head (grid H·d/32) and D/KW warps; warp w holds the state rows [w·KW, (w+1)·KW)
// of the block's columns in registers (lane = column), so a token costs two KW-long chains per
// thread (ks and o) and two block barriers, instead of one d-long chain. Each sum over i is the
// D/KW warps' partial chains (i increasing inside each) added in warp order: an order fixed by
// d and KW alone, so verify ≡ decode holds bit for bit; it differs from the CPU's single chain by
// rounding (NMSE-level). Per element the operations are kda_step's: S·e, ks += S·k,
// u = β(v − ks), S += k·u, o += S·(q·d^-0.5).
//
template <int D, int KW>
struct scan_tile_smem {
    static constexpr int SC = 16, NW = D / KW; // tokens staged at once; warps
    scan_tokens<D, SC - 1, 32> x;              // rows 0 .. SC-1: tokens c0 .. c0+SC-1
    float ks[NW][32], o[NW][32];               // the warps' partial sums of this token
};

template <int D, int KW>
static __global__ void __launch_bounds__(D / KW * 32)
scan_tile_kernel(float *S, int n_slots, sd_dev_pos at, int T, int H, const float *__restrict__ qc,
                 const float *__restrict__ kc, const float *__restrict__ vc, const float *__restrict__ gate,
                 const float *__restrict__ beta, const float *__restrict__ A_log, const float *__restrict__ dt_bias,
                 float *__restrict__ y, bool vec, bool settled) {
    using sm = scan_tile_smem<D, KW>;
    __shared__ __align__(16) sm sh;
    const int h = blockIdx.x / (D / 32), j0 = (int)(blockIdx.x % (D / 32)) * 32;
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, i0 = w * KW;
    const size_t P = (size_t)H * D, per_slot = P * D, head = (size_t)h * D * D + j0 + lane;
    const float scale = 1.0f / sqrtf((float)D);
    // Settled: slot n0 and the cursor are older than the forward, so the block's state columns
    // stream in before the wait, during the predecessor's tail; else after it.
    if (!settled) sd_pdl_wait_trigger();
    const int n0 = sd_pos_read(at);
    float s[KW];
    const float *src = S + (size_t)(n0 % n_slots) * per_slot + head;
#pragma unroll
    for (int r = 0; r < KW; r++) s[r] = src[(size_t)(i0 + r) * D];
    if (settled) sd_pdl_wait_trigger();
    for (int c0 = 0; c0 < T; c0 += sm::SC) {
        const int nt = min(sm::SC, T - c0);
        __syncthreads(); // the previous chunk's rows are read
        scan_stage_chunk<D, sm::SC - 1, 32>(sh.x, c0, 0, nt, h, j0, P, H, qc, kc, vc, gate, beta, scale, A_log, dt_bias, vec);
        for (int tt = 0; tt < nt; tt++) {
            const float *k = sh.x.k[tt], *e = sh.x.e[tt], *q = sh.x.q[tt];
            float ks = 0.0f;
#pragma unroll
            for (int r = 0; r < KW; r++) {
                s[r] = s[r] * e[i0 + r];
                ks = ks + s[r] * k[i0 + r];
            }
            sh.ks[w][lane] = ks;
            __syncthreads();
            float kt = sh.ks[0][lane];
#pragma unroll
            for (int v = 1; v < sm::NW; v++) kt = kt + sh.ks[v][lane];
            const float u = sh.x.b[tt] * (sh.x.v[tt][lane] - kt);
            float o = 0.0f;
            float *dst = S + (size_t)((n0 + c0 + tt + 1) % n_slots) * per_slot + head;
#pragma unroll
            for (int r = 0; r < KW; r++) {
                s[r] = s[r] + k[i0 + r] * u;
                o = o + s[r] * q[i0 + r];
                dst[(size_t)(i0 + r) * D] = s[r];
            }
            sh.o[w][lane] = o;
            __syncthreads();
            if (w == 0) {
                float ot = sh.o[0][lane];
#pragma unroll
                for (int v = 1; v < sm::NW; v++) ot = ot + sh.o[v][lane];
                y[(size_t)(c0 + tt) * P + (size_t)h * D + j0 + lane] = ot;
            }
        }
    }
}

template <int D>
static cudaError_t scan_col(float *S, int n_slots, sd_dev_pos n0, int T, int H, const float *qc, const float *kc,
                            const float *vc, const float *gate, const float *beta, const float *A_log, const float *dt_bias,
                            float *y, bool vec, cudaStream_t stream) {
    return sd_launch(scan_col_kernel<D>, H, D, 0, stream, S, n_slots, n0, T, H, qc, kc, vc, gate, beta, A_log, dt_bias, y, vec);
}

template <int D>
static cudaError_t scan_tile(float *S, int n_slots, sd_dev_pos n0, int T, int H, const float *qc, const float *kc,
                             const float *vc, const float *gate, const float *beta, const float *A_log, const float *dt_bias,
                             float *y, bool vec, bool settled, cudaStream_t stream) {
    return sd_launch(scan_tile_kernel<D, 32>, H * (D / 32), D, 0, stream, S, n_slots, n0, T, H, qc, kc, vc, gate, beta, A_log,
                     dt_bias, y, vec, settled);
}

extern "C" sd_code sd_cuda_kda_scan(float *S, int n_slots, sd_dev_pos n0, int T, int H, int d, const float *qc, const float *kc,
                                    const float *vc, const float *gate, const float *beta, const float *A_log,
                                    const float *dt_bias, float *y, bool settled, cudaStream_t stream, sd_status *st) {
    SD_NVTX("sd_cuda_kda_scan");
    if (d < 1 || d > 1024) return sd_fail(st, SD_ERR_UNSUPPORTED, "cuda kda: head_dim %d outside 1..1024", d);
    if (T < 1 || H < 1) return SD_OK; // a rank holding no head: nothing to compute
    if (T >= n_slots) return sd_fail(st, SD_ERR_USAGE, "cuda kda scan: %d tokens need more than %d state slots", T, n_slots);
    if (!A_log != !dt_bias) return sd_fail(st, SD_ERR_USAGE, "cuda kda scan: A_log and dt_bias come together");
    const bool vec = (((uintptr_t)qc | (uintptr_t)kc | (uintptr_t)gate) & 15) == 0;
    cudaError_t e;
    switch (d) {
    case 8: e = scan_col<8>(S, n_slots, n0, T, H, qc, kc, vc, gate, beta, A_log, dt_bias, y, vec, stream); break;
    case 16: e = scan_col<16>(S, n_slots, n0, T, H, qc, kc, vc, gate, beta, A_log, dt_bias, y, vec, stream); break;
    case 32: e = scan_tile<32>(S, n_slots, n0, T, H, qc, kc, vc, gate, beta, A_log, dt_bias, y, vec, settled, stream); break;
    case 64: e = scan_tile<64>(S, n_slots, n0, T, H, qc, kc, vc, gate, beta, A_log, dt_bias, y, vec, settled, stream); break;
    case 96: e = scan_tile<96>(S, n_slots, n0, T, H, qc, kc, vc, gate, beta, A_log, dt_bias, y, vec, settled, stream); break;
    case 128: e = scan_tile<128>(S, n_slots, n0, T, H, qc, kc, vc, gate, beta, A_log, dt_bias, y, vec, settled, stream); break;
    default:
        e = sd_launch(scan_global_kernel, H, d, 3 * (size_t)d * sizeof(float), stream, S, n_slots, n0, T, H, d, qc, kc, vc, gate,
                      beta, A_log, dt_bias, y);
    }
    SD_CUDA_CHECK(st, e);
    return SD_OK;
}

static __global__ void out_kernel(float *__restrict__ y, const float *__restrict__ gb, const float *__restrict__ o_norm,
                                  float eps, int H, int d) {
    sd_pdl_enter();
    __shared__ float sh[32];
    const int h = blockIdx.x, t = blockIdx.y, c = threadIdx.x;
    const size_t o = ((size_t)t * H + h) * d + c;
    const bool in = c < d;
    const float yv = in ? y[o] : 0.0f;
    const float ss = sd_block_sum(yv * yv, sh);
    if (in) y[o] = gated_norm_of(yv, ss, o_norm[c], gb[o], eps, d);
}

extern "C" sd_code sd_cuda_kda_out(float *y, const float *gb, const float *o_norm, float eps, int T, int H, int d,
                                   cudaStream_t stream, sd_status *st) {
    SD_NVTX("sd_cuda_kda_out");
    if (d < 1 || d > 1024) return sd_fail(st, SD_ERR_UNSUPPORTED, "cuda kda: head_dim %d outside 1..1024", d);
    if (T < 1 || H < 1) return SD_OK; // a rank holding no head: nothing to compute
    SD_CUDA_CHECK(st, sd_launch(out_kernel, dim3(H, T), sd_round32(d), 0, stream, y, gb, o_norm, eps, H, d));
    return SD_OK;
}
