// comm.c — the collectives a rank issues (comm.h): numbering, the host buffers, and the
// fixed-order sum of the all-reduce.
#include "comm.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void sd_comm_op_name(const sd_comm_op *op, uint64_t seq, char *buf, size_t len) {
    const char *kind = op->kind == SD_COMM_ALL_REDUCE ? "all-reduce" : "all-gather";
    if (op->layer >= 0) snprintf(buf, len, "%s #%llu (layer %d %s)", kind, (unsigned long long)seq, op->layer, op->what);
    else snprintf(buf, len, "%s #%llu (%s)", kind, (unsigned long long)seq, op->what);
}

void sd_comm_init(sd_comm *c, int rank, const sd_tp_plan *plan, sd_comm_transport transport) {
    memset(c, 0, sizeof *c);
    c->rank = rank;
    c->ranks = plan->ranks;
    c->plan = plan;
    c->transport = transport;
}

void sd_comm_free(sd_comm *c) {
    free(c->recv);
    free(c->send);
    free(c->log);
    memset(c, 0, sizeof *c);
}

bool sd_comm_reserve(void **buf, size_t *cap, size_t bytes) {
    if (bytes <= *cap) return true;
    void *p = realloc(*buf, bytes);
    if (!p) return false;
    *buf = p;
    *cap = bytes;
    return true;
}

// While capturing, the op joins the log (a failure to grow it fails the capture's end).
static void log_op(sd_comm *c, const sd_comm_op *op) {
    if (!c->logging) return;
    if (c->log_n == c->log_cap) {
        const int cap = c->log_cap ? 2 * c->log_cap : 64;
        sd_comm_op *v = realloc(c->log, sizeof *v * (size_t)cap);
        if (!v) { c->log_failed = true; return; }
        c->log = v;
        c->log_cap = cap;
    }
    c->log[c->log_n++] = *op;
}

sd_code sd_comm_gather_to(sd_comm *c, sd_comm_kind kind, int layer, const char *what, const void *send, size_t bytes,
                          void *recv, sd_status *st) {
    const sd_comm_op op = {kind, layer, what};
    log_op(c, &op);
    return c->transport.all_gather(c->transport.ctx, c->rank, ++c->seq, &op, send, bytes, recv, st);
}

static sd_code gather(sd_comm *c, sd_comm_op op, const void *send, size_t bytes, const void **recv, sd_status *st) {
    if (!sd_comm_reserve(&c->recv, &c->recv_bytes, bytes * (size_t)c->ranks)) {
        char name[96];
        sd_comm_op_name(&op, c->seq + 1, name, sizeof name);
        return sd_fail(st, SD_ERR_SYS, "tp: rank %d: out of memory for %s (%zu bytes)", c->rank, name,
                       bytes * (size_t)c->ranks);
    }
    *recv = c->recv;
    return sd_comm_gather_to(c, op.kind, op.layer, op.what, send, bytes, c->recv, st);
}

sd_code sd_comm_all_gather(sd_comm *c, int layer, const char *what, const void *send, size_t bytes, const void **recv,
                           sd_status *st) {
    return gather(c, (sd_comm_op){SD_COMM_ALL_GATHER, layer, what}, send, bytes, recv, st);
}

void sd_comm_sum_ranks(const float *g, int ranks, size_t n, float *out) {
    for (size_t i = 0; i < n; i++) {
        float s = g[i];
        for (int r = 1; r < ranks; r++) s += g[(size_t)r * n + i];
        out[i] = s;
    }
}

sd_code sd_comm_all_reduce(sd_comm *c, int layer, const char *what, float *x, size_t n, sd_status *st) {
    const void *g = NULL;
    sd_code rc = gather(c, (sd_comm_op){SD_COMM_ALL_REDUCE, layer, what}, x, n * sizeof(float), &g, st);
    if (!rc) sd_comm_sum_ranks(g, c->ranks, n, x);
    return rc;
}

sd_code sd_comm_check(const sd_comm *c, sd_status *st) {
    if (!c || !c->transport.check) return SD_OK;
    return c->transport.check(c->transport.ctx, c->rank, st);
}

void sd_comm_capture_begin(sd_comm *c) {
    if (!c) return;
    c->logging = true;
    c->log_failed = false;
    c->log_n = 0;
}

sd_code sd_comm_capture_end(sd_comm *c, sd_comm_window *w, sd_status *st) {
    *w = (sd_comm_window){0};
    if (!c) return SD_OK;
    c->logging = false;
    if (c->log_failed) return sd_fail(st, SD_ERR_SYS, "tp: rank %d: out of memory for a graph's collectives", c->rank);
    if (!c->log_n) return SD_OK;
    w->ops = malloc(sizeof *w->ops * (size_t)c->log_n);
    if (!w->ops) return sd_fail(st, SD_ERR_SYS, "tp: rank %d: out of memory for a graph's %d collectives", c->rank, c->log_n);
    memcpy(w->ops, c->log, sizeof *w->ops * (size_t)c->log_n);
    w->n = c->log_n;
    return SD_OK;
}

void sd_comm_window_free(sd_comm_window *w) {
    free(w->ops);
    *w = (sd_comm_window){0};
}

sd_code sd_comm_replay(sd_comm *c, const sd_comm_window *w, sd_code (*launch)(void *launch_ctx, sd_status *st),
                       void *launch_ctx, sd_status *st) {
    if (!c || !w->n) return launch(launch_ctx, st);
    if (!c->transport.replay)
        return sd_fail(st, SD_ERR_USAGE, "tp: rank %d: this group's transport cannot replay captured collectives", c->rank);
    const uint64_t first = c->seq + 1;
    c->seq += (uint64_t)w->n;
    return c->transport.replay(c->transport.ctx, c->rank, first, w->ops, w->n, launch, launch_ctx, st);
}
