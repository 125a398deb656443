// test_receipt.c — receipts: writer, trace-log parser, loader and compare (receipt.h).
#include <criterion/criterion.h>
#include <cjson/cJSON.h>
#include <dirent.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "receipt.h"

// ---- fixtures ----

static char dir[64];

static void make_dir(void) {
    strcpy(dir, "/tmp/test_receipt.XXXXXX");
    cr_assert_not_null(mkdtemp(dir));
}

static void remove_dir(void) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    char p[512];
    while ((e = readdir(d)))
        if (e->d_name[0] != '.') { snprintf(p, sizeof p, "%s/%s", dir, e->d_name); unlink(p); }
    closedir(d);
    rmdir(dir);
}

static const char *in_dir(const char *name) {
    static char p[4][512];
    static int next;
    char *s = p[next++ % 4];
    snprintf(s, 512, "%s/%s", dir, name);
    return s;
}

static void write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f);
    fputs(text, f);
    fclose(f);
}

static int count_tmp_files(void) {
    DIR *d = opendir(dir);
    cr_assert_not_null(d);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d))) n += strstr(e->d_name, ".tmp.") != NULL;
    closedir(d);
    return n;
}

// A burst with hand-set clocks; `i` varies it.
static trace_burst make_burst(int level, int i) {
    trace_burst b;
    memset(&b, 0, sizeof b);
    b.level = level;
    b.k = 4;
    const uint64_t ph[TRACE_N_PHASES] = {12345678, 45678901, 1234567, 2345678, 3456789};
    for (int p = 0; p < TRACE_N_PHASES; p++) b.phase_ns[p] = ph[p] + (uint64_t)i * 777777 * (uint64_t)(p + 1);
    b.bucket_ns[TRACE_BUCKET_VKDA] = 20000000 + (uint64_t)i * 1111111;
    b.bucket_ns[TRACE_BUCKET_SCAN] = 5000000;
    b.bucket_ns[TRACE_BUCKET_VMLA] = 10000000;
    b.bucket_ns[TRACE_BUCKET_VFFN] = 8000000 + (uint64_t)i * 333333;
    for (int r = 0; r < 10 + i; r++) sd_stats_add_round(&b.acc, 4, (r + i) % 5, (r + i) % 5 + 1);
    return b;
}

static const receipt_env test_env = {
    .version = "0.1.0", .commit = "abc123", .config_sha256 = "c0ffee", .weights_sha256 = NULL,
    .draft_sha256 = NULL, .backend = "cpu", .device = "test", .driver = NULL, .tag = "spec",
    .flags = "SPECDEC_SPEC_TRACE=2", .k = 4, .seed = UINT64_MAX, .temperature = 0.0, .trace_level = 2};

// Writes a receipt of n bursts at `level` and the same bursts' trace lines to log (if non-NULL).
static void write_run(const char *path, int n, int level, char *log, size_t log_len) {
    receipt_writer w;
    sd_status st = {0};
    cr_assert_eq(receipt_open(&w, path, &test_env, &st), SD_OK, "%s", st.msg);
    size_t used = 0;
    for (int i = 0; i < n; i++) {
        trace_burst b = make_burst(level, i);
        cr_assert_eq(receipt_add_burst(&w, &b, "spec", &st), SD_OK, "%s", st.msg);
        if (log) {
            used += (size_t)snprintf(log + used, log_len - used, "generating burst %d...\n", i);
            used += trace_burst_format(&b, "spec", log + used, log_len - used);
        }
    }
    receipt_close(&w);
}

// receipt_compare with the table printed to out (NULL: not printed) and the rows beyond
// tolerance counted into *n_over.
static sd_code compare(const receipt_set *a, const receipt_set *b, const char *tag, double tol, FILE *out,
                       int *n_over, sd_status *st) {
    receipt_comparison c;
    sd_code rc = receipt_compare(a, b, tag, tol, &c, st);
    if (!rc) receipt_comparison_print(&c, out);
    *n_over = rc ? 0 : c.n_over;
    return rc;
}

static void expect_same_numbers(const receipt_burst *a, const receipt_burst *b) {
    cr_expect_str_eq(a->tag, b->tag);
    cr_expect_eq(a->rounds, b->rounds);
    cr_expect_eq(a->k, b->k);
    cr_expect_eq(a->total_ms, b->total_ms);
    cr_expect_eq(a->per_round_total_ms, b->per_round_total_ms);
    for (int p = 0; p < TRACE_N_PHASES; p++) {
        cr_expect_eq(a->phase_ms[p], b->phase_ms[p], "phase %d: %.17g vs %.17g", p, a->phase_ms[p], b->phase_ms[p]);
        cr_expect_eq(a->per_round_ms[p], b->per_round_ms[p], "phase %d per round", p);
    }
    cr_expect_eq(a->has_v, b->has_v);
    for (int k = 0; k < TRACE_N_BUCKETS; k++) cr_expect_eq(a->v_ms[k], b->v_ms[k], "bucket %d", k);
    cr_expect_eq(a->vrest_ms, b->vrest_ms);
}

// ---- emit -> parse -> compare ----

Test(receipt, log_and_receipt_agree_exactly, .init = make_dir, .fini = remove_dir) {
    char log[8192];
    const char *path = in_dir("run.jsonl");
    write_run(path, 3, 2, log, sizeof log);

    sd_status st = {0};
    receipt_set from_log = {0}, from_receipt = {0};
    cr_assert_eq(receipt_parse_text(log, "log", &from_log, &st), SD_OK, "%s", st.msg);
    cr_assert_eq(receipt_load(path, &from_receipt, &st), SD_OK, "%s", st.msg);
    cr_assert_eq(from_log.n, 3);
    cr_assert_eq(from_receipt.n, 3);
    cr_assert_not_null(from_receipt.env_json);
    cr_expect_null(from_log.env_json);
    for (size_t i = 0; i < 3; i++) {
        expect_same_numbers(&from_log.bursts[i], &from_receipt.bursts[i]);
        cr_expect(from_log.bursts[i].has_v);
        cr_expect_eq(from_log.bursts[i].drafted, -1, "a log has no counts");
        trace_burst b = make_burst(2, (int)i);
        cr_expect_eq(from_receipt.bursts[i].drafted, (int64_t)b.acc.drafted);
        cr_expect_eq(from_receipt.bursts[i].accepted, (int64_t)b.acc.accepted);
        cr_expect_eq(from_receipt.bursts[i].emitted, (int64_t)b.acc.emitted);
    }

    int n_over = -1;
    char table[4096] = {0};
    FILE *out = fmemopen(table, sizeof table - 1, "w");
    cr_assert_eq(compare(&from_log, &from_receipt, NULL, 0.0, out, &n_over, &st), SD_OK, "%s", st.msg);
    fclose(out);
    cr_expect_eq(n_over, 0, "%s", table);
    cr_expect_not_null(strstr(table, "diff(pp)"), "%s", table);
    cr_expect_not_null(strstr(table, "vrest"), "level-2 rows are compared: %s", table);
    cr_expect_not_null(strstr(table, "all rows within tolerance"), "%s", table);
    receipt_set_free(&from_log);
    receipt_set_free(&from_receipt);
}

Test(receipt, parse_output_round_trips_through_jsonl, .init = make_dir, .fini = remove_dir) {
    char log[8192];
    write_run(in_dir("run.jsonl"), 2, 1, log, sizeof log);
    const char *log_path = in_dir("run.log"), *jsonl_path = in_dir("parsed.jsonl");
    write_text(log_path, log);

    sd_status st = {0};
    receipt_set a = {0}, b = {0};
    cr_assert_eq(receipt_read_any(log_path, &a, &st), SD_OK, "%s", st.msg);
    FILE *f = fopen(jsonl_path, "w");
    cr_assert_eq(receipt_write_jsonl(&a, f, &st), SD_OK, "%s", st.msg);
    fclose(f);
    cr_assert_eq(receipt_read_any(jsonl_path, &b, &st), SD_OK, "%s", st.msg);
    cr_assert_eq(b.n, 2);
    for (size_t i = 0; i < 2; i++) {
        expect_same_numbers(&a.bursts[i], &b.bursts[i]);
        cr_expect_eq(b.bursts[i].emitted, -1, "unknown counts stay unknown");
        cr_expect_not(b.bursts[i].has_v, "level 1");
    }
    receipt_set_free(&a);
    receipt_set_free(&b);
}

Test(receipt, doctored_receipt_fails_compare, .init = make_dir, .fini = remove_dir) {
    const char *good = in_dir("good.jsonl"), *bad = in_dir("doctored.jsonl");
    write_run(good, 3, 2, NULL, 0);
    sd_status st = {0};
    receipt_set a = {0}, b = {0};
    cr_assert_eq(receipt_load(good, &b, &st), SD_OK, "%s", st.msg);
    b.bursts[1].phase_ms[TRACE_PHASE_DRAFT] += 10.0; // one phase of one burst changed
    FILE *f = fopen(bad, "w");
    cr_assert_eq(receipt_write_jsonl(&b, f, &st), SD_OK, "%s", st.msg);
    fclose(f);
    receipt_set_free(&b);

    cr_assert_eq(receipt_read_any(good, &a, &st), SD_OK, "%s", st.msg);
    cr_assert_eq(receipt_read_any(bad, &b, &st), SD_OK, "%s", st.msg);
    int n_over = -1;
    char table[4096] = {0};
    FILE *out = fmemopen(table, sizeof table - 1, "w");
    cr_assert_eq(compare(&a, &b, NULL, 0.5, out, &n_over, &st), SD_OK, "%s", st.msg);
    fclose(out);
    cr_expect_gt(n_over, 0, "%s", table);
    cr_expect_not_null(strstr(table, "beyond tolerance"), "%s", table);
    cr_expect_not_null(strstr(strstr(table, "\ndraft"), "beyond tolerance"), "the draft row is flagged: %s", table);

    cr_assert_eq(compare(&a, &b, NULL, 100.0, NULL, &n_over, &st), SD_OK, "%s", st.msg);
    cr_expect_eq(n_over, 0);
    receipt_set_free(&a);
    receipt_set_free(&b);
}

// ---- the parser ----

#define PHASE(tag, r) "[" tag "-phase] rounds=" #r " k=4 total=10.00ms | draft=1.00 verify=6.00 accept=1.00 " \
    "roll=1.00 maint=1.00 | per-round ms: draft=0.100 verify=0.600 accept=0.100 roll=0.100 maint=0.100 total=1.000"
#define VLINE(tag, r) "[" tag "-phase-v] rounds=" #r " k=4 | per-round ms: vkda=0.300 (scan=0.100) vmla=0.100 " \
    "vrest=0.200 (vffn=0.150)"

Test(receipt_parse, any_tag_junk_ignored_v_paired) {
    const char *text =
        "starting run\n"
        PHASE("spec", 10) "\n"
        "a line that mentions [spec-phase] lines in prose\n"
        "INFO 12:00:01 " PHASE("glm5", 20) "\r\n"
        "\n"
        "INFO 12:00:01 " VLINE("glm5", 20) "\n"
        PHASE("a", 30) "\n"
        PHASE("b", 40) "\n"
        VLINE("a", 30) "\n"
        VLINE("b", 40) "\n"
        "done [x] rounds=3";
    receipt_set s = {0};
    sd_status st = {0};
    cr_assert_eq(receipt_parse_text(text, "t", &s, &st), SD_OK, "%s", st.msg);
    cr_assert_eq(s.n, 4);
    const char *tags[] = {"spec", "glm5", "a", "b"};
    const int has_v[] = {0, 1, 1, 1};
    const uint64_t rounds[] = {10, 20, 30, 40};
    for (size_t i = 0; i < 4; i++) {
        cr_expect_str_eq(s.bursts[i].tag, tags[i]);
        cr_expect_eq(s.bursts[i].has_v, has_v[i], "burst %zu", i);
        cr_expect_eq(s.bursts[i].rounds, rounds[i]);
        cr_expect_eq(s.bursts[i].k, 4);
        cr_expect_eq(s.bursts[i].accepted, -1);
    }
    cr_expect_eq(s.bursts[1].phase_ms[TRACE_PHASE_VERIFY], 6.0);
    cr_expect_eq(s.bursts[1].per_round_total_ms, 1.0);
    cr_expect_eq(s.bursts[1].v_ms[TRACE_BUCKET_VKDA], 0.3);
    cr_expect_eq(s.bursts[1].v_ms[TRACE_BUCKET_SCAN], 0.1);
    cr_expect_eq(s.bursts[1].v_ms[TRACE_BUCKET_VFFN], 0.15);
    cr_expect_eq(s.bursts[1].vrest_ms, 0.2);
    receipt_set_free(&s);
}

typedef struct {
    const char *text;
    const char *want_in_msg;
} bad_text_case;

Test(receipt_parse, bad_trace_lines_are_clear_errors) {
    const bad_text_case cases[] = {
        {"junk\n" VLINE("spec", 10) "\n", "t:2: [spec-phase-v] line without its [spec-phase] line"},
        {PHASE("spec", 10) "\n" VLINE("spec", 10) "\n" VLINE("spec", 10) "\n", "t:3:"},
        {PHASE("spec", 10) "\n" VLINE("spec", 11) "\n", "t:2:"},
        {"[spec-phase] rounds=10 k=4 total=10.00ms | draft=1.00 verify=6.0\n", "t:1: malformed [spec-phase] line"},
        {PHASE("spec", 10) " trailing\n", "t:1: malformed"},
        {"[spec-phase-v] rounds=10 k=4 | per-round ms: vkda=0.300\n", "t:1: malformed [spec-phase-v] line"},
        {"no bracket spec-phase] rounds=1\n", "t:1: bad TAG"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        receipt_set s = {0};
        sd_status st = {0};
        cr_expect_eq(receipt_parse_text(cases[i].text, "t", &s, &st), SD_ERR_DATA, "case %zu", i);
        cr_expect_not_null(strstr(st.msg, cases[i].want_in_msg), "case %zu: '%s'", i, st.msg);
        receipt_set_free(&s);
    }
}

// ---- the writer ----

Test(receipt_writer, atomic_and_valid_after_each_burst, .init = make_dir, .fini = remove_dir) {
    const char *path = in_dir("r.jsonl");
    receipt_writer w;
    sd_status st = {0};
    cr_assert_eq(receipt_open(&w, path, &test_env, &st), SD_OK, "%s", st.msg);
    for (int i = 0; i <= 3; i++) {
        receipt_set s = {0};
        cr_assert_eq(receipt_load(path, &s, &st), SD_OK, "after %d bursts: %s", i, st.msg);
        cr_expect_eq(s.n, (size_t)i);
        cr_expect_not_null(s.env_json);
        cr_expect_eq(count_tmp_files(), 0, "no temp file left after %d bursts", i);
        receipt_set_free(&s);
        if (i < 3) {
            trace_burst b = make_burst(1 + i % 2, i);
            cr_assert_eq(receipt_add_burst(&w, &b, "spec", &st), SD_OK, "%s", st.msg);
        }
    }
    trace_burst empty = make_burst(1, 0);
    empty.acc.rounds = 0;
    cr_expect_eq(receipt_add_burst(&w, &empty, "spec", &st), SD_OK, "a burst of 0 rounds is skipped");
    trace_burst off = make_burst(0, 0);
    cr_expect_eq(receipt_add_burst(&w, &off, "spec", &st), SD_ERR_USAGE);
    cr_expect_not_null(strstr(st.msg, "level"), "%s", st.msg);
    trace_burst b = make_burst(1, 0);
    cr_expect_eq(receipt_add_burst(&w, &b, "bad tag", &st), SD_ERR_USAGE);
    receipt_close(&w);

    receipt_set s = {0};
    cr_assert_eq(receipt_load(path, &s, &st), SD_OK, "%s", st.msg);
    cr_expect_eq(s.n, 3);
    receipt_set_free(&s);
}

Test(receipt_writer, env_line_fields, .init = make_dir, .fini = remove_dir) {
    const char *path = in_dir("env.jsonl");
    write_run(path, 0, 1, NULL, 0);
    FILE *f = fopen(path, "r");
    char line[2048] = {0};
    cr_assert_not_null(fgets(line, sizeof line, f));
    cr_expect_null(fgets(line + 1024, 1024, f), "only the env line");
    fclose(f);
    const char *want[] = {"{\"kind\":\"env\",", "\"version\":\"0.1.0\"", "\"commit\":\"abc123\"",
                          "\"weights_sha256\":null", "\"backend\":\"cpu\"", "\"k\":4",
                          "\"seed\":18446744073709551615", "\"temperature\":0", "\"trace_level\":2",
                          "\"flags\":\"SPECDEC_SPEC_TRACE=2\""};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        cr_expect_not_null(strstr(line, want[i]), "'%s' in %s", want[i], line);
}

Test(receipt_writer, unwritable_path_is_a_clear_error) {
    receipt_writer w;
    sd_status st = {0};
    cr_expect_eq(receipt_open(&w, "/nonexistent-dir/r.jsonl", &test_env, &st), SD_ERR_SYS);
    cr_expect_not_null(strstr(st.msg, "/nonexistent-dir/r.jsonl"), "%s", st.msg);
    receipt_close(&w);
}

// ---- loading and comparing bad inputs ----

typedef struct {
    const char *text;
    sd_code code;
    const char *want_in_msg;
} bad_file_case;

Test(receipt_load, bad_files_are_clear_errors, .init = make_dir, .fini = remove_dir) {
    const bad_file_case cases[] = {
        {"{\"kind\":\"env\"}\n{not json\n", SD_ERR_DATA, ":2: not a JSON object"},
        {"{\"kind\":\"env\"}\n{\"kind\":\"env\"}\n", SD_ERR_DATA, ":2: a second env line"},
        {"{\"rounds\":3}\n", SD_ERR_DATA, ":1: no \"kind\""},
        {"{\"kind\":\"summary\"}\n", SD_ERR_DATA, "unknown kind \"summary\""},
        {"{\"kind\":\"burst\",\"tag\":\"spec\",\"rounds\":3,\"k\":4}\n", SD_ERR_DATA, "\"total_ms\""},
        {"{\"kind\":\"burst\",\"tag\":\"spec\",\"rounds\":0,\"k\":4}\n", SD_ERR_DATA, "\"rounds\""},
        {"{\"kind\":\"env\"}\n\n{\"kind\":\"burst\",\"tag\":\"spec\",\"rounds\":1,\"k\":4,\"total_ms\":1,"
         "\"draft_ms\":1,\"verify_ms\":0,\"accept_ms\":0,\"roll_ms\":0,\"maint_ms\":0,"
         "\"per_round\":{\"draft\":1,\"verify\":0,\"accept\":0,\"roll\":0,\"maint\":0,\"total\":1},"
         "\"drafted\":\"x\"}\n", SD_ERR_DATA, ":3: burst: missing or bad \"drafted\""},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const char *path = in_dir("bad.jsonl");
        write_text(path, cases[i].text);
        receipt_set s = {0};
        sd_status st = {0};
        cr_expect_eq(receipt_read_any(path, &s, &st), cases[i].code, "case %zu: %s", i, st.msg);
        cr_expect_not_null(strstr(st.msg, cases[i].want_in_msg), "case %zu: '%s'", i, st.msg);
        cr_expect_not_null(strstr(st.msg, path), "case %zu names the file: '%s'", i, st.msg);
        receipt_set_free(&s);
    }
    receipt_set s = {0};
    sd_status st = {0};
    cr_expect_eq(receipt_read_any(in_dir("missing.jsonl"), &s, &st), SD_ERR_SYS);
    cr_expect_not_null(strstr(st.msg, "missing.jsonl"), "%s", st.msg);
}

Test(receipt_compare, empty_mixed_and_mismatched_inputs) {
    receipt_set empty = {0}, spec = {0}, glm5 = {0}, mixed = {0};
    sd_status st = {0};
    cr_assert_eq(receipt_parse_text("nothing here\n", "e", &empty, &st), SD_OK);
    cr_assert_eq(receipt_parse_text(PHASE("spec", 10) "\n", "s", &spec, &st), SD_OK, "%s", st.msg);
    cr_assert_eq(receipt_parse_text(PHASE("glm5", 10) "\n", "g", &glm5, &st), SD_OK, "%s", st.msg);
    cr_assert_eq(receipt_parse_text(PHASE("spec", 10) "\n" PHASE("glm5", 10) "\n", "m", &mixed, &st), SD_OK);
    int n_over;
    cr_expect_eq(compare(&empty, &spec, NULL, 1.0, NULL, &n_over, &st), SD_ERR_DATA);
    cr_expect_not_null(strstr(st.msg, "A: no bursts"), "%s", st.msg);
    cr_expect_eq(compare(&spec, &glm5, NULL, 1.0, NULL, &n_over, &st), SD_ERR_DATA);
    cr_expect_not_null(strstr(st.msg, "'spec'"), "%s", st.msg);
    cr_expect_not_null(strstr(st.msg, "'glm5'"), "%s", st.msg);
    cr_expect_eq(compare(&mixed, &spec, NULL, 1.0, NULL, &n_over, &st), SD_ERR_DATA);
    cr_expect_not_null(strstr(st.msg, "choose one tag"), "%s", st.msg);
    cr_expect_eq(compare(&mixed, &spec, "spec", 1.0, NULL, &n_over, &st), SD_OK, "%s", st.msg);
    cr_expect_eq(n_over, 0);
    cr_expect_eq(compare(&mixed, &spec, "glm5", 1.0, NULL, &n_over, &st), SD_ERR_DATA);
    cr_expect_not_null(strstr(st.msg, "B: no bursts of tag 'glm5'"), "%s", st.msg);
    cr_expect_eq(compare(&spec, &spec, NULL, -1.0, NULL, &n_over, &st), SD_ERR_USAGE);
    receipt_set_free(&empty);
    receipt_set_free(&spec);
    receipt_set_free(&glm5);
    receipt_set_free(&mixed);
}

Test(receipt_compare, shares_are_percent_of_total) {
    receipt_set a = {0}, b = {0};
    sd_status st = {0};
    // A: draft 10%, verify 60%. B: draft 20%, verify 50% (same total).
    cr_assert_eq(receipt_parse_text(PHASE("spec", 10) "\n" VLINE("spec", 10) "\n", "a", &a, &st), SD_OK);
    cr_assert_eq(receipt_parse_text(
        "[spec-phase] rounds=10 k=4 total=10.00ms | draft=2.00 verify=5.00 accept=1.00 roll=1.00 "
        "maint=1.00 | per-round ms: draft=0.200 verify=0.500 accept=0.100 roll=0.100 maint=0.100 "
        "total=1.000\n", "b", &b, &st), SD_OK, "%s", st.msg);
    char table[4096] = {0};
    FILE *out = fmemopen(table, sizeof table - 1, "w");
    int n_over;
    cr_assert_eq(compare(&a, &b, NULL, 5.0, out, &n_over, &st), SD_OK, "%s", st.msg);
    fclose(out);
    cr_expect_eq(n_over, 2, "draft +10 and verify -10 beyond 5 pp: %s", table);
    cr_expect_not_null(strstr(table, "draft       10.00    20.00    +10.00"), "%s", table);
    cr_expect_not_null(strstr(table, "verify      60.00    50.00    -10.00"), "%s", table);
    cr_expect_not_null(strstr(table, "only A has level-2 lines"), "%s", table);
    receipt_set_free(&a);
    receipt_set_free(&b);
}

// ---- acceptance counts under vLLM's names ----

Test(receipt, vllm_counts_round_trip, .init = make_dir, .fini = remove_dir) {
    const char *path = in_dir("r.jsonl");
    write_run(path, 2, 1, NULL, 0);
    sd_status st = {0};
    receipt_set s = {0};
    cr_assert_eq(receipt_load(path, &s, &st), SD_OK, "%s", st.msg);
    cr_assert_eq(s.n, 2);
    for (size_t i = 0; i < 2; i++) {
        trace_burst b = make_burst(1, (int)i);
        cr_expect(s.bursts[i].has_positions);
        cr_expect_arr_eq(s.bursts[i].per_position, b.acc.per_position, sizeof(uint64_t) * 4);
        cr_expect_arr_eq(s.bursts[i].histogram, b.acc.histogram, sizeof(uint64_t) * 5);
    }
    FILE *f = fopen(path, "r");
    char line[4096];
    cr_assert_not_null(fgets(line, sizeof line, f)); // env
    cr_assert_not_null(fgets(line, sizeof line, f)); // burst 0
    fclose(f);
    cJSON *j = cJSON_Parse(line);
    cr_assert_not_null(j);
    trace_burst b = make_burst(1, 0);
    cr_expect_eq(cJSON_GetObjectItem(j, "num_drafts")->valuedouble, (double)b.acc.rounds);
    cr_expect_eq(cJSON_GetObjectItem(j, "num_draft_tokens")->valuedouble, (double)b.acc.drafted);
    cr_expect_eq(cJSON_GetObjectItem(j, "num_accepted_tokens")->valuedouble, (double)b.acc.accepted);
    cr_expect_eq(cJSON_GetObjectItem(j, "mean_acceptance_length")->valuedouble, 1.0 + (double)b.acc.accepted / (double)b.acc.rounds);
    cr_expect_eq(cJSON_GetArraySize(cJSON_GetObjectItem(j, "num_accepted_tokens_per_pos")), 4);
    cr_expect_eq(cJSON_GetArraySize(cJSON_GetObjectItem(j, "acceptance_histogram")), 5);
    cJSON_Delete(j);
    receipt_set_free(&s);
}

#define BURST_HEAD "{\"kind\":\"burst\",\"tag\":\"spec\",\"rounds\":2,\"k\":2,\"total_ms\":1,\"draft_ms\":1,\"verify_ms\":0," \
    "\"accept_ms\":0,\"roll_ms\":0,\"maint_ms\":0,\"per_round\":{\"draft\":0.5,\"verify\":0,\"accept\":0,\"roll\":0," \
    "\"maint\":0,\"total\":0.5},\"drafted\":4,\"accepted\":3,\"emitted\":5"

Test(receipt_load, per_position_counts_optional_but_checked, .init = make_dir, .fini = remove_dir) {
    const struct { const char *tail; int ok, has_positions; const char *bad_key; } cases[] = {
        {"}", 1, 0, NULL}, // a receipt from before vLLM's names
        {",\"num_accepted_tokens_per_pos\":[2,1],\"acceptance_histogram\":[0,1,1]}", 1, 1, NULL},
        {",\"num_accepted_tokens_per_pos\":[2,1,0],\"acceptance_histogram\":[0,1,1]}", 0, 0, "num_accepted_tokens_per_pos"},
        {",\"num_accepted_tokens_per_pos\":[2,-1],\"acceptance_histogram\":[0,1,1]}", 0, 0, "num_accepted_tokens_per_pos"},
        {",\"num_accepted_tokens_per_pos\":[2,1]}", 0, 0, "acceptance_histogram"},
        {",\"num_accepted_tokens_per_pos\":null,\"acceptance_histogram\":null}", 1, 0, NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char text[1024];
        snprintf(text, sizeof text, "%s%s\n", BURST_HEAD, cases[i].tail);
        write_text(in_dir("b.jsonl"), text);
        receipt_set s = {0};
        sd_status st = {0};
        sd_code rc = receipt_load(in_dir("b.jsonl"), &s, &st);
        if (cases[i].ok) {
            cr_expect_eq(rc, SD_OK, "case %zu: %s", i, st.msg);
            cr_expect_eq(s.n == 1 && s.bursts[0].has_positions, cases[i].has_positions, "case %zu", i);
        } else {
            cr_expect_eq(rc, SD_ERR_DATA, "case %zu accepted", i);
            cr_expect_not_null(strstr(st.msg, cases[i].bad_key), "case %zu: %s", i, st.msg);
        }
        receipt_set_free(&s);
    }
}

// ---- the closing line ----

Test(receipt_writer, end_line_says_how_the_run_ended, .init = make_dir, .fini = remove_dir) {
    const char *path = in_dir("r.jsonl");
    receipt_writer w;
    sd_status st = {0};
    cr_assert_eq(receipt_open(&w, path, &test_env, &st), SD_OK, "%s", st.msg);
    trace_burst b = make_burst(1, 0);
    cr_assert_eq(receipt_add_burst(&w, &b, "spec", &st), SD_OK, "%s", st.msg);
    cr_assert_eq(receipt_finish(&w, "interrupted", "interrupted", 17, &st), SD_OK, "%s", st.msg);
    receipt_close(&w);
    cr_expect_eq(count_tmp_files(), 0);
    receipt_set s = {0};
    cr_assert_eq(receipt_load(path, &s, &st), SD_OK, "%s", st.msg);
    cr_expect_eq(s.n, 1, "the finished burst is kept");
    cr_expect(s.ended);
    cr_expect(s.interrupted);
    receipt_set_free(&s);

    const struct { const char *text; const char *want; } bad[] = {
        {"{\"kind\":\"env\"}\n{\"kind\":\"end\",\"status\":\"complete\"}\n{\"kind\":\"end\",\"status\":\"complete\"}\n", ":3: a line after the end line"},
        {"{\"kind\":\"env\"}\n{\"kind\":\"end\"}\n", ":2: end line without a \"status\""},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        write_text(path, bad[i].text);
        receipt_set t = {0};
        cr_expect_eq(receipt_load(path, &t, &st), SD_ERR_DATA, "case %zu", i);
        cr_expect_not_null(strstr(st.msg, bad[i].want), "case %zu: %s", i, st.msg);
        receipt_set_free(&t);
    }
}

// ---- a log with nothing to parse ----

Test(receipt_parse, a_file_without_trace_lines_is_an_error, .init = make_dir, .fini = remove_dir) {
    const char *path = in_dir("empty.log");
    write_text(path, "starting\nno trace here\n");
    receipt_set s = {0};
    sd_status st = {0};
    cr_expect_eq(receipt_parse_file(path, &s, &st), SD_ERR_DATA);
    cr_expect_not_null(strstr(st.msg, "no trace lines"), "%s", st.msg);
    cr_expect_not_null(strstr(st.msg, path), "%s", st.msg);
    cr_expect_eq(receipt_read_any(path, &s, &st), SD_ERR_DATA);
    receipt_set_free(&s);
}

// ---- what the env lines say was measured ----

#define ENV_LINE(cfg, w, d, k, be) "{\"kind\":\"env\",\"config_sha256\":\"" cfg "\",\"weights_sha256\":\"" w \
    "\",\"draft_sha256\":" d ",\"k\":" k ",\"backend\":\"" be "\",\"device\":\"x\"}"

Test(receipt_compare, env_differences_are_named) {
    const struct { const char *env_b; int n; const char *named; } cases[] = {
        {ENV_LINE("c1", "w1", "\"d1\"", "4", "cpu"), 0, NULL},
        {ENV_LINE("c2", "w1", "\"d1\"", "4", "cpu"), 1, "config_sha256 (A c1, B c2)"},
        {ENV_LINE("c1", "w2", "\"d1\"", "4", "cpu"), 1, "weights_sha256 (A w1, B w2)"},
        {ENV_LINE("c1", "w1", "null", "4", "cpu"), 1, "draft_sha256 (A d1, B null)"},
        {ENV_LINE("c1", "w1", "\"d1\"", "3", "cpu"), 1, "k (A 4, B 3)"},
        {ENV_LINE("c1", "w1", "\"d1\"", "4", "cuda"), 1, "backend (A cpu, B cuda)"},
        {ENV_LINE("c9", "w1", "\"d1\"", "2", "cuda"), 3, "k (A 4, B 2)"},
        {NULL, 0, NULL}, // B is a trace log: nothing to check
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        receipt_set a = {0}, b = {0};
        sd_status st = {0};
        cr_assert_eq(receipt_parse_text(PHASE("spec", 10) "\n", "a", &a, &st), SD_OK);
        cr_assert_eq(receipt_parse_text(PHASE("spec", 10) "\n", "b", &b, &st), SD_OK);
        a.env_json = strdup(ENV_LINE("c1", "w1", "\"d1\"", "4", "cpu"));
        b.env_json = cases[i].env_b ? strdup(cases[i].env_b) : NULL;
        receipt_comparison c;
        cr_assert_eq(receipt_compare(&a, &b, NULL, 1.0, &c, &st), SD_OK, "case %zu: %s", i, st.msg);
        cr_expect_eq(c.n_env_diffs, cases[i].n, "case %zu", i);
        bool named = !cases[i].named;
        for (int j = 0; j < c.n_env_diffs; j++) named |= strcmp(c.env_diffs[j], cases[i].named) == 0;
        cr_expect(named, "case %zu: '%s' not among the differences", i, cases[i].named);
        cr_expect_eq(c.n_over, 0, "case %zu: the same shares", i);
        receipt_set_free(&a);
        receipt_set_free(&b);
    }
}

Test(receipt_compare, json_is_one_object_with_rows_and_verdict) {
    receipt_set a = {0}, b = {0};
    sd_status st = {0};
    cr_assert_eq(receipt_parse_text(PHASE("spec", 10) "\n" VLINE("spec", 10) "\n", "a", &a, &st), SD_OK);
    cr_assert_eq(receipt_parse_text(PHASE("spec", 10) "\n" VLINE("spec", 10) "\n", "b", &b, &st), SD_OK);
    b.bursts[0].phase_ms[TRACE_PHASE_DRAFT] = 3.0; // draft 3 of 12 ms = 25%, against 10%
    receipt_comparison c;
    cr_assert_eq(receipt_compare(&a, &b, NULL, 5.0, &c, &st), SD_OK, "%s", st.msg);
    char *text = receipt_comparison_json(&c, 0);
    cr_assert_not_null(text);
    cJSON *j = cJSON_Parse(text);
    cr_assert_not_null(j, "%s", text);
    cr_expect_eq(cJSON_GetArraySize(cJSON_GetObjectItem(j, "rows")), TRACE_N_PHASES + RECEIPT_N_VROWS, "%s", text);
    cr_expect(cJSON_IsFalse(cJSON_GetObjectItem(j, "within_tolerance")), "%s", text);
    cr_expect_eq(cJSON_GetObjectItem(j, "rows_beyond_tolerance")->valuedouble, (double)c.n_over);
    const cJSON *draft = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "rows"), 0);
    cr_expect_str_eq(cJSON_GetObjectItem(draft, "name")->valuestring, "draft");
    cr_expect(cJSON_IsTrue(cJSON_GetObjectItem(draft, "beyond_tolerance")), "%s", text);
    cr_expect(cJSON_IsArray(cJSON_GetObjectItem(j, "env_differences")));
    cJSON_Delete(j);
    free(text);
    receipt_set_free(&a);
    receipt_set_free(&b);
}
