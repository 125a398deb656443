// test_op_coverage.c — the op table of tests/test_cuda_ops.c covers every exported launcher:
// each declaration `sd_code sd_cuda_<name>(` in kernels/*.h must be named by some case's .op
// string there, and every name a case lists must be declared by a header (a stale case fails
// too). It reads source text only, so it is a CPU suite: it runs, and must pass, without a GPU.
// The parser is checked first on a text whose answer is known (a canary that must fail), so a
// parser that finds nothing cannot pass.
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

// Every launcher declared in header text: the identifier after an `sd_code` token when it starts
// with sd_cuda_ and an opening parenthesis follows (whitespace and line breaks allowed between).
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
        if (*q == '(' && len > 8 && strncmp(name, "sd_cuda_", 8) == 0) list_add(out, name, len, where);
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

// A text with a known answer: two launchers (one declared twice, one across a line break), none
// of the commented-out or non-sd_code ones; two cases, one of them stale; one launcher uncovered.
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
        "sd_code sd_cuda_alpha(const float *x, int n, cudaStream_t stream, sd_status *st);\n";
    static const char table[] =
        "static const op_case CASES[] = {\n"
        "    {.op = \"sd_cuda_alpha\", .run = run_alpha, .shape = {1, 2}},\n"
        "    // {.op = \"sd_cuda_beta\", .run = run_beta},\n"
        "    {.op=\"sd_cuda_alpha, \" \"sd_cuda_stale\", .run = run_alpha},\n"
        "};\n"
        "static const char *s = \"/* not a comment */ .op\";\n"
        "static int opt = 0; struct { int ops; } x = {.ops = 1};\n";
    name_list launchers = {0}, cases = {0};
    collect_launchers(header, "canary.h", &launchers);
    collect_cases(table, "canary.c", &cases);
    cr_assert_eq(launchers.n, 2, "launchers found: %d", launchers.n);
    cr_assert(list_find(&launchers, "sd_cuda_alpha") >= 0 && list_find(&launchers, "sd_cuda_beta") >= 0);
    cr_assert_eq(cases.n, 2, "case names found: %d", cases.n);
    cr_assert(list_find(&cases, "sd_cuda_alpha") >= 0 && list_find(&cases, "sd_cuda_stale") >= 0);
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

Test(op_coverage, every_launcher_has_a_case) {
    char path[4096];
    snprintf(path, sizeof path, "%s/kernels", src_dir());
    DIR *dir = opendir(path);
    cr_assert(dir, "cannot list %s", path);
    char *headers[256];
    int nh = 0;
    for (struct dirent *e; (e = readdir(dir));) {
        const size_t len = strlen(e->d_name);
        if (len > 2 && strcmp(e->d_name + len - 2, ".h") == 0) {
            cr_assert(nh < 256, "too many headers in %s", path);
            headers[nh++] = copy_of(e->d_name);
        }
    }
    closedir(dir);
    qsort(headers, (size_t)nh, sizeof *headers, by_name);
    name_list launchers = {0}, cases = {0};
    for (int i = 0; i < nh; i++) {
        char where[96];
        snprintf(path, sizeof path, "%s/kernels/%s", src_dir(), headers[i]);
        snprintf(where, sizeof where, "kernels/%s", headers[i]);
        char *text = read_text(path);
        collect_launchers(text, where, &launchers);
        free(text);
        free(headers[i]);
    }
    snprintf(path, sizeof path, "%s/tests/test_cuda_ops.c", src_dir());
    char *text = read_text(path);
    collect_cases(text, "tests/test_cuda_ops.c", &cases);
    free(text);
    char msg[8192] = "";
    const int problems = coverage_problems(&launchers, &cases, msg, sizeof msg);
    cr_log_info("%d launchers in %d headers of kernels/, %d launcher names in the op table", launchers.n, nh, cases.n);
    cr_assert_eq(problems, 0, "the op table of tests/test_cuda_ops.c does not cover kernels/*.h:\n%s", msg);
    list_free(&launchers);
    list_free(&cases);
}
