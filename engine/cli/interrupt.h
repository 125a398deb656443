// interrupt.h — signals and the files a command is writing.
//
// Every command: SIGINT, SIGTERM, SIGHUP and SIGPIPE end the process after removing the
// temporaries its writes have registered (engine/base/cleanup.h), so an interrupted write leaves
// no temporary behind (sd_cli_cleanup_install, called by main before any command).
//
// `specdec run`: Ctrl-C (SIGINT) and SIGTERM end a run cleanly: the handler only records the
// signal; the generation loop checks the flag between rounds and steps (generate.h), and the
// command then prints the tokens so far, closes its receipt and exits 128 + the signal number
// (130 for Ctrl-C). A second signal ends the process at once (the temporaries removed first).
#pragma once
#include <signal.h> // sig_atomic_t

extern volatile sig_atomic_t sd_cli_stop_signal; // 0, or the signal that asked the run to stop

void sd_cli_cleanup_install(void);
void sd_cli_interrupt_install(void);
void sd_cli_interrupt_restore(void);
