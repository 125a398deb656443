// test_cli_gate.c — `specdec gate graph-sel` on the CPU backend, end to end on the real binary:
// both arms on the host walk (the graph arm recording through the ledger's CPU stand-in) agree on
// every (layer, token) for speculative greedy and sampled rounds and plain steps; the canary's
// one-ulp nudge makes the gate fail naming the slot it was planted in; --json carries the same
// verdicts; under --tp every emulated rank passes against its own oracle and the cross-rank
// verdict catches a canary rank; bad usage is one line and exit 2. test_cuda_gate runs the same
// on the GPU.
#include "cli_harness.h"

TestSuite(cli_gate, .init = make_dir, .fini = remove_dir, .timeout = 300);

static const cJSON *item(const cJSON *j, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, key);
    cr_assert_not_null(v, "JSON key '%s' missing", key);
    return v;
}

// `gate graph-sel --backend cpu --json` on the tiny pair with extra options; its JSON and exit code.
static cJSON *gate_json(const char *const *extra, int *rc) {
    char t[4096], d[4096];
    snprintf(t, sizeof t, "%s", in_dir("t"));
    snprintf(d, sizeof d, "%s", in_dir("d"));
    const char *argv[32] = {"gate", "graph-sel", "--model", t, "--draft", d, "--backend", "cpu", "--tokens", "24", "--json"};
    int n = 11;
    for (; extra && *extra; extra++) argv[n++] = *extra;
    argv[n] = NULL;
    char *out, *err;
    *rc = run_cli(argv, &out, &err);
    cJSON *j = parse_run_json(out);
    free(out);
    free(err);
    return j;
}

// Every MoE layer of tiny.json has a passing verdict with rows, and the arms recorded.
static void expect_pass(const cJSON *j, const char *what) {
    cr_expect(cJSON_IsTrue(item(j, "pass")), "%s: the gate failed", what);
    const cJSON *dev = cJSON_GetArrayItem(item(j, "devices"), 0);
    cr_assert_not_null(dev, "%s: no device", what);
    const cJSON *layers = item(dev, "layers"), *l;
    cr_expect_gt(cJSON_GetArraySize(layers), 0, "%s: no MoE layer verdicts", what);
    cJSON_ArrayForEach(l, layers) {
        cr_expect(cJSON_IsTrue(item(l, "pass")), "%s: layer %d", what, (int)num(l, "layer"));
        cr_expect_gt(num(l, "rows"), 0, "%s: layer %d compared nothing", what, (int)num(l, "layer"));
    }
    cr_expect_gt(num(dev, "entries_eager"), 0, "%s", what);
    cr_expect_gt(num(dev, "entries_graph"), 0, "%s", what);
    cr_expect_eq(num(dev, "rows_eager"), num(dev, "rows_graph"), "%s: the arms recorded different row counts", what);
    cr_expect(cJSON_IsTrue(item(dev, "tokens_equal")), "%s", what);
    cr_expect(cJSON_IsNull(item(dev, "first_divergence")), "%s", what);
}

Test(cli_gate, both_arms_agree_greedy_sampled_and_plain) {
    init_model("t", "1", "d", "2", "0.5");
    const struct { const char *what; const char *extra[8]; bool logits; } cases[] = {
        {"greedy k = 3", {"--k", "3", NULL}, true},
        {"sampled k = 5", {"--k", "5", "--temperature", "0.8", "--seed", "7", NULL}, true},
        {"plain greedy", {"--k", "0", NULL}, true},
        {"plain sampled", {"--k", "0", "--temperature", "1.0", NULL}, false},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int rc;
        cJSON *j = gate_json(cases[i].extra, &rc);
        cr_expect_eq(rc, 0, "%s: exit %d", cases[i].what, rc);
        expect_pass(j, cases[i].what);
        const cJSON *logits = item(cJSON_GetArrayItem(item(j, "devices"), 0), "logits_equal");
        if (cases[i].logits) cr_expect(cJSON_IsTrue(logits), "%s: logits", cases[i].what);
        else cr_expect(cJSON_IsNull(logits), "%s: logits should be reported as not compared", cases[i].what);
        cJSON_Delete(j);
    }
}

// The canary: one weight one ulp off in the graph arm's slot after its first recorded round. The
// gate must fail (exit 1) and name exactly that (layer, token).
Test(cli_gate, the_canary_fails_the_gate_at_its_slot) {
    init_model("t", "1", "d", "2", "0.5");
    int rc;
    cJSON *j = gate_json((const char *[]){"--canary", NULL}, &rc);
    cr_expect_eq(rc, 1, "a planted canary must fail the gate");
    cr_expect(cJSON_IsFalse(item(j, "pass")));
    const cJSON *dev = cJSON_GetArrayItem(item(j, "devices"), 0), *first = item(dev, "first_divergence");
    const cJSON *canary = item(dev, "canary");
    cr_assert(cJSON_IsObject(first), "no first divergence reported");
    cr_expect_eq(num(first, "layer"), num(canary, "layer"), "caught at another layer than planted");
    cr_expect_eq(num(first, "token"), num(canary, "token"), "caught at another token than planted");
    int bad = 0;
    const cJSON *l;
    cJSON_ArrayForEach(l, item(dev, "layers")) bad += (int)num(l, "mismatched");
    cr_expect_eq(bad, 1, "exactly the planted row differs");
    cJSON_Delete(j);

    // The human report names the slot too, with both rows and the margin.
    char t[4096], d[4096];
    snprintf(t, sizeof t, "%s", in_dir("t"));
    snprintf(d, sizeof d, "%s", in_dir("d"));
    const char *argv[] = {"gate", "graph-sel", "--model", t, "--draft", d, "--backend", "cpu", "--tokens", "24", "--canary", NULL};
    char *out, *err;
    cr_expect_eq(run_cli(argv, &out, &err), 1);
    cr_expect(strstr(out, "first divergence: device 0 layer") && strstr(out, "margin") && strstr(out, "graph-sel: FAIL"),
              "<<%s>>", out);
    free(out);
    free(err);
}

// --tp 3: each emulated rank runs both arms on its shard and passes against its own oracle (its
// own stand-in device), and the ranks route alike; --canary-rank 2 nudges rank 2's router input
// by one ulp: every rank still agrees with itself, and the cross-rank verdict fails naming rank 2.
Test(cli_gate, ranks_pass_alone_and_a_canary_rank_is_named) {
    init_model("t", "1", "d", "2", "0.5");
    int rc;
    cJSON *j = gate_json((const char *[]){"--tp", "3", NULL}, &rc);
    cr_expect_eq(rc, 0, "--tp 3: exit %d", rc);
    cr_expect(cJSON_IsTrue(item(j, "pass")));
    const cJSON *devs = item(j, "devices"), *d;
    cr_expect_eq(cJSON_GetArraySize(devs), 3, "one verdict set per rank");
    int r = 0;
    cJSON_ArrayForEach(d, devs) {
        cr_expect_eq(num(d, "rank"), r, "rank order");
        cr_expect(cJSON_IsTrue(item(d, "pass")), "rank %d against its oracle", r);
        cr_expect_gt(num(d, "rows_graph"), 0, "rank %d recorded nothing in the graph arm", r);
        r++;
    }
    cr_expect(cJSON_IsTrue(item(item(j, "ranks"), "pass")), "the ranks route alike");
    cJSON_Delete(j);

    j = gate_json((const char *[]){"--tp", "3", "--canary-rank", "2", NULL}, &rc);
    cr_expect_eq(rc, 1, "a canary rank must fail the gate");
    cr_expect(cJSON_IsFalse(item(j, "pass")));
    cJSON_ArrayForEach(d, item(j, "devices")) cr_expect(cJSON_IsTrue(item(d, "pass")), "each rank still agrees with itself");
    const cJSON *x = item(j, "ranks");
    cr_expect(cJSON_IsFalse(item(x, "pass")));
    cr_expect_eq(num(x, "rank"), 2, "the cross-rank verdict names rank 2");
    cr_expect(strstr(item(x, "message")->valuestring, "rank 2"), "%s", item(x, "message")->valuestring);
    cJSON_Delete(j);
}

// With neither --model nor --config: the embedded demo pair; --config synthesises with a derived draft.
Test(cli_gate, demo_and_synthesised_models) {
    const char *demo[] = {"gate", "graph-sel", "--backend", "cpu", "--tokens", "16", NULL};
    char *out = run_ok(demo, NULL);
    cr_expect(strstr(out, "graph-sel: PASS"), "<<%s>>", out);
    free(out);
    const char *synth[] = {"gate", "graph-sel", "--backend", "cpu", "--config", tiny_config(), "--draft-layers", "2",
                           "--tail-scale", "0.3", "--tokens", "16", NULL};
    out = run_ok(synth, NULL);
    cr_expect(strstr(out, "graph-sel: PASS"), "<<%s>>", out);
    free(out);
}

Test(cli_gate, bad_usage_is_one_line_and_exit_2) {
    init_model("m", "1", NULL, NULL, NULL);
    char m[4096];
    snprintf(m, sizeof m, "%s", in_dir("m"));
    struct { const char *what; const char *argv[12]; const char *needle; } cases[] = {
        {"unknown gate", {"gate", "graph-selection", NULL}, "graph-sel"},
        {"no gate", {"gate", NULL}, NULL},
        {"--k without a draft", {"gate", "graph-sel", "--model", m, "--k", "3", NULL}, "--k"},
        {"--draft-layers without --config", {"gate", "graph-sel", "--model", m, "--draft-layers", "2", NULL}, "--draft-layers"},
        {"--model and --config", {"gate", "graph-sel", "--model", m, "--config", m, NULL}, "--config"},
        {"--tokens 0", {"gate", "graph-sel", "--tokens", "0", NULL}, "--tokens"},
        {"--backend gpu", {"gate", "graph-sel", "--backend", "gpu", NULL}, "--backend"},
        {"--canary-rank without --tp", {"gate", "graph-sel", "--canary-rank", "1", NULL}, "--canary-rank"},
        {"--canary-rank out of range", {"gate", "graph-sel", "--tp", "2", "--canary-rank", "2", NULL}, "--canary-rank"},
        {"--tp 0", {"gate", "graph-sel", "--tp", "0", NULL}, "--tp"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        if (!cases[i].argv[1]) { // `specdec gate`: the list of gates on stderr, exit 2
            char *out, *err;
            cr_expect_eq(run_cli(cases[i].argv, &out, &err), 2, "%s", cases[i].what);
            cr_expect(strstr(err, "graph-sel"), "%s: <<%s>>", cases[i].what, err);
            free(out);
            free(err);
            continue;
        }
        expect_fail(cases[i].what, cases[i].argv, 2, cases[i].needle);
    }
    const char *help[] = {"gate", "graph-sel", "--help", NULL};
    char *out = run_ok(help, NULL);
    cr_expect(strstr(out, "--canary") && strstr(out, "--json") && strstr(out, "--canary-rank"), "--help lists the options");
    free(out);
}
