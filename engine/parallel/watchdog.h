// watchdog.h — every collective of a group is watched: each rank records the collective it has
// reached; a rank that has waited a timeout for the others, or that finds a peer gone, breaks the
// group with one message naming the rank that stopped answering and the operation, and every
// rank fails with that message — never a silent hang. The table is plain data under its owner's
// lock: the host transport of emulated ranks waits on it with timed waits; a device group's
// monitor thread (docs/PARALLEL.md) reads the same table to decide when to abort its
// communicators.
#pragma once
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <time.h>
#include "comm.h"   // sd_comm_op
#include "plan.h"   // SD_TP_MAX_RANKS
#include "status.h" // sd_status

#define SD_TP_TIMEOUT_DEFAULT_S 5.0

typedef struct sd_tp_watch {
    int ranks;
    double timeout_s;
    uint64_t reached[SD_TP_MAX_RANKS]; // the latest collective each rank has reached (0: none)
    bool left[SD_TP_MAX_RANKS];        // the rank's program has returned
    bool broken;
    sd_status why;                     // the first failure: what every rank reports once broken
} sd_tp_watch;

void sd_tp_watch_init(sd_tp_watch *w, int ranks, double timeout_s);

// The lowest rank whose count in `counts` is below seq (-1: every rank is there).
int sd_tp_watch_behind(const sd_tp_watch *w, const uint64_t *counts, uint64_t seq);

// Break the group: rank `rank` did not reach op (collective seq) — within the timeout, or
// because its program has already returned (w->left[rank]). The first break wins.
void sd_tp_watch_blame(sd_tp_watch *w, int rank, uint64_t seq, const sd_comm_op *op);

// A rank's program returned rc (st: its message). An error breaks the group with "tp: rank R
// failed: <message>" (unless it is already broken).
void sd_tp_watch_leave(sd_tp_watch *w, int rank, sd_code rc, const sd_status *st);

// Ready for the next run: every count back to 0, every rank present — unless the group is broken,
// which it stays: false, with its message in *why (may be NULL).
bool sd_tp_watch_restart(sd_tp_watch *w, sd_status *why);

// Break the group with a message of the caller's (a collective's own fault, e.g. mismatched sizes).
void sd_tp_watch_break(sd_tp_watch *w, const sd_status *why);

// The clock of every timed wait of a group: a mutex and a condition variable on
// CLOCK_MONOTONIC, and the deadline s seconds after a moment (NULL: now) on that clock.
void sd_tp_wait_init(pthread_mutex_t *mu, pthread_cond_t *cv);
struct timespec sd_tp_deadline(const struct timespec *from, double s);
