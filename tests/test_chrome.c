// test_chrome.c — the timeline of a burst and its Chrome trace-event JSON (chrome.h): slices
// from the same clocks (drain mode) and the same event pairs (event mode) as the burst's totals,
// so they sum to the trace line; the file is trace-event JSON, written atomically.
#include <criterion/criterion.h>
#include <cjson/cJSON.h>
#include <dirent.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "chrome.h"
#include "trace_rounds.h" // run_round

enum { ROUNDS = 6 };

static void sums(const trace_timeline *t, uint64_t ph[TRACE_N_PHASES], uint64_t bk[TRACE_N_BUCKETS], int count[TRACE_N_PHASES]) {
    memset(ph, 0, sizeof(uint64_t) * TRACE_N_PHASES);
    memset(bk, 0, sizeof(uint64_t) * TRACE_N_BUCKETS);
    memset(count, 0, sizeof(int) * TRACE_N_PHASES);
    for (size_t i = 0; i < t->n; i++) {
        const trace_slice *s = &t->slices[i];
        if (s->phase >= 0) { ph[s->phase] += s->dur_ns; count[s->phase]++; }
        else bk[s->bucket] += s->dur_ns;
    }
}

Test(chrome_timeline, drain_mode_slices_are_the_burst_totals) {
    trace_burst b;
    trace_timeline t = {0};
    trace_burst_begin(&b, 2, 3, NULL, NULL);
    trace_burst_use_timeline(&b, &t);
    for (int r = 0; r < ROUNDS; r++) run_round(&b, r % 4);
    uint64_t ph[TRACE_N_PHASES], bk[TRACE_N_BUCKETS];
    int count[TRACE_N_PHASES];
    sums(&t, ph, bk, count);
    for (int p = 0; p < TRACE_N_PHASES; p++) {
        cr_expect_eq(ph[p], b.phase_ns[p], "phase %d: slices %llu ns, burst %llu ns", p, (unsigned long long)ph[p],
                     (unsigned long long)b.phase_ns[p]);
        cr_expect_eq(count[p], ROUNDS, "phase %d: one slice per round", p);
    }
    for (int k = 0; k < TRACE_N_BUCKETS; k++) cr_expect_eq(bk[k], b.bucket_ns[k], "bucket %d", k);
    cr_assert_eq(t.n_rounds, ROUNDS);
    for (int r = 0; r < ROUNDS; r++) cr_expect_eq(t.rounds[r].accepted, r % 4, "round %d", r);
    cr_expect_eq(t.lost, 0);
    trace_timeline_free(&t);
}

// Fake device events: handle i is the i-th event recorded, and (a, b) "took" (b - a) µs.
static int recorded;
static void *fake_record(void *ctx) { (void)ctx; return (void *)(uintptr_t)(++recorded); }
static double fake_elapsed(void *ctx, void *a, void *b) { (void)ctx; return 1e-3 * (double)((uintptr_t)b - (uintptr_t)a); }
static void fake_release(void *ctx) { (void)ctx; recorded = 0; }

Test(chrome_timeline, event_mode_slices_are_the_event_pairs) {
    trace_events ev = {.record = fake_record, .elapsed_ms = fake_elapsed, .release_all = fake_release};
    recorded = 0;
    trace_burst b;
    trace_timeline t = {0};
    trace_burst_begin(&b, 2, 3, NULL, NULL);
    trace_burst_use_events(&b, &ev);
    trace_burst_use_timeline(&b, &t);
    for (int r = 0; r < ROUNDS; r++) run_round(&b, 1);
    trace_burst_collect(&b);
    uint64_t ph[TRACE_N_PHASES], bk[TRACE_N_BUCKETS];
    int count[TRACE_N_PHASES];
    sums(&t, ph, bk, count);
    for (int k = 0; k < TRACE_N_BUCKETS; k++) {
        cr_expect_eq(bk[k], b.bucket_ns[k], "bucket %d: slices %llu, burst %llu", k, (unsigned long long)bk[k],
                     (unsigned long long)b.bucket_ns[k]);
        cr_expect_gt(bk[k], 0, "bucket %d was timed", k);
    }
    // Each bucket slice sits in its round, at or after the verify start it is anchored to.
    for (size_t i = 0; i < t.n; i++)
        if (t.slices[i].phase < 0)
            cr_expect_geq(t.slices[i].t0_ns, trace_timeline_verify_start(&t, t.slices[i].round), "slice %zu", i);
    trace_timeline_free(&t);
}

// ---- the file ----

static char dir[64];
static void make_dir(void) { strcpy(dir, "/tmp/test_chrome.XXXXXX"); cr_assert_not_null(mkdtemp(dir)); }
static void remove_dir(void) {
    DIR *d = opendir(dir);
    struct dirent *e;
    char p[512];
    while (d && (e = readdir(d)))
        if (e->d_name[0] != '.') { snprintf(p, sizeof p, "%s/%s", dir, e->d_name); unlink(p); }
    if (d) closedir(d);
    rmdir(dir);
}

static cJSON *load(const char *path) {
    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f, "%s not written", path);
    static char buf[1 << 20];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    cJSON *j = cJSON_Parse(buf);
    cr_assert_not_null(j, "%s is not JSON", path);
    return j;
}

static const char *str(const cJSON *o, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsString(v) ? v->valuestring : "";
}

static double num(const cJSON *o, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    cr_assert(cJSON_IsNumber(v), "'%s' missing or not a number", key);
    return v->valuedouble;
}

Test(chrome_file, trace_event_json_that_sums_to_the_trace_line, .init = make_dir, .fini = remove_dir) {
    trace_burst b;
    trace_timeline t = {0};
    trace_burst_begin(&b, 2, 3, NULL, NULL);
    trace_burst_use_timeline(&b, &t);
    for (int r = 0; r < ROUNDS; r++) run_round(&b, r % 4);
    char path[128];
    snprintf(path, sizeof path, "%s/run.json", dir);
    trace_chrome_info info = {.tag = "spec", .k = 3, .target_device = "cpu: test", .draft_device = "cpu: test"};
    sd_status st = {0};
    cr_assert_eq(trace_chrome_write(&t, &info, path, &st), SD_OK, "%s", st.msg);
    DIR *d = opendir(dir);
    struct dirent *e;
    while ((e = readdir(d))) cr_expect_null(strstr(e->d_name, ".tmp."), "temporary %s left", e->d_name);
    closedir(d);

    cJSON *j = load(path);
    const cJSON *events = cJSON_GetObjectItemCaseSensitive(j, "traceEvents"), *ev;
    cr_assert(cJSON_IsArray(events));
    double phase_us[TRACE_N_PHASES] = {0}, bucket_us[TRACE_N_BUCKETS] = {0}, last_ts = -1;
    const char *phases[] = {"draft", "verify", "accept", "rollback", "maintenance"};
    const char *buckets[] = {"vkda", "scan", "vmla", "vffn"};
    int tracks = 0, accepted = 0;
    cJSON_ArrayForEach(ev, events) {
        const char *ph = str(ev, "ph"), *name = str(ev, "name");
        if (!strcmp(ph, "M")) {
            if (!strcmp(name, "thread_name")) {
                const char *track = str(cJSON_GetObjectItemCaseSensitive(ev, "args"), "name");
                tracks += !strcmp(track, "target") || !strcmp(track, "draft");
            }
            continue;
        }
        cr_assert_str_eq(ph, "X", "a complete event");
        cr_expect_geq(num(ev, "ts"), last_ts, "slices in time order");
        last_ts = num(ev, "ts");
        const cJSON *args = cJSON_GetObjectItemCaseSensitive(ev, "args");
        cr_expect(num(args, "round") >= 0 && num(args, "round") < ROUNDS);
        for (int p = 0; p < TRACE_N_PHASES; p++)
            if (!strcmp(name, phases[p])) {
                phase_us[p] += num(ev, "dur");
                cr_expect_eq((int)num(ev, "tid"), p == 0 || p == 4 ? 2 : 1, "%s runs on the %s track", name,
                             p == 0 || p == 4 ? "draft" : "target");
                if (p == TRACE_PHASE_ACCEPT) accepted += (int)num(args, "accepted");
            }
        for (int k = 0; k < TRACE_N_BUCKETS; k++)
            if (!strcmp(name, buckets[k])) bucket_us[k] += num(ev, "dur");
    }
    cr_expect_eq(tracks, 2, "a target and a draft track");
    cr_expect_eq((uint64_t)accepted, b.acc.accepted, "the accept slices carry the accepted counts");

    // The trace line of the same burst: totals at %.2f ms, per-round buckets at %.3f ms.
    char line[1024];
    trace_burst_format(&b, "spec", line, sizeof line);
    double ms[TRACE_N_PHASES], v[TRACE_N_BUCKETS], vrest;
    cr_assert_eq(sscanf(strstr(line, "| draft="), "| draft=%lf verify=%lf accept=%lf roll=%lf maint=%lf", &ms[0], &ms[1], &ms[2],
                        &ms[3], &ms[4]), 5, "%s", line);
    cr_assert_eq(sscanf(strstr(line, "vkda="), "vkda=%lf (scan=%lf) vmla=%lf vrest=%lf (vffn=%lf)", &v[0], &v[1], &v[2], &vrest,
                        &v[3]), 5, "%s", line);
    for (int p = 0; p < TRACE_N_PHASES; p++)
        cr_expect_leq(fabs(phase_us[p] / 1000 - ms[p]), 0.005 + 1e-9, "%s: slices %.4f ms, line %.2f", phases[p], phase_us[p] / 1000, ms[p]);
    for (int k = 0; k < TRACE_N_BUCKETS; k++)
        cr_expect_leq(fabs(bucket_us[k] / 1000 / ROUNDS - v[k]), 0.0005 + 1e-9, "%s per round: slices %.5f, line %.3f", buckets[k],
                      bucket_us[k] / 1000 / ROUNDS, v[k]);
    cJSON_Delete(j);
    trace_timeline_free(&t);
}

Test(chrome_file, unwritable_path_is_a_clear_error) {
    trace_timeline t = {0};
    trace_chrome_info info = {.k = 1};
    sd_status st = {0};
    cr_expect_eq(trace_chrome_write(&t, &info, "/nonexistent-dir/c.json", &st), SD_ERR_SYS);
    cr_expect_not_null(strstr(st.msg, "/nonexistent-dir/c.json"), "%s", st.msg);
}
