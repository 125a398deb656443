// test_cuda_chrome.c — the Chrome trace's slices on the GPU (chrome.h): in drain mode (the CLI's
// level 2) and in event mode (CUDA events around the buckets, events.h) every phase's and
// bucket's slices sum exactly to the burst's totals, and an event-mode bucket slice lies inside
// its round's verify slice. Without a device every test reports itself skipped.
#include <stdbool.h>
#include <string.h>
#include "common.h"
#include "chrome.h"
#include "spec.h"

#if !SPECDEC_HAVE_CUDA
Test(cuda_chrome, suite) { cr_skip_test("CUDA backend not built (no toolkit or -DSPECDEC_CUDA=OFF): GPU suite skipped"); }
#else
#include "cuda_backend.h" // sd_cuda_device_count, sd_cuda_model_upload
#include "events.h"       // sd_cuda_event_pool

enum { N_PROMPT = 9, N_NEW = 40, K = 4 };

// The toy target or its derived draft (the first 2 layers), synthesised and uploaded.
static void device_model(const sd_config *cfg, int depth, sd_model *dev) {
    sd_synth_opts o = {.seed = 21, .dtype = SD_DT_BF16, .tail_from = 2, .tail_scale = 0.1f, .depth = depth};
    sd_model host;
    sd_status st = {0};
    cr_assert_eq(sd_synth_model(&host, cfg, &o, &st), SD_OK, "%s", st.msg);
    cr_assert_eq(sd_cuda_model_upload(&host, dev, &st), SD_OK, "%s", st.msg);
    sd_model_free(&host);
}

static void sync_pair(void *ctx) {
    sd_model **m = ctx;
    sd_model_sync(m[0]);
    sd_model_sync(m[1]);
}

// A level-2 burst of the toy pair on the GPU with a timeline; event mode when events is set.
static void traced_burst(bool events, trace_burst *tb, trace_timeline *tl) {
    if (sd_cuda_device_count() == 0) cr_skip_test("no CUDA device: GPU suite skipped");
    sd_config cfg, dcfg;
    load_config("configs/toy.json", &cfg);
    sd_status st = {0};
    cr_assert_eq(sd_draft_config(&cfg, 2, &dcfg, &st), SD_OK);
    sd_model t, d, *both[2] = {&t, &d};
    device_model(&cfg, cfg.num_hidden_layers, &t);
    device_model(&dcfg, cfg.num_hidden_layers, &d);
    sd_cuda_event_pool pool;
    if (events) cr_assert_eq(sd_cuda_events_init(&pool, &t, TRACE_MAX_EVENT_PAIRS * 2, &st), SD_OK, "%s", st.msg);
    int prompt[N_PROMPT], out[N_NEW];
    random_tokens(5, t.cfg.vocab_size, N_PROMPT, prompt);
    sd_state ts, ds;
    cr_assert_eq(sd_model_state_init(&t, &ts, N_PROMPT + N_NEW + K + 1, K + 1, &st), SD_OK);
    cr_assert_eq(sd_model_state_init(&d, &ds, N_PROMPT + N_NEW + K + 1, K, &st), SD_OK);
    trace_burst_begin(tb, 2, K, sync_pair, both);
    if (events) trace_burst_use_events(tb, &pool.hooks);
    trace_burst_use_timeline(tb, tl);
    sd_spec_opts o = {.k = K, .trace = tb};
    sd_accept_stats stats = {0};
    cr_assert_eq(sd_spec_generate(&t, &ts, &d, &ds, prompt, N_PROMPT, N_NEW, &o, out, &stats, &st), SD_OK, "%s", st.msg);
    trace_burst_collect(tb);
    cr_assert_eq(tb->pairs_lost, 0, "the pool timed every bucket");
    if (events) sd_cuda_events_free(&pool);
    sd_state_free(&ts);
    sd_state_free(&ds);
    sd_model_free(&t);
    sd_model_free(&d);
}

static void expect_slices_are_the_totals(const trace_burst *tb, const trace_timeline *tl) {
    uint64_t ph[TRACE_N_PHASES] = {0}, bk[TRACE_N_BUCKETS] = {0};
    for (size_t i = 0; i < tl->n; i++) {
        if (tl->slices[i].phase >= 0) ph[tl->slices[i].phase] += tl->slices[i].dur_ns;
        else bk[tl->slices[i].bucket] += tl->slices[i].dur_ns;
    }
    for (int p = 0; p < TRACE_N_PHASES; p++) cr_expect_eq(ph[p], tb->phase_ns[p], "phase %d", p);
    for (int k = 0; k < TRACE_N_BUCKETS; k++) {
        cr_expect_eq(bk[k], tb->bucket_ns[k], "bucket %d", k);
        cr_expect_gt(bk[k], 0, "bucket %d was timed on the device", k);
    }
    cr_expect_eq(tl->n_rounds, tb->acc.rounds);
    cr_expect_eq(tl->lost, 0);
}

Test(cuda_chrome, drain_mode_slices_are_the_totals) {
    static trace_burst tb;
    trace_timeline tl = {0};
    traced_burst(false, &tb, &tl);
    expect_slices_are_the_totals(&tb, &tl);
    trace_timeline_free(&tl);
}

Test(cuda_chrome, event_mode_slices_are_the_event_pairs_inside_verify) {
    static trace_burst tb;
    trace_timeline tl = {0};
    traced_burst(true, &tb, &tl);
    expect_slices_are_the_totals(&tb, &tl);
    uint64_t verify_end[N_NEW + 1] = {0};
    for (size_t i = 0; i < tl.n; i++)
        if (tl.slices[i].phase == TRACE_PHASE_VERIFY) verify_end[tl.slices[i].round] = tl.slices[i].t0_ns + tl.slices[i].dur_ns;
    const uint64_t slack_ns = 1000; // the ms → ns roundings of two event intervals
    for (size_t i = 0; i < tl.n; i++) {
        const trace_slice *s = &tl.slices[i];
        if (s->phase >= 0) continue;
        cr_expect_geq(s->t0_ns, trace_timeline_verify_start(&tl, s->round), "slice %zu starts before its verify", i);
        cr_expect_leq(s->t0_ns + s->dur_ns, verify_end[s->round] + slack_ns, "slice %zu ends after its verify", i);
    }
    trace_timeline_free(&tl);
}
#endif
