// test_plot.c — scripts/plot-receipts renders receipts that specdec itself writes into a PNG:
// the file carries the PNG signature and an image header of the figure's size. Needs python3
// with matplotlib (Debian's python3-matplotlib, installed by .ci/run's deps stage): without it
// the test fails, it does not skip.
#include "cli_harness.h"

TestSuite(plot, .init = make_dir, .fini = remove_dir, .timeout = 300);

// Runs the plot script with args; returns its exit status, stderr into *err (caller frees).
static int plot(const char *const args[], char **err) {
    char script[4096], out[4096], errp[4096];
    const char *src = getenv("SPECDEC_SOURCE_DIR");
    snprintf(script, sizeof script, "%s/scripts/plot-receipts", src && *src ? src : SPECDEC_SOURCE_DIR);
    snprintf(out, sizeof out, "%s", in_dir(".plot.out"));
    snprintf(errp, sizeof errp, "%s", in_dir(".plot.err"));
    char *full[16] = {(char *)SPECDEC_PYTHON3, script};
    int n = 2;
    for (; *args && n < 15; args++) full[n++] = (char *)*args;
    int status = wait_cli(spawn_program(full, out, errp));
    *err = read_file(errp, NULL);
    cr_assert_not_null(*err);
    return status;
}

static uint32_t be32(const unsigned char *p) { return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3]; }

Test(plot, renders_two_receipts_into_a_png) {
    init_model("t", "1", "d", "2", "0.5");
    const char *ks[] = {"3", "2"};
    char rcpt[2][4096];
    for (int i = 0; i < 2; i++) {
        snprintf(rcpt[i], sizeof rcpt[i], "%s/k%s.jsonl", dir, ks[i]);
        const char *argv[] = {"run", "--model", in_dir("t"), "--draft", in_dir("d"), "--k", ks[i], "--prompt", "1,2,3", "--max-new", "40",
                              "--trace", "2", "--receipt", rcpt[i], NULL};
        free(run_ok(argv, NULL));
    }
    char png[4096];
    snprintf(png, sizeof png, "%s", in_dir("receipts.png"));
    char *err;
    const char *args[] = {rcpt[0], rcpt[1], "-o", png, "--labels", "k3,k2", NULL};
    int rc = plot(args, &err);
    cr_assert_eq(rc, 0, "plot-receipts exited %d: %s", rc, err);
    free(err);

    size_t n;
    unsigned char *b = (unsigned char *)read_file(png, &n);
    cr_assert_not_null(b, "no PNG written");
    static const unsigned char signature[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
    cr_assert_gt(n, 33);
    cr_expect_arr_eq(b, signature, 8, "not a PNG signature");
    cr_expect(!memcmp(b + 12, "IHDR", 4), "the first chunk is not IHDR");
    const uint32_t w = be32(b + 16), h = be32(b + 20);
    cr_expect(w >= 800 && w <= 2000 && h >= 500 && h <= 1500, "image %ux%u, expected the 2x2 figure (990x675)", w, h);
    cr_expect(n > 20000 && n < 2000000, "PNG of %zu bytes: not a drawn figure", n);
    free(b);
    cr_expect_eq(count_tmp_files(), 0, "a temporary file was left");
}

Test(plot, bad_input_is_one_line_and_no_file) {
    write_file(in_dir("junk.jsonl"), "{\"kind\":\"env\"}\nnot json\n");
    char png[4096];
    snprintf(png, sizeof png, "%s", in_dir("x.png"));
    char *err;
    const char *args[] = {in_dir("junk.jsonl"), "-o", png, NULL};
    cr_expect_eq(plot(args, &err), 1);
    cr_expect_eq(count_lines(err), 1, "one error line: %s", err);
    cr_expect_not_null(strstr(err, "junk.jsonl:2: not JSON"), "%s", err);
    free(err);
    cr_expect(!exists(png), "a PNG was written for bad input");
}
