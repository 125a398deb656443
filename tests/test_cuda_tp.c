// test_cuda_tp.c — tensor-parallel groups of device ranks (engine/cuda/cuda_tp.h) over NCCL, on
// configs/tiny-odd.json (3 KDA heads, 5 MLA heads, 7 experts, I = 47, Ie = 13, V = 67, tied head:
// nothing divides). Every group test runs at each N from 1 to the devices present (at most 8;
// NCCL refuses two ranks on one device, so one GPU runs N = 1 — the NCCL path for real — and the
// N >= 2 laws wait for a machine with more):
//   - one rank of a group ≡ no group, bit for bit (logits, greedy and sampled tokens), in one
//     process and as one process per GPU (the id through a file);
//   - under N ranks: every rank holds the same logits and routes, verify ≡ decode bit for bit,
//     spec ≡ greedy for k = 1..8, the decode-graph door ≡ the eager rounds (its collectives
//     captured inside the graphs, replayed on every rank);
//   - N >= 2: N ranks against one within MODEL.md's tolerance;
//   - the watchdog: a rank that stops answering fails every rank within a bounded time, naming
//     it (at N = 1 the stopped rank itself; at N >= 2 the others' NCCL kernels are aborted);
//   - a rank's shard synthesised on its device ≡ the host shard of the host synthesis, byte for
//     byte (no NCCL: any N on one device).
// The kernels' own cases (the rank-order sum, the split argmax) are test_cuda_ops.c's. Without a
// device every test reports itself skipped.
#include <math.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "common.h"
#include "decode.h"
#include "spec.h"

#if !SPECDEC_HAVE_CUDA
Test(cuda_tp, suite) { cr_skip_test("CUDA backend not built (no toolkit or -DSPECDEC_CUDA=OFF): GPU suite skipped"); }
#else
#include <cuda_runtime_api.h>
#include "cuda_backend.h"        // sd_cuda_model_upload, sd_cuda_device_count
#include "cuda_door.h"           // sd_cuda_door_*
#include "cuda_synth.h"          // sd_cuda_model_synth_shard
#include "cuda_tp.h"             // sd_cuda_tp_group_init
#include "parallel/shard.h"      // sd_tp_shard_model
#include "tp_suite.h"             // ODD, odd_pair, forced_job, forced_rank, tp_logits

enum { N_TOK = 29, N_PROMPT = 6, N_NEW = 36, K_MAX = 8 };

static void need_gpu(void) {
    if (sd_cuda_device_count() == 0) cr_skip_test("no CUDA device: GPU suite skipped");
}
// The largest N a group of this machine takes (one device a rank, at most 8).
static int max_ranks(void) {
    const int n = sd_cuda_device_count();
    return n < 8 ? n : 8;
}
static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void odd_host(int bf16, sd_model *m) { synth_from(ODD, 11, bf16, SD_MAX_LAYERS, 1.0f, m); }

// A device group of host model full (and draft, replicated) with N ranks in this process.
static void device_group(const sd_model *full, const sd_model *draft, int N, sd_tp_group *g) {
    const sd_cuda_tp_opts o = {.ranks = N, .rank = -1, .timeout_s = 30, .canary_layer = -1};
    sd_status st = {0};
    cr_assert_eq(sd_cuda_tp_group_init(g, full, draft, &o, &st), SD_OK, "%d ranks: %s", N, st.msg);
}

static sd_model upload(const sd_model *host) {
    sd_model d;
    sd_status st = {0};
    cr_assert_eq(sd_cuda_model_upload(host, &d, &st), SD_OK, "%s", st.msg);
    return d;
}

// One rank of a group, in one process and as one process per GPU, gives the whole model's bits.
Test(cuda_tp, one_rank_is_bit_identical_to_no_group, .timeout = 300) {
    need_gpu();
    for (int bf16 = 0; bf16 <= 1; bf16++) {
        sd_model full;
        odd_host(bf16, &full);
        const int V = full.cfg.vocab_size;
        int tokens[N_TOK];
        random_tokens(5, V, N_TOK, tokens);
        sd_model dev = upload(&full);
        for (int form = 0; form < 2; form++) {
            char id[256];
            snprintf(id, sizeof id, "/tmp/specdec-test-tp-%d.id", (int)getpid());
            unlink(id);
            const sd_cuda_tp_opts o = {.ranks = 1, .rank = form ? 0 : -1, .nccl_id = form ? id : NULL, .timeout_s = 30,
                                       .canary_layer = -1};
            sd_tp_group g;
            sd_status st = {0};
            cr_assert_eq(sd_cuda_tp_group_init(&g, &full, NULL, &o, &st), SD_OK, "%s", st.msg);
            for (int chunk = 1; chunk <= 5; chunk += 4) {
                float *ref = logits_chunked(&dev, tokens, N_TOK, chunk), *got = tp_logits(&g, tokens, N_TOK, chunk);
                cr_assert(memcmp(ref, got, sizeof(float) * N_TOK * V) == 0, "%s, %s, chunk %d: a group of one differs from no group",
                          bf16 ? "bf16" : "f32", form ? "one process per GPU" : "one process", chunk);
                free(ref);
                free(got);
            }
            sd_tp_group_free(&g);
            if (form) { // the id file is one run's: a second rank 0 on it is refused
                cr_assert_eq(sd_cuda_tp_group_init(&g, &full, NULL, &o, &st), SD_ERR_USAGE, "a stale id file was reused");
                cr_assert(strstr(st.msg, "already exists"), "%s", st.msg);
                char beat[300];
                snprintf(beat, sizeof beat, "%s.r0", id);
                unlink(beat);
                unlink(id);
            }
        }
        sd_model_free(&dev);
        sd_model_free(&full);
    }
}

// N ranks in one process need N devices: more is refused, naming the way out.
Test(cuda_tp, more_ranks_than_devices_are_refused) {
    need_gpu();
    sd_model full;
    odd_host(1, &full);
    const sd_cuda_tp_opts o = {.ranks = sd_cuda_device_count() + 1, .rank = -1, .timeout_s = 30, .canary_layer = -1};
    sd_tp_group g;
    sd_status st = {0};
    cr_assert_eq(sd_cuda_tp_group_init(&g, &full, NULL, &o, &st), SD_ERR_UNSUPPORTED);
    cr_assert(strstr(st.msg, "CUDA devices") && strstr(st.msg, "--nccl-id"), "%s", st.msg);
    sd_model_free(&full);
}

// Verify ≡ decode under every N the machine has: each chunk size gives decode's bits.
Test(cuda_tp, verify_equals_decode_bitwise_under_the_group, .timeout = 600) {
    need_gpu();
    sd_model full;
    odd_host(1, &full);
    int tokens[N_TOK];
    random_tokens(6, full.cfg.vocab_size, N_TOK, tokens);
    for (int N = 1; N <= max_ranks(); N++) {
        sd_tp_group g;
        device_group(&full, NULL, N, &g);
        float *ref = tp_logits(&g, tokens, N_TOK, 1);
        for (int chunk = 2; chunk <= 9; chunk++) {
            float *got = tp_logits(&g, tokens, N_TOK, chunk);
            cr_assert(memcmp(ref, got, sizeof(float) * N_TOK * full.cfg.vocab_size) == 0, "%d ranks: chunk %d differs from decode", N,
                      chunk);
            free(got);
        }
        free(ref);
        sd_tp_group_free(&g);
    }
    sd_model_free(&full);
}

// MODEL.md's tolerance for the GPU against the whole model on one device (1e-4 relative over all
// logits), and the argmax equal wherever the top-2 margin exceeds twice the error bound.
static void check_close(const float *ref, const float *got, int n, int V, const char *what) {
    double num = 0, den = 0;
    for (size_t i = 0; i < (size_t)n * V; i++) {
        cr_assert(isfinite(got[i]), "%s: logit %zu is %g", what, i, got[i]);
        num += ((double)got[i] - ref[i]) * ((double)got[i] - ref[i]);
        den += (double)ref[i] * ref[i];
    }
    cr_assert_leq(sqrt(num / den), 1e-4, "%s: relative error %.3g", what, sqrt(num / den));
    expect_greedy_where_clear(got, ref, n, V, what);
}

// N ranks against one device: within tolerance, and not the same bits (it is sharded).
Test(cuda_tp, sharded_equals_unsharded_within_tolerance, .timeout = 600) {
    need_gpu();
    if (max_ranks() < 2) cr_skip_test("one CUDA device: N >= 2 needs a device a rank (run on a machine with 2, 4 or 8)");
    for (int bf16 = 0; bf16 <= 1; bf16++) {
        sd_model full;
        odd_host(bf16, &full);
        const int V = full.cfg.vocab_size;
        int tokens[N_TOK];
        random_tokens(4, V, N_TOK, tokens);
        sd_model dev = upload(&full);
        float *ref = logits_chunked(&dev, tokens, N_TOK, 1);
        for (int N = 2; N <= max_ranks(); N++) {
            sd_tp_group g;
            device_group(&full, NULL, N, &g);
            float *got = tp_logits(&g, tokens, N_TOK, 3);
            char what[64];
            snprintf(what, sizeof what, "%d ranks, %s", N, bf16 ? "bf16" : "f32");
            check_close(ref, got, N_TOK, V, what);
            cr_assert(memcmp(ref, got, sizeof(float) * N_TOK * V) != 0, "%s: bit-identical to one device — not sharded?", what);
            free(got);
            sd_tp_group_free(&g);
        }
        free(ref);
        sd_model_free(&dev);
        sd_model_free(&full);
    }
}

// ---- generation on every rank: eager or through the decode-graph door ----

typedef struct {
    const sd_tp_group *g;
    bool spec, door;
    int k;
    float temperature;
    int prompt[N_PROMPT];
    int out[SD_TP_MAX_RANKS][N_NEW];
} gen_job;

// Through the door: both states prefilled, then rounds (or plain steps) until N_NEW tokens.
static sd_code door_generate(const gen_job *job, const sd_model *t, sd_state *ts, const sd_model *d, sd_state *ds, int *out,
                             sd_status *st) {
    SD_TRY(sd_prefill(t, ts, job->prompt, N_PROMPT - 1, NULL, st));
    if (d) SD_TRY(sd_prefill(d, ds, job->prompt, N_PROMPT - 1, NULL, st));
    const sd_cuda_door_opts o = {.k = d ? job->k : 0, .temperature = job->temperature, .seed = 9};
    sd_cuda_door *door;
    SD_TRY(sd_cuda_door_open(t, ts, d, ds, &o, &door, st));
    int emit[SD_SPEC_MAX_K + 1], n = 0, x = job->prompt[N_PROMPT - 1];
    sd_code rc = SD_OK;
    for (int done = 0, round = 0; !rc && done < N_NEW; round++) {
        if (d) rc = sd_cuda_door_round(door, x, (uint32_t)round, emit, &n, st);
        else rc = sd_cuda_door_step(door, x, &emit[0], st), n = 0;
        for (int i = 0; !rc && i <= n && done < N_NEW; i++) out[done++] = emit[i];
        x = emit[n];
    }
    sd_cuda_door_close(door);
    return rc;
}

static sd_code gen_rank(void *ctx, int rank, const sd_model *m, sd_status *st) {
    gen_job *job = ctx;
    const sd_model *draft = job->spec ? sd_tp_group_draft(job->g, rank, NULL) : NULL;
    sd_state ts = {0}, ds = {0};
    const int cap = N_PROMPT + N_NEW + 2 * (K_MAX + 1);
    sd_code rc = sd_model_state_init(m, &ts, cap, K_MAX + 1, st);
    if (!rc && draft) rc = sd_model_state_init(draft, &ds, cap, K_MAX + 1, st);
    sd_spec_opts o = {.k = job->k, .temperature = job->temperature, .seed = 9};
    sd_accept_stats stats = {0};
    if (!rc && job->door) rc = door_generate(job, m, &ts, draft, &ds, job->out[rank], st);
    else if (!rc && draft)
        rc = sd_spec_generate(m, &ts, draft, &ds, job->prompt, N_PROMPT, N_NEW, &o, job->out[rank], &stats, st);
    else if (!rc)
        rc = sd_decode(m, &ts, job->prompt, N_PROMPT, N_NEW, job->temperature, 9, NULL, job->out[rank], st);
    sd_state_free(&ts);
    sd_state_free(&ds);
    return rc;
}

// The tokens of a generation on every rank (checked equal) into out.
static void group_generate(sd_tp_group *g, gen_job *job, int *out) {
    sd_status st = {0};
    job->g = g;
    cr_assert_eq(sd_tp_group_run(g, gen_rank, job, NULL, &st), SD_OK, "%s", st.msg);
    for (int r = 1; r < g->ranks; r++)
        cr_assert(memcmp(job->out[r], job->out[0], sizeof job->out[0]) == 0, "rank %d generated other tokens than rank 0", r);
    memcpy(out, job->out[0], sizeof job->out[0]);
}

// Under every N: spec ≡ greedy for k = 1..8, and the door's rounds and steps ≡ the eager ones
// (greedy and sampled), every rank replaying its captured collectives.
Test(cuda_tp, spec_and_door_equal_eager_greedy_under_the_group, .timeout = 900) {
    need_gpu();
    static pair p;
    static gen_job job;
    odd_pair(&p, SD_DT_BF16);
    for (int N = 1; N <= max_ranks(); N++) {
        sd_tp_group g;
        device_group(&p.target, &p.draft, N, &g);
        memset(&job, 0, sizeof job);
        random_tokens(12, p.target.cfg.vocab_size, N_PROMPT, job.prompt);
        int greedy[N_NEW], got[N_NEW];
        group_generate(&g, &job, greedy); // plain greedy decode
        job.door = true;
        group_generate(&g, &job, got);
        cr_assert(memcmp(got, greedy, sizeof got) == 0, "%d ranks: plain steps through the door differ from eager decode", N);
        for (int k = 1; k <= K_MAX; k++) {
            job.spec = true;
            job.k = k;
            job.door = false;
            group_generate(&g, &job, got);
            cr_assert(memcmp(got, greedy, sizeof got) == 0, "%d ranks, k = %d: spec differs from greedy", N, k);
            job.door = true;
            group_generate(&g, &job, got);
            cr_assert(memcmp(got, greedy, sizeof got) == 0, "%d ranks, k = %d: the door's rounds differ from greedy", N, k);
        }
        int eager[N_NEW]; // sampled: the door's rounds are the eager rounds' bits
        job = (gen_job){.spec = true, .k = 4, .temperature = 0.8f};
        random_tokens(13, p.target.cfg.vocab_size, N_PROMPT, job.prompt);
        group_generate(&g, &job, eager);
        job.door = true;
        group_generate(&g, &job, got);
        cr_assert(memcmp(got, eager, sizeof got) == 0, "%d ranks: sampled rounds through the door differ from eager", N);
        sd_tp_group_free(&g);
    }
    sd_model_free(&p.target);
    sd_model_free(&p.draft);
}

// ---- the watchdog ----

// A rank that stops answering at its collective #5 (layer 2's mixer: layers 0 and 1 issue #1..#4)
// fails every rank within a bounded time with one message naming it; the group stays broken.
Test(cuda_tp, a_stopped_rank_fails_every_rank_naming_it, .timeout = 300) {
    need_gpu();
    sd_model full;
    odd_host(1, &full);
    int tokens[N_TOK];
    random_tokens(8, full.cfg.vocab_size, N_TOK, tokens);
    for (int N = 1; N <= max_ranks(); N *= 2) {
        const sd_cuda_tp_opts o = {.ranks = N, .rank = -1, .timeout_s = 1.0, .stop_rank = N - 1, .stop_at = 5, .canary_layer = -1};
        sd_tp_group g;
        sd_status st = {0}, rank_st[SD_TP_MAX_RANKS];
        cr_assert_eq(sd_cuda_tp_group_init(&g, &full, NULL, &o, &st), SD_OK, "%s", st.msg);
        static forced_job job;
        memset(&job, 0, sizeof job);
        job = (forced_job){.tokens = tokens, .n = N_TOK, .chunk = 1};
        for (int r = 0; r < N; r++) job.logits[r] = malloc(sizeof(float) * N_TOK * full.cfg.vocab_size);
        const double t0 = now_s();
        cr_assert_neq(sd_tp_group_run(&g, forced_rank, &job, rank_st, &st), SD_OK, "%d ranks: the stopped run succeeded", N);
        const double secs = now_s() - t0;
        char want[160];
        snprintf(want, sizeof want, "tp: rank %d did not reach all-reduce #5 (layer 2 mixer) within 1 s", N - 1);
        cr_assert_str_eq(st.msg, want);
        for (int r = 0; r < N; r++) cr_assert_str_eq(rank_st[r].msg, want, "%d ranks: rank %d", N, r);
        cr_assert_lt(secs, 10.0, "%d ranks: the failing run took %.1f s", N, secs);
        cr_assert_neq(sd_tp_group_run(&g, forced_rank, &job, NULL, &st), SD_OK, "a broken group stays broken");
        cr_assert_str_eq(st.msg, want);
        cr_log_info("%d ranks: every rank failed in %.2f s: %s", N, secs, want);
        for (int r = 0; r < N; r++) {
            free(job.logits[r]);
            sd_tp_route_log_free(&job.logs[r]);
        }
        sd_tp_group_free(&g);
    }
    sd_model_free(&full);
}

// The same inside the door: a stop that falls among a replayed graph's collectives (numbered as
// eager ones) fails the run, naming the rank, within a bounded time.
Test(cuda_tp, a_rank_stopped_inside_a_graph_replay_is_named, .timeout = 300) {
    need_gpu();
    static pair p;
    static gen_job job;
    odd_pair(&p, SD_DT_BF16);
    const int N = max_ranks() >= 2 ? 2 : 1;
    // tiny-odd's 5 layers: the prefill's one forward (no head) issues #1..#10, the door's warm-up
    // verify #11..#21, the round graph's capture #22..#32; replays then #33..#43, #44..#54: #50 is
    // inside the second replay.
    const sd_cuda_tp_opts o = {.ranks = N, .rank = -1, .timeout_s = 1.0, .stop_rank = N - 1, .stop_at = 50, .canary_layer = -1};
    sd_tp_group g;
    sd_status st = {0};
    cr_assert_eq(sd_cuda_tp_group_init(&g, &p.target, &p.draft, &o, &st), SD_OK, "%s", st.msg);
    job = (gen_job){.g = &g, .spec = true, .door = true, .k = 4};
    random_tokens(14, p.target.cfg.vocab_size, N_PROMPT, job.prompt);
    const double t0 = now_s();
    cr_assert_neq(sd_tp_group_run(&g, gen_rank, &job, NULL, &st), SD_OK, "the stopped run succeeded");
    const double secs = now_s() - t0;
    char want[64];
    snprintf(want, sizeof want, "tp: rank %d did not reach all-reduce #50 (layer ", N - 1);
    cr_assert(strstr(st.msg, want) == st.msg && strstr(st.msg, "within 1 s"), "%s", st.msg);
    cr_assert_lt(secs, 10.0, "the failing run took %.1f s", secs);
    sd_tp_group_free(&g);
    sd_model_free(&p.target);
    sd_model_free(&p.draft);
}

// ---- a shard synthesised on its device ----

// Every rank's shard made on the device ≡ the host shard of the host synthesis, tensor by tensor.
Test(cuda_tp, device_shard_synthesis_equals_the_host_shard, .timeout = 300) {
    need_gpu();
    sd_config cfg;
    load_config(ODD, &cfg);
    const int Ns[] = {1, 2, 3, 8};
    for (int bf16 = 0; bf16 <= 1; bf16++) {
        const sd_synth_opts so = {.seed = 11, .dtype = bf16 ? SD_DT_BF16 : SD_DT_F32, .tail_from = 2, .tail_scale = 1.5f};
        sd_model full;
        sd_status st = {0};
        cr_assert_eq(sd_synth_model(&full, &cfg, &so, &st), SD_OK, "%s", st.msg);
        for (size_t i = 0; i < sizeof Ns / sizeof *Ns; i++) {
            sd_tp_plan plan;
            cr_assert_eq(sd_tp_plan_make(&cfg, Ns[i], &plan, &st), SD_OK, "%s", st.msg);
            for (int r = 0; r < Ns[i]; r++) {
                sd_model host, dev;
                cr_assert_eq(sd_tp_shard_model(&full, &plan, r, &host, &st), SD_OK, "%s", st.msg);
                cr_assert_eq(sd_cuda_model_synth_shard(&cfg, &so, &plan, r, 0, &dev, &st), SD_OK, "%s", st.msg);
                cr_assert_eq(dev.w.n_specs, host.w.n_specs, "%d ranks, rank %d: tensor count", Ns[i], r);
                for (int s = 0; s < host.w.n_specs; s++) {
                    const sd_weight_spec *hs = &host.w.specs[s], *ds = &dev.w.specs[s];
                    const size_t bytes = (size_t)hs->shape[0] * (hs->ndim == 2 ? hs->shape[1] : 1) * sd_dtype_size(hs->dtype);
                    cr_assert_str_eq(ds->name, hs->name);
                    cr_assert_eq(ds->dtype, hs->dtype, "%s", hs->name);
                    void *got = malloc(bytes ? bytes : 1);
                    cr_assert_eq(cudaMemcpy(got, sd_weight_data(ds), bytes, cudaMemcpyDeviceToHost), cudaSuccess);
                    cr_assert(memcmp(got, sd_weight_data(hs), bytes) == 0, "%s, %d ranks, rank %d: %s differs", bf16 ? "bf16" : "f32",
                              Ns[i], r, hs->name);
                    free(got);
                }
                sd_model_free(&dev);
                sd_model_free(&host);
            }
        }
        sd_model_free(&full);
    }
}

#endif
