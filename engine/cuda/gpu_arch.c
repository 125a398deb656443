// gpu_arch.c — the CUDA side of `specdec --version` and the start-up check that every visible
// device can run one of the built architectures (gpu_arch.h).
#include "gpu_arch.h"
#include <cublasLt.h>         // cublasLtGetVersion
#include <cuda_runtime_api.h> // cudaRuntimeGetVersion, cudaGetDeviceProperties
#if defined(SPECDEC_HAVE_NCCL) && SPECDEC_HAVE_NCCL
#include <nccl.h> // ncclGetVersion
#endif
#include "cuda_backend.h" // sd_cuda_device_count

#ifndef SPECDEC_CUDA_ARCHS
#error "SPECDEC_CUDA_ARCHS (the built CMAKE_CUDA_ARCHITECTURES) must be defined by the build"
#endif

const char *sd_cuda_built_archs(void) { return SPECDEC_CUDA_ARCHS; }

sd_code sd_cuda_check_devices(sd_status *st) {
    const int n = sd_cuda_device_count();
    for (int d = 0; d < n; d++) {
        struct cudaDeviceProp p;
        const cudaError_t e = cudaGetDeviceProperties(&p, d);
        if (e != cudaSuccess) {
            (void)cudaGetLastError();
            return sd_fail(st, SD_ERR_SYS, "cuda device %d: cannot read its properties: %s", d, cudaGetErrorString(e));
        }
        if (!sd_gpu_arch_runs(SPECDEC_CUDA_ARCHS, p.major, p.minor))
            return sd_fail(st, SD_ERR_UNSUPPORTED,
                           "cuda device %d (%s) has compute capability %d.%d; this build has code for architectures "
                           "%s only (rebuild with -DCMAKE_CUDA_ARCHITECTURES=%d%d, or run --backend cpu)",
                           d, p.name, p.major, p.minor, SPECDEC_CUDA_ARCHS, p.major, p.minor);
    }
    return SD_OK;
}

// 12040 -> "12.4"; 120405 (cuBLASLt, NCCL) -> "12.4.5".
static void version2(int v, char *buf, size_t len) { snprintf(buf, len, "%d.%d", v / 1000, v % 1000 / 10); }
static void version3(long v, char *buf, size_t len) { snprintf(buf, len, "%ld.%ld.%ld", v / 10000, v / 100 % 100, v % 100); }

void sd_cuda_describe(FILE *out) {
    int rt = 0, drv = 0;
    char rts[32] = "?", drvs[48] = "no CUDA driver", blas[32];
    if (cudaRuntimeGetVersion(&rt) == cudaSuccess) version2(rt, rts, sizeof rts);
    if (cudaDriverGetVersion(&drv) == cudaSuccess && drv > 0) {
        snprintf(drvs, sizeof drvs, "driver for CUDA ");
        version2(drv, drvs + strlen(drvs), sizeof drvs - strlen(drvs));
    }
    (void)cudaGetLastError();
    version3((long)cublasLtGetVersion(), blas, sizeof blas);
    fprintf(out, "  cuda      runtime %s, %s, architectures %s\n", rts, drvs, SPECDEC_CUDA_ARCHS);
#if defined(SPECDEC_HAVE_NCCL) && SPECDEC_HAVE_NCCL
    int nv = 0;
    char ncs[32] = "?";
    if (ncclGetVersion(&nv) == ncclSuccess) version3(nv, ncs, sizeof ncs);
    fprintf(out, "  nccl      %s\n", ncs);
#else
    fprintf(out, "  nccl      not built (no NCCL at build time: --tp runs on the CPU only)\n");
#endif
    fprintf(out, "  cublasLt  %s\n", blas);
    const int n = sd_cuda_device_count();
    fprintf(out, "devices:\n");
    if (n == 0) fprintf(out, "  no CUDA device visible\n");
    for (int d = 0; d < n; d++) {
        struct cudaDeviceProp p;
        const cudaError_t e = cudaGetDeviceProperties(&p, d);
        if (e != cudaSuccess) {
            (void)cudaGetLastError();
            fprintf(out, "  %d  (properties unreadable: %s)\n", d, cudaGetErrorString(e));
            continue;
        }
        fprintf(out, "  %d  %s, compute capability %d.%d, %.1f GiB%s\n", d, p.name, p.major, p.minor,
                (double)p.totalGlobalMem / (1024.0 * 1024.0 * 1024.0),
                sd_gpu_arch_runs(SPECDEC_CUDA_ARCHS, p.major, p.minor) ? "" : " (this build cannot run on it)");
    }
}
