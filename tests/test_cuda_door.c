// test_cuda_door.c — the decode-graph door (engine/cuda/cuda_door.h) against the eager rounds,
// bit for bit: the tokens of a speculative run for k = 1..8, greedy and sampled with one seed,
// and the logits of the last verify pass; plain decode steps likewise; on toy and tiny configs
// (F32 and BF16 weights); with the trace at levels 1 and 2 (the graphs cut at the phases, event
// nodes in verify); with the selection ledger armed (the same bits, and the device slots equal
// to the eager arm's host-read rows). The door refuses the eager MoE arm and host states.
// Without a device every test reports itself skipped.
#include <math.h>
#include <string.h>
#include "common.h"
#include "decode.h"
#include "spec.h"

#if !SPECDEC_HAVE_CUDA
Test(cuda_door, suite) { cr_skip_test("CUDA backend not built (no toolkit or -DSPECDEC_CUDA=OFF): GPU suite skipped"); }
#else
#include <cuda_runtime_api.h>
#include "cuda_harness.h" // device_pair
#include "cuda_door.h"
#include "events.h" // sd_cuda_event_pool
#include "ledger.h"

static void need_gpu(void) {
    if (sd_cuda_device_count() == 0) cr_skip_test("no CUDA device: GPU suite skipped");
}

enum { N_PROMPT = 9, N_NEW = 40 };

static float *scratch_logits(const sd_state *s, int rows, int V) {
    float *h = malloc(sizeof(float) * (size_t)rows * V);
    cr_assert_eq(cudaMemcpy(h, s->scratch.logits, sizeof(float) * (size_t)rows * V, cudaMemcpyDeviceToHost), cudaSuccess);
    return h;
}

// A speculative run through the door: prefill both states, then rounds until n tokens.
static void door_generate(const sd_model *t, sd_state *ts, const sd_model *d, sd_state *ds, const int *prompt,
                          const sd_cuda_door_opts *o, int *out) {
    sd_status st = {0};
    cr_assert_eq(sd_prefill(t, ts, prompt, N_PROMPT - 1, NULL, &st), SD_OK, "%s", st.msg);
    cr_assert_eq(sd_prefill(d, ds, prompt, N_PROMPT - 1, NULL, &st), SD_OK, "%s", st.msg);
    sd_cuda_door *door;
    cr_assert_eq(sd_cuda_door_open(t, ts, d, ds, o, &door, &st), SD_OK, "%s", st.msg);
    int emit[SD_SPEC_MAX_K + 1], n = 0, x = prompt[N_PROMPT - 1];
    for (int done = 0, round = 0; done < N_NEW; round++) {
        cr_assert_eq(sd_cuda_door_round(door, x, (uint32_t)round, emit, &n, &st), SD_OK, "%s", st.msg);
        for (int i = 0; i <= n && done < N_NEW; i++) out[done++] = emit[i];
        x = emit[n];
    }
    sd_cuda_door_close(door);
}

// Eager run and door run of one (config, k, temperature): the same tokens, the same last logits.
static void check_spec(const char *config, int bf16, int k, float temperature, int trace_level, bool ledger_on) {
    sd_model t, d;
    device_pair(config, 2, 0.3f, bf16, &t, &d);
    const int V = t.cfg.vocab_size, cap = N_PROMPT + N_NEW + 2 * (k + 1);
    int prompt[N_PROMPT], want[N_NEW], got[N_NEW];
    random_tokens(4 + k, V, N_PROMPT, prompt);
    sd_status st = {0};
    sd_state ts, ds;
    cr_assert_eq(sd_model_state_init(&t, &ts, cap, k + 1, &st), SD_OK);
    cr_assert_eq(sd_model_state_init(&d, &ds, cap, k + 1, &st), SD_OK);
    sd_spec_opts so = {.k = k, .temperature = temperature, .seed = 77};
    sd_accept_stats stats = {0};
    cr_assert_eq(sd_spec_generate(&t, &ts, &d, &ds, prompt, N_PROMPT, N_NEW, &so, want, &stats, &st), SD_OK, "%s", st.msg);
    float *lw = scratch_logits(&ts, k + 1, V);
    sd_state_free(&ts);
    sd_state_free(&ds);

    cr_assert_eq(sd_model_state_init(&t, &ts, cap, k + 1, &st), SD_OK);
    cr_assert_eq(sd_model_state_init(&d, &ds, cap, k + 1, &st), SD_OK);
    trace_burst tb;
    trace_burst_begin(&tb, trace_level, k, t.backend->sync, t.backend->sync_ctx);
    sd_cuda_event_pool pool = {0};
    if (trace_level >= 2) {
        cr_assert_eq(sd_cuda_events_init(&pool, &t, 64, &st), SD_OK, "%s", st.msg);
        trace_burst_use_events(&tb, &pool.hooks);
    }
    ledger L;
    ledger_init(&L, sd_cuda_ledger_device(), ledger_on);
    sd_cuda_door_opts o = {.k = k, .temperature = temperature, .seed = 77, .trace = trace_level ? &tb : NULL,
                           .ledger = ledger_on ? &L : NULL};
    door_generate(&t, &ts, &d, &ds, prompt, &o, got);
    for (int i = 0; i < N_NEW; i++)
        cr_assert_eq(got[i], want[i], "%s k=%d T=%.1f trace %d ledger %d: token %d is %d through the door, %d eager", config,
                     k, temperature, trace_level, ledger_on, i, got[i], want[i]);
    float *lg = scratch_logits(&ts, k + 1, V);
    cr_assert(!memcmp(lg, lw, sizeof(float) * (size_t)(k + 1) * V), "%s k=%d T=%.1f: the last verify's logits differ", config,
              k, temperature);
    if (trace_level) {
        trace_burst_collect(&tb);
        cr_assert(tb.phase_ns[TRACE_PHASE_DRAFT] > 0 && tb.phase_ns[TRACE_PHASE_VERIFY] > 0, "the phases are timed");
        if (trace_level >= 2)
            cr_assert(tb.bucket_ns[TRACE_BUCKET_VKDA] > 0 && tb.bucket_ns[TRACE_BUCKET_VFFN] > 0,
                      "level-2 buckets tick from the events inside the verify graph");
    }
    if (ledger_on) cr_assert(L.device_entries > 0, "the device arm recorded");
    cr_log_info("%s k=%d T=%.1f trace %d: %d tokens, acceptance %.2f", config, k, temperature, trace_level, N_NEW,
                sd_stats_acceptance_rate(&stats));
    ledger_free(&L);
    if (pool.ev) sd_cuda_events_free(&pool);
    free(lw);
    free(lg);
    sd_state_free(&ts);
    sd_state_free(&ds);
    sd_model_free(&d);
    sd_model_free(&t);
}

Test(cuda_door, spec_greedy_toy_k1_to_8, .timeout = 600) {
    need_gpu();
    for (int k = 1; k <= 8; k++) check_spec("configs/toy.json", 1, k, 0.0f, 0, false);
}
Test(cuda_door, spec_sampled_toy_k1_to_8, .timeout = 600) {
    need_gpu();
    for (int k = 1; k <= 8; k++) check_spec("configs/toy.json", 1, k, 0.8f, 0, false);
}
Test(cuda_door, spec_greedy_and_sampled_tiny, .timeout = 600) {
    need_gpu();
    for (int k = 1; k <= 8; k++) {
        check_spec("configs/tiny.json", 0, k, 0.0f, 0, false);
        check_spec("configs/tiny.json", 1, k, 0.7f, 0, false);
    }
}
Test(cuda_door, spec_with_trace_levels_and_ledger, .timeout = 600) {
    need_gpu();
    check_spec("configs/toy.json", 1, 4, 0.0f, 1, false);
    check_spec("configs/toy.json", 1, 4, 0.8f, 2, false);
    check_spec("configs/toy.json", 1, 3, 0.0f, 0, true);
}

// Plain decode steps through the door against sd_decode.
static void check_plain(const char *config, int bf16, float temperature) {
    sd_model t, d;
    device_pair(config, 2, 0.3f, bf16, &t, &d);
    sd_model_free(&d);
    const int V = t.cfg.vocab_size;
    int prompt[N_PROMPT], want[N_NEW], got[N_NEW];
    random_tokens(9, V, N_PROMPT, prompt);
    sd_status st = {0};
    sd_state s;
    cr_assert_eq(sd_model_state_init(&t, &s, N_PROMPT + N_NEW, 4, &st), SD_OK);
    cr_assert_eq(sd_decode(&t, &s, prompt, N_PROMPT, N_NEW, temperature, 5, NULL, want, &st), SD_OK, "%s", st.msg);
    float *lw = scratch_logits(&s, 1, V);
    sd_state_free(&s);
    cr_assert_eq(sd_model_state_init(&t, &s, N_PROMPT + N_NEW, 4, &st), SD_OK);
    cr_assert_eq(sd_prefill(&t, &s, prompt, N_PROMPT - 1, NULL, &st), SD_OK);
    sd_cuda_door *door;
    const sd_cuda_door_opts o = {.temperature = temperature, .seed = 5};
    cr_assert_eq(sd_cuda_door_open(&t, &s, NULL, NULL, &o, &door, &st), SD_OK, "%s", st.msg);
    int tok = prompt[N_PROMPT - 1];
    for (int i = 0; i < N_NEW; i++) {
        cr_assert_eq(sd_cuda_door_step(door, tok, &got[i], &st), SD_OK, "%s", st.msg);
        tok = got[i];
        cr_assert_eq(got[i], want[i], "%s T=%.1f: step %d gives %d through the door, %d eager", config, temperature, i, got[i],
                     want[i]);
    }
    sd_cuda_door_close(door);
    // The last step's logits (greedy: a sampled eager step softmaxes them in place in the scratch).
    float *lg = scratch_logits(&s, 1, V);
    if (temperature <= 0.0f)
        cr_assert(!memcmp(lg, lw, sizeof(float) * V), "%s: the last step's logits differ", config);
    free(lg);
    free(lw);
    sd_state_free(&s);
    sd_model_free(&t);
}

Test(cuda_door, plain_greedy_and_sampled, .timeout = 300) {
    need_gpu();
    check_plain("configs/toy.json", 1, 0.0f);
    check_plain("configs/toy.json", 1, 0.9f);
    check_plain("configs/tiny.json", 0, 0.0f);
}

// The ledger's device arm inside the round graphs against the eager arm's host-read rows.
typedef struct {
    ledger *L;
    int dev, K, last_pos0;
} gate_ctx;
static void on_route(void *ctx, int layer, int pos, const int *sel, const float *w, int k, float margin) {
    gate_ctx *g = ctx;
    sd_status st = {0};
    cr_assert_eq(ledger_record_host(g->L, g->dev, layer, pos, sel, w, k, margin, &st), SD_OK, "%s", st.msg);
}
static ledger_row *g_rows;
static size_t g_n_rows;
static void after_target(void *ctx, int pos0, int T) {
    gate_ctx *g = ctx;
    sd_status st = {0};
    g->last_pos0 = pos0;
    cr_assert_eq(ledger_drain_device(g->L, g->dev, pos0, T, g->K, &g_rows, &g_n_rows, &st), SD_OK, "%s", st.msg);
}

Test(cuda_door, ledger_device_slots_equal_the_host_oracle, .timeout = 300) {
    need_gpu();
    sd_model t, d;
    device_pair("configs/toy.json", 2, 0.3f, 1, &t, &d);
    const int k = 3, V = t.cfg.vocab_size, K = t.cfg.num_experts_per_token, cap = N_PROMPT + N_NEW + 2 * (k + 1);
    const int dev = sd_cuda_backend_of(&t)->device;
    int prompt[N_PROMPT], got[N_NEW];
    random_tokens(31, V, N_PROMPT, prompt);
    sd_status st = {0};
    ledger L;
    ledger_init(&L, sd_cuda_ledger_device(), true);
    gate_ctx g = {.L = &L, .dev = dev, .K = K};
    int n_moe = 0; // the slots exist before any record (the door would make them only when it opens)
    for (int i = 0; i < t.cfg.num_hidden_layers; i++)
        if (sd_config_is_moe(&t.cfg, i)) {
            cr_assert_eq(ledger_prearm(&L, dev, i, (k + 1) * K, &st), SD_OK, "%s", st.msg);
            n_moe++;
        }
    // Eager arm, host oracle: every verify's routing read back, round by round.
    sd_state ts, ds;
    cr_assert_eq(sd_model_state_init(&t, &ts, cap, k + 1, &st), SD_OK);
    cr_assert_eq(sd_model_state_init(&d, &ds, cap, k + 1, &st), SD_OK);
    cr_assert_eq(sd_prefill(&t, &ts, prompt, N_PROMPT - 1, NULL, &st), SD_OK);
    cr_assert_eq(sd_prefill(&d, &ds, prompt, N_PROMPT - 1, NULL, &st), SD_OK);
    sd_cuda_backend_of(&t)->moe_arm = SD_CUDA_MOE_EAGER;
    int seq[SD_SPEC_MAX_K + 1], top[SD_SPEC_MAX_K + 1], emitted = 0;
    seq[0] = prompt[N_PROMPT - 1];
    while (emitted < N_NEW) { // greedy rounds by hand: draft, verify (tapped), accept, commit
        sd_forward_opts one = {0};
        for (int i = 1; i <= k; i++) {
            one.argmax = &seq[i];
            cr_assert_eq(sd_forward(&d, &ds, &seq[i - 1], 1, NULL, 0, &one, &st), SD_OK, "%s", st.msg);
        }
        // The eager arm's host-read rows, and its own device slot (recorded before the experts).
        const sd_forward_opts vo = {.argmax = top, .on_route = on_route, .route_ctx = &g, .ledger = &L};
        const int pos0 = ts.len;
        cr_assert_eq(sd_forward(&t, &ts, seq, k + 1, NULL, 0, &vo, &st), SD_OK, "%s", st.msg);
        after_target(&g, pos0, k + 1);
        int n = 0;
        while (n < k && top[n] == seq[n + 1]) n++;
        cr_assert_eq(sd_state_commit(&ts, n + 1, &st), SD_OK);
        if (n < k) cr_assert_eq(sd_state_commit(&ds, n + 1, &st), SD_OK);
        else {
            cr_assert_eq(sd_state_commit(&ds, k, &st), SD_OK);
            cr_assert_eq(sd_forward(&d, &ds, &seq[k], 1, NULL, 0, NULL, &st), SD_OK);
            cr_assert_eq(sd_state_commit(&ds, 1, &st), SD_OK);
        }
        emitted += n + 1;
        seq[0] = top[n];
    }
    sd_cuda_backend_of(&t)->moe_arm = SD_CUDA_MOE_DEVICE_TABLE;
    ledger_row *host, *eager_slots = g_rows;
    size_t nh, n_eager_slots = g_n_rows;
    g_rows = NULL;
    g_n_rows = 0;
    ledger_take_host(&L, &host, &nh);
    ledger_diff diff;
    ledger_compare(host, nh, eager_slots, n_eager_slots, &diff);
    if (diff.found)
        cr_log_error("eager arm: host row layer %d pos %d sel %d %d w %.9g %.9g, its slot sel %d %d w %.9g %.9g", diff.a.layer,
                     diff.a.pos, diff.a.sel[0], diff.a.sel[1], diff.a.w[0], diff.a.w[1], diff.b.sel[0], diff.b.sel[1],
                     diff.b.w[0], diff.b.w[1]);
    cr_expect(!diff.found, "the eager arm's slot differs from its host-read rows (%zu mismatched)", diff.mismatched);
    free(eager_slots);
    sd_state_free(&ts);
    sd_state_free(&ds);
    // Device arm: the door's round graphs with the recorder inside, drained after each round.
    cr_assert_eq(sd_model_state_init(&t, &ts, cap, k + 1, &st), SD_OK);
    cr_assert_eq(sd_model_state_init(&d, &ds, cap, k + 1, &st), SD_OK);
    const uint64_t entries0 = L.device_entries;
    sd_cuda_door_opts o = {.k = k, .seed = 77, .ledger = &L, .after_target = after_target, .ctx = &g};
    door_generate(&t, &ts, &d, &ds, prompt, &o, got);
    cr_assert(L.device_entries > entries0, "the device arm's counter ticked");
    ledger_compare(host, nh, g_rows, g_n_rows, &diff);
    cr_assert(nh > 0 && diff.compared == nh, "compared %zu of %zu host rows", diff.compared, nh);
    if (diff.found) {
        cr_log_error("host  layer %d pos %d: sel %d %d w %.9g %.9g", diff.a.layer, diff.a.pos, diff.a.sel[0], diff.a.sel[1],
                     diff.a.w[0], diff.a.w[1]);
        cr_log_error("graph layer %d pos %d: sel %d %d w %.9g %.9g (k %d)", diff.b.layer, diff.b.pos, diff.b.sel[0],
                     diff.b.sel[1], diff.b.w[0], diff.b.w[1], diff.b.k);
        for (size_t i = 0; i < g_n_rows && i < 12; i++)
            cr_log_error("graph row %zu: layer %d pos %d sel %d %d", i, g_rows[i].layer, g_rows[i].pos, g_rows[i].sel[0],
                         g_rows[i].sel[1]);
        for (size_t i = 0; i < nh && i < 12; i++)
            cr_log_error("host row %zu: layer %d pos %d sel %d %d", i, host[i].layer, host[i].pos, host[i].sel[0], host[i].sel[1]);
    }
    cr_assert(!diff.found, "first divergence at layer %d pos %d (mismatched %zu, missing %zu)", diff.a.layer, diff.a.pos,
              diff.mismatched, diff.missing);
    // The canary: one weight one ulp off in one slot after the last round is caught there.
    const int layer = t.cfg.first_k_dense_replace;
    cr_assert_eq(ledger_canary(&L, dev, layer, 0, &st), SD_OK, "%s", st.msg);
    ledger_row *last = NULL;
    size_t n_last = 0;
    cr_assert_eq(ledger_drain_device(&L, dev, g.last_pos0, k + 1, K, &last, &n_last, &st), SD_OK, "%s", st.msg);
    // The oracle's rows of the last round: the last (k + 1) per MoE layer it recorded (a position
    // of the last round may have been routed in an earlier round too: those rows are not this one's).
    const size_t n_tail = (size_t)(k + 1) * n_moe;
    cr_assert_geq(nh, n_tail);
    ledger_compare(last, n_last, host + nh - n_tail, n_tail, &diff);
    cr_assert(diff.found && diff.mismatched == 1 && diff.missing == 0, "the canary must be caught (mismatched %zu, missing %zu)",
              diff.mismatched, diff.missing);
    cr_assert(diff.a.layer == layer && diff.a.pos == g.last_pos0, "caught at layer %d pos %d, planted at %d/%d", diff.a.layer,
              diff.a.pos, layer, g.last_pos0);
    free(host);
    free(g_rows);
    free(last);
    g_rows = NULL;
    g_n_rows = 0;
    ledger_free(&L);
    sd_state_free(&ts);
    sd_state_free(&ds);
    sd_model_free(&d);
    sd_model_free(&t);
}

Test(cuda_door, refuses_the_eager_arm_and_host_states) {
    need_gpu();
    sd_model t, d;
    device_pair("configs/tiny.json", 2, 0.3f, 0, &t, &d);
    sd_status st = {0};
    sd_state ts, ds, hs;
    cr_assert_eq(sd_model_state_init(&t, &ts, 32, 4, &st), SD_OK);
    cr_assert_eq(sd_model_state_init(&d, &ds, 32, 4, &st), SD_OK);
    sd_cuda_door *door;
    const sd_cuda_door_opts o = {.k = 3};
    sd_cuda_backend_of(&t)->moe_arm = SD_CUDA_MOE_EAGER;
    cr_assert_eq(sd_cuda_door_open(&t, &ts, &d, &ds, &o, &door, &st), SD_ERR_USAGE);
    cr_assert(strstr(st.msg, "eager MoE arm"), "%s", st.msg);
    sd_cuda_backend_of(&t)->moe_arm = SD_CUDA_MOE_DEVICE_TABLE;
    cr_assert_eq(sd_state_init(&hs, &t.cfg, 32, 4, &st), SD_OK);
    cr_assert_eq(sd_cuda_door_open(&t, &hs, &d, &ds, &o, &door, &st), SD_ERR_USAGE);
    const sd_cuda_door_opts big = {.k = 4};
    cr_assert_eq(sd_cuda_door_open(&t, &ts, &d, &ds, &big, &door, &st), SD_ERR_USAGE, "max_T 4 is too small for k = 4");
    sd_state_free(&hs);
    sd_state_free(&ts);
    sd_state_free(&ds);
    sd_model_free(&d);
    sd_model_free(&t);
}
#endif
