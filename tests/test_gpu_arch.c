// test_gpu_arch.c — which compute capabilities a CMAKE_CUDA_ARCHITECTURES list runs on
// (engine/cuda/gpu_arch.h: the rule behind the CUDA backend's start-up check). Plain C: runs in
// every build.
#include <criterion/criterion.h>
#include "cuda/gpu_arch.h"

Test(gpu_arch, code_ptx_and_arch_specific_entries) {
    const struct { const char *archs; int major, minor; bool runs; } cases[] = {
        {"90", 9, 0, true},             // sm_90 code
        {"90", 10, 0, true},            // compute_90 PTX, compiled by the driver
        {"90", 8, 9, false},            // older than anything built
        {"90", 8, 0, false},
        {"90-real", 9, 0, true},
        {"90-real", 10, 0, false},      // code only: another major cannot run it
        {"86-real", 8, 9, true},        // same major, newer minor runs the code
        {"86-real", 8, 0, false},
        {"90-virtual", 12, 0, true},
        {"90-virtual", 8, 6, false},
        {"90a", 9, 0, true},            // arch-specific: exactly 9.0
        {"90a", 10, 0, false},
        {"80-real,90-real", 8, 6, true},
        {"80-real;90-real", 9, 0, true},
        {"80-real;90-real", 7, 5, false},
        {"100f", 10, 3, true},          // family-specific code: the same major
        {"100f", 12, 0, false},
        {"", 9, 0, false},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        cr_expect_eq(sd_gpu_arch_runs(cases[i].archs, cases[i].major, cases[i].minor), cases[i].runs,
                     "archs '%s' on %d.%d: expected %s", cases[i].archs, cases[i].major, cases[i].minor,
                     cases[i].runs ? "runs" : "refused");
}
