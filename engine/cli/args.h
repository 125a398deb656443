// args.h — the small argument reader every command shares: `--name value` and `--flag`,
// one-line usage errors (exit 2), and the value parsers.
#pragma once
#include <stdbool.h>
#include <stdint.h>
#include "status.h" // sd_status

enum { EXIT_DATA = 1, EXIT_USAGE = 2 };

typedef struct {
    int argc;
    char **argv;
    const char *cmd;   // "specdec run", for messages
    bool *used;        // argv[i] consumed
    const char *missing; // an option given without its value
    const char *twice;   // an option given more than once
} sd_args;

void sd_args_init(sd_args *a, const char *cmd, int argc, char **argv);
void sd_args_free(sd_args *a);
bool sd_args_help(sd_args *a);                          // --help / -h present
bool sd_args_flag(sd_args *a, const char *name);        // --name present
const char *sd_args_str(sd_args *a, const char *name);  // --name VALUE, NULL when absent
// An option is given at most once: a second --name (flag or value) is a usage error, never "the
// last one wins", so a command line says one thing.
// Call after reading every option, before any work: an option without its value, an option given
// twice or a leftover argument prints one line ("CMD: option '--k' given twice (see --help)",
// "... needs a value", "CMD: unknown option 'X' (see --help)") and returns false.
bool sd_args_done(sd_args *a);

// Value parsers: false (with a usage message in st naming the option) on junk or out of range.
bool sd_parse_int(const char *opt, const char *s, long lo, long hi, long *out, sd_status *st);
bool sd_parse_u64(const char *opt, const char *s, uint64_t *out, sd_status *st);
bool sd_parse_float(const char *opt, const char *s, double lo, double hi, double *out, sd_status *st);
// "1,2,3" → malloc'd ints (each in 0..max-1 when max > 0).
bool sd_parse_int_list(const char *opt, const char *s, int **out, int *n, sd_status *st);

// Print "CMD: msg" to stderr and return the exit code for st->code.
int sd_cli_fail(const char *cmd, const sd_status *st);
