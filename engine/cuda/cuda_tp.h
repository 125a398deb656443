// cuda_tp.h — a tensor-parallel group of device ranks (docs/PARALLEL.md): the plan of the whole
// model, each rank's shard as a device model on its own GPU (the walk's all-reduces and the head's
// gathers then run through its comm), the NCCL transport with its watchdog (nccl_comm.h), and the
// draft replicated on every rank's device. The result is an sd_tp_group (parallel/ranks.h), run
// with sd_tp_group_run exactly as the CPU's emulated ranks are: one host thread per device.
//
// Where each rank runs: one process for the whole group puts rank r on device r (N devices
// needed: NCCL refuses two ranks on one device); one process per GPU (rank >= 0) runs that rank
// alone on device rank % (the devices it sees), so CUDA_VISIBLE_DEVICES can pick it.
#pragma once
#include "parallel/ranks.h" // sd_tp_group
#include "synth.h"          // sd_synth_opts

typedef struct {
    int ranks;           // N, the whole group: 1..SD_TP_MAX_RANKS
    int rank;            // -1: every rank in this process; else this process's one rank
    const char *nccl_id; // with rank >= 0: the file the NCCL unique id passes through
    double timeout_s;    // every collective's timeout (<= 0: the default)
    int stop_rank;       // with stop_at > 0: that rank stops answering at its collective #stop_at
    uint64_t stop_at;
    int canary_rank;     // with canary_layer >= 0: that rank's shard gets sd_tp_shard_canary
    int canary_layer;
} sd_cuda_tp_opts;

// The device a rank runs on (-1 with an error when the machine cannot hold it).
int sd_cuda_tp_device(const sd_cuda_tp_opts *o, int rank, sd_status *st);

// The group of host model `full` (and `draft`, replicated; NULL: none): each local rank's shard
// cut on the host (one at a time), uploaded to its device and freed. full and draft stay the
// caller's.
sd_code sd_cuda_tp_group_init(sd_tp_group *g, const sd_model *full, const sd_model *draft, const sd_cuda_tp_opts *o,
                              sd_status *st);

// The group of sd_synth_model(cfg, so) with every rank's shard synthesised on its device
// (cuda_synth.h: bit for bit the host shard), no host copy of the weights: a model as large as
// all the devices together. No draft, no canary.
sd_code sd_cuda_tp_group_synth(sd_tp_group *g, const sd_config *cfg, const sd_synth_opts *so, const sd_cuda_tp_opts *o,
                               sd_status *st);

// "r0 NVIDIA H200 (device 0), r1 ..." for the group's local ranks.
void sd_cuda_tp_devices(const sd_tp_group *g, char *buf, size_t len);
