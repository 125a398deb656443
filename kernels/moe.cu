// moe.cu — router, selection + grouping, the routed experts, the shared expert and the combine.
//   route:   sd_cuda_moe_route (one block per token: 8 warps score experts e ≡ warp (mod 8) with
//            the linear.cuh dot, then one warp selects) — or, in the layer walk, the router
//            logits come from the fused Linear launch and sd_cuda_moe_select selects for every
//            token and groups the T·K entries by expert (moe.h) in one block; it lets its
//            successor start only after its own wait, so the up launch's shared-expert blocks
//            (which read only x) run during the selection. At one token both are one launch
//            (sd_cuda_moe_route_select): the router blocks' dots, then the last of them selects.
//   select:  the CPU's rules. Without group limits and for T·E <= 1024, one thread per (token,
//            expert) makes a 64-bit key (value desc, index asc — the CPU's "largest untaken, ties
//            to the lower index" for NaN-free scores); each warp sorts its 32 keys and offers its
//            K largest, and a candidate's rank among the token's candidates is its place.
//            Otherwise a warp per token: group scores per lane, kept groups by the CPU's
//            take_max, then K rounds of a warp arg-max over the keys held in registers. The
//            grouping ranks the T·K entries (O((T·K)²) compares, no pass over the E experts).
//   up:      grid (Ie rows / 8, [one row of blocks for the shared expert, then] group); per expert
//            row a warp computes the gate dot and another the up dot over all the group's tokens (linear.cuh, one weight read for the tokens),
//            then silu(g)·u — the dense FFN's SWIGLU Linear arithmetic. From two tokens up the
//            block's rows are bulk-copied into shared memory first (BULK below).
//   down:    a block per (16 output rows, unit — the shared expert of one token, or a routed
//            entry): the unit's 16 contiguous weight rows are bulk-copied into shared memory
//            before the wait for the up launch (so they stream during its tail), the activation
//            row is staged beside them after it, then the dots into exp_out; on combine, the row
//            block's last block (an atomic ticket) writes out[t][o] = Σ_j w·exp_out + shared in
//            the CPU's order (optionally added into the residual stream). Measured on the H200
//            (bench_gpu_e2e, kimi-linear-48b-a3b): decode 2.967 -> 2.862 ms, verify T=5 9.40 ->
//            8.83 ms, against a block per 8 rows of every unit with L2 prefetches issued after the
//            wait. With the readiness counters (moe.h) a down block waits for its own expert's up
//            blocks, not for the whole up launch.
// Where the one-token up launch stands (ncu, isolated replay, --clock-control none, 2026-12-01,
// kimi-linear-48b-a3b): 32.3 µs alone, as in the step (no MoE down streaming beside it), DRAM 56%
// busy (2.70 TB/s), multiprocessors active 78% of the time (2.18 waves of 1152 blocks), 7.15 warps
// a scheduler (64 registers: 4 blocks a multiprocessor), 0.42 of them eligible — bound by the
// bytes each multiprocessor keeps in flight and by the tail, not by its launch boundary.
// Tried and not kept (2026-12-01): the one-token route + select's last block starting the address
// translation of every 2 MB page of the chosen experts' gate, up and down matrices (a 16-byte L2
// bulk prefetch per page, each thread holding its expert's table entry from before the wait):
// the up increment 32.5 -> 31.7 µs, the route + select's 7.7 -> 8.8 (bench/ktrace.c), decode
// 2.503 -> 2.514 ms (five alternating pairs), a graph replay 2.426 -> 2.425.
// Tried and not kept (2026-12-01): the up launch's routed blocks loading the group's count,
// bounds and expert in one round after their wait (then the table entry, then the weights: two
// latencies before the first weight load instead of five) and taking row 0 as the input at one
// token: the up increment 32.35 -> 32.06 µs (bench/ktrace.c), the step unchanged (2.485-2.495 ms)
// — the routed blocks' starts are not what bounds the launch.
// Tried and not kept (2026-11-29, kimi-linear-48b-a3b decode): the up launch's first-wave routed
// blocks guessing their expert from the router logits while the selection runs (select_rank's
// keys, the g-th smallest chosen id) to bulk-prefetch their rows into L2 before their wait: up
// increment 27.3 -> 26.7 µs, select 5.3 -> 5.8 µs (bench/ktrace.c), the step unchanged (2.831 ->
// 2.846 ms) — the prefetches take the bandwidth the shared expert's blocks were using; nor did
// the same guess start the rows' bulk copies into shared memory before the wait (BULK at one
// token, a wrong guess re-copied after it): up increment 27.9 µs either way, the step 2.793 ms
// against 2.791 — HBM is already busy with the shared expert during the selection. The up
// launch's last blocks bulk-prefetching the selected experts' down matrices into L2 as they
// finish: 2.999 -> 3.146 ms (the moe block 59.3 -> 66.5 µs). A resident down grid (block b taking items b, b+G, ... through
// 2-4 bulk-copied stages, the next copy issued as soon as a stage is read; same dots, tickets
// and bits): decode 2.791 -> 2.967 ms at 3 blocks × 2 stages a multiprocessor, 3.041 at 2 × 3,
// 3.073 at 2 × 2, 3.429 at 1 × 4 — more blocks in flight beat deeper stages: each item's
// dot-fence-ticket chain, not the copies, bounds it. Before that: the selection as the tail of the
// router's Linear launch (its last block to finish selects, after a threadfence + atomic ticket)
// instead of a launch of its own: same bits, but the step went 3.72 -> 3.82 ms — programmatic
// dependent launch (pdl.h) already hides the select launch, and the tail serialises behind the
// router's slowest block. Also measured and not kept: down's units × D rows cut evenly across
// every resident warp, the last unit of a row (a per-row atomic ticket) combining it — same
// bits, same 22.9 µs at Kimi T = 1: the evenness of the split is not what bounds it; 4 blocks a
// multiprocessor (128 registers, some spilled) 25.1 µs; 4 output rows a block with a whole
// unit slice a lane in flight 27.5 µs. A block owning its output rows of EVERY stage of the launch
// (2026-11-30: 8, 12 or 16 rows; each routed group's expert, then the shared one, streamed through
// 3-4 bulk-copied slots with their activation rows; no tickets, the block combines its own rows):
// same bits (every GPU suite and moe_lab passed), but decode 2.679-2.695 -> 2.710-2.748 ms at 8
// rows and 3 slots, 2.753-2.763 at 12 and 4, 2.794-2.802 at 16 and 3 (graph 2.560-2.574 ->
// 2.553-2.576 at 8; verify T=2 4.36 -> 4.39-4.48); staging all nine activation rows once with 2
// slots, graph 2.536 but decode 2.710-2.716. Its increment 19.7 -> 20.8 µs and the next layer's
// KDA scan's 4.9 -> 9.3 µs (ktrace): the long-lived down blocks hold the multiprocessors the next
// launches start on. A decode (T = 1) MoE in ONE launch (2026-11-29): a 1-D
// grid of pieces — each expert's up blocks, then its down blocks (32 rows, 256 threads) placed
// LAG experts later, waiting on a per-expert device counter of finished up blocks instead of a
// launch boundary, the last combine re-zeroing the counters. Same device functions, so the same
// bits (a GPU test checked it against the eager arm over 40 tokens), but slower: decode 2.81 ->
// 2.987 ms at LAG 1, 3.063 at 0, 2.889 at 2, 2.870 with every down after every up (the two
// launches' order, one boundary fewer); up through registers instead of bulk copies 3.01-3.03;
// the moe block 52.8 -> 55.7-62.5 µs. The 256-thread down blocks at 2-3 a multiprocessor lose
// more than the boundary costs: the two launches keep 7 down blocks of 128 threads a
// multiprocessor. Each up warp bulk-prefetching its two rows into L2 before its register loads
// (one token): 2.799 -> 2.832 ms, the moe block 52.5 -> 54.3 µs — more bytes in flight do not
// make the up faster. Nor does knowing the experts early: an oracle (the step's own selection,
// recorded by a first run of the same step) bulk-prefetching the last N selected experts'
// gate and up rows into L2 right after the layer's in-projection — in the chain: 2.815 -> 3.175
// ms at N = 2, 3.589 at 8 (a kernel cannot finish before its bulk prefetches land, so the chain
// waits for them); on a side stream forked there, off the chain: 2.803 -> 2.785 at N = 2, 2.802
// at 4, 2.860 at 8, 2.778 at 4 with an evict_last policy. So predicting the routing ahead (from
// the layer's input, say) can buy at most ~1% at these sizes: 50 MB of L2 cannot hold the
// experts across the o_proj, router and shared-expert traffic in between. Nor does dropping the
// selection's launch (its 5.4 µs increment) at one token by letting every routed up block and
// every down block route the token itself in one warp from the router logits (route_warp's keys
// and weights, so the same bits: every GPU suite passed): decode 2.724-2.738 -> 3.294-3.327 ms,
// the up increment 27.4 -> 49.8 µs — each of the 1024 routed up blocks spends its selection
// before its first weight load, and the shared expert's blocks now wait for the router too.
// Nor (2026-11-30) did a routed up block load the group count, its entries and its expert in one
// round trip instead of two: 2.503-2.513 ms against 2.507-2.519. Nor (2026-12-01, three
// alternating pairs each) did a one-token up block take two or three 8-row tiles one after the
// other (64 or 43 blocks an expert instead of 128; the same dots and bits, tested): decode 2.506
// -> 2.806 ms at two, 2.787 at three (graph 2.428 -> 2.726, 2.684) — a tile's loads start only
// once the previous tile's dots are done.
#include "moe.h"
#include "linear.cuh"
#include "linear.h"
#include "l2.h" // sd_cuda_weights_evict_first_on
#include "rows.cuh" // sd_block_rmsnorm (the fused norm of the route + select launch)
#include <cuda/atomic> // cuda::atomic_ref: the readiness counters' acquire
#include <string.h>
#include <type_traits> // std::integral_constant

#define MOE_WARPS 8   // route and up: warps per block
#define UP_RPW 2 // up: rows a warp dots at once (one x load feeds both)
#define UP_ROWS (MOE_WARPS / 2 * UP_RPW) // up: expert rows per block (a gate warp and an up warp each 2)
// down: output rows per block. Kimi decode on the H200 (2026-11-29, beside the 4-block up): 16
// 2.691/2.688 ms, 8 2.689/2.686, 32 2.727/2.742 (though 2.534/2.558 as a graph against 2.570/2.559).
#define DOWN_ROWS 16
#define DOWN_ROWS_PER_WARP 4
#define DOWN_SMEM_MAX (96 * 1024) // down: the most shared memory a block's rows take
#define SEL_MAX_E 1024
#define UP_BULK_MAX (80 * 1024) // up, BULK: the most shared memory a block's gate and up rows take

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

template <int NKEY>
static __global__ void __launch_bounds__(MOE_WARPS * 32, 2)
route_kernel(const float *__restrict__ router, const float *__restrict__ bias, const float *__restrict__ b, int E, int D,
             int K, int G, int topk_group, int renormalize, float scaling, int *__restrict__ sel, float *__restrict__ wts) {
    sd_pdl_enter();
    extern __shared__ float sm[];
    float *s = sm, *sp = sm + E, *gscore = sp + E;
    unsigned char *gtaken = (unsigned char *)(gscore + G);
    const int t = blockIdx.x, lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    const float *bt = b + (size_t)t * D;
    for (int e = w; e < E; e += MOE_WARPS) {
        const float dot = sd_lin_warp_dot(router + (size_t)e * D, false, D, bt);
        if (lane == 0) {
            s[e] = sd_dev_sigmoid(dot);
            sp[e] = s[e] + bias[e];
        }
    }
    __syncthreads();
    if (w == 0) route_warp<NKEY>(s, sp, gscore, gtaken, E, K, G, topk_group, renormalize, scaling, sel + (size_t)t * K, wts + (size_t)t * K);
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

extern "C" sd_code sd_cuda_moe_route(const float *router, const float *bias, const float *b, int T, int E, int D, int K,
                                     int G, int topk_group, bool renormalize, float scaling, int *sel, float *w,
                                     cudaStream_t stream, sd_status *st) {
    SD_NVTX("sd_cuda_moe_route");
    sd_code rc = route_check(E, K, G, st);
    if (rc) return rc;
    if (T < 1) return SD_OK;
    const size_t smem = sizeof(float) * (2 * (size_t)E + G) + G;
    cudaError_t e = cudaSuccess;
    with_nkey(E, [&](auto nk) {
        e = sd_launch(route_kernel<decltype(nk)::value>, T, MOE_WARPS * 32, smem, stream, router, bias, b, E, D, K, G, topk_group,
                      renormalize ? 1 : 0, scaling, sel, w);
    });
    SD_CUDA_CHECK(st, e);
    return SD_OK;
}

// ---------------------------------------------------------------------------- grouping
// The layout of moe.h, for T·K entries.
struct moe_layout {
    int n, gc;
    __host__ __device__ moe_layout(int T, int K, int E) : n(T * K), gc(T * K < E ? T * K : E) {}
    __host__ __device__ int *gexp(int *g) const { return g + 1; }
    __host__ __device__ int *gstart(int *g) const { return g + 1 + gc; }
    __host__ __device__ int *ent(int *g) const { return g + 2 + 2 * gc; }
    __host__ __device__ int *ent_e(int *g) const { return g + 2 + 2 * gc + n; }
    __host__ __device__ const int *gexp(const int *g) const { return g + 1; }
    __host__ __device__ const int *gstart(const int *g) const { return g + 1 + gc; }
    __host__ __device__ const int *ent(const int *g) const { return g + 2 + 2 * gc; }
    __host__ __device__ const int *ent_e(const int *g) const { return g + 2 + 2 * gc + n; }
    __host__ __device__ size_t ints() const { return 2 + 2 * (size_t)gc + 2 * (size_t)n; }
};

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
// over all E experts (the layout of moe.h, as sd_cuda_moe_groups_host builds it). Starts and ends
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
// the n readiness counters (moe.h; NULL: none) the up and down launches after it count into, so
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
    sd_pdl_trigger(); // only now: the up launch's shared-expert blocks read the router launch's output (moe.h)
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
// serial compares, so that count is its length. Measured on the H200 (kimi-linear-48b-a3b, E =
// 256, K = 8, against ranking all 256 keys): the selection's increment 5.1-5.3 -> 4.2 µs
// (bench/ktrace.c), moe_lab's select 6.9 -> 5.6 µs, decode 2.687-2.703 -> 2.649-2.669 ms with
// the forward's tokens change of the same run (walk.c). Otherwise every key's rank is the count
// of the token's larger keys. Then w_j = s[sel_j] summed in selection order, renormalised and
// scaled — route_warp's arithmetic — and the grouping.
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
    sd_pdl_trigger(); // only now: the up launch's shared-expert blocks read the router launch's output (moe.h)
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
    int E, D, K, renormalize;
    float scaling;
    float *logits;
    int *sel;
    float *w;
    int *groups, *ticket, *ready;
    size_t x_off, key_off, bar_off; // shared-memory layout: the rows at 0, then x, the selection's keys, the barrier
    int ef;                         // the router rows copied at L2 evict_first (l2.h)
} route_select_params;

// Measured (bench_gpu_e2e, kimi-linear-48b-a3b, one run, three rounds each): decode 2.614-2.624 ->
// 2.607-2.613 ms, the MoE block 50.0-51.1 -> 48.8-49.1 µs; a graph replay 2.442-2.453 ->
// 2.448-2.452. (An older try, with the shared expert's gate+up in the same launch and every
// block counted, was slower: walk.c.)
// Block b: router rows RS_ROWS·b.., bulk-copied into shared memory before the wait (weights are
// never written); after it the norm of x into shared memory (linear.cu's fused norm: rows.cuh's
// sd_block_rmsnorm; block 0 writes it out), then each warp's row dotted as linear.cu's BULK
// launch dots it (linear.cuh's fast path from shared memory — the order of every Linear, so the
// logits are the router Linear's bits), stored, fenced. Every block then lets the up launch start:
// all it reads before its own wait — the normed row, which block 0 wrote and fenced after zeroing
// the readiness counters — is written by the time the last block does. The last block to finish
// (an atomic ticket, returned to zero) selects (select_rank: the selection launch's code, hence
// its bits). Measured (2026-11-30, with the one-token up's carveout below, one run, three rounds; the
// last block letting the up launch start before its selection): decode 2.539-2.568 -> 2.520-2.529
// ms, a graph replay 2.483-2.506 -> 2.445-2.466, the MoE block 47.2-47.5 -> 45.6-46.1 µs (pdl.h).
// Blocks of 4 or 2 router rows (64 or 128 blocks, shorter copies) changed nothing: 2.508-2.526 and
// 2.502-2.524 ms against 2.505-2.525 (one run, three rounds).
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
        sd_bulk_copy_pol(rows, (const char *)p.router + r0 * pitch, (uint32_t)(nrow * pitch), bar, sd_l2_weights(p.ef));
    }
    const int q = threadIdx.x;
    const float b = q < p.E ? p.bias[q] : 0.0f; // the selection's bias (the last block's)
    sd_pdl_wait();
    if (blockIdx.x == 0) zero_ready(p.ready, p.E + 2); // before this block lets the up launch start
    if (p.nw) {
        sd_block_rmsnorm(p.x, p.nw, p.D, p.eps, xs, red);
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
    sd_pdl_trigger(); // nout is written and fenced (block 0), the counters zeroed: moe.h
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
    if (norm) { p.nw = norm->w; p.eps = norm->eps; p.nout = norm->out; }
    p.E = E; p.D = D; p.K = K; p.renormalize = renormalize ? 1 : 0; p.scaling = scaling;
    p.logits = logits; p.sel = sel; p.w = w; p.groups = groups; p.ticket = ticket; p.ready = ready;
    p.ef = sd_cuda_weights_evict_first_on();
    p.x_off = (size_t)RS_ROWS * D * 4;
    p.key_off = (p.x_off + sizeof(float) * D + 15) & ~(size_t)15;
    p.bar_off = (p.key_off + select_rank_smem(1, K, E) + 15) & ~(size_t)15;
    const size_t smem = p.bar_off + sizeof(uint64_t);
    void (*k)(const route_select_params) = E % 32 == 0 && K <= 32 ? route_select_kernel<true> : route_select_kernel<false>;
    SD_CUDA_CHECK(st, sd_allow_smem((const void *)k, smem));
    SD_CUDA_CHECK(st, sd_launch(k, sd_ceil_div(E, RS_ROWS), SD_LIN_WARPS * 32, smem, stream, p));
    return SD_OK;
}

// ---------------------------------------------------------------------------- experts
typedef struct {
    const sd_cuda_expert *table;
    const int *groups;
    int T, K, E, D, Ie;
    const float *x, *w;
    float *h, *exp_out;
    const void *sgw, *suw; // shared gate and up (s_rows, D), or NULL: the up launch does not compute hs
    int sg_bf16, su_bf16, s_rows;
    const void *sdw; // shared down (D, sd_cols) or NULL
    int sd_bf16, sd_cols;
    float *hs;
    int ld_hs;
    float *shared_out, *out;
    int accumulate, xfast;
    size_t down_smem; // down: shared memory for a block's rows (0: every unit reads global memory)
    int *ready;       // moe.h: (E + 2) readiness counters, or NULL (the down launch waits for the up launch)
    int up_routed, up_shared; // down, with ready: the up blocks that count into a routed expert's and
                              // the shared expert's counter (0: hs was written before the selection)
    int ef;                   // stream the expert weights at L2 evict_first (sd_cuda_weights_evict_first)
} moe_params;

// Block: UP_ROWS rows r0.. of the group's expert; warp 2i computes gate rows r0+2i and r0+2i+1,
// warp 2i+1 the same up rows, over the group's tokens (both rows' chunks in flight per lane);
// then the block writes silu(g)·u — the SWIGLU Linear's arithmetic on the same two dots.
// BULK (bf16 experts, 16-byte aligned rows and inputs): once the block knows its expert, thread 0
// bulk-copies its UP_ROWS gate and up rows into shared memory (linear.cuh) — every weight byte
// of the block in flight at once, no registers holding them — and the warps dot them from there
// (the same chunks, order and bits); other experts take the register path.
template <int TMAX, bool BULK>
static __global__ void __launch_bounds__(MOE_WARPS * 32, TMAX == 1 && !BULK ? 4 : BULK && TMAX <= 2 ? 3 : 2)
moe_up_kernel(const __grid_constant__ moe_params p, int g_lo, int ent_lo, int ent_hi, int with_shared) {
    __shared__ float gu[2][UP_ROWS][TMAX];
    extern __shared__ __align__(128) unsigned char up_sm[]; // BULK: UP_ROWS gate rows, UP_ROWS up rows, the barrier
    // The first row of blocks, when with_shared: the shared expert's hs for every token. It reads
    // only x, written before the selection's launch let this one start: no wait (moe.h). First,
    // because blocks are dispatched in index order: so they are the ones resident while the
    // selection runs, and the routed blocks (which wait for it) come after them.
    const bool shared = with_shared && blockIdx.y == 0;
    const moe_layout L(p.T, p.K, p.E);
    const int *ent = L.ent(p.groups);
    int p0 = 0, p1 = p.T, rows = p.s_rows, key = p.E; // key: the readiness counter the block counts into
    sd_cuda_expert ex = {p.sgw, p.suw, nullptr, p.sg_bf16, p.su_bf16, 0};
    if (shared) sd_pdl_trigger();
    if (!shared) {
        // Routed blocks let the down launch start only after their wait: so it may read the
        // grouping (the selection's output) before its own (moe_down_kernel).
        sd_pdl_wait();
        sd_pdl_trigger();
        const int g = g_lo + (int)blockIdx.y - (with_shared ? 1 : 0);
        if (g >= p.groups[0]) return; // whole block
        const int *gstart = L.gstart(p.groups);
        p0 = max(gstart[g], ent_lo);
        p1 = min(gstart[g + 1], ent_hi);
        if (p0 >= p1) return;
        key = L.gexp(p.groups)[g];
        ex = p.table[key];
        rows = p.Ie;
    }
    if ((int)blockIdx.x * UP_ROWS >= rows) return; // whole block (the grid covers the larger of Ie and s_rows)
    const int warp = threadIdx.x >> 5, half = warp & 1, i = (warp >> 1) * UP_RPW, r = blockIdx.x * UP_ROWS + i;
    const bool live = r < rows; // warp-uniform
    const bool bf = half ? ex.up_bf16 : ex.gate_bf16;
    const size_t pitch = (size_t)p.D * (bf ? 2 : 4), pb = (size_t)p.D * 2;
    const bool bulk = BULK && ex.gate_bf16 && ex.up_bf16 && p.xfast && pb % 16 == 0 && ((uintptr_t)ex.gate & 15) == 0 &&
                      ((uintptr_t)ex.up & 15) == 0; // block-uniform
    uint64_t *bar = (uint64_t *)(up_sm + 2 * UP_ROWS * pb);
    const uint64_t pol = sd_l2_weights(p.ef);
    if (bulk && threadIdx.x == 0) {
        const int r0 = blockIdx.x * UP_ROWS, nrow = min(UP_ROWS, rows - r0);
        sd_bulk_init(bar);
        sd_bulk_expect(bar, (uint32_t)(2 * nrow * pb));
        sd_bulk_copy_pol(up_sm, (const char *)ex.gate + (size_t)r0 * pb, (uint32_t)(nrow * pb), bar, pol);
        sd_bulk_copy_pol(up_sm + UP_ROWS * pb, (const char *)ex.up + (size_t)r0 * pb, (uint32_t)(nrow * pb), bar, pol);
    }
    if (BULK) __syncthreads(); // the barrier is initialised before any thread waits on it
    const char *wrow = bulk ? (const char *)up_sm + (half ? UP_ROWS * pb : 0) + (size_t)i * pb
                            : (const char *)(half ? ex.up : ex.gate) + (size_t)(live ? r : 0) * pitch;
    const char *wrow1 = live && r + 1 < rows ? wrow + pitch : nullptr; // UP_RPW = 2: the next row
    if (bulk && live) sd_bulk_wait(bar, 0);
    for (int q = p0; q < p1; q += TMAX) {
        const int n = min(TMAX, p1 - q);
        sd_lin_gather<TMAX> xs;
        xs.x = p.x;
        xs.ld = (size_t)p.D;
#pragma unroll
        for (int t = 0; t < TMAX; t++) xs.idx[t] = t >= n ? 0 : shared ? q + t : ent[q + t] / p.K;
        float acc[UP_RPW][TMAX];
#pragma unroll
        for (int t = 0; t < TMAX; t++) acc[0][t] = acc[1][t] = 0.0f;
        if (bulk) {
            if (live) {
                const char *w[2] = {wrow, wrow1 ? wrow1 : wrow};
                if (wrow1) sd_lin_dot_fast<TMAX, 2, true, sd_lin_unroll<TMAX>::two, sd_lin_gather<TMAX>, true>(w, p.D, xs, n, acc);
                else sd_lin_dot_fast<TMAX, 1, true, sd_lin_unroll<TMAX>::one, sd_lin_gather<TMAX>, true>(w, p.D, xs, n, acc);
            }
        } else {
            // One token: 4 chunks a lane in flight (2 of each row) within 64 registers, so 4 blocks
            // share a multiprocessor — more of the routed blocks are resident, waiting, when the
            // selection ends. Measured (kimi-linear-48b-a3b decode, H200, one run, two rounds):
            // 10 chunks at 2 blocks (128 registers) 2.718/2.728 ms, 6 at 3 (80) 2.711/2.723, 4 at
            // 4 (64) 2.684/2.700. Two rows a warp halve the blocks, so the group lookups that
            // start each block are paid half as often. (The BULK instance's fallback keeps the
            // default depth, within its register budget.)
            constexpr int U = TMAX == 1 && !BULK ? 4 : sd_lin_unroll<TMAX>::one;
            constexpr int U2 = TMAX == 1 && !BULK ? 2 : sd_lin_unroll<TMAX>::two;
            if (live) sd_lin_dot<TMAX, sd_lin_gather<TMAX>, U, U2>(wrow, bf, wrow1, bf, p.D, xs, n, p.xfast, acc, pol);
        }
#pragma unroll
        for (int t = 0; t < TMAX; t++) {
            if (t >= n) break;
            const float v0 = sd_warp_sum(acc[0][t]), v1 = wrow1 ? sd_warp_sum(acc[1][t]) : 0.0f;
            if ((threadIdx.x & 31) == 0) {
                gu[half][i][t] = v0;
                gu[half][i + 1][t] = v1;
            }
        }
        __syncthreads();
        if (threadIdx.x < UP_ROWS * TMAX) {
            const int ii = threadIdx.x / TMAX, t = threadIdx.x % TMAX, rr = blockIdx.x * UP_ROWS + ii;
            float *dst = shared ? p.hs + (size_t)(q + t) * p.ld_hs + rr : p.h + (size_t)(q + t - ent_lo) * p.Ie + rr;
            if (t < n && rr < rows) *dst = sd_dev_silu(gu[0][ii][t]) * gu[1][ii][t];
        }
        __syncthreads();
    }
    // Every row of the block is written (the loop's last barrier): count the block for the down
    // blocks of its unit. One release by thread 0 after the barrier publishes every thread's rows
    // (a fence in every thread made the up launch's increment 24.7 -> 27.2 µs at one token, and
    // moe_lab's up 49 -> 64 µs at two).
    if (p.ready && threadIdx.x == 0) cuda::atomic_ref<int, cuda::thread_scope_device>(p.ready[key]).fetch_add(1, cuda::memory_order_release);
}

// Unit u of a down launch: when combining, first the shared expert of token u (u < n_shared: its
// activations are the up launch's first blocks, so its down blocks are the first ready); then the
// routed entry q = ent_lo + u - n_shared (expert ent_e[q], activation row q - ent_lo, output
// exp_out[ent[q]]).
struct down_unit {
    const char *w; // row o0 of the unit's down matrix
    const float *x;
    float *dst;    // the unit's output at column o0
    int cols;
    int key;       // its readiness counter: the expert's, or E for the shared expert
    bool bf16;
};

__device__ __forceinline__ down_unit down_unit_of(const moe_params &p, const int *ent, const int *ent_e, int ent_lo,
                                                  int n_shared, int u, int o0) {
    down_unit d;
    if (u >= n_shared) {
        const int q = ent_lo + u - n_shared;
        const sd_cuda_expert ex = p.table[ent_e[q]];
        d.bf16 = ex.down_bf16;
        d.cols = p.Ie;
        d.w = (const char *)ex.down + (size_t)o0 * p.Ie * (d.bf16 ? 2 : 4);
        d.x = p.h + (size_t)(q - ent_lo) * p.Ie;
        d.dst = p.exp_out + (size_t)ent[q] * p.D + o0;
        d.key = ent_e[q];
    } else {
        d.bf16 = p.sd_bf16; // token u's
        d.cols = p.sd_cols;
        d.w = (const char *)p.sdw + (size_t)o0 * p.sd_cols * (d.bf16 ? 2 : 4);
        d.x = p.hs + (size_t)u * p.ld_hs;
        d.dst = p.shared_out + (size_t)u * p.D + o0;
        d.key = p.E;
    }
    return d;
}

// Can thread 0 bulk-copy the unit's nrow rows into a stage of `room` bytes? Block-uniform.
__device__ __forceinline__ bool down_bulk(const down_unit &d, int nrow, size_t room) {
    const size_t pitch = (size_t)d.cols * (d.bf16 ? 2 : 4);
    return d.bf16 && ((uintptr_t)d.w & 15) == 0 && pitch % 16 == 0 && nrow * pitch <= room;
}

// The unit's nrow rows (in shared memory at wsm once `bar` completes `parity`, when bulk; else
// global) dotted against its activation row into d.dst, DOWN_ROWS_PER_WARP rows a warp; each
// writing lane then fences its outputs for the ticket. Every thread calls it.
__device__ __forceinline__ void down_dot(const down_unit &d, int nrow, bool bulk, const unsigned char *wsm, uint64_t *bar,
                                         uint32_t parity) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, r0 = warp * DOWN_ROWS_PER_WARP;
    if (r0 >= nrow) return;
    const size_t pitch = (size_t)d.cols * (d.bf16 ? 2 : 4);
    float acc[DOWN_ROWS_PER_WARP][1];
#pragma unroll
    for (int r = 0; r < DOWN_ROWS_PER_WARP; r++) acc[r][0] = 0.0f;
    const sd_lin_rows xs = {d.x, 0};
    const char *wr[DOWN_ROWS_PER_WARP]; // spare rows repeat the last
#pragma unroll
    for (int r = 0; r < DOWN_ROWS_PER_WARP; r++)
        wr[r] = (bulk ? (const char *)wsm : d.w) + (size_t)min(r0 + r, nrow - 1) * pitch;
    if (bulk) sd_bulk_wait(bar, parity);
    if (bulk && ((uintptr_t)d.x & 15) == 0) {
        sd_lin_dot_fast<1, DOWN_ROWS_PER_WARP, true, 2, sd_lin_rows, true>(wr, d.cols, xs, 1, acc);
    } else {
#pragma unroll
        for (int r = 0; r < DOWN_ROWS_PER_WARP; r++) {
            if (d.bf16) sd_lin_dot_any<1, true>(wr[r], d.cols, xs, 1, acc[r]);
            else sd_lin_dot_any<1, false>(wr[r], d.cols, xs, 1, acc[r]);
        }
    }
#pragma unroll
    for (int r = 0; r < DOWN_ROWS_PER_WARP; r++) {
        if (r0 + r >= nrow) break;
        const float v = sd_warp_sum(acc[r][0]);
        if (lane == 0) d.dst[r0 + r] = v;
    }
    if (lane == 0) __threadfence(); // the outputs, then the ticket
}

// The combine of output rows o0 .. o0+nrow-1 for every token, in the CPU's order, by the block
// whose unit was the row block's last (other blocks' outputs read from L2).
__device__ __forceinline__ void down_combine(const moe_params &p, int o0, int nrow) {
    __threadfence();
    for (int i = threadIdx.x; i < nrow * p.T; i += blockDim.x) {
        const int o = o0 + i % nrow, t = i / nrow;
        float acc = 0.0f;
        for (int j = 0; j < p.K; j++)
            acc = __fadd_rn(acc, __fmul_rn(p.w[(size_t)t * p.K + j], __ldcg(p.exp_out + ((size_t)t * p.K + j) * p.D + o)));
        if (p.sdw) acc = __fadd_rn(acc, __ldcg(p.shared_out + (size_t)t * p.D + o));
        float *y = p.out + (size_t)t * p.D + o;
        *y = p.accumulate ? __fadd_rn(*y, acc) : acc;
    }
}

// Thread 0: counts this unit into row block rb's ticket; true for the last of `units` (which
// returns the ticket to zero: every unit has counted).
__device__ __forceinline__ bool down_ticket(int *tickets, int rb, int units) {
    const bool last = atomicAdd(&tickets[rb], 1) == units - 1;
    if (last) tickets[rb] = 0;
    return last;
}

// Thread 0: waits until the counter reaches `need` (acquire: the counted blocks' writes are
// visible to this block after the barrier that follows).
__device__ __forceinline__ void wait_count(int *counter, int need) {
    cuda::atomic_ref<int, cuda::thread_scope_device> c(*counter);
    while (c.load(cuda::memory_order_acquire) < need) __nanosleep(64);
}

// Block: DOWN_ROWS output rows o0.. of one unit (grid: D / DOWN_ROWS row blocks × the units, at
// least one; the shared expert's units first, as their activations are the up launch's first
// blocks), DOWN_ROWS_PER_WARP rows a warp, dotted against the unit's one activation row.
// Thread 0 bulk-copies the unit's rows (contiguous) into shared memory BEFORE the wait for the
// up launch: the weights are never written and the grouping is the selection's, which the up
// launch's routed blocks waited for before they let this launch start — so the copies stream
// during the up launch's tail. The wait: with p.ready, for the unit's own up blocks only (its
// expert's counter), so the blocks of units whose expert is done dot, finish and make room for
// the next ones while the up launch's last blocks still run; else for the whole up launch.
// Units of another dtype or alignment, or rows over the shared memory given (smem 0), take the
// global-memory dots; both are linear.cuh's order. Then, when combining, the row block's last
// block to finish (tickets[row block] counts them; the last returns it to zero) combines its
// rows for every token in the CPU's order. With p.ready, the launch's last block to finish (its
// count: p.ready[E + 1]) waits for the up launch, so this launch's completion implies it, as
// pdl.h's chain assumes; the next selection zeroes the counters. The walk sets them up to two
// tokens, where they were measured faster (walk.c, MOE_READY_MAX_T).
static __global__ void __launch_bounds__(DOWN_ROWS / DOWN_ROWS_PER_WARP * 32)
moe_down_kernel(const __grid_constant__ moe_params p, int ent_lo, int ent_hi, int units, int combine, int *tickets) {
    extern __shared__ __align__(128) unsigned char down_sm[]; // the unit's rows (BULK)
    __shared__ uint64_t bar;
    __shared__ int last, last_of_launch;
    const int o0 = blockIdx.x * DOWN_ROWS, nrow = min(DOWN_ROWS, p.D - o0);
    const moe_layout L(p.T, p.K, p.E);
    const bool has_unit = (int)blockIdx.y < units; // block-uniform; false: a combine-only launch
    down_unit d = has_unit ? down_unit_of(p, L.ent(p.groups), L.ent_e(p.groups), ent_lo, units - (ent_hi - ent_lo),
                                                (int)blockIdx.y, o0)
                                 : down_unit{};
    const bool bulk = has_unit && down_bulk(d, nrow, p.down_smem);
    if (bulk && threadIdx.x == 0) {
        const uint32_t bytes = (uint32_t)(nrow * (size_t)d.cols * 2);
        sd_bulk_init(&bar);
        sd_bulk_expect(&bar, bytes);
        sd_bulk_copy_pol(down_sm, d.w, bytes, &bar, sd_l2_weights(p.ef));
    }
    sd_pdl_trigger();
    if (!p.ready) sd_pdl_wait();
    else if (has_unit && threadIdx.x == 0) {
        const int need = d.key == p.E ? p.up_shared : p.up_routed;
        if (need) wait_count(p.ready + d.key, need);
    }
    __syncthreads(); // the barrier is initialised before any thread waits on it (and the unit is ready)
    // The activation row beside the rows: one L2 latency for the block, where each warp's dot
    // waited on its own rounds of x loads (ncu: long_scoreboard 14.3 cycles an issue). Measured
    // (bench_gpu_e2e, kimi-linear-48b-a3b, one run, two rounds, without the readiness counters):
    // decode 2.622-2.623 -> 2.606-2.611 ms, a graph replay 2.490-2.510 -> 2.459-2.468, verify
    // T=2 4.29-4.32 -> 4.26, T=5 8.79-8.82 -> 8.59-8.60, T=9 14.54-14.57 -> 14.25-14.26. (The
    // same staging in the T = 1 up launch, whose register-path dots overlap their x loads with
    // the weight stream: decode 2.614-2.624 -> 2.632-2.642 ms.)
    if (bulk && ((uintptr_t)d.x & 15) == 0 && d.cols % 4 == 0) {
        float4 *xsm = (float4 *)(down_sm + p.down_smem);
        for (int i = threadIdx.x; i < d.cols / 4; i += blockDim.x) xsm[i] = ((const float4 *)d.x)[i];
        __syncthreads();
        d.x = (const float *)xsm;
    }
    if (has_unit) down_dot(d, nrow, bulk, down_sm, &bar, 0);
    if (combine) {
        __syncthreads();
        if (threadIdx.x == 0) last = down_ticket(tickets, blockIdx.x, (int)gridDim.y);
        __syncthreads();
        if (last) down_combine(p, o0, nrow);
    }
    if (!p.ready) return;
    __syncthreads();
    if (threadIdx.x == 0) last_of_launch = atomicAdd(p.ready + p.E + 1, 1) == (int)(gridDim.x * gridDim.y) - 1;
    __syncthreads();
    if (last_of_launch) sd_pdl_wait();
}


static bool aligned16(const void *p) { return ((uintptr_t)p & 15) == 0; }

static moe_params params_of(const sd_cuda_moe_args *a) {
    moe_params p;
    memset(&p, 0, sizeof p);
    p.table = a->table; p.groups = a->groups;
    p.T = a->T; p.K = a->K; p.E = a->E; p.D = a->D; p.Ie = a->Ie;
    p.x = a->x; p.w = a->w; p.h = a->h; p.exp_out = a->exp_out;
    if (a->shared_down) {
        p.sdw = a->shared_down->data;
        p.sd_bf16 = a->shared_down->dtype == SD_DT_BF16;
        p.sd_cols = a->shared_down->cols;
    }
    if (a->shared_gate && a->shared_up) {
        p.sgw = a->shared_gate->data;
        p.suw = a->shared_up->data;
        p.sg_bf16 = a->shared_gate->dtype == SD_DT_BF16;
        p.su_bf16 = a->shared_up->dtype == SD_DT_BF16;
        p.s_rows = a->shared_gate->rows;
    }
    p.hs = a->hs; p.ld_hs = a->ld_hs; p.shared_out = a->shared_out; p.out = a->out;
    p.accumulate = a->accumulate;
    p.xfast = aligned16(a->x) && a->D % 4 == 0;
    p.ready = a->ready;
    p.ef = sd_cuda_weights_evict_first_on();
    return p;
}

// Tokens per tile of the expert kernels (a group holds at most T tokens; larger groups loop).
static int tile_of(int T) { return T <= 1 ? 1 : T <= 2 ? 2 : T <= 4 ? 4 : 8; }

extern "C" sd_code sd_cuda_moe_up(const sd_cuda_moe_args *a, int g_lo, int g_hi, int ent_lo, int ent_hi, bool shared,
                                  cudaStream_t stream, sd_status *st) {
    SD_NVTX("sd_cuda_moe_up");
    shared = shared && a->shared_gate && a->shared_up;
    if (shared && (a->shared_gate->dtype != SD_DT_BF16 && a->shared_gate->dtype != SD_DT_F32))
        return sd_fail(st, SD_ERR_UNSUPPORTED, "cuda moe: shared gate dtype %d", (int)a->shared_gate->dtype);
    if (shared && (a->shared_up->dtype != SD_DT_BF16 && a->shared_up->dtype != SD_DT_F32))
        return sd_fail(st, SD_ERR_UNSUPPORTED, "cuda moe: shared up dtype %d", (int)a->shared_up->dtype);
    if (shared && (a->shared_up->rows != a->shared_gate->rows || a->shared_gate->cols != a->D || a->shared_up->cols != a->D))
        return sd_fail(st, SD_ERR_USAGE, "cuda moe: shared gate %dx%d and up %dx%d against D %d", a->shared_gate->rows,
                       a->shared_gate->cols, a->shared_up->rows, a->shared_up->cols, a->D);
    if (a->ready && (g_lo != 0 || g_hi < (a->T * a->K < a->E ? a->T * a->K : a->E) || ent_lo != 0 ||
                     ent_hi != a->T * a->K || shared != (a->shared_gate && a->shared_up)))
        return sd_fail(st, SD_ERR_USAGE, "cuda moe up: the readiness counters need one launch over every group and entry");
    if (a->T < 1 || ((g_hi <= g_lo || ent_hi <= ent_lo) && !shared)) return SD_OK;
    const moe_params p = params_of(a);
    const int routed = g_hi > g_lo && ent_hi > ent_lo ? g_hi - g_lo : 0;
    const int rows = shared && a->shared_gate->rows > a->Ie ? a->shared_gate->rows : a->Ie;
    const dim3 grid(sd_ceil_div(rows, UP_ROWS), routed + (shared ? 1 : 0)), block(MOE_WARPS * 32);
    cudaError_t e;
    // BULK from two tokens up when a block's bf16 rows fit (2 · UP_ROWS · D · 2 bytes; experts of
    // other dtypes take the register path inside it). Measured (moe_lab, Kimi dims, one run): T=1
    // 26.0 -> 27.1 µs (so one token keeps the register path), T=2 50.5 -> 46.0, T=5 114.6
    // -> 107.0, T=9 186.5 -> 185.2. At one token in the walk too (2026-12-01, bench_gpu_e2e kimi
    // decode, three alternating pairs): 2.521 -> 2.543 ms, a graph replay 2.445 -> 2.456.
    const size_t smem = 2 * UP_ROWS * (size_t)a->D * 2 + sizeof(uint64_t);
    const bool bulk = a->T >= 2 && (a->D * 2) % 16 == 0 && smem <= UP_BULK_MAX;
    void (*k)(const moe_params, int, int, int, int);
    switch (tile_of(a->T)) {
    case 1: // the largest shared-memory carveout: the down blocks (36 KB each) can take the place of
            // finished up blocks instead of waiting for a multiprocessor to drain. Measured (kimi
            // decode, one run, two rounds): 2.559-2.564 -> 2.546-2.550 ms, the MoE block 49.1-49.4 ->
            // 46.8-47.1 µs. For every MoE kernel: T=4 6.92 -> 7.41 ms (the BULK instances read their
            // x rows through the L1 it shrinks); for every walk kernel: the KDA mixer 41.4 -> 46.6 µs.
        k = moe_up_kernel<1, false>;
        SD_CUDA_CHECK(st, sd_prefer_shared((const void *)k));
        break;
    case 2: k = bulk ? moe_up_kernel<2, true> : moe_up_kernel<2, false>; break;
    case 4: k = bulk ? moe_up_kernel<4, true> : moe_up_kernel<4, false>; break;
    default: k = bulk ? moe_up_kernel<8, true> : moe_up_kernel<8, false>; break;
    }
    if (bulk) SD_CUDA_CHECK(st, sd_allow_smem((const void *)k, smem));
    e = sd_launch(k, grid, block, bulk ? smem : 0, stream, p, g_lo, ent_lo, ent_hi, shared ? 1 : 0);
    SD_CUDA_CHECK(st, e);
    return SD_OK;
}

extern "C" sd_code sd_cuda_moe_down(const sd_cuda_moe_args *a, int ent_lo, int ent_hi, bool combine,
                                    cudaStream_t stream, sd_status *st) {
    SD_NVTX("sd_cuda_moe_down");
    if (a->T < 1 || (ent_hi <= ent_lo && !combine)) return SD_OK;
    if (a->shared_down && a->shared_down->dtype != SD_DT_BF16 && a->shared_down->dtype != SD_DT_F32)
        return sd_fail(st, SD_ERR_UNSUPPORTED, "cuda moe: shared down dtype %d", (int)a->shared_down->dtype);
    if (combine && !a->tickets) return sd_fail(st, SD_ERR_USAGE, "cuda moe down: the combine needs the tickets (state.h)");
    if (a->ready && (!combine || ent_lo != 0 || ent_hi != a->T * a->K))
        return sd_fail(st, SD_ERR_USAGE, "cuda moe down: the readiness counters need one launch over every entry, with the combine");
    moe_params p = params_of(a);
    p.up_routed = sd_ceil_div(a->Ie, UP_ROWS); // the up blocks of one expert (moe_up_kernel's rows)
    p.up_shared = a->shared_gate && a->shared_up ? sd_ceil_div(a->shared_gate->rows, UP_ROWS) : 0;
    const int cols = a->shared_down && a->shared_down->cols > a->Ie ? a->shared_down->cols : a->Ie;
    p.down_smem = (size_t)DOWN_ROWS * cols * 2; // bf16 rows
    if (p.down_smem > DOWN_SMEM_MAX) p.down_smem = 0;
    const int units = (ent_hi - ent_lo) + (combine && a->shared_down ? a->T : 0);
    const size_t smem = p.down_smem ? p.down_smem + sizeof(float) * cols : 0; // the rows, then the activation row
    SD_CUDA_CHECK(st, sd_allow_smem((const void *)moe_down_kernel, smem));
    SD_CUDA_CHECK(st, sd_launch(moe_down_kernel, dim3(sd_ceil_div(a->D, DOWN_ROWS), units > 1 ? units : 1),
                                DOWN_ROWS / DOWN_ROWS_PER_WARP * 32, smem, stream, p, ent_lo, ent_hi, units,
                                combine ? 1 : 0, a->tickets));
    SD_LAUNCH_CHECK(st);
    return SD_OK;
}

// ---------------------------------------------------------------------------- dense FFN
static __global__ void silu_mul_kernel(float *__restrict__ h, const float *__restrict__ h2, size_t n) {
    sd_pdl_enter();
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        h[i] = sd_dev_silu(h[i]) * h2[i];
}

extern "C" sd_code sd_cuda_silu_mul(float *h, const float *h2, size_t n, cudaStream_t stream, sd_status *st) {
    SD_NVTX("sd_cuda_silu_mul");
    if (!n) return SD_OK;
    SD_CUDA_CHECK(st, sd_launch(silu_mul_kernel, (int)(n < 256 * 1024 ? (n + 255) / 256 : 1024), 256, 0, stream, h, h2, n));
    SD_LAUNCH_CHECK(st);
    return SD_OK;
}

extern "C" sd_code sd_cuda_ffn(const sd_ffn_weights *w, const float *x, int T, float *out, float *h1, float *h2,
                               cudaStream_t stream, sd_status *st) {
    SD_NVTX("sd_cuda_ffn");
    (void)h2;
    const int D = w->gate.cols, I = w->gate.rows;
    const sd_lin_job up = {.w = &w->gate, .w2 = &w->up, .x = x, .ldx = D, .y = h1, .ldy = I, .mode = SD_LIN_SWIGLU};
    const sd_lin_job down = {.w = &w->down, .x = h1, .ldx = I, .y = out, .ldy = w->down.rows, .mode = SD_LIN_STORE};
    sd_code rc = sd_cuda_linear_multi(&up, 1, T, stream, st);
    if (!rc) rc = sd_cuda_linear_multi(&down, 1, T, stream, st);
    return rc;
}
