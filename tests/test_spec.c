// test_spec.c — speculative rounds: spec ≡ greedy token for token, seeded sampling, the
// preserved distribution (chi-square), and the trace observed on a real run.
#include <math.h>
#include <signal.h>
#include <stdbool.h>
#include <string.h>
#include "common.h"
#include "decode.h"
#include "spec.h"

typedef struct {
    sd_model target, draft;
} pair;

// Target + derived draft of configs/tiny.json (draft = first n layers; tail scaled by E).
static void derived_pair(int n_layers, float tail, pair *p) {
    sd_config cfg, dcfg;
    load_config("configs/tiny.json", &cfg);
    sd_status st = {0};
    cr_assert_eq(sd_draft_config(&cfg, n_layers, &dcfg, &st), SD_OK);
    sd_synth_opts o = {.seed = 21, .dtype = SD_DT_F32, .tail_from = n_layers, .tail_scale = tail, .depth = cfg.num_hidden_layers};
    cr_assert_eq(sd_synth_model(&p->target, &cfg, &o, &st), SD_OK);
    cr_assert_eq(sd_synth_model(&p->draft, &dcfg, &o, &st), SD_OK);
}

static void free_pair(pair *p) {
    sd_model_free(&p->target);
    sd_model_free(&p->draft);
}

static void plain_with(const sd_model *m, const int *prompt, int n_prompt, int max_new, float temp, uint64_t seed,
                       sd_gen_control *ctl, int *out) {
    sd_state s;
    sd_status st = {0};
    cr_assert_eq(sd_state_init(&s, &m->cfg, n_prompt + max_new, 8, &st), SD_OK);
    cr_assert_eq(sd_decode(m, &s, prompt, n_prompt, max_new, temp, seed, ctl, out, &st), SD_OK, "%s", st.msg);
    sd_state_free(&s);
}

static void plain(const sd_model *m, const int *prompt, int n_prompt, int max_new, float temp, uint64_t seed, int *out) {
    plain_with(m, prompt, n_prompt, max_new, temp, seed, NULL, out);
}

static void spec_with(const pair *p, int k, const int *prompt, int n_prompt, int max_new, float temp, uint64_t seed,
                      int *out, sd_accept_stats *stats, trace_burst *tb, sd_gen_control *ctl) {
    sd_state ts, ds;
    sd_status st = {0};
    cr_assert_eq(sd_state_init(&ts, &p->target.cfg, n_prompt + max_new + k + 1, k + 1, &st), SD_OK);
    cr_assert_eq(sd_state_init(&ds, &p->draft.cfg, n_prompt + max_new + k + 1, k, &st), SD_OK);
    sd_spec_opts o = {.k = k, .temperature = temp, .seed = seed, .trace = tb, .control = ctl};
    cr_assert_eq(sd_spec_generate(&p->target, &ts, &p->draft, &ds, prompt, n_prompt, max_new, &o, out, stats, &st), SD_OK,
                 "%s", st.msg);
    sd_state_free(&ts);
    sd_state_free(&ds);
}

static void spec(const pair *p, int k, const int *prompt, int n_prompt, int max_new, float temp, uint64_t seed,
                 int *out, sd_accept_stats *stats, trace_burst *tb) {
    spec_with(p, k, prompt, n_prompt, max_new, temp, seed, out, stats, tb, NULL);
}

enum { N_PROMPT = 7, N_NEW = 40 };

static void check_spec_equals_greedy(pair *p, const char *what) {
    int prompt[N_PROMPT], want[N_NEW], got[N_NEW];
    random_tokens(8, p->target.cfg.vocab_size, N_PROMPT, prompt);
    plain(&p->target, prompt, N_PROMPT, N_NEW, 0.0f, 0, want);
    for (int k = 1; k <= 8; k++) {
        sd_accept_stats stats = {0};
        spec(p, k, prompt, N_PROMPT, N_NEW, 0.0f, 0, got, &stats, NULL);
        for (int i = 0; i < N_NEW; i++)
            cr_assert_eq(got[i], want[i], "%s, k = %d: token %d is %d, greedy decode gave %d", what, k, i, got[i], want[i]);
        cr_assert_eq(stats.emitted, (uint64_t)N_NEW, "%s, k = %d: emitted %llu", what, k, (unsigned long long)stats.emitted);
    }
}

Test(spec_greedy, tail_scale_0_full_accept) {
    pair p;
    derived_pair(2, 0.0f, &p);
    check_spec_equals_greedy(&p, "E = 0");
    // Every round accepts all k drafts: acceptance 1 and k+1 tokens per round.
    int prompt[N_PROMPT], out[N_NEW];
    random_tokens(8, p.target.cfg.vocab_size, N_PROMPT, prompt);
    sd_accept_stats stats = {0};
    spec(&p, 4, prompt, N_PROMPT, N_NEW, 0.0f, 0, out, &stats, NULL);
    cr_assert_eq(stats.accepted, stats.drafted);
    cr_assert_eq(stats.rounds, (uint64_t)(N_NEW + 4) / 5);
    free_pair(&p);
}

Test(spec_greedy, tail_scale_0_3) {
    pair p;
    derived_pair(2, 0.3f, &p);
    check_spec_equals_greedy(&p, "E = 0.3");
    free_pair(&p);
}

Test(spec_greedy, tail_scale_1_with_zero_accept_rounds) {
    pair p;
    derived_pair(1, 1.0f, &p);
    check_spec_equals_greedy(&p, "E = 1.0");
    int prompt[N_PROMPT], out[N_NEW];
    random_tokens(8, p.target.cfg.vocab_size, N_PROMPT, prompt);
    sd_accept_stats stats = {0};
    spec(&p, 4, prompt, N_PROMPT, N_NEW, 0.0f, 0, out, &stats, NULL);
    cr_assert_lt(stats.per_position[0], stats.rounds, "some round must reject its first draft (zero-accept)");
    free_pair(&p);
}

// A draft that is not the target's prefix: another config (narrower) and another seed.
Test(spec_greedy, unrelated_draft_config) {
    pair p;
    sd_config cfg, dcfg;
    load_config("configs/tiny.json", &cfg);
    dcfg = cfg;
    dcfg.hidden_size = 16;
    dcfg.num_hidden_layers = 3;
    sd_status st = {0};
    sd_synth_opts ot = {.seed = 1, .dtype = SD_DT_BF16, .tail_from = SD_MAX_LAYERS, .tail_scale = 1.0f};
    sd_synth_opts od = {.seed = 2, .dtype = SD_DT_F32, .tail_from = SD_MAX_LAYERS, .tail_scale = 1.0f};
    cr_assert_eq(sd_synth_model(&p.target, &cfg, &ot, &st), SD_OK);
    cr_assert_eq(sd_synth_model(&p.draft, &dcfg, &od, &st), SD_OK, "%s", st.msg);
    check_spec_equals_greedy(&p, "unrelated draft");
    free_pair(&p);
}

Test(spec_sampled, same_seed_same_stream) {
    pair p;
    derived_pair(2, 0.3f, &p);
    int prompt[N_PROMPT], a[N_NEW], b[N_NEW], c[N_NEW];
    random_tokens(9, p.target.cfg.vocab_size, N_PROMPT, prompt);
    sd_accept_stats s = {0};
    spec(&p, 4, prompt, N_PROMPT, N_NEW, 1.0f, 77, a, &s, NULL);
    spec(&p, 4, prompt, N_PROMPT, N_NEW, 1.0f, 77, b, &s, NULL);
    spec(&p, 4, prompt, N_PROMPT, N_NEW, 1.0f, 78, c, &s, NULL);
    cr_assert(memcmp(a, b, sizeof a) == 0, "same seed, different stream");
    cr_assert(memcmp(a, c, sizeof a) != 0, "another seed gave the same 40 tokens");
    free_pair(&p);
}

// Wilson–Hilferty: the chi-square quantile for df degrees of freedom at the upper tail whose
// standard-normal quantile is z. z = 3.719 ↔ one-sided 1e-4: the test fails by chance with
// probability below 1e-4.
static double chi2_critical(int df, double z) {
    double a = 2.0 / (9.0 * df);
    return df * pow(1.0 - a + z * sqrt(a), 3.0);
}

// The first emitted token of a sampled speculative run is distributed as the target's
// p_0 = softmax(logits after the prompt / τ), whatever the draft: over many seeds its counts
// must pass a chi-square test against p_0 (bins with expected count < 5 merged into one).
static void check_distribution(int n_layers, float tail, int k) {
    pair p;
    derived_pair(n_layers, tail, &p);
    const int V = p.target.cfg.vocab_size, N = 3000;
    const float temp = 1.5f;
    int prompt[N_PROMPT];
    random_tokens(10, V, N_PROMPT, prompt);
    float lg[V], p0[V];
    sd_state s;
    sd_status st = {0};
    cr_assert_eq(sd_state_init(&s, &p.target.cfg, 64, 8, &st), SD_OK);
    cr_assert_eq(sd_prefill(&p.target, &s, prompt, N_PROMPT, lg, &st), SD_OK);
    sd_state_free(&s);
    sd_softmax(lg, V, temp, p0);

    int counts[V];
    memset(counts, 0, sizeof counts);
    sd_accept_stats stats = {0};
    for (int seed = 0; seed < N; seed++) {
        int out[1];
        spec(&p, k, prompt, N_PROMPT, 1, temp, (uint64_t)seed, out, &stats, NULL);
        counts[out[0]]++;
    }
    double chi2 = 0, rest_e = 0, rest_o = 0;
    int bins = 0;
    for (int i = 0; i < V; i++) {
        double e = N * (double)p0[i];
        if (e < 5.0) { rest_e += e; rest_o += counts[i]; continue; }
        chi2 += (counts[i] - e) * (counts[i] - e) / e;
        bins++;
    }
    if (rest_e > 0) { chi2 += (rest_o - rest_e) * (rest_o - rest_e) / rest_e; bins++; }
    double crit = chi2_critical(bins - 1, 3.719);
    cr_assert(chi2 < crit, "E = %.1f, k = %d: chi2 %.1f over %d bins exceeds %.1f (p < 1e-4)", tail, k, chi2, bins, crit);
    cr_assert_lt(stats.accepted, stats.drafted, "the test needs rejections to exercise the residual");
    free_pair(&p);
}

Test(spec_sampled, first_token_distribution_is_target, .timeout = 120) { check_distribution(1, 1.0f, 3); }

// The trace on a real run: phases add up to the total, level-2 invariants hold.
Test(spec_trace, level2_buckets_from_the_real_verify) {
    pair p;
    derived_pair(2, 0.3f, &p);
    int prompt[N_PROMPT], out[N_NEW];
    random_tokens(11, p.target.cfg.vocab_size, N_PROMPT, prompt);
    trace_burst tb;
    trace_burst_begin(&tb, 2, 4, NULL, NULL);
    sd_accept_stats stats = {0};
    spec(&p, 4, prompt, N_PROMPT, N_NEW, 0.0f, 0, out, &stats, &tb);
    cr_assert_eq(tb.acc.rounds, stats.rounds);
    cr_assert_eq(tb.acc.accepted, stats.accepted);
    cr_assert_gt(tb.phase_ns[TRACE_PHASE_VERIFY], 0);
    cr_assert_gt(tb.bucket_ns[TRACE_BUCKET_VKDA], 0, "vkda ticks from the KDA layers of verify");
    cr_assert_gt(tb.bucket_ns[TRACE_BUCKET_VMLA], 0, "vmla ticks from the MLA layer of verify");
    cr_assert_gt(tb.bucket_ns[TRACE_BUCKET_SCAN], 0);
    cr_assert_leq(tb.bucket_ns[TRACE_BUCKET_SCAN], tb.bucket_ns[TRACE_BUCKET_VKDA]);
    uint64_t mixers = tb.bucket_ns[TRACE_BUCKET_VKDA] + tb.bucket_ns[TRACE_BUCKET_VMLA];
    cr_assert_leq(mixers, tb.phase_ns[TRACE_PHASE_VERIFY], "the buckets are inside verify");
    cr_assert_leq(tb.bucket_ns[TRACE_BUCKET_VFFN], tb.phase_ns[TRACE_PHASE_VERIFY] - mixers, "vffn is inside vrest");
    free_pair(&p);
}

Test(spec_trace, level0_reads_no_clock) {
    pair p;
    derived_pair(2, 0.3f, &p);
    int prompt[N_PROMPT], out[8];
    random_tokens(11, p.target.cfg.vocab_size, N_PROMPT, prompt);
    trace_burst tb;
    trace_burst_begin(&tb, 0, 4, NULL, NULL);
    sd_accept_stats stats = {0};
    spec(&p, 4, prompt, N_PROMPT, 8, 0.0f, 0, out, &stats, &tb);
    for (int i = 0; i < TRACE_N_PHASES; i++) cr_assert_eq(tb.phase_ns[i], 0);
    for (int i = 0; i < TRACE_N_BUCKETS; i++) cr_assert_eq(tb.bucket_ns[i], 0);
    free_pair(&p);
}

// ---- generation control (generate.h): stop ids, the stop flag, the per-commit callback ----

typedef struct {
    int tokens[N_NEW];
    int n, calls, stop_after;           // stop_after > 0: set *stop at that call
    volatile sig_atomic_t *stop;
} commits;

static void record_commit(void *ctx, const int *tokens, int n) {
    commits *c = ctx;
    cr_assert_leq(c->n + n, N_NEW, "more tokens committed than asked for");
    memcpy(c->tokens + c->n, tokens, sizeof(int) * (size_t)n);
    c->n += n;
    if (++c->calls == c->stop_after) *c->stop = SIGINT;
}

// The first id of want at index >= 5 that does not occur before it: an EOS the greedy run meets there.
static int eos_at(const int *want, int *at) {
    for (int j = 5; j < N_NEW; j++) {
        bool seen = false;
        for (int i = 0; i < j; i++) seen |= want[i] == want[j];
        if (!seen) { *at = j; return want[j]; }
    }
    cr_assert_fail("no fresh token in the greedy run");
    return -1;
}

Test(spec_control, eos_ends_spec_and_greedy_at_the_same_token) {
    pair p;
    derived_pair(2, 0.3f, &p);
    int prompt[N_PROMPT], want[N_NEW], got[N_NEW], at;
    random_tokens(8, p.target.cfg.vocab_size, N_PROMPT, prompt);
    plain(&p.target, prompt, N_PROMPT, N_NEW, 0.0f, 0, want);
    int eos[2] = {-1, eos_at(want, &at)}; // a list: eos[0] is an id the run never reaches
    for (int id = 0; eos[0] < 0 && id < p.target.cfg.vocab_size; id++) {
        bool seen = false;
        for (int i = 0; i <= at; i++) seen |= want[i] == id;
        if (!seen) eos[0] = id;
    }
    cr_assert_geq(eos[0], 0);

    commits rec = {0};
    sd_gen_control ctl = {.eos = eos, .n_eos = 2, .on_commit = record_commit, .ctx = &rec};
    plain_with(&p.target, prompt, N_PROMPT, N_NEW, 0.0f, 0, &ctl, got);
    cr_expect_eq(ctl.end, SD_GEN_EOS);
    cr_expect_eq(ctl.n_out, at + 1, "plain: %d tokens, the EOS is token %d", ctl.n_out, at);
    cr_expect_eq(rec.n, at + 1);
    cr_expect_eq(rec.calls, at + 1, "plain decode commits one token per step");
    cr_expect_arr_eq(rec.tokens, want, sizeof(int) * (size_t)(at + 1));
    for (int k = 1; k <= 8; k++) {
        sd_accept_stats stats = {0};
        rec = (commits){0};
        spec_with(&p, k, prompt, N_PROMPT, N_NEW, 0.0f, 0, got, &stats, NULL, &ctl);
        cr_expect_eq(ctl.end, SD_GEN_EOS, "k = %d", k);
        cr_expect_eq(ctl.n_out, at + 1, "k = %d: %d tokens, the EOS is token %d", k, ctl.n_out, at);
        cr_expect_arr_eq(got, want, sizeof(int) * (size_t)(at + 1), "k = %d: spec ≡ greedy up to the EOS", k);
        cr_expect_eq(stats.emitted, (uint64_t)(at + 1), "k = %d", k);
        cr_expect_eq(rec.calls, (int)stats.rounds, "k = %d: one callback per round", k);
        cr_expect_arr_eq(rec.tokens, got, sizeof(int) * (size_t)(at + 1), "k = %d: the callback saw every token", k);
    }
    free_pair(&p);
}

Test(spec_control, stop_flag_ends_between_rounds_and_steps) {
    pair p;
    derived_pair(2, 0.3f, &p);
    int prompt[N_PROMPT], want[N_NEW], got[N_NEW];
    random_tokens(8, p.target.cfg.vocab_size, N_PROMPT, prompt);
    plain(&p.target, prompt, N_PROMPT, N_NEW, 0.0f, 0, want);
    volatile sig_atomic_t stop = 0;
    commits rec = {.stop_after = 3, .stop = &stop};
    sd_gen_control ctl = {.stop = &stop, .on_commit = record_commit, .ctx = &rec};
    plain_with(&p.target, prompt, N_PROMPT, N_NEW, 0.0f, 0, &ctl, got);
    cr_expect_eq(ctl.end, SD_GEN_STOPPED);
    cr_expect_eq(ctl.n_out, 3, "the flag set during step 3 ends decode after it");

    stop = 0;
    rec = (commits){.stop_after = 3, .stop = &stop};
    sd_accept_stats stats = {0};
    spec_with(&p, 4, prompt, N_PROMPT, N_NEW, 0.0f, 0, got, &stats, NULL, &ctl);
    cr_expect_eq(ctl.end, SD_GEN_STOPPED);
    cr_expect_eq(stats.rounds, 3, "the flag set in round 3 ends the generation after it");
    cr_expect_eq(ctl.n_out, rec.n);
    cr_expect_eq((uint64_t)ctl.n_out, stats.emitted);
    cr_expect_arr_eq(got, want, sizeof(int) * (size_t)ctl.n_out, "the tokens so far are greedy's");

    stop = SIGINT; // set before the generation: nothing runs
    rec = (commits){0};
    stats = (sd_accept_stats){0};
    spec_with(&p, 4, prompt, N_PROMPT, N_NEW, 0.0f, 0, got, &stats, NULL, &ctl);
    cr_expect_eq(ctl.end, SD_GEN_STOPPED);
    cr_expect_eq(ctl.n_out, 0);
    cr_expect_eq(stats.rounds, 0);
    cr_expect_eq(rec.calls, 0);
    free_pair(&p);
}
