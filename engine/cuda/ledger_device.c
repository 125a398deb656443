// ledger_device.c — the selection ledger's slots in CUDA device memory (ledger.h's ledger_device):
// the record is a device-to-device copy on the forward's stream — a memcpy node at a fixed address
// inside a capture — and the sentinel fill, the canary and the drain are synchronous copies after
// the device is idle (the model streams are non-blocking: a plain cudaMemcpy would not wait for them).
#include "check.h"     // SD_CUDA_CHECK
#include "cuda_door.h" // sd_cuda_ledger_device

static void *d_alloc(int dev, size_t bytes, void *ctx) {
    (void)ctx;
    void *p = NULL;
    if (cudaSetDevice(dev) != cudaSuccess || cudaMalloc(&p, bytes) != cudaSuccess) {
        (void)cudaGetLastError();
        return NULL;
    }
    return p;
}

static void d_free(int dev, void *p, void *ctx) {
    (void)dev, (void)ctx;
    cudaFree(p);
}

static sd_code d_sync_copy(int dev, void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind, sd_status *st) {
    SD_CUDA_CHECK(st, cudaSetDevice(dev));
    SD_CUDA_CHECK(st, cudaDeviceSynchronize());
    SD_CUDA_CHECK(st, cudaMemcpy(dst, src, bytes, kind));
    return SD_OK;
}

static sd_code d_upload(int dev, void *dst, const void *src, size_t bytes, void *ctx, sd_status *st) {
    (void)ctx;
    return d_sync_copy(dev, dst, src, bytes, cudaMemcpyHostToDevice, st);
}

static sd_code d_download(int dev, void *dst, const void *src, size_t bytes, void *ctx, sd_status *st) {
    (void)ctx;
    return d_sync_copy(dev, dst, src, bytes, cudaMemcpyDeviceToHost, st);
}

static sd_code d_copy(int dev, void *dst, const void *src, size_t bytes, void *stream, void *ctx, sd_status *st) {
    (void)dev, (void)ctx;
    SD_CUDA_CHECK(st, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, (cudaStream_t)stream));
    return SD_OK;
}

const ledger_device *sd_cuda_ledger_device(void) {
    static const ledger_device d = {.alloc = d_alloc, .free = d_free, .upload = d_upload, .copy = d_copy,
                                    .download = d_download};
    return &d;
}
