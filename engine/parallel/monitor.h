// monitor.h — the watchdog of a group whose collectives complete later, on each rank's device
// stream (a device group's NCCL transport, docs/PARALLEL.md): a rank records in the group's table
// (watchdog.h) the collectives it has reached before it enqueues them, then a completion marker
// after them (a CUDA event); a monitor thread of the group's own polls the markers. The group
// breaks — with one message naming the rank that stopped answering and the operation — when a
// collective has been a rank's oldest incomplete one for longer than the timeout, when a rank's
// program fails, or when a peer process reports a break; the monitor then calls the abort hook
// (ncclCommAbort of every communicator), from its own thread because that abort can block while
// graphs holding NCCL work exist. Every rank's next check returns the group's message.
//
// Pure host code: the markers and the abort are hooks, so the CPU suites drive it with fake ones.
#pragma once
#include <stdbool.h>
#include <stdint.h>
#include "comm.h"     // sd_comm_op
#include "watchdog.h" // sd_tp_watch

// Completion markers a rank may have in flight (marks are reused in this rotation: the caller's
// ring of events has this many).
#define SD_TP_MONITOR_QUEUE 1024

typedef struct sd_tp_monitor sd_tp_monitor;

typedef struct {
    // Has marker `mark` of local rank `rank` completed? Never blocks (cudaEventQuery).
    bool (*done)(void *ctx, int rank, void *mark);
    // A failure of the transport itself on rank `rank` (an NCCL async error), or false.
    bool (*failed)(void *ctx, int rank, sd_status *why);
    // Abort every communicator, so every pending collective returns. Called once, from the
    // monitor's thread; may block.
    void (*abort)(void *ctx);
    // Optional, for one process per GPU: publish this process's ranks' entries of w (reached,
    // left, its break) and read the other processes' ranks into w — their reached and left, and
    // a break one of them reports (sd_tp_watch_break with its message). Under the monitor's lock.
    void (*peers)(void *ctx, sd_tp_watch *w);
    void *ctx;
} sd_tp_monitor_hooks;

// A monitor of `ranks` ranks of which this process runs first_local .. first_local+n_local-1,
// polling every timeout/10 (at most 20 ms).
sd_code sd_tp_monitor_new(sd_tp_monitor **out, int ranks, int first_local, int n_local, double timeout_s,
                          const sd_tp_monitor_hooks *hooks, sd_status *st);
// Stops the thread (a broken group's abort still runs first); an abort still blocking in it is
// waited for at most one timeout, then left behind with the monitor (false: the caller must then
// not release what the abort hook uses; the process should exit).
bool sd_tp_monitor_free(sd_tp_monitor *m);

// Rank `rank` is about to enqueue collectives #first .. #first+n-1 (ops[0..n)): the group's
// message if it is broken. Where the injected stop falls among them, the rank stops answering:
// this waits until the group breaks (a peer blames it; failing that, after the timeout, it blames
// itself) and returns the group's message.
sd_code sd_tp_monitor_enter(sd_tp_monitor *m, int rank, uint64_t first, const sd_comm_op *ops, int n, sd_status *st);
// ... and has enqueued them, their completion marked by `mark`; or, with mark NULL, only recorded
// them into a graph being captured (nothing runs: nothing to watch).
sd_code sd_tp_monitor_enqueued(sd_tp_monitor *m, int rank, void *mark, sd_status *st);
// The rank's program returned rc (watchdog.h's sd_tp_watch_leave).
void sd_tp_monitor_leave(sd_tp_monitor *m, int rank, sd_code rc, const sd_status *st);
// Break the group with a failure of the caller's (a collective call that failed).
void sd_tp_monitor_break(sd_tp_monitor *m, const sd_status *why);
// The group's message once broken, else SD_OK.
sd_code sd_tp_monitor_check(sd_tp_monitor *m, sd_status *st);
// Ready for the next run (no collective in flight): counts from 1, every rank present. A broken
// group stays broken: false, its message in *why.
bool sd_tp_monitor_restart(sd_tp_monitor *m, sd_status *why);
// Fault injection (the watchdog's tests, --tp-stop): rank `rank` stops answering at its
// collective #seq.
void sd_tp_monitor_stop_at(sd_tp_monitor *m, int rank, uint64_t seq);
