// cli_harness.h — what the suites that drive the specdec binary share: a private mkdtemp folder
// per test, running `specdec ...` with stdout and stderr captured, file helpers, and tiny models
// made by `specdec init` (configs/tiny.json).
#pragma once
#include <criterion/criterion.h>
#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <spawn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

// Each suite uses some of these helpers; the rest are not an error.
#define HARNESS static __attribute__((unused))

#define TINY_VOCAB 64
#define TINY_LAYERS 4

// ---- paths ----

HARNESS const char *bin(void) {
    const char *b = getenv("SPECDEC_BIN");
    return b && *b ? b : SPECDEC_BIN;
}

HARNESS const char *tiny_config(void) {
    static char p[4096];
    const char *d = getenv("SPECDEC_SOURCE_DIR");
    snprintf(p, sizeof p, "%s/configs/tiny.json", d && *d ? d : SPECDEC_SOURCE_DIR);
    return p;
}

// ---- the private folder ----

static char dir[64];

HARNESS void rm_tree(const char *path) {
    struct stat sb;
    if (lstat(path, &sb) != 0) return;
    if (S_ISDIR(sb.st_mode)) {
        DIR *d = opendir(path);
        if (d) {
            struct dirent *e;
            char p[4096];
            while ((e = readdir(d))) {
                if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
                if ((size_t)snprintf(p, sizeof p, "%s/%s", path, e->d_name) < sizeof p) rm_tree(p);
            }
            closedir(d);
        }
        rmdir(path);
    } else {
        unlink(path);
    }
}

HARNESS void make_dir(void) {
    strcpy(dir, "/tmp/test_cli.XXXXXX");
    cr_assert_not_null(mkdtemp(dir), "mkdtemp: %s", strerror(errno));
    // Trace flags from the caller's environment must not leak into the cases.
    unsetenv("SPECDEC_SPEC_TRACE");
    unsetenv("SPECDEC_KIMI_LINEAR_SPEC_TRACE");
}

HARNESS void remove_dir(void) {
    if (dir[0]) rm_tree(dir);
}

// dir/name; a rotation of 32 buffers so one call can hold several (copy what must live longer).
HARNESS const char *in_dir(const char *name) {
    static char p[32][4096];
    static int next;
    char *s = p[next++ % 32];
    snprintf(s, 4096, "%s/%s", dir, name);
    return s;
}

HARNESS bool exists(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0;
}

HARNESS char *read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap + 1);
    size_t got;
    while (buf && (got = fread(buf + n, 1, cap - n, f)) > 0) {
        n += got;
        if (n == cap) {
            char *g = realloc(buf, (cap *= 2) + 1);
            if (!g) { free(buf); buf = NULL; }
            else buf = g;
        }
    }
    fclose(f);
    if (!buf) return NULL;
    buf[n] = '\0';
    if (len) *len = n;
    return buf;
}

HARNESS void write_file(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f, "cannot write %s", path);
    fputs(text, f);
    fclose(f);
}

HARNESS bool same_bytes(const char *a, const char *b) {
    size_t na, nb;
    char *x = read_file(a, &na), *y = read_file(b, &nb);
    cr_assert_not_null(x, "cannot read %s", a);
    cr_assert_not_null(y, "cannot read %s", b);
    bool same = na == nb && memcmp(x, y, na) == 0;
    free(x);
    free(y);
    return same;
}

HARNESS int count_tmp_files(void) {
    DIR *d = opendir(dir);
    cr_assert_not_null(d);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d))) n += strstr(e->d_name, ".tmp.") != NULL;
    closedir(d);
    return n;
}

HARNESS int count_lines(const char *s) {
    int n = 0;
    for (; *s; s++) n += *s == '\n';
    return n;
}

// ---- running the binary ----

// Start the program full[0] with arguments full[1..] (NULL-terminated), stdin from /dev/null
// and stdout, stderr to the given files; returns its pid.
HARNESS pid_t spawn_program(char *const full[], const char *out_path, const char *err_path) {
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_addopen(&fa, STDOUT_FILENO, out_path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    posix_spawn_file_actions_addopen(&fa, STDERR_FILENO, err_path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    pid_t pid;
    int rc = posix_spawn(&pid, full[0], &fa, NULL, full, environ);
    posix_spawn_file_actions_destroy(&fa);
    cr_assert_eq(rc, 0, "posix_spawn %s: %s", full[0], strerror(rc));
    return pid;
}

// Start `specdec argv[0] argv[1] ...` (argv NULL-terminated, without the program name).
HARNESS pid_t spawn_cli(const char *const argv[], const char *out_path, const char *err_path) {
    int argc = 0;
    while (argv[argc]) argc++;
    char **full = calloc((size_t)argc + 2, sizeof *full);
    cr_assert_not_null(full);
    full[0] = (char *)bin();
    for (int i = 0; i < argc; i++) full[i + 1] = (char *)argv[i];
    pid_t pid = spawn_program(full, out_path, err_path);
    free(full);
    return pid;
}

// The exit status of a spawned child, or -N when signal N killed it.
HARNESS int wait_cli(pid_t pid) {
    int status;
    while (waitpid(pid, &status, 0) < 0) cr_assert_eq(errno, EINTR, "waitpid: %s", strerror(errno));
    return WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
}

// Run `specdec argv...` to the end; stdout and stderr are captured through files in the private
// folder into malloc'd strings (caller frees). Returns the exit status, or 128 + N when signal N
// killed the child.
HARNESS int run_cli(const char *const argv[], char **out, char **err) {
    static int seq;
    char out_path[4096], err_path[4096];
    snprintf(out_path, sizeof out_path, "%s/.stdout.%d", dir, seq);
    snprintf(err_path, sizeof err_path, "%s/.stderr.%d", dir, seq++);
    int status = wait_cli(spawn_cli(argv, out_path, err_path));
    if (status < 0) status = 128 - status;
    char *o = read_file(out_path, NULL), *e = read_file(err_path, NULL);
    cr_assert_not_null(o);
    cr_assert_not_null(e);
    unlink(out_path);
    unlink(err_path);
    if (out) *out = o; else free(o);
    if (err) *err = e; else free(e);
    return status;
}

// Run and expect exit 0; returns stdout (caller frees), stderr optional.
HARNESS char *run_ok(const char *const argv[], char **err) {
    char *out, *e;
    int rc = run_cli(argv, &out, &e);
    cr_assert_eq(rc, 0, "`specdec %s ...` exited %d; stderr: %s", argv[0], rc, e);
    if (err) *err = e; else free(e);
    return out;
}

// Expect exit `code` with exactly one line on stderr (containing `needle` when not NULL) and
// nothing on stdout. `what` names the case in the failure message.
HARNESS void expect_fail(const char *what, const char *const argv[], int code, const char *needle) {
    char *out, *err;
    int rc = run_cli(argv, &out, &err);
    cr_expect_eq(rc, code, "%s: exit %d, expected %d; stderr: %s", what, rc, code, err);
    cr_expect_eq(count_lines(err), 1, "%s: expected one stderr line, got: <<%s>>", what, err);
    cr_expect(err[0] && err[strlen(err) - 1] == '\n', "%s: stderr line not terminated: <<%s>>", what, err);
    cr_expect_str_empty(out, "%s: expected nothing on stdout, got: <<%s>>", what, out);
    if (needle) cr_expect(strstr(err, needle) != NULL, "%s: stderr does not mention '%s': <<%s>>", what, needle, err);
    free(out);
    free(err);
}

// ---- models ----

// `specdec init` of tiny.json into dir/name (seed), optionally with the derived draft.
HARNESS void init_model(const char *name, const char *seed, const char *draft, const char *layers, const char *tail) {
    const char *m = in_dir(name);
    if (draft) {
        const char *d = in_dir(draft);
        const char *argv[] = {"init", "--config", tiny_config(), "--out", m, "--seed", seed,
                              "--draft-out", d, "--draft-layers", layers, "--tail-scale", tail, NULL};
        free(run_ok(argv, NULL));
    } else {
        const char *argv[] = {"init", "--config", tiny_config(), "--out", m, "--seed", seed, NULL};
        free(run_ok(argv, NULL));
    }
}

HARNESS cJSON *parse_json_file(const char *path) {
    char *txt = read_file(path, NULL);
    cr_assert_not_null(txt, "cannot read %s", path);
    cJSON *j = cJSON_Parse(txt);
    free(txt);
    cr_assert_not_null(j, "%s: not JSON", path);
    return j;
}

// stdout of `run --json`: exactly one line holding one JSON object.
HARNESS cJSON *parse_run_json(const char *out) {
    cr_assert_eq(count_lines(out), 1, "expected one line on stdout, got: <<%s>>", out);
    const char *end = NULL;
    cJSON *j = cJSON_ParseWithOpts(out, &end, 0);
    cr_assert_not_null(j, "stdout is not JSON: <<%s>>", out);
    cr_assert(cJSON_IsObject(j), "stdout is not a JSON object: <<%s>>", out);
    while (end && (*end == '\n' || *end == ' ' || *end == '\r')) end++;
    cr_assert(end && *end == '\0', "trailing text after the JSON object: <<%s>>", end ? end : "");
    return j;
}

HARNESS double num(const cJSON *j, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, key);
    cr_assert(cJSON_IsNumber(v), "JSON field '%s' missing or not a number", key);
    return v->valuedouble;
}

// tokens[] of a run's JSON; returns the count.
HARNESS int json_tokens(const cJSON *j, int *out, int cap) {
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(j, "tokens");
    cr_assert(cJSON_IsArray(t), "JSON field 'tokens' missing or not an array");
    int n = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, t) {
        cr_assert(cJSON_IsNumber(e), "a token is not a number");
        cr_assert_lt(n, cap);
        out[n++] = e->valueint;
    }
    return n;
}

