// moe.c — SwiGLU FFN and the MoE block on the CPU (MODEL.md "MoE": routing in fp32).
#include <string.h>
#include "ops.h"    // sd_dot_*, sd_linear, sd_rmsnorm, activations
#include "layers.h"

void sd_ffn_forward(const sd_ffn_weights *w, const float *x, int T, float *out, float *h1, float *h2) {
    const int I = w->gate.rows;
    sd_linear(&w->gate, x, T, h1);
    sd_linear(&w->up, x, T, h2);
    for (size_t i = 0; i < (size_t)T * I; i++) h1[i] = sd_silu(h1[i]) * h2[i];
    sd_linear(&w->down, h1, T, out);
}

// Index of the largest v[i] over i < n not yet taken; ties go to the lower index (strict >).
static int take_max(const float *v, int n, const unsigned char *taken) {
    int best = -1;
    for (int i = 0; i < n; i++)
        if (!taken[i] && (best < 0 || v[i] > v[best])) best = i;
    return best;
}

void sd_moe_route(const sd_moe_weights *w, const sd_config *c, const float *b, int *sel, float *wts) {
    const int E = c->num_experts, K = c->num_experts_per_token, D = c->hidden_size;
    const int G = c->num_expert_group, per = E / G;
    float s[E], sp[E];
    unsigned char taken[E];
    for (int e = 0; e < E; e++) {
        s[e] = sd_sigmoid(sd_dot_f32(w->router + (size_t)e * D, b, D));
        sp[e] = s[e] + w->bias[e];
    }
    if (G > 1) { // keep the topk_group groups with the best (top-2 sum) score; mask the rest
        float gscore[G];
        unsigned char gtaken[G];
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
        for (int kept = 0; kept < c->topk_group; kept++) gtaken[take_max(gscore, G, gtaken)] = 1;
        for (int e = 0; e < E; e++)
            if (!gtaken[e / per]) sp[e] = -INFINITY;
    }
    memset(taken, 0, (size_t)E);
    float sum = 0.0f;
    for (int j = 0; j < K; j++) {
        sel[j] = take_max(sp, E, taken);
        taken[sel[j]] = 1;
        wts[j] = s[sel[j]];
        sum += wts[j];
    }
    for (int j = 0; j < K; j++) {
        if (c->moe_renormalize) wts[j] = wts[j] / sum;
        wts[j] = wts[j] * c->routed_scaling_factor;
    }
}

void sd_moe_forward(const sd_moe_weights *w, const sd_config *c, sd_state *s, const float *b, int T, float *out) {
    const int E = c->num_experts, K = c->num_experts_per_token, D = c->hidden_size;
    sd_scratch *x = &s->scratch;
    for (int t = 0; t < T; t++)
        sd_moe_route(w, c, b + (size_t)t * D, x->sel + (size_t)t * K, x->w + (size_t)t * K);

    // Each selected expert runs once over the tokens that chose it (its weights are read once
    // per forward); its output rows go to exp_out[t][j]. Per token this is the same arithmetic
    // as running the expert alone, since every output element is one fixed-order dot.
    int rows_t[T * K], rows_j[T * K];
    for (int e = 0; e < E; e++) {
        if (!sd_config_holds_expert(c, e)) continue; // a rank's shard runs only its own experts
        int n = 0;
        for (int t = 0; t < T; t++)
            for (int j = 0; j < K; j++)
                if (x->sel[(size_t)t * K + j] == e) {
                    rows_t[n] = t; rows_j[n] = j;
                    memcpy(x->xg + (size_t)n * D, b + (size_t)t * D, sizeof(float) * D);
                    n++;
                }
        if (!n) continue;
        sd_ffn_forward(&w->experts[e], x->xg, n, x->yg, x->ffn_h1, x->ffn_h2);
        for (int r = 0; r < n; r++)
            memcpy(x->exp_out + ((size_t)rows_t[r] * K + rows_j[r]) * D, x->yg + (size_t)r * D, sizeof(float) * D);
    }
    // out[t] = Σ_j w_j · y_j in selection order (over the experts held), then + shared(b).
    for (int t = 0; t < T; t++) {
        float *o = out + (size_t)t * D;
        for (int i = 0; i < D; i++) o[i] = 0.0f;
        for (int j = 0; j < K; j++) {
            if (!sd_config_holds_expert(c, x->sel[(size_t)t * K + j])) continue;
            const float wj = x->w[(size_t)t * K + j];
            const float *y = x->exp_out + ((size_t)t * K + j) * D;
            for (int i = 0; i < D; i++) o[i] += wj * y[i];
        }
    }
    if (c->num_shared_experts > 0) {
        sd_ffn_forward(&w->shared, b, T, x->yg, x->ffn_h1, x->ffn_h2);
        for (size_t i = 0; i < (size_t)T * D; i++) out[i] += x->yg[i];
    }
}
