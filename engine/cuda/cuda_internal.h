// cuda_internal.h — what the files of the CUDA backend share inside it (device.c, memory.c,
// upload.c, walk.c, moe_block.c, head.c, accept_device.c, graph.c).
#pragma once
#include <stdbool.h>
#include "cuda_backend.h" // sd_cuda_backend
#include "linear.h"       // sd_lin_norm, sd_lin_job
#include "moe_route.h"    // sd_cuda_moe_route_select, sd_cuda_moe_select

// b->mem: states in this device's memory, zeroed on b->stream (memory.c).
void sd_cuda_init_allocator(sd_cuda_backend *b);
// Was s allocated by a CUDA backend of b's device?
bool sd_cuda_state_is_ours(const sd_cuda_backend *b, const sd_state *s);
// sd_backend.sync: drain b's stream (ctx = b).
void sd_cuda_sync(void *ctx);
// sd_backend.forward (walk.c).
sd_code sd_cuda_forward(const sd_model *m, sd_state *s, const int *tokens, int T, float *logits, int last_only,
                        const sd_forward_opts *opts, sd_status *st);
// The layer walk of sd_cuda_forward (walk.c): embed the T tokens at `tokens` (device memory),
// every layer, then the cursor advance (pending += T on the device; the host's side is the
// caller's). Every launch on b->stream with no host sync unless opts asks for one (level-2 trace
// buckets, on_route) or b->moe_arm is the eager arm: otherwise capturable in a graph. The caller
// starts it on a settled stream — every earlier launch complete (sd_cuda_forward drains first; a
// graph launch follows its stream's work): its kernels read the state the earlier forwards left
// (the cursor, KDA slot n0, conv rows) before their predecessor-wait (kda.h, mla.h).
sd_code sd_cuda_walk(sd_cuda_backend *b, const sd_model *m, sd_state *s, const int *tokens, int T,
                     const sd_forward_opts *opts, sd_status *st);
// The head's launches alone (head.c), on b->stream, no host sync, capturable (sd_cuda_head, the
// graphs of graph.c and door.c): rmsnorm + lm_head of rows first .. first+n_out-1 as whole rows
// (n_out × V) into the state's logits scratch; or each row's argmax into out (device or pinned
// memory). A rank of a group does its part of the vocabulary and the head's collectives.
sd_code sd_cuda_head_logits(sd_cuda_backend *b, const sd_model *m, sd_state *s, int first, int n_out, sd_status *st);
sd_code sd_cuda_head_argmax(sd_cuda_backend *b, const sd_model *m, sd_state *s, int first, int n_out, int *out, sd_status *st);
// The end of sd_cuda_forward (head.c): the head's launches for the output rows (T, or row T-1
// with last_only), then what logits and opts ask for (logits, argmax, softmax into opts->probs,
// draws), then the forward's one drain of b->stream: every host result is valid on return.
// Without logits or a request of opts it only drains.
sd_code sd_cuda_head(sd_cuda_backend *b, const sd_model *m, sd_state *s, int T, float *logits, int last_only,
                     const sd_forward_opts *opts, sd_status *st);
// The non-finite flag (kernels/finite.h, engine/model.h): the walk checks the residual stream
// after the embedding and each sublayer, the head its rows; the flag keeps the first site and is
// never reset by a forward, so a round of several forwards keeps its first. sd_cuda_nonfinite_copy
// enqueues the flag's copy into b->nonfinite_host (capturable: the head's launches end with it);
// after the stream drains, sd_cuda_nonfinite_take returns SD_ERR_NONFINITE naming the site when
// one was seen (and resets the flag), else SD_OK. walk.c.
sd_code sd_cuda_nonfinite_copy(sd_cuda_backend *b, sd_status *st);
sd_code sd_cuda_nonfinite_take(sd_cuda_backend *b, const sd_config *c, sd_status *st);
// The MoE block of layer `layer` (moe_block.c) in b->moe_arm: out = MoE(x), or out += MoE(x)
// with accumulate; with norm, x = rmsnorm(norm->x) is computed by the router's launch (norm->out).
// Leaves sel/w of token t at s->scratch.sel/w + t·K (device memory).
// ledger: the selection ledger's device arm (ledger.h), recording sel/w right after the selection
// on the stream (a memcpy node inside a capture), or NULL.
sd_code sd_cuda_moe_block(sd_cuda_backend *b, const sd_moe_weights *w, const sd_config *c, sd_state *s, int layer,
                          const float *x, int T, float *out, bool accumulate, const sd_lin_norm *norm, struct ledger *ledger,
                          sd_status *st);
// sel and w of T tokens (the state's device scratch) into b->sel_host / b->w_host; drains the stream.
sd_code sd_cuda_read_route(sd_cuda_backend *b, const sd_state *s, int T, int K, sd_status *st);
// The router logits of T tokens (the state's scratch, (T, E)) and the score correction bias (E,
// device memory) into b->router_host, the bias after the logits; drains the stream. For the
// route tap's margins (route.h).
sd_code sd_cuda_read_router(sd_cuda_backend *b, const sd_state *s, const float *bias, int T, int E, sd_status *st);
// Does sd_cuda_head launch anything (logits, an argmax, softmax rows or draws asked for)?
bool sd_cuda_head_launches(const float *logits, const sd_forward_opts *opts);
// Is p an allocation in b's device memory? Else a usage error naming `what` (device.c).
sd_code sd_cuda_check_device_ptr(const sd_cuda_backend *b, const void *p, const char *what, sd_status *st);
// sd_backend.accept (accept_device.c).
#define SD_CUDA_ACCEPT_INTS (2 * SD_ACCEPT_MAX_K + 3) // drafts, top (k+1), (n, bonus)
sd_code sd_cuda_accept_op(const sd_model *m, const sd_accept_args *a, int *n, int *bonus, sd_status *st);
