// check.h — the one error-check generator of the GPU code. SD_CUDA_CHECK, SD_CUBLAS_CHECK and
// SD_NCCL_CHECK are the same macro over a different status type: on failure they return
// sd_fail(st, SD_ERR_SYS, "<lib> error <code> (<text>) in <function> at <file>:<line> on device
// <ordinal>: <statement>") from the enclosing function, which must return sd_code.
// Usable from C (engine/cuda/*.c) and CUDA C++ (kernels/*.cu).
#pragma once
#include <cuda_runtime_api.h>
#include <cublasLt.h>

#ifdef __cplusplus
extern "C" {
#endif
#include "status.h" // sd_fail, sd_code (engine headers are C: C linkage from CUDA C++ too)

// The shared tail of every check (not called directly). The device is the calling thread's
// current one, which is the device the failed statement ran on.
static inline sd_code sd_gpu_check_fail_(sd_status *st, const char *lib, int code, const char *text,
                                         const char *stmt, const char *func, const char *file, int line) {
    int dev = -1;
    if (cudaGetDevice(&dev) != cudaSuccess) dev = -1;
    return sd_fail(st, SD_ERR_SYS, "%s error %d (%s) in %s at %s:%d on device %d: %s", lib, code,
                   text ? text : "?", func, file, line, dev, stmt);
}
#ifdef __cplusplus
}
#endif

// The generator: evaluate `stmt` once, compare with `ok`, report with `to_text`.
#define SD_GPU_CHECK_GEN_(st, lib, type, ok, to_text, stmt)                                          \
    do {                                                                                             \
        type sd_chk_rc_ = (stmt);                                                                    \
        if (sd_chk_rc_ != (ok))                                                                      \
            return sd_gpu_check_fail_((st), (lib), (int)sd_chk_rc_, to_text(sd_chk_rc_), #stmt,      \
                                      __func__, __FILE__, __LINE__);                                 \
    } while (0)

#define SD_CUDA_CHECK(st, stmt) SD_GPU_CHECK_GEN_(st, "CUDA", cudaError_t, cudaSuccess, cudaGetErrorString, stmt)
#define SD_CUBLAS_CHECK(st, stmt) \
    SD_GPU_CHECK_GEN_(st, "cuBLASLt", cublasStatus_t, CUBLAS_STATUS_SUCCESS, cublasLtGetStatusString, stmt)
#if defined(SPECDEC_HAVE_NCCL) && SPECDEC_HAVE_NCCL
#include <nccl.h>
#define SD_NCCL_CHECK(st, stmt) SD_GPU_CHECK_GEN_(st, "NCCL", ncclResult_t, ncclSuccess, ncclGetErrorString, stmt)
#endif

// After every kernel launch: a bad configuration or a sticky fault surfaces here, named by the
// launcher it came from.
#define SD_LAUNCH_CHECK(st) SD_CUDA_CHECK(st, cudaGetLastError())
