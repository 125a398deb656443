// gpu_bench.h — what the benches share (the prefill bench and lab all of it, bench_gpu_trace its
// checks): stop-on-error checks (one line naming the program, the call and the place, then exit
// 1), the median device time of a call, and the two ceilings their times are read against,
// measured on the device at hand (never assumed): the copy bandwidth (bytes read + written per
// second of a large device-to-device copy, the bound of what streams weights) and the bf16 GEMM
// rate (cuBLASLt through kernels/gemm.h — the prefill's own GEMM path — on an n × n × n product,
// the bound of what is compute-bound).
#pragma once
#include <cuda_runtime_api.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include "status.h" // sd_status

extern const char *sd_bench_prog; // the program's name in error lines (each main sets it)

#define SD_BENCH_CK(call)                                                                                     \
    do {                                                                                                      \
        cudaError_t e_ = (call);                                                                              \
        if (e_ != cudaSuccess) {                                                                              \
            fprintf(stderr, "%s: %s: %s (%s:%d)\n", sd_bench_prog, #call, cudaGetErrorString(e_), __FILE__, __LINE__); \
            exit(1);                                                                                          \
        }                                                                                                     \
    } while (0)
// For calls that return sd_code and take `&st_` as their status.
#define SD_BENCH_OK(call)                                                      \
    do {                                                                       \
        sd_status st_ = {0};                                                   \
        if ((call) != SD_OK) {                                                 \
            fprintf(stderr, "%s: %s: %s\n", sd_bench_prog, #call, st_.msg);    \
            exit(1);                                                           \
        }                                                                      \
    } while (0)

// The median device time in ms of reps calls of fn(ctx, stream) (after one warm-up call), each
// between two events on `stream`.
typedef void (*sd_bench_fn)(void *ctx, cudaStream_t stream);
double sd_bench_time_ms(sd_bench_fn fn, void *ctx, cudaStream_t stream, int reps);

double sd_bench_copy_gbs(size_t bytes, int reps); // GB/s read + written, median of reps copies
double sd_bench_gemm_tflops(int n, int reps);     // TFLOP/s, bf16 X · bf16 Wᵀ → f32, median of reps
