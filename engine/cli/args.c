// args.c — argument reading shared by every specdec command.
#include "args.h"
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void sd_args_init(sd_args *a, const char *cmd, int argc, char **argv) {
    a->argc = argc;
    a->argv = argv;
    a->cmd = cmd;
    a->used = calloc((size_t)argc + 1, sizeof *a->used);
    a->missing = NULL;
    a->twice = NULL;
}

void sd_args_free(sd_args *a) { free(a->used); }

static int find(sd_args *a, const char *name) {
    for (int i = 0; i < a->argc; i++)
        if (!a->used[i] && strcmp(a->argv[i], name) == 0) return i;
    return -1;
}

bool sd_args_help(sd_args *a) { return find(a, "--help") >= 0 || find(a, "-h") >= 0; }

// After the first --name was taken: any further --name (with its value) is consumed and recorded
// as given twice, for sd_args_done to report.
static void take_repeats(sd_args *a, const char *name, bool has_value) {
    for (int j; (j = find(a, name)) >= 0;) {
        if (!a->twice) a->twice = a->argv[j];
        a->used[j] = true;
        if (has_value && j + 1 < a->argc) a->used[j + 1] = true;
    }
}

bool sd_args_flag(sd_args *a, const char *name) {
    int i = find(a, name);
    if (i < 0) return false;
    a->used[i] = true;
    take_repeats(a, name, false);
    return true;
}

const char *sd_args_str(sd_args *a, const char *name) {
    int i = find(a, name);
    if (i < 0) return NULL;
    a->used[i] = true;
    if (i + 1 >= a->argc) { // reported by sd_args_done
        a->missing = a->argv[i];
        return NULL;
    }
    a->used[i + 1] = true;
    take_repeats(a, name, true);
    return a->argv[i + 1];
}

bool sd_args_done(sd_args *a) {
    if (a->twice) {
        fprintf(stderr, "%s: option '%s' given twice (give it once; see --help)\n", a->cmd, a->twice);
        return false;
    }
    if (a->missing) {
        char shown[256];
        fprintf(stderr, "%s: option '%s' needs a value (see --help)\n", a->cmd, sd_escape(a->missing, shown, sizeof shown));
        return false;
    }
    for (int i = 0; i < a->argc; i++)
        if (!a->used[i]) {
            char shown[256];
            fprintf(stderr, "%s: unknown option '%s' (see --help)\n", a->cmd, sd_escape(a->argv[i], shown, sizeof shown));
            return false;
        }
    return true;
}

bool sd_parse_int(const char *opt, const char *s, long lo, long hi, long *out, sd_status *st) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (!*s || *end || errno || v < lo || v > hi) {
        char shown[128];
        sd_fail(st, SD_ERR_USAGE, "%s must be an integer in %ld..%ld, got '%s'", opt, lo, hi, sd_escape(s, shown, sizeof shown));
        return false;
    }
    *out = v;
    return true;
}

bool sd_parse_u64(const char *opt, const char *s, uint64_t *out, sd_status *st) {
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (!*s || *end || errno || *s == '-') {
        char shown[128];
        sd_fail(st, SD_ERR_USAGE, "%s must be a non-negative integer, got '%s'", opt, sd_escape(s, shown, sizeof shown));
        return false;
    }
    *out = v;
    return true;
}

bool sd_parse_float(const char *opt, const char *s, double lo, double hi, double *out, sd_status *st) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (!*s || *end || errno || !isfinite(v) || v < lo || v > hi) {
        char shown[128];
        sd_fail(st, SD_ERR_USAGE, "%s must be a number in %g..%g, got '%s'", opt, lo, hi, sd_escape(s, shown, sizeof shown));
        return false;
    }
    *out = v;
    return true;
}

bool sd_parse_int_list(const char *opt, const char *s, int **out, int *n, sd_status *st) {
    int cap = 16, cnt = 0;
    int *v = malloc(sizeof *v * cap);
    const char *p = s;
    while (v && *p) {
        char *end;
        errno = 0;
        long x = strtol(p, &end, 10);
        if (end == p || errno || x < 0 || x > 0x7fffffff || (*end && *end != ',')) break;
        if (cnt == cap) {
            int *g = realloc(v, sizeof *v * (cap *= 2));
            if (!g) break;
            v = g;
        }
        v[cnt++] = (int)x;
        p = *end ? end + 1 : end;
        if (*end && !*p) { p = end; break; } // a trailing comma is junk
    }
    if (!v || *p || cnt == 0) {
        free(v);
        char shown[128];
        sd_fail(st, SD_ERR_USAGE, "%s must be a comma-separated list of token ids, got '%s'", opt, sd_escape(s, shown, sizeof shown));
        return false;
    }
    *out = v;
    *n = cnt;
    return true;
}

int sd_cli_fail(const char *cmd, const sd_status *st) {
    fprintf(stderr, "%s: %s\n", cmd, st->msg);
    return st->code == SD_ERR_USAGE ? EXIT_USAGE : EXIT_DATA;
}
