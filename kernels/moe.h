// moe.h — SwiGLU FFN and the MoE block on the GPU (MODEL.md "MoE"; the CPU ops: engine/cpu/moe.c).
//
// The routed experts run over a GROUPING of the forward's T·K (token, slot) entries by expert:
// experts ascending, each expert's entries in (token, slot) order — the CPU's grouping. Entry p
// of the grouping (its position) owns row p of the activation scratch h. Two arms fill the same
// grouping and run the same device functions per expert, so they produce the same bits:
//   device-table: sd_cuda_moe_select writes sel, w AND the grouping to device memory; one
//                 sd_cuda_moe_up and one sd_cuda_moe_down launch run every selected expert (the
//                 number of groups is read on the device: no host sync; capturable);
//   eager:        the host reads sel back, builds the grouping (sd_cuda_moe_groups_host) and
//                 launches up and down once per selected expert, then the combine alone.
#pragma once
#include <cuda_runtime_api.h> // cudaStream_t
#include <stdbool.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif
#include "status.h"  // sd_code, sd_status
#include "weights.h" // sd_ffn_weights, sd_mat
#include "linear.h"  // sd_lin_norm

// One routed expert's matrices (device pointers; gate/up (Ie, D), down (D, Ie)), for the table.
typedef struct {
    const void *gate, *up, *down;
    int gate_bf16, up_bf16, down_bf16; // 1: BF16, 0: F32
} sd_cuda_expert;

// Routing as the CPU's sd_moe_route, one block per token: s = sigmoid(router·b) (F32 router,
// the fixed-order dot of linear.cuh), s' = s + bias, grouped top-k with the CPU's tie rules
// (lower index wins), weights renormalised and scaled. sel, w (T, K) are written to device memory.
sd_code sd_cuda_moe_route(const float *router, const float *bias, const float *b, int T, int E, int D, int K, int G,
                          int topk_group, bool renormalize, float scaling, int *sel, float *w, cudaStream_t stream,
                          sd_status *st);

// The grouping's int layout for T tokens (Gc = min(T·K, E) group slots):
//   [0] n_groups | [1, 1+Gc) expert of group g | [1+Gc, 2+2Gc) first entry of group g (g <= n_groups,
//   the last one = T·K) | [2+2Gc, +T·K) entry p's t·K+j | [.., +T·K) entry p's expert.
size_t sd_cuda_moe_groups_ints(int T, int K, int E);
// The grouping of host sel (T, K) into groups (host memory, sd_cuda_moe_groups_ints(T, K, E) ints).
void sd_cuda_moe_groups_host(const int *sel, int T, int K, int E, int *groups);

// The route of sd_cuda_moe_route from router logits (T, E) already computed (the fused router
// Linear; same dot, hence the same bits): sel, w (T, K), and the grouping into groups (device).
// ready: the (E + 2) readiness counters of the up and down launches after it (below), zeroed
// before it lets its successor start — or NULL.
sd_code sd_cuda_moe_select(const float *logits, const float *bias, int T, int E, int K, int G, int topk_group,
                           bool renormalize, float scaling, int *sel, float *w, int *groups, int *ready,
                           cudaStream_t stream, sd_status *st);

// The router Linear (F32 router, the norm fused when `norm` is given: norm->x == x, block 0 writes
// norm->out; else x as is) and sd_cuda_moe_select in ONE launch for one token: the same dots and
// the same selection code, hence the same logits, sel, w and grouping. Block 0 zeroes `ready` after
// its wait; every block lets the successor start once its logits (and block 0's normed row) are
// written and fenced — so the up launch's shared-expert blocks, which read only the normed row,
// run during the selection; its routed blocks wait for this launch. The last router block to
// finish (*ticket: a zeroed counter, returned to zero) selects. Shapes:
// sd_cuda_moe_route_select_fits.
bool sd_cuda_moe_route_select_fits(int T, int E, int D, int G);
sd_code sd_cuda_moe_route_select(const float *router, const float *bias, const float *x, const sd_lin_norm *norm, int T,
                                 int E, int D, int K, int G, bool renormalize, float scaling, float *logits, int *sel,
                                 float *w, int *groups, int *ticket, int *ready, cudaStream_t stream, sd_status *st);

// What the expert launches of one MoE block read and write (device memory).
typedef struct {
    const sd_cuda_expert *table; // the layer's E experts
    const int *groups;           // the grouping (above)
    int T, K, E, D, Ie;
    const float *x;              // (T, D) the block's input
    const float *w;              // (T, K) routing weights
    float *h;                    // routed activations silu(gate·x)·(up·x): entry p in row p - ent_lo
    float *exp_out;              // (T, K, D) routed expert outputs, entry t·K+j
    const sd_mat *shared_down;   // (D, S·Ie), or NULL: no shared expert
    const sd_mat *shared_gate;   // (S·Ie, D) with shared_up: sd_cuda_moe_up computes hs too; NULL: hs
    const sd_mat *shared_up;     //   is computed elsewhere
    float *hs;                   // (T, ld_hs) shared activations (silu(gate·x)·(up·x))
    int ld_hs;
    float *shared_out;           // (T, D) scratch: the shared expert's output
    float *out;                  // (T, D)
    bool accumulate;             // out += MoE(x) (the residual add fused) instead of out = MoE(x)
    int *tickets;                // (D) zeroed counters (state.h), or NULL: the combine waits for a
                                 //   whole launch instead of a row block's last unit
    int *ready;                  // (E + 2) counters (state.h) the selection zeroed, or NULL. Set only
                                 //   when ONE up launch (every group, every entry, the shared expert's
                                 //   hs when shared_gate is set) is followed by ONE down launch over
                                 //   the same entries with the combine: each up block counts itself
                                 //   into its expert's counter when its rows are written (the shared
                                 //   expert's: [E]), and a down block waits for its own unit's count
                                 //   instead of the whole up launch ([E + 1] counts the down blocks)
} sd_cuda_moe_args;

// Activations of the entries ent_lo .. ent_hi-1 of groups g_lo .. g_hi-1 (clipped to the
// grouping's count on the device): h row (p - ent_lo) = silu(gate_e·x_t)·(up_e·x_t). With
// `shared` (and a->shared_gate, a->shared_up), the same launch also writes the shared expert's
// hs[t] = silu(gate_s·x_t)·(up_s·x_t) for every token, in blocks that do not wait for the
// selection: they read only x, so they run while the selection does — its launch must let its
// successor start only after its own wait (pdl.h), which sd_cuda_moe_select's does.
sd_code sd_cuda_moe_up(const sd_cuda_moe_args *a, int g_lo, int g_hi, int ent_lo, int ent_hi, bool shared,
                       cudaStream_t stream, sd_status *st);
// exp_out of entries ent_lo .. ent_hi-1 (down_e · h row); then, when combine: the shared expert
// (down_shared · hs_t) and out[t] (=, or +=) Σ_j w[t·K+j]·exp_out[t·K+j] (j from 0) + shared[t]
// — the CPU's order. Entries of earlier launches must already be in exp_out. The launch reads the
// grouping before its wait for its predecessor (it starts the weight copies early): the grouping
// must be complete when the predecessor lets it start — sd_cuda_moe_up's routed blocks let it
// only after their own wait, and a host-built grouping is uploaded before both. A combine needs
// a->tickets.
sd_code sd_cuda_moe_down(const sd_cuda_moe_args *a, int ent_lo, int ent_hi, bool combine, cudaStream_t stream,
                         sd_status *st);

// h ← silu(h) ⊙ h2 over n elements.
sd_code sd_cuda_silu_mul(float *h, const float *h2, size_t n, cudaStream_t stream, sd_status *st);

// out = down·(silu(gate·x) ⊙ up·x) for T tokens (dense FFN, the shared experts): two launches
// (gate+up+silu fused, then down); h1 (T, width) scratch, h2 unused (kept for the interface).
sd_code sd_cuda_ffn(const sd_ffn_weights *w, const float *x, int T, float *out, float *h1, float *h2,
                    cudaStream_t stream, sd_status *st);

#ifdef __cplusplus
}
#endif
