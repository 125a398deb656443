// test_op_coverage.c — the op table of test_cuda_ops (tests/test_cuda_ops.c and every file of
// tests/cuda_ops/) covers every exported launcher: each declaration `sd_code sd_cuda_<name>(` in
// kernels/*.h, and `sd_code sd_gemm_<name>(` of the cuBLASLt wrapper (gemm.h), must be named by
// some case's .op string there, and every name a case lists must be declared by a header (a stale
// case fails too). It reads source text only, so it is a CPU suite: it runs, and must pass,
// without a GPU; a file of the table that is missing fails it. The parser is checked first on a
// text whose answer is known (a canary that must fail), so a parser that finds nothing cannot pass.
#include <criterion/criterion.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *src_dir(void) {
    const char *d = getenv("SPECDEC_SOURCE_DIR");
    return d ? d : SPECDEC_SOURCE_DIR;
}

// Names with where each was found, each name once.
typedef struct {
    char name[96];
    char where[96];
} entry;
typedef struct {
    entry *v;
    int n, cap;
} name_list;

static int list_find(const name_list *l, const char *name) {
    for (int i = 0; i < l->n; i++)
        if (strcmp(l->v[i].name, name) == 0) return i;
    return -1;
}
static void list_add(name_list *l, const char *name, size_t len, const char *where) {
    char buf[96];
    snprintf(buf, sizeof buf, "%.*s", (int)len, name);
    if (list_find(l, buf) >= 0) return;
    if (l->n == l->cap) {
        l->cap = l->cap ? 2 * l->cap : 32;
        l->v = realloc(l->v, sizeof(entry) * (size_t)l->cap);
        cr_assert(l->v, "out of memory");
    }
    snprintf(l->v[l->n].name, sizeof l->v[l->n].name, "%s", buf);
    snprintf(l->v[l->n].where, sizeof l->v[l->n].where, "%s", where);
    l->n++;
}
static void list_free(name_list *l) {
    free(l->v);
    *l = (name_list){0};
}

static char *copy_of(const char *s) {
    const size_t n = strlen(s) + 1;
    char *c = malloc(n);
    cr_assert(c, "out of memory");
    return memcpy(c, s, n);
}

static int ident_char(char c) { return c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9'); }
static int space_char(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

// A copy of C source with every comment blanked (string and character literals kept), so a
// commented-out declaration or case does not count.
static char *strip_comments(const char *s) {
    char *o = copy_of(s);
    size_t i = 0;
    while (s[i]) {
        if (s[i] == '"' || s[i] == '\'') {
            const char q = s[i++];
            while (s[i] && s[i] != q) i += s[i] == '\\' && s[i + 1] ? 2 : 1;
            if (s[i]) i++;
        } else if (s[i] == '/' && s[i + 1] == '/') {
            while (s[i] && s[i] != '\n') o[i++] = ' ';
        } else if (s[i] == '/' && s[i + 1] == '*') {
            o[i] = o[i + 1] = ' ';
            i += 2;
            while (s[i] && !(s[i] == '*' && s[i + 1] == '/')) {
                if (s[i] != '\n') o[i] = ' ';
                i++;
            }
            if (s[i]) {
                o[i] = o[i + 1] = ' ';
                i += 2;
            }
        } else {
            i++;
        }
    }
    return o;
}

// The prefixes of exported launchers: the kernels' and the GEMM wrapper's.
static const char *const LAUNCHER_PREFIX[] = {"sd_cuda_", "sd_gemm_"};

static int is_launcher(const char *name, size_t len) {
    for (size_t i = 0; i < sizeof LAUNCHER_PREFIX / sizeof *LAUNCHER_PREFIX; i++) {
        const size_t n = strlen(LAUNCHER_PREFIX[i]);
        if (len > n && strncmp(name, LAUNCHER_PREFIX[i], n) == 0) return 1;
    }
    return 0;
}

// Every launcher declared in header text: the identifier after an `sd_code` token when it starts
// with a LAUNCHER_PREFIX and an opening parenthesis follows (whitespace and line breaks allowed
// between).
static void collect_launchers(const char *text, const char *where, name_list *out) {
    char *t = strip_comments(text);
    for (const char *p = strstr(t, "sd_code"); p; p = strstr(p + 1, "sd_code")) {
        if ((p > t && ident_char(p[-1])) || ident_char(p[7])) continue;
        const char *q = p + 7;
        while (space_char(*q)) q++;
        const char *name = q;
        while (ident_char(*q)) q++;
        const size_t len = (size_t)(q - name);
        while (space_char(*q)) q++;
        if (*q == '(' && is_launcher(name, len)) list_add(out, name, len, where);
    }
    free(t);
}

// Every name in a `.op = "a, b"` initializer of source text (adjacent literals joined), split at
// commas, blanks trimmed; an empty name is kept (it names no launcher, so it fails as stale).
static void collect_cases(const char *text, const char *where, name_list *out) {
    char *t = strip_comments(text);
    for (const char *p = strstr(t, ".op"); p; p = strstr(p + 1, ".op")) {
        const char *q = p + 3;
        if (ident_char(*q)) continue; // .opt, .ops, ...
        while (space_char(*q)) q++;
        if (*q++ != '=') continue;
        while (space_char(*q)) q++;
        char names[512];
        size_t n = 0;
        while (*q == '"') { // one literal, then any adjacent ones
            for (q++; *q && *q != '"' && n + 1 < sizeof names; q++) names[n++] = *q;
            if (*q == '"') q++;
            while (space_char(*q)) q++;
        }
        if (n == 0) continue; // not a string initializer
        names[n] = 0;
        for (char *s = names;;) {
            char *comma = strchr(s, ',');
            char *end = comma ? comma : s + strlen(s);
            while (s < end && space_char(*s)) s++;
            while (end > s && space_char(end[-1])) end--;
            list_add(out, s, (size_t)(end - s), where);
            if (!comma) break;
            s = comma + 1;
        }
    }
    free(t);
}

// Appends one line per problem to msg; returns how many there are.
static int coverage_problems(const name_list *launchers, const name_list *cases, char *msg, size_t cap) {
    int n = 0;
    size_t at = strlen(msg);
#define PROBLEM(...)                                                              \
    do {                                                                          \
        n++;                                                                      \
        if (at < cap) at += (size_t)snprintf(msg + at, cap - at, __VA_ARGS__);    \
    } while (0)
    if (launchers->n == 0) PROBLEM("no launcher found in the headers (a broken parser?)\n");
    if (cases->n == 0) PROBLEM("no case found in the op table (a broken parser?)\n");
    for (int i = 0; i < launchers->n; i++)
        if (list_find(cases, launchers->v[i].name) < 0)
            PROBLEM("%s (declared in %s) has no case in the op table\n", launchers->v[i].name, launchers->v[i].where);
    for (int i = 0; i < cases->n; i++)
        if (list_find(launchers, cases->v[i].name) < 0)
            PROBLEM("the op table names '%s', which no kernels/*.h declares (a stale case)\n", cases->v[i].name);
#undef PROBLEM
    return n;
}

// The whole file; a missing file fails the test (it does not skip).
static char *read_text(const char *path) {
    FILE *f = fopen(path, "rb");
    cr_assert(f, "cannot open %s", path);
    fseek(f, 0, SEEK_END);
    const long size = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = malloc((size_t)size + 1);
    cr_assert(s && size >= 0 && fread(s, 1, (size_t)size, f) == (size_t)size, "cannot read %s", path);
    s[size] = 0;
    fclose(f);
    return s;
}

static int by_name(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }
static int ends_with(const char *s, const char *suffix) {
    const size_t n = strlen(s), ns = strlen(suffix);
    return n > ns && strcmp(s + n - ns, suffix) == 0;
}

// The names of the files of dir (under the source tree) whose names end in one of the suffixes,
// sorted; the caller frees each and the array. A folder that cannot be listed fails the test.
static char **files_of(const char *dir, const char *const *suffixes, int n_suffixes, int *n_out) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", src_dir(), dir);
    DIR *d = opendir(path);
    cr_assert(d, "cannot list %s", path);
    char **names = NULL;
    int n = 0, cap = 0;
    for (struct dirent *e; (e = readdir(d));) {
        for (int i = 0; i < n_suffixes; i++) {
            if (!ends_with(e->d_name, suffixes[i])) continue;
            if (n == cap) {
                cap = cap ? 2 * cap : 32;
                names = realloc(names, sizeof *names * (size_t)cap);
                cr_assert(names, "out of memory");
            }
            names[n++] = copy_of(e->d_name);
            break;
        }
    }
    closedir(d);
    if (n > 1) qsort(names, (size_t)n, sizeof *names, by_name);
    *n_out = n;
    return names;
}

// A text with a known answer: three launchers (one declared twice, two across a line break, one of
// the GEMM wrapper), none of the commented-out or non-sd_code ones; three case names, one of them
// stale; one launcher uncovered.
Test(op_coverage, parser_canary) {
    static const char header[] =
        "// sd_code sd_cuda_commented(int x);\n"
        "/* sd_code sd_cuda_block_commented(void);\n   sd_code sd_cuda_still_comment(int); */\n"
        "sd_code sd_cuda_alpha(const float *x,\n                      int n, cudaStream_t stream, sd_status *st);\n"
        "sd_code\nsd_cuda_beta (int T);\n"
        "void sd_cuda_gamma(int mode);\n"
        "bool sd_cuda_delta_fits(int T);\n"
        "static inline sd_code sd_other(int);\n"
        "typedef sd_code sd_cuda_fn_t;\n"
        "sd_code sd_cuda_alpha(const float *x, int n, cudaStream_t stream, sd_status *st);\n"
        "sd_code sd_gemm_omega(sd_gemm *g,\n                      const sd_gemm_args *a, cudaStream_t stream, sd_status *st);\n"
        "void sd_gemm_free(sd_gemm *g);\n"
        "size_t sd_gemm_plans(const sd_gemm *g);\n";
    static const char table[] =
        "static const op_case CASES[] = {\n"
        "    {.op = \"sd_cuda_alpha\", .run = run_alpha, .shape = {1, 2}},\n"
        "    // {.op = \"sd_cuda_beta\", .run = run_beta},\n"
        "    {.op=\"sd_cuda_alpha, \" \"sd_cuda_stale\", .run = run_alpha},\n"
        "    {.op = \"sd_gemm_omega\", .run = run_omega},\n"
        "};\n"
        "static const char *s = \"/* not a comment */ .op\";\n"
        "static int opt = 0; struct { int ops; } x = {.ops = 1};\n";
    name_list launchers = {0}, cases = {0};
    collect_launchers(header, "canary.h", &launchers);
    collect_cases(table, "canary.c", &cases);
    cr_assert_eq(launchers.n, 3, "launchers found: %d", launchers.n);
    cr_assert(list_find(&launchers, "sd_cuda_alpha") >= 0 && list_find(&launchers, "sd_cuda_beta") >= 0);
    cr_assert(list_find(&launchers, "sd_gemm_omega") >= 0);
    cr_assert_eq(cases.n, 3, "case names found: %d", cases.n);
    cr_assert(list_find(&cases, "sd_cuda_alpha") >= 0 && list_find(&cases, "sd_cuda_stale") >= 0);
    cr_assert(list_find(&cases, "sd_gemm_omega") >= 0);
    char msg[2048] = "";
    cr_assert_eq(coverage_problems(&launchers, &cases, msg, sizeof msg), 2, "%s", msg);
    cr_assert(strstr(msg, "sd_cuda_beta (declared in canary.h) has no case"), "%s", msg);
    cr_assert(strstr(msg, "'sd_cuda_stale'"), "%s", msg);
    name_list none = {0};
    msg[0] = 0;
    cr_assert_eq(coverage_problems(&none, &none, msg, sizeof msg), 2, "%s", msg);
    list_free(&launchers);
    list_free(&cases);
}

// The files of the op table: its main file and every .c and .h file of tests/cuda_ops/ (the run
// functions, the header they share). Any of them may hold cases.
static const char TABLE_MAIN[] = "tests/test_cuda_ops.c", TABLE_DIR[] = "tests/cuda_ops";

Test(op_coverage, every_launcher_has_a_case) {
    static const char *const h[] = {".h"}, *const ch[] = {".c", ".h"};
    int nh, nt;
    char **headers = files_of("kernels", h, 1, &nh), **table = files_of(TABLE_DIR, ch, 2, &nt);
    int n_c = 0;
    for (int i = 0; i < nt; i++) n_c += ends_with(table[i], ".c");
    cr_assert(n_c > 0, "no C file in %s/%s: the op table's run functions are missing", src_dir(), TABLE_DIR);
    name_list launchers = {0}, cases = {0};
    char path[4096], where[96];
    for (int i = 0; i < nh; i++) {
        snprintf(path, sizeof path, "%s/kernels/%s", src_dir(), headers[i]);
        snprintf(where, sizeof where, "kernels/%s", headers[i]);
        char *text = read_text(path);
        collect_launchers(text, where, &launchers);
        free(text);
        free(headers[i]);
    }
    for (int i = -1; i < nt; i++) { // the main file first
        if (i < 0) snprintf(where, sizeof where, "%s", TABLE_MAIN);
        else snprintf(where, sizeof where, "%s/%s", TABLE_DIR, table[i]);
        snprintf(path, sizeof path, "%s/%s", src_dir(), where);
        char *text = read_text(path);
        collect_cases(text, where, &cases);
        free(text);
        if (i >= 0) free(table[i]);
    }
    free(headers);
    free(table);
    char msg[8192] = "";
    const int problems = coverage_problems(&launchers, &cases, msg, sizeof msg);
    cr_log_info("%d launchers in %d headers of kernels/, %d launcher names in the op table (%s and %d files of %s/)",
                launchers.n, nh, cases.n, TABLE_MAIN, nt, TABLE_DIR);
    cr_assert_eq(problems, 0, "the op table (%s, %s/) does not cover kernels/*.h:\n%s", TABLE_MAIN, TABLE_DIR, msg);
    list_free(&launchers);
    list_free(&cases);
}
