// ranks.c — the runner of a group's rank programs and the emulated CPU group (ranks.h).
#include "ranks.h"
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#include "host_comm.h" // sd_host_comm_*
#include "shard.h"     // sd_tp_shard_model, sd_tp_shard_canary
#include "watchdog.h"  // sd_tp_wait_init, sd_tp_deadline

typedef struct runner runner;

typedef struct {
    runner *run;
    int rank;
    sd_model *model;
    pthread_t tid;
    bool done;
    sd_code rc;
    sd_status st;
} rank_thread;

struct runner {
    pthread_mutex_t mu;
    pthread_cond_t cv; // on CLOCK_MONOTONIC
    sd_tp_rank_fn fn;
    void *ctx;
    int ranks, returned, omp_threads;
    bool failed;
    sd_status first;               // the first failure in time
    struct timespec failed_at;
    rank_thread th[SD_TP_MAX_RANKS];
};

// A runner whose threads were left behind stays reachable here: they still write to it when
// they end, and the process is about to exit.
static runner *left_behind[16];

static void *rank_main(void *arg) {
    rank_thread *t = arg;
    runner *r = t->run;
#ifdef _OPENMP
    omp_set_num_threads(r->omp_threads); // the cores split between the ranks; results never depend on it
#endif
    sd_status st = {0};
    const sd_code rc = r->fn(r->ctx, t->rank, t->model, &st);
    pthread_mutex_lock(&r->mu);
    t->rc = rc;
    t->st = st;
    if (rc && !r->failed) {
        r->failed = true;
        r->first = st;
        clock_gettime(CLOCK_MONOTONIC, &r->failed_at);
    }
    pthread_mutex_unlock(&r->mu);
    // After the failure is recorded, so the ranks it wakes report later than its own message.
    const sd_comm *c = t->model->comm;
    if (c && c->transport.leave) c->transport.leave(c->transport.ctx, c->rank, rc, &st);
    pthread_mutex_lock(&r->mu);
    t->done = true;
    r->returned++;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
    return NULL;
}

// Wait until every thread has returned or, after a failure, grace_s has passed.
static void await_ranks(runner *r, double grace_s) {
    pthread_mutex_lock(&r->mu);
    while (r->returned < r->ranks) {
        if (!r->failed) {
            pthread_cond_wait(&r->cv, &r->mu);
            continue;
        }
        const struct timespec until = sd_tp_deadline(&r->failed_at, grace_s);
        if (pthread_cond_timedwait(&r->cv, &r->mu, &until) == ETIMEDOUT) break;
    }
    pthread_mutex_unlock(&r->mu);
}

sd_code sd_tp_run(int ranks, sd_model *const *models, sd_tp_rank_fn fn, void *ctx, double grace_s, sd_status *rank_st,
                  bool *abandoned, sd_status *st) {
    *abandoned = false;
    if (ranks < 1 || ranks > SD_TP_MAX_RANKS)
        return sd_fail(st, SD_ERR_USAGE, "tp: the number of ranks must be in 1..%d, got %d", SD_TP_MAX_RANKS, ranks);
    runner *r = calloc(1, sizeof *r);
    if (!r) return sd_fail(st, SD_ERR_SYS, "tp: out of memory for the rank threads");
    sd_tp_wait_init(&r->mu, &r->cv);
    r->fn = fn;
    r->ctx = ctx;
    r->ranks = ranks;
#ifdef _OPENMP
    r->omp_threads = omp_get_max_threads() / ranks > 1 ? omp_get_max_threads() / ranks : 1;
#endif
    int started = 0;
    for (; started < ranks; started++) {
        rank_thread *t = &r->th[started];
        *t = (rank_thread){.run = r, .rank = started, .model = models[started]};
        if (pthread_create(&t->tid, NULL, rank_main, t) != 0) break;
    }
    if (started < ranks) { // the ranks that did start must not wait for the missing ones
        sd_status why;
        sd_fail(&why, SD_ERR_SYS, "tp: cannot start the thread of rank %d", started);
        pthread_mutex_lock(&r->mu);
        if (!r->failed) { r->failed = true; r->first = why; clock_gettime(CLOCK_MONOTONIC, &r->failed_at); }
        r->returned += ranks - started;
        pthread_mutex_unlock(&r->mu);
        for (int q = started; q < ranks; q++) {
            r->th[q].done = true;
            const sd_comm *c = models[q]->comm;
            if (c && c->transport.leave) c->transport.leave(c->transport.ctx, c->rank, why.code, &why);
        }
    }
    await_ranks(r, grace_s);

    pthread_mutex_lock(&r->mu);
    int stuck = -1;
    for (int q = 0; q < started; q++) {
        if (r->th[q].done) continue;
        if (stuck < 0) stuck = q;
        pthread_detach(r->th[q].tid);
    }
    const bool failed = r->failed;
    sd_status first = r->first;
    for (int q = 0; rank_st && q < ranks; q++) rank_st[q] = r->th[q].st;
    pthread_mutex_unlock(&r->mu);

    for (int q = 0; q < started && stuck < 0; q++) pthread_join(r->th[q].tid, NULL);
    if (stuck >= 0) {
        *abandoned = true;
        for (size_t i = 0; i < sizeof left_behind / sizeof *left_behind; i++)
            if (!left_behind[i]) { left_behind[i] = r; break; }
        char msg[sizeof first.msg];
        memcpy(msg, first.msg, sizeof msg);
        sd_fail(&first, first.code, "%s; rank %d did not return within %g s after it and was left behind", msg, stuck, grace_s);
    } else {
        pthread_cond_destroy(&r->cv);
        pthread_mutex_destroy(&r->mu);
        free(r);
    }
    if (!failed) return SD_OK;
    if (st) *st = first;
    return first.code;
}

static bool host_restart(void *meet, sd_status *why) { return sd_host_comm_restart(meet, why); }
static void host_free(void *meet) { sd_host_comm_free(meet); }

sd_code sd_tp_group_init(sd_tp_group *g, const sd_model *full, const sd_tp_group_opts *o, sd_status *st) {
    memset(g, 0, sizeof *g);
    sd_code rc = sd_tp_plan_make(&full->cfg, o->ranks, &g->plan, st);
    if (rc) return rc;
    g->ranks = o->ranks;
    g->timeout_s = o->timeout_s > 0 ? o->timeout_s : SD_TP_TIMEOUT_DEFAULT_S;
    if (o->canary_layer >= 0 && (o->canary_rank < 0 || o->canary_rank >= o->ranks))
        return sd_fail(st, SD_ERR_USAGE, "tp: canary rank %d is not one of the %d ranks", o->canary_rank, o->ranks);
    if (o->stop_at > 0 && (o->stop_rank < 0 || o->stop_rank >= o->ranks))
        return sd_fail(st, SD_ERR_USAGE, "tp: stopped rank %d is not one of the %d ranks", o->stop_rank, o->ranks);
    sd_host_comm *meet = NULL;
    rc = sd_host_comm_new(&meet, g->ranks, g->timeout_s, st);
    if (rc) return rc;
    g->meet = meet;
    g->meet_restart = host_restart;
    g->meet_free = host_free;
    if (o->stop_at > 0) sd_host_comm_stop_at(meet, o->stop_rank, o->stop_at);
    g->shards = calloc((size_t)g->ranks, sizeof *g->shards);
    g->comms = calloc((size_t)g->ranks, sizeof *g->comms);
    if (!g->shards || !g->comms) rc = sd_fail(st, SD_ERR_SYS, "tp: out of memory for %d ranks", g->ranks);
    for (int r = 0; !rc && r < g->ranks; r++) {
        rc = sd_tp_shard_model(full, &g->plan, r, &g->shards[r], st);
        if (!rc && o->canary_layer >= 0 && r == o->canary_rank) rc = sd_tp_shard_canary(&g->shards[r], o->canary_layer, st);
        sd_comm_init(&g->comms[r], r, &g->plan, sd_host_comm_transport(meet));
        g->shards[r].comm = &g->comms[r];
    }
    if (rc) sd_tp_group_free(g);
    return rc;
}

void sd_tp_group_free(sd_tp_group *g) {
    if (g->abandoned) return; // a thread left behind may still read all of it
    for (int r = 0; g->shards && r < g->ranks; r++)
        if (g->shards[r].w.arena || g->shards[r].backend) sd_model_free(&g->shards[r]);
    for (int r = 0; g->drafts && r < g->ranks; r++)
        if (g->drafts[r].w.arena || g->drafts[r].backend) sd_model_free(&g->drafts[r]);
    for (int r = 0; g->comms && r < g->ranks; r++) sd_comm_free(&g->comms[r]);
    free(g->shards);
    free(g->drafts);
    free(g->comms);
    if (g->meet) g->meet_free(g->meet);
    memset(g, 0, sizeof *g);
}

const sd_model *sd_tp_group_draft(const sd_tp_group *g, int i, const sd_model *draft) {
    return g && g->drafts ? &g->drafts[i] : draft;
}

sd_code sd_tp_group_run(sd_tp_group *g, sd_tp_rank_fn fn, void *ctx, sd_status *rank_st, sd_status *st) {
    sd_status why;
    if (g->abandoned) return sd_fail(st, SD_ERR_USAGE, "tp: this group left a rank's thread behind; it cannot run again");
    if (!g->meet_restart(g->meet, &why)) {
        if (st) *st = why;
        return why.code;
    }
    for (int r = 0; r < g->ranks; r++) g->comms[r].seq = 0;
    sd_model *models[SD_TP_MAX_RANKS];
    for (int r = 0; r < g->ranks; r++) models[r] = &g->shards[r];
    bool abandoned = false;
    sd_code rc = sd_tp_run(g->ranks, models, fn, ctx, g->timeout_s, rank_st, &abandoned, st);
    if (abandoned) g->abandoned = true;
    return rc;
}
