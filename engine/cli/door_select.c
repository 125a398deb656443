// door_select.c — see door_select.h.
#include "door_select.h"
#include <stdlib.h>
#ifdef SPECDEC_HAVE_CUDA
#include "cuda_door.h" // sd_cuda_door_*, sd_cuda_ledger_device
#include "events.h"    // sd_cuda_event_pool
#endif

// Level-2 trace inside graphs: two events per bucket per verify graph, kept for the door's life.
#define DOOR_EVENTS 256

struct sd_cli_door {
#ifdef SPECDEC_HAVE_CUDA
    sd_cuda_door *door;
    sd_cuda_event_pool events;
#endif
    sd_round_runner runner;
};

#ifdef SPECDEC_HAVE_CUDA
static sd_code run_round(void *ctx, int x, uint32_t round, int *emit, int *n, sd_status *st) {
    return sd_cuda_door_round(((sd_cli_door *)ctx)->door, x, round, emit, n, st);
}

static sd_code run_step(void *ctx, int tok, int *next, sd_status *st) {
    return sd_cuda_door_step(((sd_cli_door *)ctx)->door, tok, next, st);
}
#endif

sd_code sd_cli_door_check_backend(sd_cli_backend be, sd_status *st) {
#ifndef SPECDEC_HAVE_CUDA
    (void)be;
    return sd_fail(st, SD_ERR_USAGE, "--graph: not available in this build (no CUDA toolkit at build time)");
#else
    if (be != SD_CLI_BACKEND_CUDA)
        return sd_fail(st, SD_ERR_USAGE, "--graph: the decode-graph door replays CUDA graphs; it needs --backend cuda "
                                         "and a GPU (the backend is %s)", sd_cli_backend_name(be));
    return SD_OK;
#endif
}

sd_code sd_cli_door_open(sd_cli_backend be, const sd_model *target, sd_state *ts, const sd_model *draft, sd_state *ds,
                         const sd_cli_door_opts *o, sd_cli_door **door, sd_status *st) {
    *door = NULL;
    SD_TRY(sd_cli_door_check_backend(be, st));
#ifdef SPECDEC_HAVE_CUDA
    sd_cli_door *d = calloc(1, sizeof *d);
    if (!d) return sd_fail(st, SD_ERR_SYS, "out of memory");
    sd_code rc = SD_OK;
    if (o->trace && o->trace->level >= 2 && !(rc = sd_cuda_events_init(&d->events, target, DOOR_EVENTS, st)))
        trace_burst_use_events(o->trace, &d->events.hooks);
    const sd_cuda_door_opts co = {.k = o->k, .temperature = o->temperature, .seed = o->seed, .trace = o->trace,
                                  .ledger = o->ledger, .after_target = o->after_target, .ctx = o->ctx};
    if (!rc) rc = sd_cuda_door_open(target, ts, draft, ds, &co, &d->door, st);
    if (rc) {
        sd_cli_door_close(d);
        return rc;
    }
    d->runner = (sd_round_runner){.round = run_round, .step = run_step, .ctx = d};
    *door = d;
    return SD_OK;
#else
    (void)target, (void)ts, (void)draft, (void)ds, (void)o;
    return SD_OK; // not reached: the check refused
#endif
}

const sd_round_runner *sd_cli_door_runner(sd_cli_door *door) { return &door->runner; }

void sd_cli_door_close(sd_cli_door *door) {
    if (!door) return;
#ifdef SPECDEC_HAVE_CUDA
    sd_cuda_door_close(door->door);
    if (door->events.ev) sd_cuda_events_free(&door->events);
#endif
    free(door);
}

void sd_cli_moe_eager(const sd_model *m, bool eager) {
#ifdef SPECDEC_HAVE_CUDA
    sd_cuda_backend *b = sd_cuda_backend_of(m);
    if (b) b->moe_arm = eager ? SD_CUDA_MOE_EAGER : SD_CUDA_MOE_DEVICE_TABLE;
#else
    (void)m, (void)eager;
#endif
}

const ledger_device *sd_cli_ledger_device(const sd_model *m) {
#ifdef SPECDEC_HAVE_CUDA
    if (sd_cuda_backend_of(m)) return sd_cuda_ledger_device();
#endif
    (void)m;
    return ledger_host_device();
}

int sd_cli_device_ordinal(const sd_model *m) {
#ifdef SPECDEC_HAVE_CUDA
    const sd_cuda_backend *b = sd_cuda_backend_of(m);
    if (b) return b->device;
#endif
    (void)m;
    return 0;
}

int sd_cli_device_count(void) {
#ifdef SPECDEC_HAVE_CUDA
    return sd_cuda_device_count();
#else
    return 0;
#endif
}
