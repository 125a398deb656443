// generate.h — what a generation call (sd_decode, sd_spec_generate) is told besides its tokens,
// and what it tells back: the ids that end it (EOS), a stop flag, and a callback per prefill
// chunk and per commit (progress, streaming). Every member is optional; a NULL control
// generates exactly max_new tokens.
#pragma once
#include <signal.h>  // sig_atomic_t
#include <stdbool.h>
#include "model.h"   // sd_model, sd_state

typedef enum {
    SD_GEN_MAX_NEW = 0, // max_new tokens were generated
    SD_GEN_EOS,         // a stop id was committed (it is the last token of out)
    SD_GEN_STOPPED,     // the stop flag ended the generation between two rounds or steps
} sd_gen_end;

struct ledger;

// What runs a round or a step in place of the eager loop: the decode-graph door
// (engine/cuda/cuda_door.h), whose rounds are the eager rounds' bits from captured graphs.
typedef struct sd_round_runner {
    // One speculative round from x (round: the draws' key): emit gets the n + 1 committed tokens;
    // both states advance by n + 1.
    sd_code (*round)(void *ctx, int x, uint32_t round, int *emit, int *n, sd_status *st);
    // One plain decode step after tok: *next the new token; the state advances by 1.
    sd_code (*step)(void *ctx, int tok, int *next, sd_status *st);
    void *ctx;
} sd_round_runner;

typedef struct sd_gen_control {
    const int *eos;                    // ids that end the generation once committed
    int n_eos;
    const volatile sig_atomic_t *stop; // non-zero: end before the next round, step or prefill chunk
    void (*on_prefill)(void *ctx, int done, int total);     // after each prefill chunk of the target
    void (*on_commit)(void *ctx, const int *tokens, int n); // after each round or step: what it committed
    void *ctx;
    // The rounds and steps through a runner (NULL: the eager loop).
    const sd_round_runner *runner;
    // Observers of the target's forwards after the prefill (every verify pass, every decode step):
    // its routing read back on the host (sd_forward_opts.on_route; eager loop only), the selection
    // ledger's device arm (sd_forward_opts.ledger; a runner records inside its graphs instead), and
    // a call after each round or step with the target forward's positions pos0 .. pos0+T-1.
    sd_route_tap on_route;
    void *route_ctx;
    struct ledger *ledger;
    void (*after_target)(void *ctx, int pos0, int T);
    void *target_ctx;
    // Written by the generation:
    int n_out;      // tokens in out
    sd_gen_end end; // why it ended
} sd_gen_control;

// ---- for the loops of decode.c and spec.c ----

// Start: n_out = 0, end = SD_GEN_MAX_NEW. c may be NULL in every function here.
void sd_gen_begin(sd_gen_control *c);
// True when the stop flag is set (and records SD_GEN_STOPPED).
bool sd_gen_should_stop(sd_gen_control *c);
// How many of a round's n tokens to keep: at most room (the last round may overshoot max_new),
// and no token after the first stop id.
int sd_gen_keep(const sd_gen_control *c, const int *tokens, int n, int room);
// The kept tokens are in out: n_out becomes done (the total so far) and on_commit sees them.
// Returns true when the last of them is a stop id (the generation ends, SD_GEN_EOS).
bool sd_gen_committed(sd_gen_control *c, const int *tokens, int n, int done);
// sd_prefill in chunks of s->max_T, the stop flag checked before each and, when report,
// on_prefill called after each.
sd_code sd_gen_prefill(const sd_model *m, sd_state *s, const int *tokens, int n, sd_gen_control *c, bool report,
                       sd_status *st);
