// accept_device.c — sd_backend.accept of the CUDA backend: step 3 of a sampled round where p and
// q already are (device memory of this model's device). The drafts (and greedy argmaxes) go up
// through pinned staging, kernels/acceptance.cu writes (n, bonus) into device memory, and two
// ints come back; the op ends drained, so its results are valid on return.
//
// q comes from the draft model, whose forwards run on its own stream and drain before they
// return: by the time a round accepts, q is complete, and only this model's stream is ordered.
#include <string.h>
#include "acceptance.h"    // sd_cuda_accept
#include "check.h"         // SD_CUDA_CHECK
#include "cuda_internal.h" // sd_cuda_accept_op, sd_cuda_check_device_ptr, SD_CUDA_ACCEPT_INTS


// Offsets into the accept ints (device and pinned alike).
enum { AT_DRAFTS = 0, AT_TOP = SD_ACCEPT_MAX_K, AT_OUT = 2 * SD_ACCEPT_MAX_K + 1 };

// Allocated once, at the first accept of the model (freed with the backend).
static sd_code ensure_accept_buffers(sd_cuda_backend *b, sd_status *st) {
    if (b->accept_ints && b->accept_ints_host) return SD_OK;
    cudaFree(b->accept_ints); // a failed first try may have left one of the two
    cudaFreeHost(b->accept_ints_host);
    b->accept_ints = b->accept_ints_host = NULL;
    SD_CUDA_CHECK(st, cudaMallocHost((void **)&b->accept_ints_host, SD_CUDA_ACCEPT_INTS * sizeof(int)));
    SD_CUDA_CHECK(st, cudaMalloc((void **)&b->accept_ints, SD_CUDA_ACCEPT_INTS * sizeof(int)));
    return SD_OK;
}

sd_code sd_cuda_accept_op(const sd_model *m, const sd_accept_args *a, int *n, int *bonus, sd_status *st) {
    sd_cuda_backend *b = sd_cuda_backend_of(m);
    if (!b) return sd_fail(st, SD_ERR_USAGE, "cuda accept: not a CUDA model");
    if (a->k < 1 || a->k > SD_ACCEPT_MAX_K)
        return sd_fail(st, SD_ERR_USAGE, "cuda accept: k must be in 1..%d, got %d", SD_ACCEPT_MAX_K, a->k);
    SD_CUDA_CHECK(st, cudaSetDevice(b->device));
    if (!a->top) {
        SD_TRY(sd_cuda_check_device_ptr(b, a->p, "accept: p", st));
        SD_TRY(sd_cuda_check_device_ptr(b, a->q, "accept: q (the draft's distributions)", st));
        SD_TRY(sd_cuda_check_device_ptr(b, a->work, "accept: work", st));
    }
    SD_TRY(ensure_accept_buffers(b, st));
    cudaStream_t q = b->stream;
    // The staging may still feed a copy of an op that failed half way (a successful one drains).
    SD_CUDA_CHECK(st, cudaStreamSynchronize(q));
    int *h = b->accept_ints_host, *d = b->accept_ints;
    memcpy(h + AT_DRAFTS, a->drafts, sizeof(int) * (size_t)a->k);
    if (a->top) memcpy(h + AT_TOP, a->top, sizeof(int) * (size_t)(a->k + 1));
    SD_CUDA_CHECK(st, cudaMemcpyAsync(d, h, sizeof(int) * AT_OUT, cudaMemcpyHostToDevice, q));
    SD_TRY(sd_cuda_accept(d + AT_DRAFTS, a->k, a->top ? d + AT_TOP : NULL, a->p, a->q, a->work, a->V, a->seed,
                          sd_draw_fixed(a->round, a->pos_x), d + AT_OUT, q, st));
    SD_CUDA_CHECK(st, cudaMemcpyAsync(h + AT_OUT, d + AT_OUT, 2 * sizeof(int), cudaMemcpyDeviceToHost, q));
    SD_CUDA_CHECK(st, cudaStreamSynchronize(q));
    *n = h[AT_OUT];
    *bonus = h[AT_OUT + 1];
    return SD_OK;
}
