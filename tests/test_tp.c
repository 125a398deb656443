// test_tp.c — the sharded model on emulated ranks (engine/parallel/): N ranks against one within
// MODEL.md's tolerance on a model whose heads, experts and widths do not divide (configs/
// tiny-odd.json: 3 KDA heads, 5 MLA heads, 7 experts, I = 47, Ie = 13, V = 67, tied head); every
// rank holding the same bits; verify ≡ decode bit for bit and spec ≡ greedy for k = 1..8 under
// N = 3; sampling across the split; the cross-rank route verdict and its canary; the watchdog
// on a real forward.
#include <math.h>
#include <string.h>
#include "common.h"
#include "decode.h"
#include "parallel/ranks.h"     // sd_tp_group
#include "parallel/shard.h"     // sd_tp_shard_model
#include "spec.h"
#include "tp_suite.h"            // ODD, odd_pair, forced_job, forced_rank, tp_logits

enum { N_TOK = 29 };

static void odd_model(int bf16, int tail_from, float tail, sd_model *m) { synth_from(ODD, 11, bf16, tail_from, tail, m); }

static void make_group(const sd_model *full, int N, sd_tp_group *g) {
    sd_tp_group_opts o = {.ranks = N, .timeout_s = 30, .canary_layer = -1};
    sd_status st = {0};
    cr_assert_eq(sd_tp_group_init(g, full, &o, &st), SD_OK, "%s", st.msg);
}

// MODEL.md's tolerance for F32 on the CPU: ‖got − ref‖ / ‖ref‖ <= 1e-4 over all logits; and the
// argmax equal in every row whose top-2 margin exceeds twice the row's error bound
// (1e-4 · ‖row‖, which bounds each element's error), where no rounding can swap them.
static void check_close(const float *ref, const float *got, int n, int V, const char *what) {
    double num = 0, den = 0;
    for (size_t i = 0; i < (size_t)n * V; i++) {
        cr_assert(isfinite(got[i]), "%s: logit %zu is %g", what, i, got[i]);
        num += ((double)got[i] - ref[i]) * ((double)got[i] - ref[i]);
        den += (double)ref[i] * ref[i];
    }
    cr_assert_leq(sqrt(num / den), 1e-4, "%s: relative error %.3g", what, sqrt(num / den));
    for (int t = 0; t < n; t++) {
        const float *r = ref + (size_t)t * V;
        const int top = sd_argmax(r, V);
        double second = -INFINITY, norm = 0;
        for (int v = 0; v < V; v++) {
            norm += (double)r[v] * r[v];
            if (v != top && r[v] > second) second = r[v];
        }
        if (r[top] - second > 2e-4 * sqrt(norm))
            cr_assert_eq(sd_argmax(got + (size_t)t * V, V), top, "%s: row %d's argmax moved (margin %.3g)", what, t, r[top] - second);
    }
}

// N ranks against one: within tolerance for N = 2, 3, 4, 6 and 8, F32 and BF16 weights.
Test(tp_model, sharded_equals_unsharded_within_tolerance) {
    const int ranks[] = {2, 3, 4, 6, 8}; // 8: a rank with no KDA or MLA head and no expert
    int tokens[N_TOK];
    for (int bf16 = 0; bf16 <= 1; bf16++) {
        sd_model full;
        odd_model(bf16, SD_MAX_LAYERS, 1.0f, &full);
        const int V = full.cfg.vocab_size;
        random_tokens(4, V, N_TOK, tokens);
        float *ref = logits_chunked(&full, tokens, N_TOK, 1);
        for (size_t i = 0; i < sizeof ranks / sizeof *ranks; i++) {
            sd_tp_group g;
            make_group(&full, ranks[i], &g);
            float *got = tp_logits(&g, tokens, N_TOK, 3);
            char what[64];
            snprintf(what, sizeof what, "%d ranks, %s", ranks[i], bf16 ? "bf16" : "f32");
            check_close(ref, got, N_TOK, V, what);
            cr_assert(memcmp(ref, got, sizeof(float) * N_TOK * V) != 0, "%s: bit-identical to one rank — not sharded?", what);
            free(got);
            sd_tp_group_free(&g);
        }
        free(ref);
        sd_model_free(&full);
    }
}

// One rank of a group is the whole model: the same bits as no group at all.
Test(tp_model, one_rank_is_bit_identical_to_no_group) {
    sd_model full;
    odd_model(1, SD_MAX_LAYERS, 1.0f, &full);
    int tokens[N_TOK];
    random_tokens(5, full.cfg.vocab_size, N_TOK, tokens);
    float *ref = logits_chunked(&full, tokens, N_TOK, 1);
    sd_tp_group g;
    make_group(&full, 1, &g);
    for (int chunk = 1; chunk <= 5; chunk += 4) {
        float *got = tp_logits(&g, tokens, N_TOK, chunk);
        cr_assert(memcmp(ref, got, sizeof(float) * N_TOK * full.cfg.vocab_size) == 0, "chunk %d", chunk);
        free(got);
    }
    sd_tp_group_free(&g);
    free(ref);
    sd_model_free(&full);
}

// Verify ≡ decode under 3 ranks, bit for bit: every chunk size gives decode's logits.
Test(tp_model, verify_equals_decode_bitwise_under_3_ranks) {
    for (int bf16 = 0; bf16 <= 1; bf16++) {
        sd_model full;
        odd_model(bf16, SD_MAX_LAYERS, 1.0f, &full);
        int tokens[N_TOK];
        random_tokens(6, full.cfg.vocab_size, N_TOK, tokens);
        sd_tp_group g;
        make_group(&full, 3, &g);
        float *ref = tp_logits(&g, tokens, N_TOK, 1);
        for (int chunk = 2; chunk <= 9; chunk++) {
            float *got = tp_logits(&g, tokens, N_TOK, chunk);
            cr_assert(memcmp(ref, got, sizeof(float) * N_TOK * full.cfg.vocab_size) == 0, "%s: chunk %d differs from decode",
                      bf16 ? "bf16" : "f32", chunk);
            free(got);
        }
        free(ref);
        sd_tp_group_free(&g);
        sd_model_free(&full);
    }
}

// ---- generation on every rank: plain and speculative, greedy and sampled ----

enum { N_PROMPT = 6, N_NEW = 36, K_MAX = 8 };

typedef struct {
    const sd_model *draft; // replicated: every rank runs the same draft (NULL: plain decode)
    int k;
    float temperature;
    int prompt[N_PROMPT];
    int out[SD_TP_MAX_RANKS][N_NEW];
    sd_accept_stats stats[SD_TP_MAX_RANKS];
} gen_job;

static sd_code gen_rank(void *ctx, int rank, const sd_model *m, sd_status *st) {
    gen_job *job = ctx;
    sd_state ts = {0}, ds = {0};
    const int cap = N_PROMPT + N_NEW + K_MAX + 1;
    sd_code rc = sd_model_state_init(m, &ts, cap, K_MAX + 1, st);
    if (!rc && job->draft) rc = sd_model_state_init(job->draft, &ds, cap, K_MAX, st);
    sd_spec_opts o = {.k = job->k, .temperature = job->temperature, .seed = 9};
    if (!rc && job->draft)
        rc = sd_spec_generate(m, &ts, job->draft, &ds, job->prompt, N_PROMPT, N_NEW, &o, job->out[rank], &job->stats[rank], st);
    else if (!rc)
        rc = sd_decode(m, &ts, job->prompt, N_PROMPT, N_NEW, job->temperature, 9, NULL, job->out[rank], st);
    sd_state_free(&ts);
    sd_state_free(&ds);
    return rc;
}

// The tokens of a generation on every rank (checked equal) into out.
static void tp_generate(sd_tp_group *g, gen_job *job, int *out) {
    sd_status st = {0};
    cr_assert_eq(sd_tp_group_run(g, gen_rank, job, NULL, &st), SD_OK, "%s", st.msg);
    for (int r = 1; r < g->ranks; r++)
        cr_assert(memcmp(job->out[r], job->out[0], sizeof job->out[0]) == 0, "rank %d generated other tokens than rank 0", r);
    memcpy(out, job->out[0], sizeof job->out[0]);
}

// The same job on the whole model, no group.
static void one_generate(const sd_model *full, gen_job *job, int *out) {
    sd_status st = {0};
    cr_assert_eq(gen_rank(job, 0, full, &st), SD_OK, "%s", st.msg);
    memcpy(out, job->out[0], sizeof job->out[0]);
}


// The pair, its target's 3-rank group and a job with a prompt drawn from `seed`.
static void spec_setup(pair *p, sd_tp_group *g, gen_job *job, uint32_t seed) {
    odd_pair(p, SD_DT_F32);
    make_group(&p->target, 3, g);
    memset(job, 0, sizeof *job);
    random_tokens(seed, p->target.cfg.vocab_size, N_PROMPT, job->prompt);
}

static void spec_teardown(pair *p, sd_tp_group *g) {
    sd_tp_group_free(g);
    sd_model_free(&p->target);
    sd_model_free(&p->draft);
}

Test(tp_spec, spec_equals_greedy_under_3_ranks_for_k_1_to_8) {
    static pair p;
    static gen_job job;
    sd_tp_group g;
    spec_setup(&p, &g, &job, 17);
    int want[N_NEW], got[N_NEW];
    tp_generate(&g, &job, want);
    // Greedy decode's argmaxes come from the ranks' local ones combined; they must be the
    // argmaxes of the whole rows the same 3 ranks gather.
    int seq[N_PROMPT + N_NEW];
    memcpy(seq, job.prompt, sizeof job.prompt);
    memcpy(seq + N_PROMPT, want, sizeof want);
    const int V = p.target.cfg.vocab_size;
    float *rows = tp_logits(&g, seq, N_PROMPT + N_NEW, 5);
    for (int i = 0; i < N_NEW; i++)
        cr_assert_eq(sd_argmax(rows + (size_t)(N_PROMPT - 1 + i) * V, V), want[i], "token %d: combined argmax vs whole row", i);
    free(rows);
    uint64_t drafted = 0, accepted = 0;
    job.draft = &p.draft;
    for (int k = 1; k <= K_MAX; k++) {
        job.k = k;
        memset(job.stats, 0, sizeof job.stats);
        tp_generate(&g, &job, got);
        for (int i = 0; i < N_NEW; i++)
            cr_assert_eq(got[i], want[i], "k = %d: token %d is %d, greedy decode on 3 ranks gave %d", k, i, got[i], want[i]);
        drafted += job.stats[0].drafted;
        accepted += job.stats[0].accepted;
    }
    cr_assert(accepted > 0 && accepted < drafted, "the rounds must both accept and reject (%llu of %llu)",
              (unsigned long long)accepted, (unsigned long long)drafted);
    spec_teardown(&p, &g);
}

// Sampling across the split draws from whole rows, as one device does: where the logits'
// rounding differences move no draw across a boundary (here: every draw), the sampled tokens of
// 3 ranks equal the unsharded ones — plain and speculative.
Test(tp_spec, sampled_tokens_equal_the_unsharded_ones) {
    static pair p;
    static gen_job job;
    sd_tp_group g;
    spec_setup(&p, &g, &job, 13);
    job.temperature = 0.9f;
    int one[N_NEW], three[N_NEW];
    for (int k = 0; k <= 4; k += 4) {
        job.draft = k ? &p.draft : NULL;
        job.k = k;
        one_generate(&p.target, &job, one);
        tp_generate(&g, &job, three);
        for (int i = 0; i < N_NEW; i++) cr_assert_eq(three[i], one[i], "k = %d: sampled token %d is %d on 3 ranks, %d on one", k, i, three[i], one[i]);
    }
    spec_teardown(&p, &g);
}

// ---- the cross-rank route verdict ----

// Every rank's (layer, token, sel, w) through on_route for a teacher-forced run; the verdict.
static void route_verdict(const sd_model *full, int N, int canary_rank, int canary_layer, sd_tp_route_verdict *v) {
    static forced_job job;
    int tokens[N_TOK];
    random_tokens(7, full->cfg.vocab_size, N_TOK, tokens);
    sd_tp_group g;
    sd_tp_group_opts o = {.ranks = N, .timeout_s = 30, .canary_rank = canary_rank, .canary_layer = canary_layer};
    sd_status st = {0};
    cr_assert_eq(sd_tp_group_init(&g, full, &o, &st), SD_OK, "%s", st.msg);
    memset(&job, 0, sizeof job);
    job = (forced_job){.tokens = tokens, .n = N_TOK, .chunk = 4};
    for (int r = 0; r < N; r++) job.logits[r] = malloc(sizeof(float) * N_TOK * full->cfg.vocab_size);
    cr_assert_eq(sd_tp_group_run(&g, forced_rank, &job, NULL, &st), SD_OK, "%s", st.msg);
    const int moe_layers = full->cfg.num_hidden_layers - full->cfg.first_k_dense_replace;
    for (int r = 0; r < N; r++) cr_assert_eq(job.logs[r].n, (size_t)moe_layers * N_TOK, "rank %d's route records", r);
    sd_tp_routes_compare(job.logs, N, v);
    for (int r = 0; r < N; r++) {
        free(job.logits[r]);
        sd_tp_route_log_free(&job.logs[r]);
    }
    sd_tp_group_free(&g);
}

Test(tp_routes, ranks_route_alike_and_a_canary_rank_is_named) {
    sd_model full;
    odd_model(0, SD_MAX_LAYERS, 1.0f, &full);
    sd_tp_route_verdict v;
    route_verdict(&full, 3, 0, -1, &v);
    cr_assert(v.agree, "%s", v.msg);
    const struct { int N, rank, layer; } canary[] = {{3, 2, 3}, {3, 0, 1}, {4, 1, 4}};
    for (size_t i = 0; i < sizeof canary / sizeof *canary; i++) {
        route_verdict(&full, canary[i].N, canary[i].rank, canary[i].layer, &v);
        cr_assert_not(v.agree, "canary rank %d at layer %d went unseen: %s", canary[i].rank, canary[i].layer, v.msg);
        cr_assert_eq(v.rank, canary[i].rank, "canary rank %d, the verdict names rank %d: %s", canary[i].rank, v.rank, v.msg);
        cr_assert_eq(v.layer, canary[i].layer, "%s", v.msg);
        char want[64];
        snprintf(want, sizeof want, "tp routes: rank %d differs from rank ", canary[i].rank);
        cr_assert(strstr(v.msg, want) == v.msg, "%s", v.msg);
    }
    sd_status st = {0};
    sd_tp_group g;
    sd_tp_group_opts bad = {.ranks = 3, .canary_rank = 1, .canary_layer = 0}; // layer 0 is dense
    cr_assert_eq(sd_tp_group_init(&g, &full, &bad, &st), SD_ERR_USAGE);
    cr_assert(strstr(st.msg, "not an MoE layer"), "%s", st.msg);
    sd_model_free(&full);
}

// ---- the shards themselves ----

// A shard is a host model like a loaded one: its config re-plans to exactly its tensor table
// (what a device upload does), it holds only its experts and its slices, and a rank may hold
// none of a kind.
Test(tp_shard, a_shard_is_a_model_its_config_replans) {
    sd_model full;
    odd_model(1, SD_MAX_LAYERS, 1.0f, &full);
    const sd_config *c = &full.cfg;
    sd_tp_plan p;
    sd_status st = {0};
    cr_assert_eq(sd_tp_plan_make(c, 4, &p, &st), SD_OK);
    for (int r = 0; r < 4; r++) {
        sd_model s;
        cr_assert_eq(sd_tp_shard_model(&full, &p, r, &s, &st), SD_OK, "%s", st.msg);
        sd_weights again;
        cr_assert_eq(sd_weights_plan(&s.cfg, &again, &st), SD_OK, "%s", st.msg);
        cr_assert_eq(again.n_specs, s.w.n_specs, "rank %d", r);
        for (int i = 0; i < s.w.n_specs; i++) {
            cr_assert_str_eq(again.specs[i].name, s.w.specs[i].name);
            cr_assert_eq(again.specs[i].shape[0], s.w.specs[i].shape[0], "%s", s.w.specs[i].name);
            cr_assert_eq(again.specs[i].shape[1], s.w.specs[i].shape[1], "%s", s.w.specs[i].name);
            if (s.w.specs[i].keep_dtype) cr_assert_eq(s.w.specs[i].dtype, SD_DT_BF16, "%s keeps the model's dtype", s.w.specs[i].name);
        }
        sd_weights_free(&again);
        cr_assert_eq(sd_model_save(&s, "/nonexistent/shard", NULL, &st), SD_ERR_USAGE, "a shard saved as a model");
        const sd_tp_share *sh = &p.rank[r];
        cr_assert_eq(s.cfg.kda_num_heads, sh->kda_heads.count);
        cr_assert_eq(s.cfg.num_attention_heads, sh->mla_heads.count);
        cr_assert_eq(s.w.lm_head.rows, sh->vocab.count);
        cr_assert_not(s.cfg.tie_word_embeddings, "a shard holds its own head rows");
        const sd_layer_weights *ly = &s.w.layers[c->num_hidden_layers - 1], *fl = &full.w.layers[c->num_hidden_layers - 1];
        for (int e = 0; e < c->num_experts; e++) {
            const bool mine = e >= sh->experts.first && e < sh->experts.first + sh->experts.count;
            cr_assert_eq(ly->moe.experts[e].gate.data != NULL, mine, "rank %d, expert %d", r, e);
            if (mine)
                cr_assert(memcmp(ly->moe.experts[e].down.data, fl->moe.experts[e].down.data, 2 * (size_t)c->hidden_size * c->moe_intermediate_size) == 0);
        }
        // Head rows come from the (tied) embedding; the shared expert's down from its columns.
        const size_t row = 2 * (size_t)c->hidden_size;
        cr_assert(memcmp(s.w.lm_head.data, (const char *)full.w.embed.data + (size_t)sh->vocab.first * row, (size_t)sh->vocab.count * row) == 0);
        const uint16_t *down = ly->moe.shared.down.data, *fdown = fl->moe.shared.down.data;
        for (int o = 0; o < c->hidden_size; o++)
            for (int j = 0; j < sh->shared.count; j++)
                cr_assert_eq(down[(size_t)o * sh->shared.count + j], fdown[(size_t)o * c->moe_intermediate_size + sh->shared.first + j]);
        sd_model_free(&s);
    }
    cr_assert_eq(p.rank[3].kda_heads.count, 0, "the case with none of a kind is covered");
    sd_model_free(&full);
}

// ---- the watchdog on a real forward ----

Test(tp_watchdog, a_rank_stopping_mid_forward_fails_every_rank_naming_it) {
    sd_model full;
    odd_model(0, SD_MAX_LAYERS, 1.0f, &full);
    sd_tp_group g;
    sd_tp_group_opts o = {.ranks = 3, .timeout_s = 1.0, .canary_layer = -1, .stop_rank = 2, .stop_at = 5};
    sd_status st = {0}, rank_st[3];
    cr_assert_eq(sd_tp_group_init(&g, &full, &o, &st), SD_OK, "%s", st.msg);
    static forced_job job;
    int tokens[N_TOK];
    random_tokens(8, full.cfg.vocab_size, N_TOK, tokens);
    memset(&job, 0, sizeof job);
    job = (forced_job){.tokens = tokens, .n = N_TOK, .chunk = 1};
    for (int r = 0; r < 3; r++) job.logits[r] = malloc(sizeof(float) * N_TOK * full.cfg.vocab_size);
    cr_assert_neq(sd_tp_group_run(&g, forced_rank, &job, rank_st, &st), SD_OK);
    // Collectives 1-4 are layers 0 and 1 (mixer, ffn); #5 is layer 2's mixer.
    const char *want = "tp: rank 2 did not reach all-reduce #5 (layer 2 mixer) within 1 s";
    cr_assert_str_eq(st.msg, want);
    for (int r = 0; r < 3; r++) cr_assert_str_eq(rank_st[r].msg, want, "rank %d", r);
    cr_assert_neq(sd_tp_group_run(&g, forced_rank, &job, NULL, &st), SD_OK, "a broken group stays broken");
    cr_assert_str_eq(st.msg, want);
    for (int r = 0; r < 3; r++) {
        free(job.logits[r]);
        sd_tp_route_log_free(&job.logs[r]);
    }
    sd_tp_group_free(&g);
    sd_model_free(&full);
}
