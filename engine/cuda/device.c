// device.c — device discovery and names, the stream sync and the pointer check of the CUDA
// backend: what needs a device and nothing else of the backend.
#include <stdio.h>
#include "check.h"         // SD_CUDA_CHECK
#include "cuda_internal.h" // sd_cuda_sync, sd_cuda_check_device_ptr

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

void sd_cuda_sync(void *ctx) {
    const sd_cuda_backend *b = ctx;
    cudaSetDevice(b->device);
    cudaStreamSynchronize(b->stream);
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
