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
#include "cursor.h"        // sd_pos_cursor, sd_cuda_cursor_advance
#include "mla.h"           // sd_cuda_mla_attend
#include "moe.h"           // sd_cuda_moe_select, sd_cuda_moe_up, sd_cuda_moe_down, sd_cuda_moe_groups_host
#include "rows.h"          // sd_cuda_embed_cursor, sd_cuda_rmsnorm

#define TRY(call)                      \
    do {                               \
        sd_code try_rc_ = (call);      \
        if (try_rc_) return try_rc_;   \
    } while (0)

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
    TRY(first_launch(in, 6, T, norm, q, st));
    TRY(sd_cuda_kda_conv(s->kda[layer].conv, s->max_T + W - 1, x->q, x->k, x->v, w->q_conv, w->k_conv, w->v_conv, T, H,
                         d, W, pos0, settled, &w->f_b, x->fa, x->gate, &w->g_b, x->ga, x->gb, x->qc, x->kc, x->vc, q, st));
    // The recurrence (state slots pos0+1 .. pos0+T), applying the gates as it reads them:
    // g = -exp(A_log) · softplus(f_b·(f_a·a) + dt_bias), β = sigmoid(b·a). Then the output
    // rmsnorm(o_h, o_norm) ⊙ sigmoid(g_b·(g_a·a)): its own launch, or folded into the scan's
    // (b->kda_norm_in_scan, the default; the scan bucket then holds its tail too); then o_proj.
    const sd_kda_out_norm on = {.gb = x->gb, .o_norm = w->o_norm, .eps = c->rms_norm_eps};
    uint64_t t_scan = bucket_start(b, tb);
    TRY(sd_cuda_kda_scan(s->kda[layer].S, s->max_T + 1, pos0, T, H, d, x->qc, x->kc, x->vc, x->gate, x->beta, w->A_log,
                         w->dt_bias, x->y, b->kda_norm_in_scan ? &on : NULL, settled, q, st));
    bucket_stop(b, tb, TRACE_BUCKET_SCAN, t_scan);
    if (!b->kda_norm_in_scan) TRY(sd_cuda_kda_out(x->y, x->gb, w->o_norm, c->rms_norm_eps, T, H, d, q, st));
    const sd_lin_job o = job(&w->o, x->y, out, out_mode(accumulate));
    return sd_cuda_linear_multi(&o, 1, T, q, st);
}

sd_code sd_cuda_kda_forward(sd_cuda_backend *b, const sd_kda_weights *w, const sd_config *c, sd_state *s, int layer,
                            const float *a, int T, float *out, trace_burst *tb, sd_status *st) {
    TRY(sd_cuda_cursor_sync(b, s, st)); // their kernels read the cursor
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
    const sd_lin_job in[] = {job(&w->q, a, x->mq, SD_LIN_STORE), job(&w->kv_a, a, x->kv, SD_LIN_STORE)};
    TRY(first_launch(in, 2, T, norm, q, st));
    const sd_mla_write write = {.kv = x->kv, .kv_norm = w->kv_a_norm, .eps = c->rms_norm_eps, .rope = !c->mla_use_nope,
                                .theta = c->rope_theta};
    TRY(sd_cuda_mla_attend(x->mq, &w->kv_b, m->c, m->kpe, T, Hm, dn, dr, dv, R, pos0, settled, &write, x->qabs, x->mla_part, x->mo, q,
                           st));
    const sd_lin_job o = job(&w->o, x->mo, out, out_mode(accumulate));
    return sd_cuda_linear_multi(&o, 1, T, q, st);
}

sd_code sd_cuda_mla_forward(sd_cuda_backend *b, const sd_mla_weights *w, const sd_config *c, sd_state *s, int layer,
                            const float *a, int T, float *out, sd_status *st) {
    TRY(sd_cuda_cursor_sync(b, s, st)); // their kernels read the cursor
    return mla_mixer(b, w, c, s, layer, a, T, out, false, NULL, false, st);
}

// Dense SwiGLU FFN: gate+up+silu in one launch, down (+ the residual add) in another.
static sd_code dense_ffn(sd_cuda_backend *b, const sd_ffn_weights *w, const float *a, int T, float *h, float *out,
                         bool accumulate, const sd_lin_norm *norm, sd_status *st) {
    sd_lin_job up = job(&w->gate, a, h, SD_LIN_SWIGLU);
    up.w2 = &w->up;
    TRY(first_launch(&up, 1, T, norm, b->stream, st));
    const sd_lin_job down = job(&w->down, h, out, out_mode(accumulate));
    return sd_cuda_linear_multi(&down, 1, T, b->stream, st);
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

// Eager arm: the host reads sel back, groups the entries by expert (the CPU's grouping), and
// launches each selected expert (up, then down into exp_out) over its tokens; then the combine.
static sd_code moe_experts_eager(sd_cuda_backend *b, sd_state *s, const sd_cuda_moe_args *ma, sd_status *st) {
    const int T = ma->T, K = ma->K, E = ma->E;
    TRY(read_route(b, s, T, K, st));
    const size_t n_int = sd_cuda_moe_groups_ints(T, K, E);
    if (n_int > b->groups_cap) { // grown once to the largest T seen, never inside later steps
        cudaFreeHost(b->groups_host);
        b->groups_host = NULL;
        b->groups_cap = 0;
        SD_CUDA_CHECK(st, cudaMallocHost((void **)&b->groups_host, n_int * sizeof(int)));
        b->groups_cap = n_int;
    }
    int *groups = b->groups_host; // free: read_route drained the stream, so the last upload is done
    sd_cuda_moe_groups_host(b->sel_host, T, K, E, groups);
    cudaError_t e = cudaMemcpyAsync((void *)ma->groups, groups, n_int * sizeof(int), cudaMemcpyHostToDevice, b->stream);
    const int n_ent = T * K, gc = n_ent < E ? n_ent : E, *gstart = groups + 1 + gc;
    sd_code rc = e == cudaSuccess ? SD_OK : sd_fail(st, SD_ERR_SYS, "cuda moe: grouping upload: %s", cudaGetErrorString(e));
    for (int g = 0; !rc && g < groups[0]; g++) { // h row 0 is the group's first entry
        rc = sd_cuda_moe_up(ma, g, g + 1, gstart[g], gstart[g + 1], false, b->stream, st);
        if (!rc) rc = sd_cuda_moe_down(ma, gstart[g], gstart[g + 1], false, b->stream, st);
    }
    if (!rc) rc = sd_cuda_moe_up(ma, 0, 0, 0, 0, true, b->stream, st); // the shared expert's activations
    if (rc) return rc;
    return sd_cuda_moe_down(ma, 0, 0, true, b->stream, st);
}

// MoE block: the router logits (the norm fused), then the selection (sel, w and the grouping),
// the routed experts, and the down projections with the combine (+ the residual add). The shared
// expert's gate+up+silu rides in the up launch for one or two tokens — its blocks run while the
// selection does (sd_cuda_moe_up) — and in the router's launch from three tokens up, where the
// router alone is too few blocks (same bits either way: linear.cuh's dots, silu(g)·u). Measured
// on the H200 (kimi-linear-48b-a3b): decode 3.113 -> 3.025 ms; verify T=5 in the up launch
// 9.79 -> 10.24 ms, hence the split. Measured and not kept (2026-11-29): the selection as the
// router launch's tail (the last router block to finish, by an atomic ticket, ran select_rank's
// code: same bits, every GPU suite passed) with the shared gate+up in that launch at every T:
// decode 2.717-2.725 -> 2.848-2.863 ms. The launch's increment (9.8 µs) was no shorter than
// router + selection (4.6 + 5.4), and the up launch's grew 27.4 -> 31.9 µs: the router launch's
// 160 blocks hold the multiprocessors the up launch's first wave waited on before (at one token
// the router and the selection now share a launch without the shared expert:
// sd_cuda_moe_route_select). Nor (2026-11-30)
// the selection inside the up launch at one token: every up block took a ticket (a 64-bit
// counter, never reset), the launch's first routed the token (select_rank's code) and counted
// it, the routed blocks waited for the count instead of a select launch — same bits (every GPU
// suite and moe_lab's checks passed), but decode 2.639-2.653 -> 2.771-2.796 ms: the up increment
// went 25.0 -> 35.7 µs against the select's 4.2 saved.
#define MOE_SHARED_IN_UP_MAX_T 2
#define MOE_READY_MAX_T 2 // the readiness counters up to this many tokens (below)
static sd_code moe_block(sd_cuda_backend *b, const sd_moe_weights *w, const sd_config *c, sd_state *s, int layer,
                         const float *xin, int T, float *out, bool accumulate, const sd_lin_norm *norm, sd_status *st) {
    const int E = c->num_experts, K = c->num_experts_per_token, D = c->hidden_size, Ie = c->moe_intermediate_size;
    cudaStream_t q = b->stream;
    sd_scratch *x = &s->scratch;
    const bool shared = c->num_shared_experts > 0, shared_in_up = shared && T <= MOE_SHARED_IN_UP_MAX_T;
    // The grouping lives in the gather scratch xg (T·D floats), unused otherwise.
    if (sd_cuda_moe_groups_ints(T, K, E) > (size_t)T * D)
        return sd_fail(st, SD_ERR_UNSUPPORTED, "cuda moe: the expert grouping of %d tokens needs %zu ints > %d", T,
                       sd_cuda_moe_groups_ints(T, K, E), T * D);
    int *groups = (int *)x->xg;
    if (sd_cuda_moe_route_select_fits(T, E, D, c->num_expert_group)) { // one launch (moe.h)
        TRY(sd_cuda_moe_route_select(w->router, w->bias, norm ? norm->x : xin, norm, T, E, D, K, c->num_expert_group,
                                     c->moe_renormalize, c->routed_scaling_factor, x->router, x->sel, x->w, groups,
                                     x->route_ticket, x->moe_ready, q, st));
    } else { // the router Linear (with the shared expert's gate+up when it is not in the up launch)
        const sd_mat router = {.dtype = SD_DT_F32, .rows = E, .cols = D, .data = w->router};
        sd_lin_job in[2] = {job(&router, xin, x->router, SD_LIN_STORE)};
        if (shared && !shared_in_up) {
            in[1] = job(&w->shared.gate, xin, x->ffn_h2, SD_LIN_SWIGLU);
            in[1].w2 = &w->shared.up;
        }
        TRY(first_launch(in, shared && !shared_in_up ? 2 : 1, T, norm, q, st));
        TRY(sd_cuda_moe_select(x->router, w->bias, T, E, K, c->num_expert_group, c->topk_group, c->moe_renormalize,
                               c->routed_scaling_factor, x->sel, x->w, groups, x->moe_ready, q, st));
    }
    sd_cuda_moe_args ma = {.table = b->experts + (size_t)(layer - c->first_k_dense_replace) * E, .groups = groups,
                           .T = T, .K = K, .E = E, .D = D, .Ie = Ie, .x = xin, .w = x->w, .h = x->ffn_h1,
                           .exp_out = x->exp_out, .shared_down = shared ? &w->shared.down : NULL,
                           .shared_gate = shared_in_up ? &w->shared.gate : NULL,
                           .shared_up = shared_in_up ? &w->shared.up : NULL,
                           .hs = x->ffn_h2,
                           .ld_hs = shared ? w->shared.gate.rows : 0, .shared_out = x->yg, .out = out,
                           .accumulate = accumulate, .tickets = x->tickets};
    if (b->moe_arm == SD_CUDA_MOE_EAGER) return moe_experts_eager(b, s, &ma, st);
    // Device table: every entry's activation row in ffn_h1, in passes when it holds fewer rows.
    const int n_ent = T * K, gc = n_ent < E ? n_ent : E;
    const int per_pass = (int)(ffn_scratch_floats(c, s->max_T) / (size_t)Ie);
    if (per_pass < 1) return sd_fail(st, SD_ERR_USAGE, "cuda moe: FFN scratch below one expert row");
    // One pass of one or two tokens: each down block waits for its own expert (moe.h). Measured on
    // the H200 (bench_gpu_e2e, kimi-linear-48b-a3b, two rounds, one run): T=2 4.255-4.261 ->
    // 4.170-4.172 ms, a decode graph 2.459-2.468 -> 2.443-2.444, stream-launched decode the same
    // (2.606-2.611 / 2.606-2.609); but from three tokens up slower: T=3 5.62 -> 5.75, T=5 8.59 ->
    // 8.82, T=9 14.25 -> 14.84 (its graph 14.10 -> 14.70).
    if (per_pass >= n_ent && T <= MOE_READY_MAX_T) ma.ready = x->moe_ready;
    for (int lo = 0; lo < n_ent; lo += per_pass) {
        const int hi = n_ent - lo < per_pass ? n_ent : lo + per_pass;
        TRY(sd_cuda_moe_up(&ma, 0, gc, lo, hi, lo == 0, q, st)); // the shared expert with the first pass
        TRY(sd_cuda_moe_down(&ma, lo, hi, hi == n_ent, q, st));
    }
    return SD_OK;
}

sd_code sd_cuda_moe_forward(sd_cuda_backend *b, const sd_moe_weights *w, const sd_config *c, sd_state *s, int layer,
                            const float *xin, int T, float *out, sd_status *st) {
    return moe_block(b, w, c, s, layer, xin, T, out, false, NULL, st);
}

// One layer: h += mixer(rmsnorm(h)); h += ffn(rmsnorm(h)) (model.c layer_forward): each norm
// fused into the sublayer's first launch (sd_cuda_linear_multi_norm: bitwise sd_cuda_rmsnorm),
// each add into the launch that writes the sublayer's output.
static sd_code layer_forward(sd_cuda_backend *b, const sd_model *m, sd_state *s, int i, int T,
                             const sd_forward_opts *opts, sd_status *st) {
    const sd_config *c = &m->cfg;
    const sd_layer_weights *ly = &m->w.layers[i];
    sd_scratch *x = &s->scratch;
    const int D = c->hidden_size;
    trace_burst *tb = opts ? opts->trace : NULL;

    const sd_lin_norm in_norm = {.x = x->x, .w = ly->input_norm, .eps = c->rms_norm_eps, .n = D, .out = x->a};
    uint64_t t0 = bucket_start(b, tb);
    sd_code rc;
    if (ly->mixer == SD_MIXER_KDA) {
        TRACE_RANGE_PUSH("kda");
        rc = kda_mixer(b, &ly->kda, c, s, i, x->a, T, x->x, true, &in_norm, true, tb, st);
        bucket_stop(b, tb, TRACE_BUCKET_VKDA, t0);
    } else {
        TRACE_RANGE_PUSH("mla");
        rc = mla_mixer(b, &ly->mla, c, s, i, x->a, T, x->x, true, &in_norm, true, st);
        bucket_stop(b, tb, TRACE_BUCKET_VMLA, t0);
    }
    TRACE_RANGE_POP();
    if (rc) return rc;

    const sd_lin_norm post_norm = {.x = x->x, .w = ly->post_norm, .eps = c->rms_norm_eps, .n = D, .out = x->a};
    t0 = bucket_start(b, tb);
    TRACE_RANGE_PUSH(ly->is_moe ? "moe" : "dense_ffn");
    if (ly->is_moe) {
        rc = moe_block(b, &ly->moe, c, s, i, x->a, T, x->x, true, &post_norm, st);
        const int K = c->num_experts_per_token;
        if (!rc && opts && opts->on_route && !(rc = read_route(b, s, T, K, st)))
            for (int t = 0; t < T; t++)
                opts->on_route(opts->route_ctx, i, sd_state_next_pos(s) + t, b->sel_host + (size_t)t * K,
                               b->w_host + (size_t)t * K, K);
    } else {
        rc = dense_ffn(b, &ly->dense, x->a, T, x->ffn_h1, x->x, true, &post_norm, st);
    }
    TRACE_RANGE_POP();
    bucket_stop(b, tb, TRACE_BUCKET_VFFN, t0);
    return rc;
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
                     const sd_forward_opts *opts, bool advance, sd_status *st) {
    const sd_config *c = &m->cfg;
    // Measured and not kept (2026-12-01, five alternating pairs): the embedding (with the held
    // cursor write) gathered by block 0 of layer 0's first launch, its other blocks waiting on a
    // flag before their norm and letting the conv launch only then (same bits; every GPU suite
    // passed): decode 2.502 -> 2.509 ms, a graph replay 2.414 -> 2.423.
    // Measured and not kept (2026-12-01, H200, bench_gpu_e2e kimi-linear-48b-a3b, three runs of
    // each build alternating): the embedding gathered by every block of layer 0's first launch,
    // before its wait, instead of this launch (the host is behind the device at a step's start,
    // so one launch fewer there looked free; same bits, every GPU suite passed): decode
    // 2.504-2.516 -> 2.517-2.528 ms, a graph replay 2.435-2.452 -> 2.456-2.474 — each of the
    // launch's 786 blocks then waits on its own token read from pinned memory and its row.
    // Nor is the stream-launched step's premium over a graph replay (~80 µs) the depth of its
    // queue: the host kept at most 2 or 5 layers ahead of the device (an event a layer, the host
    // waiting on the one 2 or 5 layers back; 2026-12-01, three alternating pairs each) gave
    // 2.507 -> 2.502 ms and 2.504 -> 2.503 ms, within the pairs' spread — the host is not what a
    // stream launch waits for (bench_gpu_e2e: it enqueues the whole step 0.6-0.9 ms into 2.5).
    // The held cursor write (cursor_in_embed: device.c) rides in the embedding launch.
    TRY(sd_cuda_embed_cursor(&m->w.embed, tokens, T, s->scratch.x, s->cursor_stale ? s->cursor : NULL, s->len, s->pending,
                             b->stream, st));
    s->cursor_stale = false;
    for (int i = 0; i < c->num_hidden_layers; i++) {
        char name[32];
        snprintf(name, sizeof name, "layer %d", i);
        TRACE_RANGE_PUSH(name);
        sd_code rc = layer_forward(b, m, s, i, T, opts, st);
        TRACE_RANGE_POP();
        if (rc) return rc;
    }
    // Every position is read: T more pending (here, or in the head's first launch).
    return advance ? sd_cuda_cursor_advance(s->cursor, T, b->stream, st) : SD_OK;
}

sd_code sd_cuda_forward(const sd_model *m, sd_state *s, const int *tokens, int T, float *logits, int last_only,
                        const sd_forward_opts *opts, sd_status *st) {
    sd_cuda_backend *b = sd_cuda_backend_of(m);
    if (!b) return sd_fail(st, SD_ERR_USAGE, "cuda forward: not a CUDA model");
    if (!sd_cuda_state_is_ours(b, s))
        return sd_fail(st, SD_ERR_USAGE, "cuda forward: the state is not in device %d memory (make it with sd_cuda_state_init)",
                       b->device);
    SD_CUDA_CHECK(st, cudaSetDevice(b->device));
    // Only a forward that failed before its drain can leave an embedding reading tokens_host: a
    // drain here would also wait for what came since (a commit's cursor launch) and leave the
    // device idle between steps (the gap before a decode step's first kernel: 31-34 -> 17-23 µs,
    // bench/ktrace.c). The host's wait itself already spins: cudaDeviceScheduleSpin or Yield
    // changed nothing (2.636-2.653 ms either way).
    if (!b->tokens_idle) SD_CUDA_CHECK(st, cudaStreamSynchronize(b->stream));
    TRY(ensure_buffers(b, s->max_T > T ? s->max_T : T, st));
    // Checked before any launch: a refused forward leaves the state (and its cursor) as it was.
    if (opts && opts->probs) TRY(sd_cuda_check_device_ptr(b, opts->probs, "forward: opts.probs", st));
    b->tokens_idle = false;
    memcpy(b->tokens_host, tokens, sizeof(int) * (size_t)T); // the embedding reads them there
    const bool in_head = b->advance_in_head && sd_cuda_head_launches(logits, opts); // the cursor advance
    TRY(sd_cuda_walk(b, m, s, b->tokens_host, T, opts, !in_head, st));
    TRY(sd_cuda_head(b, m, s, T, logits, last_only, opts, in_head, st)); // head.c: host results valid, the walk done
    b->tokens_idle = true;
    sd_state_advance(s, T); // the host's side of the cursor advanced above
    return SD_OK;
}
