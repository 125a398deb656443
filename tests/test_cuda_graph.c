// test_cuda_graph.c — the capture-ready device path: a forward captured once as a CUDA graph
// replays at every later position (positions live in the state's cursor, kernels/cursor.h) and
// gives the eager forward's logits and argmaxes bit for bit, through decode, verify chunks and
// rollbacks; the eager MoE arm refuses capture. Without a device every test reports itself skipped.
#include <string.h>
#include "common.h"

#if !SPECDEC_HAVE_CUDA
Test(cuda_graph, suite) { cr_skip_test("CUDA backend not built (no toolkit or -DSPECDEC_CUDA=OFF): GPU suite skipped"); }
#else
#include <cuda_runtime_api.h>
#include "cuda_backend.h" // sd_cuda_device_count, sd_cuda_model_upload, sd_cuda_backend_of
#include "cuda_graph.h"
#include "cursor.h" // sd_cuda_cursor_commit
#include "pdl.h"    // sd_cuda_pdl

static void need_gpu(void) {
    if (sd_cuda_device_count() == 0) cr_skip_test("no CUDA device: GPU suite skipped");
}

static void device_model(const char *config, sd_model *dev) {
    sd_model host;
    synth_from(config, 31, 1, SD_MAX_LAYERS, 1.0f, &host);
    sd_status st = {0};
    cr_assert_eq(sd_cuda_model_upload(&host, dev, &st), SD_OK, "%s", st.msg);
    sd_model_free(&host);
}

// The (T, V) logits the last forward left in the state's scratch (device memory).
static float *scratch_logits(const sd_state *s, int T, int V) {
    float *h = malloc(sizeof(float) * (size_t)T * V);
    cr_assert_eq(cudaMemcpy(h, s->scratch.logits, sizeof(float) * (size_t)T * V, cudaMemcpyDeviceToHost), cudaSuccess);
    return h;
}

static void assert_same_step(const sd_state *eager, const sd_state *graph, int T, int V, const int *a, const int *b,
                             const char *what, int step) {
    float *le = scratch_logits(eager, T, V), *lg = scratch_logits(graph, T, V);
    cr_assert(!memcmp(le, lg, sizeof(float) * (size_t)T * V), "%s step %d: graph logits differ from the eager forward's",
              what, step);
    for (int t = 0; t < T; t++) cr_assert_eq(a[t], b[t], "%s step %d row %d: argmax %d vs %d", what, step, t, a[t], b[t]);
    free(le);
    free(lg);
}

enum { N_PROMPT = 11 };

// Prefill the same prompt into two states of dev (eager).
static void two_states(const sd_model *dev, sd_state *e, sd_state *g, int capacity, int max_T, int *last) {
    int prompt[N_PROMPT];
    random_tokens(5, dev->cfg.vocab_size, N_PROMPT, prompt);
    sd_status st = {0};
    cr_assert_eq(sd_model_state_init(dev, e, capacity, max_T, &st), SD_OK, "%s", st.msg);
    cr_assert_eq(sd_model_state_init(dev, g, capacity, max_T, &st), SD_OK, "%s", st.msg);
    cr_assert_eq(sd_prefill(dev, e, prompt, N_PROMPT - 1, NULL, &st), SD_OK, "%s", st.msg);
    cr_assert_eq(sd_prefill(dev, g, prompt, N_PROMPT - 1, NULL, &st), SD_OK, "%s", st.msg);
    *last = prompt[N_PROMPT - 1];
}

// Greedy decode: one T = 1 capture replayed at 24 positions equals 24 eager steps.
static void check_decode(const char *config) {
    need_gpu();
    sd_model dev;
    device_model(config, &dev);
    const int V = dev.cfg.vocab_size;
    sd_state se, sg;
    int x;
    two_states(&dev, &se, &sg, N_PROMPT + 32, 4, &x);
    sd_status st = {0};
    sd_cuda_graph g;
    cr_assert_eq(sd_cuda_graph_capture(&dev, &sg, 1, &g, &st), SD_OK, "%s", st.msg);
    cr_assert_eq(sg.len, N_PROMPT - 1, "capture ran nothing");
    int xe = x, xg = x;
    for (int step = 0; step < 24; step++) {
        int ae, ag;
        sd_forward_opts o = {.argmax = &ae};
        cr_assert_eq(sd_forward(&dev, &se, &xe, 1, NULL, 0, &o, &st), SD_OK, "%s", st.msg);
        cr_assert_eq(sd_cuda_graph_forward(&g, &xg, &ag, &st), SD_OK, "%s", st.msg);
        assert_same_step(&se, &sg, 1, V, &ae, &ag, config, step);
        cr_assert_eq(sd_state_commit(&se, 1, &st), SD_OK);
        cr_assert_eq(sd_state_commit(&sg, 1, &st), SD_OK);
        xe = ae;
        xg = ag;
    }
    sd_cuda_graph_free(&g);
    sd_state_free(&se);
    sd_state_free(&sg);
    sd_model_free(&dev);
}

Test(cuda_graph, tiny_decode_replays_eager) { check_decode("configs/tiny.json"); }
Test(cuda_graph, toy_decode_replays_eager, .timeout = 300) { check_decode("configs/toy.json"); }

// Verify chunks of 5 with rollbacks between them: keep 1 + step % 5 of the 5 and go on from
// there, as the round does; the graph follows the cursor through every commit.
Test(cuda_graph, toy_verify_with_rollback, .timeout = 300) {
    need_gpu();
    sd_model dev;
    device_model("configs/toy.json", &dev);
    const int V = dev.cfg.vocab_size;
    enum { T = 5 };
    sd_state se, sg;
    int x;
    two_states(&dev, &se, &sg, N_PROMPT + 64, T, &x);
    sd_status st = {0};
    sd_cuda_graph g;
    cr_assert_eq(sd_cuda_graph_capture(&dev, &sg, T, &g, &st), SD_OK, "%s", st.msg);
    for (int step = 0; step < 10; step++) {
        int toks[T], ae[T], ag[T];
        random_tokens(100 + step, V, T, toks);
        sd_forward_opts o = {.argmax = ae};
        cr_assert_eq(sd_forward(&dev, &se, toks, T, NULL, 0, &o, &st), SD_OK, "%s", st.msg);
        cr_assert_eq(sd_cuda_graph_forward(&g, toks, ag, &st), SD_OK, "%s", st.msg);
        assert_same_step(&se, &sg, T, V, ae, ag, "toy verify", step);
        const int keep = 1 + step % T;
        cr_assert_eq(sd_state_commit(&se, keep, &st), SD_OK);
        cr_assert_eq(sd_state_commit(&sg, keep, &st), SD_OK);
        cr_assert_eq(se.len, sg.len);
    }
    sd_cuda_graph_free(&g);
    sd_state_free(&se);
    sd_state_free(&sg);
    sd_model_free(&dev);
}

// A replay checks what sd_forward checks and leaves the state as it was on error.
Test(cuda_graph, replay_checks_like_forward) {
    need_gpu();
    sd_model dev;
    device_model("configs/tiny.json", &dev);
    sd_state se, sg;
    int x;
    two_states(&dev, &se, &sg, N_PROMPT + 2, 2, &x);
    sd_status st = {0};
    sd_cuda_graph g;
    cr_assert_eq(sd_cuda_graph_capture(&dev, &sg, 2, &g, &st), SD_OK, "%s", st.msg);
    int bad[2] = {0, dev.cfg.vocab_size}, out[2];
    cr_assert_eq(sd_cuda_graph_forward(&g, bad, out, &st), SD_ERR_DATA);
    cr_assert(strstr(st.msg, "outside the vocabulary"), "%s", st.msg);
    int ok[2] = {1, 2};
    cr_assert_eq(sd_cuda_graph_forward(&g, ok, out, &st), SD_OK, "%s", st.msg);
    cr_assert_eq(sd_cuda_graph_forward(&g, ok, out, &st), SD_ERR_USAGE, "pending beyond max_T must fail");
    cr_assert_eq(sg.pending, 2);
    cr_assert_eq(sd_state_commit(&sg, 2, &st), SD_OK);
    cr_assert_eq(sd_cuda_graph_forward(&g, ok, out, &st), SD_ERR_FULL, "the context is full");
    cr_assert_eq(sg.len, N_PROMPT + 1);
    sd_cuda_graph_free(&g);
    cr_assert_eq(sd_cuda_graph_forward(&g, ok, out, &st), SD_ERR_USAGE, "a freed graph refuses");
    sd_state_free(&se);
    sd_state_free(&sg);
    sd_model_free(&dev);
}

// The launch mode (kernels/pdl.h: programmatic dependent launch or plain stream order, the one
// process-wide switch of the walk) changes no bit: the same prompt and steps (decode, a verify,
// decode, a short verify) on two states, one with the overlap off and one with it on, compared
// after each step (the logits and the argmaxes); then a captured decode step taken with it on
// against a stream-launched one with it off.
static void set_overlap(bool on) { sd_cuda_pdl(on ? SD_PDL_OVERLAP : SD_PDL_OFF); }

Test(cuda_graph, launch_overlap_changes_no_bits, .timeout = 300) {
    need_gpu();
    const char *what = "launch overlap";
    sd_model dev;
    device_model("configs/toy.json", &dev);
    const int V = dev.cfg.vocab_size;
    enum { T = 5 };
    static const int steps[] = {1, T, 1, 2};
    sd_state sa, sb;
    int x, toks[T], aa[T], ab[T];
    two_states(&dev, &sa, &sb, N_PROMPT + 16, T, &x);
    sd_status st = {0};
    char msg[96];
    for (int i = 0; i < 4; i++) {
        const int n = steps[i];
        random_tokens(78 + i, V, n, toks);
        sd_forward_opts o = {.argmax = aa};
        set_overlap(false);
        cr_assert_eq(sd_forward(&dev, &sa, toks, n, NULL, 0, &o, &st), SD_OK, "%s", st.msg);
        set_overlap(true);
        o.argmax = ab;
        cr_assert_eq(sd_forward(&dev, &sb, toks, n, NULL, 0, &o, &st), SD_OK, "%s", st.msg);
        snprintf(msg, sizeof msg, "%s: off vs on", what);
        assert_same_step(&sa, &sb, n, V, aa, ab, msg, i);
        cr_assert_eq(sd_state_commit(&sa, n, &st), SD_OK);
        cr_assert_eq(sd_state_commit(&sb, n, &st), SD_OK);
    }
    sd_cuda_graph g;
    cr_assert_eq(sd_cuda_graph_capture(&dev, &sb, 1, &g, &st), SD_OK, "%s", st.msg);
    set_overlap(false);
    sd_forward_opts o = {.argmax = aa};
    cr_assert_eq(sd_forward(&dev, &sa, &x, 1, NULL, 0, &o, &st), SD_OK, "%s", st.msg);
    cr_assert_eq(sd_cuda_graph_forward(&g, &x, ab, &st), SD_OK, "%s", st.msg);
    snprintf(msg, sizeof msg, "%s: off vs captured on", what);
    assert_same_step(&sa, &sb, 1, V, aa, ab, msg, 4);
    set_overlap(true); // the default again (a process setting outlives the model)
    sd_cuda_graph_free(&g);
    sd_state_free(&sa);
    sd_state_free(&sb);
    sd_model_free(&dev);
}

// A commit from a count in device memory (the accept kernel's n, plus the bonus position) moves
// the cursor exactly as the host's commit does, and the next forward sees the same state.
Test(cuda_graph, device_commit_equals_host_commit, .timeout = 300) {
    need_gpu();
    sd_model dev;
    device_model("configs/toy.json", &dev);
    const int V = dev.cfg.vocab_size;
    enum { T = 5 };
    sd_state sh, sd;
    int x, toks[T], ah[T], ad[T];
    two_states(&dev, &sh, &sd, N_PROMPT + 16, T, &x);
    random_tokens(41, V, T, toks);
    sd_status st = {0};
    sd_forward_opts oh = {.argmax = ah}, od = {.argmax = ad};
    cr_assert_eq(sd_forward(&dev, &sh, toks, T, NULL, 0, &oh, &st), SD_OK, "%s", st.msg);
    cr_assert_eq(sd_forward(&dev, &sd, toks, T, NULL, 0, &od, &st), SD_OK, "%s", st.msg);
    const int n_accepted = 2;
    int *n_dev = NULL;
    cr_assert_eq(cudaMalloc((void **)&n_dev, sizeof(int)), cudaSuccess);
    cr_assert_eq(cudaMemcpy(n_dev, &n_accepted, sizeof(int), cudaMemcpyHostToDevice), cudaSuccess);
    cr_assert_eq(sd_state_commit(&sh, n_accepted + 1, &st), SD_OK);
    cudaStream_t q = sd_cuda_backend_of(&dev)->stream;
    cr_assert_eq(sd_cuda_cursor_commit(sd.cursor, n_dev, 1, q, &st), SD_OK, "%s", st.msg);
    int ch[2], cd[2];
    cr_assert_eq(cudaStreamSynchronize(q), cudaSuccess);
    cr_assert_eq(cudaMemcpy(ch, sh.cursor, sizeof ch, cudaMemcpyDeviceToHost), cudaSuccess);
    cr_assert_eq(cudaMemcpy(cd, sd.cursor, sizeof cd, cudaMemcpyDeviceToHost), cudaSuccess);
    cr_assert(ch[0] == N_PROMPT - 1 + n_accepted + 1 && ch[1] == 0, "host commit: cursor {%d, %d}", ch[0], ch[1]);
    cr_assert(cd[0] == ch[0] && cd[1] == ch[1], "device commit: cursor {%d, %d}, host {%d, %d}", cd[0], cd[1], ch[0], ch[1]);
    sd.len = cd[0]; // the host follows once it has read the count
    sd.pending = 0;
    cr_assert_eq(sd_forward(&dev, &sh, toks, T, NULL, 0, &oh, &st), SD_OK, "%s", st.msg);
    cr_assert_eq(sd_forward(&dev, &sd, toks, T, NULL, 0, &od, &st), SD_OK, "%s", st.msg);
    assert_same_step(&sh, &sd, T, V, ah, ad, "after device commit", 1);
    cudaFree(n_dev);
    sd_state_free(&sh);
    sd_state_free(&sd);
    sd_model_free(&dev);
}

Test(cuda_graph, eager_moe_arm_refuses_capture) {
    need_gpu();
    sd_model dev;
    device_model("configs/tiny.json", &dev);
    sd_state s;
    sd_status st = {0};
    cr_assert_eq(sd_model_state_init(&dev, &s, 8, 2, &st), SD_OK);
    sd_cuda_backend_of(&dev)->moe_arm = SD_CUDA_MOE_EAGER;
    sd_cuda_graph g;
    cr_assert_eq(sd_cuda_graph_capture(&dev, &s, 1, &g, &st), SD_ERR_USAGE);
    cr_assert(strstr(st.msg, "eager MoE arm"), "%s", st.msg);
    cr_assert_eq(s.len + s.pending, 0);
    sd_state_free(&s);
    sd_model_free(&dev);
}
#endif
