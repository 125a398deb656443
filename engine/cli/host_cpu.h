// host_cpu.h — the host CPU a command runs on: the OpenMP wait policy, the CPU backend's thread
// count, and the CPU's name (for receipts and JSON).
#pragma once
#include <stddef.h>

// Idle OpenMP threads sleep rather than spin (OMP_WAIT_POLICY=passive), so a run on a loaded
// machine shares the cores instead of fighting for them. libgomp reads its environment in a
// constructor that runs before main, so setting the variable in-process is too late: the first
// call re-executes the program (/proc/self/exe, same argv) with it set, once. A policy the user
// set is kept. Call first thing in main; returns only when no re-execution happened.
void sd_cli_omp_passive(char **argv);

// Threads of the CPU backend: n > 0 uses n; n == 0 keeps OMP_NUM_THREADS when it is set, else
// the CPUs this process may run on (sched_getaffinity). Returns the count now in use.
int sd_cli_threads(long n);

// The OpenMP wait policy the runtime read ("passive", the user's value, or NULL when unset).
const char *sd_cli_omp_wait_policy(void);

// "model name" of /proc/cpuinfo; where it has none (e.g. aarch64), the machine of uname(2)
// ("aarch64"), and "cpu" when even that is unknown.
void sd_cli_cpu_model(char *buf, size_t len);
