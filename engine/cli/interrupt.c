// interrupt.c — see interrupt.h.
#include "interrupt.h"
#include <string.h>

volatile sig_atomic_t sd_cli_stop_signal = 0;

static void on_signal(int sig) { sd_cli_stop_signal = sig; }

static const int signals[] = {SIGINT, SIGTERM};
static struct sigaction saved[2];

void sd_cli_interrupt_install(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sa.sa_flags = SA_RESETHAND; // the second signal takes the default action
    sigemptyset(&sa.sa_mask);
    for (int i = 0; i < 2; i++) sigaction(signals[i], &sa, &saved[i]);
}

void sd_cli_interrupt_restore(void) {
    for (int i = 0; i < 2; i++) sigaction(signals[i], &saved[i], NULL);
}
