// host_comm.h — the meeting point of emulated ranks: host threads of one process exchange their
// collectives' bytes here (the transport of comm.h on the CPU). Collective #n is two barriers: at
// the first every rank publishes its send buffer and waits for all; then each copies all of them
// into its own receive buffer, and at the second waits until all have copied, so no sender
// reuses its buffer early. Every wait is timed (the watchdog): a rank that does not arrive
// within the timeout breaks the group, and every rank fails naming it.
#pragma once
#include <stdbool.h>
#include <stdint.h>
#include "comm.h"     // sd_comm_transport
#include "watchdog.h" // sd_tp_watch

typedef struct sd_host_comm sd_host_comm;

// A meeting point for `ranks` threads, each wait at most timeout_s (<= 0: the default).
sd_code sd_host_comm_new(sd_host_comm **out, int ranks, double timeout_s, sd_status *st);
void sd_host_comm_free(sd_host_comm *h);

// The transport over h (each rank's sd_comm gets one).
sd_comm_transport sd_host_comm_transport(sd_host_comm *h);

// Ready h for the next run of its ranks (none of them inside a collective): the collectives
// count from 1 again and every rank is present. A broken group stays broken: false, with the
// message of its break in *why.
bool sd_host_comm_restart(sd_host_comm *h, sd_status *why);

// Fault injection for the watchdog's tests: rank `rank` stops answering at its collective #seq —
// it never arrives there, and only the group's break (which names it) lets its thread return.
void sd_host_comm_stop_at(sd_host_comm *h, int rank, uint64_t seq);
