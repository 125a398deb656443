// events.h — a fixed pool of CUDA timing events on a device model's stream: the trace's event
// mode (trace.h trace_events) records them around the level-2 buckets without draining the
// device. Allocated before the burst, so recording allocates nothing.
#pragma once
#include <cuda_runtime_api.h>
#include "model.h" // sd_model
#include "trace.h" // trace_events

typedef struct {
    cudaEvent_t *ev;
    int n, used;
    int device;
    cudaStream_t stream;
    trace_events hooks; // record / elapsed_ms / release_all over this pool
} sd_cuda_event_pool;

// n events on the stream of device model m.
sd_code sd_cuda_events_init(sd_cuda_event_pool *p, const sd_model *m, int n, sd_status *st);
void sd_cuda_events_free(sd_cuda_event_pool *p);
