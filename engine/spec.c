// spec.c — the speculative round of MODEL.md on any backend's sd_forward.
//
// Invariant at the start of a round: both states hold exactly the committed sequence before x
// (the last committed token, not yet fed to either model); nothing is pending.
//
// What crosses to the host: greedy rounds move argmaxes (k draft ints, k+1 verify ints);
// sampled rounds keep p (target) and q (draft) in the backends' memory — each forward's head
// softmaxes into them and draws there (sd_forward_opts), the acceptance runs where they live
// (sd_accept) — and move the k drafts and (n, bonus). The CPU backend's memory is the host's,
// so its rounds run the same code on host buffers.
#include "spec.h"
#include <stdbool.h>
#include <string.h>
#include "accept.h"  // sd_accept
#include "backend.h" // sd_backend (its name)
#include "philox.h"  // SD_DRAW_DRAFT

_Static_assert(SD_SPEC_MAX_K <= SD_ACCEPT_MAX_K, "the accept op holds every round's drafts");

typedef struct {
    const sd_model *target, *draft;
    sd_state *ts, *ds;
    const sd_spec_opts *o;
    int V, k;
    uint32_t round;
    int seq[SD_SPEC_MAX_K + 1]; // x, d_1 .. d_k
    int top[SD_SPEC_MAX_K + 1]; // greedy: argmax p_0 .. argmax p_k (the logits stay in the backend)
    float *p;                   // sampled: (k+1, V) p_0 .. p_k in the target's backend memory
    float *q;                   // sampled: (k, V) q_1 .. q_k in the draft's backend memory
    float *work;                // sampled: (V) the rejection residual, target's backend memory
} spec_run;

static bool greedy(const spec_run *r) { return r->o->temperature <= 0.0f; }

// 1. draft: d_i from q_i = draft(x, d_1..d_{i-1}), one token per forward (left pending). Greedy:
// d_i = argmax q_i. Sampled: q_i lands in r->q row i-1 and d_i = sd_sample(q_i, u) with
// u = sd_uniform(seed, round, pos_x + i, SD_DRAW_DRAFT), both in the draft's backend.
static sd_code draft_propose(spec_run *r, sd_status *st) {
    const uint32_t pos_x = (uint32_t)sd_state_next_pos(r->ts);
    for (int i = 1; i <= r->k; i++) {
        sd_forward_opts one = {.argmax = &r->seq[i]};
        if (!greedy(r))
            one = (sd_forward_opts){.temperature = r->o->temperature, .probs = r->q + (size_t)(i - 1) * r->V,
                                    .draw = {r->o->seed, r->round, pos_x + (uint32_t)i, SD_DRAW_DRAFT},
                                    .sampled = &r->seq[i]};
        sd_code rc = sd_forward(r->draft, r->ds, &r->seq[i - 1], 1, NULL, 0, &one, st);
        if (rc) return rc;
    }
    return SD_OK;
}

// 3. accept (accept.h): greedy — d_i stands while argmax p_{i-1} = d_i, bonus = argmax p_n.
// Sampled — d_i stands with probability min(1, p_{i-1}(d_i) / q_i(d_i)); the first rejection
// draws the bonus from norm(max(0, p_{i-1} - q_i)); after k acceptances from p_k.
static sd_code accept(spec_run *r, int *n, int *bonus, sd_status *st) {
    const sd_accept_args a = {.k = r->k, .V = r->V, .drafts = &r->seq[1], .top = greedy(r) ? r->top : NULL,
                              .p = r->p, .q = r->q, .work = r->work, .seed = r->o->seed, .round = r->round,
                              .pos_x = (uint32_t)(sd_state_next_pos(r->ts) - (r->k + 1))};
    return sd_accept(r->target, &a, n, bonus, st);
}

// 5. maintenance: the draft holds x, d_1..d_{k-1} pending; keep x, d_1..d_n and feed d_k if
// all k were accepted, so it ends on the same committed sequence as the target.
static sd_code draft_catch_up(spec_run *r, int n, sd_status *st) {
    if (n < r->k) return sd_state_commit(r->ds, n + 1, st);
    sd_code rc = sd_state_commit(r->ds, r->k, st);
    if (!rc) rc = sd_forward(r->draft, r->ds, &r->seq[r->k], 1, NULL, 0, NULL, st);
    if (!rc) rc = sd_state_commit(r->ds, 1, st);
    return rc;
}

// One round from x = seq[0]: n drafts accepted; emit gets the n+1 committed tokens.
static sd_code spec_round(spec_run *r, int *emit, int *n_accepted, sd_status *st) {
    trace_burst *tb = r->o->trace;
    // Greedy: k+1 argmaxes come back. Sampled: p_0..p_k stay in the target's backend.
    const sd_gen_control *c = r->o->control;
    sd_forward_opts verify_opts = {.trace = tb, .argmax = greedy(r) ? r->top : NULL, .temperature = r->o->temperature,
                                   .probs = greedy(r) ? NULL : r->p, .on_route = c ? c->on_route : NULL,
                                   .route_ctx = c ? c->route_ctx : NULL, .ledger = c ? c->ledger : NULL};
    int n = 0, bonus = 0;
    trace_round_begin(tb);
    trace_phase_begin(TRACE_PHASE_DRAFT);                                       /* 1. draft */
    sd_code rc = draft_propose(r, st);
    trace_phase_end(tb, TRACE_PHASE_DRAFT);
    trace_phase_begin(TRACE_PHASE_VERIFY);                                      /* 2. verify */
    if (!rc) rc = sd_forward(r->target, r->ts, r->seq, r->k + 1, NULL, 0, &verify_opts, st);
    trace_phase_end(tb, TRACE_PHASE_VERIFY);
    trace_phase_begin(TRACE_PHASE_ACCEPT);                                      /* 3. accept */
    if (!rc) rc = accept(r, &n, &bonus, st);
    trace_phase_end(tb, TRACE_PHASE_ACCEPT);
    trace_phase_begin(TRACE_PHASE_ROLL);                                        /* 4. rollback */
    if (!rc) rc = sd_state_commit(r->ts, n + 1, st);
    trace_phase_end(tb, TRACE_PHASE_ROLL);
    trace_phase_begin(TRACE_PHASE_MAINT);                                       /* 5. maintenance */
    if (!rc) rc = draft_catch_up(r, n, st);
    trace_phase_end(tb, TRACE_PHASE_MAINT);
    memcpy(emit, &r->seq[1], sizeof(int) * n);
    emit[n] = bonus;
    *n_accepted = n;
    r->seq[0] = bonus;
    return rc;
}

sd_code sd_spec_generate(const sd_model *target, sd_state *ts, const sd_model *draft, sd_state *ds,
                         const int *prompt, int n_prompt, int max_new, const sd_spec_opts *o,
                         int *out, sd_accept_stats *stats, sd_status *st) {
    const int V = target->cfg.vocab_size, k = o->k;
    if (k < 1 || k > SD_SPEC_MAX_K) return sd_fail(st, SD_ERR_USAGE, "spec: k must be in 1..%d, got %d", SD_SPEC_MAX_K, k);
    if (draft->cfg.vocab_size != V)
        return sd_fail(st, SD_ERR_DATA, "spec: the draft's vocabulary (%d) differs from the target's (%d)", draft->cfg.vocab_size, V);
    if (n_prompt < 1) return sd_fail(st, SD_ERR_USAGE, "spec: the prompt needs at least one token");
    if (ts->max_T < k + 1 || ds->max_T < k)
        return sd_fail(st, SD_ERR_USAGE, "spec: states too small for k = %d", k);
    spec_run r = {.target = target, .draft = draft, .ts = ts, .ds = ds, .o = o, .V = V, .k = k};
    // Sampled rounds: the distributions live in the backends' memory for the whole generation
    // (allocated once here); greedy rounds exchange argmaxes and allocate nothing.
    const bool sampled = !greedy(&r);
    const char *tb_name = target->backend ? target->backend->name : "cpu";
    const char *db_name = draft->backend ? draft->backend->name : "cpu";
    if (sampled && strcmp(tb_name, db_name) != 0)
        return sd_fail(st, SD_ERR_UNSUPPORTED, "spec: sampled rounds need the draft on the target's backend (target %s, draft %s)",
                       tb_name, db_name);
    if (sampled) {
        r.p = sd_model_mem_alloc(target, sizeof(float) * (size_t)(k + 1) * V);
        r.work = sd_model_mem_alloc(target, sizeof(float) * (size_t)V);
        r.q = sd_model_mem_alloc(draft, sizeof(float) * (size_t)k * V);
    }
    int emit[SD_SPEC_MAX_K + 1], n = 0, done = 0;
    sd_code rc = sampled && (!r.p || !r.q || !r.work)
                     ? sd_fail(st, SD_ERR_SYS, "spec: out of %s memory for p, q (%d × %d floats)", tb_name, 2 * k + 1, V)
                     : SD_OK;
    sd_gen_control *c = o->control;
    sd_gen_begin(c);
    if (!rc) rc = sd_gen_prefill(target, ts, prompt, n_prompt - 1, c, true, st);
    if (!rc) rc = sd_gen_prefill(draft, ds, prompt, n_prompt - 1, c, false, st);
    r.seq[0] = prompt[n_prompt - 1];
    const sd_round_runner *runner = c ? c->runner : NULL;
    while (!rc && done < max_new && !sd_gen_should_stop(c)) {
        const int pos0 = ts->len; // the round's verify positions: pos0 .. pos0 + k
        rc = runner ? runner->round(runner->ctx, r.seq[0], r.round, emit, &n, st) : spec_round(&r, emit, &n, st);
        if (rc) break;
        r.seq[0] = emit[n]; // the bonus: the next round's x
        if (c && c->after_target) c->after_target(c->target_ctx, pos0, k + 1);
        r.round++;
        const int kept = sd_gen_keep(c, emit, n + 1, max_new - done); // the last round may overshoot
        memcpy(out + done, emit, sizeof(int) * kept);
        sd_stats_add_round(stats, k, n, kept);
        if (o->trace) trace_burst_round(o->trace, n, kept);
        done += kept;
        if (sd_gen_committed(c, out + done - kept, kept, done)) break; // a stop id ends the generation
    }
    sd_model_mem_free(target, r.p);
    sd_model_mem_free(target, r.work);
    sd_model_mem_free(draft, r.q);
    return rc;
}
