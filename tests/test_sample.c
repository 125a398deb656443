// test_sample.c — Philox-4x32-10, the sampling numerics and the acceptance metrics
// (philox.h, sample.h).
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>
#include "philox.h"
#include "sample.h"

// ---- Philox-4x32-10: Random123's kat_vectors ----

typedef struct {
    uint32_t ctr[4], key[2], out[4];
} philox_kat;

static const philox_kat philox_kats[] = {
    {{0, 0, 0, 0}, {0, 0}, {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
    {{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}, {0xffffffff, 0xffffffff},
     {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
    {{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}, {0xa4093822, 0x299f31d0},
     {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}},
};

Test(philox, known_answers) {
    for (size_t i = 0; i < sizeof philox_kats / sizeof philox_kats[0]; i++) {
        const philox_kat *t = &philox_kats[i];
        sd_philox_out o = sd_philox4x32_10(t->ctr, t->key);
        for (int w = 0; w < 4; w++)
            cr_expect_eq(o.v[w], t->out[w], "kat %zu word %d: %08x, want %08x", i, w, o.v[w], t->out[w]);
    }
}

Test(philox, unit_float_range) {
    cr_expect_eq(sd_u32_to_unit(0), 0.0f);
    cr_expect_lt(sd_u32_to_unit(0xffffffffu), 1.0f);
    cr_expect_eq(sd_u32_to_unit(0xffffffffu), 1.0f - 1.0f / 16777216.0f);
    double sum = 0;
    const int n = 20000;
    for (int i = 0; i < n; i++) {
        float u = sd_uniform(42, (uint32_t)i, (uint32_t)(i % 7), SD_DRAW_ACCEPT);
        cr_assert(u >= 0.0f && u < 1.0f, "draw %d: %.9g", i, u);
        sum += u;
    }
    // mean of n uniforms: sd = 1/sqrt(12 n) ~ 0.002; 0.01 is 5 sd.
    cr_expect_leq(fabs(sum / n - 0.5), 0.01, "mean %.4f", sum / n);
}

Test(philox, draw_depends_on_every_key_and_counter_part) {
    const uint64_t seed = 0x0123456789abcdefull;
    float base = sd_uniform(seed, 5, 3, SD_DRAW_BONUS);
    cr_expect_eq(sd_uniform(seed, 5, 3, SD_DRAW_BONUS), base, "deterministic");
    cr_expect_neq(sd_uniform(seed ^ 1, 5, 3, SD_DRAW_BONUS), base, "seed low half");
    cr_expect_neq(sd_uniform(seed ^ (1ull << 32), 5, 3, SD_DRAW_BONUS), base, "seed high half");
    cr_expect_neq(sd_uniform(seed, 6, 3, SD_DRAW_BONUS), base, "round");
    cr_expect_neq(sd_uniform(seed, 5, 4, SD_DRAW_BONUS), base, "position");
    cr_expect_neq(sd_uniform(seed, 5, 3, SD_DRAW_ACCEPT), base, "purpose");
}

// ---- argmax ----

typedef struct {
    float x[5];
    int n, want;
} argmax_case;

Test(sample, argmax_table) {
    const float inf = INFINITY, nan = NAN;
    const argmax_case cases[] = {
        {{1, 3, 2, 0, 0}, 3, 1},
        {{2, 5, 5, 1, 5}, 5, 1},           // ties: the lowest index
        {{nan, 1, 2, nan, 0}, 5, 2},       // NaN never wins
        {{nan, -inf, nan, 0, 0}, 3, 1},    // not even over -inf
        {{nan, nan, nan, 0, 0}, 3, 0},     // all NaN: 0
        {{-inf, -inf, -inf, 0, 0}, 3, 0},
        {{-1, inf, inf, 0, 0}, 3, 1},
        {{7, 0, 0, 0, 0}, 1, 0},
        {{0, 0, 0, 0, 0}, 0, -1},          // nothing to choose from
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        cr_expect_eq(sd_argmax(cases[i].x, cases[i].n), cases[i].want, "case %zu", i);
}

// ---- softmax ----

static float sum_of(const float *p, int n) {
    float s = 0;
    for (int i = 0; i < n; i++) s += p[i];
    return s;
}

Test(sample, softmax_sums_to_one_and_keeps_order) {
    const float logits[6] = {1.5f, -2.0f, 0.25f, 3.0f, 3.0f, -40.0f};
    float p[6];
    const float temps[] = {0.3f, 1.0f, 2.5f};
    for (size_t t = 0; t < 3; t++) {
        sd_softmax(logits, 6, temps[t], p);
        // 6 roundings of values <= 1 in the sum and one in each product: a few ulp of 1.
        cr_expect_leq(fabsf(sum_of(p, 6) - 1.0f), 1e-6f, "tau %g: sum %.9g", temps[t], sum_of(p, 6));
        cr_expect_eq(p[3], p[4], "equal logits, equal probabilities");
        cr_expect_gt(p[0], p[2]);
        cr_expect_gt(p[2], p[1]);
        cr_expect_geq(p[5], 0.0f);
    }
}

Test(sample, softmax_exact_two_way) {
    const float logits[2] = {0.0f, logf(3.0f)};
    float p[2];
    sd_softmax(logits, 2, 1.0f, p);
    cr_expect_float_eq(p[0], 0.25f, 1e-6f, "%.9g", p[0]);
    cr_expect_float_eq(p[1], 0.75f, 1e-6f, "%.9g", p[1]);
    sd_softmax(logits, 2, 0.5f, p); // odds squared: 1:9
    cr_expect_float_eq(p[1], 0.9f, 1e-6f, "%.9g", p[1]);
}

Test(sample, temperature_sharpens) {
    const float logits[4] = {2.0f, 1.0f, 0.5f, -1.0f};
    const float temps[] = {4.0f, 1.0f, 0.5f, 0.1f};
    float prev = 0.0f, p[4];
    for (size_t t = 0; t < 4; t++) {
        sd_softmax(logits, 4, temps[t], p);
        cr_expect_gt(p[0], prev, "tau %g: top %.6f, previous %.6f", temps[t], p[0], prev);
        prev = p[0];
    }
}

Test(sample, softmax_limits_are_one_hot) {
    const float nan = NAN;
    float p[4];
    const float logits[4] = {0.5f, 2.0f, 2.0f, nan};
    sd_softmax(logits, 4, 0.0f, p); // temperature 0: greedy
    cr_expect(p[0] == 0 && p[1] == 1 && p[2] == 0 && p[3] == 0);
    sd_softmax(logits, 4, 1.0f, p); // NaN gets probability 0
    cr_expect_eq(p[3], 0.0f);
    cr_expect_leq(fabsf(sum_of(p, 4) - 1.0f), 1e-6f);
    const float with_inf[3] = {1.0f, INFINITY, 0.0f};
    sd_softmax(with_inf, 3, 1.0f, p);
    cr_expect(p[0] == 0 && p[1] == 1 && p[2] == 0);
}

// ---- sampling ----

typedef struct {
    float u;
    int want;
} sample_case;

Test(sample, inverse_cdf_edges) {
    const float p[5] = {0.0f, 0.25f, 0.0f, 0.75f, 0.0f};
    const float below_one = nextafterf(1.0f, 0.0f);
    const sample_case cases[] = {
        {0.0f, 1},          // u = 0: the first positive entry, never the leading zero
        {0.2499f, 1},
        {0.25f, 3},         // cumulative must exceed u * total
        {0.9f, 3},
        {below_one, 3},     // never the trailing zero
        {1.0f, 3},          // outside [0, 1): still a valid index with p > 0
        {NAN, 3},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        cr_expect_eq(sd_sample(p, 5, cases[i].u), cases[i].want, "u=%.9g", cases[i].u);
    const float unnormalised[3] = {2.0f, 0.0f, 2.0f};
    cr_expect_eq(sd_sample(unnormalised, 3, 0.49f), 0);
    cr_expect_eq(sd_sample(unnormalised, 3, 0.5f), 2);
    const float junk[4] = {-1.0f, NAN, 0.5f, 0.5f}; // negative and NaN entries are never chosen
    cr_expect_eq(sd_sample(junk, 4, 0.0f), 2);
    cr_expect_eq(sd_sample(junk, 4, 0.5f), 3);
    const float zeros[3] = {0.0f, -0.0f, 0.0f};
    cr_expect_eq(sd_sample(zeros, 3, 0.5f), -1, "no positive entry");
}

Test(sample, never_a_zero_probability_index) {
    // Random vectors with many exact zeros, u swept up to just below 1: every draw lands on
    // an index with p > 0.
    float p[64];
    const float below_one = nextafterf(1.0f, 0.0f);
    for (uint32_t trial = 0; trial < 200; trial++) {
        for (int i = 0; i < 64; i++) {
            float r = sd_uniform(7, trial, (uint32_t)i, SD_DRAW_INIT);
            p[i] = r < 0.6f ? 0.0f : r * 1e-3f * (float)(1 + i);
        }
        p[63] = 0.0f;
        for (int j = 0; j <= 100; j++) {
            float u = j == 100 ? below_one : (float)j / 100.0f;
            int s = sd_sample(p, 64, u);
            cr_assert(s >= 0 && s < 64 && p[s] > 0, "trial %u u=%.9g -> %d", trial, u, s);
        }
    }
}

// ---- residual ----

typedef struct {
    float p[3], q[3], want[3];
} residual_case;

Test(sample, residual_table) {
    const residual_case cases[] = {
        {{0.5f, 0.3f, 0.2f}, {0.2f, 0.5f, 0.3f}, {1.0f, 0.0f, 0.0f}},
        {{0.4f, 0.4f, 0.2f}, {0.2f, 0.2f, 0.6f}, {0.5f, 0.5f, 0.0f}},
        {{0.6f, 0.3f, 0.1f}, {0.6f, 0.3f, 0.1f}, {0.6f, 0.3f, 0.1f}}, // p == q: out = p
        {{0.0f, 1.0f, 0.0f}, {0.5f, 0.5f, 0.0f}, {0.0f, 1.0f, 0.0f}},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        float out[3];
        sd_residual(cases[i].p, cases[i].q, 3, out);
        for (int j = 0; j < 3; j++)
            cr_expect_float_eq(out[j], cases[i].want[j], 1e-6f, "case %zu [%d]: %.9g", i, j, out[j]);
    }
}

// ---- acceptance metrics ----

typedef struct {
    int n_accepted, n_emitted;
} round_rec;

typedef struct {
    const char *name;
    int k, n_rounds;
    round_rec rounds[6];
    uint64_t drafted, accepted, emitted;
    double rate, mean_len, pos[5];
} stats_case;

Test(sample, acceptance_metrics_table) {
    const stats_case cases[] = {
        {"all accepted", 4, 3, {{4, 5}, {4, 5}, {4, 5}}, 12, 12, 15, 1.0, 5.0, {1, 1, 1, 1, 0}},
        {"none accepted", 4, 2, {{0, 1}, {0, 1}}, 8, 0, 2, 0.0, 1.0, {0, 0, 0, 0, 0}},
        {"mixed", 4, 4, {{4, 5}, {0, 1}, {2, 3}, {1, 2}}, 16, 7, 11, 0.4375, 2.75,
         {0.75, 0.5, 0.25, 0.25, 0}},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const stats_case *t = &cases[c];
        sd_accept_stats s = {0};
        for (int r = 0; r < t->n_rounds; r++)
            sd_stats_add_round(&s, t->k, t->rounds[r].n_accepted, t->rounds[r].n_emitted);
        cr_expect_eq(s.rounds, (uint64_t)t->n_rounds, "%s", t->name);
        cr_expect_eq(s.drafted, t->drafted, "%s", t->name);
        cr_expect_eq(s.accepted, t->accepted, "%s", t->name);
        cr_expect_eq(s.emitted, t->emitted, "%s", t->name);
        cr_expect_eq(s.k, t->k, "%s", t->name);
        // exact: each is one division of small integers, and the table holds exact binary values
        cr_expect_eq(sd_stats_acceptance_rate(&s), t->rate, "%s: rate %.17g", t->name, sd_stats_acceptance_rate(&s));
        cr_expect_eq(sd_stats_mean_accepted_length(&s), t->mean_len, "%s: mean length", t->name);
        for (int i = 0; i < 5; i++)
            cr_expect_eq(sd_stats_position_rate(&s, i), t->pos[i], "%s: position %d", t->name, i);
    }
}

Test(sample, metrics_of_nothing_are_zero) {
    sd_accept_stats s = {0};
    cr_expect_eq(sd_stats_acceptance_rate(&s), 0.0);
    cr_expect_eq(sd_stats_mean_accepted_length(&s), 0.0);
    cr_expect_eq(sd_stats_position_rate(&s, 0), 0.0);
    sd_stats_add_round(&s, 2, 2, 3);
    cr_expect_eq(sd_stats_position_rate(&s, -1), 0.0);
    cr_expect_eq(sd_stats_position_rate(&s, SD_STATS_MAX_POSITIONS), 0.0);
}

// The histogram counts rounds by their accepted length; it sums to the rounds and its
// accepted-weighted sum is the accepted total.
Test(sample, acceptance_histogram) {
    sd_accept_stats s = {0};
    const int n[] = {0, 3, 3, 1, 2, 3, 0};
    for (size_t i = 0; i < sizeof n / sizeof n[0]; i++) sd_stats_add_round(&s, 3, n[i], n[i] + 1);
    const uint64_t want[4] = {2, 1, 1, 3};
    uint64_t rounds = 0, accepted = 0;
    for (int j = 0; j <= 3; j++) {
        cr_expect_eq(s.histogram[j], want[j], "histogram[%d] = %llu", j, (unsigned long long)s.histogram[j]);
        rounds += s.histogram[j];
        accepted += (uint64_t)j * s.histogram[j];
    }
    cr_expect_eq(rounds, s.rounds);
    cr_expect_eq(accepted, s.accepted);
    cr_expect_eq(s.histogram[4], 0);
}
