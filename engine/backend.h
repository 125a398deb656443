// backend.h — what a non-CPU backend plugs into the engine. The CPU reference is the default
// (sd_model.backend == NULL); a backend model's weights and states hold device pointers laid out
// exactly like the host ones (one arena each, same offsets), so indexing code is shared.
// Sampled rounds keep their distributions in the backend's memory: the forward's head softmaxes
// and draws there (sd_forward_opts), and `accept` runs step 3 there (accept.h).
#pragma once
#include "accept.h" // sd_accept_args
#include "model.h"  // sd_model, sd_state, sd_forward_opts

typedef struct sd_backend {
    const char *name;          // "cuda"
    const sd_allocator *mem;   // where its states live
    // The forward of model.h on this backend (same contract; logits, argmax and sampled land in
    // host memory, probs in the backend's).
    sd_code (*forward)(const sd_model *m, sd_state *s, const int *tokens, int T, float *logits, int last_only,
                       const sd_forward_opts *opts, sd_status *st);
    // A whole prompt at once (sd_prefill_rows's contract, model.h), for prompts longer than
    // SD_PREFILL_TOKEN_PATH_MAX; NULL: sd_prefill runs forwards of at most max_T tokens.
    sd_code (*prefill)(const sd_model *m, sd_state *s, const int *tokens, int n, float *logits, bool all_rows,
                       const sd_prefill_opts *opts, sd_status *st);
    // sd_accept_ref on this backend's memory (p, q, work there; drafts and top in host
    // memory): the same (n, bonus), results valid on return. NULL: sd_accept refuses sampled
    // rounds on this backend (the CPU has no sd_backend: the reference runs).
    sd_code (*accept)(const sd_model *m, const sd_accept_args *a, int *n, int *bonus, sd_status *st);
    void (*sync)(void *ctx);   // drains the backend's streams (trace boundaries)
    void *sync_ctx;
    void (*free_model)(sd_model *m);
} sd_backend;
