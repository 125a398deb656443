// tp_group.c — a group of device ranks (cuda_tp.h): shards made and placed, the NCCL group, the
// comms, the replicated draft.
#include "cuda_tp.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "cuda_backend.h"   // sd_cuda_model_upload_on, sd_cuda_backend_of, sd_cuda_device_count
#include "cuda_synth.h"     // sd_cuda_model_synth_shard
#include "nccl_comm.h"      // sd_nccl_*
#include "parallel/shard.h" // sd_tp_shard_model, sd_tp_shard_canary
#include "parallel/watchdog.h" // SD_TP_TIMEOUT_DEFAULT_S

int sd_cuda_tp_device(const sd_cuda_tp_opts *o, int rank, sd_status *st) {
    const int n = sd_cuda_device_count();
    if (o->rank >= 0 && n >= 1) return rank % n;
    if (o->rank < 0 && o->ranks <= n) return rank;
    if (o->rank >= 0) sd_fail(st, SD_ERR_UNSUPPORTED, "tp: rank %d: no CUDA device visible", rank);
    else sd_fail(st, SD_ERR_UNSUPPORTED,
                 "tp: %d ranks in one process need %d CUDA devices, %d visible (NCCL takes one device a rank; one process "
                 "per GPU: --rank R --nccl-id FILE)", o->ranks, o->ranks, n);
    return -1;
}

// How a local rank's shard comes to its device.
typedef sd_code (*make_shard)(void *ctx, const sd_tp_plan *p, int rank, int device, sd_model *dev, sd_status *st);

typedef struct {
    const sd_model *full;
    const sd_cuda_tp_opts *o;
} upload_src;

static sd_code upload_shard(void *ctx, const sd_tp_plan *p, int rank, int device, sd_model *dev, sd_status *st) {
    const upload_src *u = ctx;
    sd_model host;
    sd_code rc = sd_tp_shard_model(u->full, p, rank, &host, st);
    if (!rc && u->o->canary_layer >= 0 && rank == u->o->canary_rank) rc = sd_tp_shard_canary(&host, u->o->canary_layer, st);
    if (!rc) rc = sd_cuda_model_upload_on(&host, device, dev, st);
    if (host.w.arena) sd_model_free(&host);
    return rc;
}

typedef struct {
    const sd_config *cfg;
    const sd_synth_opts *so;
} synth_src;

static sd_code synth_shard(void *ctx, const sd_tp_plan *p, int rank, int device, sd_model *dev, sd_status *st) {
    const synth_src *s = ctx;
    return sd_cuda_model_synth_shard(s->cfg, s->so, p, rank, device, dev, st);
}

static sd_code build(sd_tp_group *g, const sd_config *cfg, const sd_model *draft, const sd_cuda_tp_opts *o, make_shard make,
                     void *ctx, sd_status *st) {
    SD_TRY(sd_tp_plan_make(cfg, o->ranks, &g->plan, st));
    if (o->rank >= o->ranks) return sd_fail(st, SD_ERR_USAGE, "--rank %d is not one of the %d ranks", o->rank, o->ranks);
    if (o->canary_layer >= 0 && (o->canary_rank < 0 || o->canary_rank >= o->ranks))
        return sd_fail(st, SD_ERR_USAGE, "tp: canary rank %d is not one of the %d ranks", o->canary_rank, o->ranks);
    if (o->stop_at > 0 && (o->stop_rank < 0 || o->stop_rank >= o->ranks))
        return sd_fail(st, SD_ERR_USAGE, "tp: stopped rank %d is not one of the %d ranks", o->stop_rank, o->ranks);
    if (!sd_nccl_available()) return sd_fail(st, SD_ERR_UNSUPPORTED, "--tp with --backend cuda: this build has no NCCL");
    g->first_rank = o->rank < 0 ? 0 : o->rank;
    g->ranks = o->rank < 0 ? o->ranks : 1;
    g->timeout_s = o->timeout_s > 0 ? o->timeout_s : SD_TP_TIMEOUT_DEFAULT_S;
    int devices[SD_TP_MAX_RANKS];
    for (int i = 0; i < g->ranks; i++)
        if ((devices[i] = sd_cuda_tp_device(o, g->first_rank + i, st)) < 0) return st->code;
    g->shards = calloc((size_t)g->ranks, sizeof *g->shards);
    g->comms = calloc((size_t)g->ranks, sizeof *g->comms);
    g->drafts = draft ? calloc((size_t)g->ranks, sizeof *g->drafts) : NULL;
    if (!g->shards || !g->comms || (draft && !g->drafts)) return sd_fail(st, SD_ERR_SYS, "tp: out of memory for %d ranks", g->ranks);
    for (int i = 0; i < g->ranks; i++) {
        SD_TRY(make(ctx, &g->plan, g->first_rank + i, devices[i], &g->shards[i], st));
        if (draft) SD_TRY(sd_cuda_model_upload_on(draft, devices[i], &g->drafts[i], st));
    }
    const sd_nccl_opts no = {.ranks = o->ranks, .rank = o->rank, .devices = devices, .id_file = o->nccl_id,
                             .timeout_s = g->timeout_s};
    sd_nccl_group *ng = NULL;
    SD_TRY(sd_nccl_group_new(&ng, &no, st));
    g->meet = ng;
    g->meet_restart = sd_nccl_group_restart;
    g->meet_free = sd_nccl_group_free;
    if (o->stop_at > 0) sd_nccl_group_stop_at(ng, o->stop_rank, o->stop_at);
    for (int i = 0; i < g->ranks; i++) {
        // The rank's collectives run on its model's stream (which never changes: the door moves
        // the draft onto the target's, not the reverse).
        SD_TRY(sd_nccl_group_bind(ng, i, sd_cuda_backend_of(&g->shards[i])->stream, st));
        sd_comm_init(&g->comms[i], g->first_rank + i, &g->plan, sd_nccl_transport(ng, i));
        g->shards[i].comm = &g->comms[i];
    }
    return SD_OK;
}

sd_code sd_cuda_tp_group_init(sd_tp_group *g, const sd_model *full, const sd_model *draft, const sd_cuda_tp_opts *o,
                              sd_status *st) {
    memset(g, 0, sizeof *g);
    if (full->backend || (draft && draft->backend))
        return sd_fail(st, SD_ERR_USAGE, "tp: the models of a device group start as host models (each rank gets its shard)");
    upload_src u = {.full = full, .o = o};
    const sd_code rc = build(g, &full->cfg, draft, o, upload_shard, &u, st);
    if (rc) sd_tp_group_free(g);
    return rc;
}

sd_code sd_cuda_tp_group_synth(sd_tp_group *g, const sd_config *cfg, const sd_synth_opts *so, const sd_cuda_tp_opts *o,
                               sd_status *st) {
    memset(g, 0, sizeof *g);
    if (o->canary_layer >= 0) return sd_fail(st, SD_ERR_USAGE, "tp: a synthesised device group has no canary");
    synth_src s = {.cfg = cfg, .so = so};
    const sd_code rc = build(g, cfg, NULL, o, synth_shard, &s, st);
    if (rc) sd_tp_group_free(g);
    return rc;
}

void sd_cuda_tp_devices(const sd_tp_group *g, char *buf, size_t len) {
    size_t at = 0;
    buf[0] = 0;
    for (int i = 0; i < g->ranks && at < len; i++) {
        const sd_cuda_backend *b = sd_cuda_backend_of(&g->shards[i]);
        at += (size_t)snprintf(buf + at, len - at, "%sr%d %s (device %d)", i ? ", " : "", g->first_rank + i,
                               b ? b->device_name : "?", b ? b->device : -1);
    }
}
