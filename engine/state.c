// state.c — one sequence's caches and their rollback bookkeeping (indexing rules: state.h).
#include "state.h"
#include "route.h" // sd_route_work_bytes
#include "sizes.h" // sd_size, sd_size_mul4, sd_mem_fit
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// Bump allocator over one arena: the first pass (base == NULL) only measures, in 64 bits with
// overflow checks (a config's widths and a run's capacity can multiply past size_t); `over`
// marks a measure that wrapped, which sd_state_init_on refuses before allocating.
typedef struct { char *base; sd_size used; } bump;

static void *take(bump *b, uint64_t bytes) {
    void *p = b->base ? b->base + b->used.bytes : NULL;
    sd_size_add(&b->used, bytes, 64);
    return p;
}
// Floats of a product of up to four counts.
static float *take_f(bump *b, uint64_t n0, uint64_t n1, uint64_t n2, uint64_t n3) {
    return take(b, sd_size_mul4(sizeof(float), n0, n1, sd_size_mul4(n2, n3, 1, 1, &b->used.over), &b->used.over));
}
#define TAKE_F(b, ...) TAKE_F_(b, __VA_ARGS__, 1, 1, 1)
#define TAKE_F_(b, n0, n1, n2, n3, ...) take_f((b), (n0), (n1), (n2), (n3))

static void layout(sd_state *s, bump *b) {
    const sd_config *c = s->cfg;
    const uint64_t T = (uint64_t)s->max_T, D = (uint64_t)c->hidden_size, L = (uint64_t)c->num_hidden_layers;
    const uint64_t Hk = (uint64_t)c->kda_num_heads, d = (uint64_t)c->kda_head_dim, P = Hk * d, W = (uint64_t)c->short_conv_kernel_size;
    const uint64_t Hm = (uint64_t)c->num_attention_heads, R = (uint64_t)c->kv_lora_rank, dr = (uint64_t)c->qk_rope_head_dim;
    const uint64_t dn = (uint64_t)c->qk_nope_head_dim, dv = (uint64_t)c->v_head_dim, E = (uint64_t)c->num_experts;
    const uint64_t K = (uint64_t)c->num_experts_per_token, cap = (uint64_t)s->capacity;
    uint64_t ffn = (uint64_t)c->intermediate_size;
    uint64_t moe_w = (uint64_t)c->moe_intermediate_size * (uint64_t)(c->num_shared_experts > 1 ? c->num_shared_experts : 1);
    if (moe_w > ffn) ffn = moe_w;

    for (size_t i = 0; i < L; i++) {
        if (c->mixer[i] == SD_MIXER_KDA) {
            sd_kda_state *k = b->base ? &s->kda[i] : &(sd_kda_state){0};
            k->S = TAKE_F(b, T + 1, Hk, d, d);
            k->conv = TAKE_F(b, T + W - 1, 3, P);
        } else {
            sd_mla_state *m = b->base ? &s->mla[i] : &(sd_mla_state){0};
            m->c = TAKE_F(b, cap, R);
            m->kpe = TAKE_F(b, cap, dr);
        }
    }
    sd_scratch *x = &s->scratch;
    x->x = TAKE_F(b, T, D); x->a = TAKE_F(b, T, D); x->mix = TAKE_F(b, T, D);
    x->q = TAKE_F(b, T, P); x->k = TAKE_F(b, T, P); x->v = TAKE_F(b, T, P);
    x->qc = TAKE_F(b, T, P); x->kc = TAKE_F(b, T, P); x->vc = TAKE_F(b, T, P);
    x->gate = TAKE_F(b, T, P); x->fa = TAKE_F(b, T, d); x->ga = TAKE_F(b, T, d);
    x->gb = TAKE_F(b, T, P); x->beta = TAKE_F(b, T, Hk); x->y = TAKE_F(b, T, P);
    x->mq = TAKE_F(b, T, Hm, dn + dr); x->kv = TAKE_F(b, T, R + dr);
    x->qabs = TAKE_F(b, T, Hm, R); x->lat = TAKE_F(b, T, Hm, R); x->mo = TAKE_F(b, T, Hm, dv);
    x->scores = TAKE_F(b, Hm, cap);
    x->ffn_h1 = TAKE_F(b, T, ffn); x->ffn_h2 = TAKE_F(b, T, ffn);
    x->exp_out = TAKE_F(b, T, K, D); x->xg = TAKE_F(b, T, D); x->yg = TAKE_F(b, T, D);
    x->router = TAKE_F(b, T, E);
    x->route_work = take(b, sd_route_work_bytes(c));
    x->logits = TAKE_F(b, T, (uint64_t)c->vocab_size);
    x->sel = take(b, sd_size_mul4(sizeof(int), T, K, 1, &b->used.over));
    x->w = TAKE_F(b, T, K);
    x->expert_rows = take(b, sd_size_mul4(2 * sizeof(int), T, K, 1, &b->used.over));
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
    bump measure = {0};
    layout(s, &measure);
    if (measure.used.over || measure.used.bytes > SIZE_MAX) {
        memset(s, 0, sizeof *s);
        return sd_fail(st, SD_ERR_DATA, "state: %d positions, %d tokens per forward: the byte count overflows 64 bits",
                       capacity, max_T);
    }
    const uint64_t need = measure.used.bytes;
    if (!mem) { // a device allocator checks its own memory (e.g. engine/cuda: the device's free bytes)
        sd_code rc = sd_mem_fit(need, sd_host_memory_bytes(), "the state's caches and scratch", "this host", st);
        if (rc) { memset(s, 0, sizeof *s); return rc; }
    }
    s->kda = calloc(cfg->num_hidden_layers, sizeof *s->kda);
    s->mla = calloc(cfg->num_hidden_layers, sizeof *s->mla);
    s->arena = mem ? mem->alloc(need, mem->ctx) : aligned_alloc(64, need);
    if (!s->kda || !s->mla || !s->arena) {
        sd_state_free(s);
        char got[32];
        return sd_fail(st, SD_ERR_SYS, "state: cannot allocate %s for %d positions", sd_size_str(need, got), capacity);
    }
    s->arena_bytes = need;
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
