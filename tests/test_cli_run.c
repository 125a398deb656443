// test_cli_run.c — what a user of `specdec run` expects around a run, end to end on the real
// binary: options that would do nothing are refused, --prompt-file, EOS, --stream, progress,
// Ctrl-C, the Chrome trace, the threads and metrics in JSON and receipts, and the receipt
// command's parse / compare edges.
#include <math.h>
#include <signal.h>
#include <sys/utsname.h>
#include <time.h>
#include "cli_harness.h"

TestSuite(cli_run, .init = make_dir, .fini = remove_dir, .timeout = 300);

// The speculative pair t (target) + d (draft) of tiny.json, seed 1, tail scale 0.5.
static void pair(void) { init_model("t", "1", "d", "2", "0.5"); }

// argv of `run --model t --draft d --k 3 --prompt 1,2,3 --max-new N` and `extra` after it.
static const char **spec_argv(const char *max_new, const char *const *extra) {
    static const char *argv[48];
    static char t[4096], d[4096];
    snprintf(t, sizeof t, "%s", in_dir("t"));
    snprintf(d, sizeof d, "%s", in_dir("d"));
    const char *base[] = {"run", "--model", t, "--draft", d, "--k", "3", "--prompt", "1,2,3", "--max-new", max_new};
    int n = 0;
    for (size_t i = 0; i < sizeof base / sizeof base[0]; i++) argv[n++] = base[i];
    for (; extra && *extra && n < 47; extra++) argv[n++] = *extra;
    argv[n] = NULL;
    return argv;
}

static const cJSON *item(const cJSON *j, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, key);
    cr_assert_not_null(v, "JSON key '%s' missing", key);
    return v;
}

// The first line of a JSONL file, parsed.
static cJSON *first_line(const char *path) {
    char *txt = read_file(path, NULL);
    cr_assert_not_null(txt, "%s not written", path);
    char *nl = strchr(txt, '\n');
    if (nl) *nl = 0;
    cJSON *j = cJSON_Parse(txt);
    cr_assert_not_null(j, "%s: first line is not JSON", path);
    free(txt);
    return j;
}

// ---- options that would do nothing ----

Test(cli_run, idle_options_are_usage_errors) {
    init_model("m", "1", NULL, NULL, NULL);
    char m[4096];
    snprintf(m, sizeof m, "%s", in_dir("m"));
    struct { const char *what; const char *argv[16]; const char *needle; } cases[] = {
        {"--k without --draft", {"run", "--model", m, "--k", "3", "--prompt", "1", NULL}, "--k"},
        {"--k with --plain (demo)", {"run", "--plain", "--k", "3", NULL}, "--k"},
        {"--trace on a plain run", {"run", "--model", m, "--trace", "1", "--prompt", "1", NULL}, "--trace"},
        {"--trace-tag on a plain run", {"run", "--model", m, "--trace-tag", "x", "--prompt", "1", NULL}, "--trace-tag"},
        {"--receipt on a plain run", {"run", "--model", m, "--receipt", in_dir("r.jsonl"), "--prompt", "1", NULL}, "--receipt"},
        {"--chrome-trace on a plain run", {"run", "--model", m, "--chrome-trace", in_dir("c.json"), "--prompt", "1", NULL}, "--chrome-trace"},
        {"--draft with --plain", {"run", "--model", m, "--draft", m, "--plain", "--prompt", "1", NULL}, "--plain"},
        {"--stream with --json", {"run", "--model", m, "--stream", "--json", "--prompt", "1", NULL}, "--stream"},
        {"--prompt and --prompt-file", {"run", "--model", m, "--prompt", "1", "--prompt-file", m, NULL}, "--prompt-file"},
        {"--threads 0", {"run", "--model", m, "--threads", "0", "--prompt", "1", NULL}, "--threads"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) expect_fail(cases[i].what, cases[i].argv, 2, cases[i].needle);
    cr_expect(!exists(in_dir("r.jsonl")) && !exists(in_dir("c.json")), "a refused run wrote a file");
}

// The other commands' options that would do nothing: an error where the command line is
// self-contradictory, a one-line note (exit 0) where a script's habitual option is merely idle.
Test(cli_run, idle_options_of_forward_receipt_and_gate) {
    init_model("m", "1", "d", "2", "0.5");
    char m[4096], d[4096], o[4096];
    snprintf(m, sizeof m, "%s", in_dir("m"));
    snprintf(d, sizeof d, "%s", in_dir("d"));
    snprintf(o, sizeof o, "%s", in_dir("o.st"));
    write_file(in_dir("x.log"), "[spec-phase] rounds=1 k=1 total=1.00ms | draft=0.20 verify=0.20 accept=0.20 roll=0.20 "
                                "maint=0.20 | per-round ms: draft=0.200 verify=0.200 accept=0.200 roll=0.200 maint=0.200 total=1.000\n");
    struct { const char *what; const char *argv[16]; const char *needle; } cases[] = {
        {"forward --chunk, decode by default", {"forward", "--model", m, "--tokens", "1,2", "--out", o, "--chunk", "2", NULL},
         "--chunk does nothing with --mode decode"},
        {"forward --chunk --mode decode", {"forward", "--model", m, "--tokens", "1,2", "--out", o, "--mode", "decode", "--chunk", "2", NULL},
         "--chunk does nothing with --mode decode"},
        {"receipt parse --tol", {"receipt", "parse", in_dir("x.log"), "--tol", "1", NULL}, "--tol does nothing with parse"},
        {"receipt parse --force", {"receipt", "parse", in_dir("x.log"), "--force", NULL}, "--force does nothing with parse"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) expect_fail(cases[i].what, cases[i].argv, 2, cases[i].needle);
    cr_expect(!exists(o), "a refused forward wrote its output");

    char *err;
    const char *seed[] = {"run", "--model", m, "--prompt", "1,2", "--max-new", "2", "--seed", "5", NULL};
    free(run_ok(seed, &err));
    cr_expect(strstr(err, "note: --seed does nothing here") && count_lines(err) == 1, "<<%s>>", err);
    free(err);
    const char *sampled[] = {"run", "--model", m, "--prompt", "1,2", "--max-new", "2", "--seed", "5", "--temperature", "0.5", NULL};
    free(run_ok(sampled, &err));
    cr_expect_null(strstr(err, "note"), "--seed keys the draws of a sampled run: <<%s>>", err);
    free(err);
    const char *gate[] = {"gate", "graph-sel", "--model", m, "--draft", d, "--k", "0", "--backend", "cpu", "--tokens", "4", NULL};
    free(run_ok(gate, &err));
    cr_expect(strstr(err, "note: --k 0 runs plain decode steps: --draft is not used"), "<<%s>>", err);
    free(err);
}

// ---- the decode-graph door off the GPU ----

// --graph (or SPECDEC_DECODE_GRAPH=1) replays CUDA graphs: on the CPU backend it is refused
// before anything loads, never silently run eagerly.
Test(cli_run, graph_door_is_refused_off_the_gpu) {
    init_model("m", "1", NULL, NULL, NULL);
    char m[4096], r[4096];
    snprintf(m, sizeof m, "%s", in_dir("m"));
    snprintf(r, sizeof r, "%s", in_dir("r.jsonl"));
    const char *cpu[] = {"run", "--model", m, "--draft", m, "--backend", "cpu", "--graph", "--receipt", r, "--prompt", "1", NULL};
    expect_fail("--graph on the cpu backend", cpu, 2, "--graph");
    const char *tp[] = {"run", "--model", m, "--backend", "cpu", "--graph", "--tp", "2", "--prompt", "1", NULL};
    expect_fail("--graph with --tp on the cpu backend", tp, 2, "--graph: ");
    const char *plain[] = {"run", "--model", m, "--backend", "cpu", "--receipt", r, "--draft", m, "--prompt", "1", NULL};
    setenv("SPECDEC_DECODE_GRAPH", "1", 1);
    expect_fail("SPECDEC_DECODE_GRAPH=1 on the cpu backend", plain, 2, "--graph");
    setenv("SPECDEC_DECODE_GRAPH", "yes", 1);
    expect_fail("SPECDEC_DECODE_GRAPH=yes", plain, 2, "SPECDEC_DECODE_GRAPH");
    unsetenv("SPECDEC_DECODE_GRAPH");
    setenv("SPECDEC_GRAPH_SEL_LEDGER", "1", 1); // the ledger records inside the door's graphs only
    expect_fail("SPECDEC_GRAPH_SEL_LEDGER=1 without --graph", plain, 2, "--graph");
    unsetenv("SPECDEC_GRAPH_SEL_LEDGER");
    cr_expect(!exists(r), "a refused run wrote its receipt");
}

// ---- --prompt-file ----

Test(cli_run, prompt_file_reads_commas_and_whitespace) {
    init_model("m", "1", NULL, NULL, NULL);
    write_file(in_dir("p.txt"), "5, 17 63\n0,\t42\n");
    const char *listed[] = {"run", "--model", in_dir("m"), "--prompt", "5,17,63,0,42", "--max-new", "6", "--json", NULL};
    const char *filed[] = {"run", "--model", in_dir("m"), "--prompt-file", in_dir("p.txt"), "--max-new", "6", "--json", NULL};
    char *a = run_ok(listed, NULL), *b = run_ok(filed, NULL);
    cJSON *ja = parse_run_json(a), *jb = parse_run_json(b);
    int ta[8], tb[8];
    cr_assert_eq(json_tokens(ja, ta, 8), 6);
    cr_assert_eq(json_tokens(jb, tb, 8), 6);
    cr_expect_arr_eq(ta, tb, sizeof ta[0] * 6, "the file's prompt differs from the listed one");
    cr_expect_eq(num(jb, "prompt_tokens"), 5.0);
    cJSON_Delete(ja);
    cJSON_Delete(jb);
    free(a);
    free(b);

    const struct { const char *text; const char *needle; } bad[] = {
        {"1,,2\n", "empty field"}, {"1 x 2\n", "'x'"}, {"\n \n", "no token ids"}, {",1\n", "empty field"},
        {"99999999999\n", "too large"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        write_file(in_dir("bad.txt"), bad[i].text);
        const char *argv[] = {"run", "--model", in_dir("m"), "--prompt-file", in_dir("bad.txt"), "--max-new", "2", NULL};
        expect_fail(bad[i].needle, argv, 1, bad[i].needle);
    }
    const char *missing[] = {"run", "--model", in_dir("m"), "--prompt-file", in_dir("none.txt"), NULL};
    expect_fail("missing prompt file", missing, 1, "none.txt");
    write_file(in_dir("big.txt"), "1 64\n");
    const char *outside[] = {"run", "--model", in_dir("m"), "--prompt-file", in_dir("big.txt"), NULL};
    expect_fail("prompt id outside the vocabulary", outside, 1, "64");
}

// ---- EOS ----

// Adds "eos_token_id": ids (JSON text) to dir/name/config.json; the weights stay as they are.
static void set_eos(const char *name, const char *ids) {
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", in_dir(name));
    cJSON *c = parse_json_file(path);
    cJSON_AddItemToObject(c, "eos_token_id", cJSON_Parse(ids));
    char *txt = cJSON_Print(c);
    write_file(path, txt);
    free(txt);
    cJSON_Delete(c);
}

Test(cli_run, generation_stops_at_eos_unless_ignore_eos) {
    pair();
    char *out = run_ok(spec_argv("24", (const char *[]){"--json", "--ignore-eos", NULL}), NULL);
    cJSON *j = parse_run_json(out);
    int all[32], n = json_tokens(j, all, 32), at = -1;
    cr_assert_eq(n, 24);
    cJSON_Delete(j);
    free(out);
    for (int i = 4; i < n && at < 0; i++) { // a token first seen at i >= 4
        bool seen = false;
        for (int p = 0; p < i; p++) seen |= all[p] == all[i];
        if (!seen) at = i;
    }
    cr_assert_geq(at, 0, "no fresh token to use as EOS");
    char ids[32];
    snprintf(ids, sizeof ids, "[%d]", all[at]);
    set_eos("t", ids);

    const char *plain[] = {"run", "--model", in_dir("t"), "--prompt", "1,2,3", "--max-new", "24", "--json", NULL};
    const char *const modes[][4] = {{"--json", NULL}, {NULL}};
    for (int spec = 0; spec < 2; spec++) {
        out = run_ok(spec ? spec_argv("24", modes[0]) : plain, NULL);
        j = parse_run_json(out);
        int got[32], g = json_tokens(j, got, 32);
        cr_expect_eq(g, at + 1, "%s: %d tokens, the EOS %d is token %d", spec ? "spec" : "plain", g, all[at], at);
        cr_expect_arr_eq(got, all, sizeof(int) * (size_t)(at + 1));
        cr_expect_str_eq(item(j, "stop_reason")->valuestring, "eos");
        cJSON_Delete(j);
        free(out);
    }
    out = run_ok(spec_argv("24", (const char *[]){"--json", "--ignore-eos", NULL}), NULL);
    j = parse_run_json(out);
    cr_expect_eq(json_tokens(j, all, 32), 24, "--ignore-eos runs on past the EOS");
    cr_expect_str_eq(item(j, "stop_reason")->valuestring, "max_new");
    cJSON_Delete(j);
    free(out);

    free(run_ok(spec_argv("24", (const char *[]){"--receipt", in_dir("r.jsonl"), NULL}), NULL));
    char *r = read_file(in_dir("r.jsonl"), NULL);
    cr_expect_not_null(strstr(r, "{\"kind\":\"end\",\"status\":\"complete\",\"stop_reason\":\"eos\""), "%s", r);
    free(r);
}

// ---- --stream and progress ----

Test(cli_run, stream_prints_what_the_report_prints) {
    pair();
    char *plain = run_ok(spec_argv("20", NULL), NULL), *streamed = run_ok(spec_argv("20", (const char *[]){"--stream", NULL}), NULL);
    char *a = strchr(plain, '\n'), *b = strchr(streamed, '\n');
    cr_assert(a && b);
    cr_expect_eq(a - plain, b - streamed, "tokens lines differ:\n%s\n%s", plain, streamed);
    cr_expect(!strncmp(plain, streamed, (size_t)(a - plain)), "tokens lines differ:\n%s\n%s", plain, streamed);
    cr_expect_not_null(strstr(b, "tokens/s"), "the summary follows the stream: %s", streamed);
    free(plain);
    free(streamed);
}

Test(cli_run, progress_lines_only_when_asked_off_a_terminal) {
    pair();
    char *err;
    free(run_ok(spec_argv("20", NULL), &err));
    cr_expect_null(strstr(err, "specdec run: "), "progress on a log without --progress: %s", err);
    free(err);
    free(run_ok(spec_argv("20", (const char *[]){"--progress", NULL}), &err));
    cr_expect_not_null(strstr(err, "specdec run: prefill 2/2 tokens\n"), "%s", err);
    cr_expect_not_null(strstr(err, "specdec run: 20/20 tokens, "), "%s", err);
    cr_expect_not_null(strstr(err, "tokens/s (done)\n"), "%s", err);
    cr_expect_null(strchr(err, '\r'), "a log gets whole lines, not a rewritten terminal line: %s", err);
    free(err);
}

// ---- Ctrl-C ----

static int tokens_in(const char *text) {
    int n = 0;
    for (const char *p = strchr(text, ':'); p && *p && *p != '\n'; p++) n += p[0] == ' ' && p[1] >= '0' && p[1] <= '9';
    return n;
}

Test(cli_run, ctrl_c_ends_the_run_cleanly) {
    pair();
    const char *out = strdup(in_dir("out.txt")), *err = strdup(in_dir("err.txt"));
    const char *rcpt = strdup(in_dir("r.jsonl")), *chrome = strdup(in_dir("c.json"));
    pid_t pid = spawn_cli(spec_argv("200000", (const char *[]){"--stream", "--receipt", rcpt, "--chrome-trace", chrome, NULL}), out, err);
    // Wait until the stream shows the rounds running, then interrupt.
    int seen = 0;
    for (int i = 0; i < 3000 && seen < 50; i++) {
        nanosleep(&(struct timespec){0, 10000000}, NULL);
        char *txt = read_file(out, NULL);
        seen = txt ? tokens_in(txt) : 0;
        free(txt);
    }
    cr_assert_geq(seen, 50, "the run never streamed 50 tokens");
    cr_assert_eq(kill(pid, SIGINT), 0);
    const int status = wait_cli(pid);
    cr_expect_eq(status, 130, "exit status %d, expected 130 (an exit, not death by the signal)", status);

    char *o = read_file(out, NULL), *e = read_file(err, NULL);
    const int n = tokens_in(o);
    cr_expect(n >= seen && n < 200000, "%d tokens printed", n);
    char want[128];
    snprintf(want, sizeof want, "\n%d tokens in ", n);
    cr_expect_not_null(strstr(o, want), "the summary counts the tokens printed: %s", o + strlen(o) - (strlen(o) > 300 ? 300 : strlen(o)));
    cr_expect_not_null(strstr(e, "interrupted (SIGINT)"), "%s", e);
    cr_expect_not_null(strstr(e, "[spec-phase] rounds="), "the finished rounds' trace line: %s", e);

    char *r = read_file(rcpt, NULL);
    cr_assert_not_null(r, "no receipt");
    cr_expect_eq(count_lines(r), 3, "env, the burst, the end line: %s", r);
    cr_expect_not_null(strstr(r, "{\"kind\":\"burst\""), "%s", r);
    snprintf(want, sizeof want, "\"status\":\"interrupted\",\"stop_reason\":\"interrupted\",\"tokens\":%d}", n);
    cr_expect_not_null(strstr(r, want), "no closing line %s in %s", want, r);
    cJSON *c = parse_json_file(chrome);
    cr_expect(cJSON_GetArraySize(item(c, "traceEvents")) > 50, "the Chrome trace holds the finished rounds");
    cJSON_Delete(c);
    cr_expect_eq(count_tmp_files(), 0, "a temporary file was left");
    free(o);
    free(e);
    free(r);
}

// ---- the Chrome trace against the trace lines ----

Test(cli_run, chrome_trace_slices_sum_to_the_trace_lines) {
    pair();
    char *err, *out = run_ok(spec_argv("40", (const char *[]){"--trace", "2", "--json", "--chrome-trace", in_dir("c.json"), NULL}), &err);
    cJSON *run = parse_run_json(out);
    double ms[5], v[4], vrest;
    const char *l = strstr(err, "[spec-phase] rounds="), *lv = strstr(err, "[spec-phase-v] rounds=");
    cr_assert(l && lv, "%s", err);
    cr_assert_eq(sscanf(strstr(l, "| draft="), "| draft=%lf verify=%lf accept=%lf roll=%lf maint=%lf", &ms[0], &ms[1], &ms[2], &ms[3],
                        &ms[4]), 5);
    cr_assert_eq(sscanf(strstr(lv, "vkda="), "vkda=%lf (scan=%lf) vmla=%lf vrest=%lf (vffn=%lf)", &v[0], &v[1], &v[2], &vrest, &v[3]), 5);
    const double rounds = num(run, "rounds");

    cJSON *c = parse_json_file(in_dir("c.json"));
    const char *phases[] = {"draft", "verify", "accept", "rollback", "maintenance"}, *buckets[] = {"vkda", "scan", "vmla", "vffn"};
    double phase_us[5] = {0}, bucket_us[4] = {0}, accepted = 0;
    int verify_slices = 0, names = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, item(c, "traceEvents")) {
        const char *name = item(e, "name")->valuestring;
        if (!strcmp(item(e, "ph")->valuestring, "M")) {
            if (!strcmp(name, "thread_name")) names++;
            continue;
        }
        for (int p = 0; p < 5; p++)
            if (!strcmp(name, phases[p])) phase_us[p] += num(e, "dur");
        for (int k = 0; k < 4; k++)
            if (!strcmp(name, buckets[k])) bucket_us[k] += num(e, "dur");
        if (!strcmp(name, "verify")) {
            verify_slices++;
            accepted += num(item(e, "args"), "accepted");
        }
    }
    cr_expect_eq(names, 2, "a target and a draft track");
    cr_expect_eq(verify_slices, rounds, "one verify slice per round");
    cr_expect_eq(accepted, num(run, "accepted"), "the slices' accepted counts sum to the run's");
    for (int p = 0; p < 5; p++)
        cr_expect_leq(fabs(phase_us[p] / 1000 - ms[p]), 0.005 + 1e-9, "%s: slices %.4f ms, trace line %.2f", phases[p], phase_us[p] / 1000, ms[p]);
    for (int k = 0; k < 4; k++)
        cr_expect_leq(fabs(bucket_us[k] / 1000 / rounds - v[k]), 0.0005 + 1e-9, "%s: slices %.5f ms/round, trace line %.3f", buckets[k],
                      bucket_us[k] / 1000 / rounds, v[k]);
    cJSON_Delete(c);
    cJSON_Delete(run);
    free(out);
    free(err);
}

// ---- threads, the CPU and vLLM's metric names in JSON and receipts ----

Test(cli_run, json_carries_threads_and_vllm_metrics) {
    pair();
    char *out = run_ok(spec_argv("30", (const char *[]){"--json", "--threads", "1", NULL}), NULL);
    cJSON *j = parse_run_json(out);
    cr_expect_eq(num(j, "threads"), 1.0);
    const double rounds = num(j, "rounds"), drafted = num(j, "drafted"), accepted = num(j, "accepted");
    cr_expect_eq(num(j, "num_drafts"), rounds);
    cr_expect_eq(num(j, "num_draft_tokens"), drafted);
    cr_expect_eq(num(j, "num_accepted_tokens"), accepted);
    cr_expect_eq(num(j, "mean_acceptance_length"), 1.0 + accepted / rounds);
    const cJSON *pos = item(j, "num_accepted_tokens_per_pos"), *hist = item(j, "acceptance_histogram"), *rate = item(j, "per_position");
    cr_assert_eq(cJSON_GetArraySize(pos), 3);
    cr_assert_eq(cJSON_GetArraySize(hist), 4);
    double pos_sum = 0, hist_rounds = 0, hist_accepted = 0;
    for (int i = 0; i < 3; i++) {
        double c = cJSON_GetArrayItem(pos, i)->valuedouble;
        pos_sum += c;
        cr_expect_eq(c / rounds, cJSON_GetArrayItem(rate, i)->valuedouble, "position %d", i);
        if (i) cr_expect_leq(c, cJSON_GetArrayItem(pos, i - 1)->valuedouble, "a survival count never grows");
    }
    for (int n = 0; n <= 3; n++) {
        hist_rounds += cJSON_GetArrayItem(hist, n)->valuedouble;
        hist_accepted += n * cJSON_GetArrayItem(hist, n)->valuedouble;
    }
    cr_expect_eq(pos_sum, accepted, "per-position counts sum to the accepted tokens");
    cr_expect_eq(hist_rounds, rounds, "the histogram counts every round");
    cr_expect_eq(hist_accepted, accepted);
    cJSON_Delete(j);
    free(out);
}

// What the env line's cpu_model must say: /proc/cpuinfo's "model name", else uname's machine.
static void expected_cpu_model(char *buf, size_t len) {
    struct utsname u;
    snprintf(buf, len, "%s", uname(&u) == 0 ? u.machine : "cpu");
    FILE *f = fopen("/proc/cpuinfo", "r");
    char line[512];
    while (f && fgets(line, sizeof line, f)) {
        char *colon = strchr(line, ':');
        if (strncmp(line, "model name", 10) || !colon) continue;
        snprintf(buf, len, "%s", colon + 2);
        buf[strcspn(buf, "\n")] = 0;
        break;
    }
    if (f) fclose(f);
}

// The env line records the CPU (model, threads) and, in flags, the trace level in force whatever
// set it: --trace, SPECDEC_SPEC_TRACE, its family alias, or an output that needs the clocks.
Test(cli_run, receipt_env_records_cpu_threads_and_the_trace_level_source) {
    pair();
    char cpu[512];
    expected_cpu_model(cpu, sizeof cpu);
    const struct { const char *env, *env_level; const char *extra[4]; int level; const char *source; } cases[] = {
        {NULL, NULL, {NULL}, 1, "--receipt"},
        {NULL, NULL, {"--trace", "2", NULL}, 2, "--trace"},
        {"SPECDEC_SPEC_TRACE", "2", {NULL}, 2, "environment"},
        {"SPECDEC_KIMI_LINEAR_SPEC_TRACE", "2", {NULL}, 2, "environment"},
        {"SPECDEC_SPEC_TRACE", "1", {"--trace", "2", NULL}, 2, "--trace"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        if (cases[i].env) setenv(cases[i].env, cases[i].env_level, 1);
        const char *extra[8] = {"--threads", "1", "--receipt", in_dir("r.jsonl")};
        for (int e = 0; cases[i].extra[e]; e++) extra[4 + e] = cases[i].extra[e];
        free(run_ok(spec_argv("8", extra), NULL));
        if (cases[i].env) unsetenv(cases[i].env);
        cJSON *env = first_line(in_dir("r.jsonl"));
        char flags[96];
        snprintf(flags, sizeof flags, "SPECDEC_SPEC_TRACE=%d SPECDEC_DECODE_GRAPH=0", cases[i].level);
        cr_expect_str_eq(item(env, "flags")->valuestring, flags, "case %zu", i);
        cr_expect_eq(num(env, "trace_level"), cases[i].level, "case %zu", i);
        cr_expect_str_eq(item(env, "trace_level_source")->valuestring, cases[i].source, "case %zu", i);
        cr_expect_eq(num(env, "cpu_threads"), 1.0, "case %zu", i);
        cr_expect(cJSON_IsFalse(item(env, "decode_graph")), "case %zu: the door was not open", i);
        cr_expect(cJSON_IsString(item(env, "cpu_model")) && item(env, "cpu_model")->valuestring[0], "case %zu", i);
        cr_expect_str_eq(item(env, "cpu_model")->valuestring, cpu, "case %zu: the host's CPU", i);
        cr_expect_str_eq(item(env, "omp_wait_policy")->valuestring, "passive", "idle OpenMP threads sleep");
        cJSON_Delete(env);
    }
}

// ---- receipt parse and compare ----

Test(cli_run, receipt_parse_of_a_log_without_trace_lines_fails) {
    write_file(in_dir("plain.log"), "tokens: 1 2 3\n8 tokens in 0.1 s\n");
    const char *argv[] = {"receipt", "parse", in_dir("plain.log"), NULL};
    expect_fail("receipt parse, no trace lines", argv, 1, "no trace lines");
}

Test(cli_run, receipt_compare_refuses_other_measurements_unless_forced) {
    pair();
    free(run_ok(spec_argv("12", (const char *[]){"--receipt", in_dir("k3.jsonl"), NULL}), NULL));
    const char *k2[] = {"run", "--model", in_dir("t"), "--draft", in_dir("d"), "--k", "2", "--prompt", "1,2,3", "--max-new", "12",
                        "--receipt", in_dir("k2.jsonl"), NULL};
    free(run_ok(k2, NULL));
    const char *refused[] = {"receipt", "compare", in_dir("k3.jsonl"), in_dir("k2.jsonl"), "--tol", "100", NULL};
    expect_fail("compare k = 3 with k = 2", refused, 1, "k (A 3, B 2)");

    const char *forced[] = {"receipt", "compare", in_dir("k3.jsonl"), in_dir("k2.jsonl"), "--tol", "100", "--force", NULL};
    char *err, *out = run_ok(forced, &err);
    cr_expect_not_null(strstr(err, "warning: k (A 3, B 2) differs"), "%s", err);
    cr_expect_eq(count_lines(err), 1, "one warning per difference: %s", err);
    cr_expect_not_null(strstr(out, "all rows within tolerance"), "%s", out);
    free(out);
    free(err);

    // A trace log has no env line: compared with a receipt, a note says B's measurement is unchecked.
    const char *logged[] = {"run", "--model", in_dir("t"), "--draft", in_dir("d"), "--k", "2", "--prompt", "1,2,3",
                            "--max-new", "12", "--trace", "1", NULL};
    free(run_ok(logged, &err));
    write_file(in_dir("k2.log"), err);
    free(err);
    const char *mixed[] = {"receipt", "compare", in_dir("k3.jsonl"), in_dir("k2.log"), "--tol", "100", NULL};
    free(run_ok(mixed, &err));
    cr_expect(strstr(err, "note: B (") && strstr(err, "is a trace log without an env line") && count_lines(err) == 1,
              "<<%s>>", err);
    free(err);

    const char *json[] = {"receipt", "compare", in_dir("k3.jsonl"), in_dir("k3.jsonl"), "--json", NULL};
    out = run_ok(json, NULL);
    cJSON *j = parse_run_json(out); // one line, one object
    cr_expect(cJSON_IsTrue(item(j, "within_tolerance")));
    cr_expect_eq(cJSON_GetArraySize(item(j, "rows")), 5);
    cr_expect_eq(cJSON_GetArraySize(item(j, "env_differences")), 0);
    cJSON_Delete(j);
    free(out);
}
