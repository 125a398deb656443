// events.c — the event pool of the trace's event mode (events.h).
#include "events.h"
#include <stdlib.h>
#include <string.h>
#include "check.h"        // SD_CUDA_CHECK
#include "cuda_backend.h" // sd_cuda_backend_of

static void *record(void *ctx) {
    sd_cuda_event_pool *p = ctx;
    if (p->used == p->n) return NULL; // the trace counts the pair as lost
    cudaEvent_t e = p->ev[p->used++];
    // Inside a stream capture the record becomes an event record node of the graph (External),
    // recorded again by every replay; outside, a plain record.
    enum cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(p->stream, &cs) != cudaSuccess) return NULL;
    const unsigned flags = cs == cudaStreamCaptureStatusActive ? cudaEventRecordExternal : cudaEventRecordDefault;
    return cudaEventRecordWithFlags(e, p->stream, flags) == cudaSuccess ? (void *)e : NULL;
}

static double elapsed_ms(void *ctx, void *a, void *b) {
    (void)ctx;
    float ms = 0.0f;
    return cudaEventElapsedTime(&ms, (cudaEvent_t)a, (cudaEvent_t)b) == cudaSuccess ? ms : 0.0;
}

static void release_all(void *ctx) { ((sd_cuda_event_pool *)ctx)->used = 0; }

sd_code sd_cuda_events_init(sd_cuda_event_pool *p, const sd_model *m, int n, sd_status *st) {
    memset(p, 0, sizeof *p);
    const sd_cuda_backend *b = sd_cuda_backend_of(m);
    if (!b) return sd_fail(st, SD_ERR_USAGE, "event pool: not a CUDA model");
    p->device = b->device;
    p->stream = b->stream;
    p->ev = calloc((size_t)n, sizeof *p->ev);
    if (!p->ev) return sd_fail(st, SD_ERR_SYS, "event pool: out of memory");
    SD_CUDA_CHECK(st, cudaSetDevice(b->device));
    for (; p->n < n; p->n++) SD_CUDA_CHECK(st, cudaEventCreate(&p->ev[p->n]));
    p->hooks = (trace_events){.record = record, .elapsed_ms = elapsed_ms, .release_all = release_all, .ctx = p};
    return SD_OK;
}

void sd_cuda_events_free(sd_cuda_event_pool *p) {
    for (int i = 0; i < p->n; i++) cudaEventDestroy(p->ev[i]);
    free(p->ev);
    memset(p, 0, sizeof *p);
}
