// config_sizes.c — the sizes a config implies, computed from the config alone before anything
// is allocated (config.h sd_config_check_sizes, sd_config_weight_bytes).
//
// Every width that the engine stores in an int (a matrix's rows or columns, a state row) must
// fit in an int; the weights (counted at F32, the widest dtype a model holds) must stay under
// SD_MAX_MODEL_BYTES and the tensor table under SD_MAX_TENSORS. Each refusal names the key whose
// value drives the size at fault.
#include "config.h"
#include <limits.h>
#include <string.h>
#include "sizes.h" // sd_size_mul4, sd_size_add, sd_size_str

// One width: a product of config values that must fit an int.
typedef struct {
    const char *key, *what;
    int64_t a, b, c; // the factors (1 where unused) ...
    int64_t plus;    // ... plus this
} width_rule;

// The weights by the key that drives each part, in floats. Exact in 128 bits: every config
// value is below 2^31 and no part multiplies more than four of them with a layer count (< 2^9).
typedef unsigned __int128 u128;
typedef struct {
    const char *key;
    u128 floats;
} weight_part;

#define MAX_PARTS 12

typedef struct {
    weight_part part[MAX_PARTS];
    int n;
} parts;

static void part(parts *p, const char *key, u128 floats) {
    for (int i = 0; i < p->n; i++)
        if (!strcmp(p->part[i].key, key)) { p->part[i].floats += floats; return; } // one key's parts add up
    p->part[p->n++] = (weight_part){key, floats};
}

static void weight_parts(const sd_config *c, parts *p) {
    const u128 D = (u128)c->hidden_size, V = (u128)c->vocab_size;
    const u128 Hk = (u128)c->kda_num_heads, d = (u128)c->kda_head_dim, P = Hk * d, W = (u128)c->short_conv_kernel_size;
    const u128 Hm = (u128)c->num_attention_heads, R = (u128)c->kv_lora_rank, dn = (u128)c->qk_nope_head_dim;
    const u128 dr = (u128)c->qk_rope_head_dim, dv = (u128)c->v_head_dim;
    const u128 E = (u128)c->num_experts, S = (u128)c->num_shared_experts, Ie = (u128)c->moe_intermediate_size;
    const u128 L = (u128)c->num_hidden_layers, F = (u128)c->first_k_dense_replace;
    u128 n_kda = 0, n_mla = 0;
    for (int i = 0; i < c->num_hidden_layers && i < SD_MAX_LAYERS; i++) {
        if (c->mixer[i] == SD_MIXER_KDA) n_kda++;
        else n_mla++;
    }
    part(p, "vocab_size", (c->tie_word_embeddings ? 1 : 2) * V * D);
    part(p, "hidden_size", (2 * L + 1) * D);
    // KDA: q, k, v, o (P·D each); f_a, g_a (d·D), f_b, g_b (P·d); b (Hk·D), A_log; convs; dt_bias, o_norm.
    part(p, "linear_attn_config.num_heads", n_kda * (4 * P * D + Hk * (D + 1) + P + d));
    part(p, "linear_attn_config.head_dim", n_kda * 2 * d * (D + P));
    part(p, "linear_attn_config.short_conv_kernel_size", n_kda * 3 * P * W);
    // MLA: q, kv_b, o; kv_a and its norm.
    part(p, "num_attention_heads", n_mla * Hm * ((dn + dr) * D + (dn + dv) * R + dv * D));
    part(p, "kv_lora_rank", n_mla * (R + dr) * (D + 1));
    part(p, "intermediate_size", F * 3 * (u128)c->intermediate_size * D);
    part(p, "num_experts", (L - F) * E * (3 * Ie * D + D + 1));
    part(p, "num_shared_experts", (L - F) * S * 3 * Ie * D);
}

sd_code sd_config_weight_bytes(const sd_config *c, uint64_t *bytes, const char **key) {
    parts p = {0};
    weight_parts(c, &p);
    u128 total = 0, largest = 0;
    *key = NULL;
    for (int i = 0; i < p.n; i++) {
        total += p.part[i].floats;
        if (p.part[i].floats >= largest) { largest = p.part[i].floats; *key = p.part[i].key; }
    }
    total *= sizeof(float);
    *bytes = total > UINT64_MAX ? UINT64_MAX : (uint64_t)total;
    return total > UINT64_MAX ? SD_ERR_DATA : SD_OK;
}

int64_t sd_config_tensor_count(const sd_config *c) {
    int64_t n = 2 + (c->tie_word_embeddings ? 0 : 1); // embedding, final norm, head
    for (int i = 0; i < c->num_hidden_layers && i < SD_MAX_LAYERS; i++) {
        n += 2 + (c->mixer[i] == SD_MIXER_KDA ? 15 : 5);
        n += sd_config_is_moe(c, i) ? 2 + 3 * (int64_t)c->num_experts + (c->num_shared_experts > 0 ? 3 : 0) : 3;
    }
    return n;
}

sd_code sd_config_check_sizes(const sd_config *c, const char *name, sd_status *st) {
    const int64_t Hk = c->kda_num_heads, d = c->kda_head_dim, Hm = c->num_attention_heads;
    const int64_t R = c->kv_lora_rank, dn = c->qk_nope_head_dim, dr = c->qk_rope_head_dim, dv = c->v_head_dim;
    const width_rule widths[] = {
        {"linear_attn_config.num_heads", "num_heads x head_dim x 3 (a KDA conv row)", Hk, d, 3, 0},
        {"linear_attn_config.head_dim", "head_dim x head_dim (a KDA state)", d, d, Hk, 0},
        {"num_attention_heads", "num_attention_heads x (qk_nope_head_dim + qk_rope_head_dim)", Hm, dn + dr, 1, 0},
        {"num_attention_heads", "num_attention_heads x (qk_nope_head_dim + v_head_dim)", Hm, dn + dv, 1, 0},
        {"num_attention_heads", "num_attention_heads x kv_lora_rank", Hm, R, 1, 0},
        {"kv_lora_rank", "kv_lora_rank + qk_rope_head_dim", R, 1, 1, dr},
        {"num_shared_experts", "num_shared_experts x moe_intermediate_size", c->num_shared_experts, c->moe_intermediate_size, 1, 0},
        {"num_experts", "num_experts x 2 + num_expert_group (the router's work)", c->num_experts, 2, 1, c->num_expert_group},
    };
    for (size_t i = 0; i < sizeof widths / sizeof widths[0]; i++) {
        const width_rule *w = &widths[i];
        bool over = false;
        uint64_t v = sd_size_mul4((uint64_t)w->a, (uint64_t)w->b, (uint64_t)w->c, 1, &over) + (uint64_t)w->plus;
        if (over || v > INT_MAX)
            return sd_fail(st, SD_ERR_DATA, "%s: key '%s': %s must be <= %d, got %s%llu", name, w->key, w->what, INT_MAX,
                           over ? "more than " : "", over ? (unsigned long long)UINT64_MAX : (unsigned long long)v);
    }
    const int64_t n_tensors = sd_config_tensor_count(c);
    if (n_tensors > SD_MAX_TENSORS)
        return sd_fail(st, SD_ERR_DATA, "%s: key 'num_experts': the model would hold %lld tensors, more than the %d this "
                       "engine loads (SD_MAX_TENSORS)", name, (long long)n_tensors, SD_MAX_TENSORS);
    uint64_t bytes;
    const char *key;
    char got[32], bound[32];
    if (sd_config_weight_bytes(c, &bytes, &key))
        return sd_fail(st, SD_ERR_DATA, "%s: key '%s': the model's weights overflow a 64-bit byte count", name, key);
    if (bytes > SD_MAX_MODEL_BYTES)
        return sd_fail(st, SD_ERR_DATA, "%s: key '%s': the model's weights (F32) would need %s, more than the %s this "
                       "engine loads (SD_MAX_MODEL_BYTES; the largest part is this key's)", name, key,
                       sd_size_str(bytes, got), sd_size_str(SD_MAX_MODEL_BYTES, bound));
    return SD_OK;
}
