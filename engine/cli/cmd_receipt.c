// cmd_receipt.c — `specdec receipt parse LOG` and `specdec receipt compare A B [--tol PP]`.
#include <cjson/cJSON.h>
#include <stdio.h>
#include <string.h>
#include "args.h"
#include "commands.h"
#include "receipt.h"

static const char *HELP =
    "usage: specdec receipt parse LOG\n"
    "       specdec receipt compare A B [--tol PP] [--tag TAG] [--force] [--json]\n\n"
    "parse    turn banked trace lines ([TAG-phase] / [TAG-phase-v], any TAG) into burst records,\n"
    "         printed as JSONL on stdout (the burst lines of a receipt); a log without any trace\n"
    "         line is an error\n"
    "compare  print each phase's share of the round (and the level-2 shares of verify) for A and\n"
    "         B side by side with the difference in percentage points; exit 1 when any row\n"
    "         differs by more than --tol PP (default 2.0). A and B: receipts or trace logs.\n"
    "         Receipts whose env lines name different configs, weights, draft weights, k or\n"
    "         backends measured different things: refused (exit 1) unless --force, which compares\n"
    "         them anyway with one warning line per difference on stderr. A trace log has no env\n"
    "         line: a note on stderr says its measurement is not checked.\n"
    "  --json  compare: one JSON object on stdout (rows, verdict, env differences) instead of the table\n";

static int compare(const char *cmd, const char *pa, const char *pb, const char *tol_s, const char *tag, bool force,
                   bool json) {
    sd_status st = {0};
    double tol = 2.0;
    receipt_set A = {0}, B = {0};
    receipt_comparison c;
    int rc = 0;
    if (tol_s && !sd_parse_float("--tol", tol_s, 0.0, 100.0, &tol, &st)) rc = sd_cli_fail(cmd, &st);
    else if (receipt_read_any(pa, &A, &st) || receipt_read_any(pb, &B, &st) ||
             receipt_compare(&A, &B, tag, tol, &c, &st))
        rc = sd_cli_fail(cmd, &st);
    else if (c.n_env_diffs && !force) {
        char all[1024] = "";
        for (int i = 0; i < c.n_env_diffs; i++)
            snprintf(all + strlen(all), sizeof all - strlen(all), "%s%s", i ? ", " : "", c.env_diffs[i]);
        fprintf(stderr, "%s: A and B measured different things: %s (--force compares them anyway)\n", cmd, all);
        rc = EXIT_DATA;
    }
    if (!rc) {
        for (int i = 0; i < c.n_env_diffs; i++) fprintf(stderr, "%s: warning: %s differs\n", cmd, c.env_diffs[i]);
        // A trace log has no env line: what it measured cannot be checked, and the user is told.
        for (int s = 0; s < 2; s++)
            if (!c.side[s].has_env)
                fprintf(stderr, "%s: note: %s (%s) is a trace log without an env line: its config, weights, k and "
                                "backend are not checked\n", cmd, s ? "B" : "A", s ? pb : pa);
        char *text = json ? receipt_comparison_json(&c, force) : NULL;
        if (json && text) puts(text);
        else if (!json) receipt_comparison_print(&c, stdout);
        cJSON_free(text);
        if (json && !text) rc = sd_cli_fail(cmd, &(sd_status){SD_ERR_SYS, "out of memory"});
        else if (c.n_over) {
            fprintf(stderr, "%s: %d row(s) differ by more than %.2f pp\n", cmd, c.n_over, tol);
            rc = EXIT_DATA;
        }
    }
    receipt_set_free(&A);
    receipt_set_free(&B);
    return rc;
}

int cmd_receipt(int argc, char **argv) {
    const char *cmd = "specdec receipt";
    sd_args a;
    sd_args_init(&a, cmd, argc, argv);
    if (sd_args_help(&a)) { fputs(HELP, stdout); sd_args_free(&a); return 0; }
    const char *tol_s = sd_args_str(&a, "--tol"), *tag = sd_args_str(&a, "--tag");
    const bool force = sd_args_flag(&a, "--force"), json = sd_args_flag(&a, "--json");
    // Positional arguments: the verb and its files.
    const char *pos[3] = {0};
    int n_pos = 0;
    for (int i = 0; i < argc; i++)
        if (!a.used[i] && argv[i][0] != '-' && n_pos < 3) { pos[n_pos++] = argv[i]; a.used[i] = true; }
    bool ok = sd_args_done(&a);
    sd_args_free(&a);
    if (!ok) return EXIT_USAGE;

    const char *compare_only = tol_s ? "--tol" : tag ? "--tag" : force ? "--force" : json ? "--json" : NULL;
    if (n_pos >= 1 && !strcmp(pos[0], "parse") && compare_only) {
        fprintf(stderr, "%s: %s does nothing with parse (it is an option of compare)\n", cmd, compare_only);
        return EXIT_USAGE;
    }
    if (n_pos == 2 && !strcmp(pos[0], "parse")) {
        sd_status st = {0};
        receipt_set A = {0};
        int rc = receipt_parse_file(pos[1], &A, &st) || receipt_write_jsonl(&A, stdout, &st) ? sd_cli_fail(cmd, &st) : 0;
        receipt_set_free(&A);
        return rc;
    }
    if (n_pos == 3 && !strcmp(pos[0], "compare")) return compare(cmd, pos[1], pos[2], tol_s, tag, force, json);
    fprintf(stderr, "%s: expected 'parse LOG' or 'compare A B [--tol PP] [--force] [--json]' (see --help)\n", cmd);
    return EXIT_USAGE;
}
