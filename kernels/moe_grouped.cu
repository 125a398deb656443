// moe_grouped.cu — the grouped expert GEMMs of moe_grouped.h: the host side of one
// cublasGemmGroupedBatchedEx call an op (no kernels of its own). Every problem is its own group
// (group size 1): the problems differ in their row counts.
#include <cublas_v2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "common.cuh" // SD_NVTX, sd_aligned16
#include "moe_grouped.h"

#define GROUPED_WORKSPACE (32u << 20) // the cuBLAS workspace: what its Hopper kernels ask for at most

enum { SIZE_M, SIZE_N, SIZE_K, SIZE_LDA, SIZE_LDB, SIZE_LDC, SIZE_GROUP, N_SIZES }; // the int arrays of one op
enum { PTR_A, PTR_B, PTR_C, N_PTRS };                                              // the pointer arrays of one op

struct sd_moe_grouped {
    cublasHandle_t h;
    void *workspace;              // GROUPED_WORKSPACE bytes of device memory
    cudaStream_t stream;          // the handle's stream once bound
    bool bound;
    cudaEvent_t done;             // recorded after the pointers' copy and after each call
    int cap;                      // problems an op: 2·E ([gate | up] as two when not stacked)
    int groups[2];                // the planned problems of each op
    int *sizes;                   // host: [op][N_SIZES][cap]
    cublasOperation_t *ta, *tb;   // host (cap): every A transposed (W stored [N, K]), every B as stored
    float *alpha, *beta;          // host (cap): 1, 0
    const void **ptr_host;        // pinned: [op][N_PTRS][cap]
    const void **ptr_dev;         // the device copy cuBLAS reads
};

static sd_code blas_fail(sd_status *st, const char *call, cublasStatus_t rc) {
    return sd_fail(st, SD_ERR_SYS, "cuda moe grouped: %s: %s (cublasStatus_t %d)", call, cublasGetStatusString(rc), (int)rc);
}

static int *sizes_of(const sd_moe_grouped *g, int op, int which) { return g->sizes + ((size_t)op * N_SIZES + which) * g->cap; }
static const void **ptrs_of(const void **base, const sd_moe_grouped *g, int op, int which) {
    return base + ((size_t)op * N_PTRS + which) * g->cap;
}
static size_t ptr_bytes(const sd_moe_grouped *g) { return sizeof(void *) * 2 * N_PTRS * (size_t)g->cap; }

extern "C" void sd_moe_grouped_free(sd_moe_grouped *g) {
    if (!g) return;
    if (g->done) {
        cudaEventSynchronize(g->done); // the last copy may still read the pinned pointers
        cudaEventDestroy(g->done);
    }
    if (g->h) cublasDestroy(g->h);
    cudaFree(g->workspace);
    cudaFree(g->ptr_dev);
    cudaFreeHost(g->ptr_host);
    free(g->sizes);
    free(g->ta);
    free(g->tb);
    free(g->alpha);
    free(g->beta);
    free(g);
}

extern "C" sd_code sd_cuda_moe_grouped_create(sd_moe_grouped **out, int E, sd_status *st) {
    *out = NULL;
    if (E < 1 || E > (1 << 20)) return sd_fail(st, SD_ERR_USAGE, "cuda moe grouped: %d experts (1 .. 2^20)", E);
    sd_moe_grouped *g = (sd_moe_grouped *)calloc(1, sizeof *g);
    if (!g) return sd_fail(st, SD_ERR_SYS, "cuda moe grouped: out of memory");
    const int cap = g->cap = 2 * E;
    g->sizes = (int *)malloc(sizeof(int) * 2 * N_SIZES * (size_t)cap);
    g->ta = (cublasOperation_t *)malloc(sizeof *g->ta * (size_t)cap);
    g->tb = (cublasOperation_t *)malloc(sizeof *g->tb * (size_t)cap);
    g->alpha = (float *)malloc(sizeof(float) * (size_t)cap);
    g->beta = (float *)malloc(sizeof(float) * (size_t)cap);
    sd_code rc = g->sizes && g->ta && g->tb && g->alpha && g->beta
                     ? SD_OK
                     : sd_fail(st, SD_ERR_SYS, "cuda moe grouped: out of memory for %d problems", cap);
    for (int i = 0; !rc && i < cap; i++) {
        g->ta[i] = CUBLAS_OP_T;
        g->tb[i] = CUBLAS_OP_N;
        g->alpha[i] = 1.0f;
        g->beta[i] = 0.0f;
    }
    if (!rc && cudaMallocHost((void **)&g->ptr_host, ptr_bytes(g)) != cudaSuccess)
        rc = sd_fail(st, SD_ERR_SYS, "cuda moe grouped: cannot allocate %zu bytes of pinned pointers", ptr_bytes(g));
    if (!rc && cudaMalloc((void **)&g->ptr_dev, ptr_bytes(g)) != cudaSuccess)
        rc = sd_fail(st, SD_ERR_SYS, "cuda moe grouped: cannot allocate %zu bytes of device pointers", ptr_bytes(g));
    if (!rc && cudaMalloc(&g->workspace, GROUPED_WORKSPACE) != cudaSuccess)
        rc = sd_fail(st, SD_ERR_SYS, "cuda moe grouped: cannot allocate the %u-byte cuBLAS workspace", GROUPED_WORKSPACE);
    if (!rc && cudaEventCreateWithFlags(&g->done, cudaEventDisableTiming) != cudaSuccess)
        rc = sd_fail(st, SD_ERR_SYS, "cuda moe grouped: cannot create its event");
    if (!rc) {
        const cublasStatus_t cs = cublasCreate(&g->h);
        if (cs != CUBLAS_STATUS_SUCCESS) {
            g->h = NULL;
            rc = blas_fail(st, "cublasCreate", cs);
        }
    }
    if (rc) {
        (void)cudaGetLastError();
        sd_moe_grouped_free(g);
        return rc;
    }
    *out = g;
    return SD_OK;
}

// Problem i of op: C (m × rows, ld ldc) = op(A) (m × k) · B (k × rows), A and B of leading
// dimension k (moe_grouped.h's mapping).
static void put(sd_moe_grouped *g, int op, int i, const void *a, const void *b, void *c, int m, int rows, int k, int ldc) {
    const int v[N_SIZES] = {m, rows, k, k, k, ldc, 1}; // SIZE_M .. SIZE_GROUP
    for (int s = 0; s < N_SIZES; s++) sizes_of(g, op, s)[i] = v[s];
    ptrs_of(g->ptr_host, g, op, PTR_A)[i] = a;
    ptrs_of(g->ptr_host, g, op, PTR_B)[i] = b;
    ptrs_of(g->ptr_host, g, op, PTR_C)[i] = c;
}

extern "C" sd_code sd_cuda_moe_grouped_plan(sd_moe_grouped *g, const sd_cuda_expert *experts, const int *counts, int E, int D,
                                            int Ie, const uint16_t *x, uint16_t *h, const uint16_t *hb, uint16_t *y,
                                            cudaStream_t stream, sd_status *st) {
    SD_NVTX("sd_cuda_moe_grouped_plan");
    g->groups[SD_MOE_GROUPED_UP] = g->groups[SD_MOE_GROUPED_DOWN] = 0;
    if (E < 1 || 2 * E > g->cap || D < 8 || Ie < 8 || D % 8 || Ie % 8)
        return sd_fail(st, SD_ERR_UNSUPPORTED, "cuda moe grouped: E = %d (room for %d), D = %d, Ie = %d (multiples of 8)", E,
                       g->cap / 2, D, Ie);
    if (!sd_aligned16(x) || !sd_aligned16(h) || !sd_aligned16(hb) || !sd_aligned16(y))
        return sd_fail(st, SD_ERR_UNSUPPORTED, "cuda moe grouped: the rows' buffers (%p, %p, %p, %p) are not 16-byte aligned",
                       (const void *)x, (void *)h, (const void *)hb, (void *)y);
    SD_CUDA_CHECK(st, cudaEventSynchronize(g->done)); // the previous plan's copy and calls have run
    const size_t gate_bytes = (size_t)Ie * D * sizeof(uint16_t);
    int n_up = 0, n_down = 0;
    for (int e = 0, off = 0; e < E; off += counts[e], e++) {
        const int c = counts[e];
        if (c < 0) return sd_fail(st, SD_ERR_USAGE, "cuda moe grouped: expert %d has %d rows", e, c);
        if (!c) continue;
        const sd_cuda_expert *w = &experts[e];
        if (!w->gate || !w->up || !w->down || !w->gate_bf16 || !w->up_bf16 || !w->down_bf16)
            return sd_fail(st, SD_ERR_UNSUPPORTED, "cuda moe grouped: expert %d (%d rows) is not three BF16 matrices on this device",
                           e, c);
        if (!sd_aligned16(w->gate) || !sd_aligned16(w->up) || !sd_aligned16(w->down))
            return sd_fail(st, SD_ERR_UNSUPPORTED, "cuda moe grouped: expert %d's matrices are not 16-byte aligned", e);
        const uint16_t *xe = x + (size_t)off * D, *hbe = hb + (size_t)off * Ie;
        uint16_t *he = h + (size_t)off * 2 * Ie, *ye = y + (size_t)off * D;
        if ((const char *)w->up == (const char *)w->gate + gate_bytes) { // [gate | up] stacked: one problem
            put(g, SD_MOE_GROUPED_UP, n_up++, w->gate, xe, he, 2 * Ie, c, D, 2 * Ie);
        } else { // the two halves of each h row
            put(g, SD_MOE_GROUPED_UP, n_up++, w->gate, xe, he, Ie, c, D, 2 * Ie);
            put(g, SD_MOE_GROUPED_UP, n_up++, w->up, xe, he + Ie, Ie, c, D, 2 * Ie);
        }
        put(g, SD_MOE_GROUPED_DOWN, n_down++, w->down, hbe, ye, D, c, Ie, D);
    }
    SD_CUDA_CHECK(st, cudaMemcpyAsync(g->ptr_dev, g->ptr_host, ptr_bytes(g), cudaMemcpyHostToDevice, stream));
    SD_CUDA_CHECK(st, cudaEventRecord(g->done, stream));
    g->groups[SD_MOE_GROUPED_UP] = n_up;
    g->groups[SD_MOE_GROUPED_DOWN] = n_down;
    return SD_OK;
}

// The handle on stream; its workspace set after the stream, since setting a stream resets the
// workspace to cuBLAS's own pool.
static sd_code bind(sd_moe_grouped *g, cudaStream_t stream, sd_status *st) {
    if (g->bound && g->stream == stream) return SD_OK;
    cublasStatus_t rc = cublasSetStream(g->h, stream);
    if (rc != CUBLAS_STATUS_SUCCESS) return blas_fail(st, "cublasSetStream", rc);
    rc = cublasSetWorkspace(g->h, g->workspace, GROUPED_WORKSPACE);
    if (rc != CUBLAS_STATUS_SUCCESS) return blas_fail(st, "cublasSetWorkspace", rc);
    g->stream = stream;
    g->bound = true;
    return SD_OK;
}

extern "C" sd_code sd_cuda_moe_grouped_gemm(sd_moe_grouped *g, sd_moe_grouped_op op, cudaStream_t stream, sd_status *st) {
    SD_NVTX("sd_cuda_moe_grouped_gemm");
    if (op != SD_MOE_GROUPED_UP && op != SD_MOE_GROUPED_DOWN)
        return sd_fail(st, SD_ERR_USAGE, "cuda moe grouped: op %d (up 0, down 1)", (int)op);
    const int n = g->groups[op];
    if (n == 0) return SD_OK;
    sd_code rc = bind(g, stream, st);
    if (rc) return rc;
    const cublasStatus_t cs = cublasGemmGroupedBatchedEx(
        g->h, g->ta, g->tb, sizes_of(g, op, SIZE_M), sizes_of(g, op, SIZE_N), sizes_of(g, op, SIZE_K), g->alpha,
        ptrs_of(g->ptr_dev, g, op, PTR_A), CUDA_R_16BF, sizes_of(g, op, SIZE_LDA), ptrs_of(g->ptr_dev, g, op, PTR_B),
        CUDA_R_16BF, sizes_of(g, op, SIZE_LDB), g->beta, (void *const *)ptrs_of(g->ptr_dev, g, op, PTR_C), CUDA_R_16BF,
        sizes_of(g, op, SIZE_LDC), n, sizes_of(g, op, SIZE_GROUP), CUBLAS_COMPUTE_32F);
    if (cs != CUBLAS_STATUS_SUCCESS) {
        char call[96];
        snprintf(call, sizeof call, "cublasGemmGroupedBatchedEx (%s, %d groups)", op == SD_MOE_GROUPED_UP ? "[gate | up]" : "down", n);
        return blas_fail(st, call, cs);
    }
    SD_CUDA_CHECK(st, cudaEventRecord(g->done, stream));
    return SD_OK;
}
