// door.c — the decode-graph door (cuda_door.h): rounds and steps captured once, replayed after.
#include "cuda_door.h"
#include <stdlib.h>
#include <string.h>
#include "acceptance.h"    // sd_cuda_accept
#include "check.h"         // SD_CUDA_CHECK
#include "cuda_internal.h" // sd_cuda_walk, sd_cuda_head_logits, sd_cuda_head_argmax, sd_cuda_state_is_ours
#include "cursor.h"        // sd_cuda_cursor_commit
#include "philox.h"        // SD_DRAW_DRAFT, SD_DRAW_DECODE
#include "round.h"         // sd_cuda_round_publish
#include "sampling.h"      // sd_cuda_softmax, sd_cuda_sample_rows
#include "parallel/comm.h" // sd_comm_capture_begin, sd_comm_replay, sd_comm_check
#include "spec.h"          // SD_SPEC_MAX_K

// The graphs of a round, in phase order (trace.h's phases); a plain step is one STEP graph.
enum { G_DRAFT, G_VERIFY, G_ACCEPT, G_ROLL, G_MAINT, G_ROUND, G_STEP, G_COUNT };
static const char *graph_name[G_COUNT] = {"draft", "verify", "accept", "rollback", "maintenance", "round", "step"};

struct sd_cuda_door {
    const sd_model *target, *draft;
    sd_state *ts, *ds;
    sd_cuda_backend *tb, *db;
    sd_cuda_door_opts o;
    int k, V, level;
    bool sampled, captured;
    // One device allocation: seq (k + 2) x, d_1 .. d_k, the catch-up feed's pick; top (k + 1) the
    // verify's argmaxes; out (2) n and bonus; round (1) the draws' round counter.
    void *dev;
    int *seq, *top, *out;
    uint32_t *round;
    float *p, *q, *work; // sampled: (k + 1, V) each, and (V); in the target's device memory
    int *pub;            // pinned, device-mapped (k + 2): n, bonus, d_1 .. d_k
    cudaGraphExec_t exec[G_COUNT];
    sd_comm_window win[G_COUNT]; // the collectives each graph holds (a target that is a rank of a group)
    trace_pair *vpairs;  // level 2: the verify graph's event pairs, re-recorded by every replay
    int n_vpairs;
};

// ---------------------------------------------------------------------------- capture
// One forward of T tokens read from `tokens` (device memory) on model m's stream, its head over
// every row, and each row's pick into pick (device memory): the argmax, or — with probs — the
// softmax rows there and a draw at the state's positions (len + pending after the walk, + row),
// keyed by the door's device round counter.
typedef struct {
    int *pick;
    float *probs;
    uint32_t purpose; // with probs and pick: the draw's purpose
    int pos_offset;   // the draw of row r at (len + pending) + pos_offset + r
} pick_rule;

static sd_code enqueue_forward(sd_cuda_door *d, const sd_model *m, sd_state *s, const int *tokens, int T,
                               const sd_forward_opts *opts, const pick_rule *pr, sd_status *st) {
    sd_cuda_backend *b = sd_cuda_backend_of(m);
    const int V = m->cfg.vocab_size;
    SD_TRY(sd_cuda_walk(b, m, s, tokens, T, opts, st));
    if (!pr->probs) return pr->pick ? sd_cuda_head_argmax(b, m, s, 0, T, pr->pick, st) : sd_cuda_head_logits(b, m, s, 0, T, st);
    SD_TRY(sd_cuda_head_logits(b, m, s, 0, T, st));
    SD_TRY(sd_cuda_softmax(s->scratch.logits, T, V, d->o.temperature, pr->probs, b->stream, st));
    if (!pr->pick) return SD_OK;
    const sd_dev_draw at = {.round_dev = d->round, .pos = {s->cursor, pr->pos_offset}};
    return sd_cuda_sample_rows(pr->probs, T, V, d->o.seed, at, pr->purpose, pr->pick, b->stream, st);
}

// Phase bodies, each on the shared stream.
static sd_code body_draft(sd_cuda_door *d, sd_status *st) {
    const size_t V = (size_t)d->V;
    for (int i = 1; i <= d->k + 1; i++) { // the (k+1)-th feeds d_k: the catch-up, made ahead
        const pick_rule pr = {.pick = &d->seq[i], .probs = d->sampled ? d->q + (size_t)(i - 1) * V : NULL,
                              .purpose = SD_DRAW_DRAFT};
        SD_TRY(enqueue_forward(d, d->draft, d->ds, &d->seq[i - 1], 1, NULL, &pr, st));
    }
    return SD_OK;
}

static sd_code body_verify(sd_cuda_door *d, sd_status *st) {
    const sd_forward_opts opts = {.trace = d->level >= 2 ? d->o.trace : NULL, .ledger = d->o.ledger};
    const pick_rule pr = {.pick = d->sampled ? NULL : d->top, .probs = d->sampled ? d->p : NULL};
    return enqueue_forward(d, d->target, d->ts, d->seq, d->k + 1, &opts, &pr, st);
}

static sd_code body_accept(sd_cuda_door *d, sd_status *st) {
    // pos_x: the target's length at the round's start (its cursor after the verify: len, k + 1 pending).
    const sd_dev_draw at = {.round_dev = d->round, .pos = {d->ts->cursor, -(d->k + 1)}};
    return sd_cuda_accept(&d->seq[1], d->k, d->sampled ? NULL : d->top, d->p, d->q, d->work, d->V, d->o.seed, at, d->out,
                          d->tb->stream, st);
}

static sd_code body_roll(sd_cuda_door *d, sd_status *st) { return sd_cuda_cursor_commit(d->ts->cursor, d->out, 1, d->tb->stream, st); }

static sd_code body_maint(sd_cuda_door *d, sd_status *st) {
    SD_TRY(sd_cuda_cursor_commit(d->ds->cursor, d->out, 1, d->tb->stream, st));
    return sd_cuda_round_publish(d->out, d->seq, d->k, d->pub, d->round, d->tb->stream, st);
}

// A plain step: out[0] stays 0 (the "accepted" count), out[1] gets the pick; commit 0 + 1.
static sd_code body_step(sd_cuda_door *d, sd_status *st) {
    const sd_forward_opts opts = {.ledger = d->o.ledger};
    const pick_rule pr = {.pick = &d->out[1], .probs = d->sampled ? d->p : NULL, .purpose = SD_DRAW_DECODE,
                          .pos_offset = 0};
    SD_TRY(enqueue_forward(d, d->target, d->ts, d->seq, 1, &opts, &pr, st));
    SD_TRY(sd_cuda_cursor_commit(d->ts->cursor, d->out, 1, d->tb->stream, st));
    return sd_cuda_round_publish(d->out, d->seq, 0, d->pub, NULL, d->tb->stream, st);
}

static sd_code body_round(sd_cuda_door *d, sd_status *st) {
    SD_TRY(body_draft(d, st));
    SD_TRY(body_verify(d, st));
    SD_TRY(body_accept(d, st));
    SD_TRY(body_roll(d, st));
    return body_maint(d, st);
}

static sd_code (*const bodies[G_COUNT])(sd_cuda_door *, sd_status *) = {body_draft, body_verify, body_accept, body_roll,
                                                                        body_maint, body_round, body_step};

// Captures graph g on the target's stream and instantiates it.
static sd_code capture(sd_cuda_door *d, int g, sd_status *st) {
    cudaStream_t q = d->tb->stream;
    cudaError_t e = cudaStreamBeginCapture(q, cudaStreamCaptureModeThreadLocal);
    if (e != cudaSuccess) return sd_fail(st, SD_ERR_SYS, "graph door: capture of the %s graph: %s", graph_name[g], cudaGetErrorString(e));
    sd_comm_capture_begin(d->target->comm); // every rank captures the same collectives
    sd_status body_st = {0};
    sd_code body = bodies[g](d, &body_st);
    cudaGraph_t graph = NULL;
    e = cudaStreamEndCapture(q, &graph); // always end what began
    if (!body) body = sd_comm_capture_end(d->target->comm, &d->win[g], &body_st);
    else sd_comm_capture_end(d->target->comm, &d->win[g], NULL);
    sd_code rc = SD_OK;
    if (body) rc = sd_fail(st, body, "graph door: capture of the %s graph: %s", graph_name[g], body_st.msg);
    else if (e != cudaSuccess)
        rc = sd_fail(st, SD_ERR_SYS, "graph door: capture of the %s graph: %s", graph_name[g], cudaGetErrorString(e));
    if (!rc) {
        e = cudaGraphInstantiate(&d->exec[g], graph, 0);
        if (e != cudaSuccess)
            rc = sd_fail(st, SD_ERR_SYS, "graph door: instantiate the %s graph: %s", graph_name[g], cudaGetErrorString(e));
    }
    if (graph) cudaGraphDestroy(graph);
    if (rc) (void)cudaGetLastError();
    return rc;
}

// One eager forward of every shape the graphs hold, rolled back (commit 0): kernels loaded, their
// attributes set and the backends' buffers grown before any capture opens.
static sd_code warm_up(sd_cuda_door *d, int x, sd_status *st) {
    int toks[SD_SPEC_MAX_K + 1], got[SD_SPEC_MAX_K + 1];
    for (int i = 0; i <= d->k; i++) toks[i] = x;
    sd_forward_opts o = {.argmax = got};
    SD_TRY(sd_forward(d->target, d->ts, toks, d->k + 1, NULL, 0, &o, st));
    SD_TRY(sd_state_commit(d->ts, 0, st));
    if (d->k) {
        SD_TRY(sd_forward(d->draft, d->ds, toks, 1, NULL, 0, &o, st));
        SD_TRY(sd_state_commit(d->ds, 0, st));
    }
    return SD_OK;
}

static sd_code capture_all(sd_cuda_door *d, int x, uint32_t round, sd_status *st) {
    SD_TRY(warm_up(d, x, st));
    int seq0[2] = {x, 0};
    SD_CUDA_CHECK(st, cudaMemcpy(d->seq, seq0, sizeof seq0, cudaMemcpyHostToDevice));
    SD_CUDA_CHECK(st, cudaMemcpy(d->round, &round, sizeof round, cudaMemcpyHostToDevice));
    SD_CUDA_CHECK(st, cudaMemset(d->out, 0, 2 * sizeof(int)));
    SD_CUDA_CHECK(st, cudaStreamSynchronize(d->tb->stream));
    if (!d->k) return capture(d, G_STEP, st);
    if (d->level == 0) return capture(d, G_ROUND, st);
    trace_burst *tb = d->o.trace;
    const int pairs0 = tb->n_pairs;
    for (int g = G_DRAFT; g <= G_MAINT; g++) SD_TRY(capture(d, g, st));
    if (d->level >= 2) { // the verify graph's event pairs: kept by the door, re-recorded by every replay
        d->n_vpairs = tb->n_pairs - pairs0;
        d->vpairs = malloc(sizeof *d->vpairs * (size_t)(d->n_vpairs ? d->n_vpairs : 1));
        if (!d->vpairs) return sd_fail(st, SD_ERR_SYS, "graph door: out of memory for %d event pairs", d->n_vpairs);
        memcpy(d->vpairs, tb->pairs + pairs0, sizeof *d->vpairs * (size_t)d->n_vpairs);
        tb->n_pairs = pairs0;
    }
    return SD_OK;
}

// ---------------------------------------------------------------------------- open / close
static sd_code refuse(sd_status *st, const char *why) {
    return sd_fail(st, SD_ERR_USAGE, "graph door: %s", why);
}

sd_code sd_cuda_door_open(const sd_model *target, sd_state *ts, const sd_model *draft, sd_state *ds,
                          const sd_cuda_door_opts *o, sd_cuda_door **door, sd_status *st) {
    *door = NULL;
    sd_cuda_backend *tb = sd_cuda_backend_of(target), *db = o->k ? sd_cuda_backend_of(draft) : NULL;
    if (!tb || (o->k && !db)) return refuse(st, "the models must be CUDA models (--graph needs --backend cuda and a GPU)");
    if (!sd_cuda_state_is_ours(tb, ts) || (o->k && !sd_cuda_state_is_ours(db, ds)))
        return refuse(st, "the states must be in the models' device memory");
    if (o->k && db->device != tb->device) return refuse(st, "the draft and the target must be on one device");
    if (tb->moe_arm != SD_CUDA_MOE_DEVICE_TABLE || (db && db->moe_arm != SD_CUDA_MOE_DEVICE_TABLE))
        return refuse(st, "the eager MoE arm reads the routing back to the host mid-step; a capture forbids it");
    if (o->k < 0 || o->k > SD_SPEC_MAX_K) return sd_fail(st, SD_ERR_USAGE, "graph door: k = %d outside 0..%d", o->k, SD_SPEC_MAX_K);
    if (ts->max_T < o->k + 1 || (o->k && ds->max_T < o->k + 1))
        return sd_fail(st, SD_ERR_USAGE, "graph door: states too small for k = %d (the draft feeds k + 1 tokens a round)", o->k);
    const int level = o->trace ? o->trace->level : 0;
    if (level >= 2 && !o->trace->events)
        return refuse(st, "level-2 buckets inside a graph come from CUDA events: the trace must be in event mode");
    sd_cuda_door *d = calloc(1, sizeof *d);
    if (!d) return sd_fail(st, SD_ERR_SYS, "graph door: out of memory");
    *d = (sd_cuda_door){.target = target, .draft = draft, .ts = ts, .ds = ds, .tb = tb, .db = db, .o = *o, .k = o->k,
                        .V = target->cfg.vocab_size, .level = level, .sampled = o->temperature > 0.0f};
    sd_code rc = SD_OK;
    if (db) rc = sd_cuda_backend_share_stream(db, tb, st); // one stream: the round is one capture
    const size_t k2 = (size_t)d->k + 2, V = (size_t)d->V;
    const size_t ints = k2 + (k2 - 1) + 2 + 1, floats = d->sampled ? 2 * (k2 - 1) * V + V : 0;
    if (!rc && cudaSetDevice(tb->device) != cudaSuccess) rc = sd_fail(st, SD_ERR_SYS, "graph door: cudaSetDevice failed");
    if (!rc && (cudaMalloc(&d->dev, sizeof(int) * ints + sizeof(float) * floats + 64) != cudaSuccess ||
                cudaMallocHost((void **)&d->pub, sizeof(int) * k2) != cudaSuccess))
        rc = sd_fail(st, SD_ERR_SYS, "graph door: no device memory for the round's buffers: %s",
                     cudaGetErrorString(cudaGetLastError()));
    if (!rc) {
        d->seq = d->dev;
        d->top = d->seq + k2;
        d->out = d->top + (k2 - 1);
        d->round = (uint32_t *)(d->out + 2);
        float *f = (float *)(((uintptr_t)(d->round + 1) + 15) & ~(uintptr_t)15);
        if (d->sampled) {
            d->p = f;
            d->q = f + (k2 - 1) * V;
            d->work = f + 2 * (k2 - 1) * V;
        }
    }
    if (!rc && o->ledger) // the slots, before any capture opens
        for (int i = 0; i < target->cfg.num_hidden_layers && !rc; i++)
            if (sd_config_is_moe(&target->cfg, i))
                rc = ledger_prearm(o->ledger, tb->device, i, ts->max_T * target->cfg.num_experts_per_token, st);
    if (rc) {
        sd_cuda_door_close(d);
        return rc;
    }
    *door = d;
    return SD_OK;
}

void sd_cuda_door_close(sd_cuda_door *d) {
    if (!d) return;
    cudaSetDevice(d->tb->device);
    cudaStreamSynchronize(d->tb->stream);
    for (int g = 0; g < G_COUNT; g++) {
        if (d->exec[g]) cudaGraphExecDestroy(d->exec[g]);
        sd_comm_window_free(&d->win[g]);
    }
    cudaFree(d->dev);
    cudaFreeHost(d->pub);
    free(d->vpairs);
    free(d);
}

// ---------------------------------------------------------------------------- replay
typedef struct {
    sd_cuda_door *d;
    int g;
} graph_launch;

static sd_code launch_graph(void *ctx, sd_status *st) {
    const graph_launch *l = ctx;
    const cudaError_t e = cudaGraphLaunch(l->d->exec[l->g], l->d->tb->stream);
    if (e != cudaSuccess)
        return sd_fail(st, SD_ERR_SYS, "graph door: launch of the %s graph: %s", graph_name[l->g], cudaGetErrorString(e));
    return SD_OK;
}

// A replay: through the target's comm when it is a rank of a group (its collectives numbered and
// watched as eager ones, parallel/comm.h), else the launch alone.
static sd_code launch(sd_cuda_door *d, int g, sd_status *st) {
    graph_launch l = {d, g};
    return sd_comm_replay(d->target->comm, &d->win[g], launch_graph, &l, st);
}

// The stream drained; a rank of a broken group then reports the group's failure (an aborted
// collective leaves the round's results meaningless).
// Then the models' non-finite flags (the graphs' heads copied them): a round or step that saw a
// NaN or an Inf fails naming the site (the draft's first, it ran first); its device cursors have
// committed, so the run ends there (the CLI exits 1).
static sd_code drain(sd_cuda_door *d, sd_status *st) {
    const cudaError_t e = cudaStreamSynchronize(d->tb->stream);
    SD_TRY(sd_comm_check(d->target->comm, st));
    SD_CUDA_CHECK(st, e);
    if (d->draft) SD_TRY(sd_cuda_nonfinite_take(sd_cuda_backend_of(d->draft), &d->draft->cfg, st));
    return sd_cuda_nonfinite_take(d->tb, &d->target->cfg, st);
}

sd_code sd_cuda_door_round(sd_cuda_door *d, int x, uint32_t round, int *emit, int *n, sd_status *st) {
    if (!d->k) return sd_fail(st, SD_ERR_USAGE, "graph door: a round needs a draft (k >= 1)");
    sd_state *ts = d->ts, *ds = d->ds;
    if (ts->pending || ds->pending) return sd_fail(st, SD_ERR_USAGE, "graph door: a round starts with nothing pending");
    if (ts->len + d->k + 1 > ts->capacity || ds->len + d->k + 1 > ds->capacity)
        return sd_fail(st, SD_ERR_FULL, "context full: %d positions + a round of %d > capacity %d", ts->len, d->k + 1,
                       ts->capacity < ds->capacity ? ts->capacity : ds->capacity);
    SD_CUDA_CHECK(st, cudaSetDevice(d->tb->device));
    if (!d->captured) {
        SD_TRY(capture_all(d, x, round, st));
        d->captured = true;
    }
    const int pos0 = ts->len;
    trace_burst *tb = d->o.trace;
    if (d->level == 0) {
        SD_TRY(launch(d, G_ROUND, st));
        SD_TRY(drain(d, st));
    } else {
        trace_round_begin(tb); // a capture just now is no phase's
        for (int g = G_DRAFT; g <= G_MAINT; g++) {
            trace_phase_begin((trace_phase)g);
            SD_TRY(launch(d, g, st));
            trace_phase_end(tb, (trace_phase)g); // drains both models' streams (the same one)
            if (g == G_VERIFY && d->level >= 2) {
                SD_TRY(drain(d, st));
                trace_burst_add_pairs(tb, d->vpairs, d->n_vpairs);
            }
        }
        SD_TRY(drain(d, st));
    }
    const int acc = d->pub[0];
    if (acc < 0 || acc > d->k) return sd_fail(st, SD_ERR_SYS, "graph door: the round published n = %d (k = %d)", acc, d->k);
    memcpy(emit, &d->pub[2], sizeof(int) * (size_t)acc);
    emit[acc] = d->pub[1];
    *n = acc;
    sd_state_committed_on_device(ts, acc + 1);
    sd_state_committed_on_device(ds, acc + 1);
    if (d->o.after_target) d->o.after_target(d->o.ctx, pos0, d->k + 1);
    return SD_OK;
}

sd_code sd_cuda_door_step(sd_cuda_door *d, int tok, int *next, sd_status *st) {
    if (d->k) return sd_fail(st, SD_ERR_USAGE, "graph door: a plain step has no draft (k = 0)");
    sd_state *ts = d->ts;
    if (ts->pending) return sd_fail(st, SD_ERR_USAGE, "graph door: a step starts with nothing pending");
    if (ts->len + 1 > ts->capacity)
        return sd_fail(st, SD_ERR_FULL, "context full: %d positions + 1 new > capacity %d", ts->len, ts->capacity);
    SD_CUDA_CHECK(st, cudaSetDevice(d->tb->device));
    if (!d->captured) {
        SD_TRY(capture_all(d, tok, 0, st));
        d->captured = true;
    }
    const int pos0 = ts->len;
    SD_TRY(launch(d, G_STEP, st));
    SD_TRY(drain(d, st));
    *next = d->pub[1];
    sd_state_committed_on_device(ts, 1);
    if (d->o.after_target) d->o.after_target(d->o.ctx, pos0, 1);
    return SD_OK;
}
