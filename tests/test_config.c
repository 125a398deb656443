// test_config.c — engine/config.c: the shipped and golden configs load with the right shape;
// every rule of MODEL.md "config.json" refuses a patched tiny config with a one-line message
// naming the file, the key and the rule; to_json → parse reproduces the struct exactly.
#include <criterion/criterion.h>
#include <criterion/parameterized.h>

#include <cjson/cJSON.h> // patching the tiny config
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "config.h" // sd_config_parse, sd_config_load, sd_config_to_json

#define N_OF(a) (sizeof(a) / sizeof((a)[0]))

// ---------------------------------------------------------------------------------------------
// Helpers

static const char *source_dir(void) {
    const char *dir = getenv("SPECDEC_SOURCE_DIR");
    return dir && *dir ? dir : SPECDEC_SOURCE_DIR;
}

// <source>/<rel>; static storage, one path at a time.
static const char *source_path(const char *rel) {
    static char path[4096];
    snprintf(path, sizeof path, "%s/%s", source_dir(), rel);
    return path;
}

static char *read_text(const char *path) {
    FILE *f = fopen(path, "rb");
    cr_assert(f, "cannot open %s", path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *text = malloc((size_t)n + 1);
    cr_assert(text && fread(text, 1, (size_t)n, f) == (size_t)n, "cannot read %s", path);
    text[n] = '\0';
    fclose(f);
    return text;
}

// Every sd_config field, compared one by one (floats bitwise: the round trip must be exact).
static void expect_same_config(const sd_config *a, const sd_config *b, const char *what) {
#define SAME_INT(f) cr_expect_eq(a->f, b->f, "%s: " #f " %d != %d", what, (int)a->f, (int)b->f)
#define SAME_BITS(f) cr_expect(memcmp(&a->f, &b->f, sizeof a->f) == 0, "%s: " #f " %.17g != %.17g", what, (double)a->f, (double)b->f)
    SAME_INT(vocab_size); SAME_INT(hidden_size); SAME_INT(num_hidden_layers);
    SAME_BITS(rms_norm_eps); SAME_INT(tie_word_embeddings);
    SAME_INT(num_attention_heads); SAME_INT(kv_lora_rank); SAME_INT(qk_nope_head_dim);
    SAME_INT(qk_rope_head_dim); SAME_INT(v_head_dim); SAME_INT(mla_use_nope); SAME_BITS(rope_theta);
    SAME_INT(kda_num_heads); SAME_INT(kda_head_dim); SAME_INT(short_conv_kernel_size);
    SAME_INT(first_k_dense_replace); SAME_INT(intermediate_size); SAME_INT(num_experts);
    SAME_INT(num_experts_per_token); SAME_INT(num_shared_experts); SAME_INT(moe_intermediate_size);
    SAME_INT(moe_renormalize); SAME_BITS(routed_scaling_factor); SAME_INT(num_expert_group);
    SAME_INT(topk_group);
#undef SAME_INT
#undef SAME_BITS
    for (int i = 0; i < SD_MAX_LAYERS; i++)
        cr_expect_eq(a->mixer[i], b->mixer[i], "%s: mixer[%d] %d != %d", what, i, a->mixer[i], b->mixer[i]);
    // sd_config_parse zeroes the struct first, padding included, so the bytes agree as well:
    // this catches a field added to sd_config but forgotten above.
    cr_expect(memcmp(a, b, sizeof *a) == 0, "%s: structs differ bytewise", what);
}

// to_json → parse gives back the same struct.
static void expect_round_trip(const sd_config *cfg, const char *what) {
    char *json = sd_config_to_json(cfg);
    cr_assert(json, "%s: to_json failed", what);
    sd_config back;
    sd_status st = {0};
    sd_code rc = sd_config_parse(json, "round-trip.json", &back, &st);
    cr_assert_eq(rc, SD_OK, "%s: re-parse failed: %s\n%s", what, st.msg, json);
    expect_same_config(cfg, &back, what);
    char *again = sd_config_to_json(&back);
    cr_expect_str_eq(again, json, "%s: to_json is not a fixed point", what);
    free(again);
    free(json);
}

// ---------------------------------------------------------------------------------------------
// Good configs: the shipped ones and the golden models load with the expected shape.

typedef struct {
    const char *rel;     // under the source dir
    int vocab, hidden, top_k, experts, groups;
    bool nope;
    const char *mixers;  // one letter per 0-based layer: K = KDA, M = MLA
} good_case;

static const good_case good_cases[] = {
    {"configs/tiny.json", 64, 32, 2, 8, 2, false, "KKMK"},
    {"configs/toy.json", 8192, 512, 2, 16, 1, true, "KKKMKKKM"},
    {"configs/kimi-linear-48b-a3b.json", 163840, 2304, 8, 256, 1, true, "KKKMKKKMKKKMKKKMKKKMKKKMKKM"},
    {"tests/golden-hf/tiny-nope-f32/config.json", 97, 48, 2, 8, 2, true, "KKMK"},
    {"tests/golden-hf/tiny-rope-bf16/config.json", 97, 48, 2, 8, 2, false, "KKMK"},
};

ParameterizedTestParameters(config, loads) {
    static int index[N_OF(good_cases)];
    for (size_t i = 0; i < N_OF(good_cases); i++) index[i] = (int)i;
    return cr_make_param_array(int, index, N_OF(good_cases));
}

ParameterizedTest(int *index, config, loads) {
    const good_case *g = &good_cases[*index];
    const char *path = source_path(g->rel);
    sd_config c;
    sd_status st = {0};
    sd_code rc = sd_config_load(path, &c, &st);
    cr_assert_eq(rc, SD_OK, "%s: %s", g->rel, st.msg);
    cr_expect_eq(c.vocab_size, g->vocab, "%s: vocab_size", g->rel);
    cr_expect_eq(c.hidden_size, g->hidden, "%s: hidden_size", g->rel);
    cr_expect_eq(c.num_experts_per_token, g->top_k, "%s: top-k", g->rel);
    cr_expect_eq(c.num_experts, g->experts, "%s: num_experts", g->rel);
    cr_expect_eq(c.num_expert_group, g->groups, "%s: num_expert_group", g->rel);
    cr_expect_eq(c.mla_use_nope, g->nope, "%s: mla_use_nope", g->rel);
    cr_assert_eq(c.num_hidden_layers, (int)strlen(g->mixers), "%s: num_hidden_layers", g->rel);
    for (int i = 0; i < c.num_hidden_layers; i++) {
        sd_mixer want = g->mixers[i] == 'M' ? SD_MIXER_MLA : SD_MIXER_KDA;
        cr_expect_eq(c.mixer[i], want, "%s: mixer of layer index %d", g->rel, i);
    }
    cr_expect_eq(c.rms_norm_eps, 1e-5f, "%s: rms_norm_eps", g->rel);
    cr_expect_eq(c.routed_scaling_factor, 2.446f, "%s: routed_scaling_factor", g->rel);
    cr_expect_eq(c.rope_theta, 10000.0, "%s: rope_theta", g->rel);
    cr_expect(!c.tie_word_embeddings, "%s: tie_word_embeddings", g->rel);
    cr_expect(c.moe_renormalize, "%s: moe_renormalize", g->rel);
    expect_round_trip(&c, g->rel);
}

// The real model's geometry, spelled out.
Test(config, kimi_linear_48b_shape) {
    sd_config c;
    sd_status st = {0};
    cr_assert_eq(sd_config_load(source_path("configs/kimi-linear-48b-a3b.json"), &c, &st), SD_OK, "%s", st.msg);
    cr_expect_eq(c.num_hidden_layers, 27);
    cr_expect_eq(c.mixer[0], SD_MIXER_KDA);
    cr_expect_eq(c.mixer[3], SD_MIXER_MLA);  // layer 4
    cr_expect_eq(c.mixer[26], SD_MIXER_MLA); // layer 27
    cr_expect_eq(c.num_attention_heads, 32);
    cr_expect_eq(c.kv_lora_rank, 512);
    cr_expect_eq(c.qk_nope_head_dim, 128);
    cr_expect_eq(c.qk_rope_head_dim, 64);
    cr_expect_eq(c.v_head_dim, 128);
    cr_expect_eq(sd_config_kda_dim(&c), 32 * 128);
    cr_expect_eq(c.short_conv_kernel_size, 4);
    cr_expect_eq(c.first_k_dense_replace, 1);
    cr_expect_eq(c.intermediate_size, 9216);
    cr_expect(!sd_config_is_moe(&c, 0));
    cr_expect(sd_config_is_moe(&c, 1));
    cr_expect_eq(c.num_shared_experts, 1);
    cr_expect_eq(c.moe_intermediate_size, 1024);
    cr_expect_eq(c.topk_group, 1);
}

// ---------------------------------------------------------------------------------------------
// Patches of configs/tiny.json (L = 4, kda [1,2,4], full [3], E = 8, K = 2, G = 2, topk_group 1,
// mla_use_nope false).

typedef enum { PATCH_NONE, PATCH_SET, PATCH_DELETE, PATCH_APPEND, PATCH_RAW } patch_op;

typedef struct {
    patch_op op;
    const char *key;   // dotted for linear_attn_config members
    const char *value; // JSON text (SET, APPEND) or the whole document (RAW)
} patch;

// Applies up to two patches to the tiny config text; caller frees.
static char *patched_tiny(const patch *patches, int n) {
    char *text = read_text(source_path("configs/tiny.json"));
    cJSON *doc = cJSON_Parse(text);
    cr_assert(doc, "configs/tiny.json does not parse");
    free(text);
    for (int i = 0; i < n; i++) {
        const patch *p = &patches[i];
        if (p->op == PATCH_NONE) continue;
        if (p->op == PATCH_RAW) { cJSON_Delete(doc); return strdup(p->value); }
        cJSON *obj = doc;
        const char *leaf = p->key;
        const char *dot = strchr(p->key, '.');
        if (dot) {
            char parent[64];
            snprintf(parent, sizeof parent, "%.*s", (int)(dot - p->key), p->key);
            obj = cJSON_GetObjectItemCaseSensitive(doc, parent);
            leaf = dot + 1;
        }
        if (p->op == PATCH_DELETE) {
            cJSON_DeleteItemFromObjectCaseSensitive(obj, leaf);
            continue;
        }
        cJSON *value = cJSON_Parse(p->value);
        cr_assert(value, "bad patch value %s", p->value);
        if (p->op == PATCH_SET && cJSON_GetObjectItemCaseSensitive(obj, leaf))
            cJSON_ReplaceItemInObjectCaseSensitive(obj, leaf, value);
        else
            cJSON_AddItemToObject(obj, leaf, value); // APPEND: a second copy of the key
    }
    char *out = cJSON_Print(doc);
    cJSON_Delete(doc);
    return out;
}

#define SET(k, v) {PATCH_SET, k, v}
#define DEL(k) {PATCH_DELETE, k, NULL}
#define RAW(text) {PATCH_RAW, NULL, text}
#define LA "linear_attn_config."

typedef struct {
    patch patches[2];
    const char *expect; // substring of the message: key and rule
} bad_case;

static const bad_case bad_cases[] = {
    // layer lists
    {{SET(LA "full_attn_layers", "[]")}, "key 'linear_attn_config': kda_layers and full_attn_layers must partition 1..4, but layer 3 is in neither kda_layers nor full_attn_layers"},
    {{SET(LA "kda_layers", "[1, 2]"), SET(LA "full_attn_layers", "[3]")}, "layer 4 is in neither kda_layers nor full_attn_layers"},
    {{SET(LA "full_attn_layers", "[3, 2]")}, "key 'linear_attn_config.full_attn_layers': each layer must be listed once, got 2, already in kda_layers"},
    {{SET(LA "kda_layers", "[1, 2, 2, 4]")}, "key 'linear_attn_config.kda_layers': each layer must be listed once, got 2 twice"},
    {{SET(LA "full_attn_layers", "[3, 5]")}, "key 'linear_attn_config.full_attn_layers': must be in 1..4 (num_hidden_layers), got 5"},
    {{SET(LA "kda_layers", "[0, 1, 3]"), SET(LA "full_attn_layers", "[2]")}, "key 'linear_attn_config.kda_layers': layer numbers are 1-based (1..4), got 0"},
    {{SET(LA "kda_layers", "[1, -2, 4]")}, "key 'linear_attn_config.kda_layers': layer numbers are 1-based (1..4), got -2"},
    {{SET(LA "kda_layers", "[1, 2.5, 4]")}, "key 'linear_attn_config.kda_layers': must be an array of integer layer numbers, got 2.5"},
    {{SET(LA "kda_layers", "\"1,2,4\"")}, "key 'linear_attn_config.kda_layers': must be an array of layer numbers, got \"1,2,4\""},
    {{DEL(LA "full_attn_layers")}, "key 'linear_attn_config.full_attn_layers': is required"},
    // integer dims
    {{SET("hidden_size", "0")}, "key 'hidden_size': must be an integer > 0, got 0"},
    {{SET(LA "head_dim", "-8")}, "key 'linear_attn_config.head_dim': must be an integer > 0, got -8"},
    {{SET("kv_lora_rank", "16.5")}, "key 'kv_lora_rank': must be an integer > 0, got 16.5"},
    {{SET("vocab_size", "\"64\"")}, "key 'vocab_size': must be an integer > 0, got \"64\""},
    {{SET("vocab_size", "3e9")}, "key 'vocab_size': must be <= 2147483647, got 3000000000"},
    {{SET("num_shared_experts", "-1")}, "key 'num_shared_experts': must be an integer >= 0, got -1"},
    {{SET("first_k_dense_replace", "5")}, "key 'first_k_dense_replace': must be in 0..num_hidden_layers (4), got 5"},
    {{SET("num_hidden_layers", "300")}, "key 'num_hidden_layers': must be <= 256 (SD_MAX_LAYERS), got 300"},
    // routing
    // keys of the published configs that change the function and are not implemented
    {{SET("moe_layer_freq", "2")}, "key 'moe_layer_freq': must be 1 (every layer from first_k_dense_replace on is MoE"},
    {{SET("moe_layer_freq", "\"1\"")}, "key 'moe_layer_freq': must be 1"},
    {{SET("rope_scaling", "{\"type\": \"yarn\", \"factor\": 4.0}")}, "key 'rope_scaling': must be null (specdec implements no RoPE scaling), got {\"type\":\"yarn\""},
    {{SET("use_grouped_topk", "false")}, "key 'use_grouped_topk': must be true when num_expert_group > 1 (2)"},
    {{SET("use_grouped_topk", "0")}, "key 'use_grouped_topk': must be true or false, got 0"},
    {{SET("mla_use_output_gate", "true")}, "key 'mla_use_output_gate': must be false or absent"},
    {{SET(LA "gate_lower_bound", "-5.0")}, "key 'linear_attn_config.gate_lower_bound': must be null or absent"},
    {{SET(LA "use_full_rank_gate", "true")}, "key 'linear_attn_config.use_full_rank_gate': must be false or absent"},
    {{SET("num_experts_per_token", "9")}, "key 'num_experts_per_token': must be <= num_experts (8), got 9"},
    {{SET("num_experts_per_token", "5")}, "key 'num_experts_per_token': must be <= topk_group * experts per group (1 * 4 = 4), got 5"},
    {{SET("num_expert_group", "3")}, "key 'num_expert_group': must divide num_experts (8), got 3"},
    {{SET("num_expert_group", "8")}, "key 'num_expert_group': must leave >= 2 experts per group (group score = sum of top-2), got 8"},
    {{SET("topk_group", "3")}, "key 'topk_group': must be in 1..num_expert_group (2), got 3"},
    {{SET("topk_group", "0")}, "key 'topk_group': must be an integer > 0, got 0"},
    {{SET("moe_router_activation_func", "\"softmax\"")}, "key 'moe_router_activation_func': must be \"sigmoid\", got \"softmax\""},
    {{SET("moe_renormalize", "1")}, "key 'moe_renormalize': must be true or false, got 1"},
    // floats
    {{SET("rms_norm_eps", "0")}, "key 'rms_norm_eps': must be a number > 0 (float32), got 0"},
    {{SET("rms_norm_eps", "-1e-5")}, "key 'rms_norm_eps': must be a number > 0 (float32), got -1e-05"},
    {{SET("rms_norm_eps", "1e-50")}, "key 'rms_norm_eps': must be a number > 0 (float32), got 1e-50"},
    {{SET("routed_scaling_factor", "0")}, "key 'routed_scaling_factor': must be a number > 0 (float32), got 0"},
    {{SET("rope_theta", "0")}, "key 'rope_theta': must be > 0 when mla_use_nope is false, got 0"},
    {{DEL("rope_theta")}, "key 'rope_theta': is required when mla_use_nope is false"},
    {{SET("rope_theta", "\"1e4\"")}, "key 'rope_theta': must be a finite number, got \"1e4\""},
    // names and flags
    {{SET("hidden_act", "\"gelu\"")}, "key 'hidden_act': must be \"silu\", got \"gelu\""},
    {{SET("q_lora_rank", "8")}, "key 'q_lora_rank': must be null or absent (no query LoRA), got 8"},
    {{SET("model_type", "\"deepseek_v3\"")}, "key 'model_type': must be \"kimi_linear\", got \"deepseek_v3\""},
    {{DEL("model_type")}, "key 'model_type': is required"},
    {{DEL("vocab_size")}, "key 'vocab_size': is required, got nothing (key absent)"},
    {{DEL(LA "num_heads")}, "key 'linear_attn_config.num_heads': is required"},
    {{DEL("linear_attn_config")}, "key 'linear_attn_config': is required"},
    {{SET("linear_attn_config", "3")}, "key 'linear_attn_config': must be an object, got 3"},
    {{SET("mla_use_nope", "\"no\"")}, "key 'mla_use_nope': must be true or false, got \"no\""},
    {{{PATCH_APPEND, "vocab_size", "65"}}, "key 'vocab_size': must appear once, got it twice"},
    // not JSON, or not a config
    {{RAW("{\n  \"model_type\": \"kimi_linear\",\n  \"vocab_size\": 64,,\n}")}, "invalid JSON: syntax error near line 3, column "},
    {{RAW("{\"model_type\": \"kimi_linear\"} trailing")}, "invalid JSON: syntax error"},
    {{RAW("")}, "invalid JSON"},
    {{RAW("[1, 2]")}, "the top level must be a JSON object, got [1,2]"},
};

ParameterizedTestParameters(config, refuses) {
    static int index[N_OF(bad_cases)];
    for (size_t i = 0; i < N_OF(bad_cases); i++) index[i] = (int)i;
    return cr_make_param_array(int, index, N_OF(bad_cases));
}

ParameterizedTest(int *index, config, refuses) {
    const bad_case *b = &bad_cases[*index];
    char *json = patched_tiny(b->patches, 2);
    sd_config c;
    sd_status st = {0};
    sd_code rc = sd_config_parse(json, "configs/bad.json", &c, &st);
    cr_assert_eq(rc, SD_ERR_DATA, "case %d (%s) was accepted:\n%s", *index, b->expect, json);
    cr_expect_eq(st.code, SD_ERR_DATA);
    cr_expect(strncmp(st.msg, "configs/bad.json: ", strlen("configs/bad.json: ")) == 0,
              "case %d: message does not start with the name: %s", *index, st.msg);
    cr_expect(!strchr(st.msg, '\n'), "case %d: message is not one line: %s", *index, st.msg);
    cr_expect(strstr(st.msg, b->expect), "case %d: message\n  %s\nlacks\n  %s", *index, st.msg, b->expect);
    sd_config zero;
    memset(&zero, 0, sizeof zero);
    cr_expect(memcmp(&c, &zero, sizeof c) == 0, "case %d: a refused config is left half-filled", *index);
    free(json);
}

// Patches the rules allow, and the defaults of optional keys.
Test(config, accepts_optional_and_unknown_keys) {
    static const struct { patch patches[2]; } ok_cases[] = {
        {{DEL("q_lora_rank")}},
        {{DEL("tie_word_embeddings")}},
        {{DEL("num_expert_group"), DEL("topk_group")}},
        {{SET("architectures", "[\"KimiLinearForCausalLM\"]"), SET(LA "unknown", "{\"x\": 1}")}},
        {{SET("mla_use_nope", "true"), DEL("rope_theta")}},
        {{SET(LA "kda_layers", "[4, 2, 1]"), SET("first_k_dense_replace", "4")}},
        {{SET("num_shared_experts", "0"), SET("first_k_dense_replace", "0")}},
        {{SET("tie_word_embeddings", "true"), SET("num_expert_group", "null")}},
        // the published configs' values of the keys specdec refuses otherwise
        {{SET("moe_layer_freq", "1"), SET("rope_scaling", "null")}},
        {{SET("use_grouped_topk", "true"), SET("mla_use_output_gate", "false")}},
        {{SET("use_grouped_topk", "false"), SET("num_expert_group", "1")}},
        {{SET(LA "gate_lower_bound", "null"), SET(LA "use_full_rank_gate", "false")}},
        {{SET("num_nextn_predict_layers", "1"), SET("use_cache", "true")}},
    };
    for (size_t i = 0; i < N_OF(ok_cases); i++) {
        char *json = patched_tiny(ok_cases[i].patches, 2);
        sd_config c;
        sd_status st = {0};
        cr_expect_eq(sd_config_parse(json, "configs/ok.json", &c, &st), SD_OK, "ok case %zu: %s", i, st.msg);
        free(json);
    }

    patch defaults[2] = {DEL("tie_word_embeddings"), DEL("num_expert_group")};
    char *json = patched_tiny(defaults, 2);
    sd_config c;
    sd_status st = {0};
    cr_assert_eq(sd_config_parse(json, "configs/ok.json", &c, &st), SD_OK, "%s", st.msg);
    cr_expect(!c.tie_word_embeddings);
    cr_expect_eq(c.num_expert_group, 1);
    free(json);

    patch no_rope[2] = {SET("mla_use_nope", "true"), DEL("rope_theta")};
    json = patched_tiny(no_rope, 2);
    cr_assert_eq(sd_config_parse(json, "configs/ok.json", &c, &st), SD_OK, "%s", st.msg);
    cr_expect_eq(c.rope_theta, 10000.0);
    free(json);
}

// Floats that need every digit still come back bit-exact, and plain ones are written plainly.
Test(config, round_trip_exact_floats) {
    sd_config c;
    sd_status st = {0};
    cr_assert_eq(sd_config_load(source_path("configs/tiny.json"), &c, &st), SD_OK, "%s", st.msg);
    char *json = sd_config_to_json(&c);
    cr_expect(strstr(json, "1e-05"), "rms_norm_eps not written shortest:\n%s", json);
    cr_expect(strstr(json, "2.446"), "routed_scaling_factor not written shortest:\n%s", json);
    cr_expect(strstr(json, "10000.0"), "rope_theta not written as a whole number:\n%s", json);
    cr_expect(strstr(json, "\"q_lora_rank\":\tnull"), "q_lora_rank not null:\n%s", json);
    free(json);

    c.rms_norm_eps = nextafterf(1e-5f, 1.0f);
    c.routed_scaling_factor = 1.0f / 3.0f;
    c.rope_theta = 1e5 / 3.0;
    expect_round_trip(&c, "odd floats");
    c.rms_norm_eps = 1e-38f; // below FLT_MIN: subnormal-adjacent, still > 0
    c.rope_theta = 5e-324;   // the smallest subnormal double
    expect_round_trip(&c, "tiny floats");
}

// ---------------------------------------------------------------------------------------------
// Files

Test(config, unreadable_path_is_sys_error) {
    const char *paths[] = {"/nonexistent/specdec/config.json", source_path("configs")};
    for (size_t i = 0; i < N_OF(paths); i++) {
        char path[4096];
        snprintf(path, sizeof path, "%s", paths[i]);
        sd_config c;
        sd_status st = {0};
        cr_expect_eq(sd_config_load(path, &c, &st), SD_ERR_SYS, "%s: %s", path, st.msg);
        cr_expect(strncmp(st.msg, path, strlen(path)) == 0, "message does not name %s: %s", path, st.msg);
        cr_expect(!strchr(st.msg, '\n'), "message is not one line: %s", st.msg);
    }
}

Test(config, load_errors_name_the_path) {
    char path[] = "/tmp/specdec_test_config_XXXXXX";
    int fd = mkstemp(path);
    cr_assert(fd >= 0);
    patch p[1] = {SET("num_experts_per_token", "9")};
    char *json = patched_tiny(p, 1);
    cr_assert_eq(write(fd, json, strlen(json)), (ssize_t)strlen(json));
    close(fd);
    sd_config c;
    sd_status st = {0};
    sd_code rc = sd_config_load(path, &c, &st);
    unlink(path);
    free(json);
    cr_assert_eq(rc, SD_ERR_DATA);
    char want[256];
    snprintf(want, sizeof want, "%s: key 'num_experts_per_token': must be <= num_experts (8), got 9", path);
    cr_expect_str_eq(st.msg, want);
}

// eos_token_id: optional; one id or a list of ids in 0..V-1 (tiny: V = 64); written back the
// way it was read.
Test(config, eos_token_id_table) {
    const struct {
        const char *value; // NULL: the key absent
        int n, ids[3];
        const char *error; // substring of the refusal, NULL when accepted
    } cases[] = {
        {NULL, 0, {0}, NULL},
        {"null", 0, {0}, NULL},
        {"7", 1, {7}, NULL},
        {"[63, 0, 5]", 3, {63, 0, 5}, NULL},
        {"64", 0, {0}, "key 'eos_token_id': must be in 0..63 (vocab_size - 1), got 64"},
        {"[1, 64]", 0, {0}, "key 'eos_token_id': must be in 0..63 (vocab_size - 1), got 64"},
        {"-1", 0, {0}, "key 'eos_token_id': must be an integer >= 0, got -1"},
        {"[1.5]", 0, {0}, "key 'eos_token_id': must be an integer >= 0, got 1.5"},
        {"\"2\"", 0, {0}, "key 'eos_token_id': must be a token id or a list of token ids, got \"2\""},
        {"[]", 0, {0}, "key 'eos_token_id': must list at least one id, got []"},
        {"[0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16]", 0, {0}, "key 'eos_token_id': must list at most 16 ids"},
    };
    for (size_t i = 0; i < N_OF(cases); i++) {
        patch p[1] = {cases[i].value ? (patch)SET("eos_token_id", cases[i].value) : (patch){PATCH_NONE, NULL, NULL}};
        char *json = patched_tiny(p, 1);
        sd_config c;
        sd_status st = {0};
        sd_code rc = sd_config_parse(json, "eos.json", &c, &st);
        free(json);
        if (cases[i].error) {
            cr_expect_eq(rc, SD_ERR_DATA, "case %zu accepted", i);
            cr_expect(strstr(st.msg, cases[i].error), "case %zu: '%s' lacks '%s'", i, st.msg, cases[i].error);
            continue;
        }
        cr_assert_eq(rc, SD_OK, "case %zu: %s", i, st.msg);
        cr_expect_eq(c.n_eos_token_ids, cases[i].n, "case %zu", i);
        for (int j = 0; j < cases[i].n; j++) cr_expect_eq(c.eos_token_id[j], cases[i].ids[j], "case %zu id %d", i, j);
        char *back = sd_config_to_json(&c);
        sd_config again;
        cr_assert_eq(sd_config_parse(back, "written", &again, &st), SD_OK, "case %zu: %s", i, st.msg);
        cr_expect(memcmp(&c, &again, sizeof c) == 0, "case %zu: eos_token_id does not round-trip:\n%s", i, back);
        cr_expect_eq(strstr(back, "eos_token_id") != NULL, cases[i].n > 0, "case %zu: written iff present", i);
        free(back);
    }
}
