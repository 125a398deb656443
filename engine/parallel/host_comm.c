// host_comm.c — emulated ranks' collectives over one mutex and condition variable (host_comm.h).
#include "host_comm.h"
#include <errno.h>
#include <stdlib.h>
#include <string.h>

struct sd_host_comm {
    pthread_mutex_t mu;
    pthread_cond_t cv; // on CLOCK_MONOTONIC
    sd_tp_watch watch; // reached[r]: rank r has published its send buffer of that collective
    uint64_t copied[SD_TP_MAX_RANKS]; // the latest collective rank r has copied out
    const void *send[SD_TP_MAX_RANKS];
    size_t bytes[SD_TP_MAX_RANKS];
    int stop_rank;     // the injected fault (-1: none)
    uint64_t stop_seq;
};

sd_code sd_host_comm_new(sd_host_comm **out, int ranks, double timeout_s, sd_status *st) {
    *out = NULL;
    if (ranks < 1 || ranks > SD_TP_MAX_RANKS)
        return sd_fail(st, SD_ERR_USAGE, "tp: the number of ranks must be in 1..%d, got %d", SD_TP_MAX_RANKS, ranks);
    sd_host_comm *h = calloc(1, sizeof *h);
    if (!h) return sd_fail(st, SD_ERR_SYS, "tp: out of memory for the host collective");
    sd_tp_wait_init(&h->mu, &h->cv);
    sd_tp_watch_init(&h->watch, ranks, timeout_s);
    h->stop_rank = -1;
    *out = h;
    return SD_OK;
}

void sd_host_comm_free(sd_host_comm *h) {
    if (!h) return;
    pthread_cond_destroy(&h->cv);
    pthread_mutex_destroy(&h->mu);
    free(h);
}

bool sd_host_comm_restart(sd_host_comm *h, sd_status *why) {
    pthread_mutex_lock(&h->mu);
    const bool ok = sd_tp_watch_restart(&h->watch, why);
    if (ok) memset(h->copied, 0, sizeof h->copied);
    pthread_mutex_unlock(&h->mu);
    return ok;
}

void sd_host_comm_stop_at(sd_host_comm *h, int rank, uint64_t seq) {
    pthread_mutex_lock(&h->mu);
    h->stop_rank = rank;
    h->stop_seq = seq;
    pthread_mutex_unlock(&h->mu);
}

// Under the lock: wait until every rank's count reaches seq, the group breaks, a rank that is
// behind has left, or the timeout passes (then the first rank behind is blamed). true: all there.
static bool wait_all(sd_host_comm *h, const uint64_t *counts, uint64_t seq, const sd_comm_op *op) {
    sd_tp_watch *w = &h->watch;
    const struct timespec until = sd_tp_deadline(NULL, w->timeout_s);
    for (;;) {
        if (w->broken) return false;
        const int behind = sd_tp_watch_behind(w, counts, seq);
        if (behind < 0) return true;
        if (w->left[behind] || pthread_cond_timedwait(&h->cv, &h->mu, &until) == ETIMEDOUT) {
            if (!w->broken && sd_tp_watch_behind(w, counts, seq) == behind) sd_tp_watch_blame(w, behind, seq, op);
            pthread_cond_broadcast(&h->cv);
        }
    }
}

static sd_code host_all_gather(void *ctx, int rank, uint64_t seq, const sd_comm_op *op, const void *send, size_t bytes,
                               void *recv, sd_status *st) {
    sd_host_comm *h = ctx;
    sd_tp_watch *w = &h->watch;
    pthread_mutex_lock(&h->mu);
    if (rank == h->stop_rank && seq == h->stop_seq) { // stopped answering: waits for the break that names it
        const struct timespec until = sd_tp_deadline(NULL, w->timeout_s);
        while (!w->broken)
            if (pthread_cond_timedwait(&h->cv, &h->mu, &until) == ETIMEDOUT) sd_tp_watch_blame(w, rank, seq, op);
        pthread_cond_broadcast(&h->cv);
    }
    if (w->broken) goto broken;
    h->send[rank] = send;
    h->bytes[rank] = bytes;
    w->reached[rank] = seq;
    pthread_cond_broadcast(&h->cv);
    if (!wait_all(h, w->reached, seq, op)) goto broken;
    for (int r = 0; r < w->ranks; r++)
        if (h->bytes[r] != bytes) {
            char name[128];
            sd_status why;
            sd_comm_op_name(op, seq, name, sizeof name);
            sd_fail(&why, SD_ERR_SYS, "tp: %s: rank %d sent %zu bytes, rank %d %zu", name, r, h->bytes[r], rank, bytes);
            sd_tp_watch_break(w, &why);
            pthread_cond_broadcast(&h->cv);
            goto broken;
        }
    // Every sender waits at the second barrier, so the buffers hold still while we copy.
    pthread_mutex_unlock(&h->mu);
    for (int r = 0; r < w->ranks; r++) memcpy((char *)recv + (size_t)r * bytes, h->send[r], bytes);
    pthread_mutex_lock(&h->mu);
    h->copied[rank] = seq;
    pthread_cond_broadcast(&h->cv);
    if (!wait_all(h, h->copied, seq, op)) goto broken;
    pthread_mutex_unlock(&h->mu);
    return SD_OK;
broken:;
    const sd_code rc = w->why.code;
    if (st) *st = w->why;
    pthread_mutex_unlock(&h->mu);
    return rc;
}

static void host_leave(void *ctx, int rank, sd_code rc, const sd_status *st) {
    sd_host_comm *h = ctx;
    pthread_mutex_lock(&h->mu);
    sd_tp_watch_leave(&h->watch, rank, rc, st);
    pthread_cond_broadcast(&h->cv);
    pthread_mutex_unlock(&h->mu);
}

sd_comm_transport sd_host_comm_transport(sd_host_comm *h) {
    return (sd_comm_transport){.all_gather = host_all_gather, .leave = host_leave, .ctx = h};
}
