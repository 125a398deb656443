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

static sd_code gather(sd_comm *c, sd_comm_op op, const void *send, size_t bytes, const void **recv, sd_status *st) {
    const uint64_t seq = ++c->seq;
    if (!sd_comm_reserve(&c->recv, &c->recv_bytes, bytes * (size_t)c->ranks)) {
        char name[96];
        sd_comm_op_name(&op, seq, name, sizeof name);
        return sd_fail(st, SD_ERR_SYS, "tp: rank %d: out of memory for %s (%zu bytes)", c->rank, name,
                       bytes * (size_t)c->ranks);
    }
    *recv = c->recv;
    return c->transport.all_gather(c->transport.ctx, c->rank, seq, &op, send, bytes, c->recv, st);
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
