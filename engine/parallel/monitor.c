// monitor.c — the watchdog thread of an asynchronous group (monitor.h).
#include "monitor.h"
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define OPS_RING 4096 // the ops a rank entered, by seq: what a blame names

typedef struct {
    uint64_t first, last; // collectives #first .. #last
    void *mark;           // their completion marker
    struct timespec since; // since when they are the rank's oldest incomplete ones
} entry;

typedef struct {
    entry q[SD_TP_MONITOR_QUEUE];
    int head, n;
    sd_comm_op ops[OPS_RING];
    uint64_t op_seq[OPS_RING];
    bool entering;             // between enter and enqueued (the enqueue call itself is watched too)
    struct timespec enter_t;
    uint64_t enter_first, enter_last;
} rank_queue;

struct sd_tp_monitor {
    pthread_mutex_t mu;
    pthread_cond_t cv; // on CLOCK_MONOTONIC
    sd_tp_watch w;
    int first_local, n_local;
    sd_tp_monitor_hooks h;
    rank_queue *rq; // n_local
    int stop_rank;  // the injected fault (-1: none)
    uint64_t stop_seq;
    double poll_s;
    bool running, aborting, thread_done;
    pthread_t tid;
};

static double since_s(const struct timespec *a, const struct timespec *b) {
    return (double)(b->tv_sec - a->tv_sec) + 1e-9 * (double)(b->tv_nsec - a->tv_nsec);
}

static sd_comm_op op_at(const rank_queue *q, uint64_t seq) {
    if (q->op_seq[seq % OPS_RING] == seq) return q->ops[seq % OPS_RING];
    return (sd_comm_op){SD_COMM_ALL_GATHER, -1, "collective"};
}

// Local rank li's collectives #first .. #last have not completed within the timeout: blame the
// lowest rank that has not reached them, at the first one it has not reached; when every rank
// has, the collective itself did not complete. Under the lock.
static void blame(sd_tp_monitor *m, int li, uint64_t first, uint64_t last) {
    sd_tp_watch *w = &m->w;
    const rank_queue *q = &m->rq[li];
    const int behind = sd_tp_watch_behind(w, w->reached, last);
    if (behind >= 0) {
        uint64_t seq = w->reached[behind] + 1;
        if (seq < first) seq = first;
        const sd_comm_op op = op_at(q, seq);
        sd_tp_watch_blame(w, behind, seq, &op);
    } else {
        const sd_comm_op op = op_at(q, first);
        char name[128];
        sd_status why;
        sd_comm_op_name(&op, first, name, sizeof name);
        sd_fail(&why, SD_ERR_SYS, "tp: %s did not complete within %g s on rank %d, though every rank reached it", name,
                w->timeout_s, m->first_local + li);
        sd_tp_watch_break(w, &why);
    }
}

// Local rank li's completed markers retired, oldest first (the next one's clock starts now); a
// rank waiting for room in its queue is woken. Under the lock, on the monitor's thread only (a
// marker's query is a CUDA call, which a rank thread inside a capture must not make).
static void retire(sd_tp_monitor *m, int li, const struct timespec *now) {
    rank_queue *q = &m->rq[li];
    const int before = q->n;
    while (q->n && m->h.done(m->h.ctx, m->first_local + li, q->q[q->head].mark)) {
        q->head = (q->head + 1) % SD_TP_MONITOR_QUEUE;
        if (--q->n) q->q[q->head].since = *now;
    }
    if (q->n < before) pthread_cond_broadcast(&m->cv);
}

// One look at every local rank: completed markers retired, then the oldest incomplete
// collective (or a rank stuck in its enqueue call) against the timeout. Under the lock.
static void scan(sd_tp_monitor *m) {
    sd_tp_watch *w = &m->w;
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    for (int li = 0; li < m->n_local && !w->broken; li++) {
        const int rank = m->first_local + li;
        rank_queue *q = &m->rq[li];
        sd_status why;
        if (m->h.failed && m->h.failed(m->h.ctx, rank, &why)) {
            sd_tp_watch_break(w, &why);
            break;
        }
        retire(m, li, &now);
        if (q->n) {
            const entry *e = &q->q[q->head];
            const int behind = sd_tp_watch_behind(w, w->reached, e->last);
            if ((behind >= 0 && w->left[behind]) || since_s(&e->since, &now) > w->timeout_s) blame(m, li, e->first, e->last);
        }
        if (!w->broken && q->entering && since_s(&q->enter_t, &now) > w->timeout_s) blame(m, li, q->enter_first, q->enter_last);
    }
}

// Polls until stopped; a broken group's communicators are aborted even when the stop comes first.
static void *monitor_main(void *arg) {
    sd_tp_monitor *m = arg;
    pthread_mutex_lock(&m->mu);
    for (;;) {
        if (m->h.peers) m->h.peers(m->h.ctx, &m->w);
        if (!m->w.broken && m->running) scan(m);
        if (m->w.broken && !m->aborting) { // the abort runs unlocked: it may block
            m->aborting = true;
            pthread_cond_broadcast(&m->cv);
            pthread_mutex_unlock(&m->mu);
            m->h.abort(m->h.ctx);
            pthread_mutex_lock(&m->mu);
            pthread_cond_broadcast(&m->cv);
            continue;
        }
        if (!m->running) break;
        const struct timespec until = sd_tp_deadline(NULL, m->poll_s);
        pthread_cond_timedwait(&m->cv, &m->mu, &until);
    }
    m->thread_done = true;
    pthread_cond_broadcast(&m->cv);
    pthread_mutex_unlock(&m->mu);
    return NULL;
}

sd_code sd_tp_monitor_new(sd_tp_monitor **out, int ranks, int first_local, int n_local, double timeout_s,
                          const sd_tp_monitor_hooks *hooks, sd_status *st) {
    *out = NULL;
    if (ranks < 1 || ranks > SD_TP_MAX_RANKS || first_local < 0 || n_local < 1 || first_local + n_local > ranks)
        return sd_fail(st, SD_ERR_USAGE, "tp monitor: local ranks %d..%d of %d", first_local, first_local + n_local - 1, ranks);
    sd_tp_monitor *m = calloc(1, sizeof *m);
    rank_queue *rq = calloc((size_t)n_local, sizeof *rq);
    if (!m || !rq) {
        free(m);
        free(rq);
        return sd_fail(st, SD_ERR_SYS, "tp monitor: out of memory");
    }
    sd_tp_wait_init(&m->mu, &m->cv);
    sd_tp_watch_init(&m->w, ranks, timeout_s);
    m->first_local = first_local;
    m->n_local = n_local;
    m->h = *hooks;
    m->rq = rq;
    m->stop_rank = -1;
    m->poll_s = m->w.timeout_s / 10 < 0.02 ? m->w.timeout_s / 10 : 0.02;
    m->running = true;
    if (pthread_create(&m->tid, NULL, monitor_main, m) != 0) {
        pthread_cond_destroy(&m->cv);
        pthread_mutex_destroy(&m->mu);
        free(rq);
        free(m);
        return sd_fail(st, SD_ERR_SYS, "tp monitor: cannot start its thread");
    }
    *out = m;
    return SD_OK;
}

bool sd_tp_monitor_free(sd_tp_monitor *m) {
    if (!m) return true;
    pthread_mutex_lock(&m->mu);
    m->running = false;
    pthread_cond_broadcast(&m->cv);
    const struct timespec until = sd_tp_deadline(NULL, m->w.timeout_s + 1.0);
    while (!m->thread_done)
        if (pthread_cond_timedwait(&m->cv, &m->mu, &until) == ETIMEDOUT) break;
    const bool done = m->thread_done;
    pthread_mutex_unlock(&m->mu);
    if (!done) { // blocked in the abort: left behind with what it uses
        pthread_detach(m->tid);
        return false;
    }
    pthread_join(m->tid, NULL);
    pthread_cond_destroy(&m->cv);
    pthread_mutex_destroy(&m->mu);
    free(m->rq);
    free(m);
    return true;
}

static sd_code broken(sd_tp_monitor *m, sd_status *st) {
    if (st) *st = m->w.why;
    return m->w.why.code;
}

sd_code sd_tp_monitor_enter(sd_tp_monitor *m, int rank, uint64_t first, const sd_comm_op *ops, int n, sd_status *st) {
    const int li = rank - m->first_local;
    rank_queue *q = &m->rq[li];
    sd_tp_watch *w = &m->w;
    pthread_mutex_lock(&m->mu);
    if (w->broken) goto fail;
    // A full queue: the monitor retires the markers that are done at its next look.
    const struct timespec room_by = sd_tp_deadline(NULL, w->timeout_s);
    while (q->n == SD_TP_MONITOR_QUEUE && !w->broken)
        if (pthread_cond_timedwait(&m->cv, &m->mu, &room_by) == ETIMEDOUT) break;
    if (w->broken) goto fail;
    if (q->n == SD_TP_MONITOR_QUEUE) {
        pthread_mutex_unlock(&m->mu);
        return sd_fail(st, SD_ERR_SYS, "tp: rank %d has %d collectives in flight (its stream is never drained)", rank,
                       SD_TP_MONITOR_QUEUE);
    }
    for (int i = 0; i < n; i++) {
        q->ops[(first + (uint64_t)i) % OPS_RING] = ops[i];
        q->op_seq[(first + (uint64_t)i) % OPS_RING] = first + (uint64_t)i;
    }
    q->entering = true;
    clock_gettime(CLOCK_MONOTONIC, &q->enter_t);
    q->enter_first = first;
    q->enter_last = first + (uint64_t)n - 1;
    if (rank == m->stop_rank && m->stop_seq >= first && m->stop_seq <= q->enter_last) {
        // Stops answering: reaches the collectives before the stop, then waits for the break
        // (a peer's blame, or the monitor's own once the timeout passes).
        if (m->stop_seq - 1 > w->reached[rank]) w->reached[rank] = m->stop_seq - 1;
        pthread_cond_broadcast(&m->cv);
        while (!w->broken) {
            const struct timespec until = sd_tp_deadline(NULL, 1.0);
            pthread_cond_timedwait(&m->cv, &m->mu, &until);
        }
        q->entering = false;
        goto fail;
    }
    w->reached[rank] = q->enter_last;
    pthread_cond_broadcast(&m->cv);
    pthread_mutex_unlock(&m->mu);
    return SD_OK;
fail:;
    const sd_code rc = broken(m, st);
    pthread_mutex_unlock(&m->mu);
    return rc;
}

sd_code sd_tp_monitor_enqueued(sd_tp_monitor *m, int rank, void *mark, sd_status *st) {
    rank_queue *q = &m->rq[rank - m->first_local];
    pthread_mutex_lock(&m->mu);
    q->entering = false;
    if (mark) {
        entry *e = &q->q[(q->head + q->n) % SD_TP_MONITOR_QUEUE];
        *e = (entry){.first = q->enter_first, .last = q->enter_last, .mark = mark};
        clock_gettime(CLOCK_MONOTONIC, &e->since);
        q->n++;
    }
    const sd_code rc = m->w.broken ? broken(m, st) : SD_OK;
    pthread_mutex_unlock(&m->mu);
    return rc;
}

void sd_tp_monitor_leave(sd_tp_monitor *m, int rank, sd_code rc, const sd_status *st) {
    pthread_mutex_lock(&m->mu);
    sd_tp_watch_leave(&m->w, rank, rc, st);
    pthread_cond_broadcast(&m->cv);
    pthread_mutex_unlock(&m->mu);
}

void sd_tp_monitor_break(sd_tp_monitor *m, const sd_status *why) {
    pthread_mutex_lock(&m->mu);
    sd_tp_watch_break(&m->w, why);
    pthread_cond_broadcast(&m->cv);
    pthread_mutex_unlock(&m->mu);
}

sd_code sd_tp_monitor_check(sd_tp_monitor *m, sd_status *st) {
    pthread_mutex_lock(&m->mu);
    const sd_code rc = m->w.broken ? broken(m, st) : SD_OK;
    pthread_mutex_unlock(&m->mu);
    return rc;
}

bool sd_tp_monitor_restart(sd_tp_monitor *m, sd_status *why) {
    pthread_mutex_lock(&m->mu);
    const bool ok = sd_tp_watch_restart(&m->w, why);
    for (int li = 0; ok && li < m->n_local; li++) {
        m->rq[li].n = m->rq[li].head = 0;
        m->rq[li].entering = false;
    }
    pthread_mutex_unlock(&m->mu);
    return ok;
}

void sd_tp_monitor_stop_at(sd_tp_monitor *m, int rank, uint64_t seq) {
    pthread_mutex_lock(&m->mu);
    m->stop_rank = rank;
    m->stop_seq = seq;
    pthread_mutex_unlock(&m->mu);
}
