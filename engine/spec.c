// spec.c — the speculative round of MODEL.md on any backend's sd_forward.
//
// Invariant at the start of a round: both states hold exactly the committed sequence before x
// (the last committed token, not yet fed to either model); nothing is pending.
#include "spec.h"
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include "philox.h" // sd_uniform

typedef struct {
    const sd_model *target, *draft;
    sd_state *ts, *ds;
    const sd_spec_opts *o;
    int V, k;
    uint32_t round;
    int seq[SD_SPEC_MAX_K + 1]; // x, d_1 .. d_k
    int top[SD_SPEC_MAX_K + 1]; // greedy: argmax p_0 .. argmax p_k (the logits stay in the backend)
    float *p;                   // (k+1, V) sampling: target logits, then probabilities
    float *q;                   // (k, V) sampling: draft probabilities
    float *work;                // (V) sampling: draft logits / residual
} spec_run;

// 1. draft: d_i from q_i = draft(x, d_1..d_{i-1}), one token per forward (left pending).
static sd_code draft_propose(spec_run *r, sd_status *st) {
    const int pos_x = sd_state_next_pos(r->ts);
    for (int i = 1; i <= r->k; i++) {
        if (r->o->temperature <= 0.0f) { // greedy: only the argmax leaves the backend
            sd_forward_opts top = {.argmax = &r->seq[i]};
            sd_code rc = sd_forward(r->draft, r->ds, &r->seq[i - 1], 1, NULL, 0, &top, st);
            if (rc) return rc;
        } else {
            sd_code rc = sd_forward(r->draft, r->ds, &r->seq[i - 1], 1, r->work, 0, NULL, st);
            if (rc) return rc;
            float *qi = r->q + (size_t)(i - 1) * r->V;
            sd_softmax(r->work, r->V, r->o->temperature, qi);
            r->seq[i] = sd_sample(qi, r->V, sd_uniform(r->o->seed, r->round, (uint32_t)(pos_x + i), SD_DRAW_DRAFT));
        }
    }
    return SD_OK;
}

// 3. accept: greedy — d_i stands while argmax p_{i-1} = d_i, bonus = argmax p_n. Sampled — d_i
// stands with probability min(1, p_{i-1}(d_i) / q_i(d_i)); the first rejection draws the bonus
// from norm(max(0, p_{i-1} - q_i)); after k acceptances from p_k. Returns n; *bonus set.
static int accept(spec_run *r, int *bonus) {
    const int V = r->V, pos_x = sd_state_next_pos(r->ts) - (r->k + 1);
    if (r->o->temperature <= 0.0f) {
        int n = 0;
        while (n < r->k && r->top[n] == r->seq[n + 1]) n++;
        *bonus = r->top[n];
        return n;
    }
    for (int i = 0; i <= r->k; i++) sd_softmax(r->p + (size_t)i * V, V, r->o->temperature, r->p + (size_t)i * V);
    for (int i = 1; i <= r->k; i++) {
        const float *p = r->p + (size_t)(i - 1) * V, *q = r->q + (size_t)(i - 1) * V;
        const int d = r->seq[i];
        const uint32_t pos = (uint32_t)(pos_x + i);
        if (sd_uniform(r->o->seed, r->round, pos, SD_DRAW_ACCEPT) * q[d] < p[d]) continue;
        sd_residual(p, q, V, r->work);
        *bonus = sd_sample(r->work, V, sd_uniform(r->o->seed, r->round, pos, SD_DRAW_BONUS));
        return i - 1;
    }
    *bonus = sd_sample(r->p + (size_t)r->k * V, V,
                       sd_uniform(r->o->seed, r->round, (uint32_t)(pos_x + r->k + 1), SD_DRAW_BONUS));
    return r->k;
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
    const bool greedy = r->o->temperature <= 0.0f;
    sd_forward_opts verify_opts = {.trace = tb, .argmax = greedy ? r->top : NULL};
    int n = 0, bonus = 0;
    trace_phase_begin(TRACE_PHASE_DRAFT);                                       /* 1. draft */
    sd_code rc = draft_propose(r, st);
    trace_phase_end(tb, TRACE_PHASE_DRAFT);
    trace_phase_begin(TRACE_PHASE_VERIFY);                                      /* 2. verify */
    if (!rc) rc = sd_forward(r->target, r->ts, r->seq, r->k + 1, greedy ? NULL : r->p, 0, &verify_opts, st);
    trace_phase_end(tb, TRACE_PHASE_VERIFY);
    trace_phase_begin(TRACE_PHASE_ACCEPT);                                      /* 3. accept */
    if (!rc) n = accept(r, &bonus);
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
    // Only sampling moves distributions to the host; greedy rounds exchange argmaxes.
    const bool sampled = o->temperature > 0.0f;
    if (sampled) {
        r.p = malloc(sizeof(float) * (size_t)(k + 1) * V);
        r.q = malloc(sizeof(float) * (size_t)k * V);
        r.work = malloc(sizeof(float) * (size_t)V);
    }
    int emit[SD_SPEC_MAX_K + 1], n = 0, n_emit = 0;
    sd_code rc = sampled && (!r.p || !r.q || !r.work) ? sd_fail(st, SD_ERR_SYS, "out of memory") : SD_OK;
    if (!rc) rc = sd_prefill(target, ts, prompt, n_prompt - 1, NULL, st);
    if (!rc) rc = sd_prefill(draft, ds, prompt, n_prompt - 1, NULL, st);
    r.seq[0] = prompt[n_prompt - 1];
    for (int done = 0; !rc && done < max_new; done += n_emit, r.round++) {
        rc = spec_round(&r, emit, &n, st);
        if (rc) break;
        n_emit = n + 1 < max_new - done ? n + 1 : max_new - done; // the last round may overshoot
        memcpy(out + done, emit, sizeof(int) * n_emit);
        sd_stats_add_round(stats, k, n, n_emit);
        if (o->trace) {
            o->trace->rounds++;
            o->trace->drafted += (uint64_t)k;
            o->trace->accepted += (uint64_t)n;
            o->trace->emitted += (uint64_t)n_emit;
        }
    }
    free(r.p);
    free(r.q);
    free(r.work);
    return rc;
}
