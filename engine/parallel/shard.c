// shard.c — a rank's config and weights from the whole model (shard.h; the split: plan.h).
#include "shard.h"
#include <math.h>
#include <string.h>
#include "backend.h" // sd_backend (its name)

void sd_tp_shard_config(const sd_config *full, const sd_tp_plan *p, int rank, sd_config *out) {
    const sd_tp_share *s = &p->rank[rank];
    *out = *full;
    out->kda_num_heads = s->kda_heads.count;
    out->num_attention_heads = s->mla_heads.count;
    out->intermediate_size = s->dense.count;
    out->tie_word_embeddings = false;
    out->shard = (sd_config_shard){.ranks = p->ranks, .rank = rank,
                                   .expert_first = s->experts.first, .expert_count = s->experts.count,
                                   .shared_width = s->shared.count,
                                   .vocab_first = s->vocab.first, .vocab_count = s->vocab.count};
}

// The walk over the paired weight structs, in the visitor's terms (shard.h).
static void rows(const sd_tp_slicer *v, sd_mat *dst, const sd_mat *src, int first) { v->mat(v->ctx, dst, src, false, first); }
static void cols(const sd_tp_slicer *v, sd_mat *dst, const sd_mat *src, int first) { v->mat(v->ctx, dst, src, true, first); }
static void whole(const sd_tp_slicer *v, sd_mat *dst, const sd_mat *src) { rows(v, dst, src, 0); }
static void vec(const sd_tp_slicer *v, float **dst, float *const *src, size_t first, size_t n) {
    v->vec(v->ctx, dst, src, first, n);
}

// A SwiGLU FFN split by its intermediate columns [first, first + the shard's width).
static void ffn(const sd_tp_slicer *v, sd_ffn_weights *dst, const sd_ffn_weights *src, int first) {
    rows(v, &dst->gate, &src->gate, first);
    rows(v, &dst->up, &src->up, first);
    cols(v, &dst->down, &src->down, first);
}

// KDA by heads: q/k/v, f_b, g_b, b and the per-channel conv taps, dt_bias and A_log by their
// heads' rows; o_proj by its input columns; f_a, g_a (the low-rank halves every head reads) and
// o_norm (one weight per head dimension, shared by the heads) whole.
static void kda(const sd_tp_slicer *v, sd_kda_weights *dst, const sd_kda_weights *src, const sd_config *c, sd_tp_range h) {
    const int d = c->kda_head_dim, W = c->short_conv_kernel_size, ch = h.first * d;
    const size_t n = (size_t)h.count * d;
    rows(v, &dst->q, &src->q, ch);
    rows(v, &dst->k, &src->k, ch);
    rows(v, &dst->v, &src->v, ch);
    vec(v, &dst->q_conv, &src->q_conv, (size_t)ch * W, n * W);
    vec(v, &dst->k_conv, &src->k_conv, (size_t)ch * W, n * W);
    vec(v, &dst->v_conv, &src->v_conv, (size_t)ch * W, n * W);
    vec(v, &dst->A_log, &src->A_log, (size_t)h.first, (size_t)h.count);
    vec(v, &dst->dt_bias, &src->dt_bias, (size_t)ch, n);
    whole(v, &dst->f_a, &src->f_a);
    rows(v, &dst->f_b, &src->f_b, ch);
    rows(v, &dst->b, &src->b, h.first);
    whole(v, &dst->g_a, &src->g_a);
    rows(v, &dst->g_b, &src->g_b, ch);
    vec(v, &dst->o_norm, &src->o_norm, 0, (size_t)d);
    cols(v, &dst->o, &src->o, ch);
}

// MLA by heads: q and kv_b by their heads' rows, o_proj by its input columns; kv_a and its norm
// (the latent every head attends over) whole.
static void mla(const sd_tp_slicer *v, sd_mla_weights *dst, const sd_mla_weights *src, const sd_config *c, sd_tp_range h) {
    const int dn = c->qk_nope_head_dim, dr = c->qk_rope_head_dim, dv = c->v_head_dim;
    rows(v, &dst->q, &src->q, h.first * (dn + dr));
    whole(v, &dst->kv_a, &src->kv_a);
    vec(v, &dst->kv_a_norm, &src->kv_a_norm, 0, (size_t)c->kv_lora_rank);
    rows(v, &dst->kv_b, &src->kv_b, h.first * (dn + dv));
    cols(v, &dst->o, &src->o, h.first * dv);
}

// MoE: the router and its bias whole (every rank routes alike), the held experts whole, the
// shared experts by their intermediate columns.
static void moe(const sd_tp_slicer *v, sd_moe_weights *dst, const sd_moe_weights *src, const sd_config *c, const sd_tp_share *s) {
    const int E = c->num_experts, D = c->hidden_size;
    vec(v, &dst->router, &src->router, 0, (size_t)E * D);
    vec(v, &dst->bias, &src->bias, 0, (size_t)E);
    for (int e = s->experts.first; e < s->experts.first + s->experts.count; e++) {
        whole(v, &dst->experts[e].gate, &src->experts[e].gate);
        whole(v, &dst->experts[e].up, &src->experts[e].up);
        whole(v, &dst->experts[e].down, &src->experts[e].down);
    }
    if (c->num_shared_experts > 0) ffn(v, &dst->shared, &src->shared, s->shared.first);
}

void sd_tp_shard_visit(const sd_tp_plan *p, int rank, const sd_config *c, sd_weights *dst, const sd_weights *src,
                       const sd_tp_slicer *v) {
    const sd_tp_share *s = &p->rank[rank];
    const int D = c->hidden_size;
    whole(v, &dst->embed, &src->embed);
    vec(v, &dst->final_norm, &src->final_norm, 0, (size_t)D);
    rows(v, &dst->lm_head, c->tie_word_embeddings ? &src->embed : &src->lm_head, s->vocab.first);
    for (int i = 0; i < c->num_hidden_layers; i++) {
        sd_layer_weights *dl = &dst->layers[i];
        const sd_layer_weights *sl = &src->layers[i];
        vec(v, &dl->input_norm, &sl->input_norm, 0, (size_t)D);
        vec(v, &dl->post_norm, &sl->post_norm, 0, (size_t)D);
        if (sl->mixer == SD_MIXER_KDA) kda(v, &dl->kda, &sl->kda, c, s->kda_heads);
        else mla(v, &dl->mla, &sl->mla, c, s->mla_heads);
        if (sl->is_moe) moe(v, &dl->moe, &sl->moe, c, s);
        else ffn(v, &dl->dense, &sl->dense, s->dense.first);
    }
}

// The host shard's two visits: the dtypes (before its arena exists), then the copies.
static void dtype_mat(void *ctx, sd_mat *dst, const sd_mat *src, bool by_cols, int first) {
    (void)ctx, (void)by_cols, (void)first;
    dst->dtype = src->dtype;
}
static void dtype_vec(void *ctx, float **dst, float *const *src, size_t first, size_t n) { (void)ctx, (void)dst, (void)src, (void)first, (void)n; }

static void copy_mat(void *ctx, sd_mat *dst, const sd_mat *src, bool by_cols, int first) {
    (void)ctx;
    const size_t e = sd_dtype_size(src->dtype);
    if (!by_cols) {
        const size_t row = (size_t)src->cols * e;
        memcpy((void *)dst->data, (const char *)src->data + (size_t)first * row, (size_t)dst->rows * row);
        return;
    }
    const size_t n = (size_t)dst->cols * e;
    for (int r = 0; r < src->rows; r++)
        memcpy((char *)dst->data + (size_t)r * n, (const char *)src->data + ((size_t)r * src->cols + first) * e, n);
}
static void copy_vec(void *ctx, float **dst, float *const *src, size_t first, size_t n) {
    (void)ctx;
    memcpy(*dst, *src + first, n * sizeof(float));
}

sd_code sd_tp_shard_model(const sd_model *full, const sd_tp_plan *p, int rank, sd_model *out, sd_status *st) {
    memset(out, 0, sizeof *out);
    if (full->backend)
        return sd_fail(st, SD_ERR_USAGE, "tp shard: the whole model must be a host model (it is on %s)", full->backend->name);
    if (rank < 0 || rank >= p->ranks) return sd_fail(st, SD_ERR_USAGE, "tp shard: rank %d of %d", rank, p->ranks);
    sd_tp_shard_config(&full->cfg, p, rank, &out->cfg);
    sd_code rc = sd_weights_plan(&out->cfg, &out->w, st);
    if (!rc) {
        sd_tp_shard_visit(p, rank, &full->cfg, &out->w, &full->w, &(sd_tp_slicer){.mat = dtype_mat, .vec = dtype_vec});
        for (int i = 0; i < out->w.n_specs; i++) {
            sd_weight_spec *s = &out->w.specs[i];
            s->dtype = s->keep_dtype ? s->mat->dtype : SD_DT_F32;
        }
        rc = sd_weights_alloc(&out->w, st);
    }
    if (rc) {
        sd_weights_free(&out->w);
        return rc;
    }
    sd_tp_shard_visit(p, rank, &full->cfg, &out->w, &full->w, &(sd_tp_slicer){.mat = copy_mat, .vec = copy_vec});
    memcpy(out->config_sha256, full->config_sha256, sizeof out->config_sha256);
    memcpy(out->weights_sha256, full->weights_sha256, sizeof out->weights_sha256);
    return SD_OK;
}

sd_code sd_tp_shard_canary(sd_model *shard, int layer, sd_status *st) {
    const sd_config *c = &shard->cfg;
    if (layer < c->first_k_dense_replace || layer >= c->num_hidden_layers)
        return sd_fail(st, SD_ERR_USAGE, "tp canary: layer %d is not an MoE layer (%d..%d)", layer, c->first_k_dense_replace,
                       c->num_hidden_layers - 1);
    float *w = shard->w.layers[layer].post_norm;
    for (int i = 0; i < c->hidden_size; i++) w[i] = nextafterf(w[i], INFINITY);
    return SD_OK;
}
