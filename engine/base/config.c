// config.c — read, validate and write config.json of a kimi_linear model (MODEL.md "config.json").
// One table (config_keys) lists every key in document order: the reader walks it to type-check
// and store each scalar, the writer walks it to print them, so the two cannot disagree on a key.
// Rules that tie keys together (layer lists, routing groups, conditional RoPE) follow the walk.
#include "config.h" // sd_config, sd_config_parse, sd_config_load, sd_config_to_json
#include "file_open.h" // sd_fopen_regular

#include <cjson/cJSON.h> // cJSON_ParseWithOpts, cJSON_Print, cJSON_CreateRaw
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h> // offsetof
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define LINEAR_PREFIX "linear_attn_config."
#define CONFIG_MAX_BYTES (16 << 20) // a config.json is a few KiB; anything this big is not one

typedef enum {
    KEY_INT,          // int field >= min
    KEY_FLOAT,        // float field, finite and > 0 after rounding to float32
    KEY_DOUBLE,       // double field (rope_theta; its rule depends on mla_use_nope, checked later)
    KEY_BOOL,         // bool field
    KEY_CONST_STRING, // no field: the value must equal `expected`
    KEY_NULL,         // no field: absent or null (q_lora_rank)
    KEY_SECTION,      // no field: the linear_attn_config object holding the dotted keys after it
    KEY_LAYERS,       // 1-based layer list → cfg->mixer[]; checked with its partner in check_layers
} key_kind;

typedef struct {
    const char *key;      // dotted for linear_attn_config's members
    key_kind kind;
    size_t offset;        // field in sd_config (KEY_INT/FLOAT/DOUBLE/BOOL)
    bool optional;        // absent or null → fallback
    double fallback;
    int min;              // KEY_INT: smallest allowed value
    const char *expected; // KEY_CONST_STRING
    sd_mixer mixer;       // KEY_LAYERS: the mixer the listed layers get
} key_spec;

#define F(field) offsetof(sd_config, field)
#define INT_KEY(k, field, lo) {k, KEY_INT, F(field), false, 0, lo, NULL, 0}
#define INT_OPT(k, field, lo, dflt) {k, KEY_INT, F(field), true, dflt, lo, NULL, 0}
#define FLOAT_KEY(k, field) {k, KEY_FLOAT, F(field), false, 0, 0, NULL, 0}
#define BOOL_KEY(k, field) {k, KEY_BOOL, F(field), false, 0, 0, NULL, 0}
#define BOOL_OPT(k, field, dflt) {k, KEY_BOOL, F(field), true, dflt, 0, NULL, 0}
#define STRING_KEY(k, value) {k, KEY_CONST_STRING, 0, false, 0, 0, value, 0}
#define LAYERS_KEY(k, m) {k, KEY_LAYERS, 0, false, 0, 0, NULL, m}

static const key_spec config_keys[] = {
    STRING_KEY("model_type", "kimi_linear"),
    INT_KEY("vocab_size", vocab_size, 1),
    INT_KEY("hidden_size", hidden_size, 1),
    INT_KEY("num_hidden_layers", num_hidden_layers, 1),
    FLOAT_KEY("rms_norm_eps", rms_norm_eps),
    BOOL_OPT("tie_word_embeddings", tie_word_embeddings, false),
    INT_KEY("num_attention_heads", num_attention_heads, 1),
    {"q_lora_rank", KEY_NULL, 0, true, 0, 0, NULL, 0},
    INT_KEY("kv_lora_rank", kv_lora_rank, 1),
    INT_KEY("qk_nope_head_dim", qk_nope_head_dim, 1),
    INT_KEY("qk_rope_head_dim", qk_rope_head_dim, 1),
    INT_KEY("v_head_dim", v_head_dim, 1),
    BOOL_KEY("mla_use_nope", mla_use_nope),
    {"rope_theta", KEY_DOUBLE, F(rope_theta), true, 10000.0, 0, NULL, 0},
    {"linear_attn_config", KEY_SECTION, 0, false, 0, 0, NULL, 0},
    LAYERS_KEY(LINEAR_PREFIX "kda_layers", SD_MIXER_KDA),
    LAYERS_KEY(LINEAR_PREFIX "full_attn_layers", SD_MIXER_MLA),
    INT_KEY(LINEAR_PREFIX "num_heads", kda_num_heads, 1),
    INT_KEY(LINEAR_PREFIX "head_dim", kda_head_dim, 1),
    INT_KEY(LINEAR_PREFIX "short_conv_kernel_size", short_conv_kernel_size, 1),
    INT_KEY("first_k_dense_replace", first_k_dense_replace, 0), // <= L: check_rules
    INT_KEY("intermediate_size", intermediate_size, 1),
    INT_KEY("num_experts", num_experts, 1),
    INT_KEY("num_experts_per_token", num_experts_per_token, 1),
    INT_KEY("num_shared_experts", num_shared_experts, 0),
    INT_KEY("moe_intermediate_size", moe_intermediate_size, 1),
    STRING_KEY("moe_router_activation_func", "sigmoid"),
    BOOL_KEY("moe_renormalize", moe_renormalize),
    FLOAT_KEY("routed_scaling_factor", routed_scaling_factor),
    INT_OPT("num_expert_group", num_expert_group, 1, 1),
    INT_OPT("topk_group", topk_group, 1, 1),
    STRING_KEY("hidden_act", "silu"),
};
#define N_CONFIG_KEYS (sizeof config_keys / sizeof config_keys[0])

// ---------------------------------------------------------------------------------------------
// Reading

typedef struct {
    const cJSON *root;   // the document, an object
    const cJSON *linear; // root's linear_attn_config, an object (set when the walk reaches it)
    const char *name;    // prefixes every message
    sd_status *st;
} reader;

// One error line: "<name>: key '<key>': <rule>, got <value>" (the caller writes rule and got).
__attribute__((format(printf, 3, 4)))
static sd_code bad(const reader *r, const char *key, const char *fmt, ...) {
    char rule[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(rule, sizeof rule, fmt, ap);
    va_end(ap);
    return sd_fail(r->st, SD_ERR_DATA, "%s: key '%s': %s", r->name, key, rule);
}

// A JSON value as one short line (cJSON escapes newlines inside strings).
static const char *show(const cJSON *item, char buf[static 64]) {
    if (cJSON_IsNumber(item) && !isfinite(item->valuedouble)) // cJSON would print null
        return isnan(item->valuedouble) ? "nan" : item->valuedouble > 0 ? "inf (a number beyond double range)" : "-inf";
    char *text = cJSON_PrintUnformatted(item);
    if (!text) return "(unprintable)";
    size_t n = strlen(text);
    if (n < 64) {
        memcpy(buf, text, n + 1);
    } else {
        memcpy(buf, text, 56);
        strcpy(buf + 56, "...");
    }
    cJSON_free(text);
    return buf;
}

// Finds `key` (dotted keys live in linear_attn_config). *out is NULL when the key is absent or,
// for an optional key, null. A key written twice is refused: JSON readers disagree on which
// copy wins, so the file would mean different things to different tools.
static sd_code find(const reader *r, const key_spec *k, const cJSON **out) {
    bool nested = strncmp(k->key, LINEAR_PREFIX, strlen(LINEAR_PREFIX)) == 0;
    const cJSON *obj = nested ? r->linear : r->root;
    const char *leaf = nested ? k->key + strlen(LINEAR_PREFIX) : k->key;
    const cJSON *found = NULL, *child;
    cJSON_ArrayForEach(child, obj) {
        if (child->string && strcmp(child->string, leaf) == 0) {
            if (found) return bad(r, k->key, "must appear once, got it twice");
            found = child;
        }
    }
    if (!found && !k->optional) return bad(r, k->key, "is required, got nothing (key absent)");
    if (found && cJSON_IsNull(found) && k->optional) found = NULL;
    *out = found;
    return SD_OK;
}

// An integer in [min, INT_MAX]; the rule text names the lower bound.
static sd_code read_int(const reader *r, const key_spec *k, const cJSON *item, int *out) {
    char got[64];
    const char *rule = k->min > 0 ? "must be an integer > 0" : "must be an integer >= 0";
    if (!cJSON_IsNumber(item)) return bad(r, k->key, "%s, got %s", rule, show(item, got));
    double v = item->valuedouble;
    if (v != floor(v)) return bad(r, k->key, "%s, got %s", rule, show(item, got));
    if (v < k->min) return bad(r, k->key, "%s, got %s", rule, show(item, got));
    if (v > INT_MAX) return bad(r, k->key, "must be <= %d, got %s", INT_MAX, show(item, got));
    *out = (int)v;
    return SD_OK;
}

// Reads one scalar key of the table into cfg (KEY_LAYERS are left to check_layers).
static sd_code read_key(reader *r, const key_spec *k, sd_config *cfg) {
    const cJSON *item;
    sd_code rc = find(r, k, &item);
    if (rc) return rc;
    char got[64];
    void *field = (char *)cfg + k->offset;
    switch (k->kind) {
    case KEY_INT:
        if (!item) { *(int *)field = (int)k->fallback; return SD_OK; }
        return read_int(r, k, item, field);
    case KEY_FLOAT: {
        // Stored as float32, so the rule applies to the rounded value (1e-50 would become 0).
        float f = cJSON_IsNumber(item) ? (float)item->valuedouble : 0.0f;
        if (!cJSON_IsNumber(item) || !(f > 0.0f) || !isfinite(f))
            return bad(r, k->key, "must be a number > 0 (float32), got %s", show(item, got));
        *(float *)field = f;
        return SD_OK;
    }
    case KEY_DOUBLE:
        if (!item) { *(double *)field = k->fallback; return SD_OK; }
        // 1e999 parses to infinity: refused here, so no infinite value reaches the model (or a
        // config that `init` writes and specdec then refuses).
        if (!cJSON_IsNumber(item) || !isfinite(item->valuedouble))
            return bad(r, k->key, "must be a finite number, got %s", show(item, got));
        *(double *)field = item->valuedouble;
        return SD_OK;
    case KEY_BOOL:
        if (!item) { *(bool *)field = k->fallback != 0; return SD_OK; }
        if (!cJSON_IsBool(item)) return bad(r, k->key, "must be true or false, got %s", show(item, got));
        *(bool *)field = cJSON_IsTrue(item);
        return SD_OK;
    case KEY_CONST_STRING:
        if (!cJSON_IsString(item) || strcmp(item->valuestring, k->expected) != 0)
            return bad(r, k->key, "must be \"%s\", got %s", k->expected, show(item, got));
        return SD_OK;
    case KEY_NULL:
        if (item) return bad(r, k->key, "must be null or absent (no query LoRA), got %s", show(item, got));
        return SD_OK;
    case KEY_SECTION:
        if (!cJSON_IsObject(item)) return bad(r, k->key, "must be an object, got %s", show(item, got));
        r->linear = item;
        return SD_OK;
    case KEY_LAYERS:
        return SD_OK;
    }
    return SD_OK;
}

// Marks the layers one list names. listed_in[i] is the list that already named 0-based layer i
// (NULL if none), so a layer named twice, in one list or across both, is caught here.
static sd_code read_layer_list(const reader *r, const key_spec *k, sd_config *cfg,
                               const char *listed_in[]) {
    const cJSON *list, *item;
    sd_code rc = find(r, k, &list);
    if (rc) return rc;
    char got[64];
    if (!cJSON_IsArray(list)) return bad(r, k->key, "must be an array of layer numbers, got %s", show(list, got));
    int L = cfg->num_hidden_layers;
    const char *leaf = k->key + strlen(LINEAR_PREFIX);
    cJSON_ArrayForEach(item, list) {
        if (!cJSON_IsNumber(item) || item->valuedouble != floor(item->valuedouble))
            return bad(r, k->key, "must be an array of integer layer numbers, got %s", show(item, got));
        double v = item->valuedouble;
        if (v < 1) return bad(r, k->key, "layer numbers are 1-based (1..%d), got %s", L, show(item, got));
        if (v > L) return bad(r, k->key, "must be in 1..%d (num_hidden_layers), got %s", L, show(item, got));
        int i = (int)v - 1;
        if (listed_in[i] == leaf)
            return bad(r, k->key, "each layer must be listed once, got %d twice", i + 1);
        if (listed_in[i])
            return bad(r, k->key, "each layer must be listed once, got %d, already in %s", i + 1, listed_in[i]);
        listed_in[i] = leaf;
        cfg->mixer[i] = k->mixer;
    }
    return SD_OK;
}

// kda_layers and full_attn_layers together name every layer 1..L exactly once.
static sd_code check_layers(const reader *r, sd_config *cfg) {
    const char *listed_in[SD_MAX_LAYERS] = {0};
    for (size_t i = 0; i < N_CONFIG_KEYS; i++) {
        if (config_keys[i].kind != KEY_LAYERS) continue;
        sd_code rc = read_layer_list(r, &config_keys[i], cfg, listed_in);
        if (rc) return rc;
    }
    for (int i = 0; i < cfg->num_hidden_layers; i++)
        if (!listed_in[i])
            return sd_fail(r->st, SD_ERR_DATA,
                           "%s: key 'linear_attn_config': kda_layers and full_attn_layers must partition "
                           "1..%d, but layer %d is in neither kda_layers nor full_attn_layers",
                           r->name, cfg->num_hidden_layers, i + 1);
    return SD_OK;
}

// Rules between keys, checked once every scalar is known to be well-typed and in range.
static sd_code check_rules(const reader *r, sd_config *cfg) {
    const sd_config *c = cfg;
    if (c->num_hidden_layers > SD_MAX_LAYERS)
        return bad(r, "num_hidden_layers", "must be <= %d (SD_MAX_LAYERS), got %d", SD_MAX_LAYERS, c->num_hidden_layers);
    if (c->first_k_dense_replace > c->num_hidden_layers)
        return bad(r, "first_k_dense_replace", "must be in 0..num_hidden_layers (%d), got %d",
                   c->num_hidden_layers, c->first_k_dense_replace);
    sd_code rc = check_layers(r, cfg);
    if (rc) return rc;

    if (!c->mla_use_nope) { // RoPE is applied, so its base must be given and usable
        const cJSON *theta = cJSON_GetObjectItemCaseSensitive(r->root, "rope_theta");
        if (!theta || cJSON_IsNull(theta))
            return bad(r, "rope_theta", "is required when mla_use_nope is false, got nothing (key absent)");
        if (!(c->rope_theta > 0))
            return bad(r, "rope_theta", "must be > 0 when mla_use_nope is false, got %.17g", c->rope_theta);
    }

    int E = c->num_experts, K = c->num_experts_per_token, G = c->num_expert_group;
    if (K > E) return bad(r, "num_experts_per_token", "must be <= num_experts (%d), got %d", E, K);
    if (E % G != 0) return bad(r, "num_expert_group", "must divide num_experts (%d), got %d", E, G);
    if (c->topk_group > G)
        return bad(r, "topk_group", "must be in 1..num_expert_group (%d), got %d", G, c->topk_group);
    if (G > 1) { // grouped routing: a group's score is the sum of its two best experts
        if (E / G < 2)
            return bad(r, "num_expert_group", "must leave >= 2 experts per group (group score = sum of top-2), "
                       "got %d (%d expert per group)", G, E / G);
        int reachable = c->topk_group * (E / G);
        if (K > reachable)
            return bad(r, "num_experts_per_token", "must be <= topk_group * experts per group (%d * %d = %d), got %d",
                       c->topk_group, E / G, reachable, K);
    }
    return sd_config_check_sizes(c, r->name, r->st);
}

// Line and column (1-based) of byte `at` in `text`, for JSON syntax errors.
static void locate(const char *text, size_t at, int *line, int *col) {
    *line = 1;
    *col = 1;
    for (size_t i = 0; i < at && text[i]; i++) {
        if (text[i] == '\n') { ++*line; *col = 1; } else { ++*col; }
    }
}

// ---------------------------------------------------------------------------------------------
// eos_token_id: optional and outside the table (its value is one id or a list, as in the Hugging
// Face configs); read after the table, since each id must lie in 0..vocab_size-1.

static sd_code read_eos_token_id(const reader *r, sd_config *cfg) {
    const key_spec k = INT_OPT("eos_token_id", n_eos_token_ids, 0, 0);
    const cJSON *v, *item;
    sd_code rc = find(r, &k, &v);
    if (rc || !v) return rc;
    char got[64];
    if (!cJSON_IsNumber(v) && !cJSON_IsArray(v))
        return bad(r, k.key, "must be a token id or a list of token ids, got %s", show(v, got));
    int n = 0;
    for (item = cJSON_IsArray(v) ? v->child : v; item; item = cJSON_IsArray(v) ? item->next : NULL) {
        if (n == SD_MAX_EOS_IDS) return bad(r, k.key, "must list at most %d ids, got more", SD_MAX_EOS_IDS);
        if ((rc = read_int(r, &k, item, &cfg->eos_token_id[n]))) return rc;
        if (cfg->eos_token_id[n] >= cfg->vocab_size)
            return bad(r, k.key, "must be in 0..%d (vocab_size - 1), got %d", cfg->vocab_size - 1, cfg->eos_token_id[n]);
        n++;
    }
    if (n == 0) return bad(r, k.key, "must list at least one id, got []");
    cfg->n_eos_token_ids = n;
    return SD_OK;
}

// One id as a number, several as a list: what the reader accepts, written back the same way.
static bool write_eos_token_id(cJSON *root, const sd_config *c) {
    if (c->n_eos_token_ids == 0) return true;
    cJSON *v = c->n_eos_token_ids == 1 ? cJSON_CreateNumber(c->eos_token_id[0])
                                       : cJSON_CreateIntArray(c->eos_token_id, c->n_eos_token_ids);
    return v && cJSON_AddItemToObject(root, "eos_token_id", v);
}

// ---------------------------------------------------------------------------------------------
// Keys of the published Kimi Linear configs (and their modeling code) that change the function
// and that specdec does not implement. Each is refused, naming the key, unless it holds the
// value under which the function is MODEL.md's: read and ignored, it would compute another
// model. Keys that only describe the run (use_cache, num_nextn_predict_layers: its layers'
// tensors are skipped at load) are not listed.

// The key (dotted: inside linear_attn_config), or NULL when absent or null; twice is refused.
static sd_code find_optional(const reader *r, const char *key, const cJSON **out) {
    const key_spec k = {key, KEY_NULL, 0, true, 0, 0, NULL, 0};
    return find(r, &k, out);
}

static sd_code check_unimplemented(const reader *r, const sd_config *c) {
    const cJSON *v;
    char got[64];
    SD_TRY(find_optional(r, "moe_layer_freq", &v));
    if (v && !(cJSON_IsNumber(v) && v->valuedouble == 1))
        return bad(r, "moe_layer_freq", "must be 1 (every layer from first_k_dense_replace on is MoE; specdec "
                   "implements no other spacing), got %s", show(v, got));
    SD_TRY(find_optional(r, "rope_scaling", &v));
    if (v) return bad(r, "rope_scaling", "must be null (specdec implements no RoPE scaling), got %s", show(v, got));
    SD_TRY(find_optional(r, "use_grouped_topk", &v));
    if (v && !cJSON_IsBool(v)) return bad(r, "use_grouped_topk", "must be true or false, got %s", show(v, got));
    if (v && cJSON_IsFalse(v) && c->num_expert_group > 1)
        return bad(r, "use_grouped_topk", "must be true when num_expert_group > 1 (%d): specdec implements grouped "
                   "routing only, got false", c->num_expert_group);
    SD_TRY(find_optional(r, "mla_use_output_gate", &v));
    if (v && !cJSON_IsFalse(v))
        return bad(r, "mla_use_output_gate", "must be false or absent (specdec implements no MLA output gate), got %s",
                   show(v, got));
    SD_TRY(find_optional(r, LINEAR_PREFIX "gate_lower_bound", &v));
    if (v)
        return bad(r, LINEAR_PREFIX "gate_lower_bound", "must be null or absent (specdec implements the unbounded "
                   "softplus decay gate of MODEL.md), got %s", show(v, got));
    SD_TRY(find_optional(r, LINEAR_PREFIX "use_full_rank_gate", &v));
    if (v && !cJSON_IsFalse(v))
        return bad(r, LINEAR_PREFIX "use_full_rank_gate", "must be false or absent (specdec implements the low-rank "
                   "f_a/f_b and g_a/g_b gates), got %s", show(v, got));
    return SD_OK;
}

// The byte offset of the first \u0000 escape in JSON text, or -1. cJSON stores keys and strings
// as C strings, so "rope_theta\u0000x" would be read as the key rope_theta: such text is refused
// before parsing (a backslash outside strings is a syntax error anyway, so the scan needs no
// string tracking; an escaped backslash is skipped with its pair).
static long nul_escape_at(const char *json) {
    for (const char *p = json; *p; p++) {
        if (*p != '\\') continue;
        if (p[1] == 'u' && p[2] == '0' && p[3] == '0' && p[4] == '0' && p[5] == '0') return (long)(p - json);
        if (p[1]) p++;
    }
    return -1;
}

static sd_code parse_document(const reader *r_in, const char *json, sd_config *cfg) {
    reader r = *r_in;
    sd_code rc;
    const long nul = nul_escape_at(json);
    if (nul >= 0)
        return sd_fail(r.st, SD_ERR_DATA, "%s: invalid JSON: a \\u0000 (NUL) escape at byte %ld: keys and strings may not "
                       "hold NUL", r.name, nul);
    const char *end = NULL;
    cJSON *doc = cJSON_ParseWithOpts(json, &end, true); // true: nothing may follow the value
    if (!doc) {
        size_t at = end && end >= json ? (size_t)(end - json) : 0;
        int line, col;
        locate(json, at, &line, &col);
        return sd_fail(r.st, SD_ERR_DATA, "%s: invalid JSON: syntax error near line %d, column %d (byte %zu)",
                       r.name, line, col, at);
    }
    char got[64];
    r.root = doc;
    if (!cJSON_IsObject(doc)) {
        rc = sd_fail(r.st, SD_ERR_DATA, "%s: not a config: the top level must be a JSON object, got %s",
                     r.name, show(doc, got));
        goto done;
    }
    for (size_t i = 0; i < N_CONFIG_KEYS; i++)
        if ((rc = read_key(&r, &config_keys[i], cfg))) goto done;
    rc = check_rules(&r, cfg);
    if (!rc) rc = check_unimplemented(&r, cfg);
    if (!rc) rc = read_eos_token_id(&r, cfg);
done:
    cJSON_Delete(doc);
    return rc;
}

sd_code sd_config_parse(const char *json, const char *name, sd_config *cfg, sd_status *st) {
    memset(cfg, 0, sizeof *cfg); // zeroed padding: two parses of one text compare equal bytewise
    if (!name) name = "(config)";
    if (!json) return sd_fail(st, SD_ERR_DATA, "%s: invalid JSON: no text", name);
    reader r = {.name = name, .st = st};
    sd_code rc = parse_document(&r, json, cfg);
    if (rc) memset(cfg, 0, sizeof *cfg); // a failed parse leaves nothing half-filled behind
    return rc;
}

sd_code sd_config_load(const char *path, sd_config *cfg, sd_status *st) {
    memset(cfg, 0, sizeof *cfg);
    FILE *f = sd_fopen_regular(path, st); // a FIFO must not block, a directory is no config
    if (!f) return st ? st->code : SD_ERR_SYS;
    size_t cap = 4096, len = 0;
    char *text = malloc(cap);
    sd_code rc = SD_OK;
    while (text) {
        len += fread(text + len, 1, cap - 1 - len, f);
        if (ferror(f)) { rc = sd_fail(st, SD_ERR_SYS, "%s: cannot read: %s", path, strerror(errno)); break; }
        if (feof(f)) break;
        if (cap >= CONFIG_MAX_BYTES) { rc = sd_fail(st, SD_ERR_DATA, "%s: too large for a config.json (> %d bytes)", path, CONFIG_MAX_BYTES); break; }
        char *grown = realloc(text, cap * 2);
        if (!grown) { free(text); text = NULL; break; }
        text = grown;
        cap *= 2;
    }
    fclose(f);
    if (!text) return sd_fail(st, SD_ERR_SYS, "%s: out of memory reading the file", path);
    if (rc == SD_OK) {
        text[len] = '\0';
        if (strlen(text) != len)
            rc = sd_fail(st, SD_ERR_DATA, "%s: invalid JSON: contains a NUL byte at byte %zu", path, strlen(text));
        else
            rc = sd_config_parse(text, path, cfg, st);
    }
    free(text);
    return rc;
}

// ---------------------------------------------------------------------------------------------
// Writing

// Text that reads back (the way the reader reads it) to exactly `v`: "10000.0" for a whole
// number, else the shortest %.Ng that does. cJSON's own printer goes through double and would
// write 1e-5f as 9.99999974737875e-06.
static cJSON *exact_number(double v, bool as_float) {
    if (!isfinite(v)) return cJSON_CreateNull();
    char buf[40];
    if (v == floor(v) && fabs(v) < 1e15) { // every integer this small is exact in %.1f
        snprintf(buf, sizeof buf, "%.1f", v);
        return cJSON_CreateRaw(buf);
    }
    for (int digits = 1; digits <= 17; digits++) {
        snprintf(buf, sizeof buf, "%.*g", digits, v);
        double back = strtod(buf, NULL);
        if (as_float ? (float)back == (float)v : back == v) break;
    }
    return cJSON_CreateRaw(buf); // %.17g always reads back exactly, so the loop ends on a match
}

static cJSON *layer_list(const sd_config *c, sd_mixer mixer) {
    cJSON *list = cJSON_CreateArray();
    int L = c->num_hidden_layers < SD_MAX_LAYERS ? c->num_hidden_layers : SD_MAX_LAYERS;
    for (int i = 0; i < L && list; i++)
        if (c->mixer[i] == mixer) cJSON_AddItemToArray(list, cJSON_CreateNumber(i + 1));
    return list;
}

static cJSON *write_key(const key_spec *k, const sd_config *c) {
    const void *field = (const char *)c + k->offset;
    switch (k->kind) {
    case KEY_INT: return cJSON_CreateNumber(*(const int *)field);
    case KEY_FLOAT: return exact_number(*(const float *)field, true);
    case KEY_DOUBLE: return exact_number(*(const double *)field, false);
    case KEY_BOOL: return cJSON_CreateBool(*(const bool *)field);
    case KEY_CONST_STRING: return cJSON_CreateString(k->expected);
    case KEY_NULL: return cJSON_CreateNull();
    case KEY_SECTION: return cJSON_CreateObject();
    case KEY_LAYERS: return layer_list(c, k->mixer);
    }
    return NULL;
}

char *sd_config_to_json(const sd_config *cfg) {
    cJSON *root = cJSON_CreateObject();
    cJSON *linear = NULL;
    bool ok = root != NULL;
    for (size_t i = 0; i < N_CONFIG_KEYS && ok; i++) {
        const key_spec *k = &config_keys[i];
        cJSON *parent = root;
        const char *leaf = k->key;
        if (strncmp(k->key, LINEAR_PREFIX, strlen(LINEAR_PREFIX)) == 0) {
            parent = linear; // the KEY_SECTION entry comes first
            leaf = k->key + strlen(LINEAR_PREFIX);
        }
        cJSON *value = write_key(k, cfg);
        ok = parent && value && cJSON_AddItemToObject(parent, leaf, value);
        if (value && !ok) cJSON_Delete(value);
        if (ok && k->kind == KEY_SECTION) linear = value;
    }
    ok = ok && write_eos_token_id(root, cfg);
    char *text = ok ? cJSON_Print(root) : NULL;
    cJSON_Delete(root);
    return text;
}
