// model.c — loading a model and the layer walk of MODEL.md's forward function on the CPU.
//
// The CPU head serves every request of sd_forward_opts with sample.c: argmaxes, softmax rows
// into probs (host memory is this backend's memory) and the Philox draws. This is the
// reference a backend's head (engine/cuda/head.c) must match.
#include "model.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "backend.h" // sd_backend
#include "digest.h"  // sd_sha256_file
#include "checkpoint.h" // sd_ckpt_open, sd_ckpt_digest
#include "nvtx.h"   // TRACE_RANGE_PUSH, TRACE_RANGE_POP
#include "ops.h"    // sd_linear, sd_rmsnorm, sd_mat_row_f32
#include "philox.h" // sd_uniform
#include "sample.h" // sd_argmax, sd_softmax, sd_sample
#include "layers.h" // sd_kda_forward, sd_mla_forward, sd_ffn_forward, sd_moe_forward
#include "ledger.h" // ledger_record_device
#include "route.h"  // sd_route_margin (the route tap's margins)
#include "parallel/comm.h" // sd_comm_all_reduce
#include "parallel/head.h" // sd_tp_head

sd_code sd_model_load(sd_model *m, const char *dir, sd_status *st) {
    memset(m, 0, sizeof *m);
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", dir);
    sd_code rc = sd_config_load(path, &m->cfg, st);
    if (!rc) rc = sd_sha256_file(path, m->config_sha256, st);
    if (rc) return rc;
    sd_checkpoint ck;
    rc = sd_ckpt_open(dir, &ck, st);
    if (rc) return rc;
    rc = sd_weights_load(&m->cfg, &ck, &m->w, st);
    if (!rc) rc = sd_ckpt_digest(&ck, m->weights_sha256, st);
    sd_ckpt_close(&ck);
    if (rc) sd_model_free(m);
    return rc;
}

void sd_model_free(sd_model *m) {
    if (m->backend) m->backend->free_model(m);
    else sd_weights_free(&m->w);
    memset(m, 0, sizeof *m);
}

static void add_into(float *x, const float *y, size_t n) {
    for (size_t i = 0; i < n; i++) x[i] += y[i];
}

bool sd_all_finite(const float *x, size_t n) {
    float acc = 0.0f; // x - x is 0 for a finite x and NaN for a NaN or an Inf
    for (size_t i = 0; i < n; i++) acc += x[i] - x[i];
    return acc == 0.0f;
}

sd_code sd_nonfinite_fail(const sd_config *c, int site, sd_status *st) {
    if (site <= 0) return sd_fail(st, SD_ERR_NONFINITE, "non-finite activations first at the embedding (the token's row)");
    if (site >= sd_nonfinite_site_head(c)) return sd_fail(st, SD_ERR_NONFINITE, "non-finite logits (after the head)");
    return sd_fail(st, SD_ERR_NONFINITE, "non-finite activations first at layer %d (after the %s)", (site - 1) / 2,
                   site % 2 ? "mixer" : "ffn");
}

static void norm_rows(const float *x, const float *w, int T, int D, float eps, float *out) {
    for (int t = 0; t < T; t++) sd_rmsnorm(x + (size_t)t * D, w, D, eps, out + (size_t)t * D);
}

// The caller's route override on each of T tokens' selections (model.h), each expert id checked.
static sd_code override_routes(const sd_forward_opts *o, const sd_config *c, int layer, int p0, int T, int *sel, float *w,
                               sd_status *st) {
    const int K = c->num_experts_per_token;
    for (int t = 0; t < T; t++) {
        o->override_route(o->override_ctx, layer, p0 + t, sel + (size_t)t * K, w + (size_t)t * K, K);
        for (int j = 0; j < K; j++)
            if (sel[(size_t)t * K + j] < 0 || sel[(size_t)t * K + j] >= c->num_experts)
                return sd_fail(st, SD_ERR_USAGE, "route override: expert %d at layer %d, position %d is outside 0..%d",
                               sel[(size_t)t * K + j], layer, p0 + t, c->num_experts - 1);
    }
    return SD_OK;
}

// One layer: h += mixer(rmsnorm(h)); h += ffn(rmsnorm(h)). Level-2 buckets time the mixer and
// the FFN calls when opts->trace asks for them. A rank of a group (m->comm) adds the ranks'
// partial sublayer outputs (all-reduce) before each residual add. The ledger records the routing
// where the walk keeps it (device: the rank, 0 without a group).
static sd_code layer_forward(const sd_model *m, sd_state *s, int i, int T, const sd_forward_opts *opts, sd_status *st) {
    const sd_config *c = &m->cfg;
    const sd_layer_weights *ly = &m->w.layers[i];
    sd_scratch *x = &s->scratch;
    const int D = c->hidden_size;
    trace_burst *tb = opts ? opts->trace : NULL;
    sd_code rc = SD_OK;

    TRACE_RANGE_PUSH(ly->mixer == SD_MIXER_KDA ? "kda" : "mla");
    norm_rows(x->x, ly->input_norm, T, D, c->rms_norm_eps, x->a);
    uint64_t t0 = trace_bucket_start(tb);
    if (ly->mixer == SD_MIXER_KDA) {
        sd_kda_forward(&ly->kda, c, s, i, x->a, T, x->mix, tb);
        trace_bucket_stop(tb, TRACE_BUCKET_VKDA, t0);
    } else {
        sd_mla_forward(&ly->mla, c, s, i, x->a, T, x->mix);
        trace_bucket_stop(tb, TRACE_BUCKET_VMLA, t0);
    }
    TRACE_RANGE_POP(); // the all-reduce stands apart from the sublayer in a profile
    rc = m->comm ? sd_comm_all_reduce(m->comm, i, "mixer", x->mix, (size_t)T * D, st) : SD_OK;
    if (rc) return rc;
    add_into(x->x, x->mix, (size_t)T * D);
    if (!sd_all_finite(x->x, (size_t)T * D)) return sd_nonfinite_fail(c, sd_nonfinite_site_mixer(i), st);

    TRACE_RANGE_PUSH(ly->is_moe ? "moe" : "dense_ffn");
    norm_rows(x->x, ly->post_norm, T, D, c->rms_norm_eps, x->a);
    t0 = trace_bucket_start(tb);
    if (ly->is_moe) {
        const int K = c->num_experts_per_token;
        sd_moe_route_rows(&ly->moe, c, s, x->a, T);
        if (opts && opts->override_route) rc = override_routes(opts, c, i, sd_state_next_pos(s), T, x->sel, x->w, st);
        if (rc) return rc;
        sd_moe_experts(&ly->moe, c, s, x->a, T, x->mix);
        if (opts && opts->ledger)
            rc = ledger_record_device(opts->ledger, m->comm ? m->comm->rank : 0, i, x->sel, x->w, T * K, NULL, st);
        if (opts && opts->on_route)
            for (int t = 0; t < T; t++)
                opts->on_route(opts->route_ctx, i, sd_state_next_pos(s) + t, x->sel + (size_t)t * K, x->w + (size_t)t * K, K,
                               sd_route_margin(x->router + (size_t)t * c->num_experts, ly->moe.bias, c));
    } else {
        sd_ffn_forward(&ly->dense, x->a, T, x->mix, x->ffn_h1, x->ffn_h2);
    }
    trace_bucket_stop(tb, TRACE_BUCKET_VFFN, t0);
    TRACE_RANGE_POP();
    if (!rc && m->comm) rc = sd_comm_all_reduce(m->comm, i, "ffn", x->mix, (size_t)T * D, st);
    if (rc) return rc;
    add_into(x->x, x->mix, (size_t)T * D);
    if (!sd_all_finite(x->x, (size_t)T * D)) return sd_nonfinite_fail(c, sd_nonfinite_site_ffn(i), st);
    return SD_OK;
}

// The sampling request of o on n rows of logits: P_r into o->probs (or `scratch`, in place when
// logits is the scratch: sd_softmax may alias), then sampled[r] = sd_sample(P_r, u_r).
static void sample_rows(const sd_forward_opts *o, const float *logits, int n, int V, float *scratch) {
    for (int r = 0; r < n; r++) {
        float *p = (o->probs ? o->probs : scratch) + (size_t)r * V;
        sd_softmax(logits + (size_t)r * V, V, o->temperature, p);
        if (o->sampled)
            o->sampled[r] = sd_sample(p, V, sd_uniform(o->draw.seed, o->draw.round, o->draw.pos + (uint32_t)r, o->draw.purpose));
    }
}

sd_code sd_forward_check(const sd_model *m, const sd_state *s, const int *tokens, int T, sd_status *st) {
    const int V = m->cfg.vocab_size;
    if (T < 1 || s->pending + T > s->max_T)
        return sd_fail(st, SD_ERR_USAGE, "forward: %d tokens with %d pending, this state holds at most %d uncommitted",
                       T, s->pending, s->max_T);
    if (s->len + s->pending + T > s->capacity)
        return sd_fail(st, SD_ERR_FULL, "context full: %d positions + %d new > capacity %d", s->len + s->pending, T, s->capacity);
    for (int t = 0; t < T; t++)
        if (tokens[t] < 0 || tokens[t] >= V)
            return sd_fail(st, SD_ERR_DATA, "forward: token %d at position %d is outside the vocabulary 0..%d", tokens[t],
                           sd_state_next_pos(s) + t, V - 1);
    return SD_OK;
}

sd_code sd_forward(const sd_model *m, sd_state *s, const int *tokens, int T, float *logits, int last_only,
                   const sd_forward_opts *opts, sd_status *st) {
    const sd_config *c = &m->cfg;
    const int D = c->hidden_size, V = c->vocab_size;
    sd_code rc = sd_forward_check(m, s, tokens, T, st);
    if (rc) return rc;

    if (m->backend && opts && opts->override_route)
        return sd_fail(st, SD_ERR_UNSUPPORTED, "route override: the CPU reference only, not the %s backend", m->backend->name);
    if (m->backend) return m->backend->forward(m, s, tokens, T, logits, last_only, opts, st);

    sd_scratch *x = &s->scratch;
    for (int t = 0; t < T; t++) sd_mat_row_f32(&m->w.embed, tokens[t], x->x + (size_t)t * D);
    if (!sd_all_finite(x->x, (size_t)T * D)) return sd_nonfinite_fail(c, 0, st);
    for (int i = 0; i < c->num_hidden_layers; i++) {
        char name[32];
        snprintf(name, sizeof name, "layer %d", i);
        TRACE_RANGE_PUSH(name);
        rc = layer_forward(m, s, i, T, opts, st);
        TRACE_RANGE_POP();
        if (rc) return rc;
    }

    int *argmax = opts ? opts->argmax : NULL;
    const int sampling = opts && (opts->probs || opts->sampled);
    if (logits || argmax || sampling) {
        const int first = last_only ? T - 1 : 0, n = T - first;
        float *out = logits ? logits : x->logits;
        norm_rows(x->x + (size_t)first * D, m->w.final_norm, n, D, c->rms_norm_eps, x->a);
        if (m->comm) { // a rank holds its vocabulary rows: whole rows gathered, or argmaxes combined
            rc = sd_tp_head(m->comm, &m->w.lm_head, x->a, n, V, logits || sampling ? out : NULL, argmax, st);
            if (rc) return rc;
        } else {
            sd_linear(&m->w.lm_head, x->a, n, out);
        }
        // The head of a finite stream can still overflow (a huge lm_head row): checked before any
        // argmax or draw reads the logits, on every rank alike (each holds the whole rows).
        if ((logits || sampling || !m->comm) && !sd_all_finite(out, (size_t)n * V))
            return sd_nonfinite_fail(c, sd_nonfinite_site_head(c), st);
        for (int r = 0; !m->comm && argmax && r < n; r++) argmax[r] = sd_argmax(out + (size_t)r * V, V);
        if (sampling) sample_rows(opts, out, n, V, x->logits);
    }
    sd_state_advance(s, T);
    return SD_OK;
}

sd_code sd_model_state_init(const sd_model *m, sd_state *s, int capacity, int max_T, sd_status *st) {
    return sd_state_init_on(s, &m->cfg, capacity, max_T, m->backend ? m->backend->mem : NULL, st);
}

void *sd_model_mem_alloc(const sd_model *m, size_t bytes) {
    const sd_allocator *a = m->backend ? m->backend->mem : NULL;
    return a ? a->alloc(bytes, a->ctx) : malloc(bytes);
}

void sd_model_mem_free(const sd_model *m, void *p) {
    if (!p) return;
    const sd_allocator *a = m->backend ? m->backend->mem : NULL;
    if (a) a->free(p, a->ctx);
    else free(p);
}

void sd_model_sync(void *model) {
    const sd_model *m = model;
    if (m->backend && m->backend->sync) m->backend->sync(m->backend->sync_ctx);
}

sd_code sd_prefill_rows(const sd_model *m, sd_state *s, const int *tokens, int n, float *logits, bool all_rows,
                        const sd_prefill_opts *opts, sd_status *st) {
    if (n > SD_PREFILL_TOKEN_PATH_MAX && m->backend && m->backend->prefill && !m->comm) // the batch path has no collectives
        return m->backend->prefill(m, s, tokens, n, logits, all_rows, opts, st);
    const size_t V = (size_t)m->cfg.vocab_size;
    const sd_forward_opts taps = {.on_route = opts ? opts->on_route : NULL, .route_ctx = opts ? opts->route_ctx : NULL};
    for (int done = 0; done < n;) {
        int room = s->max_T - s->pending, T = n - done < room ? n - done : room;
        int last = done + T == n;
        float *out = !logits ? NULL : all_rows ? logits + (size_t)done * V : last ? logits : NULL;
        sd_code rc = sd_forward(m, s, tokens + done, T, out, !all_rows, &taps, st);
        if (rc) return rc;
        sd_state_commit(s, T, st);
        done += T;
    }
    return SD_OK;
}

sd_code sd_prefill(const sd_model *m, sd_state *s, const int *tokens, int n, float *last_logits, sd_status *st) {
    return sd_prefill_rows(m, s, tokens, n, last_logits, false, NULL, st);
}
