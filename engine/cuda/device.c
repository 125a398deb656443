// device.c — device discovery, names, the state allocator, the stream sync and the pointer check
// of the CUDA backend.
#include <stdio.h>
#include "check.h"        // SD_CUDA_CHECK
#include "cuda_backend.h" // sd_cuda_backend
#include "cursor.h"       // sd_cuda_cursor_set
#include "cuda_internal.h"

int sd_cuda_device_count(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        (void)cudaGetLastError(); // no driver / no device: clear the error, report none
        return 0;
    }
    return n;
}

sd_code sd_cuda_device_name(int device, char *buf, size_t len, sd_status *st) {
    struct cudaDeviceProp p;
    SD_CUDA_CHECK(st, cudaGetDeviceProperties(&p, device));
    snprintf(buf, len, "%s", p.name);
    return SD_OK;
}

// The allocator of device states: ctx is the backend (its device and stream).
static void *dev_alloc(size_t bytes, void *ctx) {
    const sd_cuda_backend *b = ctx;
    void *p = NULL;
    if (cudaSetDevice(b->device) != cudaSuccess || cudaMalloc(&p, bytes) != cudaSuccess) {
        (void)cudaGetLastError();
        return NULL;
    }
    return p;
}

// cudaFree waits for the device's work on p and needs no current device (unified addressing),
// so a state may outlive its model.
static void dev_free(void *p, void *ctx) {
    (void)ctx;
    cudaFree(p);
}

// Ordered on the model's stream, then drained, so the zeroed state is visible to everything after.
static void dev_zero(void *p, size_t bytes, void *ctx) {
    const sd_cuda_backend *b = ctx;
    cudaSetDevice(b->device);
    cudaMemsetAsync(p, 0, bytes, b->stream);
    cudaStreamSynchronize(b->stream);
}

// Ordered before the next forward's kernels read the cursor: held (cursor_in_embed) for that
// forward's embedding launch to write — one launch fewer at each step boundary, where the device
// waits for the host — or a launch on the model's stream.
static bool dev_set_cursor(int *cursor, int len, int pending, void *ctx) {
    const sd_cuda_backend *b = ctx;
    if (b->cursor_in_embed) return true;
    sd_status st = {0};
    // A failure is reported here and again by the next forward's launch check.
    if (cudaSetDevice(b->device) != cudaSuccess || sd_cuda_cursor_set(cursor, len, pending, b->stream, &st) != SD_OK)
        fprintf(stderr, "specdec: cuda state cursor: %s\n", st.msg[0] ? st.msg : "cudaSetDevice failed");
    return false;
}

sd_code sd_cuda_cursor_sync(sd_cuda_backend *b, sd_state *s, sd_status *st) {
    if (!s->cursor_stale) return SD_OK;
    SD_CUDA_CHECK(st, cudaSetDevice(b->device));
    sd_code rc = sd_cuda_cursor_set(s->cursor, s->len, s->pending, b->stream, st);
    if (!rc) s->cursor_stale = false;
    return rc;
}

void sd_cuda_init_allocator(sd_cuda_backend *b) {
    b->mem = (sd_allocator){.alloc = dev_alloc, .free = dev_free, .zero = dev_zero, .set_cursor = dev_set_cursor, .ctx = b};
}

bool sd_cuda_state_is_ours(const sd_cuda_backend *b, const sd_state *s) {
    return s->mem && s->mem->alloc == dev_alloc && ((const sd_cuda_backend *)s->mem->ctx)->device == b->device;
}

void sd_cuda_sync(void *ctx) {
    const sd_cuda_backend *b = ctx;
    cudaSetDevice(b->device);
    cudaStreamSynchronize(b->stream);
}

sd_code sd_cuda_state_init(sd_state *s, const sd_model *dev, int capacity, int max_T, sd_status *st) {
    const sd_cuda_backend *b = sd_cuda_backend_of(dev);
    if (!b) return sd_fail(st, SD_ERR_USAGE, "cuda state: the model is not on a CUDA device");
    return sd_state_init_on(s, &dev->cfg, capacity, max_T, &b->mem, st);
}

sd_code sd_cuda_check_device_ptr(const sd_cuda_backend *b, const void *p, const char *what, sd_status *st) {
    if (!p) return sd_fail(st, SD_ERR_USAGE, "cuda %s is NULL", what);
    struct cudaPointerAttributes at;
    SD_CUDA_CHECK(st, cudaPointerGetAttributes(&at, p)); // host pointers: success, type unregistered
    if (at.type != cudaMemoryTypeDevice || at.device != b->device)
        return sd_fail(st, SD_ERR_USAGE, "cuda %s (%p) is not in device %d memory (the model's backend memory)", what, p,
                       b->device);
    return SD_OK;
}
