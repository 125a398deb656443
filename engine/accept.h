// accept.h — step 3 of a speculative round (MODEL.md "Speculative rounds"): how many drafts
// stand (n) and which bonus token follows them, from the target's p_0..p_k and the draft's
// q_1..q_k. accept.c holds the CPU reference and the dispatcher; a backend whose distributions
// live in device memory runs its twin (sd_backend.accept; kernels/acceptance.cu for CUDA) on
// the same inputs, and the twin must return the same (n, bonus) bit for bit.
//
// The rule, with x at position pos_x and d_i drafted for position pos_x + i:
//   greedy:  n = the number of leading i with top[i-1] = d_i (top[i] = argmax p_i); bonus = top[n].
//   sampled: d_i stands while u_i·q_i(d_i) < p_{i-1}(d_i), u_i = sd_uniform(seed, round,
//            pos_x + i, SD_DRAW_ACCEPT) (i.e. with probability min(1, p/q)). At the first
//            rejection i: n = i - 1 and bonus = sd_sample(sd_residual(p_{i-1}, q_i), u) with
//            u = sd_uniform(seed, round, pos_x + i, SD_DRAW_BONUS). All k stand: n = k and
//            bonus = sd_sample(p_k, sd_uniform(seed, round, pos_x + k + 1, SD_DRAW_BONUS)).
#pragma once
#include <stdint.h>
#include "status.h" // sd_code, sd_status

struct sd_model;

#define SD_ACCEPT_MAX_K 16 // the deepest round (spec.h's SD_SPEC_MAX_K)

typedef struct {
    int k, V;              // drafts (1..SD_ACCEPT_MAX_K) and the vocabulary
    const int *drafts;     // (k) host memory: d_1 .. d_k, each in 0..V-1
    const int *top;        // greedy: (k+1) host memory, argmax p_0 .. argmax p_k. NULL: sampled
    const float *p;        // sampled: (k+1, V) p_0 .. p_k, in the backend's memory
    const float *q;        // sampled: (k, V) q_1 .. q_k, in the same backend's memory
    float *work;           // sampled: (V) the residual, same memory; aliases neither p nor q
    uint64_t seed;         // the Philox key
    uint32_t round, pos_x; // the round's counter and x's position
} sd_accept_args;

// The CPU reference on host memory: the rule above, in sample.h's operation order.
void sd_accept_ref(const sd_accept_args *a, int *n, int *bonus);

// Step 3 for a round whose target is `target`: greedy (top in host memory) and host-memory
// backends run sd_accept_ref; a backend with device memory runs its accept op (only the two
// ints come back). Errors: k outside 1..SD_ACCEPT_MAX_K, V not the target's vocabulary, a draft
// outside it, a backend without an accept op, or the backend's own failure.
sd_code sd_accept(const struct sd_model *target, const sd_accept_args *a, int *n, int *bonus, sd_status *st);
