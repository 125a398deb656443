// sample.h — sampling numerics of the round loop and the acceptance metrics (MODEL.md
// "Speculative rounds", step 3). This is the CPU reference; a GPU sampler mirrors the
// arithmetic order stated on each function (float throughout, sums in index order).
#pragma once
#include <stdint.h>

// The first index of the maximum; NaN never wins (all NaN: 0). n <= 0: -1.
int sd_argmax(const float *x, int n);

// p = softmax(logits / temperature), in this order:
//   m = max_i logits[i] (NaN skipped);  e_i = expf((logits[i] - m) / temperature)  (NaN -> 0);
//   s = e_0 + e_1 + ... in index order (float);  p_i = e_i * (1.0f / s).
// Edge cases, each the limit of the formula: temperature <= 0 (or NaN), or no finite max
// (+inf present, or all -inf / NaN): p is one-hot at sd_argmax(logits). p may alias logits.
// Across backends expf may differ by an ulp; everything else is the same operation order.
void sd_softmax(const float *logits, int n, float temperature, float *p);

// Inverse CDF in index order: the smallest i with p_i > 0 and c_i > u * total, where c_i is
// the float running sum of the positive entries up to i and total is the same sum to the end
// (entries <= 0 or NaN are never chosen and add nothing). u in [0, 1): u * total < total in
// float, and the last c_i is bit-identical to total, so some i always qualifies. Outside the
// contract (u >= 1, u NaN, an infinite total): the last index with p_i > 0. -1 only when no
// entry is positive.
int sd_sample(const float *p, int n, float u);

// The rejection residual: out_i = max(0, p_i - q_i), then out_i *= 1.0f / (sum in index
// order). If that sum is 0 — p <= q everywhere, which for two normalised distributions means
// p == q up to rounding — a rejection had probability 0 in exact arithmetic and happened only
// through rounding; the bonus must still be distributed as p, so out = p. out must not alias
// p or q.
void sd_residual(const float *p, const float *q, int n, float *out);

// Acceptance metrics over rounds. Zero-initialise ({0}) before the first round.
#define SD_STATS_MAX_POSITIONS 16
typedef struct sd_accept_stats {
    uint64_t rounds, drafted, accepted, emitted;
    uint64_t per_position[SD_STATS_MAX_POSITIONS]; // rounds whose draft position i (0-based) was accepted
    uint64_t histogram[SD_STATS_MAX_POSITIONS + 1]; // rounds that accepted exactly n drafts, n = 0..k
    int k;                                         // draft depth of the latest round
} sd_accept_stats;

// One round: k drafted, the first n_accepted of them accepted (0 <= n_accepted <= k),
// n_emitted tokens committed (n_accepted + 1 unless the sequence ended). Positions past
// SD_STATS_MAX_POSITIONS - 1 count in the totals only.
void sd_stats_add_round(sd_accept_stats *s, int k, int n_accepted, int n_emitted);
// accepted / drafted (0 when nothing was drafted).
double sd_stats_acceptance_rate(const sd_accept_stats *s);
// 1 + accepted / rounds: tokens per round with the bonus included (vLLM's and llama.cpp's
// mean accepted length). 0 when there were no rounds.
double sd_stats_mean_accepted_length(const sd_accept_stats *s);
// per_position[i] / rounds: the fraction of rounds whose draft position i was accepted
// (0 when there were no rounds or i is out of range).
double sd_stats_position_rate(const sd_accept_stats *s, int i);
