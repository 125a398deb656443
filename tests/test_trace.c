// test_trace.c — trace levels, phase clocks, buckets and the emitted line shapes (trace.h).
#include <stdint.h>
#include <criterion/criterion.h>
#include <criterion/redirect.h>
#include <math.h>
#include <regex.h>
#include <stdlib.h>
#include <string.h>
#include "trace.h"
#include "trace_rounds.h" // spin_us, run_round

#define ALIAS "SPECDEC_KIMI_LINEAR_SPEC_TRACE"

// ---- level resolution (the reference's table, plus the junk values) ----

typedef struct {
    const char *general, *alias;
    int level;
    int warns;
} level_case;

static const level_case level_cases[] = {
    {NULL, NULL, 0, 0},  // off by default
    {"x", NULL, 0, 0},   // junk is off
    {"0", NULL, 0, 0},   // "0" is not a level
    {"", NULL, 0, 0},
    {" 1", NULL, 0, 0},
    {"1 ", NULL, 0, 0},
    {"3", NULL, 0, 0},
    {NULL, "0", 0, 0},
    {NULL, "x", 0, 0},
    {"1", NULL, 1, 0},   // either name alone
    {"2", NULL, 2, 0},
    {NULL, "1", 1, 0},
    {NULL, "2", 2, 0},
    {"1", "1", 1, 0},    // agreement: silent
    {"2", "2", 2, 0},
    {"1", "2", 1, 1},    // disagreement: the general name wins, loudly
    {"2", "1", 2, 1},
    {"x", "1", 1, 0},    // a junk general value never masks a valid alias
    {"0", "2", 2, 0},
    {"", "2", 2, 0},
    {"1", "x", 1, 0},    // a junk alias is simply not set
    {"2", "0", 2, 0},
};

Test(trace_level, resolution_table) {
    for (size_t i = 0; i < sizeof level_cases / sizeof level_cases[0]; i++) {
        const level_case *c = &level_cases[i];
        char warn[256] = "sentinel";
        int got = trace_level_resolve(c->general, c->alias, ALIAS, warn, sizeof warn);
        cr_expect_eq(got, c->level, "row %zu (general=%s alias=%s): level %d, want %d", i,
                     c->general ? c->general : "NULL", c->alias ? c->alias : "NULL", got, c->level);
        cr_expect_eq(warn[0] != 0, c->warns, "row %zu: warning '%s'", i, warn);
    }
}

Test(trace_level, warning_names_both_values) {
    char warn[256];
    trace_level_resolve("2", "1", ALIAS, warn, sizeof warn);
    cr_assert_str_eq(warn, "[spec-trace] SPECDEC_SPEC_TRACE=2 overrides " ALIAS "=1 "
                           "(the general flag wins; unset one to silence this)");
    trace_level_resolve("1", "2", NULL, warn, sizeof warn);
    cr_assert_str_eq(warn, "[spec-trace] SPECDEC_SPEC_TRACE=1 overrides the family alias=2 "
                           "(the general flag wins; unset one to silence this)");
}

Test(trace_level, warn_buffer_optional) {
    cr_assert_eq(trace_level_resolve("2", "1", ALIAS, NULL, 0), 2);
    char tiny[8];
    cr_assert_eq(trace_level_resolve("2", "1", ALIAS, tiny, sizeof tiny), 2);
    cr_assert_eq(strlen(tiny), sizeof tiny - 1);
}

// trace_level reads the environment once per process; Criterion runs each test in its own
// process, so each test starts with a fresh cache.
static void clear_env(void) {
    unsetenv("SPECDEC_SPEC_TRACE");
    unsetenv(ALIAS);
}

Test(trace_level_env, general_wins_with_one_warning, .init = cr_redirect_stderr) {
    clear_env();
    setenv("SPECDEC_SPEC_TRACE", "2", 1);
    setenv(ALIAS, "1", 1);
    cr_assert_eq(trace_level("kimi_linear", -1), 2);
    cr_assert_eq(trace_level("kimi_linear", -1), 2);
    fflush(stderr);
    cr_assert_stderr_eq_str("[spec-trace] SPECDEC_SPEC_TRACE=2 overrides " ALIAS "=1 "
                            "(the general flag wins; unset one to silence this)\n");
}

Test(trace_level_env, alias_alone_is_honoured_silently, .init = cr_redirect_stderr) {
    clear_env();
    setenv(ALIAS, "2", 1);
    cr_assert_eq(trace_level("kimi_linear", -1), 2);
    fflush(stderr);
    cr_assert_stderr_eq_str("");
}

Test(trace_level_env, family_is_upper_cased) {
    clear_env();
    setenv(ALIAS, "1", 1);
    cr_assert_eq(trace_level("kimi-linear", -1), 1);
}

Test(trace_level_env, read_once_per_process) {
    clear_env();
    setenv("SPECDEC_SPEC_TRACE", "1", 1);
    cr_assert_eq(trace_level("kimi_linear", -1), 1);
    setenv("SPECDEC_SPEC_TRACE", "2", 1);
    cr_assert_eq(trace_level("kimi_linear", -1), 1);
}

Test(trace_level_env, off_by_default_and_cli_overrides) {
    clear_env();
    cr_assert_eq(trace_level("kimi_linear", 2), 2);
    cr_assert_eq(trace_level("kimi_linear", -1), 0);
    setenv("SPECDEC_SPEC_TRACE", "2", 1); // too late for the cache, and the CLI wins anyway
    cr_assert_eq(trace_level("kimi_linear", 1), 1);
    cr_assert_eq(trace_level("kimi_linear", 0), 0);
    cr_assert_eq(trace_level(NULL, -1), 0);
}

// ---- bursts with hand-set clocks ----

static trace_burst hand_burst(int level) {
    trace_burst b;
    memset(&b, 0, sizeof b);
    b.level = level;
    b.k = 4;
    b.acc.rounds = 10;
    const uint64_t ph[TRACE_N_PHASES] = {12345678, 45678901, 1234567, 2345678, 3456789};
    memcpy(b.phase_ns, ph, sizeof ph);
    b.bucket_ns[TRACE_BUCKET_VKDA] = 20000000;
    b.bucket_ns[TRACE_BUCKET_SCAN] = 5000000;
    b.bucket_ns[TRACE_BUCKET_VMLA] = 10000000;
    b.bucket_ns[TRACE_BUCKET_VFFN] = 8000000;
    return b;
}

#define NUM2 "[0-9]+\\.[0-9]{2}"
#define NUM3 "[0-9]+\\.[0-9]{3}"
static const char *const phase_re =
    "^\\[spec-phase\\] rounds=[0-9]+ k=[0-9]+ total=" NUM2 "ms \\| draft=" NUM2 " verify=" NUM2
    " accept=" NUM2 " roll=" NUM2 " maint=" NUM2 " \\| per-round ms: draft=" NUM3 " verify=" NUM3
    " accept=" NUM3 " roll=" NUM3 " maint=" NUM3 " total=" NUM3 "$";
static const char *const v_re =
    "^\\[spec-phase-v\\] rounds=[0-9]+ k=[0-9]+ \\| per-round ms: vkda=" NUM3 " \\(scan=" NUM3
    "\\) vmla=" NUM3 " vrest=" NUM3 " \\(vffn=" NUM3 "\\)$";

// Splits buf into at most `max` lines (in place); returns the count.
static int split_lines(char *buf, char **lines, int max) {
    int n = 0;
    for (char *s = buf; *s && n < max;) {
        char *nl = strchr(s, '\n');
        cr_assert_not_null(nl, "every emitted line ends with a newline");
        *nl = 0;
        lines[n++] = s;
        s = nl + 1;
    }
    return n;
}

static int matches(const char *re, const char *s) {
    regex_t r;
    cr_assert_eq(regcomp(&r, re, REG_EXTENDED | REG_NOSUB), 0, "regex compiles");
    int ok = regexec(&r, s, 0, NULL, 0) == 0;
    regfree(&r);
    return ok;
}

Test(trace_lines, shapes_match_the_contract) {
    trace_burst b = hand_burst(2);
    char buf[1024], *lines[4];
    size_t len = trace_burst_format(&b, NULL, buf, sizeof buf);
    cr_assert_eq(len, strlen(buf));
    cr_assert_eq(split_lines(buf, lines, 4), 2);
    cr_expect(matches(phase_re, lines[0]), "phase line: %s", lines[0]);
    cr_expect(matches(v_re, lines[1]), "-v line: %s", lines[1]);
}

Test(trace_lines, exact_text) {
    trace_burst b = hand_burst(2);
    char buf[1024];
    trace_burst_format(&b, "spec", buf, sizeof buf);
    cr_assert_str_eq(buf,
        "[spec-phase] rounds=10 k=4 total=65.06ms | draft=12.35 verify=45.68 accept=1.23 "
        "roll=2.35 maint=3.46 | per-round ms: draft=1.235 verify=4.568 accept=0.123 roll=0.235 "
        "maint=0.346 total=6.506\n"
        "[spec-phase-v] rounds=10 k=4 | per-round ms: vkda=2.000 (scan=0.500) vmla=1.000 "
        "vrest=1.568 (vffn=0.800)\n");
}

typedef struct {
    double total, ph[TRACE_N_PHASES], pr[TRACE_N_PHASES], pr_total;
    double vkda, scan, vmla, vrest, vffn;
    int has_v;
} parsed;

static parsed parse_lines(const char *text) {
    parsed p;
    memset(&p, 0, sizeof p);
    const char *l1 = strstr(text, "] rounds=");
    cr_assert_not_null(l1);
    int got = sscanf(l1, "] rounds=%*u k=%*d total=%lfms | draft=%lf verify=%lf accept=%lf roll=%lf "
                         "maint=%lf | per-round ms: draft=%lf verify=%lf accept=%lf roll=%lf "
                         "maint=%lf total=%lf",
                     &p.total, &p.ph[0], &p.ph[1], &p.ph[2], &p.ph[3], &p.ph[4], &p.pr[0], &p.pr[1],
                     &p.pr[2], &p.pr[3], &p.pr[4], &p.pr_total);
    cr_assert_eq(got, 12, "phase line parses: %s", text);
    const char *l2 = strstr(text, "-phase-v] rounds=");
    if (l2) {
        got = sscanf(l2, "-phase-v] rounds=%*u k=%*d | per-round ms: vkda=%lf (scan=%lf) vmla=%lf "
                         "vrest=%lf (vffn=%lf)",
                     &p.vkda, &p.scan, &p.vmla, &p.vrest, &p.vffn);
        cr_assert_eq(got, 5, "-v line parses: %s", l2);
        p.has_v = 1;
    }
    return p;
}

// Each printed value is rounded by at most half its last digit: 5 phases + the total.
static void expect_sums(const parsed *p) {
    double s = 0, spr = 0;
    for (int i = 0; i < TRACE_N_PHASES; i++) { s += p->ph[i]; spr += p->pr[i]; }
    cr_expect_leq(fabs(s - p->total), 6 * 0.005 + 1e-9, "phases %.2f vs total %.2f", s, p->total);
    cr_expect_leq(fabs(spr - p->pr_total), 6 * 0.0005 + 1e-9, "per-round %.3f vs %.3f", spr, p->pr_total);
}

Test(trace_lines, phases_sum_to_total) {
    trace_burst b = hand_burst(1);
    char buf[1024];
    trace_burst_format(&b, "spec", buf, sizeof buf);
    parsed p = parse_lines(buf);
    expect_sums(&p);
}

Test(trace_lines, vrest_clamped_when_buckets_exceed_verify) {
    trace_burst b = hand_burst(2);
    b.bucket_ns[TRACE_BUCKET_VKDA] = 40000000;
    b.bucket_ns[TRACE_BUCKET_VMLA] = 10000000; // 50 ms of buckets in 45.68 ms of verify
    char buf[1024];
    trace_burst_format(&b, "spec", buf, sizeof buf);
    parsed p = parse_lines(buf);
    cr_assert(p.has_v);
    cr_expect_eq(p.vrest, 0.0, "vrest %.3f", p.vrest);
    cr_expect(strstr(buf, "vrest=0.000 ") != NULL, "%s", buf);
}

static int sync_calls;
static void count_sync(void *ctx) { (void)ctx; sync_calls++; }

Test(trace_lines, realistic_burst_invariants) {
    trace_burst b;
    trace_burst_begin(&b, 2, 4, count_sync, NULL);
    for (int r = 0; r < 5; r++) run_round(&b, 2);
    char buf[1024];
    trace_burst_format(&b, "spec", buf, sizeof buf);
    parsed p = parse_lines(buf);
    cr_assert(p.has_v, "%s", buf);
    expect_sums(&p);
    cr_expect_geq(p.vrest, 0.0);
    cr_expect_leq(p.scan, p.vkda, "%s", buf);
    cr_expect_leq(p.vffn, p.vrest, "%s", buf);
    cr_expect_gt(p.scan, 0.0, "%s", buf);
    cr_expect_gt(p.pr[TRACE_PHASE_VERIFY], p.pr[TRACE_PHASE_ACCEPT], "%s", buf);
}

Test(trace_lines, nothing_at_level_0_or_without_rounds) {
    trace_burst b = hand_burst(0);
    char buf[64] = "sentinel";
    cr_expect_eq(trace_burst_format(&b, "spec", buf, sizeof buf), 0);
    cr_expect_str_eq(buf, "");
    b = hand_burst(2);
    b.acc.rounds = 0;
    cr_expect_eq(trace_burst_format(&b, "spec", buf, sizeof buf), 0);

    FILE *f = tmpfile();
    cr_assert_not_null(f);
    b = hand_burst(0);
    trace_burst_emit(&b, "spec", f);
    b = hand_burst(1);
    b.acc.rounds = 0;
    trace_burst_emit(&b, "spec", f);
    cr_expect_eq(ftell(f), 0, "nothing written");
    fclose(f);
}

Test(trace_lines, level_1_has_no_v_line) {
    trace_burst b = hand_burst(1);
    char buf[1024], *lines[4];
    trace_burst_format(&b, "spec", buf, sizeof buf);
    cr_expect_null(strstr(buf, "-phase-v]"));
    cr_expect_eq(split_lines(buf, lines, 4), 1);
}

Test(trace_lines, emit_writes_what_format_makes) {
    trace_burst b = hand_burst(2);
    char want[1024], got[1024] = {0};
    trace_burst_format(&b, "glm5", want, sizeof want);
    FILE *f = tmpfile();
    cr_assert_not_null(f);
    trace_burst_emit(&b, "glm5", f);
    rewind(f);
    size_t n = fread(got, 1, sizeof got - 1, f);
    fclose(f);
    cr_expect_eq(n, strlen(want));
    cr_expect_str_eq(got, want);
}

Test(trace_lines, tag_is_used) {
    trace_burst b = hand_burst(2);
    char buf[1024], *lines[4];
    trace_burst_format(&b, "glm5", buf, sizeof buf);
    cr_assert_eq(split_lines(buf, lines, 4), 2);
    cr_expect_eq(strncmp(lines[0], "[glm5-phase] rounds=", 20), 0, "%s", lines[0]);
    cr_expect_eq(strncmp(lines[1], "[glm5-phase-v] rounds=", 22), 0, "%s", lines[1]);
}

Test(trace_lines, small_buffer_is_cut_not_overrun) {
    trace_burst b = hand_burst(2);
    char buf[40];
    buf[sizeof buf - 1] = 'x';
    size_t n = trace_burst_format(&b, "spec", buf, sizeof buf - 1); // last byte: a guard
    cr_expect_eq(n, sizeof buf - 2);
    cr_expect_eq(strlen(buf), n);
    cr_expect_eq(buf[sizeof buf - 1], 'x');
}

// ---- clocks ----

Test(trace_clock, level_0_leaves_everything_zero_and_never_syncs) {
    trace_burst b;
    sync_calls = 0;
    trace_burst_begin(&b, 0, 4, count_sync, NULL);
    for (int p = 0; p < TRACE_N_PHASES; p++) trace_phase_end(&b, (trace_phase)p);
    uint64_t t = trace_bucket_start(&b);
    trace_bucket_stop(&b, TRACE_BUCKET_VKDA, t);
    cr_expect_eq(t, 0);
    cr_expect_eq(b.t_mark, 0);
    for (int p = 0; p < TRACE_N_PHASES; p++) cr_expect_eq(b.phase_ns[p], 0);
    for (int k = 0; k < TRACE_N_BUCKETS; k++) cr_expect_eq(b.bucket_ns[k], 0);
    cr_expect_eq(sync_calls, 0);
}

typedef struct { int level, want_syncs; } sync_case;

Test(trace_clock, sync_at_each_boundary) {
    // begin + 5 phase ends, + 2 per bucket at level 2 (one bucket below)
    const sync_case cases[] = {{0, 0}, {1, 6}, {2, 8}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int ctx_calls = 0;
        trace_burst b;
        sync_calls = 0;
        trace_burst_begin(&b, cases[i].level, 4, count_sync, &ctx_calls);
        trace_phase_end(&b, TRACE_PHASE_DRAFT);
        uint64_t t = trace_bucket_start(&b);
        trace_bucket_stop(&b, TRACE_BUCKET_VMLA, t);
        trace_phase_end(&b, TRACE_PHASE_VERIFY);
        trace_phase_end(&b, TRACE_PHASE_ACCEPT);
        trace_phase_end(&b, TRACE_PHASE_ROLL);
        trace_phase_end(&b, TRACE_PHASE_MAINT);
        cr_expect_eq(sync_calls, cases[i].want_syncs, "level %d: %d syncs, want %d",
                     cases[i].level, sync_calls, cases[i].want_syncs);
    }
}

static void check_ctx(void *ctx) { (*(int *)ctx)++; }

Test(trace_clock, sync_gets_its_context_and_null_sync_is_fine) {
    int calls = 0;
    trace_burst b;
    trace_burst_begin(&b, 1, 2, check_ctx, &calls);
    trace_phase_end(&b, TRACE_PHASE_DRAFT);
    cr_expect_eq(calls, 2);
    trace_burst_begin(&b, 2, 2, NULL, NULL);
    uint64_t t = trace_bucket_start(&b);
    trace_bucket_stop(&b, TRACE_BUCKET_VKDA, t);
    trace_phase_end(&b, TRACE_PHASE_VERIFY);
    cr_expect_eq(b.k, 2);
    cr_expect_eq(b.acc.rounds, 0);
}

Test(trace_clock, phases_accumulate_elapsed_time) {
    trace_burst b;
    trace_burst_begin(&b, 1, 4, NULL, NULL);
    spin_us(2000);
    trace_phase_end(&b, TRACE_PHASE_VERIFY);
    spin_us(2000);
    trace_phase_end(&b, TRACE_PHASE_VERIFY);
    cr_expect_geq(b.phase_ns[TRACE_PHASE_VERIFY], 4000000);
    cr_expect_eq(b.phase_ns[TRACE_PHASE_DRAFT], 0);
    cr_expect_eq(b.bucket_ns[TRACE_BUCKET_VKDA], 0, "buckets are level 2 only");
}

// What runs before a round (a prefill, a capture, the loop between rounds) is no phase's.
Test(trace_clock, time_before_a_round_is_no_phases) {
    trace_burst b;
    int calls = 0;
    trace_burst_begin(&b, 1, 4, check_ctx, &calls);
    spin_us(20000); // the prefill
    trace_round_begin(&b);
    spin_us(1000);
    trace_phase_end(&b, TRACE_PHASE_DRAFT);
    cr_expect_lt(b.phase_ns[TRACE_PHASE_DRAFT], 15000000, "draft charged %llu ns: the time before the round leaked in",
                 (unsigned long long)b.phase_ns[TRACE_PHASE_DRAFT]);
    cr_expect_geq(b.phase_ns[TRACE_PHASE_DRAFT], 1000000);
    cr_expect_eq(calls, 3, "begin, the round's mark and the phase end each drain the backend");
    trace_burst_begin(&b, 0, 4, check_ctx, &calls);
    trace_round_begin(&b);
    cr_expect_eq(calls, 3, "level 0 never drains");
}

Test(trace_clock, begin_drains_a_previous_burst) {
    trace_burst b = hand_burst(2);
    trace_burst_begin(&b, 1, 3, NULL, NULL);
    cr_expect_eq(b.acc.rounds, 0);
    cr_expect_eq(b.phase_ns[TRACE_PHASE_VERIFY], 0);
    cr_expect_eq(b.bucket_ns[TRACE_BUCKET_VKDA], 0);
    cr_expect_eq(b.acc.drafted, 0);
    cr_expect_neq(b.t_mark, 0);
}

// ---- event mode: buckets timed by backend events, summed once after the burst ----

static int fake_events_recorded, fake_pool_size;
static void *fake_record(void *ctx) {
    (void)ctx;
    if (fake_events_recorded == fake_pool_size) return NULL;
    return (void *)(uintptr_t)(++fake_events_recorded); // handle i = the i-th event (never 0)
}
// Each pair (a, b) "took" (b - a) ms.
static double fake_elapsed(void *ctx, void *a, void *b) {
    (void)ctx;
    return (double)((uintptr_t)b - (uintptr_t)a);
}
static void fake_release(void *ctx) { (void)ctx; fake_events_recorded = 0; }

Test(trace_events, buckets_sum_event_pairs_without_draining) {
    trace_events ev = {.record = fake_record, .elapsed_ms = fake_elapsed, .release_all = fake_release};
    fake_events_recorded = 0;
    fake_pool_size = 100;
    trace_burst b;
    sync_calls = 0;
    trace_burst_begin(&b, 2, 4, count_sync, NULL);
    trace_burst_use_events(&b, &ev);
    int after_begin = sync_calls;
    uint64_t t = trace_bucket_start(&b);              // event 1
    trace_bucket_stop(&b, TRACE_BUCKET_VKDA, t);      // event 2: 1 ms
    t = trace_bucket_start(&b);                       // event 3
    uint64_t s = trace_bucket_start(&b);              // event 4 (nested scan)
    trace_bucket_stop(&b, TRACE_BUCKET_SCAN, s);      // event 5: 1 ms
    trace_bucket_stop(&b, TRACE_BUCKET_VKDA, t);      // event 6: 3 ms
    cr_assert_eq(sync_calls, after_begin, "event mode must not drain inside the walk");
    cr_assert_eq(b.bucket_ns[TRACE_BUCKET_VKDA], 0, "nothing is summed before collect");
    trace_burst_collect(&b);
    cr_assert_eq(sync_calls, after_begin + 1, "collect drains once");
    cr_assert_eq(b.bucket_ns[TRACE_BUCKET_VKDA], 4000000);
    cr_assert_eq(b.bucket_ns[TRACE_BUCKET_SCAN], 1000000);
    cr_assert_eq(fake_events_recorded, 0, "collect releases the events");
}

Test(trace_events, an_exhausted_pool_loses_pairs_visibly) {
    trace_events ev = {.record = fake_record, .elapsed_ms = fake_elapsed, .release_all = fake_release};
    fake_events_recorded = 0;
    fake_pool_size = 3;
    trace_burst b;
    trace_burst_begin(&b, 2, 4, NULL, NULL);
    trace_burst_use_events(&b, &ev);
    for (int i = 0; i < 3; i++) {
        uint64_t t = trace_bucket_start(&b);
        trace_bucket_stop(&b, TRACE_BUCKET_VMLA, t);
    }
    cr_assert_eq(b.n_pairs, 1);
    cr_assert_eq(b.pairs_lost, 2);
    trace_burst_collect(&b);
    cr_assert_eq(b.bucket_ns[TRACE_BUCKET_VMLA], 1000000);
}

Test(trace_events, level_1_records_nothing) {
    trace_events ev = {.record = fake_record, .elapsed_ms = fake_elapsed, .release_all = fake_release};
    fake_events_recorded = 0;
    fake_pool_size = 10;
    trace_burst b;
    trace_burst_begin(&b, 1, 4, NULL, NULL);
    trace_burst_use_events(&b, &ev);
    uint64_t t = trace_bucket_start(&b);
    trace_bucket_stop(&b, TRACE_BUCKET_VKDA, t);
    cr_assert_eq(fake_events_recorded, 0);
    cr_assert_eq(b.n_pairs, 0);
}
