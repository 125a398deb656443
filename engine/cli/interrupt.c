// interrupt.c — see interrupt.h.
#include "interrupt.h"
#include <string.h>
#include "cleanup.h" // sd_cleanup_run

volatile sig_atomic_t sd_cli_stop_signal = 0;

// The end of the process: registered temporaries removed, then the signal's default action
// (so the exit status still says which signal it was).
static void on_fatal(int sig) {
    sd_cleanup_run();
    signal(sig, SIG_DFL);
    raise(sig);
}

// A run's first SIGINT/SIGTERM asks it to stop; a second one is fatal.
static void on_signal(int sig) {
    if (sd_cli_stop_signal) on_fatal(sig);
    sd_cli_stop_signal = sig;
}

static const int fatal_signals[] = {SIGINT, SIGTERM, SIGHUP, SIGPIPE};
static const int run_signals[] = {SIGINT, SIGTERM};
static struct sigaction saved[2];

static void set(int sig, void (*fn)(int), struct sigaction *old) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = fn;
    sigemptyset(&sa.sa_mask);
    sigaction(sig, &sa, old);
}

void sd_cli_cleanup_install(void) {
    for (int i = 0; i < 4; i++) {
        struct sigaction cur;
        if (sigaction(fatal_signals[i], NULL, &cur) == 0 && cur.sa_handler == SIG_IGN) continue; // e.g. nohup
        set(fatal_signals[i], on_fatal, NULL);
    }
}

void sd_cli_interrupt_install(void) {
    for (int i = 0; i < 2; i++) set(run_signals[i], on_signal, &saved[i]);
}

void sd_cli_interrupt_restore(void) {
    for (int i = 0; i < 2; i++) sigaction(run_signals[i], &saved[i], NULL);
}
