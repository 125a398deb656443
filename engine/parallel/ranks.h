// ranks.h — a tensor-parallel group at work: every rank runs the same program on its own model
// at once, one host thread per rank, the threads meeting only in the collectives their models'
// forwards issue. On the CPU the group is emulated (sd_tp_group: the shards of one host model,
// each with its sd_comm over the host transport); a process driving several devices runs its
// device models through the same runner, one thread per device (docs/PARALLEL.md).
#pragma once
#include <stdbool.h>
#include <stdint.h>
#include "comm.h"  // sd_comm
#include "model.h" // sd_model
#include "plan.h"  // sd_tp_plan

// A rank's program: what one rank runs on `model` (its shard, model->comm set), e.g. a whole
// generation. Every rank's program must issue the same forwards in the same order. `rank` is the
// index of the model among those the runner was given (the group rank itself is model->comm->rank;
// they differ only in a process that runs one rank of several processes').
typedef sd_code (*sd_tp_rank_fn)(void *ctx, int rank, const sd_model *model, sd_status *st);

// Run fn on models[0..ranks) at once, rank r on its own thread; each rank's result in rank_st[r]
// (may be NULL). Every rank's end is reported to its comm's transport (leave), so ranks waiting
// on a failed one fail at once. Returns SD_OK when every rank did; else the first failure in
// time, which for a broken group is the message naming the rank that stopped answering. After a
// failure the other threads get grace_s to come back; a thread that does not (a rank stuck
// outside any collective) is left behind and named, and *abandoned is set: the caller must then
// not free what the threads use (the process should exit).
sd_code sd_tp_run(int ranks, sd_model *const *models, sd_tp_rank_fn fn, void *ctx, double grace_s, sd_status *rank_st,
                  bool *abandoned, sd_status *st);

// The ranks of a group that this process runs, each with its model and comm, meeting in one
// transport. On the CPU (sd_tp_group_init) the group is emulated: every rank's shard of one host
// model, meeting in a host transport. A device group (engine/cuda/cuda_tp.h) fills the same
// struct with device models and its own transport, so both run through sd_tp_group_run.
typedef struct sd_tp_group {
    int ranks;        // the ranks this process runs: shards[0..ranks), comms[0..ranks)
    int first_rank;   // the group rank of shards[0] (0 unless one process runs one rank of several)
    sd_tp_plan plan;  // of the whole group (plan.ranks ranks)
    sd_model *shards; // shards[i]: group rank first_rank + i, with .comm = &comms[i]
    sd_comm *comms;
    sd_model *drafts; // a device group's replicated draft, one per local rank on its device, or NULL
    // Where the ranks meet (the host transport, or a device group's), readied before each run
    // and released with the group.
    void *meet;
    bool (*meet_restart)(void *meet, sd_status *why);
    void (*meet_free)(void *meet);
    double timeout_s;
    bool abandoned; // a run left a thread behind: free keeps the memory it may touch
} sd_tp_group;

// The draft local rank i runs: its own replica on a device group, else the shared `draft`.
const sd_model *sd_tp_group_draft(const sd_tp_group *g, int i, const sd_model *draft);

typedef struct {
    int ranks;           // 1..SD_TP_MAX_RANKS
    double timeout_s;    // every collective's timeout; <= 0: SD_TP_TIMEOUT_DEFAULT_S
    int canary_rank;     // with canary_layer >= 0: that rank's shard gets sd_tp_shard_canary
    int canary_layer;    // < 0: no canary
    int stop_rank;       // with stop_at > 0: that rank stops answering at its collective #stop_at
    uint64_t stop_at;    //   (sd_host_comm_stop_at; the watchdog's test)
} sd_tp_group_opts;

// The plan, the shards and the comms of `full` (a host model) under o.
sd_code sd_tp_group_init(sd_tp_group *g, const sd_model *full, const sd_tp_group_opts *o, sd_status *st);
void sd_tp_group_free(sd_tp_group *g);

// sd_tp_run over the group's shards, with a grace of one timeout. Each run counts its
// collectives from 1; a group that broke fails every later run with the message of its break.
sd_code sd_tp_group_run(sd_tp_group *g, sd_tp_rank_fn fn, void *ctx, sd_status *rank_st, sd_status *st);
