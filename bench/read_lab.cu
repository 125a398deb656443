// read_lab.cu — how much of the HBM copy bandwidth a weight-streaming launch can reach, by its
// size and by how a step cuts its bytes into launches. The decode step reads ~6.3 GB through
// ~266 launches (bench_gpu_e2e); this lab measures, with nothing else in the way, what that
// structure costs, so a kernel's critical-path increment (bench/ktrace.c) can be read against
// what a launch of its size can do at best.
//   1. One launch reading N bytes (N = 4 MB .. 1 GiB, L2 flushed before each rep): blocks of
//      64 KB each bulk-copied into shared memory by one thread and summed (the Linear kernel's
//      BULK way, 3 blocks a multiprocessor); µs, GB/s, % of the copy bandwidth, and the least-
//      squares fit t = t0 + N / B over N >= 16 MB — t0 is what a launch costs beyond its bytes
//      (ramp-up and tail).
//   2. 128 MB (about one MoE block's weights) cut into a chain of k = 1 .. 64 launches, each
//      issuing its copies before griddepcontrol.wait (programmatic dependent launch, as the layer
//      walk chains its launches, kernels/pdl.h): as stream launches and as one captured graph;
//      the cost of one boundary = (t_k - t_1) / (k - 1).
//   3. A chain of 32 launches of 24 MB each (the device slower than the host's launches) whose
//      kernel takes P bytes of parameters (P = 64 .. 2048; the Linear's lin_params is ~700):
//      stream and graph µs, and what each parameter byte costs a launch against P = 64 — a
//      stream launch carries its parameters in the command stream, a graph node has them on
//      the device already.
// Usage: read_lab   (prints a table and one JSON line per row; no validation: nothing is computed)
#include <cuda_runtime.h>
#include <stdio.h>
#include <vector>
#include "lab.cuh"
#include "linear.cuh" // sd_bulk_*, sd_launch (common.cuh)

#define CHUNK (64 * 1024) // bytes a block copies
#define THREADS 256

// Block b copies bytes [b·CHUNK, (b+1)·CHUNK) of src into shared memory before its wait, then
// sums them as words (so the bytes are consumed) and writes the sum when it is a sentinel the
// data never produces.
__device__ __forceinline__ void read_body(const unsigned char *src, float *sink, unsigned salt) {
    extern __shared__ __align__(128) unsigned char sm[];
    __shared__ uint64_t bar;
    sd_pdl_trigger();
    if (threadIdx.x == 0) {
        sd_bulk_init(&bar);
        sd_bulk_expect(&bar, CHUNK);
        sd_bulk_copy(sm, src + (size_t)blockIdx.x * CHUNK, CHUNK, &bar);
    }
    sd_pdl_wait();
    __syncthreads();
    sd_bulk_wait(&bar, 0);
    unsigned acc = salt;
    for (int i = threadIdx.x; i < CHUNK / 16; i += THREADS) {
        const uint4 v = ((const uint4 *)sm)[i];
        acc += v.x ^ v.y ^ v.z ^ v.w;
    }
    if (acc == 0x9e3779b9u) sink[blockIdx.x & 1023] = (float)acc;
}

static __global__ void __launch_bounds__(THREADS, 3) read_kernel(const unsigned char *src, float *sink) {
    read_body(src, sink, 0);
}

// P bytes of launch parameters (section 3); the kernel reads its last byte so none is dead.
template <int P> struct pad_params {
    const unsigned char *src;
    float *sink;
    unsigned char pad[P - 16];
};
template <int P> static __global__ void __launch_bounds__(THREADS, 3) read_kernel_p(const __grid_constant__ pad_params<P> p) {
    read_body(p.src, p.sink, p.pad[P - 17]);
}

static void launch_read(const unsigned char *src, size_t bytes, float *sink, cudaStream_t q) {
    CK(sd_launch(read_kernel, (unsigned)(bytes / CHUNK), THREADS, CHUNK, q, src, sink));
}

int main() {
    cudaStream_t q;
    CK(cudaStreamCreateWithFlags(&q, cudaStreamNonBlocking));
    CK(cudaFuncSetAttribute(read_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, CHUNK));
    const double copy = lab_copy_gbs(q, (size_t)2 << 30, 10);
    const size_t max_bytes = (size_t)1 << 30, flush_bytes = (size_t)256 << 20;
    unsigned char *src, *flush;
    float *sink;
    CK(cudaMalloc(&src, max_bytes));
    CK(cudaMalloc(&flush, flush_bytes));
    CK(cudaMalloc(&sink, 1024 * sizeof(float)));
    CK(cudaMemsetAsync(src, 0x5a, max_bytes, q));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    const int REPS = 15;
    // Median µs of `run` over REPS reps, each after an L2 flush (a 256 MB memset).
    auto timed = [&](auto run) {
        std::vector<float> us;
        for (int r = -2; r < REPS; r++) {
            CK(cudaMemsetAsync(flush, r & 0xff, flush_bytes, q));
            CK(cudaEventRecord(e0, q));
            run();
            CK(cudaEventRecord(e1, q));
            CK(cudaEventSynchronize(e1));
            float ms;
            CK(cudaEventElapsedTime(&ms, e0, e1));
            if (r >= 0) us.push_back(1e3f * ms);
        }
        return median(us);
    };
    // The same median over replays of one graph captured from `launches`.
    auto timed_graph = [&](auto launches) {
        cudaGraph_t g;
        cudaGraphExec_t ge;
        CK(cudaStreamBeginCapture(q, cudaStreamCaptureModeThreadLocal));
        launches();
        CK(cudaStreamEndCapture(q, &g));
        CK(cudaGraphInstantiate(&ge, g, 0));
        const double us = timed([&] { CK(cudaGraphLaunch(ge, q)); });
        CK(cudaGraphExecDestroy(ge));
        CK(cudaGraphDestroy(g));
        return us;
    };
    int dev = 0, sms = 0;
    CK(cudaGetDevice(&dev));
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    printf("read_lab: %d SMs; copy bandwidth %.0f GB/s (2 GiB cudaMemcpyDeviceToDevice, read + write); blocks of %d KB "
           "bulk-copied into shared memory, L2 flushed before each of %d reps (median)\n\n", sms, copy, CHUNK / 1024, REPS);

    printf("1. one launch of N bytes\n%10s %10s %10s %8s\n", "MB", "us", "GB/s", "% copy");
    double sx = 0, sy = 0, sxx = 0, sxy = 0;
    int nfit = 0;
    for (size_t mb = 4; mb <= 1024; mb *= 2) {
        const size_t bytes = mb << 20;
        const double us = timed([&] { launch_read(src, bytes, sink, q); });
        const double gbs = bytes / (us * 1e-6) / 1e9;
        printf("%10zu %10.1f %10.0f %7.1f%%\n", mb, us, gbs, 100.0 * gbs / copy);
        printf("{\"bench\":\"read_lab_one\",\"mb\":%zu,\"us\":%.2f,\"gbs\":%.1f,\"pct_copy\":%.2f}\n", mb, us, gbs,
               100.0 * gbs / copy);
        if (mb >= 16) { sx += bytes; sy += us; sxx += (double)bytes * bytes; sxy += (double)bytes * us; nfit++; }
    }
    const double slope = (nfit * sxy - sx * sy) / (nfit * sxx - sx * sx), t0 = (sy - slope * sx) / nfit;
    printf("fit over N >= 16 MB: t = %.2f us + N / (%.0f GB/s)\n", t0, 1e-3 / slope);
    printf("{\"bench\":\"read_lab_fit\",\"t0_us\":%.3f,\"gbs\":%.1f}\n", t0, 1e-3 / slope);

    const size_t chain_bytes = (size_t)128 << 20;
    printf("\n2. 128 MB as a chain of k launches (programmatic dependent launch; copies before the wait)\n"
           "%6s %12s %12s %14s %14s\n", "k", "stream us", "graph us", "stream us/bnd", "graph us/bnd");
    double s1 = 0, g1 = 0, sb_last = 0, gb_last = 0;
    for (int k = 1; k <= 64; k *= 2) {
        const size_t part = chain_bytes / k;
        auto chain = [&] {
            for (int i = 0; i < k; i++) launch_read(src + (size_t)i * part, part, sink, q);
        };
        const double s = timed(chain);
        const double gr = timed_graph(chain);
        if (k == 1) { s1 = s; g1 = gr; }
        const double sb = k > 1 ? (s - s1) / (k - 1) : 0, gb = k > 1 ? (gr - g1) / (k - 1) : 0;
        printf("%6d %12.1f %12.1f %14.2f %14.2f\n", k, s, gr, sb, gb);
        sb_last = sb, gb_last = gb;
        printf("{\"bench\":\"read_lab_chain\",\"mb\":128,\"k\":%d,\"stream_us\":%.2f,\"graph_us\":%.2f,"
               "\"stream_us_per_boundary\":%.3f,\"graph_us_per_boundary\":%.3f}\n", k, s, gr, sb, gb);
    }

    const int n3 = 32;
    const size_t part3 = (size_t)24 << 20;
    printf("\n3. %d launches of %zu MB, P bytes of kernel parameters\n%6s %12s %12s %16s %16s\n", n3, part3 >> 20, "P",
           "stream us", "graph us", "stream ns/launch", "graph ns/launch");
    double s64 = 0, g64 = 0;
    auto params_row = [&](auto kernel, auto params, int P) {
        CK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, CHUNK));
        auto chain = [&] {
            for (int i = 0; i < n3; i++) {
                params.src = src + (size_t)i * part3;
                CK(sd_launch(kernel, (unsigned)(part3 / CHUNK), THREADS, CHUNK, q, params));
            }
        };
        const double s = timed(chain);
        const double gr = timed_graph(chain);
        if (P == 64) { s64 = s; g64 = gr; }
        const double sd = 1e3 * (s - s64) / n3, gd = 1e3 * (gr - g64) / n3;
        printf("%6d %12.1f %12.1f %16.0f %16.0f\n", P, s, gr, sd, gd);
        printf("{\"bench\":\"read_lab_params\",\"param_bytes\":%d,\"launches\":%d,\"stream_us\":%.2f,\"graph_us\":%.2f,"
               "\"stream_ns_per_launch_vs_64\":%.1f,\"graph_ns_per_launch_vs_64\":%.1f}\n", P, n3, s, gr, sd, gd);
        return sd;
    };
    params_row(read_kernel_p<64>, pad_params<64>{nullptr, sink, {}}, 64);
    params_row(read_kernel_p<256>, pad_params<256>{nullptr, sink, {}}, 256);
    const double s704 = params_row(read_kernel_p<704>, pad_params<704>{nullptr, sink, {}}, 704);
    params_row(read_kernel_p<2048>, pad_params<2048>{nullptr, sink, {}}, 2048);
    printf("read_lab: one launch costs %.1f us beyond its bytes at %.0f GB/s; a boundary of the 64-launch chain %.2f us "
           "(stream), %.2f us (graph); 704 bytes of parameters cost a stream launch %+.0f ns against 64\n", t0, 1e-3 / slope,
           sb_last, gb_last, s704);
    CK(cudaFree(src));
    CK(cudaFree(flush));
    CK(cudaFree(sink));
    return 0;
}
