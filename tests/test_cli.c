// test_cli.c — the specdec binary end to end: usage and exit codes, init determinism, forward's
// verify ≡ decode, run's JSON / trace / receipt, the receipt commands, and --tp's emulated ranks. Every case runs the
// real executable (SPECDEC_BIN) on configs/tiny.json inside a private mkdtemp folder.
#include "cli_harness.h"
#include <math.h>
#include <time.h>
#include "safetensors.h" // sd_st_open: a forward output's logits

TestSuite(cli, .init = make_dir, .fini = remove_dir, .timeout = 300);

// ---- usage ----

Test(cli, help_on_every_command) {
    static const char *const cases[][3] = {
        {"--help", NULL}, {"-h", NULL},
        {"run", "--help"}, {"init", "--help"}, {"forward", "--help"}, {"receipt", "--help"},
        {"run", "-h"}, {"init", "-h"}, {"forward", "-h"}, {"receipt", "-h"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *out, *err;
        int rc = run_cli(cases[i], &out, &err);
        cr_expect_eq(rc, 0, "`specdec %s %s` exited %d; stderr: %s", cases[i][0], cases[i][1] ? cases[i][1] : "", rc, err);
        cr_expect(strstr(out, "usage: specdec") != NULL, "`specdec %s %s`: no usage on stdout: <<%s>>",
                  cases[i][0], cases[i][1] ? cases[i][1] : "", out);
        cr_expect_str_empty(err, "`specdec %s %s`: stderr not empty: <<%s>>", cases[i][0], cases[i][1] ? cases[i][1] : "", err);
        free(out);
        free(err);
    }
}

Test(cli, help_wins_over_other_options) {
    const char *argv[] = {"forward", "--bogus", "--help", NULL};
    char *out = run_ok(argv, NULL);
    cr_expect(strstr(out, "usage: specdec forward") != NULL);
    free(out);
}

// --version: the version, then the backends compiled in and the devices this process sees.
Test(cli, version) {
    const char *argv[] = {"--version", NULL};
    char *out = run_ok(argv, NULL);
    cr_expect(strncmp(out, "specdec ", 8) == 0, "got <<%s>>", out);
    cr_expect_not_null(strstr(out, "\nbackends:\n  cpu       the reference ("), "got <<%s>>", out);
    const char *devices = strstr(out, "\ndevices:\n");
    cr_assert_not_null(devices, "got <<%s>>", out);
#ifdef SPECDEC_BUILT_CUDA_ARCHS
    cr_expect_not_null(strstr(out, "  cuda      runtime "), "got <<%s>>", out);
    cr_expect_not_null(strstr(out, "architectures " SPECDEC_BUILT_CUDA_ARCHS "\n"), "got <<%s>>", out);
    cr_expect_not_null(strstr(out, "\n  nccl      "), "got <<%s>>", out);
    cr_expect_not_null(strstr(out, "\n  cublasLt  "), "got <<%s>>", out);
    // Each visible device: "  N  NAME, compute capability X.Y, M GiB", or none at all.
    cr_expect(strstr(devices, "no CUDA device visible") || strstr(devices, ", compute capability "), "got <<%s>>", out);
#else
    cr_expect_not_null(strstr(out, "  cuda      CUDA not built"), "got <<%s>>", out);
    cr_expect_not_null(strstr(devices, "CUDA not built"), "got <<%s>>", out);
#endif
    free(out);
}

Test(cli, usage_errors_exit_2_with_one_line) {
    // Own copies: in_dir's buffers rotate.
    char m[4096], o[4096], x[4096], y[4096];
    const char *cfg = tiny_config();
    snprintf(m, sizeof m, "%s", in_dir("m"));
    snprintf(o, sizeof o, "%s", in_dir("o.st"));
    snprintf(x, sizeof x, "%s", in_dir("x"));
    snprintf(y, sizeof y, "%s", in_dir("y"));
    init_model("m", "1", NULL, NULL, NULL);
    struct { const char *what; const char *argv[16]; const char *needle; } cases[] = {
        {"unknown command", {"bogus", NULL}, "bogus"},
        {"unknown option (run)", {"run", "--model", m, "--prompt", "1", "--bogus", NULL}, "--bogus"},
        {"unknown option (init)", {"init", "--config", cfg, "--out", x, "--bogus", NULL}, "--bogus"},
        {"unknown option (forward)", {"forward", "--model", m, "--tokens", "1", "--out", o, "--bogus", NULL}, "--bogus"},
        {"unknown option (receipt)", {"receipt", "compare", o, o, "--bogus", NULL}, "--bogus"},
        {"stray argument (run)", {"run", "--model", m, "--prompt", "1", "extra", NULL}, "extra"},
        {"option without value", {"run", "--model", m, "--prompt", "1", "--max-new", NULL}, "--max-new"},
        {"init without --config", {"init", "--out", x, NULL}, "--config"},
        {"init without --out", {"init", "--config", cfg, NULL}, "--out"},
        {"forward without --out", {"forward", "--model", m, "--tokens", "1,2", NULL}, "--out"},
        {"forward without --tokens", {"forward", "--model", m, "--out", o, NULL}, "--tokens"},
        {"forward without --model", {"forward", "--tokens", "1", "--out", o, NULL}, "--model"},
        {"receipt without verb", {"receipt", NULL}, NULL},
        {"receipt unknown verb", {"receipt", "frobnicate", o, NULL}, NULL},
        {"receipt compare one file", {"receipt", "compare", o, NULL}, NULL},
        {"receipt parse no file", {"receipt", "parse", NULL}, NULL},
        {"init --draft-out without --draft-layers", {"init", "--config", cfg, "--out", x, "--draft-out", y, NULL}, NULL},
        {"run --draft without --model", {"run", "--draft", m, "--prompt", "1", NULL}, "--draft"},
        {"run --prompt and --prompt-len", {"run", "--model", m, "--prompt", "1", "--prompt-len", "4", NULL}, NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) expect_fail(cases[i].what, cases[i].argv, 2, cases[i].needle);
    cr_expect(!exists(x), "a usage error created the --out folder");
    cr_expect(!exists(o), "a usage error wrote the --out file");
}

Test(cli, bad_values_exit_2) {
    // Own copies: in_dir's buffers rotate.
    char m[4096], o[4096], x[4096], y[4096];
    const char *cfg = tiny_config();
    snprintf(m, sizeof m, "%s", in_dir("m"));
    snprintf(o, sizeof o, "%s", in_dir("o.st"));
    snprintf(x, sizeof x, "%s", in_dir("x"));
    snprintf(y, sizeof y, "%s", in_dir("y"));
    init_model("m", "1", NULL, NULL, NULL);
    struct { const char *what; const char *argv[16]; const char *needle; } cases[] = {
        {"--seed -1", {"init", "--config", cfg, "--out", x, "--seed", "-1", NULL}, "--seed"},
        {"--seed junk", {"init", "--config", cfg, "--out", x, "--seed", "12ab", NULL}, "--seed"},
        {"--dtype f64", {"init", "--config", cfg, "--out", x, "--dtype", "f64", NULL}, "--dtype"},
        {"--draft-layers 0", {"init", "--config", cfg, "--out", x, "--draft-out", y, "--draft-layers", "0", NULL}, "--draft-layers"},
        {"--tail-scale -1", {"init", "--config", cfg, "--out", x, "--draft-out", y, "--draft-layers", "2", "--tail-scale", "-1", NULL}, "--tail-scale"},
        {"--k 0", {"run", "--model", m, "--draft", m, "--k", "0", "--prompt", "1", NULL}, "--k"},
        {"--k 17", {"run", "--model", m, "--draft", m, "--k", "17", "--prompt", "1", NULL}, "--k"},
        {"--temperature -1", {"run", "--model", m, "--prompt", "1", "--temperature", "-1", NULL}, "--temperature"},
        {"--temperature nan", {"run", "--model", m, "--prompt", "1", "--temperature", "nan", NULL}, "--temperature"},
        {"--max-new 0", {"run", "--model", m, "--prompt", "1", "--max-new", "0", NULL}, "--max-new"},
        {"--trace 3", {"run", "--model", m, "--prompt", "1", "--trace", "3", NULL}, "--trace"},
        {"--backend tpu", {"run", "--model", m, "--prompt", "1", "--backend", "tpu", NULL}, "--backend"},
        {"--prompt 1,,2", {"run", "--model", m, "--prompt", "1,,2", NULL}, "--prompt"},
        {"--tokens 1,,2", {"forward", "--model", m, "--tokens", "1,,2", "--out", o, NULL}, "--tokens"},
        {"--tokens x", {"forward", "--model", m, "--tokens", "x", "--out", o, NULL}, "--tokens"},
        {"--tokens -1", {"forward", "--model", m, "--tokens", "-1", "--out", o, NULL}, "--tokens"},
        {"--mode sideways", {"forward", "--model", m, "--tokens", "1", "--out", o, "--mode", "sideways", NULL}, "--mode"},
        {"--chunk 0", {"forward", "--model", m, "--tokens", "1", "--out", o, "--mode", "verify", "--chunk", "0", NULL}, "--chunk"},
        {"--tol -1", {"receipt", "compare", o, o, "--tol", "-1", NULL}, "--tol"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) expect_fail(cases[i].what, cases[i].argv, 2, cases[i].needle);
    cr_expect(!exists(x), "a bad value still created the --out folder");
    cr_expect(!exists(o), "a bad value still wrote the --out file");
}

// A trailing comma is junk like an empty field: sd_parse_int_list means to reject it (its
// "trailing comma" branch) but breaks out of the loop with nothing left to parse, so "1,2," is
// read as [1, 2]. Expectation: exit 2 and no output, as for "1,,2".
Test(cli, token_list_with_trailing_comma_exit_2) {
    char m[4096], o[4096];
    snprintf(m, sizeof m, "%s", in_dir("m"));
    snprintf(o, sizeof o, "%s", in_dir("o.st"));
    init_model("m", "1", NULL, NULL, NULL);
    const char *fwd[] = {"forward", "--model", m, "--tokens", "1,2,", "--out", o, NULL};
    const char *run[] = {"run", "--model", m, "--prompt", "1,2,", "--max-new", "2", NULL};
    expect_fail("forward --tokens 1,2,", fwd, 2, "--tokens");
    expect_fail("run --prompt 1,2,", run, 2, "--prompt");
    cr_expect(!exists(o), "--tokens 1,2, still wrote the --out file");
}

// ---- data errors ----

Test(cli, missing_model_dir_exit_1_naming_it) {
    const char *nodir = in_dir("no-such-model");
    const char *run[] = {"run", "--model", nodir, "--prompt", "1", "--max-new", "2", NULL};
    const char *fwd[] = {"forward", "--model", nodir, "--tokens", "1", "--out", in_dir("o.st"), NULL};
    expect_fail("run, missing model dir", run, 1, nodir);
    expect_fail("forward, missing model dir", fwd, 1, nodir);
    cr_expect(!exists(in_dir("o.st")));
}

Test(cli, missing_config_file_exit_1_naming_it) {
    const char *argv[] = {"init", "--config", in_dir("nope.json"), "--out", in_dir("x"), NULL};
    expect_fail("init, missing config", argv, 1, "nope.json");
    cr_expect(!exists(in_dir("x")));
}

Test(cli, corrupt_config_exit_1_naming_it) {
    write_file(in_dir("bad.json"), "{\"vocab_size\": \n");
    const char *argv[] = {"init", "--config", in_dir("bad.json"), "--out", in_dir("x"), NULL};
    expect_fail("init, corrupt config", argv, 1, "bad.json");
    cr_expect(!exists(in_dir("x")));

    // A model folder whose config.json is corrupt.
    init_model("m", "1", NULL, NULL, NULL);
    write_file(in_dir("m/config.json"), "{oops");
    const char *run[] = {"run", "--model", in_dir("m"), "--prompt", "1", "--max-new", "2", NULL};
    const char *fwd[] = {"forward", "--model", in_dir("m"), "--tokens", "1", "--out", in_dir("o.st"), NULL};
    expect_fail("run, corrupt model config", run, 1, "config.json");
    expect_fail("forward, corrupt model config", fwd, 1, "config.json");
    cr_expect(!exists(in_dir("o.st")));
}

Test(cli, truncated_weights_exit_1_naming_them) {
    init_model("m", "1", NULL, NULL, NULL);
    size_t n;
    char *w = read_file(in_dir("m/model.safetensors"), &n);
    cr_assert_not_null(w);
    FILE *f = fopen(in_dir("m/model.safetensors"), "wb");
    cr_assert_not_null(f);
    fwrite(w, 1, n / 2, f);
    fclose(f);
    free(w);
    const char *run[] = {"run", "--model", in_dir("m"), "--prompt", "1", "--max-new", "2", NULL};
    expect_fail("run, truncated weights", run, 1, "model.safetensors");
}

// Where no GPU serves (CI: no device, or a build without CUDA) --backend cuda is a clear error,
// never a silent CPU run. On a GPU machine the GPU suites cover the cuda backend instead.
Test(cli, backend_cuda_not_available) {
    if (system("nvidia-smi -L > /dev/null 2>&1") == 0) cr_skip_test("a GPU is visible: covered by the GPU suites");
    init_model("m", "1", NULL, NULL, NULL);
    const char *run[] = {"run", "--model", in_dir("m"), "--prompt", "1", "--max-new", "2", "--backend", "cuda", NULL};
    const char *fwd[] = {"forward", "--model", in_dir("m"), "--tokens", "1", "--out", in_dir("o.st"), "--backend", "cuda", NULL};
    expect_fail("run --backend cuda", run, 1, "not available");
    expect_fail("forward --backend cuda", fwd, 1, "not available");
    cr_expect(!exists(in_dir("o.st")));
}

// ---- init ----

Test(cli, init_same_seed_same_bytes_other_seed_other_bytes) {
    init_model("a", "7", NULL, NULL, NULL);
    init_model("b", "7", NULL, NULL, NULL);
    init_model("c", "8", NULL, NULL, NULL);
    cr_expect(same_bytes(in_dir("a/model.safetensors"), in_dir("b/model.safetensors")), "same seed, different weights");
    cr_expect(same_bytes(in_dir("a/config.json"), in_dir("b/config.json")), "same seed, different config.json");
    cr_expect(!same_bytes(in_dir("a/model.safetensors"), in_dir("c/model.safetensors")), "seeds 7 and 8 wrote the same weights");
    cr_expect_eq(count_tmp_files(), 0);
}

Test(cli, init_default_seed_is_0_and_f32_differs_from_bf16) {
    const char *def[] = {"init", "--config", tiny_config(), "--out", in_dir("def"), NULL};
    const char *f32[] = {"init", "--config", tiny_config(), "--out", in_dir("f32"), "--dtype", "f32", NULL};
    free(run_ok(def, NULL));
    init_model("zero", "0", NULL, NULL, NULL);
    free(run_ok(f32, NULL));
    cr_expect(same_bytes(in_dir("def/model.safetensors"), in_dir("zero/model.safetensors")));
    cr_expect(!same_bytes(in_dir("def/model.safetensors"), in_dir("f32/model.safetensors")));
}

Test(cli, init_with_draft_writes_both_dirs) {
    init_model("t", "3", "d", "2", "0.5");
    const char *files[] = {"t/config.json", "t/model.safetensors", "d/config.json", "d/model.safetensors"};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) cr_expect(exists(in_dir(files[i])), "%s missing", files[i]);
    cJSON *tc = parse_json_file(in_dir("t/config.json")), *dc = parse_json_file(in_dir("d/config.json"));
    cr_expect_eq((int)num(tc, "num_hidden_layers"), TINY_LAYERS);
    cr_expect_eq((int)num(dc, "num_hidden_layers"), 2);
    cr_expect_eq((int)num(dc, "vocab_size"), (int)num(tc, "vocab_size"), "draft and target vocabularies differ");
    cJSON_Delete(tc);
    cJSON_Delete(dc);
    cr_expect_eq(count_tmp_files(), 0);
}

// --draft-out naming the --out directory, however it is spelled, would write the draft over the
// target: refused before anything is written.
Test(cli, init_draft_out_equal_to_out_is_refused) {
    cr_assert_eq(mkdir(in_dir("real"), 0755), 0);
    char real[4096], link[4096];
    snprintf(real, sizeof real, "%s", in_dir("real"));
    snprintf(link, sizeof link, "%s", in_dir("link"));
    cr_assert_eq(symlink(real, link), 0);
    char m[4096], spell[4][4096];
    snprintf(m, sizeof m, "%s", in_dir("m"));
    snprintf(spell[0], sizeof spell[0], "%s", m);
    snprintf(spell[1], sizeof spell[1], "%s/m/", dir);
    snprintf(spell[2], sizeof spell[2], "%s/./x/../m", dir);
    snprintf(spell[3], sizeof spell[3], "%s//m/.", dir);
    for (int i = 0; i < 4; i++) {
        const char *argv[] = {"init", "--config", tiny_config(), "--out", m, "--draft-out", spell[i], "--draft-layers", "2", NULL};
        expect_fail(spell[i], argv, 2, "the draft would overwrite the target");
    }
    cr_expect(!exists(in_dir("m")), "a refused init wrote %s", in_dir("m"));
    const char *sym[] = {"init", "--config", tiny_config(), "--out", real, "--draft-out", link, "--draft-layers", "2", NULL};
    expect_fail("--draft-out a symbolic link to --out", sym, 2, "the draft would overwrite the target");
    cr_expect(!exists(in_dir("real/model.safetensors")), "a refused init wrote the target");
}

// "wrote" comes once everything is written: a draft that cannot be written fails the command
// without a "wrote" line for the target before it.
Test(cli, init_says_wrote_only_after_everything_is_written) {
    char *err;
    const char *ok[] = {"init", "--config", tiny_config(), "--out", in_dir("t"), "--draft-out", in_dir("d"), "--draft-layers", "2", NULL};
    free(run_ok(ok, &err));
    const char *t = strstr(err, "wrote "), *d = strstr(err, "wrote draft ");
    cr_expect(t && d && t < d && count_lines(err) == 2, "target then draft: <<%s>>", err);
    free(err);

    write_file(in_dir("file"), "not a directory\n");
    char bad[4096];
    snprintf(bad, sizeof bad, "%s/file/d", dir);
    const char *fail[] = {"init", "--config", tiny_config(), "--out", in_dir("t2"), "--draft-out", bad, "--draft-layers", "2", NULL};
    expect_fail("draft under a regular file", fail, 1, bad);
    char *out;
    run_cli(fail, &out, &err);
    cr_expect_null(strstr(err, "wrote"), "a failed init said it wrote: <<%s>>", err);
    free(out);
    free(err);
}

// An option given twice is a usage error naming it, for every command (never "the last wins").
Test(cli, an_option_given_twice_is_named) {
    init_model("m", "1", NULL, NULL, NULL);
    char m[4096];
    snprintf(m, sizeof m, "%s", in_dir("m"));
    struct { const char *what; const char *argv[16]; const char *needle; } cases[] = {
        {"run --k twice", {"run", "--model", m, "--draft", m, "--k", "2", "--k", "3", NULL}, "'--k' given twice"},
        {"run --json twice", {"run", "--model", m, "--json", "--json", NULL}, "'--json' given twice"},
        {"demo --seed twice", {"--seed", "1", "--seed", "1", NULL}, "'--seed' given twice"},
        {"run --tp twice", {"run", "--model", m, "--tp", "2", "--tp", "2", NULL}, "'--tp' given twice"},
        {"init --out twice", {"init", "--config", tiny_config(), "--out", m, "--out", m, NULL}, "'--out' given twice"},
        {"forward --tokens twice", {"forward", "--model", m, "--tokens", "1", "--tokens", "2", "--out", in_dir("f"), NULL},
         "'--tokens' given twice"},
        {"receipt --tol twice", {"receipt", "compare", m, m, "--tol", "1", "--tol", "2", NULL}, "'--tol' given twice"},
        {"gate --canary twice", {"gate", "graph-sel", "--canary", "--canary", NULL}, "'--canary' given twice"},
        {"twice, the second without its value", {"run", "--model", m, "--max-new", "3", "--max-new", NULL}, "'--max-new' given twice"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) expect_fail(cases[i].what, cases[i].argv, 2, cases[i].needle);
    cr_expect(!exists(in_dir("f")), "a refused forward wrote its output");
}

// ---- forward ----

// The safetensors header of a forward output: logits F32 [T, V] and tokens I32 [T].
static void check_forward_file(const char *path, int T) {
    size_t n;
    char *b = read_file(path, &n);
    cr_assert_not_null(b, "%s missing", path);
    cr_assert_gt(n, 8);
    uint64_t hl = 0;
    for (int i = 7; i >= 0; i--) hl = hl << 8 | (unsigned char)b[i];
    cr_assert_leq(8 + hl, n);
    cJSON *h = cJSON_ParseWithLength(b + 8, (size_t)hl);
    cr_assert_not_null(h, "%s: header is not JSON", path);
    const cJSON *lg = cJSON_GetObjectItemCaseSensitive(h, "logits"), *tk = cJSON_GetObjectItemCaseSensitive(h, "tokens");
    cr_assert_not_null(lg, "no 'logits' tensor");
    cr_assert_not_null(tk, "no 'tokens' tensor");
    cr_expect_str_eq(cJSON_GetObjectItemCaseSensitive(lg, "dtype")->valuestring, "F32");
    cr_expect_str_eq(cJSON_GetObjectItemCaseSensitive(tk, "dtype")->valuestring, "I32");
    const cJSON *ls = cJSON_GetObjectItemCaseSensitive(lg, "shape"), *ts = cJSON_GetObjectItemCaseSensitive(tk, "shape");
    cr_expect_eq(cJSON_GetArraySize(ls), 2);
    cr_expect_eq(cJSON_GetArrayItem(ls, 0)->valueint, T);
    cr_expect_eq(cJSON_GetArrayItem(ls, 1)->valueint, TINY_VOCAB);
    cr_expect_eq(cJSON_GetArraySize(ts), 1);
    cr_expect_eq(cJSON_GetArrayItem(ts, 0)->valueint, T);
    cJSON_Delete(h);
    free(b);
}

Test(cli, forward_decode_and_verify_are_byte_identical) {
    init_model("m", "1", NULL, NULL, NULL);
    const char *toks = "5,17,63,0,42,8,8,31";
    const char *dec[] = {"forward", "--model", in_dir("m"), "--tokens", toks, "--out", in_dir("dec.st"), NULL};
    const char *dec2[] = {"forward", "--model", in_dir("m"), "--tokens", toks, "--mode", "decode", "--out", in_dir("dec2.st"), NULL};
    const char *ver[] = {"forward", "--model", in_dir("m"), "--tokens", toks, "--mode", "verify", "--chunk", "3", "--out", in_dir("ver.st"), NULL};
    const char *ver8[] = {"forward", "--model", in_dir("m"), "--tokens", toks, "--mode", "verify", "--chunk", "8", "--out", in_dir("ver8.st"), NULL};
    free(run_ok(dec, NULL));
    free(run_ok(dec2, NULL));
    free(run_ok(ver, NULL));
    free(run_ok(ver8, NULL));
    check_forward_file(in_dir("dec.st"), 8);
    cr_expect(same_bytes(in_dir("dec.st"), in_dir("dec2.st")), "default mode differs from --mode decode");
    cr_expect(same_bytes(in_dir("dec.st"), in_dir("ver.st")), "verify --chunk 3 differs from decode (verify ≡ decode)");
    cr_expect(same_bytes(in_dir("dec.st"), in_dir("ver8.st")), "verify --chunk 8 differs from decode (verify ≡ decode)");
    cr_expect_eq(count_tmp_files(), 0);
}

// The CPU has no prefill entry: a prompt longer than SD_PREFILL_TOKEN_PATH_MAX (40 > 32 tokens)
// still runs as forwards of --chunk tokens, so --mode prefill is decode bit for bit there.
Test(cli, forward_prefill_on_the_cpu_is_the_token_path) {
    init_model("m", "1", NULL, NULL, NULL);
    const char *toks = "5,17,63,0,42,8,8,31,1,2,3,4,5,6,7,9,10,11,12,13,14,15,16,18,19,20,21,22,23,24,25,26,27,28,29,30,"
                       "32,33,34,35";
    const char *dec[] = {"forward", "--backend", "cpu", "--model", in_dir("m"), "--tokens", toks, "--out", in_dir("dec.st"), NULL};
    const char *pre[] = {"forward", "--backend", "cpu", "--model", in_dir("m"), "--tokens", toks, "--mode", "prefill",
                         "--out", in_dir("pre.st"), NULL};
    free(run_ok(dec, NULL));
    free(run_ok(pre, NULL));
    check_forward_file(in_dir("pre.st"), 40);
    cr_expect(same_bytes(in_dir("dec.st"), in_dir("pre.st")), "--mode prefill on the CPU differs from decode");
    cr_expect_eq(count_tmp_files(), 0);
}

Test(cli, forward_token_outside_vocab_leaves_no_file) {
    init_model("m", "1", NULL, NULL, NULL);
    const char *dec[] = {"forward", "--model", in_dir("m"), "--tokens", "1,2,64", "--out", in_dir("o.st"), NULL};
    const char *ver[] = {"forward", "--model", in_dir("m"), "--tokens", "1,2,64", "--mode", "verify", "--chunk", "3", "--out", in_dir("o.st"), NULL};
    expect_fail("forward decode, token 64 of 64", dec, 1, "64");
    cr_expect(!exists(in_dir("o.st")), "an output file was left after the failure");
    cr_expect_eq(count_tmp_files(), 0, "a *.tmp.* file was left after the failure");
    expect_fail("forward verify, token 64 of 64", ver, 1, "64");
    cr_expect(!exists(in_dir("o.st")), "an output file was left after the failure");
    cr_expect_eq(count_tmp_files(), 0, "a *.tmp.* file was left after the failure");
}

// ---- run ----

Test(cli, run_plain_json) {
    init_model("m", "1", NULL, NULL, NULL);
    const char *argv[] = {"run", "--model", in_dir("m"), "--prompt", "1,2,3", "--max-new", "8", "--json", NULL};
    char *out = run_ok(argv, NULL);
    cJSON *j = parse_run_json(out);
    int tok[64];
    int n = json_tokens(j, tok, 64);
    cr_expect_eq(n, 8);
    for (int i = 0; i < n; i++) cr_expect(tok[i] >= 0 && tok[i] < TINY_VOCAB, "token %d = %d outside 0..%d", i, tok[i], TINY_VOCAB - 1);
    cr_expect_gt(num(j, "tokens_per_s"), 0.0);
    cJSON_Delete(j);
    free(out);
}

Test(cli, run_is_deterministic_and_human_output_lists_tokens) {
    init_model("m", "1", NULL, NULL, NULL);
    const char *js[] = {"run", "--model", in_dir("m"), "--prompt-len", "5", "--seed", "9", "--max-new", "6", "--temperature", "0.8", "--json", NULL};
    char *a = run_ok(js, NULL), *b = run_ok(js, NULL);
    cJSON *ja = parse_run_json(a), *jb = parse_run_json(b);
    int ta[16], tb[16];
    int na = json_tokens(ja, ta, 16), nb = json_tokens(jb, tb, 16);
    cr_expect_eq(na, 6);
    cr_expect_eq(nb, 6);
    cr_expect_arr_eq(ta, tb, sizeof(int) * 6, "same seed, different sampled tokens");
    cJSON_Delete(ja);
    cJSON_Delete(jb);
    free(a);
    free(b);

    const char *human[] = {"run", "--model", in_dir("m"), "--prompt", "1,2,3", "--max-new", "4", NULL};
    char *out = run_ok(human, NULL);
    cr_expect(strstr(out, "tokens") != NULL, "human output: <<%s>>", out);
    free(out);
}

Test(cli, run_prompt_outside_vocab_exit_1) {
    init_model("m", "1", NULL, NULL, NULL);
    const char *argv[] = {"run", "--model", in_dir("m"), "--prompt", "1,64", "--max-new", "2", NULL};
    expect_fail("run, prompt token 64 of 64", argv, 1, "64");
}

// Plain and speculative runs of the same prompt with the derived draft (tail-scale 0).
static void spec_pair(cJSON **plain, cJSON **spec) {
    init_model("t", "1", "d", "2", "0");
    const char *p[] = {"run", "--model", in_dir("t"), "--prompt", "1,2,3", "--max-new", "8", "--json", NULL};
    const char *s[] = {"run", "--model", in_dir("t"), "--draft", in_dir("d"), "--k", "3", "--prompt", "1,2,3",
                       "--max-new", "8", "--json", NULL};
    char *po = run_ok(p, NULL), *so = run_ok(s, NULL);
    *plain = parse_run_json(po);
    *spec = parse_run_json(so);
    free(po);
    free(so);
}

Test(cli, run_spec_json_has_metrics_and_greedy_tokens) {
    cJSON *plain, *spec;
    spec_pair(&plain, &spec);
    int tp[16], ts[16];
    int np = json_tokens(plain, tp, 16), ns = json_tokens(spec, ts, 16);
    cr_expect_eq(np, 8);
    cr_expect_eq(ns, 8);
    cr_expect_arr_eq(tp, ts, sizeof(int) * 8, "speculative greedy tokens differ from plain greedy (spec ≡ greedy)");
    const double rounds = num(spec, "rounds"), drafted = num(spec, "drafted"), accepted = num(spec, "accepted");
    const double rate = num(spec, "acceptance_rate"), mal = num(spec, "mean_accepted_length");
    cr_expect_gt(num(spec, "tokens_per_s"), 0.0);
    cr_expect_geq(rounds, 1.0);
    cr_expect_eq(drafted, 3.0 * rounds, "drafted %g != k * rounds %g", drafted, 3.0 * rounds);
    cr_expect_leq(accepted, drafted);
    cr_expect_leq(rate, 1.0);
    cr_expect_geq(rate, 0.0);
    cr_expect(drafted > 0 && rate == accepted / drafted, "acceptance_rate %g != accepted/drafted %g", rate, accepted / drafted);
    cr_expect(mal >= 1.0 && mal <= 4.0, "mean_accepted_length %g outside 1..k+1", mal);
    const cJSON *pp = cJSON_GetObjectItemCaseSensitive(spec, "per_position");
    cr_assert(cJSON_IsArray(pp), "per_position missing");
    cr_expect_eq(cJSON_GetArraySize(pp), 3);
    cr_expect(cJSON_GetObjectItemCaseSensitive(plain, "rounds") == NULL, "plain run reports rounds");
    cJSON_Delete(plain);
    cJSON_Delete(spec);
}

// With tail-scale 0 the target's layers past the draft's write nothing to the residual stream,
// so the draft is the target and every drafted token is accepted (the brief's requirement).
Test(cli, run_spec_tail_scale_0_accepts_every_draft) {
    cJSON *plain, *spec;
    spec_pair(&plain, &spec);
    const double rate = num(spec, "acceptance_rate");
    cr_expect_eq(rate, 1.0, "tail-scale 0: acceptance_rate %g, expected 1 (accepted %g of %g drafted)", rate,
                 num(spec, "accepted"), num(spec, "drafted"));
    const cJSON *pp = cJSON_GetObjectItemCaseSensitive(spec, "per_position"), *e;
    int i = 0;
    cJSON_ArrayForEach(e, pp) cr_expect_eq(e->valuedouble, 1.0, "per_position[%d] = %g, expected 1", i++, e->valuedouble);
    cJSON_Delete(plain);
    cJSON_Delete(spec);
}

Test(cli, trace_lines_and_tag) {
    init_model("t", "1", "d", "2", "0");
    const char *t1[] = {"run", "--model", in_dir("t"), "--draft", in_dir("d"), "--k", "3", "--prompt", "1,2,3", "--max-new", "8",
                        "--trace", "1", NULL};
    const char *t2[] = {"run", "--model", in_dir("t"), "--draft", in_dir("d"), "--k", "3", "--prompt", "1,2,3", "--max-new", "8",
                        "--trace", "2", NULL};
    const char *tag[] = {"run", "--model", in_dir("t"), "--draft", in_dir("d"), "--k", "3", "--prompt", "1,2,3", "--max-new", "8",
                         "--trace", "1", "--trace-tag", "foo", NULL};
    char *err;
    free(run_ok(t1, &err));
    cr_expect(strstr(err, "[spec-phase] rounds=") != NULL, "--trace 1: no [spec-phase] line: <<%s>>", err);
    cr_expect(strstr(err, "k=3") != NULL, "--trace 1: k not in the line: <<%s>>", err);
    cr_expect(strstr(err, "[spec-phase-v]") == NULL, "--trace 1 printed the level-2 line: <<%s>>", err);
    free(err);
    free(run_ok(t2, &err));
    cr_expect(strstr(err, "[spec-phase] rounds=") != NULL, "--trace 2: no [spec-phase] line: <<%s>>", err);
    cr_expect(strstr(err, "[spec-phase-v] rounds=") != NULL, "--trace 2: no [spec-phase-v] line: <<%s>>", err);
    free(err);
    free(run_ok(tag, &err));
    cr_expect(strstr(err, "[foo-phase] rounds=") != NULL, "--trace-tag foo: no [foo-phase] line: <<%s>>", err);
    cr_expect(strstr(err, "[spec-phase]") == NULL, "--trace-tag foo still printed [spec-phase]: <<%s>>", err);
    free(err);
}

// ---- receipts ----

// A speculative run with --trace 2 and --receipt dir/name; returns its stderr (the trace log).
static char *run_with_receipt(const char *name) {
    init_model("t", "1", "d", "2", "0.5");
    const char *argv[] = {"run", "--model", in_dir("t"), "--draft", in_dir("d"), "--k", "3", "--prompt", "1,2,3", "--max-new", "12",
                          "--trace", "2", "--receipt", in_dir(name), NULL};
    char *err;
    free(run_ok(argv, &err));
    return err;
}

Test(cli, receipt_written_env_then_burst) {
    free(run_with_receipt("r.jsonl"));
    cr_expect_eq(count_tmp_files(), 0);
    char *txt = read_file(in_dir("r.jsonl"), NULL);
    cr_assert_not_null(txt, "no receipt written");
    cr_expect_geq(count_lines(txt), 2, "receipt: <<%s>>", txt);
    char *nl = strchr(txt, '\n');
    cr_assert_not_null(nl);
    *nl = '\0';
    cJSON *env = cJSON_Parse(txt);
    cr_assert_not_null(env, "first receipt line is not JSON: <<%s>>", txt);
    const cJSON *kind = cJSON_GetObjectItemCaseSensitive(env, "kind");
    cr_expect(cJSON_IsString(kind) && !strcmp(kind->valuestring, "env"), "first line is not kind env: <<%s>>", txt);
    cr_expect_eq((int)num(env, "k"), 3);
    cJSON_Delete(env);
    char *second = nl + 1, *nl2 = strchr(second, '\n');
    if (nl2) *nl2 = '\0';
    cJSON *burst = cJSON_Parse(second);
    cr_assert_not_null(burst, "second receipt line is not JSON: <<%s>>", second);
    kind = cJSON_GetObjectItemCaseSensitive(burst, "kind");
    cr_expect(cJSON_IsString(kind) && !strcmp(kind->valuestring, "burst"), "second line is not kind burst: <<%s>>", second);
    cJSON_Delete(burst);
    free(txt);
}

Test(cli, receipt_parse_of_a_trace_log) {
    char *log = run_with_receipt("r.jsonl");
    write_file(in_dir("run.log"), log);
    free(log);
    const char *argv[] = {"receipt", "parse", in_dir("run.log"), NULL};
    char *out = run_ok(argv, NULL);
    cr_expect_eq(count_lines(out), 1, "expected one burst line: <<%s>>", out);
    cJSON *j = cJSON_Parse(out);
    cr_assert_not_null(j, "not JSON: <<%s>>", out);
    const cJSON *kind = cJSON_GetObjectItemCaseSensitive(j, "kind");
    cr_expect(cJSON_IsString(kind) && !strcmp(kind->valuestring, "burst"), "not a burst line: <<%s>>", out);
    cr_expect_eq((int)num(j, "k"), 3);
    cr_expect_gt(num(j, "draft_ms"), 0.0);
    cJSON_Delete(j);
    free(out);

    const char *missing[] = {"receipt", "parse", in_dir("no.log"), NULL};
    expect_fail("receipt parse, missing log", missing, 1, "no.log");
}

// Copy a receipt with every burst's draft_ms multiplied by `factor`.
static void doctor_receipt(const char *from, const char *to, double factor) {
    char *txt = read_file(from, NULL);
    cr_assert_not_null(txt);
    FILE *f = fopen(to, "w");
    cr_assert_not_null(f);
    int doctored = 0;
    for (char *line = strtok(txt, "\n"); line; line = strtok(NULL, "\n")) {
        cJSON *j = cJSON_Parse(line);
        cr_assert_not_null(j, "receipt line is not JSON: <<%s>>", line);
        cJSON *d = cJSON_GetObjectItemCaseSensitive(j, "draft_ms");
        if (cJSON_IsNumber(d)) { cJSON_SetNumberValue(d, d->valuedouble * factor); doctored++; }
        char *s = cJSON_PrintUnformatted(j);
        fprintf(f, "%s\n", s);
        free(s);
        cJSON_Delete(j);
    }
    fclose(f);
    free(txt);
    cr_assert_gt(doctored, 0, "no draft_ms in %s", from);
}

Test(cli, receipt_compare_self_passes_doctored_fails) {
    free(run_with_receipt("r.jsonl"));
    const char *r = in_dir("r.jsonl"), *bad = in_dir("bad.jsonl");
    const char *same[] = {"receipt", "compare", r, r, NULL};
    char *out = run_ok(same, NULL);
    cr_expect(strstr(out, "draft") != NULL, "compare prints no draft row: <<%s>>", out);
    free(out);

    doctor_receipt(r, bad, 20.0);
    const char *cmp[] = {"receipt", "compare", r, bad, "--tol", "0.5", NULL};
    char *err;
    int rc = run_cli(cmp, &out, &err);
    cr_expect_eq(rc, 1, "doctored receipt: exit %d, expected 1; stderr: %s", rc, err);
    cr_expect(strstr(out, "draft") != NULL, "compare prints no draft row: <<%s>>", out);
    cr_expect_eq(count_lines(err), 1, "expected one stderr line: <<%s>>", err);
    free(out);
    free(err);

    const char *missing[] = {"receipt", "compare", r, in_dir("none.jsonl"), NULL};
    expect_fail("receipt compare, missing B", missing, 1, "none.jsonl");
}

// ---- tensor-parallel ranks (--tp: emulated on the CPU) ----

// The logits of a forward output (T × TINY_VOCAB floats; caller frees).
static float *forward_logits(const char *path, int T) {
    sd_st_file f;
    sd_status st = {0};
    cr_assert_eq(sd_st_open(path, &f, &st), SD_OK, "%s", st.msg);
    const sd_st_tensor *t = sd_st_find(&f, "logits");
    cr_assert_not_null(t);
    cr_assert_eq(t->nbytes, sizeof(float) * (size_t)T * TINY_VOCAB);
    float *lg = malloc(t->nbytes);
    memcpy(lg, t->data, t->nbytes);
    sd_st_close(&f);
    return lg;
}

// init --json: one object on stdout naming both folders, and the "wrote" lines still on stderr.
Test(cli, init_json_names_what_it_wrote) {
    const char *argv[] = {"init", "--config", tiny_config(), "--out", in_dir("t"), "--draft-out", in_dir("d"),
                          "--draft-layers", "1", "--seed", "5", "--json", NULL};
    char *err = NULL;
    char *out = run_ok(argv, &err);
    cJSON *j = parse_run_json(out);
    cr_expect_str_eq(cJSON_GetObjectItem(j, "out")->valuestring, in_dir("t"));
    cr_expect_str_eq(cJSON_GetObjectItem(j, "draft")->valuestring, in_dir("d"));
    cr_expect_eq(num(j, "draft_layers"), 1);
    cr_expect_eq(num(j, "seed"), 5);
    cr_expect_gt(num(j, "tensors"), 0);
    cr_expect_gt(num(j, "bytes"), 0);
    cr_expect_str_eq(cJSON_GetObjectItem(j, "dtype")->valuestring, "bf16");
    cr_expect(err && strstr(err, "wrote"), "<<%s>>", err ? err : "");
    cJSON_Delete(j);
    free(out);
    free(err);
}

// forward --json: one object naming what it wrote, and each position's argmax is the argmax
// (the lower id on ties) of that row of the file.
Test(cli, forward_json_matches_the_file) {
    init_model("m", "1", NULL, NULL, NULL);
    const char *argv[] = {"forward", "--model", in_dir("m"), "--tokens", "5,17,63,0", "--mode", "verify", "--chunk", "2",
                          "--out", in_dir("j.st"), "--json", NULL};
    char *out = run_ok(argv, NULL);
    cJSON *j = parse_run_json(out);
    free(out);
    cr_expect_str_eq(cJSON_GetObjectItem(j, "out")->valuestring, in_dir("j.st"));
    cr_expect_eq(num(j, "positions"), 4);
    cr_expect_eq(num(j, "vocab"), TINY_VOCAB);
    cr_expect_str_eq(cJSON_GetObjectItem(j, "mode")->valuestring, "verify");
    cr_expect_str_eq(cJSON_GetObjectItem(j, "backend")->valuestring, "cpu");
    const cJSON *am = cJSON_GetObjectItem(j, "argmax");
    cr_assert_eq(cJSON_GetArraySize(am), 4);
    float *lg = forward_logits(in_dir("j.st"), 4);
    for (int t = 0; t < 4; t++) {
        int best = 0;
        for (int v = 1; v < TINY_VOCAB; v++)
            if (lg[(size_t)t * TINY_VOCAB + v] > lg[(size_t)t * TINY_VOCAB + best]) best = v;
        cr_expect_eq((int)cJSON_GetArrayItem(am, t)->valuedouble, best, "position %d", t);
    }
    free(lg);
    cJSON_Delete(j);
}

// 3 ranks: verify ≡ decode byte for byte; against one device within MODEL.md's tolerance (and
// not the same bytes: the sums ran in another order); one rank: the same bytes as no --tp.
Test(cli, forward_tp_verify_equals_decode_near_one_device) {
    init_model("m", "1", NULL, NULL, NULL);
    const char *toks = "5,17,63,0,42,8,8,31,2,9";
    const char *one[] = {"forward", "--model", in_dir("m"), "--tokens", toks, "--out", in_dir("one.st"), NULL};
    const char *tp1[] = {"forward", "--model", in_dir("m"), "--tokens", toks, "--tp", "1", "--out", in_dir("tp1.st"), NULL};
    const char *dec[] = {"forward", "--model", in_dir("m"), "--tokens", toks, "--backend", "cpu", "--tp", "3", "--out", in_dir("dec.st"), NULL};
    const char *ver[] = {"forward", "--model", in_dir("m"), "--tokens", toks, "--mode", "verify", "--chunk", "5", "--tp", "3",
                         "--out", in_dir("ver.st"), NULL};
    char *err;
    free(run_ok(one, NULL));
    free(run_ok(tp1, NULL));
    free(run_ok(dec, &err));
    cr_expect(strstr(err, "cpu, 3 ranks") != NULL, "%s", err);
    free(err);
    free(run_ok(ver, NULL));
    cr_expect(same_bytes(in_dir("one.st"), in_dir("tp1.st")), "--tp 1 differs from one device");
    cr_expect(same_bytes(in_dir("dec.st"), in_dir("ver.st")), "--tp 3: verify --chunk 5 differs from decode");
    float *a = forward_logits(in_dir("one.st"), 10), *b = forward_logits(in_dir("dec.st"), 10);
    double num2 = 0, den2 = 0;
    for (int i = 0; i < 10 * TINY_VOCAB; i++) {
        num2 += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        den2 += (double)a[i] * a[i];
    }
    cr_expect_leq(sqrt(num2 / den2), 1e-4, "--tp 3 against one device: relative error %.3g", sqrt(num2 / den2));
    cr_expect_gt(num2, 0.0, "--tp 3 gave one device's bytes: not sharded?");
    free(a);
    free(b);
}

Test(cli, run_tp_greedy_tokens_layout_and_spec) {
    init_model("t", "1", "d", "2", "0.5");
    const char *one[] = {"run", "--model", in_dir("t"), "--prompt", "1,2,3", "--max-new", "12", "--json", NULL};
    const char *tp[] = {"run", "--model", in_dir("t"), "--prompt", "1,2,3", "--max-new", "12", "--json", "--tp", "3", NULL};
    const char *spec[] = {"run", "--model", in_dir("t"), "--draft", in_dir("d"), "--k", "3", "--prompt", "1,2,3",
                          "--max-new", "12", "--json", "--tp", "3", NULL};
    char *o1 = run_ok(one, NULL), *o3 = run_ok(tp, NULL), *os = run_ok(spec, NULL);
    cJSON *j1 = parse_run_json(o1), *j3 = parse_run_json(o3), *js = parse_run_json(os);
    int t1[16], t3[16], ts[16];
    cr_assert_eq(json_tokens(j1, t1, 16), 12);
    cr_assert_eq(json_tokens(j3, t3, 16), 12);
    cr_assert_eq(json_tokens(js, ts, 16), 12);
    cr_expect_arr_eq(t3, t1, sizeof t1[0] * 12, "3 ranks' greedy tokens differ from one device's");
    cr_expect_arr_eq(ts, t3, sizeof t1[0] * 12, "3 ranks: speculative tokens differ from plain greedy (spec ≡ greedy)");
    cr_expect_eq((int)num(j1, "ranks"), 1);
    cr_expect_eq((int)num(j3, "ranks"), 3);
    const cJSON *layout = cJSON_GetObjectItemCaseSensitive(j3, "layout");
    cr_expect(cJSON_IsString(layout) && strstr(layout->valuestring, "3 ranks: r0 kda 0-0 mla 0-0") == layout->valuestring &&
                  strstr(layout->valuestring, "r2 kda - mla -"), "layout: %s", cJSON_IsString(layout) ? layout->valuestring : "-");
    cJSON_Delete(j1);
    cJSON_Delete(j3);
    cJSON_Delete(js);
    free(o1);
    free(o3);
    free(os);
}

// The watchdog through the binary: a rank that stops answering ends the run with exit 1 and one
// line naming it, within a bounded time — never a hang.
Test(cli, run_tp_stopped_rank_exits_1_naming_it) {
    init_model("t", "1", "d", "2", "0.5");
    const char *argv[] = {"run", "--model", in_dir("t"), "--draft", in_dir("d"), "--k", "3", "--prompt", "1,2,3",
                          "--max-new", "12", "--tp", "3", "--tp-timeout", "1", "--tp-stop", "2:40", NULL};
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    expect_fail("run --tp 3 with rank 2 stopped", argv, 1, "tp: rank 2 did not reach all-reduce #40 (layer 2 mixer) within 1 s");
    clock_gettime(CLOCK_MONOTONIC, &t1);
    const double secs = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    cr_expect_lt(secs, 10.0, "the failing run took %.1f s", secs);
    const char *env[] = {"forward", "--model", in_dir("t"), "--tokens", "1,2,3", "--tp", "2", "--tp-stop", "1:3",
                         "--out", in_dir("o.st"), NULL};
    setenv("SPECDEC_TP_TIMEOUT", "1", 1);
    expect_fail("forward --tp 2 with rank 1 stopped", env, 1, "tp: rank 1 did not reach all-reduce #3 (layer 1 mixer) within 1 s");
    unsetenv("SPECDEC_TP_TIMEOUT");
    cr_expect(!exists(in_dir("o.st")), "a failed forward left its output");
}

Test(cli, tp_usage_errors) {
    init_model("m", "1", NULL, NULL, NULL);
    const char *m = in_dir("m");
    const struct { const char *argv[16]; int code; const char *needle; } cases[] = {
        {{"run", "--model", m, "--tp", "0", NULL}, 2, "--tp must be an integer in 1..64"},
        {{"run", "--model", m, "--tp", "65", NULL}, 2, "--tp must be an integer in 1..64"},
        {{"run", "--model", m, "--tp-timeout", "3", NULL}, 2, "--tp-timeout needs --tp"},
        {{"forward", "--model", m, "--tokens", "1", "--out", "x", "--tp-stop", "1:2", NULL}, 2, "--tp-stop needs --tp"},
        {{"run", "--model", m, "--tp", "3", "--tp-stop", "3:1", NULL}, 2, "--tp-stop (rank) must be an integer in 0..2"},
        {{"run", "--model", m, "--tp", "3", "--tp-stop", "x", NULL}, 2, "--tp-stop must be RANK:COLLECTIVE"},
        {{"run", "--model", m, "--tp", "3", "--tp-timeout", "0", NULL}, 2, "--tp-timeout must be a number"},
        {{"run", "--model", m, "--rank", "0", NULL}, 2, "--rank needs --tp"},
        {{"run", "--model", m, "--tp", "2", "--rank", "0", NULL}, 2, "--rank and --nccl-id come together"},
        {{"run", "--model", m, "--tp", "2", "--nccl-id", "f", NULL}, 2, "--rank and --nccl-id come together"},
        {{"run", "--model", m, "--tp", "2", "--rank", "2", "--nccl-id", "f", NULL}, 2, "--rank must be an integer in 0..1"},
        {{"forward", "--model", m, "--tokens", "1", "--out", "x", "--backend", "cpu", "--tp", "2", "--rank", "1", "--nccl-id", "f",
          NULL}, 2, "--rank needs --backend cuda"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) expect_fail(cases[i].argv[3], cases[i].argv, cases[i].code, cases[i].needle);
    setenv("SPECDEC_TP_TIMEOUT", "soon", 1);
    const char *env[] = {"run", "--model", m, "--tp", "2", NULL};
    expect_fail("SPECDEC_TP_TIMEOUT=soon", env, 2, "SPECDEC_TP_TIMEOUT must be a number");
    unsetenv("SPECDEC_TP_TIMEOUT");
}

// A receipt of a --tp run names its rank layout (null for one device).
Test(cli, receipt_names_the_rank_layout) {
    init_model("t", "1", "d", "2", "0.5");
    for (int tp = 0; tp <= 1; tp++) {
        const char *argv[] = {"run", "--model", in_dir("t"), "--draft", in_dir("d"), "--k", "2", "--prompt", "1,2,3", "--max-new", "6",
                              "--receipt", in_dir("r.jsonl"), tp ? "--tp" : NULL, "2", NULL};
        char *err;
        free(run_ok(argv, &err));
        free(err);
        char *txt = read_file(in_dir("r.jsonl"), NULL);
        cr_assert_not_null(txt);
        *strchr(txt, '\n') = '\0';
        cJSON *env = cJSON_Parse(txt);
        cr_assert_not_null(env);
        const cJSON *layout = cJSON_GetObjectItemCaseSensitive(env, "tp_layout");
        if (tp) cr_expect(cJSON_IsString(layout) && strstr(layout->valuestring, "2 ranks: r0 kda 0-0"), "%s", txt);
        else cr_expect(cJSON_IsNull(layout), "%s", txt);
        cJSON_Delete(env);
        free(txt);
    }
}
