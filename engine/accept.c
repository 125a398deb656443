// accept.c — the CPU reference of step 3 (accept.h states the rule) and the dispatcher that
// sends a round's acceptance to the backend holding its distributions.
#include "accept.h"
#include "backend.h" // sd_backend
#include "philox.h"  // sd_uniform
#include "sample.h"  // sd_sample, sd_residual

void sd_accept_ref(const sd_accept_args *a, int *n, int *bonus) {
    const int V = a->V, k = a->k;
    if (a->top) { // greedy: d_i stands while it is the target's argmax
        int i = 0;
        while (i < k && a->top[i] == a->drafts[i]) i++;
        *n = i;
        *bonus = a->top[i];
        return;
    }
    for (int i = 1; i <= k; i++) {
        const float *p = a->p + (size_t)(i - 1) * V, *q = a->q + (size_t)(i - 1) * V;
        const int d = a->drafts[i - 1];
        const uint32_t pos = a->pos_x + (uint32_t)i;
        if (sd_uniform(a->seed, a->round, pos, SD_DRAW_ACCEPT) * q[d] < p[d]) continue; // P = min(1, p/q)
        sd_residual(p, q, V, a->work);
        *n = i - 1;
        *bonus = sd_sample(a->work, V, sd_uniform(a->seed, a->round, pos, SD_DRAW_BONUS));
        return;
    }
    *n = k;
    *bonus = sd_sample(a->p + (size_t)k * V, V, sd_uniform(a->seed, a->round, a->pos_x + (uint32_t)k + 1, SD_DRAW_BONUS));
}

sd_code sd_accept(const sd_model *target, const sd_accept_args *a, int *n, int *bonus, sd_status *st) {
    if (a->k < 1 || a->k > SD_ACCEPT_MAX_K)
        return sd_fail(st, SD_ERR_USAGE, "accept: k must be in 1..%d, got %d", SD_ACCEPT_MAX_K, a->k);
    if (a->V != target->cfg.vocab_size)
        return sd_fail(st, SD_ERR_USAGE, "accept: V = %d, the target's vocabulary is %d", a->V, target->cfg.vocab_size);
    for (int i = 0; i < a->k; i++)
        if (a->drafts[i] < 0 || a->drafts[i] >= a->V)
            return sd_fail(st, SD_ERR_DATA, "accept: draft d_%d = %d is outside the vocabulary 0..%d", i + 1, a->drafts[i],
                           a->V - 1);
    if (a->top || !target->backend) { // the inputs are in host memory: nothing to move
        sd_accept_ref(a, n, bonus);
        return SD_OK;
    }
    if (!target->backend->accept)
        return sd_fail(st, SD_ERR_UNSUPPORTED, "accept: backend '%s' has no accept op for sampled rounds",
                       target->backend->name);
    return target->backend->accept(target, a, n, bonus, st);
}
