// cursor.cu — the three writes of a device state's {len, pending} (cursor.h): one thread each,
// on the stream, so they order with the kernels that read the cursor.
#include "cursor.h"
#include "common.cuh" // SD_NVTX, SD_LAUNCH_CHECK

static __global__ void cursor_set_kernel(int *cursor, int len, int pending) {
    cursor[0] = len;
    cursor[1] = pending;
}
static __global__ void cursor_advance_kernel(int *cursor, int T) {
    sd_pdl_enter();
    cursor[1] += T;
}
static __global__ void cursor_commit_kernel(int *cursor, const int *n, int plus) {
    cursor[0] += *n + plus;
    cursor[1] = 0;
}

extern "C" sd_code sd_cuda_cursor_set(int *cursor, int len, int pending, cudaStream_t stream, sd_status *st) {
    cursor_set_kernel<<<1, 1, 0, stream>>>(cursor, len, pending);
    SD_LAUNCH_CHECK(st);
    return SD_OK;
}

extern "C" sd_code sd_cuda_cursor_advance(int *cursor, int T, cudaStream_t stream, sd_status *st) {
    SD_CUDA_CHECK(st, sd_launch(cursor_advance_kernel, 1, 1, 0, stream, cursor, T));
    return SD_OK;
}

extern "C" sd_code sd_cuda_cursor_commit(int *cursor, const int *n, int plus, cudaStream_t stream, sd_status *st) {
    cursor_commit_kernel<<<1, 1, 0, stream>>>(cursor, n, plus);
    SD_LAUNCH_CHECK(st);
    return SD_OK;
}
