// main.c — `specdec COMMAND [options]`. With no command it runs the default demo (`run`).
#include <stdio.h>
#include <string.h>
#include "commands.h"
#include "backend_select.h" // sd_cli_backends_describe
#include "host_cpu.h"       // sd_cli_omp_passive
#include "interrupt.h"      // sd_cli_cleanup_install
#include "status.h"         // sd_escape

static const struct {
    const char *name;
    int (*fn)(int argc, char **argv);
    const char *what;
} commands[] = {
    {"run", cmd_run, "generate tokens: plain or speculative decode (default: the embedded toy demo)"},
    {"init", cmd_init, "synthesise a model directory (and a derived draft) from a config"},
    {"forward", cmd_forward, "teacher-forced logits of a token sequence, to a safetensors file"},
    {"receipt", cmd_receipt, "parse banked trace lines; compare two receipts' phase shares"},
    {"gate", cmd_gate, "graph-sel: the decode-graph door's MoE routing against the eager host oracle"},
};
enum { N_COMMANDS = sizeof commands / sizeof commands[0] };

static void usage(FILE *out) {
    fprintf(out, "usage: specdec [COMMAND] [options]   (specdec COMMAND --help for its options)\n\n"
                 "specdec " SPECDEC_VERSION " (%s): an instrumented reference speculative-decode engine.\n\ncommands:\n",
            SPECDEC_GIT_COMMIT);
    for (int i = 0; i < N_COMMANDS; i++) fprintf(out, "  %-9s %s\n", commands[i].name, commands[i].what);
    fprintf(out, "\nWith no command, `specdec` runs `specdec run` (the default demo).\n"
                 "Exit codes: 0 success, 1 bad data or a failed run, 2 bad usage, 128 + N when signal N\n"
                 "ended a run (130: Ctrl-C; the work finished so far is printed and banked).\n");
}

int main(int argc, char **argv) {
    sd_cli_omp_passive(argv);
    sd_cli_cleanup_install(); // a signal removes the temporaries of an unfinished write
    if (argc < 2 || argv[1][0] == '-') {
        if (argc >= 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
            usage(stdout);
            return 0;
        }
        if (argc >= 2 && !strcmp(argv[1], "--version")) {
            printf("specdec %s (%s)\n", SPECDEC_VERSION, SPECDEC_GIT_COMMIT);
            sd_cli_backends_describe(stdout);
            return 0;
        }
        return cmd_run(argc - 1, argv + 1);
    }
    for (int i = 0; i < N_COMMANDS; i++)
        if (!strcmp(argv[1], commands[i].name)) return commands[i].fn(argc - 2, argv + 2);
    char shown[256];
    fprintf(stderr, "specdec: unknown command '%s' (see specdec --help)\n", sd_escape(argv[1], shown, sizeof shown));
    return 2;
}
