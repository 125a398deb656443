// gpu_arch.h — which GPUs this build runs on, and what `specdec --version` says about the CUDA
// side. sd_gpu_arch_runs is plain C (no CUDA headers), so the rule is tested in every build;
// the rest is in gpu_arch.c, built with the CUDA backend only.
#pragma once
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "status.h" // sd_status, sd_code

// Whether a device of compute capability major.minor runs code built for `archs`, a list in
// CMAKE_CUDA_ARCHITECTURES form separated by ',' or ';': "90" is sm_90 code plus compute_90 PTX,
// "90-real" the code only, "90-virtual" the PTX only, "90a" code for exactly 9.0. Code for X.Y
// runs on major X with minor >= Y; PTX for X.Y is compiled by the driver for any device >= X.Y.
static inline bool sd_gpu_arch_runs(const char *archs, int major, int minor) {
    const int cc = major * 10 + minor;
    for (const char *p = archs; p && *p;) {
        char *end;
        const long n = strtol(p, &end, 10);
        const bool exact = *end == 'a', family = *end == 'f';
        if (exact || family) end++;
        const bool real_only = !strncmp(end, "-real", 5), virt_only = !strncmp(end, "-virtual", 8);
        if (end != p && n > 0) {
            const int am = (int)(n / 10), an = (int)(n % 10);
            if (exact && cc == n) return true;
            if (!exact && !virt_only && major == am && minor >= an) return true; // the code (family: the same)
            if (!exact && !family && !real_only && cc >= n) return true;         // the PTX, JIT-compiled
        }
        while (*p && *p != ',' && *p != ';') p++;
        if (*p) p++;
    }
    return false;
}

#ifdef SPECDEC_HAVE_CUDA
// The architectures compiled into this build (CMAKE_CUDA_ARCHITECTURES, ',' separated).
const char *sd_cuda_built_archs(void);
// Refuses (SD_ERR_UNSUPPORTED) a visible device this build cannot run, in one line naming the
// device, its compute capability and the built architectures; SD_OK when there is no device.
sd_code sd_cuda_check_devices(sd_status *st);
// The CUDA lines of `specdec --version`: the runtime and driver, the architectures, NCCL and
// cuBLASLt versions, then one line per visible device (name, compute capability, memory, and
// whether this build runs on it), or "no CUDA device visible".
void sd_cuda_describe(FILE *out);
#endif
