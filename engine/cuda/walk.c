// walk.c — the forward of model.h on one CUDA device: model.c's layer walk with every op a
// kernel on the model's stream (kernels/*.h). Tokens go up through pinned memory, logits come
// back at the end; the only other host syncs are the level-2 trace buckets, the route readback
// of the eager MoE arm, and opts->on_route.
#include <string.h>
#include "check.h"         // SD_CUDA_CHECK
#include "cuda_internal.h" // sd_cuda_state_is_ours
#include "cuda_layers.h"   // sd_cuda_kda_forward, sd_cuda_mla_forward, sd_cuda_moe_forward
#include "kda.h"           // sd_cuda_kda_conv, _gates, _scan, _out
#include "linear.h"        // sd_cuda_linear
#include "mla.h"           // sd_cuda_mla_cache_write, sd_cuda_mla_attend
#include "moe.h"           // sd_cuda_moe_route, sd_cuda_ffn, sd_cuda_moe_experts, sd_cuda_moe_combine
#include "rows.h"          // sd_cuda_embed, sd_cuda_rmsnorm, sd_cuda_add

#define TRY(call)                      \
    do {                               \
        sd_code try_rc_ = (call);      \
        if (try_rc_) return try_rc_;   \
    } while (0)

// Level-2 buckets: drain this stream first, so device time lands in the bucket whatever sync the
// burst carries (trace_bucket_* sync again through it; the second drain is free).
static uint64_t bucket_start(sd_cuda_backend *b, trace_burst *tb) {
    if (tb && tb->level >= 2) cudaStreamSynchronize(b->stream);
    return trace_bucket_start(tb);
}
static void bucket_stop(sd_cuda_backend *b, trace_burst *tb, trace_bucket which, uint64_t t0) {
    if (tb && tb->level >= 2) cudaStreamSynchronize(b->stream);
    trace_bucket_stop(tb, which, t0);
}

sd_code sd_cuda_kda_forward(sd_cuda_backend *b, const sd_kda_weights *w, const sd_config *c, sd_state *s, int layer,
                            const float *a, int T, float *out, trace_burst *tb, sd_status *st) {
    const int H = c->kda_num_heads, d = c->kda_head_dim, W = c->short_conv_kernel_size;
    const int pos0 = sd_state_next_pos(s);
    cudaStream_t q = b->stream;
    sd_scratch *x = &s->scratch;
    TRY(sd_cuda_linear(&w->q, a, T, x->q, q, st));
    TRY(sd_cuda_linear(&w->k, a, T, x->k, q, st));
    TRY(sd_cuda_linear(&w->v, a, T, x->v, q, st));
    TRY(sd_cuda_kda_conv(s->kda[layer].conv, s->max_T + W - 1, x->q, x->k, x->v, w->q_conv, w->k_conv, w->v_conv, T, H,
                         d, W, pos0, x->qc, x->kc, x->vc, q, st));
    // Gates: g = -exp(A_log) · softplus(f_b·(f_a·a) + dt_bias), β = sigmoid(b·a).
    TRY(sd_cuda_linear(&w->f_a, a, T, x->fa, q, st));
    TRY(sd_cuda_linear(&w->f_b, x->fa, T, x->gate, q, st));
    TRY(sd_cuda_linear(&w->b, a, T, x->beta, q, st));
    TRY(sd_cuda_kda_gates(x->gate, x->beta, w->A_log, w->dt_bias, T, H, d, q, st));
    // The recurrence: state slots pos0+1 .. pos0+T.
    uint64_t t_scan = bucket_start(b, tb);
    TRY(sd_cuda_kda_scan(s->kda[layer].S, s->max_T + 1, pos0, T, H, d, x->qc, x->kc, x->vc, x->gate, x->beta, x->y, q, st));
    bucket_stop(b, tb, TRACE_BUCKET_SCAN, t_scan);
    // Output: rmsnorm(o_h, o_norm) ⊙ sigmoid(g_b·(g_a·a)), then o_proj.
    TRY(sd_cuda_linear(&w->g_a, a, T, x->ga, q, st));
    TRY(sd_cuda_linear(&w->g_b, x->ga, T, x->gb, q, st));
    TRY(sd_cuda_kda_out(x->y, x->gb, w->o_norm, c->rms_norm_eps, T, H, d, q, st));
    return sd_cuda_linear(&w->o, x->y, T, out, q, st);
}

sd_code sd_cuda_mla_forward(sd_cuda_backend *b, const sd_mla_weights *w, const sd_config *c, sd_state *s, int layer,
                            const float *a, int T, float *out, sd_status *st) {
    const int Hm = c->num_attention_heads, R = c->kv_lora_rank, dn = c->qk_nope_head_dim;
    const int dr = c->qk_rope_head_dim, dv = c->v_head_dim;
    const int pos0 = sd_state_next_pos(s);
    cudaStream_t q = b->stream;
    sd_scratch *x = &s->scratch;
    sd_mla_state *m = &s->mla[layer];
    TRY(sd_cuda_linear(&w->q, a, T, x->mq, q, st));
    TRY(sd_cuda_linear(&w->kv_a, a, T, x->kv, q, st));
    TRY(sd_cuda_mla_cache_write(x->kv, w->kv_a_norm, c->rms_norm_eps, T, R, dr, pos0, m->c, m->kpe, x->mq, Hm, dn,
                                !c->mla_use_nope, c->rope_theta, q, st));
    TRY(sd_cuda_mla_attend(x->mq, &w->kv_b, m->c, m->kpe, T, Hm, dn, dr, dv, R, pos0, x->mo, q, st));
    return sd_cuda_linear(&w->o, x->mo, T, out, q, st);
}

// The (T, width) FFN scratch of state.h: width = max(I, S·Ie, Ie).
static size_t ffn_scratch_floats(const sd_config *c, int max_T) {
    size_t ffn = (size_t)c->intermediate_size;
    size_t moe_w = (size_t)c->moe_intermediate_size * (c->num_shared_experts > 1 ? c->num_shared_experts : 1);
    return (size_t)max_T * (moe_w > ffn ? moe_w : ffn);
}

// Pinned host buffers for n route entries (sel, w).
static sd_code ensure_route_host(sd_cuda_backend *b, size_t n, sd_status *st) {
    if (n <= b->route_cap) return SD_OK;
    cudaFreeHost(b->sel_host);
    cudaFreeHost(b->w_host);
    b->sel_host = NULL;
    b->w_host = NULL;
    b->route_cap = 0;
    SD_CUDA_CHECK(st, cudaMallocHost((void **)&b->sel_host, n * sizeof(int)));
    SD_CUDA_CHECK(st, cudaMallocHost((void **)&b->w_host, n * sizeof(float)));
    b->route_cap = n;
    return SD_OK;
}

// sel and w of T tokens (device scratch) into b->sel_host / b->w_host; drains the stream.
static sd_code read_route(sd_cuda_backend *b, const sd_state *s, int T, int K, sd_status *st) {
    const size_t n = (size_t)T * K;
    TRY(ensure_route_host(b, n, st));
    SD_CUDA_CHECK(st, cudaMemcpyAsync(b->sel_host, s->scratch.sel, n * sizeof(int), cudaMemcpyDeviceToHost, b->stream));
    SD_CUDA_CHECK(st, cudaMemcpyAsync(b->w_host, s->scratch.w, n * sizeof(float), cudaMemcpyDeviceToHost, b->stream));
    SD_CUDA_CHECK(st, cudaStreamSynchronize(b->stream));
    return SD_OK;
}

// Eager arm: each selected expert once over the tokens that chose it (the CPU's grouping), rows
// gathered into xg and its outputs scattered to exp_out[t][j].
static sd_code moe_experts_eager(sd_cuda_backend *b, const sd_moe_weights *w, const sd_config *c, sd_state *s,
                                 const float *xin, int T, sd_status *st) {
    const int E = c->num_experts, K = c->num_experts_per_token, D = c->hidden_size;
    const size_t row = sizeof(float) * (size_t)D;
    cudaStream_t q = b->stream;
    sd_scratch *x = &s->scratch;
    TRY(read_route(b, s, T, K, st));
    int rows_t[T * K], rows_j[T * K];
    for (int e = 0; e < E; e++) {
        int n = 0;
        for (int t = 0; t < T; t++)
            for (int j = 0; j < K; j++)
                if (b->sel_host[(size_t)t * K + j] == e) {
                    rows_t[n] = t;
                    rows_j[n] = j;
                    SD_CUDA_CHECK(st, cudaMemcpyAsync(x->xg + (size_t)n * D, xin + (size_t)t * D, row, cudaMemcpyDeviceToDevice, q));
                    n++;
                }
        if (!n) continue;
        TRY(sd_cuda_ffn(&w->experts[e], x->xg, n, x->yg, x->ffn_h1, x->ffn_h2, q, st));
        for (int r = 0; r < n; r++)
            SD_CUDA_CHECK(st, cudaMemcpyAsync(x->exp_out + ((size_t)rows_t[r] * K + rows_j[r]) * D, x->yg + (size_t)r * D,
                                              row, cudaMemcpyDeviceToDevice, q));
    }
    return SD_OK;
}

sd_code sd_cuda_moe_forward(sd_cuda_backend *b, const sd_moe_weights *w, const sd_config *c, sd_state *s, int layer,
                            const float *xin, int T, float *out, sd_status *st) {
    const int E = c->num_experts, K = c->num_experts_per_token, D = c->hidden_size;
    cudaStream_t q = b->stream;
    sd_scratch *x = &s->scratch;
    TRY(sd_cuda_moe_route(w->router, w->bias, xin, T, E, D, K, c->num_expert_group, c->topk_group, c->moe_renormalize,
                          c->routed_scaling_factor, x->sel, x->w, q, st));
    if (b->moe_arm == SD_CUDA_MOE_EAGER) {
        TRY(moe_experts_eager(b, w, c, s, xin, T, st));
    } else {
        const sd_cuda_expert *table = b->experts + (size_t)(layer - c->first_k_dense_replace) * E;
        TRY(sd_cuda_moe_experts(table, c->moe_intermediate_size, D, x->sel, xin, T, K, x->ffn_h1,
                                ffn_scratch_floats(c, s->max_T), x->exp_out, q, st));
    }
    const float *shared = NULL;
    if (c->num_shared_experts > 0) {
        TRY(sd_cuda_ffn(&w->shared, xin, T, x->yg, x->ffn_h1, x->ffn_h2, q, st));
        shared = x->yg;
    }
    return sd_cuda_moe_combine(x->exp_out, x->w, shared, T, K, D, out, q, st);
}

// One layer: h += mixer(rmsnorm(h)); h += ffn(rmsnorm(h)) (model.c layer_forward).
static sd_code layer_forward(sd_cuda_backend *b, const sd_model *m, sd_state *s, int i, int T,
                             const sd_forward_opts *opts, sd_status *st) {
    const sd_config *c = &m->cfg;
    const sd_layer_weights *ly = &m->w.layers[i];
    sd_scratch *x = &s->scratch;
    const int D = c->hidden_size;
    cudaStream_t q = b->stream;
    trace_burst *tb = opts ? opts->trace : NULL;

    TRY(sd_cuda_rmsnorm(x->x, ly->input_norm, T, D, c->rms_norm_eps, x->a, q, st));
    uint64_t t0 = bucket_start(b, tb);
    if (ly->mixer == SD_MIXER_KDA) {
        TRY(sd_cuda_kda_forward(b, &ly->kda, c, s, i, x->a, T, x->mix, tb, st));
        bucket_stop(b, tb, TRACE_BUCKET_VKDA, t0);
    } else {
        TRY(sd_cuda_mla_forward(b, &ly->mla, c, s, i, x->a, T, x->mix, st));
        bucket_stop(b, tb, TRACE_BUCKET_VMLA, t0);
    }
    TRY(sd_cuda_add(x->x, x->mix, (size_t)T * D, q, st));

    TRY(sd_cuda_rmsnorm(x->x, ly->post_norm, T, D, c->rms_norm_eps, x->a, q, st));
    t0 = bucket_start(b, tb);
    if (ly->is_moe) {
        TRY(sd_cuda_moe_forward(b, &ly->moe, c, s, i, x->a, T, x->mix, st));
        if (opts && opts->on_route) {
            const int K = c->num_experts_per_token;
            TRY(read_route(b, s, T, K, st));
            for (int t = 0; t < T; t++)
                opts->on_route(opts->route_ctx, i, sd_state_next_pos(s) + t, b->sel_host + (size_t)t * K,
                               b->w_host + (size_t)t * K, K);
        }
    } else {
        TRY(sd_cuda_ffn(&ly->dense, x->a, T, x->mix, x->ffn_h1, x->ffn_h2, q, st));
    }
    bucket_stop(b, tb, TRACE_BUCKET_VFFN, t0);
    return sd_cuda_add(x->x, x->mix, (size_t)T * D, q, st);
}

// Device and pinned buffers for a forward of T tokens (grown, never shrunk).
static sd_code ensure_buffers(sd_cuda_backend *b, int T, size_t logit_floats, sd_status *st) {
    if ((size_t)T > b->tokens_cap) {
        cudaFree(b->tokens);
        cudaFreeHost(b->tokens_host);
        b->tokens = NULL;
        b->tokens_host = NULL;
        b->tokens_cap = 0;
        SD_CUDA_CHECK(st, cudaMalloc((void **)&b->tokens, (size_t)T * sizeof(int)));
        SD_CUDA_CHECK(st, cudaMallocHost((void **)&b->tokens_host, (size_t)T * sizeof(int)));
        b->tokens_cap = (size_t)T;
    }
    if (logit_floats > b->logits_cap) {
        cudaFree(b->logits);
        b->logits = NULL;
        b->logits_cap = 0;
        SD_CUDA_CHECK(st, cudaMalloc((void **)&b->logits, logit_floats * sizeof(float)));
        b->logits_cap = logit_floats;
    }
    return SD_OK;
}

sd_code sd_cuda_forward(const sd_model *m, sd_state *s, const int *tokens, int T, float *logits, int last_only,
                        const sd_forward_opts *opts, sd_status *st) {
    sd_cuda_backend *b = sd_cuda_backend_of(m);
    const sd_config *c = &m->cfg;
    const int D = c->hidden_size, V = c->vocab_size;
    if (!b) return sd_fail(st, SD_ERR_USAGE, "cuda forward: not a CUDA model");
    if (!sd_cuda_state_is_ours(b, s))
        return sd_fail(st, SD_ERR_USAGE, "cuda forward: the state is not in device %d memory (make it with sd_cuda_state_init)",
                       b->device);
    SD_CUDA_CHECK(st, cudaSetDevice(b->device));
    const int first = last_only ? T - 1 : 0, n_out = T - first;
    TRY(ensure_buffers(b, s->max_T > T ? s->max_T : T, logits ? (size_t)s->max_T * V : 0, st));
    cudaStream_t q = b->stream;
    sd_scratch *x = &s->scratch;

    SD_CUDA_CHECK(st, cudaStreamSynchronize(q)); // tokens_host may still feed the previous copy
    memcpy(b->tokens_host, tokens, sizeof(int) * (size_t)T);
    SD_CUDA_CHECK(st, cudaMemcpyAsync(b->tokens, b->tokens_host, sizeof(int) * (size_t)T, cudaMemcpyHostToDevice, q));
    TRY(sd_cuda_embed(&m->w.embed, b->tokens, T, x->x, q, st));
    for (int i = 0; i < c->num_hidden_layers; i++) TRY(layer_forward(b, m, s, i, T, opts, st));

    if (logits) {
        TRY(sd_cuda_rmsnorm(x->x + (size_t)first * D, m->w.final_norm, n_out, D, c->rms_norm_eps, x->a, q, st));
        TRY(sd_cuda_linear(&m->w.lm_head, x->a, n_out, b->logits, q, st));
        SD_CUDA_CHECK(st, cudaMemcpyAsync(logits, b->logits, sizeof(float) * (size_t)n_out * V, cudaMemcpyDeviceToHost, q));
    }
    SD_CUDA_CHECK(st, cudaStreamSynchronize(q));
    s->pending += T;
    return SD_OK;
}
