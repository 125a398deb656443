// host_cpu.c — see host_cpu.h.
#include "host_cpu.h"
#include <omp.h>   // omp_set_num_threads, omp_get_max_threads
#include <sched.h> // sched_getaffinity, CPU_COUNT
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/utsname.h> // uname
#include <unistd.h>

#define WAIT_POLICY "OMP_WAIT_POLICY"

void sd_cli_omp_passive(char **argv) {
    if (getenv(WAIT_POLICY) || setenv(WAIT_POLICY, "passive", 1) != 0) return;
    execv("/proc/self/exe", argv);
    unsetenv(WAIT_POLICY); // no /proc: run on with the runtime's default (spinning) policy
}

const char *sd_cli_omp_wait_policy(void) { return getenv(WAIT_POLICY); }

int sd_cli_threads(long n) {
    if (n <= 0 && !getenv("OMP_NUM_THREADS")) {
        cpu_set_t set;
        if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0) n = CPU_COUNT(&set);
    }
    if (n > 0) omp_set_num_threads((int)n);
    return omp_get_max_threads();
}

void sd_cli_cpu_model(char *buf, size_t len) {
    struct utsname u;
    snprintf(buf, len, "%s", uname(&u) == 0 && u.machine[0] ? u.machine : "cpu");
    FILE *f = fopen("/proc/cpuinfo", "r");
    char line[512];
    while (f && fgets(line, sizeof line, f)) {
        char *colon = strchr(line, ':');
        if (strncmp(line, "model name", 10) || !colon) continue;
        snprintf(buf, len, "%s", colon + 2);
        buf[strcspn(buf, "\n")] = 0;
        break;
    }
    if (f) fclose(f);
}
