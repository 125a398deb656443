// lab.cuh — what the kernel labs (kda_lab, mla_lab, moe_lab) share: the stop-on-error check, the
// median of timings, and the measured copy-bandwidth ceiling their bytes/s lines are read against.
#pragma once
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <algorithm>
#include <vector>

#define CK(x)                                                                                        \
    do {                                                                                             \
        cudaError_t e_ = (x);                                                                        \
        if (e_ != cudaSuccess) {                                                                     \
            fprintf(stderr, "CUDA error %s at %s:%d: %s\n", cudaGetErrorString(e_), __FILE__, __LINE__, #x); \
            exit(1);                                                                                 \
        }                                                                                            \
    } while (0)

static inline double median(std::vector<float> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

// Device-to-device copy bandwidth in GB/s (bytes read + written): `bytes` copied `reps` times
// after a warm-up copy, the median of the per-copy event times.
static inline double lab_copy_gbs(cudaStream_t q, size_t bytes, int reps) {
    void *a, *b;
    CK(cudaMalloc(&a, bytes));
    CK(cudaMalloc(&b, bytes));
    CK(cudaMemsetAsync(a, 1, bytes, q));
    CK(cudaMemsetAsync(b, 2, bytes, q));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    CK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, q));
    std::vector<float> ms;
    for (int r = 0; r < reps; r++) {
        CK(cudaEventRecord(e0, q));
        CK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, q));
        CK(cudaEventRecord(e1, q));
        CK(cudaEventSynchronize(e1));
        float t;
        CK(cudaEventElapsedTime(&t, e0, e1));
        ms.push_back(t);
    }
    CK(cudaFree(a));
    CK(cudaFree(b));
    CK(cudaEventDestroy(e0));
    CK(cudaEventDestroy(e1));
    return 2.0 * bytes / (median(ms) * 1e-3) / 1e9;
}
