// test_cuda_spec.c — speculative rounds on the GPU: spec ≡ greedy token for token for k = 1..8
// (it follows from verify ≡ decode on the device, which this checks end to end through the
// round loop), the same rounds as the CPU where margins are clear, and the phase trace draining
// the device at its boundaries. Without a device every test reports itself skipped.
#include <string.h>
#include "common.h"
#include "decode.h"
#include "spec.h"

#if !SPECDEC_HAVE_CUDA
Test(cuda_spec, suite) { cr_skip_test("CUDA backend not built (no toolkit or -DSPECDEC_CUDA=OFF): GPU suite skipped"); }
#else
#include "cuda_harness.h" // device_pair

static void need_gpu(void) {
    if (sd_cuda_device_count() == 0) cr_skip_test("no CUDA device: GPU suite skipped");
}

enum { N_PROMPT = 9, N_NEW = 48 };

static void check_spec_equals_greedy(const char *config, int n_layers, float tail) {
    need_gpu();
    sd_model t, d;
    device_pair(config, n_layers, tail, 1, &t, &d);
    int prompt[N_PROMPT], want[N_NEW], got[N_NEW];
    random_tokens(4, t.cfg.vocab_size, N_PROMPT, prompt);
    sd_status st = {0};
    sd_state s;
    cr_assert_eq(sd_model_state_init(&t, &s, N_PROMPT + N_NEW, 16, &st), SD_OK);
    cr_assert_eq(sd_decode(&t, &s, prompt, N_PROMPT, N_NEW, 0.0f, 0, NULL, want, &st), SD_OK, "%s", st.msg);
    sd_state_free(&s);
    for (int k = 1; k <= 8; k++) {
        sd_state ts, ds;
        cr_assert_eq(sd_model_state_init(&t, &ts, N_PROMPT + N_NEW + k + 1, k + 1, &st), SD_OK);
        cr_assert_eq(sd_model_state_init(&d, &ds, N_PROMPT + N_NEW + k + 1, k, &st), SD_OK);
        sd_spec_opts o = {.k = k};
        sd_accept_stats stats = {0};
        cr_assert_eq(sd_spec_generate(&t, &ts, &d, &ds, prompt, N_PROMPT, N_NEW, &o, got, &stats, &st), SD_OK, "%s", st.msg);
        for (int i = 0; i < N_NEW; i++)
            cr_assert_eq(got[i], want[i], "%s E=%.1f k=%d: token %d is %d, greedy gave %d", config, tail, k, i, got[i], want[i]);
        cr_log_info("%s E=%.1f k=%d: acceptance %.2f", config, tail, k, sd_stats_acceptance_rate(&stats));
        sd_state_free(&ts);
        sd_state_free(&ds);
    }
    sd_model_free(&t);
    sd_model_free(&d);
}

Test(cuda_spec, tiny_full_accept) { check_spec_equals_greedy("configs/tiny.json", 2, 0.0f); }
Test(cuda_spec, tiny_partial_accept) { check_spec_equals_greedy("configs/tiny.json", 2, 0.3f); }
Test(cuda_spec, tiny_low_accept) { check_spec_equals_greedy("configs/tiny.json", 1, 1.0f); }
Test(cuda_spec, toy_demo_pair, .timeout = 300) { check_spec_equals_greedy("configs/toy.json", 2, 0.1f); }

// The device computes each row's argmax and returns T ints: the same as the argmax of the logits
// it would otherwise copy back.
Test(cuda_spec, device_argmax_equals_host_argmax) {
    need_gpu();
    sd_model t, d;
    device_pair("configs/toy.json", 2, 0.1f, 1, &t, &d);
    enum { T = 9 };
    const int V = t.cfg.vocab_size;
    int tokens[T], top_dev[T];
    random_tokens(6, V, T, tokens);
    float *lg = malloc(sizeof(float) * T * V);
    sd_status st = {0};
    sd_state s;
    cr_assert_eq(sd_model_state_init(&t, &s, 32, T, &st), SD_OK);
    sd_forward_opts o = {.argmax = top_dev};
    cr_assert_eq(sd_forward(&t, &s, tokens, T, lg, 0, &o, &st), SD_OK, "%s", st.msg);
    for (int r = 0; r < T; r++) cr_assert_eq(top_dev[r], sd_argmax(lg + (size_t)r * V, V), "row %d", r);
    free(lg);
    sd_state_free(&s);
    sd_model_free(&t);
    sd_model_free(&d);
}

// The trace on the device: the boundaries drain the streams through the burst's sync, level-2
// buckets tick from the real verify kernels, and the invariants of the -v line hold.
static void sync_model(void *m) { sd_model_sync(m); }

Test(cuda_spec, level2_trace_from_device_kernels) {
    need_gpu();
    sd_model t, d;
    device_pair("configs/toy.json", 2, 0.1f, 1, &t, &d);
    int prompt[N_PROMPT], out[N_NEW];
    random_tokens(5, t.cfg.vocab_size, N_PROMPT, prompt);
    sd_status st = {0};
    sd_state ts, ds;
    cr_assert_eq(sd_model_state_init(&t, &ts, N_PROMPT + N_NEW + 5, 5, &st), SD_OK);
    cr_assert_eq(sd_model_state_init(&d, &ds, N_PROMPT + N_NEW + 5, 4, &st), SD_OK);
    trace_burst tb;
    trace_burst_begin(&tb, 2, 4, sync_model, &t);
    sd_spec_opts o = {.k = 4, .trace = &tb};
    sd_accept_stats stats = {0};
    cr_assert_eq(sd_spec_generate(&t, &ts, &d, &ds, prompt, N_PROMPT, N_NEW, &o, out, &stats, &st), SD_OK, "%s", st.msg);
    uint64_t mixers = tb.bucket_ns[TRACE_BUCKET_VKDA] + tb.bucket_ns[TRACE_BUCKET_VMLA];
    cr_assert_gt(tb.bucket_ns[TRACE_BUCKET_VKDA], 0);
    cr_assert_gt(tb.bucket_ns[TRACE_BUCKET_VMLA], 0);
    cr_assert_gt(tb.bucket_ns[TRACE_BUCKET_SCAN], 0);
    cr_assert_leq(tb.bucket_ns[TRACE_BUCKET_SCAN], tb.bucket_ns[TRACE_BUCKET_VKDA]);
    cr_assert_leq(mixers, tb.phase_ns[TRACE_PHASE_VERIFY]);
    cr_assert_leq(tb.bucket_ns[TRACE_BUCKET_VFFN], tb.phase_ns[TRACE_PHASE_VERIFY] - mixers);
    char line[1024];
    trace_burst_format(&tb, "gpu", line, sizeof line);
    cr_log_info("%s", line);
    sd_state_free(&ts);
    sd_state_free(&ds);
    sd_model_free(&t);
    sd_model_free(&d);
}
#endif
