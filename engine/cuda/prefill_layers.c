// prefill_layers.c — the sublayers of a prefill piece (prefill_internal.h): model.c's layer walk
// over C tokens at once, each sublayer the GEMMs of kernels/gemm.h around the kernels of
// kernels/{kda,mla,moe}_prefill.h, its output added into the residual stream (o_proj and the dense
// down with the add fused into the GEMM: beta = 1; the MoE through its combine).
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>
#include "check.h"          // SD_CUDA_CHECK
#include "kda_prefill.h"    // sd_cuda_kda_prefill_conv, _ring, sd_cuda_kda_chunk, sd_cuda_kda_prefill_out
#include "mla_prefill.h"    // sd_cuda_mla_prefill_cache, _pack_*, sd_cuda_mla_flash, sd_mla_*_width
#include "moe_grouped.h"    // sd_cuda_moe_grouped_plan, sd_cuda_moe_grouped_gemm
#include "moe_prefill.h"    // sd_cuda_moe_prefill_*, sd_cuda_gather_rows, sd_cuda_swiglu_rows
#include "prefill_internal.h"

#define TRY(call)                    \
    do {                             \
        sd_code try_rc_ = (call);    \
        if (try_rc_) return try_rc_; \
    } while (0)

static bool bf16(const sd_mat *w) { return w->dtype == SD_DT_BF16; }
static size_t esize(const sd_mat *w) { return bf16(w) ? 2 : 4; }

bool sd_prefill_stacked(const sd_mat *a, const sd_mat *b, sd_mat *out) {
    if (a->dtype != b->dtype || a->cols != b->cols) return false;
    if ((const char *)b->data != (const char *)a->data + (size_t)a->rows * a->cols * esize(a)) return false;
    *out = (sd_mat){.dtype = a->dtype, .data = a->data, .rows = a->rows + b->rows, .cols = a->cols};
    return true;
}

sd_code sd_prefill_lin_a(sd_prefill_scratch *p, sd_cuda_backend *b, const sd_mat *w, int M, float *y, int ldy, float beta,
                         sd_status *st) {
    if (bf16(w)) return sd_gemm_linear_bf16(p->gemm, w, p->a16, w->cols, M, y, ldy, beta, b->stream, st);
    return sd_gemm_linear(p->gemm, w, p->a, w->cols, M, y, ldy, beta, b->stream, st);
}

// y (M, ld ldy) = x · wᵀ for activations x whose dtype the producing kernel chose to match w.
static sd_code lin_act(sd_prefill_scratch *p, sd_cuda_backend *b, const sd_mat *w, const void *x, int ldx, int M, float *y,
                       int ldy, float beta, sd_status *st) {
    if (bf16(w)) return sd_gemm_linear_bf16(p->gemm, w, x, ldx, M, y, ldy, beta, b->stream, st);
    return sd_gemm_linear(p->gemm, w, x, ldx, M, y, ldy, beta, b->stream, st);
}

// Two Linears of the normed input into the columns [0, a.rows) and [a.rows, a.rows + b.rows) of y
// (ld ldy): one GEMM when the matrices are stacked in memory.
static sd_code lin_pair(sd_prefill_scratch *p, sd_cuda_backend *b, const sd_mat *wa, const sd_mat *wb, int M, float *y,
                        int ldy, sd_status *st) {
    sd_mat both;
    if (sd_prefill_stacked(wa, wb, &both)) return sd_prefill_lin_a(p, b, &both, M, y, ldy, 0.0f, st);
    TRY(sd_prefill_lin_a(p, b, wa, M, y, ldy, 0.0f, st));
    return sd_prefill_lin_a(p, b, wb, M, y + wa->rows, ldy, 0.0f, st);
}

// ---------------------------------------------------------------------------- KDA
sd_code sd_prefill_kda_mixer(sd_cuda_backend *b, sd_prefill_scratch *p, const sd_model *m, sd_state *s, int i, int C,
                             sd_status *st) {
    const sd_config *c = &m->cfg;
    const sd_kda_weights *w = &m->w.layers[i].kda;
    const int H = c->kda_num_heads, d = c->kda_head_dim, P = H * d, W = c->short_conv_kernel_size, pos0 = s->len;
    const int n_rows = s->max_T + W - 1, ld_b = (H + 3) / 4 * 4; // beta rows padded to 16 bytes for the GEMM
    sd_prefill_kda *k = &p->kda;
    cudaStream_t q = b->stream;
    // The projections of the normed input: [q | k | v] rows (one GEMM when stacked), the gates.
    sd_mat qk;
    if (sd_prefill_stacked(&w->q, &w->k, &qk)) TRY(lin_pair(p, b, &qk, &w->v, C, k->qkv, 3 * P, st));
    else {
        TRY(sd_prefill_lin_a(p, b, &w->q, C, k->qkv, 3 * P, 0.0f, st));
        TRY(lin_pair(p, b, &w->k, &w->v, C, k->qkv + P, 3 * P, st));
    }
    TRY(sd_prefill_lin_a(p, b, &w->f_a, C, k->fa, d, 0.0f, st));
    TRY(sd_prefill_lin_a(p, b, &w->b, C, k->beta, ld_b, 0.0f, st));
    TRY(sd_prefill_lin_a(p, b, &w->g_a, C, k->ga, d, 0.0f, st));
    TRY(sd_gemm_linear(p->gemm, &w->f_b, k->fa, d, C, k->gate, P, 0.0f, q, st));
    TRY(sd_gemm_linear(p->gemm, &w->g_b, k->ga, d, C, k->gb, P, 0.0f, q, st));
    float *ring = s->kda[i].conv;
    TRY(sd_cuda_kda_prefill_conv(k->qkv, ring, n_rows, pos0, C, H, d, W, w->q_conv, w->k_conv, w->v_conv, w->A_log,
                                 w->dt_bias, k->gate, k->beta, ld_b, k->qkvc, q, st));
    TRY(sd_cuda_kda_prefill_ring(k->qkv, ring, n_rows, pos0, C, P, W, q, st));
    // The state after pos0 tokens (its slot) to the state after pos0 + C (its slot; the same one
    // when C is a multiple of max_T + 1: each block reads its columns before it writes them).
    TRY(sd_cuda_kda_chunk(k->qkvc, k->qkvc + P, k->qkvc + 2 * P, 3 * P, k->gate, P, k->beta, ld_b, C, H, d,
                          sd_state_kda_S(s, i, pos0), sd_state_kda_S(s, i, pos0 + C), k->y, P, k->work, q, st));
    TRY(sd_cuda_kda_prefill_out(k->y, k->gb, w->o_norm, c->rms_norm_eps, C, H, d, k->act, bf16(&w->o), q, st));
    return lin_act(p, b, &w->o, k->act, P, C, p->x, c->hidden_size, 1.0f, st);
}

// ---------------------------------------------------------------------------- MLA
// The bf16 keys and values of `rows` cache rows (every head), grown to a state's capacity.
static sd_code ensure_kv(sd_prefill_scratch *p, int rows, size_t key_elems, size_t value_elems, sd_status *st) {
    if (rows <= p->kv_rows) return SD_OK;
    cudaFree(p->kpack);
    cudaFree(p->vpack);
    p->kpack = p->vpack = NULL;
    p->kv_rows = 0;
    SD_CUDA_CHECK(st, cudaMalloc((void **)&p->kpack, (size_t)rows * key_elems * sizeof(uint16_t)));
    SD_CUDA_CHECK(st, cudaMalloc((void **)&p->vpack, (size_t)rows * value_elems * sizeof(uint16_t)));
    p->kv_rows = rows;
    return SD_OK;
}

// The expanded form (mla_prefill.h): every cache row's per-head keys and values from its latent
// through kv_b, in blocks of C rows, then each head's flash attention over them.
sd_code sd_prefill_mla_mixer(sd_cuda_backend *b, sd_prefill_scratch *p, const sd_model *m, sd_state *s, int i, int C,
                             sd_status *st) {
    const sd_config *c = &m->cfg;
    const sd_mla_weights *w = &m->w.layers[i].mla;
    const int Hm = c->num_attention_heads, R = c->kv_lora_rank, dn = c->qk_nope_head_dim, dr = c->qk_rope_head_dim;
    const int dv = c->v_head_dim, Nq = Hm * (dn + dr), ldm = sd_prefill_mla_ld(c), pos0 = s->len, n = pos0 + C;
    sd_prefill_mla *x = &p->mla;
    sd_mla_state *cache = &s->mla[i];
    cudaStream_t q = b->stream;
    TRY(lin_pair(p, b, &w->q, &w->kv_a, C, x->qm, ldm, st));
    TRY(sd_cuda_mla_prefill_cache(x->qm + Nq, ldm, w->kv_a_norm, c->rms_norm_eps, !c->mla_use_nope, c->rope_theta, pos0, C,
                                  Hm, dn, dr, R, x->qm, ldm, cache->c, cache->kpe, q, st));
    TRY(sd_cuda_mla_pack_queries(x->qm, ldm, C, Hm, dn, dr, x->qpack, q, st));
    TRY(ensure_kv(p, s->capacity, (size_t)Hm * sd_mla_head_width(dn, dr), (size_t)Hm * sd_mla_value_width(dv), st));
    for (int j0 = 0; j0 < n; j0 += C) {
        const int rows = n - j0 < C ? n - j0 : C;
        TRY(sd_gemm_linear(p->gemm, &w->kv_b, cache->c + (size_t)j0 * R, R, rows, x->kvb, Hm * (dn + dv), 0.0f, q, st));
        TRY(sd_cuda_mla_pack_kv(x->kvb, cache->kpe, j0, rows, Hm, dn, dr, dv, p->kpack, p->vpack, q, st));
    }
    TRY(sd_cuda_mla_flash(x->qpack, p->kpack, p->vpack, C, Hm, dn, dr, dv, pos0, 1.0f / sqrtf((float)(dn + dr)), x->mo, q,
                          st));
    return sd_gemm_linear(p->gemm, &w->o, x->mo, Hm * dv, C, p->x, c->hidden_size, 1.0f, q, st);
}

// ---------------------------------------------------------------------------- FFNs
// h (M, 2I) = [gate | up] of the normed input, then out = SwiGLU(h) in the down weight's dtype.
static sd_code swiglu_up(sd_prefill_scratch *p, sd_cuda_backend *b, const sd_ffn_weights *w, int M, float *h, void *out,
                         sd_status *st) {
    const int I = w->gate.rows;
    TRY(lin_pair(p, b, &w->gate, &w->up, M, h, 2 * I, st));
    return sd_cuda_swiglu_rows(h, false, M, I, out, bf16(&w->down), b->stream, st);
}

sd_code sd_prefill_dense_ffn(sd_cuda_backend *b, sd_prefill_scratch *p, const sd_model *m, int i, int C, sd_status *st) {
    const sd_ffn_weights *w = &m->w.layers[i].dense;
    sd_prefill_dense *x = &p->dense;
    TRY(swiglu_up(p, b, w, C, x->h1, x->hb, st));
    return lin_act(p, b, &w->down, x->hb, w->down.cols, C, p->x, m->cfg.hidden_size, 1.0f, st);
}

// F32 routed experts over the grouped rows, one cuBLASLt call per expert with entries and operation
// (counts in host memory): [gate | up] of its rows, then one SwiGLU over all rows, then its down.
static sd_code routed_experts_f32(sd_prefill_scratch *p, sd_cuda_backend *b, const sd_moe_weights *w, const sd_config *c,
                                  const int *counts, sd_status *st) {
    const int E = c->num_experts, D = c->hidden_size, Ie = c->moe_intermediate_size;
    sd_prefill_moe *x = &p->moe;
    int off = 0;
    for (int e = 0; e < E; off += counts[e], e++) {
        if (!counts[e]) continue;
        const sd_ffn_weights *f = &w->experts[e];
        const float *xe = (const float *)x->xg + (size_t)off * D;
        float *h = (float *)x->h1 + (size_t)off * 2 * Ie;
        TRY(lin_act(p, b, &f->gate, xe, D, counts[e], h, 2 * Ie, 0.0f, st));
        TRY(lin_act(p, b, &f->up, xe, D, counts[e], h + Ie, 2 * Ie, 0.0f, st));
    }
    const int rows = off;
    TRY(sd_cuda_swiglu_rows(x->h1, false, rows, Ie, x->hb, false, b->stream, st));
    off = 0;
    for (int e = 0; e < E; off += counts[e], e++) {
        if (!counts[e]) continue;
        const float *he = (const float *)x->hb + (size_t)off * Ie;
        TRY(lin_act(p, b, &w->experts[e].down, he, Ie, counts[e], (float *)x->yexp + (size_t)off * D, D, 0.0f, st));
    }
    return SD_OK;
}

// Are all of the layer's routed experts BF16 and on this device (the grouped GEMMs' operands)? F32
// experts take the per-expert cuBLASLt calls; a layer that mixes the two is refused.
static sd_code experts_bf16(const sd_moe_weights *w, const sd_config *c, int layer, bool *out, sd_status *st) {
    int n_bf16 = 0;
    for (int e = 0; e < c->num_experts; e++) {
        const sd_ffn_weights *f = &w->experts[e];
        if (!f->gate.data || !f->up.data || !f->down.data)
            return sd_fail(st, SD_ERR_UNSUPPORTED, "cuda prefill: layer %d expert %d is not on this device (a shard?)", layer, e);
        const int k = bf16(&f->gate) + bf16(&f->up) + bf16(&f->down);
        if (k != 0 && k != 3)
            return sd_fail(st, SD_ERR_UNSUPPORTED, "cuda prefill: layer %d expert %d mixes bf16 and f32 matrices", layer, e);
        n_bf16 += k == 3;
    }
    if (n_bf16 != 0 && n_bf16 != c->num_experts)
        return sd_fail(st, SD_ERR_UNSUPPORTED, "cuda prefill: layer %d mixes bf16 and f32 experts", layer);
    *out = n_bf16 > 0;
    return SD_OK;
}

// The n entries grouped by expert: the counts to the host (the expert GEMMs' sizes are host
// arguments), their offsets back up, the entries scattered to rows and the normed input gathered
// into them (bf16 for BF16 experts, f32 for F32).
static sd_code group_rows(sd_prefill_scratch *p, sd_cuda_backend *b, const sd_config *c, int n, bool rows_bf16,
                          sd_status *st) {
    const int E = c->num_experts, K = c->num_experts_per_token, D = c->hidden_size;
    sd_prefill_moe *x = &p->moe;
    cudaStream_t q = b->stream;
    SD_CUDA_CHECK(st, cudaMemcpyAsync(p->counts_host, x->counts, sizeof(int) * E, cudaMemcpyDeviceToHost, q));
    SD_CUDA_CHECK(st, cudaStreamSynchronize(q));
    // The offsets go up from pinned memory (the previous layer's copy is done: the counts
    // readback above synchronised the stream), not from a stack array sized by the config.
    int *offsets = p->counts_host + E;
    for (int e = 0, acc = 0; e < E; acc += p->counts_host[e], e++) offsets[e] = acc;
    SD_CUDA_CHECK(st, cudaMemcpyAsync(x->offsets, offsets, sizeof(int) * E, cudaMemcpyHostToDevice, q));
    TRY(sd_cuda_moe_prefill_scatter(x->sel, n, K, E, x->offsets, x->row_tok, x->inv, q, st));
    return sd_cuda_gather_rows(p->a, D, x->row_tok, n, D, x->xg, rows_bf16, q, st);
}

// The routed experts of a BF16 layer over the grouped rows (moe_grouped.h): [gate | up] of every
// expert as one grouped cuBLAS call, bf16 out; one SwiGLU over all rows, bf16 in and out; down as
// another grouped call, bf16 out (the combine reads it).
static sd_code routed_experts_grouped(sd_prefill_scratch *p, sd_cuda_backend *b, const sd_config *c, int layer, int n,
                                      sd_status *st) {
    const int E = c->num_experts, D = c->hidden_size, Ie = c->moe_intermediate_size;
    const sd_cuda_expert *table = p->experts_host + (size_t)(layer - c->first_k_dense_replace) * E;
    sd_prefill_moe *x = &p->moe;
    cudaStream_t q = b->stream;
    TRY(sd_cuda_moe_grouped_plan(p->grouped, table, p->counts_host, E, D, Ie, x->xg, x->h1, x->hb, x->yexp, q, st));
    TRY(sd_cuda_moe_grouped_gemm(p->grouped, SD_MOE_GROUPED_UP, q, st));
    TRY(sd_cuda_swiglu_rows(x->h1, true, n, Ie, x->hb, true, q, st));
    return sd_cuda_moe_grouped_gemm(p->grouped, SD_MOE_GROUPED_DOWN, q, st);
}

sd_code sd_prefill_moe_ffn(sd_cuda_backend *b, sd_prefill_scratch *p, const sd_model *m, int i, int C, sd_status *st) {
    const sd_config *c = &m->cfg;
    const sd_moe_weights *w = &m->w.layers[i].moe;
    const int E = c->num_experts, K = c->num_experts_per_token, D = c->hidden_size, n = C * K;
    sd_prefill_moe *x = &p->moe;
    cudaStream_t q = b->stream;
    // Routing in FP32 (an F32 GEMM: the selection must not drift from the token path's).
    const sd_mat router = {.dtype = SD_DT_F32, .data = w->router, .rows = E, .cols = D};
    TRY(sd_gemm_linear(p->gemm, &router, p->a, D, C, x->router, E, 0.0f, q, st));
    TRY(sd_cuda_moe_prefill_select(x->router, w->bias, C, E, K, c->num_expert_group, c->topk_group, c->moe_renormalize,
                                   c->routed_scaling_factor, x->sel, x->w, q, st));
    TRY(sd_cuda_moe_prefill_count(x->sel, n, E, x->counts, q, st));
    bool grouped = false;
    TRY(experts_bf16(w, c, i, &grouped, st));
    TRY(group_rows(p, b, c, n, grouped, st));
    if (grouped) TRY(routed_experts_grouped(p, b, c, i, n, st));
    else TRY(routed_experts_f32(p, b, w, c, p->counts_host, st));
    const float *shared = NULL;
    if (c->num_shared_experts > 0) {
        TRY(swiglu_up(p, b, &w->shared, C, x->h1s, x->hbs, st));
        TRY(lin_act(p, b, &w->shared.down, x->hbs, w->shared.down.cols, C, x->shared, D, 0.0f, st));
        shared = x->shared;
    }
    return sd_cuda_moe_prefill_combine(x->yexp, grouped, x->inv, x->w, shared, C, K, D, p->x, q, st);
}
