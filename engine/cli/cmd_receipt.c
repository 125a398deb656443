// cmd_receipt.c — `specdec receipt parse LOG` and `specdec receipt compare A B [--tol PP]`.
#include <stdio.h>
#include <string.h>
#include "args.h"
#include "commands.h"
#include "receipt.h"

static const char *HELP =
    "usage: specdec receipt parse LOG\n"
    "       specdec receipt compare A B [--tol PP] [--tag TAG]\n\n"
    "parse    turn banked trace lines ([TAG-phase] / [TAG-phase-v], any TAG) into burst records,\n"
    "         printed as JSONL on stdout (the burst lines of a receipt)\n"
    "compare  print each phase's share of the round (and the level-2 shares of verify) for A and\n"
    "         B side by side with the difference in percentage points; exit 1 when any row\n"
    "         differs by more than --tol PP (default 2.0). A and B: receipts or trace logs.\n";

int cmd_receipt(int argc, char **argv) {
    const char *cmd = "specdec receipt";
    sd_args a;
    sd_args_init(&a, cmd, argc, argv);
    if (sd_args_help(&a)) { fputs(HELP, stdout); sd_args_free(&a); return 0; }
    const char *tol_s = sd_args_str(&a, "--tol"), *tag = sd_args_str(&a, "--tag");
    // Positional arguments: the verb and its files.
    const char *pos[3] = {0};
    int n_pos = 0;
    for (int i = 0; i < argc; i++)
        if (!a.used[i] && argv[i][0] != '-' && n_pos < 3) { pos[n_pos++] = argv[i]; a.used[i] = true; }
    bool ok = sd_args_done(&a);
    sd_args_free(&a);
    if (!ok) return EXIT_USAGE;

    sd_status st = {0};
    double tol = 2.0;
    receipt_set A = {0}, B = {0};
    int rc = 0;
    if (n_pos >= 1 && !strcmp(pos[0], "parse") && n_pos == 2 && !tol_s && !tag) {
        if (receipt_parse_file(pos[1], &A, &st) || receipt_write_jsonl(&A, stdout, &st)) rc = sd_cli_fail(cmd, &st);
    } else if (n_pos == 3 && !strcmp(pos[0], "compare")) {
        int over = 0;
        if (tol_s && !sd_parse_float("--tol", tol_s, 0.0, 100.0, &tol, &st)) rc = sd_cli_fail(cmd, &st);
        else if (receipt_read_any(pos[1], &A, &st) || receipt_read_any(pos[2], &B, &st) ||
                 receipt_compare(&A, &B, tag, tol, stdout, &over, &st))
            rc = sd_cli_fail(cmd, &st);
        else if (over) {
            fprintf(stderr, "%s: %d row(s) differ by more than %.2f pp\n", cmd, over, tol);
            rc = EXIT_DATA;
        }
    } else {
        fprintf(stderr, "%s: expected 'parse LOG' or 'compare A B [--tol PP]' (see --help)\n", cmd);
        rc = EXIT_USAGE;
    }
    receipt_set_free(&A);
    receipt_set_free(&B);
    return rc;
}
