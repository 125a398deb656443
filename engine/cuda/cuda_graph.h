// cuda_graph.h — one forward of T tokens captured as a CUDA graph and replayed at any position:
// the kernels read positions from the state's cursor (kernels/cursor.h) and the walk's last
// launch advances it, so one capture serves every step. The graph is the layer walk, the final
// norm, lm_head and each row's argmax; its kernels read the tokens from and write the argmaxes
// into the graph's own pinned, device-mapped buffers (no copy nodes). Only the device-table MoE
// arm can be captured (the eager arm reads the routing back to the host by design); level-2
// trace buckets and on_route are not part of a graph. The kernels are captured in the process's
// launch mode (kernels/pdl.h).
// A rank of a tensor-parallel group captures its collectives too (every rank captures alike);
// each replay numbers and watches them as eager ones (parallel/comm.h sd_comm_replay).
#pragma once
#include "cuda_backend.h"  // sd_model, sd_state, sd_status
#include "parallel/comm.h" // sd_comm_window

typedef struct sd_cuda_graph {
    const sd_model *model;
    sd_state *state; // the state the graph's pointers belong to
    int T;
    void *exec;      // cudaGraphExec_t
    int *tokens_host, *argmax_host; // (T) pinned, device-mapped: read and written by the graph's kernels
    sd_comm_window window;          // the collectives the graph holds (a rank of a group)
} sd_cuda_graph;

// Capture the forward of T tokens (1 <= T <= s->max_T) on state s of device model m. Nothing
// runs and the state is unchanged. Errors: not a device model or state, the eager MoE arm, T out
// of range, or a capture the driver refuses (named).
sd_code sd_cuda_graph_capture(const sd_model *m, sd_state *s, int T, sd_cuda_graph *g, sd_status *st);

// One replay: the forward of tokens[0..T) at the state's next positions, as sd_forward with
// opts.argmax (the same checks: room for T more pending positions, tokens in the vocabulary;
// each error leaves the state as it was). argmax[t] gets row t's argmax; T pending positions.
sd_code sd_cuda_graph_forward(sd_cuda_graph *g, const int *tokens, int *argmax, sd_status *st);

void sd_cuda_graph_free(sd_cuda_graph *g);
