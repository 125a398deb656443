// ktrace.c — the kernel timeline of a profiled region, from CUPTI's activity records: every
// kernel between cudaProfilerStart and cudaProfilerStop with its device start and end, so the
// overlap that programmatic dependent launch buys (a kernel starting before its predecessor
// ends) and the gaps between launches are seen as they ran, not as ncu replays each kernel
// alone. A CUDA injection library: no change to the program traced.
//
//   SD_KTRACE=trace.csv CUDA_INJECTION64_PATH=libsd_ktrace.so bench_gpu_e2e --config NAME --profile
//   scripts/ktrace-summary trace.csv
//
// CSV: kernel,start_ns,end_ns,grid,block,smem (start and end relative to the region's first
// kernel start), one row per kernel in start order.
#include <cupti.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define KT_BUF (8u << 20)

typedef struct {
    uint64_t start, end;
    char *name;
    unsigned grid[3], block[3], smem;
} kt_row;

static kt_row *rows;
static size_t n_rows, cap_rows, n_dropped; // dropped: records no memory was left for
static int tracing;
static CUpti_SubscriberHandle subscriber;

static void kt_fail(const char *what, CUptiResult r) {
    const char *msg = "?";
    cuptiGetResultString(r, &msg);
    fprintf(stderr, "ktrace: %s: %s\n", what, msg);
}

static void CUPTIAPI buffer_requested(uint8_t **buffer, size_t *size, size_t *max_records) {
    *buffer = aligned_alloc(8, KT_BUF);
    *size = *buffer ? KT_BUF : 0;
    *max_records = 0;
}

static void keep(const CUpti_ActivityKernel10 *k) {
    if (n_rows == cap_rows) {
        const size_t cap = cap_rows ? 2 * cap_rows : 4096;
        kt_row *r = realloc(rows, cap * sizeof *r);
        if (!r) {
            n_dropped++;
            return;
        }
        rows = r;
        cap_rows = cap;
    }
    rows[n_rows++] = (kt_row){.start = k->start, .end = k->end, .name = strdup(k->name ? k->name : "?"),
                              .grid = {(unsigned)k->gridX, (unsigned)k->gridY, (unsigned)k->gridZ},
                              .block = {(unsigned)k->blockX, (unsigned)k->blockY, (unsigned)k->blockZ},
                              .smem = (unsigned)(k->dynamicSharedMemory + k->staticSharedMemory)};
}

static void CUPTIAPI buffer_completed(CUcontext ctx, uint32_t stream, uint8_t *buffer, size_t size, size_t valid) {
    (void)ctx, (void)stream, (void)size;
    CUpti_Activity *rec = NULL;
    while (cuptiActivityGetNextRecord(buffer, valid, &rec) == CUPTI_SUCCESS)
        if (rec->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL || rec->kind == CUPTI_ACTIVITY_KIND_KERNEL)
            keep((const CUpti_ActivityKernel10 *)rec);
    free(buffer);
}

static int by_start(const void *a, const void *b) {
    const kt_row *x = a, *y = b;
    return x->start < y->start ? -1 : x->start > y->start;
}

static void write_csv(void) {
    const char *path = getenv("SD_KTRACE");
    FILE *f = path ? fopen(path, "w") : stdout;
    if (!f) {
        fprintf(stderr, "ktrace: cannot write %s\n", path);
        return;
    }
    qsort(rows, n_rows, sizeof *rows, by_start);
    const uint64_t t0 = n_rows ? rows[0].start : 0;
    fprintf(f, "kernel,start_ns,end_ns,grid,block,smem\n");
    for (size_t i = 0; i < n_rows; i++) {
        const kt_row *r = &rows[i];
        fprintf(f, "\"%s\",%llu,%llu,%ux%ux%u,%ux%ux%u,%u\n", r->name, (unsigned long long)(r->start - t0),
                (unsigned long long)(r->end - t0), r->grid[0], r->grid[1], r->grid[2], r->block[0], r->block[1],
                r->block[2], r->smem);
    }
    if (f != stdout) fclose(f);
    fprintf(stderr, "ktrace: %zu kernels%s%s\n", n_rows, path ? " -> " : "", path ? path : "");
    if (n_dropped) fprintf(stderr, "ktrace: %zu kernel records dropped (out of memory): the CSV is incomplete\n", n_dropped);
}

// cudaProfilerStart turns the kernel records on, cudaProfilerStop flushes them and writes the CSV.
static void CUPTIAPI on_api(void *ud, CUpti_CallbackDomain dom, CUpti_CallbackId id, const void *data) {
    (void)ud, (void)dom;
    const CUpti_CallbackData *cb = data;
    if (id == CUPTI_RUNTIME_TRACE_CBID_cudaProfilerStart_v4000 && cb->callbackSite == CUPTI_API_EXIT && !tracing) {
        CUptiResult r = cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
        if (r != CUPTI_SUCCESS) kt_fail("enabling kernel records", r);
        tracing = 1;
    } else if (id == CUPTI_RUNTIME_TRACE_CBID_cudaProfilerStop_v4000 && cb->callbackSite == CUPTI_API_ENTER && tracing) {
        cuptiActivityFlushAll(1);
        cuptiActivityDisable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
        cuptiActivityFlushAll(1);
        tracing = 0;
        write_csv();
    }
}

int InitializeInjection(void) {
    CUptiResult r = cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed);
    if (r == CUPTI_SUCCESS) r = cuptiSubscribe(&subscriber, (CUpti_CallbackFunc)on_api, NULL);
    if (r == CUPTI_SUCCESS)
        r = cuptiEnableCallback(1, subscriber, CUPTI_CB_DOMAIN_RUNTIME_API, CUPTI_RUNTIME_TRACE_CBID_cudaProfilerStart_v4000);
    if (r == CUPTI_SUCCESS)
        r = cuptiEnableCallback(1, subscriber, CUPTI_CB_DOMAIN_RUNTIME_API, CUPTI_RUNTIME_TRACE_CBID_cudaProfilerStop_v4000);
    if (r != CUPTI_SUCCESS) {
        kt_fail("setting up", r);
        return 0;
    }
    return 1;
}
