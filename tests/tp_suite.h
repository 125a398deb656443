// tp_suite.h — what the tensor-parallel suites on the CPU (test_tp) and on devices (test_cuda_tp)
// share: configs/tiny-odd.json (nothing divides) with its derived draft, and a group's
// teacher-forced logits on every rank — each rank runs the same forwards of `chunk` tokens on
// its model, logits into its own host buffer and its routes into its own log.
#pragma once
#include <stdlib.h>
#include <string.h>
#include "common.h"
#include "parallel/ranks.h"     // sd_tp_group, sd_tp_group_run
#include "parallel/route_log.h" // sd_tp_route_log, sd_tp_routes_compare

#define ODD "configs/tiny-odd.json"

typedef struct {
    sd_model target, draft;
} pair;

// tiny-odd and its 2-layer derived draft (seed 11), the target's tail scaled so some drafts are
// rejected.
static inline void odd_pair(pair *p, sd_dtype dt) {
    sd_config cfg, dcfg;
    load_config(ODD, &cfg);
    sd_status st = {0};
    cr_assert_eq(sd_draft_config(&cfg, 2, &dcfg, &st), SD_OK, "%s", st.msg);
    sd_synth_opts o = {.seed = 11, .dtype = dt, .tail_from = 2, .tail_scale = 1.5f, .depth = cfg.num_hidden_layers};
    cr_assert_eq(sd_synth_model(&p->target, &cfg, &o, &st), SD_OK, "%s", st.msg);
    cr_assert_eq(sd_synth_model(&p->draft, &dcfg, &o, &st), SD_OK, "%s", st.msg);
}

typedef struct {
    const int *tokens;
    int n, chunk;
    float *logits[SD_TP_MAX_RANKS]; // (n, V) per rank, host memory
    sd_tp_route_log logs[SD_TP_MAX_RANKS];
} forced_job;

static sd_code forced_rank(void *ctx, int rank, const sd_model *m, sd_status *st) {
    forced_job *job = ctx;
    const int V = m->cfg.vocab_size;
    sd_state s;
    sd_code rc = sd_model_state_init(m, &s, job->n, job->chunk, st);
    sd_forward_opts o = {.on_route = sd_tp_route_record, .route_ctx = &job->logs[rank]};
    for (int t = 0; !rc && t < job->n; t += job->chunk) {
        const int T = job->n - t < job->chunk ? job->n - t : job->chunk;
        rc = sd_forward(m, &s, job->tokens + t, T, job->logits[rank] + (size_t)t * V, 0, &o, st);
        if (!rc) rc = sd_state_commit(&s, T, st);
    }
    sd_state_free(&s);
    return rc;
}

// Rank 0's logits (caller frees) after checking that every rank holds the same bits and routes alike.
static inline float *tp_logits(sd_tp_group *g, const int *tokens, int n, int chunk) {
    static forced_job job;
    memset(&job, 0, sizeof job);
    job = (forced_job){.tokens = tokens, .n = n, .chunk = chunk};
    const size_t bytes = sizeof(float) * (size_t)n * g->shards[0].cfg.vocab_size;
    for (int r = 0; r < g->ranks; r++) job.logits[r] = malloc(bytes);
    sd_status st = {0};
    cr_assert_eq(sd_tp_group_run(g, forced_rank, &job, NULL, &st), SD_OK, "%s", st.msg);
    sd_tp_route_verdict v;
    sd_tp_routes_compare(job.logs, g->ranks, &v);
    cr_assert(v.agree, "%d ranks: %s", g->ranks, v.msg);
    for (int r = 1; r < g->ranks; r++) {
        cr_assert(memcmp(job.logits[r], job.logits[0], bytes) == 0, "%d ranks: rank %d's logits differ from rank 0's", g->ranks, r);
        free(job.logits[r]);
    }
    for (int r = 0; r < g->ranks; r++) sd_tp_route_log_free(&job.logs[r]);
    return job.logits[0];
}
