// moe_route.cu — the MoE router's selection and the grouping of the routed entries by expert
// (moe_route.h), with the CPU's rules (engine/cpu/moe.c sd_moe_route).
//   select:  without group limits and for T·E <= 1024, one thread per (token, expert) makes a
//            64-bit key (value desc, index asc — the CPU's "largest untaken, ties to the lower
//            index" for NaN-free scores); each warp sorts its 32 keys and offers its K largest, and
//            a candidate's rank among the token's candidates is its place. Otherwise a warp per
//            token: group scores per lane, kept groups by the CPU's take_max, then K rounds of a
//            warp arg-max over the keys held in registers. The selection lets its successor start
//            only after its own wait, so the up launch's shared-expert blocks (which read only x)
//            run during the selection.
//   group:   the T·K entries ranked by (expert, entry) — O((T·K)²) compares, no pass over the E
//            experts — into the layout of moe_layout.cuh.
//   one token: the router Linear and the selection in one launch (route_select): the router
//            blocks' dots, then the last of them selects with the same code.
#include "moe_route.h"
#include <string.h>
#include <type_traits> // std::integral_constant
#include "linear.cuh"    // sd_lin_dot_fast, sd_bulk_* (the router rows of route_select)
#include "moe_layout.cuh" // moe_layout
#include "rows.cuh"      // sd_block_rmsnorm (the fused norm of route_select)

#define SEL_MAX_E 1024 // the most experts a selection ranks

// The CPU's take_max: the largest untaken v[i], ties to the lower index.
__device__ static int take_max(const float *v, int n, const unsigned char *taken) {
    int best = -1;
    for (int i = 0; i < n; i++)
        if (!taken[i] && (best < 0 || v[i] > v[best])) best = i;
    return best;
}

// One warp routes one token from s (E) and sp = s + bias (E, masked in place when G > 1);
// gscore (G floats) and gtaken (G bytes) are this warp's scratch. Writes sel[0..K), w[0..K)
// (K <= 32: lane j holds selection j).
template <int NKEY>
__device__ static void route_warp(const float *s, float *sp, float *gscore, unsigned char *gtaken, int E, int K, int G,
                                  int topk_group, int renormalize, float scaling, int *sel, float *wt) {
    const int lane = threadIdx.x & 31;
    if (G > 1) { // keep the topk_group groups with the best top-2 sums; mask the rest
        const int per = E / G;
        for (int g = lane; g < G; g += 32) {
            const float *v = sp + g * per;
            float top = v[0] > v[1] ? v[0] : v[1], second = v[0] > v[1] ? v[1] : v[0];
            for (int i = 2; i < per; i++) {
                if (v[i] > top) { second = top; top = v[i]; }
                else if (v[i] > second) second = v[i];
            }
            gscore[g] = top + second;
            gtaken[g] = 0;
        }
        __syncwarp();
        if (lane == 0)
            for (int kept = 0; kept < topk_group; kept++) gtaken[take_max(gscore, G, gtaken)] = 1;
        __syncwarp();
        for (int e = lane; e < E; e += 32)
            if (!gtaken[e / per]) sp[e] = -INFINITY;
        __syncwarp();
    }
    // Top-K: each lane holds the keys of entries lane + 32·i, i < NKEY (32·NKEY >= E: the loops
    // cover only the experts there are); a key orders (value desc, index asc), a taken entry's
    // key is 0 (below every value's).
    uint64_t key[NKEY];
#pragma unroll
    for (int i = 0; i < NKEY; i++) {
        const int e = lane + 32 * i;
        key[i] = 0;
        if (e < E) {
            const uint32_t u = __float_as_uint(sp[e] == 0.0f ? 0.0f : sp[e]); // -0 ties +0, as in take_max
            const uint32_t ord = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
            key[i] = (uint64_t)ord << 32 | (uint32_t)~(uint32_t)e;
        }
    }
    int mine = 0; // lane j ends with the j-th selection
    for (int j = 0; j < K; j++) {
        uint64_t best = 0;
#pragma unroll
        for (int i = 0; i < NKEY; i++) best = key[i] > best ? key[i] : best;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            const uint64_t other = __shfl_xor_sync(0xffffffffu, best, o);
            best = other > best ? other : best;
        }
        const int e = (int)~(uint32_t)best;
#pragma unroll
        for (int i = 0; i < NKEY; i++)
            if (lane + 32 * i == e) key[i] = 0;
        if (lane == j) mine = e;
    }
    // w_j = s[sel_j]; Σ in selection order (every lane the same chain), renormalise, scale.
    float wj = lane < K ? s[mine] : 0.0f, sum = 0.0f;
    for (int j = 0; j < K; j++) sum += __shfl_sync(0xffffffffu, wj, j);
    if (renormalize) wj = wj / sum;
    wj = wj * scaling;
    if (lane < K) {
        sel[lane] = mine;
        wt[lane] = wj;
    }
}

// f(std::integral_constant<int, NKEY>) with NKEY the power of two >= ceil(E / 32) (route_warp's
// keys per lane; E <= SEL_MAX_E).
template <class F> static void with_nkey(int E, F f) {
    const int n = (E + 31) / 32;
    if (n <= 1) f(std::integral_constant<int, 1>());
    else if (n <= 2) f(std::integral_constant<int, 2>());
    else if (n <= 4) f(std::integral_constant<int, 4>());
    else if (n <= 8) f(std::integral_constant<int, 8>());
    else if (n <= 16) f(std::integral_constant<int, 16>());
    else f(std::integral_constant<int, 32>());
}

static sd_code route_check(int E, int K, int G, sd_status *st) {
    if (G < 1 || E % G || K > E || K < 1) return sd_fail(st, SD_ERR_USAGE, "cuda moe route: E %d, G %d, K %d", E, G, K);
    if (K > 32) return sd_fail(st, SD_ERR_UNSUPPORTED, "cuda moe route: %d experts per token > 32", K);
    if (E > SEL_MAX_E) return sd_fail(st, SD_ERR_UNSUPPORTED, "cuda moe route: %d experts > %d", E, SEL_MAX_E);
    return SD_OK;
}

// ---------------------------------------------------------------------------- grouping
extern "C" size_t sd_cuda_moe_groups_ints(int T, int K, int E) { return moe_layout(T, K, E).ints(); }

extern "C" void sd_cuda_moe_groups_host(const int *sel, int T, int K, int E, int *groups) {
    const moe_layout L(T, K, E);
    int *gexp = L.gexp(groups), *gstart = L.gstart(groups), *ent = L.ent(groups), *ent_e = L.ent_e(groups);
    int ng = 0, p = 0;
    for (int e = 0; e < E; e++) {
        const int first = p;
        for (int i = 0; i < L.n; i++)
            if (sel[i] == e) {
                ent[p] = i;
                ent_e[p++] = e;
            }
        if (p > first) {
            gexp[ng] = e;
            gstart[ng++] = first;
        }
    }
    gstart[ng] = p;
    groups[0] = ng;
}

// The block groups the n = T·K entries of sel_sh (shared memory; head: n ints of scratch) by
// rank: entry i's place in (expert, entry) order is the count of entries before it there, and an
// expert's group number the count of smaller experts that head a group — O(n²) compares, no pass
// over all E experts (moe_layout.cuh, as sd_cuda_moe_groups_host builds it). Starts and ends
// with a barrier's worth of ordering: sel_sh must be complete before the call.
__device__ static void group_entries(const int *sel_sh, int *head, const moe_layout &L, int *groups) {
    int *gexp = L.gexp(groups), *gstart = L.gstart(groups), *ent = L.ent(groups), *ent_e = L.ent_e(groups);
    for (int i = threadIdx.x; i < L.n; i += blockDim.x) {
        const int e = sel_sh[i];
        int rank = 0, first = 1;
        for (int i2 = 0; i2 < L.n; i2++) {
            const int e2 = sel_sh[i2];
            rank += e2 < e || (e2 == e && i2 < i);
            first &= !(e2 == e && i2 < i);
        }
        ent[rank] = i;
        ent_e[rank] = e;
        head[i] = first ? rank : -1; // a group's first entry: its start
    }
    __syncthreads();
    for (int i = threadIdx.x; i < L.n; i += blockDim.x) {
        if (head[i] < 0) continue;
        const int e = sel_sh[i];
        int g = 0, last = 1;
        for (int i2 = 0; i2 < L.n; i2++)
            if (head[i2] >= 0) {
                g += sel_sh[i2] < e;
                last &= sel_sh[i2] <= e;
            }
        gexp[g] = e;
        gstart[g] = head[i];
        if (last) { // the largest expert's group closes the list
            gstart[g + 1] = L.n;
            groups[0] = g + 1;
        }
    }
}

// The selection's launch, after its wait and before it lets the up launch start: the block zeroes
// the n readiness counters (moe_experts.h; NULL: none) the up and down launches after it count into, so
// every MoE call starts from zero whatever an earlier call left (a forward stopped between its up
// and down launches, say). Every writer fences, then the barrier: the zeros are visible before
// the trigger.
__device__ static void zero_ready(int *ready, int n) {
    if (!ready) return;
    for (int i = threadIdx.x; i < n; i += blockDim.x) ready[i] = 0;
    __threadfence();
    __syncthreads();
}

// One block, warp w routing tokens w, w+nw, ... (route_warp; every lane's logits and biases
// loaded at once, the biases before the wait: weights are never written), then the grouping.
template <int NKEY>
static __global__ void select_kernel(const float *__restrict__ logits, const float *__restrict__ bias, int T, int E, int K,
                                     int G, int topk_group, int renormalize, float scaling, int *sel, float *wts,
                                     int *__restrict__ groups, int *ready) {
    extern __shared__ float sm[];
    const int nw = blockDim.x >> 5, w = threadIdx.x >> 5, lane = threadIdx.x & 31;
    float *s = sm + (size_t)w * (2 * E + G), *sp = s + E, *gscore = sp + E;
    unsigned char *gbytes = (unsigned char *)(sm + (size_t)nw * (2 * E + G));
    unsigned char *gtaken = gbytes + (size_t)w * G;
    const moe_layout L(T, K, E);
    int *sel_sh = (int *)(gbytes + (((size_t)nw * G + 3) & ~(size_t)3)), *head = sel_sh + L.n;
    float bv[NKEY];
#pragma unroll
    for (int i = 0; i < NKEY; i++) bv[i] = lane + 32 * i < E ? bias[lane + 32 * i] : 0.0f;
    sd_pdl_wait();
    zero_ready(ready, E + 2);
    sd_pdl_trigger(); // only now: the up launch's shared-expert blocks read the router launch's output (moe_experts.h)
    for (int t = w; t < T; t += nw) {
        float lv[NKEY];
#pragma unroll
        for (int i = 0; i < NKEY; i++) lv[i] = lane + 32 * i < E ? logits[(size_t)t * E + lane + 32 * i] : 0.0f;
#pragma unroll
        for (int i = 0; i < NKEY; i++) {
            const int e = lane + 32 * i;
            if (e < E) {
                s[e] = sd_dev_sigmoid(lv[i]);
                sp[e] = s[e] + bv[i];
            }
        }
        __syncwarp();
        route_warp<NKEY>(s, sp, gscore, gtaken, E, K, G, topk_group, renormalize, scaling, sel + (size_t)t * K, wts + (size_t)t * K);
        if (lane < K) sel_sh[t * K + lane] = sel[(size_t)t * K + lane]; // this lane's own write
        __syncwarp();
    }
    __syncthreads(); // every token's selection is in sel_sh
    group_entries(sel_sh, head, L, groups);
}

static size_t select_smem(int nw, int T, int K, int E, int G) {
    return sizeof(float) * (size_t)nw * (2 * (size_t)E + G) + (((size_t)nw * G + 3) & ~(size_t)3) +
           sizeof(int) * 2 * (size_t)T * K;
}

// No group limit (G = 1) and T·E <= 1024: one thread per (token, expert). Thread (t, e) makes
// expert e's key — (sigmoid(logit) + bias, then the lower index) as route_warp orders them; keys
// are distinct, so the experts of the token's K largest keys, largest first, are route_warp's
// selection in route_warp's order. WARPSORT (E a multiple of 32, K <= 32): each warp sorts its 32
// keys (a bitonic network over shuffles) and offers its K largest; a candidate's rank is the
// count of the token's larger candidates (E/32·K of them, not E) — the kernel is one block of
// serial compares, so that count is its length (docs/EXPERIMENTS.md#moe-select-warpsort).
// Otherwise every key's rank is the count of the token's larger keys. Then w_j = s[sel_j] summed
// in selection order, renormalised and scaled — route_warp's arithmetic — and the grouping.
// The body: thread q < T·E holds (token q / E, expert q % E) with b = its bias; key: the shared
// memory of select_rank_smem. Logits are read from L2 (__ldcg): the fused route's other blocks
// wrote them during this launch.
template <bool WARPSORT>
__device__ static void select_rank(const float *logits, float b, int T, int E, int K, int renormalize, float scaling,
                                   int *sel, float *wts, int *groups, unsigned long long *key) {
    float *s = (float *)(key + (size_t)T * E);
    const moe_layout L(T, K, E);
    int *sel_sh = (int *)(s + (size_t)T * E), *head = sel_sh + L.n;
    const int q = threadIdx.x, t = q / E, e = q - t * E;
    const bool live = q < T * E;
    unsigned long long mine = 0; // below every key: an ordered value is never 0 with ~e in the low half
    if (live) {
        const float sv = sd_dev_sigmoid(__ldcg(logits + q)), sp = sv + b;
        const uint32_t u = __float_as_uint(sp == 0.0f ? 0.0f : sp); // -0 ties +0, as in take_max
        const uint32_t ord = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
        mine = (unsigned long long)ord << 32 | (uint32_t)~(uint32_t)e;
        s[q] = sv;
    }
    // rank = the count of larger keys among `n` at kt: four (two 16-byte loads) an iteration when aligned
    auto rank_of = [](unsigned long long k, const unsigned long long *kt, int n) {
        int rank = 0, i = 0;
        if ((((uintptr_t)kt) & 15) == 0)
            for (; i + 4 <= n; i += 4) {
                const ulonglong2 a = *(const ulonglong2 *)(kt + i), b2 = *(const ulonglong2 *)(kt + i + 2);
                rank += (a.x > k) + (a.y > k) + (b2.x > k) + (b2.y > k);
            }
        for (; i < n; i++) rank += kt[i] > k;
        return rank;
    };
    if constexpr (WARPSORT) { // a warp holds 32 experts of one token (E % 32 == 0)
        const int lane = q & 31, nc = (E / 32) * K;
        unsigned long long kv = mine;
#pragma unroll
        for (int k = 2; k <= 32; k <<= 1)
#pragma unroll
            for (int j = k >> 1; j > 0; j >>= 1) { // descending: the lower lane of a pair keeps the larger
                const unsigned long long o = __shfl_xor_sync(0xffffffffu, kv, j);
                kv = (((lane & j) == 0) == ((lane & k) == 0)) ? (o > kv ? o : kv) : (o < kv ? o : kv);
            }
        if (live && lane < K) key[(size_t)t * nc + (e >> 5) * K + lane] = kv;
        __syncthreads();
        if (q < T * nc) {
            const int t2 = q / nc, rank = rank_of(key[q], key + (size_t)t2 * nc, nc);
            if (rank < K) sel_sh[t2 * K + rank] = (int)~(uint32_t)key[q];
        }
    } else {
        if (live) key[q] = mine;
        __syncthreads();
        if (live) {
            const int rank = rank_of(mine, key + (size_t)t * E, E);
            if (rank < K) sel_sh[t * K + rank] = e;
        }
    }
    __syncthreads();
    if (live && e < K) { // thread (t, j = e): selection j of token t
        const int j = e, *st = sel_sh + t * K;
        float sum = 0.0f;
        for (int j2 = 0; j2 < K; j2++) sum += s[(size_t)t * E + st[j2]];
        float wj = s[(size_t)t * E + st[j]];
        if (renormalize) wj = wj / sum;
        wj = wj * scaling;
        sel[(size_t)t * K + j] = st[j];
        wts[(size_t)t * K + j] = wj;
    }
    group_entries(sel_sh, head, L, groups);
}

template <bool WARPSORT>
static __global__ void select_rank_kernel(const float *__restrict__ logits, const float *__restrict__ bias, int T, int E,
                                          int K, int renormalize, float scaling, int *sel, float *wts,
                                          int *__restrict__ groups, int *ready) {
    extern __shared__ __align__(8) unsigned long long key[]; // (T, E), then s (T, E) floats, then sel_sh, head
    const int q = threadIdx.x;
    const float b = q < T * E ? bias[q % E] : 0.0f;
    sd_pdl_wait();
    zero_ready(ready, E + 2);
    sd_pdl_trigger(); // only now: the up launch's shared-expert blocks read the router launch's output (moe_experts.h)
    select_rank<WARPSORT>(logits, b, T, E, K, renormalize, scaling, sel, wts, groups, key);
}

static size_t select_rank_smem(int T, int K, int E) {
    return (sizeof(unsigned long long) + sizeof(float)) * (size_t)T * E + sizeof(int) * 2 * (size_t)T * K;
}

extern "C" sd_code sd_cuda_moe_select(const float *logits, const float *bias, int T, int E, int K, int G, int topk_group,
                                      bool renormalize, float scaling, int *sel, float *w, int *groups, int *ready,
                                      cudaStream_t stream, sd_status *st) {
    SD_NVTX("sd_cuda_moe_select");
    sd_code rc = route_check(E, K, G, st);
    if (rc) return rc;
    if (T < 1) return SD_OK;
    if (G == 1 && T * E <= 1024 && select_rank_smem(T, K, E) <= 48 * 1024) {
        SD_CUDA_CHECK(st, sd_launch(E % 32 == 0 && K <= 32 ? select_rank_kernel<true> : select_rank_kernel<false>, 1,
                                    sd_ceil_div(T * E, 32) * 32, select_rank_smem(T, K, E), stream, logits, bias, T, E, K,
                                    renormalize ? 1 : 0, scaling, sel, w, groups, ready));
        return SD_OK;
    }
    int nw = T < 16 ? T : 16;
    while (nw > 1 && select_smem(nw, T, K, E, G) > 48 * 1024) nw--;
    const size_t smem = select_smem(nw, T, K, E, G);
    if (smem > 48 * 1024) return sd_fail(st, SD_ERR_UNSUPPORTED, "cuda moe select: %d experts need %zu bytes of shared memory", E, smem);
    cudaError_t e = cudaSuccess;
    with_nkey(E, [&](auto nk) {
        e = sd_launch(select_kernel<decltype(nk)::value>, 1, nw * 32, smem, stream, logits, bias, T, E, K, G, topk_group,
                      renormalize ? 1 : 0, scaling, sel, w, groups, ready);
    });
    SD_CUDA_CHECK(st, e);
    return SD_OK;
}

// ---------------------------------------------------------------------------- route + select, one token
// One launch for the router Linear and the selection at one token (sd_cuda_moe_route_select).
#define RS_ROWS SD_LIN_WARPS // router rows a block: one a warp
typedef struct {
    const float *router, *bias; // (E, D) F32, (E)
    const float *x, *nw;        // the block's input (T = 1, D); nw: the norm's weight, or NULL (x as is)
    float eps;
    float *nout;                // the normed row (block 0 writes it), with nw
    int *nflag, nsite;          // the non-finite flag the norm sets (block 0), or NULL
    int E, D, K, renormalize;
    float scaling;
    float *logits;
    int *sel;
    float *w;
    int *groups, *ticket, *ready;
    size_t x_off, key_off, bar_off; // shared-memory layout: the rows at 0, then x, the selection's keys, the barrier
} route_select_params;

// Block b: router rows RS_ROWS·b.., bulk-copied into shared memory before the wait (weights are
// never written); after it the norm of x into shared memory (linear.cu's fused norm: rows.cuh's
// sd_block_rmsnorm; block 0 writes it out), then each warp's row dotted as linear.cu's BULK
// launch dots it (linear.cuh's fast path from shared memory — the order of every Linear, so the
// logits are the router Linear's bits), stored, fenced. Every block then lets the up launch start:
// all it reads before its own wait — the normed row, which block 0 wrote and fenced after zeroing
// the readiness counters — is written by the time the last block does. The last block to finish
// (an atomic ticket, returned to zero) selects (select_rank: the selection launch's code, hence
// its bits). docs/EXPERIMENTS.md#moe-route-select-one-launch has the measurements behind the shape.
template <bool WARPSORT>
static __global__ void __launch_bounds__(SD_LIN_WARPS * 32) route_select_kernel(const __grid_constant__ route_select_params p) {
    extern __shared__ __align__(128) unsigned char rs_sm[];
    __shared__ float red[32];
    __shared__ int last;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, r0 = blockIdx.x * RS_ROWS, nrow = min(RS_ROWS, p.E - r0);
    const size_t pitch = (size_t)p.D * 4;
    unsigned char *rows = rs_sm;
    float *xs = (float *)(rs_sm + p.x_off);
    uint64_t *bar = (uint64_t *)(rs_sm + p.bar_off);
    if (threadIdx.x == 0) {
        sd_bulk_init(bar);
        sd_bulk_expect(bar, (uint32_t)(nrow * pitch));
        sd_bulk_copy_pol(rows, (const char *)p.router + r0 * pitch, (uint32_t)(nrow * pitch), bar, sd_l2_evict_first());
    }
    const int q = threadIdx.x;
    const float b = q < p.E ? p.bias[q] : 0.0f; // the selection's bias (the last block's)
    sd_pdl_wait();
    if (blockIdx.x == 0) zero_ready(p.ready, p.E + 2); // before this block lets the up launch start
    if (p.nw) {
        sd_block_rmsnorm(p.x, p.nw, p.D, p.eps, xs, red, blockIdx.x == 0 ? p.nflag : nullptr, p.nsite);
        __syncthreads();
        if (blockIdx.x == 0)
            for (int i = threadIdx.x; i < p.D; i += blockDim.x) p.nout[i] = xs[i];
    } else {
        for (int i = threadIdx.x; i < p.D; i += blockDim.x) xs[i] = p.x[i];
        __syncthreads();
    }
    if (warp < nrow) {
        const sd_lin_rows xr = {xs, (size_t)p.D};
        const char *w[1] = {(const char *)rows + warp * pitch};
        float acc[1][1] = {{0.0f}};
        sd_bulk_wait(bar, 0);
        sd_lin_dot_fast<1, 1, false, sd_lin_unroll<1>::one, sd_lin_rows, true>(w, p.D, xr, 1, acc);
        const float v = sd_warp_sum(acc[0][0]);
        if (lane == 0) {
            p.logits[r0 + warp] = v;
            __threadfence(); // the logit, then the ticket
        }
    }
    if (blockIdx.x == 0) __threadfence(); // nout, then the ticket
    __syncthreads();
    sd_pdl_trigger(); // nout is written and fenced (block 0), the counters zeroed: moe_experts.h
    if (threadIdx.x == 0) {
        last = atomicAdd(p.ticket, 1) == (int)gridDim.x - 1;
        if (last) *p.ticket = 0;
    }
    __syncthreads();
    if (!last) return;
    __threadfence();
    select_rank<WARPSORT>(p.logits, b, 1, p.E, p.K, p.renormalize, p.scaling, p.sel, p.w, p.groups,
                          (unsigned long long *)(rs_sm + p.key_off));
}

extern "C" bool sd_cuda_moe_route_select_fits(int T, int E, int D, int G) {
    return T == 1 && G == 1 && E >= 1 && E <= SD_LIN_WARPS * 32 && D % 4 == 0 &&
           (size_t)RS_ROWS * D * 4 + sizeof(float) * D <= 160 * 1024;
}

extern "C" sd_code sd_cuda_moe_route_select(const float *router, const float *bias, const float *x, const sd_lin_norm *norm,
                                            int T, int E, int D, int K, int G, bool renormalize, float scaling,
                                            float *logits, int *sel, float *w, int *groups, int *ticket, int *ready,
                                            cudaStream_t stream, sd_status *st) {
    SD_NVTX("sd_cuda_moe_route_select");
    sd_code rc = route_check(E, K, G, st);
    if (rc) return rc;
    if (!sd_cuda_moe_route_select_fits(T, E, D, G) || ((uintptr_t)router & 15))
        return sd_fail(st, SD_ERR_UNSUPPORTED, "cuda moe route+select: T %d, E %d, D %d, G %d (sd_cuda_moe_route_select_fits)",
                       T, E, D, G);
    if (norm && (norm->n != D || norm->x != x))
        return sd_fail(st, SD_ERR_USAGE, "cuda moe route+select: the norm's row (%d) is not x's (%d)", norm->n, D);
    route_select_params p;
    memset(&p, 0, sizeof p);
    p.router = router; p.bias = bias; p.x = x;
    if (norm) { p.nw = norm->w; p.eps = norm->eps; p.nout = norm->out; p.nflag = norm->flag; p.nsite = norm->site; }
    p.E = E; p.D = D; p.K = K; p.renormalize = renormalize ? 1 : 0; p.scaling = scaling;
    p.logits = logits; p.sel = sel; p.w = w; p.groups = groups; p.ticket = ticket; p.ready = ready;
    p.x_off = (size_t)RS_ROWS * D * 4;
    p.key_off = (p.x_off + sizeof(float) * D + 15) & ~(size_t)15;
    p.bar_off = (p.key_off + select_rank_smem(1, K, E) + 15) & ~(size_t)15;
    const size_t smem = p.bar_off + sizeof(uint64_t);
    void (*k)(const route_select_params) = E % 32 == 0 && K <= 32 ? route_select_kernel<true> : route_select_kernel<false>;
    SD_CUDA_CHECK(st, sd_allow_smem((const void *)k, smem));
    SD_CUDA_CHECK(st, sd_launch(k, sd_ceil_div(E, RS_ROWS), SD_LIN_WARPS * 32, smem, stream, p));
    return SD_OK;
}

