// cuda_door.h — the decode-graph door: speculative rounds and plain decode steps replayed from
// CUDA graphs captured once, with the device-table MoE arm, bit for bit the eager rounds.
//
// A speculative round (k drafts) is, on the device and with no value crossing to the host:
//   draft     k + 1 one-token draft forwards: x, d_1 .. d_k each fed, each row's pick (argmax, or
//             a draw from q) the next one's input — the (k+1)-th, fed d_k, is the draft's catch-up
//             for the case all k are accepted, made ahead (its pick is unused);
//   verify    one (k+1)-token target forward over [x, d_1 .. d_k]: argmaxes, or p rows;
//   accept    kernels/acceptance.h: (n, bonus) into device memory;
//   rollback  the target's cursor commits n + 1 (len += n + 1, pending = 0);
//   maint     the draft's cursor commits n + 1 — the positions it fed past d_n are dropped, which
//             is bookkeeping (engine/state.h) — then n, the bonus and the drafts are published to
//             pinned memory and the bonus becomes the next round's x.
// The host launches the round and reads back n and the n + 1 tokens. The states are the eager
// round's, so the tokens and every later logit are the same bits.
//
// Where the graphs are cut (docs/CUDA.md "The decode-graph door"): trace level 0, one graph a
// round; level 1, one graph a phase, the host draining the stream at each phase boundary (the
// phase clocks of trace.h); level 2, as level 1 with CUDA event record nodes inside the verify
// graph at the level-2 bucket boundaries (the walk's own, from the trace's event pool: the burst
// must be in event mode, trace_burst_use_events), whose elapsed times are added to the buckets
// after each replay — never a drain inside a graph. The events stay the graph's until it closes.
//
// A target that is a rank of a tensor-parallel group (target->comm; its draft the rank's own
// replica on the same device) captures its collectives inside the graphs: every rank captures
// and replays the same graphs, so they meet in the same collectives (docs/PARALLEL.md). Each
// replay numbers and watches them as eager ones (parallel/comm.h sd_comm_replay), and each drain
// is followed by the group's check: a rank of a broken group fails with the group's message.
//
// The door refuses to open (SD_ERR_USAGE) with the eager MoE arm, a route tap (on_route) or any
// other host readback armed, models on different devices or not on a GPU; a capture or
// instantiate failure is an error naming the graph and the CUDA error — never an eager fallback.
#pragma once
#include "cuda_backend.h" // sd_model, sd_state
#include "ledger.h"       // ledger
#include "trace.h"        // trace_burst

typedef struct sd_cuda_door sd_cuda_door;

typedef struct {
    int k;                 // draft depth, 1..16; 0: plain decode steps (no draft)
    float temperature;     // <= 0 greedy; else sampled rounds (the draws of engine/spec.c, philox.h)
    uint64_t seed;
    trace_burst *trace;    // phase trace (level 1, 2), or NULL
    ledger *ledger;        // armed: the target's routing recorded inside the graphs (ledger.h), or NULL
    // Called after each replay, outside any capture, with the target forward's positions
    // pos0 .. pos0+T-1 (the gate drains the ledger's slots there), or NULL.
    void (*after_target)(void *ctx, int pos0, int T);
    void *ctx;
} sd_cuda_door_opts;

// A door for target (and draft, when o->k > 0) on their states. Nothing is captured yet: the
// first round or step warms the shapes up (forwards rolled back) and captures, after the prefill.
sd_code sd_cuda_door_open(const sd_model *target, sd_state *ts, const sd_model *draft, sd_state *ds,
                          const sd_cuda_door_opts *o, sd_cuda_door **door, sd_status *st);

// One speculative round from x (used at the first round only: later rounds start from the bonus
// the device carried over), numbered round (the draws' key): emit gets the n + 1 committed tokens,
// *n the accepted drafts. Both states advance by n + 1. Errors: the context full (SD_ERR_FULL,
// nothing launched), a CUDA failure.
sd_code sd_cuda_door_round(sd_cuda_door *d, int x, uint32_t round, int *emit, int *n, sd_status *st);

// One plain decode step after tok (tok used at the first step only), the token at position `pos`
// drawn as engine/decode.c draws it: *next gets the new token; the target state advances by 1.
sd_code sd_cuda_door_step(sd_cuda_door *d, int tok, int *next, sd_status *st);

void sd_cuda_door_close(sd_cuda_door *d);

// The selection ledger's slots in CUDA device memory (ledger_device.c).
const ledger_device *sd_cuda_ledger_device(void);
