// cuda_layers.h — the sublayers of engine/cpu/layers.h on the GPU (walk.c), exposed so the op
// suite can run each one against its CPU twin. Same contracts: T tokens at positions
// sd_state_next_pos(s) .. +T-1; weights, state and activations in device memory.
#pragma once
#include "cuda_backend.h" // sd_cuda_backend
#include "trace.h"        // trace_burst

// KDA: projections, conv (rows into the state), gates, recurrence (scan bucket when tb level
// >= 2), gated output norm, o_proj.
sd_code sd_cuda_kda_forward(sd_cuda_backend *b, const sd_kda_weights *w, const sd_config *c, sd_state *s, int layer,
                            const float *a, int T, float *out, trace_burst *tb, sd_status *st);

// MLA, absorbed form: cache rows pos0 .. pos0+T-1, then causal attention, o_proj.
sd_code sd_cuda_mla_forward(sd_cuda_backend *b, const sd_mla_weights *w, const sd_config *c, sd_state *s, int layer,
                            const float *a, int T, float *out, sd_status *st);

// MoE block of layer `layer` with b->moe_arm; leaves sel/w of token t at s->scratch.sel/w + t·K
// (device memory).
sd_code sd_cuda_moe_forward(sd_cuda_backend *b, const sd_moe_weights *w, const sd_config *c, sd_state *s, int layer,
                            const float *x, int T, float *out, sd_status *st);
