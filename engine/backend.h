// backend.h — what a non-CPU backend plugs into the engine. The CPU reference is the default
// (sd_model.backend == NULL); a backend model's weights and states hold device pointers laid out
// exactly like the host ones (one arena each, same offsets), so indexing code is shared.
#pragma once
#include "model.h" // sd_model, sd_state, sd_forward_opts

typedef struct sd_backend {
    const char *name;          // "cuda"
    const sd_allocator *mem;   // where its states live
    // The forward of model.h on this backend (same contract; logits land in host memory).
    sd_code (*forward)(const sd_model *m, sd_state *s, const int *tokens, int T, float *logits, int last_only,
                       const sd_forward_opts *opts, sd_status *st);
    void (*sync)(void *ctx);   // drains the backend's streams (trace boundaries)
    void *sync_ctx;
    void (*free_model)(sd_model *m);
} sd_backend;
