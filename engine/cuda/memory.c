// memory.c — where a device model's states live: the sd_allocator of engine/state.h over one CUDA
// device and the model's stream (cudaMalloc'd arenas, zeroed and cursor-written on the stream), with
// the GPU-only scratch (cuda_scratch.h) at each arena's end.
#include <stdio.h>
#include "cuda_internal.h" // sd_cuda_init_allocator, sd_cuda_state_is_ours
#include "cuda_scratch.h"  // sd_cuda_scratch_bytes
#include "cursor.h"        // sd_cuda_cursor_set

// ctx is the backend (its device and stream).
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

// A launch on the model's stream, so it orders before the next forward's kernels read the cursor.
// A failure is reported here and again by the next forward's launch check.
static void dev_set_cursor(int *cursor, int len, int pending, void *ctx) {
    const sd_cuda_backend *b = ctx;
    sd_status st = {0};
    if (cudaSetDevice(b->device) != cudaSuccess || sd_cuda_cursor_set(cursor, len, pending, b->stream, &st) != SD_OK)
        fprintf(stderr, "specdec: cuda state cursor: %s\n", st.msg[0] ? st.msg : "cudaSetDevice failed");
}

static size_t dev_scratch_bytes(const sd_config *cfg, int max_T, void *ctx) {
    (void)ctx;
    return sd_cuda_scratch_bytes(cfg, max_T);
}

void sd_cuda_init_allocator(sd_cuda_backend *b) {
    b->mem = (sd_allocator){.alloc = dev_alloc, .free = dev_free, .zero = dev_zero, .set_cursor = dev_set_cursor,
                            .scratch_bytes = dev_scratch_bytes, .ctx = b};
}

bool sd_cuda_state_is_ours(const sd_cuda_backend *b, const sd_state *s) {
    return s->mem && s->mem->alloc == dev_alloc && ((const sd_cuda_backend *)s->mem->ctx)->device == b->device;
}
