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
} sd_cuda_scratch;

// Bytes of sd_cuda_scratch for a state of cfg with forwards of up to max_T tokens.
size_t sd_cuda_scratch_bytes(const sd_config *cfg, int max_T);
// The scratch of a device state (its backend_scratch split by the same layout).
sd_cuda_scratch sd_cuda_scratch_of(const sd_state *s);
