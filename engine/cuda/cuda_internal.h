// cuda_internal.h — what device.c, upload.c, walk.c, head.c and accept_device.c share inside the
// CUDA backend.
#pragma once
#include <stdbool.h>
#include "cuda_backend.h" // sd_cuda_backend

// b->mem: states in this device's memory, zeroed on b->stream.
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
// caller's). Every launch on b->stream with no host sync unless opts asks for one (level-2
// trace buckets, on_route) or b->moe_arm is the eager arm: otherwise capturable in a graph.
// The caller starts it on a settled stream — every earlier launch complete (sd_cuda_forward
// drains first; a graph launch follows its stream's work): its kernels read the state the
// earlier forwards left (the cursor, KDA slot n0, conv rows) before their predecessor-wait (kda.h).
// A stale cursor (s->cursor_stale: a held commit) is written by the embedding launch; the
// kernels that read it before their wait come after a layer's first launch, a Linear, which lets
// its successor start only after its own wait — by then the embedding launch is complete.
// advance false: the walk leaves the cursor advance to the caller's next launch (the head's:
// sd_cuda_head_logits with adv_T = T), one launch fewer a step.
sd_code sd_cuda_walk(sd_cuda_backend *b, const sd_model *m, sd_state *s, const int *tokens, int T,
                     const sd_forward_opts *opts, bool advance, sd_status *st);
// The end of sd_cuda_forward (head.c): rmsnorm + lm_head of the output rows (T, or row T-1 with
// last_only) into the state's logits scratch, then what logits and opts ask for (logits,
// argmax, softmax into opts->probs, draws), then the forward's one drain of b->stream (or, when
// argmaxes are all it returns and b->argmax_spin, their arrival in pinned memory: every kernel
// before the argmax is complete): every host result is valid on return. Without logits or a
// request of opts it only drains.
// The head's launches alone: rmsnorm + lm_head of rows first .. first+n_out-1 into the state's
// logits scratch, on b->stream, no host sync (sd_cuda_head, and the graph of graph.c). adv_T > 0:
// with the walk's cursor advance by adv_T (in the lm_head launch when its norm is fused, else a
// launch of its own first). sd_cuda_head's advance: the walk left it (adv_T = T); only when
// sd_cuda_head_launches.
sd_code sd_cuda_head_logits(sd_cuda_backend *b, const sd_model *m, sd_state *s, int first, int n_out, int adv_T,
                            sd_status *st);
sd_code sd_cuda_head(sd_cuda_backend *b, const sd_model *m, sd_state *s, int T, float *logits, int last_only,
                     const sd_forward_opts *opts, bool advance, sd_status *st);
// Does sd_cuda_head launch anything (logits, an argmax, softmax rows or draws asked for)?
bool sd_cuda_head_launches(const float *logits, const sd_forward_opts *opts);
// Is p an allocation in b's device memory? Else a usage error naming `what` (head.c).
sd_code sd_cuda_check_device_ptr(const sd_cuda_backend *b, const void *p, const char *what, sd_status *st);
// sd_backend.accept (accept_device.c).
#define SD_CUDA_ACCEPT_INTS (2 * SD_ACCEPT_MAX_K + 3) // drafts, top (k+1), (n, bonus)
sd_code sd_cuda_accept_op(const sd_model *m, const sd_accept_args *a, int *n, int *bonus, sd_status *st);
