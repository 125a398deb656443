// cuda_scratch.h — the scratch only the GPU kernels use, carried by every device state at the end
// of its arena (the allocator's scratch_bytes hook, engine/state.h) and zeroed with it: a CPU state
// carries none of it. The counters are zero between calls: each kernel that counts into one
// returns it to zero (or the selection re-zeroes it before its call), so a state starts and stays
// ready for any forward.
#pragma once
#include <stddef.h>
#include "config.h" // sd_config
#include "state.h"  // sd_state

typedef struct {
    float *mla_part;   // (max_T, Hm, SD_MLA_SPLIT, R + 2) the MLA attention's chunk partials (mla.h)
    int *tickets;      // (D) the MoE down's row-block counters (moe_experts.h)
    int *moe_ready;    // (E + 2) the MoE readiness counters (moe_experts.h)
    int *route_ticket; // (1) the one-token route + select launch's ticket (moe_route.h)
    int *argmax_ws;    // SD_ARGMAX_WS_INTS(max_T) the argmax's slice results and row tickets (sampling.h)
    // A rank's shard of a tensor-parallel group (cfg->shard.ranks > 0; NULL otherwise), before any
    // capture: the collectives' device buffers (docs/PARALLEL.md), N = shard.ranks, Vm the largest
    // vocabulary slice (plan.h's vocab_max).
    float *tp_gather;  // (N, max_T, max(D, Vm)) what an all-gather lands in: the partials, or the head's slices / pairs
    float *tp_head;    // (max_T, Vm) this rank's logits slice (rows of its vocab_count)
    struct sd_cuda_tp_pick *tp_pairs; // (max_T) the slice's argmaxes as (value, global id)
    int *tp_idx;       // (max_T) the slice's local argmaxes
} sd_cuda_scratch;

// The largest vocabulary slice of a group of cfg's shard (0 without a group): the head's gathers
// pad every rank's block to it.
int sd_cuda_tp_vocab_max(const sd_config *cfg);

// Bytes of sd_cuda_scratch for a state of cfg with forwards of up to max_T tokens.
size_t sd_cuda_scratch_bytes(const sd_config *cfg, int max_T);
// The scratch of a device state (its backend_scratch split by the same layout).
sd_cuda_scratch sd_cuda_scratch_of(const sd_state *s);
