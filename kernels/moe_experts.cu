// moe_experts.cu — the routed experts, the shared expert and the combine of the MoE block
// (moe_experts.h), over the grouping the selection wrote (moe_layout.cuh).
//   up:    grid (Ie rows / 8, [one row of blocks for the shared expert, then] group); per expert
//          row a warp computes the gate dot and another the up dot over all the group's tokens
//          (linear.cuh, one weight read for the tokens), then silu(g)·u — the dense FFN's SWIGLU
//          Linear arithmetic. From two tokens up the block's rows are bulk-copied into shared
//          memory first (BULK).
//   down:  a block per (16 output rows, unit — the shared expert of one token, or a routed
//          entry): the unit's 16 contiguous weight rows are bulk-copied into shared memory before
//          the wait for the up launch (so they stream during its tail), the activation row is
//          staged beside them after it, then the dots into exp_out; on combine, the row block's
//          last block (an atomic ticket) writes out[t][o] = Σ_j w·exp_out + shared in the CPU's
//          order (optionally added into the residual stream). With the readiness counters a down
//          block waits for its own expert's up blocks, not for the whole up launch.
// The decode MoE stays two launches, and neither predicts nor prefetches the routing:
// docs/EXPERIMENTS.md#moe-one-launch and #moe-prefetch-routing say why.
#include "moe_experts.h"
#include <cuda/atomic> // cuda::atomic_ref: the readiness counters' acquire
#include <string.h>
#include "linear.cuh"     // sd_lin_dot, sd_lin_dot_fast, sd_bulk_*
#include "moe_layout.cuh" // moe_layout

#define MOE_WARPS 8                      // up: warps per block
#define UP_RPW 2                         // up: rows a warp dots at once (one x load feeds both)
#define UP_ROWS (MOE_WARPS / 2 * UP_RPW) // up: expert rows per block (a gate warp and an up warp each 2)
#define UP_BULK_MAX (80 * 1024)          // up, BULK: the most shared memory a block's gate and up rows take
#define DOWN_ROWS 16                     // down: output rows per block (docs/EXPERIMENTS.md#moe-down-rows)
#define DOWN_ROWS_PER_WARP 4
#define DOWN_SMEM_MAX (96 * 1024)        // down: the most shared memory a block's rows take

typedef struct moe_params moe_params;
struct moe_params {
    const sd_cuda_expert *table;
    const int *groups;
    int T, K, E, D, Ie;
    const float *x, *w;
    const int *sel;
    int held_first, held_count;
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
    int *ready;       // moe_experts.h: (E + 2) readiness counters, or NULL (the down launch waits for the up launch)
    int up_routed, up_shared; // down, with ready: the up blocks that count into a routed expert's and
                              // the shared expert's counter (0: hs was written before the selection)
};

// Does this model hold expert e (moe_experts.h: a tensor-parallel rank's shard holds a range)?
__device__ __forceinline__ bool moe_held(const moe_params &p, int e) {
    return e >= p.held_first && e < p.held_first + p.held_count;
}

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
    // only x, written before the selection's launch let this one start: no wait (moe_experts.h). First,
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
        if (!moe_held(p, key)) return; // another rank's expert (its table entry is NULL; no down block waits on it)
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
    const uint64_t pol = sd_l2_evict_first();
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
            // selection ends (docs/EXPERIMENTS.md#moe-up-one-token-depth). Two rows a warp halve the
            // blocks, so the group lookups that start each block are paid half as often. (The BULK
            // instance's fallback keeps the default depth, within its register budget.)
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
    // (cheaper than a fence in every thread: docs/EXPERIMENTS.md#moe-up-release).
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
    bool held;     // false: another rank's expert — no dot, no wait (its block still counts its ticket)
};

__device__ __forceinline__ down_unit down_unit_of(const moe_params &p, const int *ent, const int *ent_e, int ent_lo,
                                                  int n_shared, int u, int o0) {
    down_unit d = {};
    d.held = true;
    if (u >= n_shared) {
        const int q = ent_lo + u - n_shared;
        if (!moe_held(p, ent_e[q])) {
            d.held = false;
            return d;
        }
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
            if (moe_held(p, p.sel[(size_t)t * p.K + j]))
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
// pdl.h's chain assumes; the next selection zeroes the counters. The MoE block sets them up to two
// tokens (engine/cuda/moe_block.c, MOE_READY_MAX_T).
static __global__ void __launch_bounds__(DOWN_ROWS / DOWN_ROWS_PER_WARP * 32)
moe_down_kernel(const __grid_constant__ moe_params p, int ent_lo, int ent_hi, int units, int combine, int *tickets) {
    extern __shared__ __align__(128) unsigned char down_sm[]; // the unit's rows (BULK)
    __shared__ uint64_t bar;
    __shared__ int last, last_of_launch;
    const int o0 = blockIdx.x * DOWN_ROWS, nrow = min(DOWN_ROWS, p.D - o0);
    const moe_layout L(p.T, p.K, p.E);
    down_unit d = (int)blockIdx.y < units ? down_unit_of(p, L.ent(p.groups), L.ent_e(p.groups), ent_lo, units - (ent_hi - ent_lo),
                                                         (int)blockIdx.y, o0)
                                          : down_unit{};
    const bool has_unit = (int)blockIdx.y < units && d.held; // block-uniform; false: a combine-only launch or another rank's expert
    const bool bulk = has_unit && down_bulk(d, nrow, p.down_smem);
    if (bulk && threadIdx.x == 0) {
        const uint32_t bytes = (uint32_t)(nrow * (size_t)d.cols * 2);
        sd_bulk_init(&bar);
        sd_bulk_expect(&bar, bytes);
        sd_bulk_copy_pol(down_sm, d.w, bytes, &bar, sd_l2_evict_first());
    }
    sd_pdl_trigger();
    if (!p.ready) sd_pdl_wait();
    else if (has_unit && threadIdx.x == 0) {
        const int need = d.key == p.E ? p.up_shared : p.up_routed;
        if (need) wait_count(p.ready + d.key, need);
    }
    __syncthreads(); // the barrier is initialised before any thread waits on it (and the unit is ready)
    // The activation row beside the rows: one L2 latency for the block, where each warp's dot
    // would wait on its own rounds of x loads (docs/EXPERIMENTS.md#moe-down-stage-x).
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



static moe_params params_of(const sd_cuda_moe_args *a) {
    moe_params p;
    memset(&p, 0, sizeof p);
    p.table = a->table; p.groups = a->groups;
    p.T = a->T; p.K = a->K; p.E = a->E; p.D = a->D; p.Ie = a->Ie;
    p.x = a->x; p.w = a->w; p.h = a->h; p.exp_out = a->exp_out;
    p.sel = a->sel; p.held_first = a->held_first; p.held_count = a->held_count;
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
    p.xfast = sd_aligned16(a->x) && a->D % 4 == 0;
    p.ready = a->ready;
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
    // other dtypes take the register path inside it); one token keeps the register path
    // (docs/EXPERIMENTS.md#moe-up-bulk).
    const size_t smem = 2 * UP_ROWS * (size_t)a->D * 2 + sizeof(uint64_t);
    const bool bulk = a->T >= 2 && (a->D * 2) % 16 == 0 && smem <= UP_BULK_MAX;
    void (*k)(const moe_params, int, int, int, int);
    switch (tile_of(a->T)) {
    case 1: // the largest shared-memory carveout: the down blocks (36 KB each) can take the place of
            // finished up blocks instead of waiting for a multiprocessor to drain; only here
            // (docs/EXPERIMENTS.md#moe-up-carveout).
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

