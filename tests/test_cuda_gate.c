// test_cuda_gate.c — the decode-graph door and the graph-selection gate through the real binary on
// the GPU: `gate graph-sel --backend cuda` passes on the demo pair for k = 1..8 greedy, sampled and
// plain, and fails naming the slot when the canary is planted; `run --graph` emits the eager run's
// tokens (speculative greedy and sampled, plain) at trace levels 0, 1 and 2, and its receipt says
// the door was open. Without a device every test reports itself skipped.
#include "cli_harness.h"

#if !SPECDEC_HAVE_CUDA
Test(cuda_gate, suite) { cr_skip_test("CUDA backend not built (no toolkit or -DSPECDEC_CUDA=OFF): GPU suite skipped"); }
#else
#include "cuda_backend.h" // sd_cuda_device_count

static void need_gpu(void) {
    if (sd_cuda_device_count() == 0) cr_skip_test("no CUDA device: GPU suite skipped");
}

TestSuite(cuda_gate, .init = make_dir, .fini = remove_dir, .timeout = 600);

static const cJSON *item(const cJSON *j, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, key);
    cr_assert_not_null(v, "JSON key '%s' missing", key);
    return v;
}

static cJSON *gate(const char *k, const char *temperature, bool canary, int *rc) {
    const char *argv[] = {"gate", "graph-sel", "--backend", "cuda", "--tokens", "48", "--k", k, "--temperature", temperature,
                          "--json", canary ? "--canary" : NULL, NULL};
    char *out, *err;
    *rc = run_cli(argv, &out, &err);
    cJSON *j = parse_run_json(out);
    free(out);
    free(err);
    return j;
}

Test(cuda_gate, graph_sel_passes_on_every_device_for_k_1_to_8) {
    need_gpu();
    const char *ks[] = {"1", "2", "3", "4", "5", "6", "7", "8"};
    for (size_t i = 0; i < sizeof ks / sizeof ks[0]; i++)
        for (int sampled = 0; sampled < 2; sampled++) {
            int rc;
            cJSON *j = gate(ks[i], sampled ? "0.8" : "0", false, &rc);
            cr_expect_eq(rc, 0, "k = %s %s: the gate failed", ks[i], sampled ? "sampled" : "greedy");
            cr_expect_eq(cJSON_GetArraySize(item(j, "devices")), sd_cuda_device_count(), "one verdict set per device");
            const cJSON *d;
            cJSON_ArrayForEach(d, item(j, "devices")) {
                cr_expect(cJSON_IsTrue(item(d, "pass")), "k = %s device %d", ks[i], (int)num(d, "device"));
                cr_expect_gt(num(d, "entries_graph"), 0, "the recorder inside the graphs ran");
                cr_expect_eq(num(d, "rows_eager"), num(d, "rows_graph"));
            }
            cJSON_Delete(j);
        }
    int rc;
    cJSON *plain = gate("0", "0", false, &rc);
    cr_expect_eq(rc, 0, "plain decode steps through the door");
    cJSON_Delete(plain);
}

Test(cuda_gate, the_canary_fails_the_gate_at_its_slot) {
    need_gpu();
    int rc;
    cJSON *j = gate("4", "0", true, &rc);
    cr_expect_eq(rc, 1, "a planted canary must fail the gate");
    const cJSON *d = cJSON_GetArrayItem(item(j, "devices"), 0), *first = item(d, "first_divergence");
    cr_assert(cJSON_IsObject(first), "no divergence reported");
    cr_expect_eq(num(first, "layer"), num(item(d, "canary"), "layer"));
    cr_expect_eq(num(first, "token"), num(item(d, "canary"), "token"));
    cJSON_Delete(j);
}

// --tp over every device (rank r on device r, over NCCL; N = 1 on a one-GPU machine): each rank's
// door against its own eager oracle, and the ranks' routing alike; a canary rank is caught when
// there are two ranks or more.
Test(cuda_gate, graph_sel_under_a_device_group) {
    need_gpu();
    const int n = sd_cuda_device_count();
    char ranks[16], last[16];
    snprintf(ranks, sizeof ranks, "%d", n);
    snprintf(last, sizeof last, "%d", n - 1);
    const char *argv[] = {"gate", "graph-sel", "--backend", "cuda", "--tokens", "32", "--k", "3", "--tp", ranks, "--json", NULL};
    char *out, *err;
    int rc = run_cli(argv, &out, &err);
    cr_expect_eq(rc, 0, "--tp %d: exit %d: %s", n, rc, err);
    cJSON *j = parse_run_json(out);
    free(out);
    free(err);
    cr_expect_eq(cJSON_GetArraySize(item(j, "devices")), n, "one verdict set per rank");
    const cJSON *d;
    cJSON_ArrayForEach(d, item(j, "devices")) {
        cr_expect(cJSON_IsTrue(item(d, "pass")), "rank %d", (int)num(d, "rank"));
        cr_expect_gt(num(d, "rows_graph"), 0, "rank %d: the recorder inside its graphs ran", (int)num(d, "rank"));
    }
    cr_expect(cJSON_IsTrue(item(item(j, "ranks"), "pass")));
    cJSON_Delete(j);
    if (n < 2) return; // one rank agrees with itself: the canary rank needs two
    const char *canary[] = {"gate", "graph-sel", "--backend", "cuda", "--tokens", "32", "--k", "3", "--tp", ranks,
                            "--canary-rank", last, "--json", NULL};
    rc = run_cli(canary, &out, &err);
    cr_expect_eq(rc, 1, "a canary rank must fail the gate");
    j = parse_run_json(out);
    free(out);
    free(err);
    cr_expect_eq(num(item(j, "ranks"), "rank"), n - 1, "the cross-rank verdict names the canary rank");
    cJSON_Delete(j);
}

// `run` on the demo with extra options: its tokens.
static int run_tokens(const char *const *extra, int *tokens, cJSON **json) {
    const char *argv[24] = {"run", "--backend", "cuda", "--max-new", "40", "--json"};
    int n = 6;
    for (; extra && *extra; extra++) argv[n++] = *extra;
    argv[n] = NULL;
    char *out = run_ok(argv, NULL);
    cJSON *j = parse_run_json(out);
    free(out);
    const int got = json_tokens(j, tokens, 64);
    if (json) *json = j;
    else cJSON_Delete(j);
    return got;
}

Test(cuda_gate, run_graph_emits_the_eager_tokens) {
    need_gpu();
    const struct { const char *what; const char *extra[6]; } modes[] = {
        {"speculative greedy", {NULL}},
        {"speculative sampled", {"--temperature", "0.7", "--seed", "5", NULL}},
        {"plain greedy", {"--plain", NULL}},
        {"speculative greedy, trace 1", {"--trace", "1", NULL}},
        {"speculative sampled, trace 2", {"--trace", "2", "--temperature", "0.7", NULL}},
    };
    for (size_t i = 0; i < sizeof modes / sizeof modes[0]; i++) {
        int eager[64], graph[64];
        const char *with_graph[8] = {0};
        int n = 0;
        for (; modes[i].extra[n]; n++) with_graph[n] = modes[i].extra[n];
        with_graph[n] = "--graph";
        cJSON *gj;
        const int ne = run_tokens(modes[i].extra, eager, NULL), ng = run_tokens(with_graph, graph, &gj);
        cr_expect_eq(ne, ng, "%s: %d tokens eager, %d through the door", modes[i].what, ne, ng);
        cr_expect_arr_eq(eager, graph, sizeof(int) * (size_t)(ne < ng ? ne : ng), "%s: the door's tokens differ", modes[i].what);
        cr_expect(cJSON_IsTrue(item(gj, "decode_graph")), "%s: --json says the door was open", modes[i].what);
        cJSON_Delete(gj);
    }
    // The ledger armed in a real run: its recorder fires in every graph, for every layer and token.
    setenv("SPECDEC_GRAPH_SEL_LEDGER", "1", 1);
    const char *armed[] = {"run", "--backend", "cuda", "--graph", "--max-new", "40", NULL};
    char *err;
    free(run_ok(armed, &err));
    unsetenv("SPECDEC_GRAPH_SEL_LEDGER");
    cr_expect(strstr(err, "every slot written"), "<<%s>>", err);
    free(err);
    const char *receipt[] = {"run", "--backend", "cuda", "--graph", "--max-new", "24", "--receipt", in_dir("r.jsonl"), NULL};
    free(run_ok(receipt, NULL));
    char *txt = read_file(in_dir("r.jsonl"), NULL);
    cr_assert_not_null(txt);
    cr_expect(strstr(txt, "\"decode_graph\":true"), "the receipt's env line records the open door: <<%.300s>>", txt);
    free(txt);
}
#endif
