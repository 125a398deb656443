// gpu_bench.c — timing and the ceilings of gpu_bench.h.
#include "gpu_bench.h"
#include "gemm.h"       // sd_gemm_run
#include "synth_fill.h" // sd_cuda_synth_fill (GEMM operands that are not all zeros)

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

double sd_bench_time_ms(sd_bench_fn fn, void *ctx, cudaStream_t stream, int reps) {
    cudaEvent_t e0, e1;
    SD_BENCH_CK(cudaEventCreate(&e0));
    SD_BENCH_CK(cudaEventCreate(&e1));
    double *ms = malloc(sizeof(double) * (size_t)(reps > 0 ? reps : 1));
    fn(ctx, stream);
    for (int r = 0; r < reps; r++) {
        float t = 0;
        SD_BENCH_CK(cudaEventRecord(e0, stream));
        fn(ctx, stream);
        SD_BENCH_CK(cudaEventRecord(e1, stream));
        SD_BENCH_CK(cudaEventSynchronize(e1));
        SD_BENCH_CK(cudaEventElapsedTime(&t, e0, e1));
        ms[r] = t;
    }
    qsort(ms, (size_t)reps, sizeof *ms, cmp_double);
    const double m = reps % 2 ? ms[reps / 2] : 0.5 * (ms[reps / 2 - 1] + ms[reps / 2]);
    free(ms);
    SD_BENCH_CK(cudaEventDestroy(e0));
    SD_BENCH_CK(cudaEventDestroy(e1));
    return m;
}

typedef struct { void *a, *b; size_t bytes; int i; } copy_ctx;
static void run_copy(void *ctx, cudaStream_t q) { // alternating directions
    copy_ctx *c = ctx;
    const int i = c->i++;
    SD_BENCH_CK(cudaMemcpyAsync(i & 1 ? c->a : c->b, i & 1 ? c->b : c->a, c->bytes, cudaMemcpyDeviceToDevice, q));
}

double sd_bench_copy_gbs(size_t bytes, int reps) {
    copy_ctx c = {.bytes = bytes};
    SD_BENCH_CK(cudaMalloc(&c.a, bytes));
    SD_BENCH_CK(cudaMalloc(&c.b, bytes));
    SD_BENCH_CK(cudaMemset(c.a, 1, bytes));
    SD_BENCH_CK(cudaMemset(c.b, 2, bytes));
    const double ms = sd_bench_time_ms(run_copy, &c, 0, reps);
    SD_BENCH_CK(cudaFree(c.a));
    SD_BENCH_CK(cudaFree(c.b));
    return 2.0 * (double)bytes / (ms * 1e-3) / 1e9;
}

typedef struct { sd_gemm *g; sd_gemm_args a; } gemm_ctx;
static void run_gemm(void *ctx, cudaStream_t q) {
    gemm_ctx *c = ctx;
    SD_BENCH_OK(sd_gemm_run(c->g, &c->a, q, &st_));
}

double sd_bench_gemm_tflops(int n, int reps) {
    const size_t nn = (size_t)n * n;
    void *w, *x, *y;
    SD_BENCH_CK(cudaMalloc(&w, nn * 2));
    SD_BENCH_CK(cudaMalloc(&x, nn * 2));
    SD_BENCH_CK(cudaMalloc(&y, nn * 4));
    SD_BENCH_OK(sd_cuda_synth_fill(w, (int64_t)nn, true, 1, 11, 0.02f, 0.0f, 0, &st_));
    SD_BENCH_OK(sd_cuda_synth_fill(x, (int64_t)nn, true, 2, 12, 1.0f, 0.0f, 0, &st_));
    gemm_ctx c = {.a = {.w = w, .w_dtype = SD_DT_BF16, .ldw = n, .op = SD_GEMM_WT, .x = x, .x_dtype = SD_DT_BF16, .ldx = n,
                        .y = y, .ldy = n, .M = n, .N = n, .K = n}};
    SD_BENCH_OK(sd_gemm_create(&c.g, 0, &st_));
    const double ms = sd_bench_time_ms(run_gemm, &c, 0, reps);
    sd_gemm_free(c.g);
    SD_BENCH_CK(cudaFree(w));
    SD_BENCH_CK(cudaFree(x));
    SD_BENCH_CK(cudaFree(y));
    return 2.0 * (double)nn * n / (ms * 1e-3) / 1e12;
}
