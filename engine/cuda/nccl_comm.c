// nccl_comm.c — a device group's collectives over NCCL (nccl_comm.h).
#include "nccl_comm.h"
#include "file_open.h" // sd_fopen_regular
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "check.h"            // SD_CUDA_CHECK, SD_NCCL_CHECK
#include "parallel/monitor.h" // sd_tp_monitor

#if defined(SPECDEC_HAVE_NCCL) && SPECDEC_HAVE_NCCL

#define INIT_TIMEOUT_FACTOR 12 // the id file and the communicator's setup, in collective timeouts

typedef struct {
    struct sd_nccl_group *g;
    int rank, device;
    ncclComm_t comm;
    cudaStream_t stream;           // bound: the rank's model's
    cudaEvent_t ev[SD_TP_MONITOR_QUEUE]; // completion markers, in rotation (monitor.h)
    uint64_t n_ev;
    bool bound;
} nccl_rank;

struct sd_nccl_group {
    int ranks, first, n_local;
    double timeout_s;
    nccl_rank r[SD_TP_MAX_RANKS];
    sd_tp_monitor *mon;
    bool nonblocking; // one process per GPU: its communicator was made non-blocking
    bool aborted;
    char beat[4096]; // one process per GPU: the heartbeat files' prefix (the id file), else ""
    char last_beat[256];
};

bool sd_nccl_available(void) { return true; }

static void quiet_env(void) {
    setenv("NCCL_NVLS_ENABLE", "0", 0);
    setenv("NCCL_RUNTIME_CONNECT", "0", 0);
}

static double mono_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

// A non-blocking call's completion (ncclInProgress until then), at most until `deadline`.
static ncclResult_t settle(ncclComm_t c, ncclResult_t r, double deadline) {
    while (r == ncclInProgress) {
        if (mono_s() > deadline) return ncclInProgress;
        usleep(1000);
        if (ncclCommGetAsyncError(c, &r) != ncclSuccess) return ncclSystemError;
    }
    return r;
}

// ---------------------------------------------------------------------------- monitor hooks
static bool hook_done(void *ctx, int rank, void *mark) {
    struct sd_nccl_group *g = ctx;
    cudaSetDevice(g->r[rank - g->first].device);
    const cudaError_t e = cudaEventQuery((cudaEvent_t)mark);
    if (e == cudaErrorNotReady) return false;
    (void)cudaGetLastError(); // any other error is the rank's to report at its drain
    return true;
}

static bool hook_failed(void *ctx, int rank, sd_status *why) {
    struct sd_nccl_group *g = ctx;
    ncclResult_t r = ncclSuccess;
    if (ncclCommGetAsyncError(g->r[rank - g->first].comm, &r) != ncclSuccess || r == ncclSuccess || r == ncclInProgress)
        return false;
    sd_fail(why, SD_ERR_SYS, "tp: rank %d: NCCL error %d (%s)", rank, (int)r, ncclGetErrorString(r));
    return true;
}

static void hook_abort(void *ctx) {
    struct sd_nccl_group *g = ctx;
    g->aborted = true;
    for (int i = 0; i < g->n_local; i++) {
        cudaSetDevice(g->r[i].device);
        ncclCommAbort(g->r[i].comm); // pending kernels return; the handle is gone after this
    }
}

// One process per GPU: this process's entry of w as one line of its heartbeat file (written when
// it changes: a temporary name renamed), and the other ranks' files read into w.
static void hook_peers(void *ctx, sd_tp_watch *w) {
    struct sd_nccl_group *g = ctx;
    char path[4200], line[sizeof g->last_beat];
    const int me = g->first;
    snprintf(line, sizeof line, "%llu %d %d", (unsigned long long)w->reached[me], w->left[me] ? 1 : 0, w->broken ? 1 : 0);
    if (strcmp(line, g->last_beat)) {
        char tmp[4300];
        snprintf(path, sizeof path, "%s.r%d", g->beat, me);
        snprintf(tmp, sizeof tmp, "%s.tmp", path);
        FILE *f = fopen(tmp, "w");
        if (f) {
            const bool ok = fprintf(f, "%s\n%s\n", line, w->broken ? w->why.msg : "") > 0;
            if (fclose(f) == 0 && ok && rename(tmp, path) == 0) snprintf(g->last_beat, sizeof g->last_beat, "%s", line);
        }
    }
    for (int p = 0; p < g->ranks; p++) {
        if (p == me) continue;
        snprintf(path, sizeof path, "%s.r%d", g->beat, p);
        FILE *f = fopen(path, "r");
        if (!f) continue;
        unsigned long long reached = 0;
        int left = 0, broken = 0;
        char msg[sizeof w->why.msg] = "";
        if (fscanf(f, "%llu %d %d\n", &reached, &left, &broken) == 3) {
            if (!fgets(msg, sizeof msg, f)) msg[0] = 0;
            msg[strcspn(msg, "\n")] = 0;
            w->reached[p] = reached;
            w->left[p] = left != 0;
            if (broken && !w->broken) {
                sd_status why;
                sd_fail(&why, SD_ERR_SYS, "%s", msg[0] ? msg : "tp: another rank's process broke the group");
                sd_tp_watch_break(w, &why);
            }
        }
        fclose(f);
    }
}

// ---------------------------------------------------------------------------- transport
static sd_code fail_call(nccl_rank *r, uint64_t seq, const sd_comm_op *op, ncclResult_t e, sd_status *st) {
    char name[128];
    sd_status why;
    sd_comm_op_name(op, seq, name, sizeof name);
    if (e == ncclInProgress) sd_fail(&why, SD_ERR_SYS, "tp: rank %d: NCCL %s was not enqueued within %g s", r->rank, name, r->g->timeout_s);
    else sd_fail(&why, SD_ERR_SYS, "tp: rank %d: NCCL %s: error %d (%s)", r->rank, name, (int)e, ncclGetErrorString(e));
    sd_tp_monitor_break(r->g->mon, &why);
    sd_tp_monitor_enqueued(r->g->mon, r->rank, NULL, NULL);
    return sd_tp_monitor_check(r->g->mon, st);
}

// After collectives were enqueued on the rank's stream: their completion marker, or none while
// the stream is being captured (nothing runs).
static sd_code mark(nccl_rank *r, sd_status *st) {
    enum cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(r->stream, &cs) != cudaSuccess) cs = cudaStreamCaptureStatusNone;
    if (cs != cudaStreamCaptureStatusNone) return sd_tp_monitor_enqueued(r->g->mon, r->rank, NULL, st);
    cudaEvent_t ev = r->ev[r->n_ev++ % SD_TP_MONITOR_QUEUE];
    const cudaError_t e = cudaEventRecord(ev, r->stream);
    if (e != cudaSuccess) {
        sd_tp_monitor_enqueued(r->g->mon, r->rank, NULL, NULL);
        return sd_fail(st, SD_ERR_SYS, "tp: rank %d: cudaEventRecord: %s", r->rank, cudaGetErrorString(e));
    }
    return sd_tp_monitor_enqueued(r->g->mon, r->rank, ev, st);
}

static sd_code nccl_all_gather(void *ctx, int rank, uint64_t seq, const sd_comm_op *op, const void *send, size_t bytes,
                               void *recv, sd_status *st) {
    nccl_rank *r = ctx;
    (void)rank;
    if (!r->bound) return sd_fail(st, SD_ERR_USAGE, "tp: rank %d has no stream bound", r->rank);
    SD_TRY(sd_tp_monitor_enter(r->g->mon, r->rank, seq, op, 1, st));
    ncclResult_t e = ncclAllGather(send, recv, bytes, ncclChar, r->comm, r->stream);
    e = settle(r->comm, e, mono_s() + r->g->timeout_s);
    if (e != ncclSuccess) return fail_call(r, seq, op, e, st);
    return mark(r, st);
}

static sd_code nccl_replay(void *ctx, int rank, uint64_t first, const sd_comm_op *ops, int n,
                           sd_code (*launch)(void *launch_ctx, sd_status *st), void *launch_ctx, sd_status *st) {
    nccl_rank *r = ctx;
    (void)rank;
    SD_TRY(sd_tp_monitor_enter(r->g->mon, r->rank, first, ops, n, st));
    const sd_code rc = launch(launch_ctx, st);
    if (rc) {
        sd_tp_monitor_enqueued(r->g->mon, r->rank, NULL, NULL);
        return rc;
    }
    return mark(r, st);
}

static void nccl_leave(void *ctx, int rank, sd_code rc, const sd_status *st) {
    nccl_rank *r = ctx;
    (void)rank;
    sd_tp_monitor_leave(r->g->mon, r->rank, rc, st);
}

static sd_code nccl_check(void *ctx, int rank, sd_status *st) {
    (void)rank;
    return sd_tp_monitor_check(((nccl_rank *)ctx)->g->mon, st);
}

sd_comm_transport sd_nccl_transport(sd_nccl_group *g, int i) {
    return (sd_comm_transport){.all_gather = nccl_all_gather, .leave = nccl_leave, .check = nccl_check,
                               .replay = nccl_replay, .ctx = &g->r[i]};
}

// ---------------------------------------------------------------------------- setup
// One process per GPU: the unique id through the file (rank 0 writes it, the others wait for it).
static sd_code exchange_id(const sd_nccl_opts *o, ncclUniqueId *id, double deadline, sd_status *st) {
    if (o->rank == 0) {
        if (access(o->id_file, F_OK) == 0)
            return sd_fail(st, SD_ERR_USAGE, "--nccl-id %s already exists (an earlier run's id?): remove it or name a new file",
                           o->id_file);
        SD_NCCL_CHECK(st, ncclGetUniqueId(id));
        char tmp[4200];
        snprintf(tmp, sizeof tmp, "%s.tmp.%d", o->id_file, (int)getpid());
        FILE *f = fopen(tmp, "wb");
        const bool ok = f && fwrite(id, sizeof *id, 1, f) == 1;
        if (f && fclose(f) != 0) f = NULL;
        if (!ok || !f || rename(tmp, o->id_file) != 0) {
            unlink(tmp);
            return sd_fail(st, SD_ERR_SYS, "--nccl-id %s: cannot write it: %s", o->id_file, strerror(errno));
        }
        return SD_OK;
    }
    for (;;) {
        sd_status absent = {0}; // not there yet (or not a regular file): wait, within the deadline
        FILE *f = sd_fopen_regular(o->id_file, &absent);
        if (f) {
            const size_t got = fread(id, sizeof *id, 1, f);
            fclose(f);
            if (got == 1) return SD_OK;
        }
        if (mono_s() > deadline)
            return sd_fail(st, SD_ERR_SYS, "tp: rank %d: no NCCL id in %s within %g s (is rank 0 started with the same --nccl-id?)",
                           o->rank, o->id_file, INIT_TIMEOUT_FACTOR * o->timeout_s);
        usleep(50000);
    }
}

static sd_code init_comms(sd_nccl_group *g, const sd_nccl_opts *o, sd_status *st) {
    if (o->rank < 0) {
        ncclComm_t comms[SD_TP_MAX_RANKS];
        SD_NCCL_CHECK(st, ncclCommInitAll(comms, o->ranks, o->devices));
        for (int i = 0; i < o->ranks; i++) g->r[i].comm = comms[i];
        return SD_OK;
    }
    const double deadline = mono_s() + INIT_TIMEOUT_FACTOR * g->timeout_s;
    char beat[4200];
    snprintf(beat, sizeof beat, "%s.r%d", o->id_file, o->rank);
    unlink(beat); // an earlier run's, gone before this rank joins (so no peer reads it after init)
    ncclUniqueId id;
    SD_TRY(exchange_id(o, &id, deadline, st));
    SD_CUDA_CHECK(st, cudaSetDevice(o->devices[0]));
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    ncclComm_t c = NULL;
    ncclResult_t e = ncclCommInitRankConfig(&c, o->ranks, id, o->rank, &cfg);
    if (e == ncclSuccess || e == ncclInProgress) e = settle(c, ncclInProgress, deadline);
    if (e != ncclSuccess) {
        if (c) ncclCommAbort(c);
        if (e == ncclInProgress)
            return sd_fail(st, SD_ERR_SYS, "tp: rank %d: the group of %d did not form within %g s (are all %d processes started "
                           "with the same --nccl-id?)", o->rank, o->ranks, INIT_TIMEOUT_FACTOR * g->timeout_s, o->ranks);
        return sd_fail(st, SD_ERR_SYS, "tp: rank %d: ncclCommInitRankConfig: error %d (%s)", o->rank, (int)e, ncclGetErrorString(e));
    }
    g->r[0].comm = c;
    g->nonblocking = true;
    snprintf(g->beat, sizeof g->beat, "%s", o->id_file);
    return SD_OK;
}

sd_code sd_nccl_group_new(sd_nccl_group **out, const sd_nccl_opts *o, sd_status *st) {
    *out = NULL;
    if (o->ranks < 1 || o->ranks > SD_TP_MAX_RANKS || o->rank >= o->ranks)
        return sd_fail(st, SD_ERR_USAGE, "tp: rank %d of %d ranks", o->rank, o->ranks);
    if (o->rank >= 0 && !o->id_file) return sd_fail(st, SD_ERR_USAGE, "tp: one process per GPU needs --nccl-id FILE");
    quiet_env();
    sd_nccl_group *g = calloc(1, sizeof *g);
    if (!g) return sd_fail(st, SD_ERR_SYS, "tp: out of memory for the NCCL group");
    g->ranks = o->ranks;
    g->first = o->rank < 0 ? 0 : o->rank;
    g->n_local = o->rank < 0 ? o->ranks : 1;
    g->timeout_s = o->timeout_s > 0 ? o->timeout_s : SD_TP_TIMEOUT_DEFAULT_S;
    for (int i = 0; i < g->n_local; i++) g->r[i] = (nccl_rank){.g = g, .rank = g->first + i, .device = o->devices[i]};
    sd_code rc = init_comms(g, o, st);
    if (rc) {
        free(g);
        return rc;
    }
    const sd_tp_monitor_hooks h = {.done = hook_done, .failed = hook_failed, .abort = hook_abort,
                                   .peers = g->beat[0] ? hook_peers : NULL, .ctx = g};
    rc = sd_tp_monitor_new(&g->mon, g->ranks, g->first, g->n_local, g->timeout_s, &h, st);
    if (rc) {
        for (int i = 0; i < g->n_local; i++) ncclCommDestroy(g->r[i].comm);
        free(g);
        return rc;
    }
    *out = g;
    return SD_OK;
}

sd_code sd_nccl_group_bind(sd_nccl_group *g, int i, cudaStream_t stream, sd_status *st) {
    nccl_rank *r = &g->r[i];
    SD_CUDA_CHECK(st, cudaSetDevice(r->device));
    if (!r->bound)
        for (int k = 0; k < SD_TP_MONITOR_QUEUE; k++) SD_CUDA_CHECK(st, cudaEventCreateWithFlags(&r->ev[k], cudaEventDisableTiming));
    r->stream = stream;
    r->bound = true;
    return SD_OK;
}

bool sd_nccl_group_restart(void *group, sd_status *why) { return sd_tp_monitor_restart(((sd_nccl_group *)group)->mon, why); }

void sd_nccl_group_stop_at(sd_nccl_group *g, int rank, uint64_t seq) { sd_tp_monitor_stop_at(g->mon, rank, seq); }

void sd_nccl_group_free(void *group) {
    sd_nccl_group *g = group;
    if (!g) return;
    // The monitor first (a broken group's abort runs and is waited for, within bounds); then,
    // unless aborted, each communicator destroyed — a non-blocking one finalized first, its
    // completion waited for at most one timeout (else aborted).
    if (!sd_tp_monitor_free(g->mon)) return; // its thread is still inside ncclCommAbort: g is left to it
    for (int i = 0; i < g->n_local; i++) {
        nccl_rank *r = &g->r[i];
        cudaSetDevice(r->device);
        if (!g->aborted && g->nonblocking) {
            ncclResult_t e = ncclCommFinalize(r->comm);
            if (e == ncclSuccess || e == ncclInProgress) e = settle(r->comm, ncclInProgress, mono_s() + g->timeout_s);
            if (e == ncclSuccess) ncclCommDestroy(r->comm);
            else ncclCommAbort(r->comm);
        } else if (!g->aborted) {
            ncclCommDestroy(r->comm);
        }
        for (int k = 0; r->bound && k < SD_TP_MONITOR_QUEUE; k++) cudaEventDestroy(r->ev[k]);
    }
    free(g);
}

#else // no NCCL in this build: a device group is refused where it is made

bool sd_nccl_available(void) { return false; }

sd_code sd_nccl_group_new(sd_nccl_group **out, const sd_nccl_opts *o, sd_status *st) {
    (void)o;
    *out = NULL;
    return sd_fail(st, SD_ERR_UNSUPPORTED, "tp: this build has no NCCL (found at build time: cmake/FindNCCL.cmake)");
}
sd_code sd_nccl_group_bind(sd_nccl_group *g, int i, cudaStream_t stream, sd_status *st) {
    (void)g, (void)i, (void)stream;
    return sd_fail(st, SD_ERR_UNSUPPORTED, "tp: this build has no NCCL");
}
sd_comm_transport sd_nccl_transport(sd_nccl_group *g, int i) {
    (void)g, (void)i;
    return (sd_comm_transport){0};
}
bool sd_nccl_group_restart(void *g, sd_status *why) {
    (void)g;
    sd_fail(why, SD_ERR_UNSUPPORTED, "tp: this build has no NCCL");
    return false;
}
void sd_nccl_group_stop_at(sd_nccl_group *g, int rank, uint64_t seq) { (void)g, (void)rank, (void)seq; }
void sd_nccl_group_free(void *g) { (void)g; }

#endif
