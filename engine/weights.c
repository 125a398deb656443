// weights.c — the tensor table of a config, the weight arena, and loading from safetensors.
#include "weights.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "sizes.h" // sd_size_mul4, sd_size_add, sd_mem_fit, sd_host_memory_bytes

typedef struct {
    sd_weight_spec *v;
    int n, cap;
    sd_code err;
} spec_list;

// A failed growth leaves the list as it was and stops it: every later push is refused, so no
// write lands past the capacity actually allocated.
static sd_weight_spec *push(spec_list *l, int layer, const char *name, sd_weight_role role) {
    if (l->err) return NULL;
    if (l->n == l->cap) {
        const int cap = l->cap ? 2 * l->cap : 256;
        sd_weight_spec *v = realloc(l->v, sizeof *v * (size_t)cap);
        if (!v) { l->err = SD_ERR_SYS; return NULL; }
        l->v = v;
        l->cap = cap;
    }
    sd_weight_spec *s = &l->v[l->n++];
    memset(s, 0, sizeof *s);
    if (layer >= 0) snprintf(s->name, sizeof s->name, "model.layers.%d.%s", layer, name);
    else snprintf(s->name, sizeof s->name, "%s", name);
    s->layer = layer;
    s->role = role;
    s->dtype = SD_DT_F32;
    return s;
}

static void add_mat(spec_list *l, int layer, const char *name, sd_weight_role role, sd_mat *m, int rows, int cols) {
    sd_weight_spec *s = push(l, layer, name, role);
    if (!s) return;
    s->ndim = 2; s->shape[0] = rows; s->shape[1] = cols;
    s->keep_dtype = true;
    s->mat = m;
    m->rows = rows; m->cols = cols;
}

static void add_vec(spec_list *l, int layer, const char *name, sd_weight_role role, float **v, int64_t rows, int64_t cols) {
    sd_weight_spec *s = push(l, layer, name, role);
    if (!s) return;
    s->ndim = cols ? 2 : 1; s->shape[0] = rows; s->shape[1] = cols;
    s->vec = v;
}

// A SwiGLU FFN's three Linears under `prefix`, named as the published checkpoints name them:
// gate_proj/up_proj/down_proj for the dense MLP and the shared experts, w1/w3/w2 (gate, up,
// down) for a routed expert.
typedef struct { const char *gate, *up, *down; } ffn_names;
static const ffn_names FFN_PROJ = {"gate_proj", "up_proj", "down_proj"};
static const ffn_names FFN_EXPERT = {"w1", "w3", "w2"};

static void add_ffn(spec_list *l, int layer, const char *prefix, const ffn_names *nm, sd_ffn_weights *f, int D, int I) {
    char name[96];
    snprintf(name, sizeof name, "%s.%s.weight", prefix, nm->gate);
    add_mat(l, layer, name, SD_ROLE_MATRIX, &f->gate, I, D);
    snprintf(name, sizeof name, "%s.%s.weight", prefix, nm->up);
    add_mat(l, layer, name, SD_ROLE_MATRIX, &f->up, I, D);
    snprintf(name, sizeof name, "%s.%s.weight", prefix, nm->down);
    add_mat(l, layer, name, SD_ROLE_RESIDUAL, &f->down, D, I);
}

static void add_kda(spec_list *l, int i, const sd_config *c, sd_kda_weights *k) {
    const int D = c->hidden_size, d = c->kda_head_dim, H = c->kda_num_heads, P = H * d, W = c->short_conv_kernel_size;
    add_mat(l, i, "self_attn.q_proj.weight", SD_ROLE_MATRIX, &k->q, P, D);
    add_mat(l, i, "self_attn.k_proj.weight", SD_ROLE_MATRIX, &k->k, P, D);
    add_mat(l, i, "self_attn.v_proj.weight", SD_ROLE_MATRIX, &k->v, P, D);
    add_vec(l, i, "self_attn.q_conv1d.weight", SD_ROLE_CONV, &k->q_conv, P, W);
    add_vec(l, i, "self_attn.k_conv1d.weight", SD_ROLE_CONV, &k->k_conv, P, W);
    add_vec(l, i, "self_attn.v_conv1d.weight", SD_ROLE_CONV, &k->v_conv, P, W);
    add_vec(l, i, "self_attn.A_log", SD_ROLE_A_LOG, &k->A_log, H, 0);
    add_vec(l, i, "self_attn.dt_bias", SD_ROLE_DT_BIAS, &k->dt_bias, P, 0);
    add_mat(l, i, "self_attn.f_a_proj.weight", SD_ROLE_MATRIX, &k->f_a, d, D);
    add_mat(l, i, "self_attn.f_b_proj.weight", SD_ROLE_MATRIX, &k->f_b, P, d);
    add_mat(l, i, "self_attn.b_proj.weight", SD_ROLE_MATRIX, &k->b, H, D);
    add_mat(l, i, "self_attn.g_a_proj.weight", SD_ROLE_MATRIX, &k->g_a, d, D);
    add_mat(l, i, "self_attn.g_b_proj.weight", SD_ROLE_MATRIX, &k->g_b, P, d);
    add_vec(l, i, "self_attn.o_norm.weight", SD_ROLE_NORM, &k->o_norm, d, 0);
    add_mat(l, i, "self_attn.o_proj.weight", SD_ROLE_RESIDUAL, &k->o, D, P);
}

static void add_mla(spec_list *l, int i, const sd_config *c, sd_mla_weights *m) {
    const int D = c->hidden_size, Hm = c->num_attention_heads, R = c->kv_lora_rank;
    const int dn = c->qk_nope_head_dim, dr = c->qk_rope_head_dim, dv = c->v_head_dim;
    add_mat(l, i, "self_attn.q_proj.weight", SD_ROLE_MATRIX, &m->q, Hm * (dn + dr), D);
    add_mat(l, i, "self_attn.kv_a_proj_with_mqa.weight", SD_ROLE_MATRIX, &m->kv_a, R + dr, D);
    add_vec(l, i, "self_attn.kv_a_layernorm.weight", SD_ROLE_NORM, &m->kv_a_norm, R, 0);
    add_mat(l, i, "self_attn.kv_b_proj.weight", SD_ROLE_MATRIX, &m->kv_b, Hm * (dn + dv), R);
    add_mat(l, i, "self_attn.o_proj.weight", SD_ROLE_RESIDUAL, &m->o, D, Hm * dv);
}

sd_code sd_weights_plan(const sd_config *c, sd_weights *w, sd_status *st) {
    const int D = c->hidden_size, V = c->vocab_size, L = c->num_hidden_layers, E = c->num_experts;
    memset(w, 0, sizeof *w);
    // The table's length from the config before it grows (sd_config_parse checks this too; a
    // shard's config is made, not parsed).
    if (sd_config_tensor_count(c) > SD_MAX_TENSORS)
        return sd_fail(st, SD_ERR_DATA, "key 'num_experts': the model would hold %lld tensors, more than %d (SD_MAX_TENSORS)",
                       (long long)sd_config_tensor_count(c), SD_MAX_TENSORS);
    w->layers = calloc(L, sizeof *w->layers);
    int n_moe = L - c->first_k_dense_replace;
    w->expert_pool = n_moe > 0 ? calloc((size_t)n_moe * E, sizeof *w->expert_pool) : NULL;
    if (!w->layers || (n_moe > 0 && !w->expert_pool)) return sd_fail(st, SD_ERR_SYS, "out of memory for the weight table");

    spec_list l = {0};
    add_mat(&l, -1, "model.embed_tokens.weight", SD_ROLE_EMBED, &w->embed, V, D);
    for (int i = 0; i < L; i++) {
        sd_layer_weights *ly = &w->layers[i];
        add_vec(&l, i, "input_layernorm.weight", SD_ROLE_NORM, &ly->input_norm, D, 0);
        add_vec(&l, i, "post_attention_layernorm.weight", SD_ROLE_NORM, &ly->post_norm, D, 0);
        ly->mixer = c->mixer[i];
        if (ly->mixer == SD_MIXER_KDA) add_kda(&l, i, c, &ly->kda);
        else add_mla(&l, i, c, &ly->mla);
        ly->is_moe = sd_config_is_moe(c, i);
        if (!ly->is_moe) {
            add_ffn(&l, i, "mlp", &FFN_PROJ, &ly->dense, D, c->intermediate_size);
            continue;
        }
        sd_moe_weights *moe = &ly->moe;
        moe->experts = w->expert_pool + (size_t)(i - c->first_k_dense_replace) * E;
        // MoE layers live under block_sparse_moe. (MODEL.md "Tensors"); the dense ones under mlp.
        add_vec(&l, i, "block_sparse_moe.gate.weight", SD_ROLE_ROUTER, &moe->router, E, D);
        add_vec(&l, i, "block_sparse_moe.gate.e_score_correction_bias", SD_ROLE_ROUTER_BIAS, &moe->bias, E, 0);
        for (int j = 0; j < E; j++) {
            if (!sd_config_holds_expert(c, j)) continue; // another rank's (a shard config)
            char prefix[48];
            snprintf(prefix, sizeof prefix, "block_sparse_moe.experts.%d", j);
            add_ffn(&l, i, prefix, &FFN_EXPERT, &moe->experts[j], D, c->moe_intermediate_size);
        }
        if (c->num_shared_experts > 0)
            add_ffn(&l, i, "block_sparse_moe.shared_experts", &FFN_PROJ, &moe->shared, D, sd_config_shared_width(c));
    }
    add_vec(&l, -1, "model.norm.weight", SD_ROLE_NORM, &w->final_norm, D, 0);
    if (!c->tie_word_embeddings) add_mat(&l, -1, "lm_head.weight", SD_ROLE_HEAD, &w->lm_head, sd_config_head_rows(c), D);
    w->specs = l.v;
    w->n_specs = l.n;
    if (l.err) return sd_fail(st, SD_ERR_SYS, "out of memory for the weight table");
    return SD_OK;
}

static size_t spec_bytes(const sd_weight_spec *s) {
    size_t n = (size_t)s->shape[0] * (size_t)(s->ndim == 2 ? s->shape[1] : 1);
    return n * sd_dtype_size(s->dtype);
}

sd_code sd_weights_arena_bytes(const sd_weights *w, uint64_t *bytes, sd_status *st) {
    sd_size total = {0};
    for (int i = 0; i < w->n_specs; i++) {
        const sd_weight_spec *s = &w->specs[i];
        bool over = s->shape[0] < 0 || s->shape[1] < 0;
        uint64_t b = sd_size_mul4((uint64_t)s->shape[0], s->ndim == 2 ? (uint64_t)s->shape[1] : 1, sd_dtype_size(s->dtype), 1, &over);
        sd_size_add(&total, over ? UINT64_MAX : b, 64);
    }
    if (total.over || total.bytes > SIZE_MAX)
        return sd_fail(st, SD_ERR_DATA, "the weights' byte count overflows (%d tensors)", w->n_specs);
    *bytes = total.bytes;
    return SD_OK;
}

sd_code sd_weights_alloc(sd_weights *w, sd_status *st) {
    sd_weight_spec *specs = w->specs;
    const int n = w->n_specs;
    uint64_t need;
    SD_TRY(sd_weights_arena_bytes(w, &need, st));
    SD_TRY(sd_mem_fit(need, sd_host_memory_bytes(), "the weights", "this host", st));
    const size_t total = (size_t)need;
    w->arena = aligned_alloc(64, total ? total : 64);
    if (!w->arena) return sd_fail(st, SD_ERR_SYS, "cannot allocate %zu bytes of weights", total);
    w->arena_bytes = total;
    char *p = w->arena;
    for (int i = 0; i < n; i++) {
        sd_weight_spec *s = &specs[i];
        if (s->keep_dtype) { s->mat->data = p; s->mat->dtype = s->dtype; }
        else *s->vec = (float *)p;
        p += (spec_bytes(s) + 63) & ~(size_t)63;
    }
    // Tied head: the embedding serves both (MODEL.md: no lm_head.weight then).
    if (!w->lm_head.data) w->lm_head = w->embed;
    return SD_OK;
}

void sd_weights_free(sd_weights *w) {
    free(w->arena);
    free(w->layers);
    free(w->expert_pool);
    free(w->specs);
    memset(w, 0, sizeof *w);
}

// A file shape matches the spec when equal, or (MODEL.md) [P,1,W] for a conv [P,W] and
// [1,1,Hk,1] for A_log [Hk].
static bool shape_matches(const sd_weight_spec *s, const sd_st_tensor *t) {
    if (t->ndim == s->ndim) {
        for (int d = 0; d < s->ndim; d++) if (t->shape[d] != s->shape[d]) return false;
        return true;
    }
    if (s->role == SD_ROLE_CONV && t->ndim == 3)
        return t->shape[0] == s->shape[0] && t->shape[1] == 1 && t->shape[2] == s->shape[1];
    if (s->role == SD_ROLE_A_LOG && t->ndim == 4)
        return t->shape[0] == 1 && t->shape[1] == 1 && t->shape[3] == 1 && t->shape[2] == s->shape[0];
    return false;
}

static void shape_str(const int64_t *shape, int ndim, char *buf, size_t len) {
    size_t o = (size_t)snprintf(buf, len, "[");
    for (int d = 0; d < ndim && o < len; d++) o += (size_t)snprintf(buf + o, len - o, d ? ", %lld" : "%lld", (long long)shape[d]);
    if (o < len) snprintf(buf + o, len - o, "]");
}

static void convert_to(const sd_st_tensor *t, sd_dtype to, void *dst) {
    int64_t n = sd_st_numel(t);
    if (t->dtype == to) { memcpy(dst, t->data, t->nbytes); return; } // data may be unaligned
    float *out = dst;
    const unsigned char *src = t->data;
    for (int64_t i = 0; i < n; i++) {
        uint16_t h;
        memcpy(&h, src + 2 * i, 2);
        out[i] = t->dtype == SD_DT_BF16 ? sd_bf16_to_f32(h) : sd_f16_to_f32(h);
    }
}

// A tensor of a layer at or beyond num_hidden_layers: a multi-token-prediction layer of the
// published checkpoints, not part of this model (MODEL.md "Tensors").
static bool beyond_last_layer(const char *name, int L) {
    const char *prefix = "model.layers.";
    if (strncmp(name, prefix, strlen(prefix)) != 0) return false;
    const char *p = name + strlen(prefix);
    long i = 0;
    int digits = 0;
    for (; *p >= '0' && *p <= '9' && digits < 9; p++, digits++) i = i * 10 + (*p - '0');
    return digits > 0 && *p == '.' && i >= L;
}

static bool skipped(const sd_config *cfg, const char *name) {
    if (cfg->tie_word_embeddings && strcmp(name, "lm_head.weight") == 0) return true; // the embedding is the head
    return beyond_last_layer(name, cfg->num_hidden_layers);
}

sd_code sd_weights_load(const sd_config *cfg, const sd_checkpoint *c, sd_weights *w, sd_status *st) {
    sd_code rc = sd_weights_plan(cfg, w, st);
    if (rc) { sd_weights_free(w); return rc; }
    sd_weight_spec *specs = w->specs;
    const int n = w->n_specs;
    bool *used = calloc((size_t)(c->n ? c->n : 1), sizeof *used);
    if (!used) { sd_weights_free(w); return sd_fail(st, SD_ERR_SYS, "out of memory for the tensor table"); }
    char want[64], got[64];
    for (int i = 0; i < n && !rc; i++) {
        sd_weight_spec *s = &specs[i];
        int at = sd_ckpt_find_index(c, s->name);
        if (at < 0) { rc = sd_fail(st, SD_ERR_DATA, "%s: missing tensor '%s'", sd_ckpt_path(c), s->name); break; }
        used[at] = true;
        const sd_st_tensor *t = c->entries[at].tensor;
        const char *path = c->shards[c->entries[at].shard].path;
        if (t->dtype != SD_DT_F32 && t->dtype != SD_DT_BF16 && t->dtype != SD_DT_F16) {
            rc = sd_fail(st, SD_ERR_DATA, "%s: tensor '%s': dtype %s is not F32, BF16 or F16", path, s->name, sd_dtype_name(t->dtype));
            break;
        }
        if (!shape_matches(s, t)) {
            shape_str(s->shape, s->ndim, want, sizeof want);
            shape_str(t->shape, t->ndim, got, sizeof got);
            rc = sd_fail(st, SD_ERR_DATA, "%s: tensor '%s': shape must be %s, got %s", path, s->name, want, got);
            break;
        }
        s->dtype = (s->keep_dtype && t->dtype == SD_DT_BF16) ? SD_DT_BF16 : SD_DT_F32;
    }
    // Every other tensor must be one the published checkpoints carry unused (skipped()): a stray
    // name is usually a config that does not describe this file (tied head, expert count).
    for (int i = 0; i < c->n && !rc; i++) {
        const char *name = c->entries[i].tensor->name;
        if (!used[i] && !skipped(cfg, name))
            rc = sd_fail(st, SD_ERR_DATA, "%s: tensor '%s' is not part of this config's model",
                         c->shards[c->entries[i].shard].path, name);
    }
    free(used);
    if (!rc) rc = sd_weights_alloc(w, st);
    if (!rc)
        for (int i = 0; i < n; i++) {
            const sd_weight_spec *s = &specs[i];
            convert_to(sd_ckpt_find(c, s->name, NULL), s->dtype, s->keep_dtype ? (void *)s->mat->data : (void *)*s->vec);
        }
    if (rc) sd_weights_free(w);
    return rc;
}
