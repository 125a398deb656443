// moe_experts.h — the routed experts, the shared expert and the combine on the GPU (MODEL.md
// "MoE"; the CPU op: engine/cpu/moe.c sd_moe_forward), run over the grouping of moe_route.h. Two
// arms fill the same grouping and run the same device functions per expert, so they produce the
// same bits (engine/cuda/moe_block.c calls them):
//   device table: one sd_cuda_moe_up and one sd_cuda_moe_down launch over every selected expert
//                 (the number of groups is read on the device: no host sync; capturable); the
//                 shared expert's gate+up rides in the up launch at T <= 2;
//   eager:        the host launches up and down once per selected expert, then the combine alone.
// The dense FFN and, from three tokens up, the shared expert's gate+up are Linear jobs (linear.h).
#pragma once
#include <cuda_runtime_api.h> // cudaStream_t
#include <stdbool.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif
#include "status.h" // sd_code, sd_status
#include "tensor.h" // sd_mat

// One routed expert's matrices (device pointers; gate/up (Ie, D), down (D, Ie)), for the table.
typedef struct {
    const void *gate, *up, *down;
    int gate_bf16, up_bf16, down_bf16; // 1: BF16, 0: F32
} sd_cuda_expert;

// What the expert launches of one MoE block read and write (device memory).
typedef struct {
    const sd_cuda_expert *table; // the layer's E experts
    const int *groups;           // the grouping (above)
    int T, K, E, D, Ie;
    const float *x;              // (T, D) the block's input
    const float *w;              // (T, K) routing weights
    const int *sel;              // (T, K) the selected experts (what the combine reads to skip experts not held)
    int held_first, held_count;  // the experts this model holds: all E for a whole model; a tensor-parallel
                                 //   rank's shard holds [held_first, +held_count) and the table's other
                                 //   entries are NULL — never read: their groups and entries are skipped
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
    int *tickets;                // (D) zeroed counters (engine/cuda/cuda_scratch.h), or NULL: the combine waits for a
                                 //   whole launch instead of a row block's last unit
    int *ready;                  // (E + 2) counters (engine/cuda/cuda_scratch.h) the selection zeroed, or NULL. Set only
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
// (down_shared · hs_t) and out[t] (=, or +=) Σ_j w[t·K+j]·exp_out[t·K+j] (j from 0, over the held
// experts) + shared[t] — the CPU's order. Entries of earlier launches must already be in exp_out. The launch reads the
// grouping before its wait for its predecessor (it starts the weight copies early): the grouping
// must be complete when the predecessor lets it start — sd_cuda_moe_up's routed blocks let it
// only after their own wait, and a host-built grouping is uploaded before both. A combine needs
// a->tickets.
sd_code sd_cuda_moe_down(const sd_cuda_moe_args *a, int ent_lo, int ent_hi, bool combine, cudaStream_t stream,
                         sd_status *st);

#ifdef __cplusplus
}
#endif
