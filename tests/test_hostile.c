// test_hostile.c — the reproducers of hostile inputs, one case per class: a config whose sizes
// overflow or exceed the engine's bounds (refused naming the key, before anything is allocated),
// a latent width that once sized a stack array, FIFOs where files are read, non-finite config
// values and activations (the error names the layer), output paths that are not regular files,
// writes that fail or are interrupted (nothing left behind), and values with control characters
// (errors stay one line). Every crash a fuzzer finds (fuzz/, scripts/fuzz) becomes a case here.
#include <criterion/criterion.h>
#include <criterion/parameterized.h>
#include <cjson/cJSON.h>
#include <math.h>
#include <signal.h>
#include <time.h>
#include "cli_harness.h"
#include "atomic_file.h" // sd_atomic_open, sd_atomic_commit
#include "cleanup.h"     // sd_cleanup_run
#include "common.h"      // synth_from, src_path
#include "sizes.h"       // sd_mem_fit, SD_MAX_TENSORS

TestSuite(hostile, .init = make_dir, .fini = remove_dir, .timeout = 60);

// ---------------------------------------------------------------------------------------------
// configs/tiny.json with up to four keys set (dotted keys live in linear_attn_config), as text.

typedef struct {
    const char *key, *value; // value: JSON text
} kv;

static char *tiny_with(const kv *set, int n) {
    char *text = read_file(src_path("configs/tiny.json"), NULL);
    cr_assert_not_null(text);
    cJSON *doc = cJSON_Parse(text);
    free(text);
    cr_assert_not_null(doc);
    for (int i = 0; i < n && set[i].key; i++) {
        cJSON *obj = doc;
        const char *leaf = set[i].key, *dot = strchr(leaf, '.');
        if (dot) {
            obj = cJSON_GetObjectItemCaseSensitive(doc, "linear_attn_config");
            leaf = dot + 1;
        }
        // A number beyond double range goes in as its text (cJSON would print inf as null).
        cJSON *v = strstr(set[i].value, "e999") ? cJSON_CreateRaw(set[i].value) : cJSON_Parse(set[i].value);
        if (cJSON_GetObjectItemCaseSensitive(obj, leaf)) cJSON_ReplaceItemInObjectCaseSensitive(obj, leaf, v);
        else cJSON_AddItemToObject(obj, leaf, v);
    }
    char *out = cJSON_Print(doc);
    cJSON_Delete(doc);
    return out;
}

#define LA "linear_attn_config."

typedef struct {
    const char *what;
    kv set[4];
    const char *expect; // substring of the one-line message
} config_case;

static const config_case config_cases[] = {
    {"heads x head_dim overflows int", {{LA "num_heads", "65536"}, {LA "head_dim", "65536"}},
     "key 'linear_attn_config.num_heads': num_heads x head_dim x 3 (a KDA conv row) must be <= 2147483647"},
    {"a KDA state d x d x heads overflows int", {{LA "num_heads", "64"}, {LA "head_dim", "8192"}},
     "key 'linear_attn_config.head_dim': head_dim x head_dim (a KDA state) must be <= 2147483647"},
    {"MLA query width overflows int", {{"num_attention_heads", "1048576"}, {"qk_nope_head_dim", "4096"}},
     "key 'num_attention_heads': num_attention_heads x (qk_nope_head_dim + qk_rope_head_dim)"},
    {"MLA absorbed width heads x latent overflows int", {{"num_attention_heads", "65536"}, {"kv_lora_rank", "65536"}},
     "key 'num_attention_heads': num_attention_heads x kv_lora_rank"},
    {"latent + rope wraps int", {{"kv_lora_rank", "2147483647"}, {"qk_rope_head_dim", "2"}, {"num_attention_heads", "1"}},
     "key 'kv_lora_rank': kv_lora_rank + qk_rope_head_dim"},
    {"shared experts x width overflows int", {{"num_shared_experts", "65536"}, {"moe_intermediate_size", "65536"}},
     "key 'num_shared_experts': num_shared_experts x moe_intermediate_size"},
    {"vocab x hidden beyond the model bound", {{"vocab_size", "2147483647"}, {"hidden_size", "1048576"}},
     "key 'vocab_size': the model's weights (F32) would need"},
    {"a million experts: the table is bounded before it grows", {{"num_experts", "1000000"}},
     "key 'num_experts': the model would hold"},
    {"widths whose sum would wrap size_t", {{"hidden_size", "2147483647"}, {"intermediate_size", "2147483647"},
                                            {"moe_intermediate_size", "2147483647"}},
     "the model's weights"},
    {"rope_theta 1e999 (parses to infinity)", {{"rope_theta", "1e999"}}, "key 'rope_theta': must be a finite number, got inf"},
    {"rms_norm_eps 1e999", {{"rms_norm_eps", "1e999"}}, "key 'rms_norm_eps': must be a number > 0 (float32), got inf"},
    {"routed_scaling_factor -1e999", {{"routed_scaling_factor", "-1e999"}}, "key 'routed_scaling_factor'"},
};

ParameterizedTestParameters(hostile, config_refused) {
    static int idx[sizeof config_cases / sizeof config_cases[0]];
    for (size_t i = 0; i < sizeof idx / sizeof idx[0]; i++) idx[i] = (int)i;
    return cr_make_param_array(int, idx, sizeof idx / sizeof idx[0]);
}

// Refused with SD_ERR_DATA, the key named, one line, and at once: the sizes come from the config
// alone, so nothing is allocated first (a million experts once cost 1.5 GB and 9 s).
ParameterizedTest(int *index, hostile, config_refused) {
    const config_case *k = &config_cases[*index];
    char *json = tiny_with(k->set, 4);
    sd_config c;
    sd_status st = {0};
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    sd_code rc = sd_config_parse(json, "hostile.json", &c, &st);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    free(json);
    cr_expect_eq(rc, SD_ERR_DATA, "%s: accepted (code %d): %s", k->what, rc, st.msg);
    cr_expect(strstr(st.msg, k->expect), "%s: message lacks <<%s>>: %s", k->what, k->expect, st.msg);
    cr_expect(!strchr(st.msg, '\n'), "%s: not one line: %s", k->what, st.msg);
    const double s = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    cr_expect(s < 0.5, "%s: the refusal took %.2f s", k->what, s);
}

// A key holding a NUL escape is refused, not read under its shorter name (cJSON keeps keys as C
// strings: "rope_theta\u0000x" would be rope_theta).
Test(hostile, nul_escape_in_config_key) {
    char *text = read_file(src_path("configs/tiny.json"), NULL);
    cr_assert_not_null(text);
    char *at = strstr(text, "\"rope_theta\"");
    cr_assert_not_null(at);
    size_t n = strlen(text);
    char *patched = malloc(n + 16);
    snprintf(patched, n + 16, "%.*s\"rope_theta\\u0000x\"%s", (int)(at - text), text, at + strlen("\"rope_theta\""));
    sd_config c;
    sd_status st = {0};
    cr_expect_eq(sd_config_parse(patched, "nul-key.json", &c, &st), SD_ERR_DATA, "accepted: %s", patched);
    cr_expect(strstr(st.msg, "nul-key.json: invalid JSON: a \\u0000 (NUL) escape at byte"), "%s", st.msg);
    free(patched);
    free(text);
}

// Every config the reader accepts is one the writer writes back to an accepted config (the class
// where `init` wrote a config that specdec then refused): an extreme but finite theta.
Test(hostile, accepted_config_writes_back) {
    const kv set[1] = {{"rope_theta", "1e300"}};
    char *json = tiny_with(set, 1);
    sd_config c, back;
    sd_status st = {0};
    cr_assert_eq(sd_config_parse(json, "big-theta.json", &c, &st), SD_OK, "%s", st.msg);
    char *out = sd_config_to_json(&c);
    cr_assert_not_null(out);
    cr_expect_eq(sd_config_parse(out, "written.json", &back, &st), SD_OK, "the written config is refused: %s", st.msg);
    cr_expect_eq(back.rope_theta, 1e300);
    free(out);
    free(json);
}

// A state whose byte count overflows 64 bits is refused before any allocation; one beyond this
// host's memory names both sizes.
Test(hostile, state_sizes_checked) {
    sd_config c;
    load_config("configs/tiny.json", &c);
    sd_state s;
    sd_status st = {0};
    c.vocab_size = 2147483647; // logits scratch: max_T x V floats
    sd_code rc = sd_state_init(&s, &c, 2147483647, 2147483647, &st);
    cr_expect(rc == SD_ERR_DATA || rc == SD_ERR_UNSUPPORTED, "a wrapping state was not refused (%d): %s", rc, st.msg);
    cr_expect(strstr(st.msg, "state"), "%s", st.msg);
    rc = sd_state_init(&s, &c, 1 << 30, 64, &st); // finite, but ~8 PiB of latents
    cr_expect_eq(rc, SD_ERR_UNSUPPORTED, "%d: %s", rc, st.msg);
    cr_expect(strstr(st.msg, "the state's caches and scratch need") && strstr(st.msg, "this host has"), "%s", st.msg);
}

Test(hostile, mem_fit_message) {
    sd_status st = {0};
    cr_expect_eq(sd_mem_fit(3ull << 30, 1ull << 30, "the weights", "this host", &st), SD_ERR_UNSUPPORTED);
    cr_expect_str_eq(st.msg, "the weights need 3.0 GiB, this host has 1.0 GiB");
    cr_expect_eq(sd_mem_fit(1, 2, "x", "y", &st), SD_OK);
    cr_expect_eq(sd_mem_fit(5, 0, "x", "y", &st), SD_OK, "unknown memory (0) is no refusal");
}

// A latent width of 2.5 M floats (10 MiB) once sized a stack array in the CPU MLA (stack
// overflow past the 8 MiB main stack); the forward now runs from the state's scratch.
Test(hostile, large_latent_width_forward) {
    const kv set[4] = {{"kv_lora_rank", "2621440"}, {"hidden_size", "8"}, {"num_attention_heads", "1"},
                       {"num_hidden_layers", "1"}};
    char *json = tiny_with(set, 4);
    cJSON *doc = cJSON_Parse(json);
    free(json);
    cJSON *la = cJSON_GetObjectItemCaseSensitive(doc, "linear_attn_config");
    cJSON_ReplaceItemInObjectCaseSensitive(la, "kda_layers", cJSON_CreateArray());
    cJSON_ReplaceItemInObjectCaseSensitive(la, "full_attn_layers", cJSON_Parse("[1]"));
    cJSON_ReplaceItemInObjectCaseSensitive(doc, "qk_nope_head_dim", cJSON_CreateNumber(2));
    cJSON_ReplaceItemInObjectCaseSensitive(doc, "v_head_dim", cJSON_CreateNumber(2));
    json = cJSON_Print(doc);
    cJSON_Delete(doc);
    sd_config c;
    sd_status st = {0};
    cr_assert_eq(sd_config_parse(json, "wide-latent.json", &c, &st), SD_OK, "%s", st.msg);
    free(json);
    sd_synth_opts o = {.seed = 3, .dtype = SD_DT_BF16, .tail_from = SD_MAX_LAYERS, .tail_scale = 1.0f};
    sd_model m;
    cr_assert_eq(sd_synth_model(&m, &c, &o, &st), SD_OK, "%s", st.msg);
    sd_state s;
    cr_assert_eq(sd_model_state_init(&m, &s, 2, 2, &st), SD_OK, "%s", st.msg);
    const int tokens[2] = {1, 2};
    float logits[2 * 64];
    cr_expect_eq(sd_forward(&m, &s, tokens, 2, logits, 0, NULL, &st), SD_OK, "%s", st.msg);
    for (int i = 0; i < 2 * 64; i++) cr_assert(isfinite(logits[i]), "logit %d is %g", i, logits[i]);
    sd_state_free(&s);
    sd_model_free(&m);
}

// ---------------------------------------------------------------------------------------------
// Files that are not regular files: refused at once (a FIFO's open once blocked forever).

Test(hostile, fifo_as_config) {
    const char *p = in_dir("config.json");
    cr_assert_eq(mkfifo(p, 0600), 0, "mkfifo: %s", strerror(errno));
    sd_config c;
    sd_status st = {0};
    cr_expect_eq(sd_config_load(p, &c, &st), SD_ERR_SYS);
    cr_expect(strstr(st.msg, p) && strstr(st.msg, "not a regular file (a FIFO)"), "%s", st.msg);
}

Test(hostile, fifo_as_weights) {
    init_model("m", "1", NULL, NULL, NULL);
    const char *w = in_dir("m/model.safetensors");
    cr_assert_eq(unlink(w), 0);
    cr_assert_eq(mkfifo(w, 0600), 0, "mkfifo: %s", strerror(errno));
    sd_model m;
    sd_status st = {0};
    cr_expect_eq(sd_model_load(&m, in_dir("m"), &st), SD_ERR_SYS);
    cr_expect(strstr(st.msg, "model.safetensors: not a regular file (a FIFO)"), "%s", st.msg);
}

Test(hostile, fifo_and_directory_as_prompt_file) {
    init_model("m", "1", NULL, NULL, NULL);
    const char *f = in_dir("prompt");
    cr_assert_eq(mkfifo(f, 0600), 0);
    const char *argv[] = {"run", "--model", in_dir("m"), "--prompt-file", f, "--backend", "cpu", "--plain", NULL};
    expect_fail("--prompt-file FIFO", argv, 1, "not a regular file (a FIFO)");
    const char *argv2[] = {"run", "--model", in_dir("m"), "--prompt-file", dir, "--backend", "cpu", "--plain", NULL};
    expect_fail("--prompt-file folder", argv2, 1, "not a regular file (a directory)");
}

// A FIFO as a shard index, or as a receipt to parse or compare: refused at once, naming it.
Test(hostile, fifo_as_index_and_as_receipt) {
    init_model("m", "1", NULL, NULL, NULL);
    const char *w = in_dir("m/model.safetensors"), *ix = in_dir("m/model.safetensors.index.json");
    cr_assert_eq(unlink(w), 0);
    cr_assert_eq(mkfifo(ix, 0600), 0, "mkfifo: %s", strerror(errno));
    sd_model m;
    sd_status st = {0};
    cr_expect_eq(sd_model_load(&m, in_dir("m"), &st), SD_ERR_SYS);
    cr_expect(strstr(st.msg, "model.safetensors.index.json: not a regular file (a FIFO)"), "%s", st.msg);
    const char *r = in_dir("receipt.jsonl");
    cr_assert_eq(mkfifo(r, 0600), 0);
    const char *parse[] = {"receipt", "parse", r, NULL};
    expect_fail("receipt parse FIFO", parse, 1, "not a regular file (a FIFO)");
    const char *cmp[] = {"receipt", "compare", r, r, NULL};
    expect_fail("receipt compare FIFO", cmp, 1, "not a regular file (a FIFO)");
}

// ---------------------------------------------------------------------------------------------
// Non-finite activations: a NaN planted in one weight of one layer fails the forward naming that
// layer; the state is left as it was.

typedef enum { PLANT_KDA_O, PLANT_MLA_O, PLANT_POST_NORM, PLANT_EMBED, PLANT_HEAD } plant_at;

typedef struct {
    plant_at at;
    int layer;
    float value;
    const char *expect;
} plant_case;

static const plant_case plant_cases[] = {
    {PLANT_KDA_O, 1, NAN, "non-finite activations first at layer 1 (after the mixer)"},
    {PLANT_MLA_O, 2, INFINITY, "non-finite activations first at layer 2 (after the mixer)"},
    {PLANT_POST_NORM, 3, NAN, "non-finite activations first at layer 3 (after the ffn)"},
    {PLANT_POST_NORM, 0, -INFINITY, "non-finite activations first at layer 0 (after the ffn)"},
    {PLANT_EMBED, -1, NAN, "non-finite activations first at the embedding (the token's row)"},
    {PLANT_HEAD, -1, INFINITY, "non-finite logits (after the head)"},
};

// tiny.json: KDA layers 0, 1, 3, MLA layer 2 (0-based); F32 matrices, so one element is one float.
static void plant(sd_model *m, const plant_case *k, int token) {
    sd_layer_weights *ly = k->layer >= 0 ? &m->w.layers[k->layer] : NULL;
    switch (k->at) {
    case PLANT_KDA_O: ((float *)ly->kda.o.data)[5] = k->value; break;
    case PLANT_MLA_O: ((float *)ly->mla.o.data)[3] = k->value; break;
    case PLANT_POST_NORM: ly->post_norm[0] = k->value; break;
    case PLANT_EMBED: ((float *)m->w.embed.data)[(size_t)token * m->cfg.hidden_size] = k->value; break;
    case PLANT_HEAD: ((float *)m->w.lm_head.data)[7] = k->value; break;
    }
}

ParameterizedTestParameters(hostile, nonfinite_names_the_layer) {
    static int idx[sizeof plant_cases / sizeof plant_cases[0]];
    for (size_t i = 0; i < sizeof idx / sizeof idx[0]; i++) idx[i] = (int)i;
    return cr_make_param_array(int, idx, sizeof idx / sizeof idx[0]);
}

ParameterizedTest(int *index, hostile, nonfinite_names_the_layer) {
    const plant_case *k = &plant_cases[*index];
    sd_model m;
    synth_from("configs/tiny.json", 5, 0, SD_MAX_LAYERS, 1.0f, &m);
    cr_assert_eq(m.cfg.mixer[2], SD_MIXER_MLA);
    sd_state s;
    sd_status st = {0};
    cr_assert_eq(sd_model_state_init(&m, &s, 16, 4, &st), SD_OK, "%s", st.msg);
    const int prompt[3] = {3, 4, 5}, next[2] = {6, 7};
    cr_assert_eq(sd_prefill(&m, &s, prompt, 3, NULL, &st), SD_OK, "%s", st.msg);
    char before[65], after[65];
    sd_state_live_hash(&s, before);
    plant(&m, k, next[0]);
    float logits[2 * 64];
    int argmax[2] = {-1, -1};
    sd_forward_opts o = {.argmax = argmax};
    cr_expect_eq(sd_forward(&m, &s, next, 2, logits, 0, &o, &st), SD_ERR_NONFINITE, "no error: %s", st.msg);
    cr_expect_str_eq(st.msg, k->expect);
    cr_expect_eq(s.pending, 0, "a failed forward left %d positions pending", s.pending);
    sd_state_live_hash(&s, after);
    cr_expect_str_eq(after, before, "a failed forward changed the live state");
    cr_expect_eq(argmax[0], -1, "an argmax was written from non-finite logits");
    sd_state_free(&s);
    sd_model_free(&m);
}

// The CLI: a plain run and a speculative run of a model with one NaN weight exit 1 with the layer
// named (they once printed token 0 forever, and reported 100% acceptance).
Test(hostile, run_and_spec_refuse_nonfinite) {
    init_model("t", "2", "d", "2", "1");
    sd_model m;
    sd_status st = {0};
    cr_assert_eq(sd_model_load(&m, in_dir("t"), &st), SD_OK, "%s", st.msg);
    const sd_mat *o = &m.w.layers[1].kda.o;
    if (o->dtype == SD_DT_BF16) ((uint16_t *)o->data)[9] = 0x7fc0; // a bf16 NaN
    else ((float *)o->data)[9] = NAN;
    cr_assert_eq(sd_model_save(&m, in_dir("t"), NULL, &st), SD_OK, "%s", st.msg);
    sd_model_free(&m);
    const char *plain[] = {"run", "--model", in_dir("t"), "--prompt", "1,2,3", "--max-new", "4", "--backend", "cpu", "--plain", NULL};
    expect_fail("plain run", plain, 1, "non-finite activations first at layer 1 (after the mixer)");
    const char *spec[] = {"run", "--model", in_dir("t"), "--draft", in_dir("d"), "--prompt", "1,2,3", "--max-new", "8",
                          "--backend", "cpu", NULL};
    char *out, *err;
    int rc = run_cli(spec, &out, &err);
    cr_expect_eq(rc, 1, "speculative run exited %d: %s", rc, err);
    cr_expect(strstr(err, "non-finite activations first at layer 1 (after the mixer)"), "%s", err);
    cr_expect(!strstr(out, "100"), "a speculative run reported acceptance: %s", out);
    free(out);
    free(err);
}

// ---------------------------------------------------------------------------------------------
// Outputs: an existing path that is not a regular file is refused, never replaced.

Test(hostile, init_out_symlink_refused) {
    const char *target = in_dir("elsewhere");
    write_file(target, "keep me");
    const char *link = in_dir("link");
    cr_assert_eq(symlink(target, link), 0);
    const char *argv[] = {"init", "--config", tiny_config(), "--out", link, NULL};
    expect_fail("init --out symlink", argv, 2, "a symbolic link");
    struct stat sb;
    cr_expect(lstat(link, &sb) == 0 && S_ISLNK(sb.st_mode), "the link was replaced");
    char *text = read_file(target, NULL);
    cr_expect_str_eq(text, "keep me");
    free(text);
}

Test(hostile, init_into_folder_with_fifo_refused) {
    const char *m = in_dir("m");
    cr_assert_eq(mkdir(m, 0755), 0);
    cr_assert_eq(mkfifo(in_dir("m/config.json"), 0600), 0);
    const char *argv[] = {"init", "--config", tiny_config(), "--out", m, NULL};
    expect_fail("init over a FIFO config.json", argv, 2, "a FIFO");
    struct stat sb;
    cr_expect(lstat(in_dir("m/config.json"), &sb) == 0 && S_ISFIFO(sb.st_mode), "the FIFO was replaced");
    cr_expect(!exists(in_dir("m/model.safetensors")), "weights written without a config");
}

Test(hostile, forward_out_device_and_fifo_refused) {
    init_model("m", "1", NULL, NULL, NULL);
    const char *argv[] = {"forward", "--model", in_dir("m"), "--tokens", "1,2", "--out", "/dev/null", "--backend", "cpu", NULL};
    expect_fail("forward --out /dev/null", argv, 2, "a character device");
    struct stat sb;
    cr_expect(stat("/dev/null", &sb) == 0 && S_ISCHR(sb.st_mode), "/dev/null is no longer a device");
    const char *f = in_dir("fifo.safetensors");
    cr_assert_eq(mkfifo(f, 0600), 0);
    const char *argv2[] = {"forward", "--model", in_dir("m"), "--tokens", "1,2", "--out", f, "--backend", "cpu", NULL};
    expect_fail("forward --out FIFO", argv2, 2, "a FIFO");
}

Test(hostile, atomic_open_refuses_non_regular) {
    sd_atomic_file a;
    sd_status st = {0};
    const char *f = in_dir("receipt.jsonl");
    cr_assert_eq(mkfifo(f, 0600), 0);
    cr_expect_eq(sd_atomic_open(&a, f, &st), SD_ERR_USAGE, "%s", st.msg);
    cr_expect(strstr(st.msg, "a FIFO"), "%s", st.msg);
    cr_expect_eq(sd_atomic_open(&a, "/dev/null", &st), SD_ERR_USAGE, "%s", st.msg);
    cr_expect_eq(sd_atomic_open(&a, dir, &st), SD_ERR_USAGE, "%s", st.msg);
    cr_expect_eq(count_tmp_files(), 0);
}

// A failed multi-file write leaves nothing: the draft's folder cannot be created, so neither the
// target nor the draft appears (and no temporary stays).
Test(hostile, failed_init_leaves_nothing) {
    const char *argv[] = {"init", "--config", tiny_config(), "--out", in_dir("t"), "--draft-out", in_dir("no/such/d"),
                          "--draft-layers", "2", NULL};
    char *out, *err;
    int rc = run_cli(argv, &out, &err);
    cr_expect_eq(rc, 1, "exit %d: %s", rc, err);
    cr_expect_eq(count_lines(err), 1, "%s", err);
    cr_expect(!exists(in_dir("t")), "the target was written though the draft failed");
    cr_expect_eq(count_tmp_files(), 0, "a temporary stayed behind");
    free(out);
    free(err);
}

// The pid of a process that has exited (reaped: no process holds it now).
static long dead_pid(void) {
    pid_t p = fork();
    cr_assert(p >= 0);
    if (p == 0) _exit(0);
    waitpid(p, NULL, 0);
    return (long)p;
}

// Temporaries of a run that was killed outright do not accumulate: the next write to the same
// target removes them (a file, and a staged model folder).
Test(hostile, stale_temporaries_swept) {
    const long pid = dead_pid();
    char stale[4200], stage[4200], inner[4300];
    snprintf(stale, sizeof stale, "%s.tmp.%ld", in_dir("out.json"), pid);
    write_file(stale, "partial");
    sd_atomic_file a;
    sd_status st = {0};
    cr_assert_eq(sd_atomic_open(&a, in_dir("out.json"), &st), SD_OK, "%s", st.msg);
    fputs("{}", a.f);
    cr_assert_eq(sd_atomic_commit(&a, &st), SD_OK, "%s", st.msg);
    cr_expect(!exists(stale), "the stale temporary of pid %ld stayed", pid);

    snprintf(stage, sizeof stage, "%s.tmp.%ld", in_dir("m"), pid);
    cr_assert_eq(mkdir(stage, 0755), 0);
    snprintf(inner, sizeof inner, "%s/model.safetensors", stage);
    write_file(inner, "partial");
    sd_model m;
    synth_from("configs/tiny.json", 1, 1, SD_MAX_LAYERS, 1.0f, &m);
    cr_assert_eq(sd_model_save(&m, in_dir("m"), NULL, &st), SD_OK, "%s", st.msg);
    sd_model_free(&m);
    cr_expect(!exists(stage), "the stale stage of pid %ld stayed", pid);
    cr_expect(exists(in_dir("m/config.json")) && exists(in_dir("m/model.safetensors")));
    cr_expect_eq(count_tmp_files(), 0);
}

static void on_term(int sig) {
    (void)sig;
    sd_cleanup_run(); // what the CLI's handler does before dying (engine/cli/interrupt.c)
    _exit(3);
}

// An interrupted write removes its temporary: a signal in the middle of the write.
Test(hostile, signal_removes_temporary) {
    char tmp[4200];
    pid_t p = fork();
    cr_assert(p >= 0);
    if (p == 0) {
        signal(SIGTERM, on_term);
        sd_atomic_file a;
        sd_status st = {0};
        if (sd_atomic_open(&a, in_dir("r.jsonl"), &st)) _exit(1);
        fputs("half a line", a.f);
        fflush(a.f);
        raise(SIGTERM);
        _exit(2);
    }
    int status;
    waitpid(p, &status, 0);
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 3, "child status %d", status);
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", in_dir("r.jsonl"), (long)p);
    cr_expect(!exists(tmp), "the temporary stayed after the signal");
    cr_expect(!exists(in_dir("r.jsonl")), "a partial output appeared");
}

// The CLI end to end: SIGTERM while `specdec init` runs leaves no temporary. The toy config at
// F32 takes about a second (synthesis, then 266 MB written), so the signals at these delays land
// before, during and after the write; each leaves nothing or the whole folder, and no temporary.
Test(hostile, signal_during_init_leaves_no_temporary) {
    char cfg[4096];
    snprintf(cfg, sizeof cfg, "%s", src_path("configs/toy.json"));
    const long delays_ms[] = {200, 500, 800, 1100};
    for (size_t i = 0; i < sizeof delays_ms / sizeof delays_ms[0]; i++) {
        char out[4096];
        snprintf(out, sizeof out, "%s", in_dir(i == 0 ? "toy0" : i == 1 ? "toy1" : i == 2 ? "toy2" : "toy3"));
        const char *argv[] = {"init", "--config", cfg, "--out", out, "--dtype", "f32", NULL};
        pid_t p = spawn_cli(argv, in_dir(".o"), in_dir(".e"));
        struct timespec nap = {delays_ms[i] / 1000, (delays_ms[i] % 1000) * 1000000L};
        nanosleep(&nap, NULL);
        kill(p, SIGTERM);
        int rc = wait_cli(p);
        char c[4200], w[4200];
        snprintf(c, sizeof c, "%s/config.json", out);
        snprintf(w, sizeof w, "%s/model.safetensors", out);
        const bool whole = exists(c) && exists(w);
        cr_expect(rc != 0 || whole, "%ld ms: init exited 0 without its folder", delays_ms[i]);
        cr_expect(whole || !exists(out), "%ld ms: a partial model folder stayed", delays_ms[i]);
        cr_expect_eq(count_tmp_files(), 0, "%ld ms: a temporary stayed after SIGTERM (exit %d)", delays_ms[i], rc);
    }
}

// ---------------------------------------------------------------------------------------------
// Errors stay one line whatever the echoed value holds.

Test(hostile, control_characters_escaped) {
    const char *a1[] = {"run", "--max-new", "1\n2", NULL};
    expect_fail("newline in a value", a1, 2, "got '1\\n2'");
    const char *a2[] = {"run", "--bogus\nx", NULL};
    expect_fail("newline in an option name", a2, 2, "'--bogus\\nx'");
    const char *a3[] = {"init", "--config", "no\nsuch\x1b[31m.json", "--out", in_dir("x"), NULL};
    expect_fail("control characters in a path", a3, 1, "no\\nsuch\\x1b[31m.json");
    const char *a4[] = {"run", "--prompt", "1,2\n3", NULL};
    expect_fail("a newline in a token list", a4, 2, "1,2\\n3");
    char buf[16];
    cr_expect_str_eq(sd_escape("a\nb\x7f", buf, sizeof buf), "a\\nb\\x7f");
    cr_expect_str_eq(sd_escape("0123456789abcdef", buf, 8), "0123...");
}
