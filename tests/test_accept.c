// test_accept.c — step 3 of a round (accept.h): the CPU reference on hand-made p and q (greedy;
// sampled accept, rejection → residual bonus, all accepted → bonus from p_k, the flat residual
// → bonus from p, the min(1, p/q) rule draw by draw) and the dispatcher's refusals.
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>
#include "accept.h"
#include "model.h"  // sd_model (a CPU model for the dispatcher)
#include "philox.h" // sd_uniform
#include "sample.h" // sd_sample, sd_residual

enum { V = 4 };
static const uint64_t SEED = 99;
static const uint32_t ROUND = 3, POS_X = 10;

static sd_accept_args sampled_args(int k, const int *drafts, const float *p, const float *q, float *work) {
    return (sd_accept_args){.k = k, .V = V, .drafts = drafts, .p = p, .q = q, .work = work, .seed = SEED,
                            .round = ROUND, .pos_x = POS_X};
}

static float u_at(uint32_t i, sd_draw_purpose purpose) { return sd_uniform(SEED, ROUND, POS_X + i, purpose); }

// ---- greedy: d_i stands while it is argmax p_{i-1}; the bonus is argmax p_n ----

typedef struct {
    int k, drafts[4], top[5], n, bonus;
} greedy_case;

Test(accept, greedy_table) {
    const greedy_case cases[] = {
        {3, {5, 6, 7}, {5, 6, 7, 8}, 3, 8}, // all stand: the bonus is argmax p_k
        {3, {5, 9, 7}, {5, 6, 7, 8}, 1, 6}, // the first mismatch stops, whatever follows
        {3, {4, 6, 7}, {5, 6, 7, 8}, 0, 5}, // zero accepted: the bonus is argmax p_0
        {1, {2}, {2, 3}, 1, 3},
        {1, {1}, {2, 3}, 0, 2},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const greedy_case *g = &cases[c];
        sd_accept_args a = {.k = g->k, .V = 16, .drafts = g->drafts, .top = g->top};
        int n = -1, bonus = -1;
        sd_accept_ref(&a, &n, &bonus);
        cr_expect_eq(n, g->n, "case %zu: n = %d", c, n);
        cr_expect_eq(bonus, g->bonus, "case %zu: bonus = %d", c, bonus);
    }
}

// ---- sampled ----

// p == q with p(d) > 0 everywhere drafted: u·q < p for every u < 1, so all k stand and the bonus
// is p_k's draw at pos_x + k + 1.
Test(accept, p_equals_q_accepts_all_and_draws_the_bonus_from_p_k) {
    const float p[3 * V] = {0.1f, 0.2f, 0.3f, 0.4f, 0.25f, 0.25f, 0.25f, 0.25f, 0.7f, 0.1f, 0.1f, 0.1f};
    const int drafts[2] = {3, 0};
    float work[V];
    sd_accept_args a = sampled_args(2, drafts, p, p, work);
    int n, bonus;
    sd_accept_ref(&a, &n, &bonus);
    cr_expect_eq(n, 2);
    cr_expect_eq(bonus, sd_sample(p + 2 * V, V, u_at(3, SD_DRAW_BONUS)), "bonus %d", bonus);
}

// p_k one-hot: whatever the draw, the bonus after k acceptances is that token.
Test(accept, all_accepted_bonus_is_from_p_k) {
    const float p[3 * V] = {0.1f, 0.2f, 0.3f, 0.4f, 0.25f, 0.25f, 0.25f, 0.25f, 0, 0, 0, 1};
    const int drafts[2] = {1, 2};
    float work[V];
    for (uint64_t seed = 0; seed < 50; seed++) {
        sd_accept_args a = sampled_args(2, drafts, p, p, work);
        a.seed = seed;
        int n, bonus;
        sd_accept_ref(&a, &n, &bonus);
        cr_assert_eq(n, 2, "seed %llu", (unsigned long long)seed);
        cr_assert_eq(bonus, 3, "seed %llu: bonus %d", (unsigned long long)seed, bonus);
    }
}

// p_0(d_1) = 0: d_1 is rejected by any draw, and the residual max(0, p_0 - q_1) is one-hot.
Test(accept, rejection_draws_the_bonus_from_the_residual) {
    const float p[3 * V] = {0, 0, 1, 0, 0.25f, 0.25f, 0.25f, 0.25f, 0.25f, 0.25f, 0.25f, 0.25f};
    const float q[2 * V] = {0, 1, 0, 0, 0.25f, 0.25f, 0.25f, 0.25f};
    const int drafts[2] = {1, 0};
    float work[V];
    for (uint64_t seed = 0; seed < 50; seed++) {
        sd_accept_args a = sampled_args(2, drafts, p, q, work);
        a.seed = seed;
        int n, bonus;
        sd_accept_ref(&a, &n, &bonus);
        cr_assert_eq(n, 0, "seed %llu", (unsigned long long)seed);
        cr_assert_eq(bonus, 2, "seed %llu: the residual is one-hot at 2, got %d", (unsigned long long)seed, bonus);
    }
}

// A rejection at i = 2: d_1 stands (p_0 == q_1), p_1(d_2) = 0 rejects d_2, and the bonus is the
// draw from norm(max(0, p_1 - q_2)) = (½, ½, 0, 0) at pos_x + 2.
Test(accept, second_draft_rejected) {
    const float p[3 * V] = {0.1f, 0.2f, 0.3f, 0.4f, 0.5f, 0.5f, 0, 0, 0.25f, 0.25f, 0.25f, 0.25f};
    const float q[2 * V] = {0.1f, 0.2f, 0.3f, 0.4f, 0, 0, 0, 1};
    const int drafts[2] = {2, 3};
    float work[V], res[V];
    sd_accept_args a = sampled_args(2, drafts, p, q, work);
    int n, bonus;
    sd_accept_ref(&a, &n, &bonus);
    cr_expect_eq(n, 1);
    sd_residual(p + V, q + V, V, res);
    cr_expect_eq(bonus, sd_sample(res, V, u_at(2, SD_DRAW_BONUS)), "bonus %d", bonus);
    cr_expect(bonus == 0 || bonus == 1, "the residual has no mass on %d", bonus);
}

// A rejection whose residual sums to 0 (p <= q everywhere, possible only through rounding for
// normalised inputs): the bonus is distributed as p (sample.h: sd_residual).
Test(accept, flat_residual_draws_the_bonus_from_p) {
    const float p[2 * V] = {0.25f, 0.25f, 0.5f, 0, 0.25f, 0.25f, 0.25f, 0.25f};
    const float q[1 * V] = {1e30f, 0.25f, 0.5f, 0};
    const int drafts[1] = {0};
    float work[V];
    cr_assert_gt(u_at(1, SD_DRAW_ACCEPT), 0.0f, "the test needs u > 0 (u·1e30 >= 0.25)");
    sd_accept_args a = sampled_args(1, drafts, p, q, work);
    int n, bonus;
    sd_accept_ref(&a, &n, &bonus);
    cr_expect_eq(n, 0);
    cr_expect_eq(bonus, sd_sample(p, V, u_at(1, SD_DRAW_BONUS)), "bonus %d", bonus);
}

// The rule draw by draw: d_1 stands iff u·q_1(d_1) < p_0(d_1), u = sd_uniform(seed, round,
// pos_x + 1, SD_DRAW_ACCEPT) — here p/q = ½, so about half of 2000 rounds accept.
Test(accept, min_one_p_over_q_draw_by_draw) {
    const float p[2 * V] = {0.3f, 0.7f, 0, 0, 0.25f, 0.25f, 0.25f, 0.25f};
    const float q[1 * V] = {0.6f, 0.4f, 0, 0};
    const int drafts[1] = {0};
    float work[V];
    int accepted = 0;
    const int rounds = 2000;
    for (uint32_t r = 0; r < (uint32_t)rounds; r++) {
        sd_accept_args a = sampled_args(1, drafts, p, q, work);
        a.round = r;
        int n, bonus;
        sd_accept_ref(&a, &n, &bonus);
        const int want = sd_uniform(SEED, r, POS_X + 1, SD_DRAW_ACCEPT) * 0.6f < 0.3f;
        cr_assert_eq(n, want, "round %u", r);
        // Rejected: max(0, p - q) = (0, 0.3, 0, 0) → token 1. Accepted: p_1's draw.
        if (!n) cr_assert_eq(bonus, 1, "round %u", r);
        accepted += n;
    }
    // Binomial(2000, ½): sd ≈ 22; 110 is 5 sd.
    cr_expect_leq(abs(accepted - rounds / 2), 110, "accepted %d of %d", accepted, rounds);
}

// ---- the dispatcher ----

Test(accept, dispatcher_runs_the_reference_on_the_cpu_and_refuses_bad_input) {
    sd_model m;
    memset(&m, 0, sizeof m);
    m.cfg.vocab_size = V; // a CPU model: backend NULL
    const float p[2 * V] = {0, 0, 1, 0, 0.25f, 0.25f, 0.25f, 0.25f};
    const float q[1 * V] = {0, 1, 0, 0};
    int drafts[1] = {1}, n = -1, bonus = -1;
    float work[V];
    sd_status st = {0};
    sd_accept_args a = sampled_args(1, drafts, p, q, work);
    cr_assert_eq(sd_accept(&m, &a, &n, &bonus, &st), SD_OK, "%s", st.msg);
    cr_expect(n == 0 && bonus == 2, "n %d bonus %d", n, bonus);

    a.k = 0;
    cr_expect_eq(sd_accept(&m, &a, &n, &bonus, &st), SD_ERR_USAGE);
    a.k = SD_ACCEPT_MAX_K + 1;
    cr_expect_eq(sd_accept(&m, &a, &n, &bonus, &st), SD_ERR_USAGE);
    cr_expect(strstr(st.msg, "17") != NULL, "%s", st.msg);
    a.k = 1;
    a.V = V + 1;
    cr_expect_eq(sd_accept(&m, &a, &n, &bonus, &st), SD_ERR_USAGE);
    a.V = V;
    drafts[0] = V;
    cr_expect_eq(sd_accept(&m, &a, &n, &bonus, &st), SD_ERR_DATA);
    cr_expect(strstr(st.msg, "d_1 = 4") != NULL, "%s", st.msg);
}
