// cuda_internal.h — what device.c, upload.c and walk.c share inside the CUDA backend.
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
