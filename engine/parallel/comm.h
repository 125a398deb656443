// comm.h — a rank's collectives (docs/PARALLEL.md). Every rank of a group issues the same
// collectives in the same order (each runs the same program on its shard), numbered 1, 2, ... per
// rank, so collective #n means the same operation on every rank.
//
// The all-reduce has one fixed per-element order, independent of the message size: all-gather
// every rank's partial, then on every rank out[i] = ((p0[i] + p1[i]) + p2[i]) + ... in rank
// order. A row therefore gets the same bits whether it is reduced alone (a decode step) or inside
// a (k+1)-row verify — verify ≡ decode holds under N ranks — and every rank holds identical bits,
// so every rank routes the same. (NCCL's ring and tree all-reduces may order an element's sum by
// the message size for three or more ranks, which is why the reduction is not theirs.)
//
// The transport moves bytes only; the sum is here. A transport is the host meeting point of
// emulated ranks (host_comm.h), or — for a device rank — NCCL's all-gather on the rank's stream
// with the rank-order sum as a device kernel (the GPU twin of sd_comm_sum_ranks).
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "plan.h"   // sd_tp_plan
#include "status.h" // sd_code, sd_status

typedef enum { SD_COMM_ALL_REDUCE = 0, SD_COMM_ALL_GATHER = 1 } sd_comm_kind;

// What a collective is for, so a failure names it: "all-reduce #137 (layer 5 mixer)".
typedef struct {
    sd_comm_kind kind;
    int layer;        // -1: not a layer's (the head)
    const char *what; // "mixer", "ffn", "head argmax", "head logits", ...
} sd_comm_op;

// "all-reduce #137 (layer 5 mixer)" / "all-gather #12 (head argmax)".
void sd_comm_op_name(const sd_comm_op *op, uint64_t seq, char *buf, size_t len);

typedef struct {
    // Collective #seq: every rank's `bytes` at `send` land in `recv` (ranks · bytes, rank r's at
    // r · bytes) on every rank. Memory: the rank's backend memory. A failure breaks the whole
    // group: every rank fails, and the message names the rank at fault and the operation (e.g. "tp:
    // rank 2 did not reach all-reduce #137 (layer 5 mixer) within 5 s"); a broken group fails every
    // later collective at once.
    sd_code (*all_gather)(void *ctx, int rank, uint64_t seq, const sd_comm_op *op, const void *send, size_t bytes,
                          void *recv, sd_status *st);
    // The rank's program has returned (rc, st: its result). Ranks waiting for it stop waiting: a
    // failure breaks the group with "tp: rank R failed: <its message>".
    void (*leave)(void *ctx, int rank, sd_code rc, const sd_status *st);
    // Optional (NULL on the host, whose collectives are done when all_gather returns): for a
    // transport whose collectives complete later on the rank's device stream.
    //   check:  the group's message once it is broken, else SD_OK. A rank calls it after each drain
    //           of its stream: an aborted collective leaves that stream's results meaningless.
    //   replay: collectives #first .. #first+n-1 (ops[0..n)), captured earlier inside a graph, are
    //           about to run again: the transport watches them as its own (and may stop the rank
    //           there, --tp-stop), then launch(launch_ctx) enqueues the graph.
    sd_code (*check)(void *ctx, int rank, sd_status *st);
    sd_code (*replay)(void *ctx, int rank, uint64_t first, const sd_comm_op *ops, int n,
                      sd_code (*launch)(void *launch_ctx, sd_status *st), void *launch_ctx, sd_status *st);
    void *ctx;
} sd_comm_transport;

// One rank's handle on its group, what its model's walk and head call (sd_model.comm).
typedef struct sd_comm {
    int rank, ranks;
    const sd_tp_plan *plan;
    sd_comm_transport transport;
    uint64_t seq;               // collectives this rank has issued
    void *recv, *send;          // host buffers of the CPU collectives (grown on demand)
    size_t recv_bytes, send_bytes;
    // While a graph is captured (sd_comm_capture_begin .. _end): the ops issued, in order.
    sd_comm_op *log;
    int log_n, log_cap;
    bool logging, log_failed;
} sd_comm;

// The collectives one captured graph holds, in order: what a replay of it issues again.
typedef struct {
    sd_comm_op *ops;
    int n;
} sd_comm_window;

void sd_comm_init(sd_comm *c, int rank, const sd_tp_plan *plan, sd_comm_transport transport);
void sd_comm_free(sd_comm *c);

// The next collective, for (layer, what) of sd_comm_op: every rank's `bytes` from send, gathered
// into *recv (ranks · bytes of host memory owned by c, valid until c's next collective).
sd_code sd_comm_all_gather(sd_comm *c, int layer, const char *what, const void *send, size_t bytes, const void **recv,
                           sd_status *st);

// The next collective with the caller's buffers: every rank's `bytes` at send gathered into recv
// (ranks · bytes). A device rank's collectives take device memory on its stream, so recv holds
// the result only once that stream has run them (each drain is followed by sd_comm_check).
sd_code sd_comm_gather_to(sd_comm *c, sd_comm_kind kind, int layer, const char *what, const void *send, size_t bytes,
                          void *recv, sd_status *st);

// x (n floats, this rank's partial) becomes the sum over the ranks in the fixed order (above).
sd_code sd_comm_all_reduce(sd_comm *c, int layer, const char *what, float *x, size_t n, sd_status *st);

// The order itself: out[i] = ((g[0][i] + g[1][i]) + g[2][i]) + ... for g the ranks' n-float rows
// laid one after another (out may alias g's first row).
void sd_comm_sum_ranks(const float *g, int ranks, size_t n, float *out);

// A host buffer of at least `bytes` in *buf (capacity *cap), grown as needed. false: out of memory.
bool sd_comm_reserve(void **buf, size_t *cap, size_t bytes);

// The group's message once it is broken (the transport's check), else SD_OK. c may be NULL (no
// group: SD_OK).
sd_code sd_comm_check(const sd_comm *c, sd_status *st);

// Graphs: the collectives issued between begin and end (a capture: each is enqueued into the
// graph, none runs) become window w (caller frees with sd_comm_window_free). Each replay of the
// graph then goes through sd_comm_replay, which numbers the window's collectives as the next ones
// of this rank — so numbering, watching and fault injection are the same as for eager ones.
// c may be NULL (no group: an empty window).
void sd_comm_capture_begin(sd_comm *c);
sd_code sd_comm_capture_end(sd_comm *c, sd_comm_window *w, sd_status *st);
void sd_comm_window_free(sd_comm_window *w);
// One replay of a graph holding window w: launch(launch_ctx) enqueues it (directly when c is NULL
// or w is empty).
sd_code sd_comm_replay(sd_comm *c, const sd_comm_window *w, sd_code (*launch)(void *launch_ctx, sd_status *st),
                       void *launch_ctx, sd_status *st);
