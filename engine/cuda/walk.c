// walk.c — the forward of model.h on one CUDA device: model.c's layer walk with every op a
// kernel on the model's stream (kernels/*.h). The embedding reads the tokens from pinned memory;
// the head (head.c: logits, argmaxes, softmax rows and draws) ends the forward with its one drain; the
// only other host syncs are the level-2 trace buckets, the route readback of the eager MoE arm,
// and opts->on_route. Positions are never launch arguments: the kernels
// read them from the state's cursor (kernels/cursor.h), which the walk's last launch advances —
// what lets a CUDA graph capture the walk and replay it at any position.
#include <string.h>
#include <stdio.h>
#include "check.h"         // SD_CUDA_CHECK
#include "nvtx.h"          // TRACE_RANGE_PUSH, TRACE_RANGE_POP
#include "cuda_internal.h" // sd_cuda_state_is_ours
#include "cuda_layers.h"   // sd_cuda_kda_forward, sd_cuda_mla_forward, sd_cuda_moe_forward
#include "kda.h"           // sd_cuda_kda_conv, _scan, _out
#include "linear.h"        // sd_cuda_linear, sd_cuda_linear_multi
#include "cursor.h"        // sd_pos_cursor, sd_cuda_cursor_advance, sd_cuda_cursor_set
#include "finite.h"        // sd_cuda_finite_reset
#include "mla.h"           // sd_cuda_mla_attend
#include "route.h"         // sd_route_margin (the route tap's margins, on the host)
#include "cuda_scratch.h"  // sd_cuda_scratch_of
#include "rows.h"          // sd_cuda_embed
#include "tp_reduce.h"     // sd_cuda_tp_reduce
#include "parallel/comm.h" // sd_comm_gather_to, sd_comm_check

// Level-2 buckets: drain this stream first, so device time lands in the bucket whatever sync the
// burst carries (trace_bucket_* sync again through it; the second drain is free).
// Event mode (tb->events) records events instead and drains nothing.
static uint64_t bucket_start(sd_cuda_backend *b, trace_burst *tb) {
    if (tb && tb->level >= 2 && !tb->events) cudaStreamSynchronize(b->stream);
    return trace_bucket_start(tb);
}
static void bucket_stop(sd_cuda_backend *b, trace_burst *tb, trace_bucket which, uint64_t t0) {
    if (tb && tb->level >= 2 && !tb->events) cudaStreamSynchronize(b->stream);
    trace_bucket_stop(tb, which, t0);
}

// Where a sublayer's output goes: out = f(a) (the op-test interface), or out += f(a) when out
// is the residual stream (the add fused into the output projection's launch).
static sd_lin_mode out_mode(bool accumulate) { return accumulate ? SD_LIN_ADD : SD_LIN_STORE; }

static sd_lin_job job(const sd_mat *w, const float *x, float *y, sd_lin_mode mode) {
    return (sd_lin_job){.w = w, .x = x, .ldx = w->cols, .y = y, .ldy = w->rows, .mode = mode};
}

// A sublayer's first launch: its input a = rmsnorm(h) computed by the same launch (norm), or
// already in memory (norm NULL: the op-test interface).
static sd_code first_launch(const sd_lin_job *jobs, int n, int T, const sd_lin_norm *norm, cudaStream_t q, sd_status *st) {
    return norm ? sd_cuda_linear_multi_norm(jobs, n, T, norm, q, st) : sd_cuda_linear_multi(jobs, n, T, q, st);
}

// KDA: the six projections of a in one launch (q, k, v, f_a, b, g_a), the conv and the two
// low-rank second halves (f_b, g_b) in one launch, the recurrence (gates applied as it reads
// them), the gated norm, o_proj. settled: called by the walk, whose forward began drained (kda.h).
static sd_code kda_mixer(sd_cuda_backend *b, const sd_kda_weights *w, const sd_config *c, sd_state *s, int layer,
                         const float *a, int T, float *out, bool accumulate, const sd_lin_norm *norm, bool settled,
                         trace_burst *tb, sd_status *st) {
    const int H = c->kda_num_heads, d = c->kda_head_dim, W = c->short_conv_kernel_size;
    const sd_dev_pos pos0 = sd_pos_cursor(s->cursor); // read on the device: sd_state_next_pos(s)
    cudaStream_t q = b->stream;
    sd_scratch *x = &s->scratch;
    const sd_lin_job in[] = {job(&w->q, a, x->q, SD_LIN_STORE),     job(&w->k, a, x->k, SD_LIN_STORE),
                             job(&w->v, a, x->v, SD_LIN_STORE),     job(&w->f_a, a, x->fa, SD_LIN_STORE),
                             job(&w->b, a, x->beta, SD_LIN_STORE),  job(&w->g_a, a, x->ga, SD_LIN_STORE)};
    SD_TRY(first_launch(in, 6, T, norm, q, st));
    SD_TRY(sd_cuda_kda_conv(s->kda[layer].conv, s->max_T + W - 1, x->q, x->k, x->v, w->q_conv, w->k_conv, w->v_conv, T, H,
                         d, W, pos0, settled, &w->f_b, x->fa, x->gate, &w->g_b, x->ga, x->gb, x->qc, x->kc, x->vc, q, st));
    // The recurrence (state slots pos0+1 .. pos0+T), applying the gates as it reads them:
    // g = -exp(A_log) · softplus(f_b·(f_a·a) + dt_bias), β = sigmoid(b·a); then the output
    // rmsnorm(o_h, o_norm) ⊙ sigmoid(g_b·(g_a·a)), then o_proj.
    uint64_t t_scan = bucket_start(b, tb);
    SD_TRY(sd_cuda_kda_scan(s->kda[layer].S, s->max_T + 1, pos0, T, H, d, x->qc, x->kc, x->vc, x->gate, x->beta, w->A_log,
                            w->dt_bias, x->y, settled, q, st));
    bucket_stop(b, tb, TRACE_BUCKET_SCAN, t_scan);
    SD_TRY(sd_cuda_kda_out(x->y, x->gb, w->o_norm, c->rms_norm_eps, T, H, d, q, st));
    const sd_lin_job o = job(&w->o, x->y, out, out_mode(accumulate));
    return sd_cuda_linear_multi(&o, 1, T, q, st);
}

sd_code sd_cuda_kda_forward(sd_cuda_backend *b, const sd_kda_weights *w, const sd_config *c, sd_state *s, int layer,
                            const float *a, int T, float *out, trace_burst *tb, sd_status *st) {
    return kda_mixer(b, w, c, s, layer, a, T, out, false, NULL, false, tb, st);
}

// MLA: q and kv_a in one launch, the cache write folded into the absorbed attention, o_proj.
// settled: as kda_mixer's.
static sd_code mla_mixer(sd_cuda_backend *b, const sd_mla_weights *w, const sd_config *c, sd_state *s, int layer,
                         const float *a, int T, float *out, bool accumulate, const sd_lin_norm *norm, bool settled,
                         sd_status *st) {
    const int Hm = c->num_attention_heads, R = c->kv_lora_rank, dn = c->qk_nope_head_dim;
    const int dr = c->qk_rope_head_dim, dv = c->v_head_dim;
    const sd_dev_pos pos0 = sd_pos_cursor(s->cursor); // read on the device: sd_state_next_pos(s)
    cudaStream_t q = b->stream;
    sd_scratch *x = &s->scratch;
    sd_mla_state *m = &s->mla[layer];
    float *part = sd_cuda_scratch_of(s).mla_part;
    const sd_lin_job in[] = {job(&w->q, a, x->mq, SD_LIN_STORE), job(&w->kv_a, a, x->kv, SD_LIN_STORE)};
    SD_TRY(first_launch(in, 2, T, norm, q, st));
    const sd_mla_write write = {.kv = x->kv, .kv_norm = w->kv_a_norm, .eps = c->rms_norm_eps, .rope = !c->mla_use_nope,
                                .theta = c->rope_theta};
    SD_TRY(sd_cuda_mla_attend(x->mq, &w->kv_b, m->c, m->kpe, T, Hm, dn, dr, dv, R, pos0, settled, &write, x->qabs, part, x->mo, q,
                           st));
    const sd_lin_job o = job(&w->o, x->mo, out, out_mode(accumulate));
    return sd_cuda_linear_multi(&o, 1, T, q, st);
}

sd_code sd_cuda_mla_forward(sd_cuda_backend *b, const sd_mla_weights *w, const sd_config *c, sd_state *s, int layer,
                            const float *a, int T, float *out, sd_status *st) {
    return mla_mixer(b, w, c, s, layer, a, T, out, false, NULL, false, st);
}

// Dense SwiGLU FFN: gate+up+silu in one launch, down (+ the residual add) in another.
static sd_code dense_ffn(sd_cuda_backend *b, const sd_ffn_weights *w, const float *a, int T, float *h, float *out,
                         bool accumulate, const sd_lin_norm *norm, sd_status *st) {
    sd_lin_job up = job(&w->gate, a, h, SD_LIN_SWIGLU);
    up.w2 = &w->up;
    SD_TRY(first_launch(&up, 1, T, norm, b->stream, st));
    const sd_lin_job down = job(&w->down, h, out, out_mode(accumulate));
    return sd_cuda_linear_multi(&down, 1, T, b->stream, st);
}

sd_code sd_cuda_moe_forward(sd_cuda_backend *b, const sd_moe_weights *w, const sd_config *c, sd_state *s, int layer,
                            const float *xin, int T, float *out, sd_status *st) {
    return sd_cuda_moe_block(b, w, c, s, layer, xin, T, out, false, NULL, NULL, st);
}

// A rank of a group (m->comm): its partial sublayer output x->mix (T × D) summed over the ranks
// into the residual stream, h += all_reduce(partial) — an all-gather of every rank's partial into
// the state's gather buffer, then the rank-order sum (kernels/tp_reduce.h: sd_comm_sum_ranks's
// order, then the add). Both capturable: no host sync, no allocation.
static sd_code all_reduce(sd_cuda_backend *b, sd_comm *comm, sd_state *s, int layer, const char *what, int T, sd_status *st) {
    const size_t n = (size_t)T * s->cfg->hidden_size;
    float *g = sd_cuda_scratch_of(s).tp_gather;
    SD_TRY(sd_comm_gather_to(comm, SD_COMM_ALL_REDUCE, layer, what, s->scratch.mix, n * sizeof(float), g, st));
    return sd_cuda_tp_reduce(g, comm->ranks, n, s->scratch.x, true, b->stream, st);
}

// A sublayer this rank holds none of (no head, no column): its part of the all-reduce is zeros.
static sd_code zero_part(sd_cuda_backend *b, sd_state *s, int T, sd_status *st) {
    SD_CUDA_CHECK(st, cudaMemsetAsync(s->scratch.mix, 0, sizeof(float) * (size_t)T * s->cfg->hidden_size, b->stream));
    return SD_OK;
}

// One layer: h += mixer(rmsnorm(h)); h += ffn(rmsnorm(h)) (model.c layer_forward): each norm
// fused into the sublayer's first launch (sd_cuda_linear_multi_norm: bitwise sd_cuda_rmsnorm),
// each add into the launch that writes the sublayer's output. A rank of a group writes each
// sublayer's partial to x->mix instead and adds the all-reduce of the ranks' partials (numbered
// as the CPU walk's: the mixer's, then the FFN's); the level-2 buckets time the sublayer calls
// without their all-reduces, as on the CPU.
static sd_code layer_forward(sd_cuda_backend *b, const sd_model *m, sd_state *s, int i, int T,
                             const sd_forward_opts *opts, sd_status *st) {
    const sd_config *c = &m->cfg;
    const sd_layer_weights *ly = &m->w.layers[i];
    sd_scratch *x = &s->scratch;
    const int D = c->hidden_size;
    trace_burst *tb = opts ? opts->trace : NULL;
    sd_comm *comm = m->comm;
    float *out = comm ? x->mix : x->x; // the partial, or the residual stream with the add fused
    const bool acc = !comm;

    // Each sublayer's norm checks the residual stream it reads (linear.h): the input norm what the
    // previous sublayer left (layer 0: the embedding), the post norm the mixer's sum.
    const sd_lin_norm in_norm = {.x = x->x, .w = ly->input_norm, .eps = c->rms_norm_eps, .n = D, .out = x->a,
                                 .flag = b->nonfinite, .site = i ? sd_nonfinite_site_ffn(i - 1) : 0};
    uint64_t t0 = bucket_start(b, tb);
    sd_code rc;
    if (ly->mixer == SD_MIXER_KDA) {
        TRACE_RANGE_PUSH("kda");
        rc = c->kda_num_heads ? kda_mixer(b, &ly->kda, c, s, i, x->a, T, out, acc, &in_norm, true, tb, st) : zero_part(b, s, T, st);
        bucket_stop(b, tb, TRACE_BUCKET_VKDA, t0);
    } else {
        TRACE_RANGE_PUSH("mla");
        rc = c->num_attention_heads ? mla_mixer(b, &ly->mla, c, s, i, x->a, T, out, acc, &in_norm, true, st) : zero_part(b, s, T, st);
        bucket_stop(b, tb, TRACE_BUCKET_VMLA, t0);
    }
    TRACE_RANGE_POP();
    if (!rc && comm) rc = all_reduce(b, comm, s, i, "mixer", T, st);
    if (rc) return rc;

    const sd_lin_norm post_norm = {.x = x->x, .w = ly->post_norm, .eps = c->rms_norm_eps, .n = D, .out = x->a,
                                   .flag = b->nonfinite, .site = sd_nonfinite_site_mixer(i)};
    t0 = bucket_start(b, tb);
    TRACE_RANGE_PUSH(ly->is_moe ? "moe" : "dense_ffn");
    if (ly->is_moe) {
        rc = sd_cuda_moe_block(b, &ly->moe, c, s, i, x->a, T, out, acc, &post_norm, opts ? opts->ledger : NULL, st);
        const int K = c->num_experts_per_token;
        const int E = c->num_experts;
        if (!rc && opts && opts->on_route && !(rc = sd_cuda_read_route(b, s, T, K, st)) &&
            !(rc = sd_cuda_read_router(b, s, ly->moe.bias, T, E, st)))
            for (int t = 0; t < T; t++)
                opts->on_route(opts->route_ctx, i, sd_state_next_pos(s) + t, b->sel_host + (size_t)t * K,
                               b->w_host + (size_t)t * K, K,
                               sd_route_margin(b->router_host + (size_t)t * E, b->router_host + (size_t)T * E, c));
    } else {
        rc = ly->dense.gate.rows ? dense_ffn(b, &ly->dense, x->a, T, x->ffn_h1, out, acc, &post_norm, st) : zero_part(b, s, T, st);
    }
    TRACE_RANGE_POP();
    bucket_stop(b, tb, TRACE_BUCKET_VFFN, t0);
    if (!rc && comm) rc = all_reduce(b, comm, s, i, "ffn", T, st);
    return rc;
}

sd_code sd_cuda_nonfinite_copy(sd_cuda_backend *b, sd_status *st) {
    SD_CUDA_CHECK(st, cudaMemcpyAsync(b->nonfinite_host, b->nonfinite, sizeof(int), cudaMemcpyDeviceToHost, b->stream));
    return SD_OK;
}

sd_code sd_cuda_nonfinite_take(sd_cuda_backend *b, const sd_config *c, sd_status *st) {
    const int site = *b->nonfinite_host;
    if (site == SD_NONFINITE_NONE) return SD_OK;
    *b->nonfinite_host = SD_NONFINITE_NONE;
    sd_status ignored = {0};
    if (sd_cuda_finite_reset(b->nonfinite, b->stream, &ignored) == SD_OK) cudaStreamSynchronize(b->stream);
    return sd_nonfinite_fail(c, site, st);
}

// Pinned (device-mapped) token and argmax buffers for a forward of T tokens (grown, never shrunk).
static sd_code ensure_buffers(sd_cuda_backend *b, int T, sd_status *st) {
    if ((size_t)T > b->tokens_cap) {
        cudaFreeHost(b->tokens_host);
        cudaFreeHost(b->argmax_host);
        b->tokens_host = b->argmax_host = NULL;
        b->tokens_cap = 0;
        SD_CUDA_CHECK(st, cudaMallocHost((void **)&b->tokens_host, (size_t)T * sizeof(int)));
        SD_CUDA_CHECK(st, cudaMallocHost((void **)&b->argmax_host, (size_t)T * sizeof(int)));
        b->tokens_cap = (size_t)T;
    }
    return SD_OK;
}

sd_code sd_cuda_walk(sd_cuda_backend *b, const sd_model *m, sd_state *s, const int *tokens, int T,
                     const sd_forward_opts *opts, sd_status *st) {
    const sd_config *c = &m->cfg;
    SD_TRY(sd_cuda_embed(&m->w.embed, tokens, T, s->scratch.x, b->stream, st));
    for (int i = 0; i < c->num_hidden_layers; i++) {
        char name[32];
        snprintf(name, sizeof name, "layer %d", i);
        TRACE_RANGE_PUSH(name);
        sd_code rc = layer_forward(b, m, s, i, T, opts, st);
        TRACE_RANGE_POP();
        if (rc) return rc;
    }
    return sd_cuda_cursor_advance(s->cursor, T, b->stream, st); // every position is read: T more pending
}

sd_code sd_cuda_forward(const sd_model *m, sd_state *s, const int *tokens, int T, float *logits, int last_only,
                        const sd_forward_opts *opts, sd_status *st) {
    sd_cuda_backend *b = sd_cuda_backend_of(m);
    if (!b) return sd_fail(st, SD_ERR_USAGE, "cuda forward: not a CUDA model");
    if (!sd_cuda_state_is_ours(b, s))
        return sd_fail(st, SD_ERR_USAGE, "cuda forward: the state is not in device %d memory (make it with sd_cuda_state_init)",
                       b->device);
    SD_CUDA_CHECK(st, cudaSetDevice(b->device));
    // Only a forward that failed before its drain can leave an embedding reading tokens_host; a
    // drain here would also wait for what came since (a commit's cursor launch) and leave the
    // device idle between steps.
    if (!b->tokens_idle) SD_CUDA_CHECK(st, cudaStreamSynchronize(b->stream));
    SD_TRY(ensure_buffers(b, s->max_T > T ? s->max_T : T, st));
    // Checked before any launch: a refused forward leaves the state (and its cursor) as it was.
    if (opts && opts->probs) SD_TRY(sd_cuda_check_device_ptr(b, opts->probs, "forward: opts.probs", st));
    b->tokens_idle = false;
    memcpy(b->tokens_host, tokens, sizeof(int) * (size_t)T); // the embedding reads them there
    sd_code rc = sd_cuda_walk(b, m, s, b->tokens_host, T, opts, st);
    if (!rc) rc = sd_cuda_head(b, m, s, T, logits, last_only, opts, st); // head.c: host results valid, the walk done
    if (rc == SD_ERR_NONFINITE) { // the walk advanced the device cursor; the state stays as it was
        sd_status ignored = {0};
        sd_cuda_cursor_set(s->cursor, s->len, s->pending, b->stream, &ignored);
        b->tokens_idle = cudaStreamSynchronize(b->stream) == cudaSuccess;
        return rc;
    }
    // A rank of a broken group reports the group's failure, whatever it met after the abort.
    if (rc && m->comm && sd_comm_check(m->comm, st)) return st->code;
    if (rc) return rc;
    b->tokens_idle = true;
    sd_state_advance(s, T); // the host's side of the cursor advanced above
    return SD_OK;
}
