// watchdog.c — the arrival table and the messages of a broken group (watchdog.h).
#include "watchdog.h"
#include <string.h>

void sd_tp_watch_init(sd_tp_watch *w, int ranks, double timeout_s) {
    memset(w, 0, sizeof *w);
    w->ranks = ranks;
    w->timeout_s = timeout_s > 0 ? timeout_s : SD_TP_TIMEOUT_DEFAULT_S;
}

int sd_tp_watch_behind(const sd_tp_watch *w, const uint64_t *counts, uint64_t seq) {
    for (int r = 0; r < w->ranks; r++)
        if (counts[r] < seq) return r;
    return -1;
}

bool sd_tp_watch_restart(sd_tp_watch *w, sd_status *why) {
    if (w->broken) {
        if (why) *why = w->why;
        return false;
    }
    memset(w->reached, 0, sizeof w->reached);
    memset(w->left, 0, sizeof w->left);
    return true;
}

void sd_tp_watch_break(sd_tp_watch *w, const sd_status *why) {
    if (w->broken) return;
    w->broken = true;
    w->why = *why;
}

void sd_tp_watch_blame(sd_tp_watch *w, int rank, uint64_t seq, const sd_comm_op *op) {
    char name[128];
    sd_status why;
    sd_comm_op_name(op, seq, name, sizeof name);
    if (w->left[rank]) sd_fail(&why, SD_ERR_SYS, "tp: rank %d ended its run without reaching %s", rank, name);
    else sd_fail(&why, SD_ERR_SYS, "tp: rank %d did not reach %s within %g s", rank, name, w->timeout_s);
    sd_tp_watch_break(w, &why);
}

void sd_tp_watch_leave(sd_tp_watch *w, int rank, sd_code rc, const sd_status *st) {
    w->left[rank] = true;
    if (!rc || w->broken) return;
    sd_status why;
    sd_fail(&why, rc, "tp: rank %d failed: %s", rank, st && st->msg[0] ? st->msg : "(no message)");
    sd_tp_watch_break(w, &why);
}

void sd_tp_wait_init(pthread_mutex_t *mu, pthread_cond_t *cv) {
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_mutex_init(mu, NULL);
    pthread_cond_init(cv, &ca);
    pthread_condattr_destroy(&ca);
}

struct timespec sd_tp_deadline(const struct timespec *from, double s) {
    struct timespec t;
    if (from) t = *from;
    else clock_gettime(CLOCK_MONOTONIC, &t);
    const long long ns = (long long)t.tv_nsec + (long long)(s * 1e9);
    t.tv_sec += (time_t)(ns / 1000000000LL);
    t.tv_nsec = (long)(ns % 1000000000LL);
    return t;
}
