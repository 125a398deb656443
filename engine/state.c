// state.c — one sequence's caches and their rollback bookkeeping (indexing rules: state.h).
#include "state.h"
#include "route.h" // sd_route_work_bytes
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// Bump allocator over one arena: the first pass (base == NULL) only measures.
typedef struct { char *base; size_t used; } bump;

static void *take(bump *b, size_t bytes) {
    void *p = b->base ? b->base + b->used : NULL;
    b->used += (bytes + 63) & ~(size_t)63;
    return p;
}
#define TAKE_F(b, n) ((float *)take((b), sizeof(float) * (size_t)(n)))

static void layout(sd_state *s, bump *b) {
    const sd_config *c = s->cfg;
    const size_t T = s->max_T, D = c->hidden_size, L = c->num_hidden_layers;
    const size_t Hk = c->kda_num_heads, d = c->kda_head_dim, P = Hk * d, W = c->short_conv_kernel_size;
    const size_t Hm = c->num_attention_heads, R = c->kv_lora_rank, dr = c->qk_rope_head_dim;
    const size_t dn = c->qk_nope_head_dim, dv = c->v_head_dim, E = c->num_experts, K = c->num_experts_per_token;
    size_t ffn = (size_t)c->intermediate_size;
    size_t moe_w = (size_t)c->moe_intermediate_size * (c->num_shared_experts > 1 ? c->num_shared_experts : 1);
    if (moe_w > ffn) ffn = moe_w;

    for (size_t i = 0; i < L; i++) {
        if (c->mixer[i] == SD_MIXER_KDA) {
            sd_kda_state *k = b->base ? &s->kda[i] : &(sd_kda_state){0};
            k->S = TAKE_F(b, (T + 1) * Hk * d * d);
            k->conv = TAKE_F(b, (T + W - 1) * 3 * P);
        } else {
            sd_mla_state *m = b->base ? &s->mla[i] : &(sd_mla_state){0};
            m->c = TAKE_F(b, (size_t)s->capacity * R);
            m->kpe = TAKE_F(b, (size_t)s->capacity * dr);
        }
    }
    sd_scratch *x = &s->scratch;
    x->x = TAKE_F(b, T * D); x->a = TAKE_F(b, T * D); x->mix = TAKE_F(b, T * D);
    x->q = TAKE_F(b, T * P); x->k = TAKE_F(b, T * P); x->v = TAKE_F(b, T * P);
    x->qc = TAKE_F(b, T * P); x->kc = TAKE_F(b, T * P); x->vc = TAKE_F(b, T * P);
    x->gate = TAKE_F(b, T * P); x->fa = TAKE_F(b, T * d); x->ga = TAKE_F(b, T * d);
    x->gb = TAKE_F(b, T * P); x->beta = TAKE_F(b, T * Hk); x->y = TAKE_F(b, T * P);
    x->mq = TAKE_F(b, T * Hm * (dn + dr)); x->kv = TAKE_F(b, T * (R + dr));
    x->qabs = TAKE_F(b, T * Hm * R); x->lat = TAKE_F(b, T * Hm * R); x->mo = TAKE_F(b, T * Hm * dv);
    x->scores = TAKE_F(b, Hm * (size_t)s->capacity);
    x->ffn_h1 = TAKE_F(b, T * ffn); x->ffn_h2 = TAKE_F(b, T * ffn);
    x->exp_out = TAKE_F(b, T * K * D); x->xg = TAKE_F(b, T * D); x->yg = TAKE_F(b, T * D);
    x->router = TAKE_F(b, T * E);
    x->route_work = take(b, sd_route_work_bytes(c));
    x->logits = TAKE_F(b, T * (size_t)c->vocab_size);
    x->sel = take(b, sizeof(int) * T * K);
    x->w = TAKE_F(b, T * K);
    s->cursor = take(b, 2 * sizeof(int));
    const sd_allocator *m = s->mem;
    if (m && m->scratch_bytes) s->backend_scratch = take(b, m->scratch_bytes(c, s->max_T, m->ctx));
}

// The cursor follows len and pending (state.h).
static void sync_cursor(sd_state *s) {
    if (s->mem) {
        s->mem->set_cursor(s->cursor, s->len, s->pending, s->mem->ctx);
    } else {
        s->cursor[0] = s->len;
        s->cursor[1] = s->pending;
    }
}

sd_code sd_state_init(sd_state *s, const sd_config *cfg, int capacity, int max_T, sd_status *st) {
    return sd_state_init_on(s, cfg, capacity, max_T, NULL, st);
}

sd_code sd_state_init_on(sd_state *s, const sd_config *cfg, int capacity, int max_T, const sd_allocator *mem,
                         sd_status *st) {
    memset(s, 0, sizeof *s);
    s->mem = mem;
    if (capacity < 1 || max_T < 1)
        return sd_fail(st, SD_ERR_USAGE, "state: capacity (%d) and max tokens per forward (%d) must be >= 1", capacity, max_T);
    s->cfg = cfg;
    s->capacity = capacity;
    s->max_T = max_T;
    s->kda = calloc(cfg->num_hidden_layers, sizeof *s->kda);
    s->mla = calloc(cfg->num_hidden_layers, sizeof *s->mla);
    bump measure = {0};
    layout(s, &measure);
    s->arena = mem ? mem->alloc(measure.used, mem->ctx) : aligned_alloc(64, measure.used);
    if (!s->kda || !s->mla || !s->arena) {
        sd_state_free(s);
        return sd_fail(st, SD_ERR_SYS, "state: cannot allocate %zu bytes for %d positions", measure.used, capacity);
    }
    s->arena_bytes = measure.used;
    bump real = {.base = s->arena};
    layout(s, &real);
    sd_state_reset(s);
    return SD_OK;
}

void sd_state_free(sd_state *s) {
    if (s->mem && s->arena) s->mem->free(s->arena, s->mem->ctx);
    else free(s->arena);
    free(s->kda);
    free(s->mla);
    memset(s, 0, sizeof *s);
}

// Zero history: S = 0 and zero conv inputs before position 0 are what MODEL.md starts from.
// Clearing the whole arena is simplest and also makes scratch deterministic.
void sd_state_reset(sd_state *s) {
    if (s->mem) s->mem->zero(s->arena, s->arena_bytes, s->mem->ctx);
    else memset(s->arena, 0, s->arena_bytes);
    s->len = 0;
    s->pending = 0;
    sync_cursor(s);
}

void sd_state_advance(sd_state *s, int T) {
    s->pending += T;
    if (!s->mem) s->cursor[1] = s->pending;
}

sd_code sd_state_commit(sd_state *s, int n, sd_status *st) {
    if (n < 0 || n > s->pending)
        return sd_fail(st, SD_ERR_USAGE, "state: commit(%d) with %d pending positions", n, s->pending);
    s->len += n;
    s->pending = 0;
    sync_cursor(s);
    return SD_OK;
}

void sd_state_committed_on_device(sd_state *s, int n) {
    s->len += n;
    s->pending = 0;
}

float *sd_state_kda_S(const sd_state *s, int layer, int n) {
    const sd_config *c = s->cfg;
    size_t per_slot = (size_t)c->kda_num_heads * c->kda_head_dim * c->kda_head_dim;
    return s->kda[layer].S + (size_t)sd_state_slot(s, n) * per_slot;
}

void sd_state_live_hash(const sd_state *s, char hex[65]) {
    const sd_config *c = s->cfg;
    const int P = sd_config_kda_dim(c), W = c->short_conv_kernel_size;
    const size_t S_bytes = sizeof(float) * c->kda_num_heads * c->kda_head_dim * c->kda_head_dim;
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    EVP_DigestInit_ex(ctx, EVP_sha256(), NULL);
    EVP_DigestUpdate(ctx, &s->len, sizeof s->len);
    float *zeros = calloc(3 * (size_t)P, sizeof(float));
    for (int i = 0; i < c->num_hidden_layers; i++) {
        if (c->mixer[i] == SD_MIXER_KDA) {
            EVP_DigestUpdate(ctx, sd_state_kda_S(s, i, s->len), S_bytes);
            for (int p = s->len - (W - 1); p < s->len; p++) {
                const float *row = p < 0 ? zeros : s->kda[i].conv + (size_t)sd_state_conv_row(s, p) * 3 * P;
                EVP_DigestUpdate(ctx, row, sizeof(float) * 3 * P);
            }
        } else {
            EVP_DigestUpdate(ctx, s->mla[i].c, sizeof(float) * (size_t)s->len * c->kv_lora_rank);
            EVP_DigestUpdate(ctx, s->mla[i].kpe, sizeof(float) * (size_t)s->len * c->qk_rope_head_dim);
        }
    }
    free(zeros);
    unsigned char md[32];
    EVP_DigestFinal_ex(ctx, md, NULL);
    EVP_MD_CTX_free(ctx);
    for (int i = 0; i < 32; i++) snprintf(hex + 2 * i, 3, "%02x", md[i]);
}
