// nccl_comm.h — the transport of a device group (parallel/comm.h's sd_comm_transport) over NCCL:
// each collective is an ncclAllGather of device memory on the rank's stream (the sum of an
// all-reduce is the caller's kernel, kernels/tp_reduce.h), capturable, so a graph holds it.
// A communicator per rank, made one of two ways:
//   one process, N devices:  ncclCommInitAll over devices[0..N) (rank r on devices[r]);
//   one process per GPU:     rank 0 writes ncclGetUniqueId to the id file atomically (a temporary
//                            name renamed); the others wait for it; every rank joins with
//                            ncclCommInitRankConfig (non-blocking), each wait bounded by the init
//                            timeout (12 × the collective timeout) — never a hang at start.
// Every collective is watched by the group's monitor (parallel/monitor.h): the rank's reach is
// recorded before the call and a CUDA event after it (or, for a graph's collectives, after the
// graph's launch); a collective not complete within the timeout gets every communicator aborted
// by the monitor's thread and every rank fails with the message naming the rank that stopped
// answering. With one process per GPU the ranks' processes exchange their progress and a break
// through small files beside the id file (ID.r0 .. ID.r<N-1>), so every process names the same
// rank.
//
// NVLink multicast stays off: NCCL_NVLS_ENABLE=0 (and NCCL_RUNTIME_CONNECT=0: connections made at
// init, so no collective call waits on a peer) are set in the process before the first NCCL call
// unless the environment already sets them.
#pragma once
#include <cuda_runtime_api.h> // cudaStream_t
#include <stdbool.h>
#include <stdint.h>
#include "parallel/comm.h" // sd_comm_transport

typedef struct sd_nccl_group sd_nccl_group;

typedef struct {
    int ranks;           // N
    int rank;            // -1: this process runs every rank, rank r on devices[r]; else its one rank
    const int *devices;  // rank -1: N ordinals; else devices[0], this rank's
    const char *id_file; // rank >= 0: the file the unique id passes through
    double timeout_s;    // every collective's (<= 0: the default)
} sd_nccl_opts;

// Is NCCL in this build?
bool sd_nccl_available(void);

// The communicators of this process's ranks (all N, or its one).
sd_code sd_nccl_group_new(sd_nccl_group **out, const sd_nccl_opts *o, sd_status *st);
// Local rank i (0-based among this process's) runs its collectives on `stream`, its model's.
sd_code sd_nccl_group_bind(sd_nccl_group *g, int i, cudaStream_t stream, sd_status *st);
// The transport of local rank i (for its sd_comm).
sd_comm_transport sd_nccl_transport(sd_nccl_group *g, int i);
// Ready for the next run (sd_tp_group's meet_restart); a broken group stays broken.
bool sd_nccl_group_restart(void *g, sd_status *why);
// Fault injection (--tp-stop): rank `rank` stops answering at its collective #seq.
void sd_nccl_group_stop_at(sd_nccl_group *g, int rank, uint64_t seq);
// Releases every communicator (sd_tp_group's meet_free).
void sd_nccl_group_free(void *g);
