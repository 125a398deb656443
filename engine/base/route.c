// route.c — see route.h. The selection is MODEL.md's, tie-breaking included: groups and experts
// of equal score go to the lower index.
#include "route.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

size_t sd_route_work_bytes(const sd_config *c) {
    const size_t E = (size_t)c->num_experts, G = (size_t)c->num_expert_group;
    return sizeof(float) * (2 * E + G) + E + G;
}

static float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

// Index of the largest v[i] over i < n not yet taken (-1 when all are); ties to the lower index.
static int take_max(const float *v, int n, const unsigned char *taken) {
    int best = -1;
    for (int i = 0; i < n; i++)
        if (!taken[i] && (best < 0 || v[i] > v[best])) best = i;
    return best;
}

void sd_route_select(const float *logits, const float *bias, const sd_config *c, void *work, int *sel, float *w,
                     float *margin) {
    const int E = c->num_experts, K = c->num_experts_per_token, G = c->num_expert_group, per = E / G;
    float *s = work, *sp = s + E, *gscore = sp + E;
    unsigned char *taken = (unsigned char *)(gscore + G), *gtaken = taken + E;
    float gmargin = INFINITY; // the last kept group's score minus the best dropped one's
    for (int e = 0; e < E; e++) {
        s[e] = sigmoid(logits[e]);
        sp[e] = s[e] + bias[e];
    }
    if (G > 1) { // keep the topk_group groups with the best (top-2 sum) score; mask the rest
        for (int g = 0; g < G; g++) { // the two largest (config.c guarantees per >= 2)
            const float *v = sp + g * per;
            float top = v[0] > v[1] ? v[0] : v[1], second = v[0] > v[1] ? v[1] : v[0];
            for (int i = 2; i < per; i++) {
                if (v[i] > top) { second = top; top = v[i]; }
                else if (v[i] > second) second = v[i];
            }
            gscore[g] = top + second;
            gtaken[g] = 0;
        }
        int last = -1;
        for (int kept = 0; kept < c->topk_group; kept++) gtaken[last = take_max(gscore, G, gtaken)] = 1;
        const int gnext = take_max(gscore, G, gtaken);
        if (gnext >= 0) gmargin = gscore[last] - gscore[gnext];
        for (int e = 0; e < E; e++)
            if (!gtaken[e / per]) sp[e] = -INFINITY;
    }
    memset(taken, 0, (size_t)E);
    float sum = 0.0f;
    for (int j = 0; j < K; j++) {
        sel[j] = take_max(sp, E, taken);
        taken[sel[j]] = 1;
        w[j] = s[sel[j]];
        sum += w[j];
    }
    for (int j = 0; j < K; j++) {
        if (c->moe_renormalize) w[j] = w[j] / sum;
        w[j] = w[j] * c->routed_scaling_factor;
    }
    if (!margin) return;
    const int next = take_max(sp, E, taken);
    const float emargin = next < 0 || sp[next] == -INFINITY ? INFINITY : sp[sel[K - 1]] - sp[next];
    *margin = emargin < gmargin ? emargin : gmargin;
}

float sd_route_margin(const float *logits, const float *bias, const sd_config *c) {
    const int K = c->num_experts_per_token;
    void *work = malloc(sd_route_work_bytes(c));
    int *sel = malloc(sizeof(int) * (size_t)K);
    float *w = malloc(sizeof(float) * (size_t)K), margin = NAN;
    if (work && sel && w) sd_route_select(logits, bias, c, work, sel, w, &margin);
    free(work);
    free(sel);
    free(w);
    return margin;
}
