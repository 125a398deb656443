// fuzz_cli.c — the CLI's option reading and value parsers on arbitrary argument vectors: the
// input split at NUL bytes into argv, read by `specdec run`'s option reader (run_parse: the
// table, each group's checks, the mode rules, token lists) and by the shared parsers. Every
// vector is accepted or refused with one line; never a crash. (--prompt-file opens only regular
// files, so a name such as /dev/stdin cannot block the run.)
#include <fcntl.h>
#include <string.h>
#include "args.h" // sd_parse_*
#include "fuzz_input.h"
#include "run_options.h" // run_parse

#define MAX_ARGS 64

static int quiet; // /dev/null: where the usage lines go while run_parse reads (crash reports stay on stderr)

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    if (!freopen("/dev/null", "w", stdout)) abort(); // --help text
    quiet = open("/dev/null", O_WRONLY | O_CLOEXEC);
    if (quiet < 0) abort();
    unsetenv("SPECDEC_DECODE_GRAPH");
    unsetenv("SPECDEC_GRAPH_SEL_LEDGER");
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *text = fuzz_text(data, size);
    char *argv[MAX_ARGS + 1];
    int argc = 0;
    for (char *p = text; argc < MAX_ARGS && p <= text + size; p += strlen(p) + 1) argv[argc++] = p;
    argv[argc] = NULL;

    run_opts o;
    memset(&o, 0, sizeof o);
    fflush(stderr);
    int saved = dup(2);
    dup2(quiet, 2);
    const int rc = run_parse(argc, argv, &o);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    if (rc == 0) free(o.prompt);

    sd_status st = {0};
    long l;
    uint64_t u;
    double d;
    int *ids, n;
    sd_parse_int("--n", argv[0], -5, 1L << 40, &l, &st);
    sd_parse_u64("--seed", argv[0], &u, &st);
    sd_parse_float("--t", argv[0], 0.0, 1e6, &d, &st);
    if (sd_parse_int_list("--prompt", argv[0], &ids, &n, &st)) free(ids);
    if (strchr(st.msg, '\n')) abort(); // an echoed value never breaks the error line
    free(text);
    return 0;
}
