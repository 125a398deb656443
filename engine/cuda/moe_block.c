// moe_block.c — the MoE block of the CUDA layer walk (MODEL.md "MoE"): the router, the selection
// and grouping (kernels/moe_route.h), the routed experts and the shared expert with the combine
// (kernels/moe_experts.h), in one of two arms with the same bits:
//   device table (the default): every routed launch reads sel and the grouping from device memory
//                 — no host sync, so the block can be captured in a CUDA graph;
//   eager:        the host reads sel back (the host oracle of the selection ledger), groups the
//                 entries and launches each selected expert itself.
#include <string.h>
#include "check.h"         // SD_CUDA_CHECK
#include "cuda_internal.h" // sd_cuda_moe_block, sd_cuda_read_route
#include "cuda_scratch.h"  // sd_cuda_scratch_of
#include "ledger.h"        // ledger_record_device

// The shared expert's gate+up+silu rides in the up launch for one or two tokens — its blocks run
// while the selection does — and in the router's launch from three tokens up, where the router
// alone is too few blocks (the same bits either way: linear.cuh's dots, silu(g)·u).
// docs/EXPERIMENTS.md#moe-shared-in-up says why the split is at two.
#define MOE_SHARED_IN_UP_MAX_T 2
// The readiness counters (each down block waiting for its own expert's up blocks, not for the
// whole up launch) pay up to two tokens and cost from three up: docs/EXPERIMENTS.md#moe-ready-counters.
#define MOE_READY_MAX_T 2

static sd_lin_job job(const sd_mat *w, const float *x, float *y, sd_lin_mode mode) {
    return (sd_lin_job){.w = w, .x = x, .ldx = w->cols, .y = y, .ldy = w->rows, .mode = mode};
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

sd_code sd_cuda_read_route(sd_cuda_backend *b, const sd_state *s, int T, int K, sd_status *st) {
    const size_t n = (size_t)T * K;
    SD_TRY(ensure_route_host(b, n, st));
    SD_CUDA_CHECK(st, cudaMemcpyAsync(b->sel_host, s->scratch.sel, n * sizeof(int), cudaMemcpyDeviceToHost, b->stream));
    SD_CUDA_CHECK(st, cudaMemcpyAsync(b->w_host, s->scratch.w, n * sizeof(float), cudaMemcpyDeviceToHost, b->stream));
    SD_CUDA_CHECK(st, cudaStreamSynchronize(b->stream));
    return SD_OK;
}

sd_code sd_cuda_read_router(sd_cuda_backend *b, const sd_state *s, const float *bias, int T, int E, sd_status *st) {
    const size_t n = (size_t)(T + 1) * E;
    if (n > b->router_cap) {
        cudaFreeHost(b->router_host);
        b->router_host = NULL;
        b->router_cap = 0;
        SD_CUDA_CHECK(st, cudaMallocHost((void **)&b->router_host, n * sizeof(float)));
        b->router_cap = n;
    }
    SD_CUDA_CHECK(st, cudaMemcpyAsync(b->router_host, s->scratch.router, (size_t)T * E * sizeof(float),
                                      cudaMemcpyDeviceToHost, b->stream));
    SD_CUDA_CHECK(st, cudaMemcpyAsync(b->router_host + (size_t)T * E, bias, (size_t)E * sizeof(float),
                                      cudaMemcpyDeviceToHost, b->stream));
    SD_CUDA_CHECK(st, cudaStreamSynchronize(b->stream));
    return SD_OK;
}

// Eager arm: the host reads sel back, groups the entries by expert (the CPU's grouping), and
// launches each selected expert (up, then down into exp_out) over its tokens; then the combine.
static sd_code experts_eager(sd_cuda_backend *b, sd_state *s, const sd_cuda_moe_args *ma, sd_status *st) {
    const int T = ma->T, K = ma->K, E = ma->E;
    SD_TRY(sd_cuda_read_route(b, s, T, K, st));
    const size_t n_int = sd_cuda_moe_groups_ints(T, K, E);
    if (n_int > b->groups_cap) { // grown once to the largest T seen, never inside later steps
        cudaFreeHost(b->groups_host);
        b->groups_host = NULL;
        b->groups_cap = 0;
        SD_CUDA_CHECK(st, cudaMallocHost((void **)&b->groups_host, n_int * sizeof(int)));
        b->groups_cap = n_int;
    }
    int *groups = b->groups_host; // free: the route readback drained the stream, so the last upload is done
    for (int i = 0; i < T * K; i++) // a broken group's stream may have left anything there
        if (b->sel_host[i] < 0 || b->sel_host[i] >= E)
            return sd_fail(st, SD_ERR_SYS, "cuda moe: routed expert %d outside 0..%d", b->sel_host[i], E - 1);
    sd_cuda_moe_groups_host(b->sel_host, T, K, E, groups);
    SD_CUDA_CHECK(st, cudaMemcpyAsync((void *)ma->groups, groups, n_int * sizeof(int), cudaMemcpyHostToDevice, b->stream));
    const int n_ent = T * K, gc = n_ent < E ? n_ent : E, *gexp = groups + 1, *gstart = groups + 1 + gc;
    for (int g = 0; g < groups[0]; g++) { // h row 0 is the group's first entry
        if (gexp[g] < ma->held_first || gexp[g] >= ma->held_first + ma->held_count) continue; // another rank's expert
        SD_TRY(sd_cuda_moe_up(ma, g, g + 1, gstart[g], gstart[g + 1], false, b->stream, st));
        SD_TRY(sd_cuda_moe_down(ma, gstart[g], gstart[g + 1], false, b->stream, st));
    }
    SD_TRY(sd_cuda_moe_up(ma, 0, 0, 0, 0, true, b->stream, st)); // the shared expert's activations
    return sd_cuda_moe_down(ma, 0, 0, true, b->stream, st);
}

// Device-table arm: one up and one down launch over every group (in passes when the activation
// scratch holds fewer entry rows than the forward has).
static sd_code experts_device(const sd_config *c, sd_state *s, sd_cuda_moe_args *ma, cudaStream_t q, sd_status *st) {
    const int n_ent = ma->T * ma->K, gc = n_ent < ma->E ? n_ent : ma->E;
    const int per_pass = (int)(ffn_scratch_floats(c, s->max_T) / (size_t)ma->Ie);
    if (per_pass < 1) return sd_fail(st, SD_ERR_USAGE, "cuda moe: FFN scratch below one expert row");
    if (per_pass >= n_ent && ma->T <= MOE_READY_MAX_T) ma->ready = sd_cuda_scratch_of(s).moe_ready;
    for (int lo = 0; lo < n_ent; lo += per_pass) {
        const int hi = n_ent - lo < per_pass ? n_ent : lo + per_pass;
        SD_TRY(sd_cuda_moe_up(ma, 0, gc, lo, hi, lo == 0, q, st)); // the shared expert with the first pass
        SD_TRY(sd_cuda_moe_down(ma, lo, hi, hi == n_ent, q, st));
    }
    return SD_OK;
}

sd_code sd_cuda_moe_block(sd_cuda_backend *b, const sd_moe_weights *w, const sd_config *c, sd_state *s, int layer,
                          const float *xin, int T, float *out, bool accumulate, const sd_lin_norm *norm, struct ledger *ledger,
                          sd_status *st) {
    const int E = c->num_experts, K = c->num_experts_per_token, D = c->hidden_size, Ie = c->moe_intermediate_size;
    cudaStream_t q = b->stream;
    sd_scratch *x = &s->scratch;
    const sd_cuda_scratch g = sd_cuda_scratch_of(s);
    // A rank holding none of the shared width has no shared expert (its part is zeros).
    const bool shared = c->num_shared_experts > 0 && sd_config_shared_width(c) > 0, shared_in_up = shared && T <= MOE_SHARED_IN_UP_MAX_T;
    // The grouping lives in the gather scratch xg (T·D floats), unused otherwise.
    if (sd_cuda_moe_groups_ints(T, K, E) > (size_t)T * D)
        return sd_fail(st, SD_ERR_UNSUPPORTED, "cuda moe: the expert grouping of %d tokens needs %zu ints > %d", T,
                       sd_cuda_moe_groups_ints(T, K, E), T * D);
    int *groups = (int *)x->xg;
    if (sd_cuda_moe_route_select_fits(T, E, D, c->num_expert_group)) { // one launch (moe_route.h)
        SD_TRY(sd_cuda_moe_route_select(w->router, w->bias, norm ? norm->x : xin, norm, T, E, D, K, c->num_expert_group,
                                        c->moe_renormalize, c->routed_scaling_factor, x->router, x->sel, x->w, groups,
                                        g.route_ticket, g.moe_ready, q, st));
    } else { // the router Linear (with the shared expert's gate+up when it is not in the up launch)
        const sd_mat router = {.dtype = SD_DT_F32, .rows = E, .cols = D, .data = w->router};
        sd_lin_job in[2] = {job(&router, xin, x->router, SD_LIN_STORE)};
        if (shared && !shared_in_up) {
            in[1] = job(&w->shared.gate, xin, x->ffn_h2, SD_LIN_SWIGLU);
            in[1].w2 = &w->shared.up;
        }
        const int n_in = shared && !shared_in_up ? 2 : 1;
        SD_TRY(norm ? sd_cuda_linear_multi_norm(in, n_in, T, norm, q, st) : sd_cuda_linear_multi(in, n_in, T, q, st));
        SD_TRY(sd_cuda_moe_select(x->router, w->bias, T, E, K, c->num_expert_group, c->topk_group, c->moe_renormalize,
                                  c->routed_scaling_factor, x->sel, x->w, groups, g.moe_ready, q, st));
    }
    if (ledger) SD_TRY(ledger_record_device(ledger, b->device, layer, x->sel, x->w, T * K, b->stream, st));
    sd_cuda_moe_args ma = {.table = b->experts + (size_t)(layer - c->first_k_dense_replace) * E, .groups = groups,
                           .T = T, .K = K, .E = E, .D = D, .Ie = Ie, .x = xin, .w = x->w, .sel = x->sel,
                           .held_first = c->shard.ranks ? c->shard.expert_first : 0,
                           .held_count = c->shard.ranks ? c->shard.expert_count : E, .h = x->ffn_h1,
                           .exp_out = x->exp_out, .shared_down = shared ? &w->shared.down : NULL,
                           .shared_gate = shared_in_up ? &w->shared.gate : NULL,
                           .shared_up = shared_in_up ? &w->shared.up : NULL, .hs = x->ffn_h2,
                           .ld_hs = shared ? w->shared.gate.rows : 0, .shared_out = x->yg, .out = out,
                           .accumulate = accumulate, .tickets = g.tickets};
    return b->moe_arm == SD_CUDA_MOE_EAGER ? experts_eager(b, s, &ma, st) : experts_device(c, s, &ma, q, st);
}
