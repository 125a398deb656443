// moe.c — SwiGLU FFN and the MoE block on the CPU (MODEL.md "MoE": routing in fp32).
#include <stdlib.h>
#include <string.h>
#include "ops.h"    // sd_dot_*, sd_linear, sd_rmsnorm, activations
#include "layers.h"
#include "route.h"  // sd_route_select: MODEL.md's selection from the logits

void sd_ffn_forward(const sd_ffn_weights *w, const float *x, int T, float *out, float *h1, float *h2) {
    const int I = w->gate.rows;
    sd_linear(&w->gate, x, T, h1);
    sd_linear(&w->up, x, T, h2);
    for (size_t i = 0; i < (size_t)T * I; i++) h1[i] = sd_silu(h1[i]) * h2[i];
    sd_linear(&w->down, h1, T, out);
}

// The router's logits of one token b: one fixed-order dot per expert.
static void router_logits(const sd_moe_weights *w, const sd_config *c, const float *b, float *logits) {
    for (int e = 0; e < c->num_experts; e++) logits[e] = sd_dot_f32(w->router + (size_t)e * c->hidden_size, b, c->hidden_size);
}

void sd_moe_route(const sd_moe_weights *w, const sd_config *c, const float *b, int *sel, float *wts) {
    float *logits = malloc(sizeof(float) * (size_t)c->num_experts);
    void *work = malloc(sd_route_work_bytes(c));
    if (logits && work) {
        router_logits(w, c, b, logits);
        sd_route_select(logits, w->bias, c, work, sel, wts, NULL);
    } else {
        for (int j = 0; j < c->num_experts_per_token; j++) sel[j] = -1, wts[j] = NAN; // never a silent route
    }
    free(logits);
    free(work);
}

void sd_moe_route_rows(const sd_moe_weights *w, const sd_config *c, sd_state *s, const float *b, int T) {
    const int E = c->num_experts, K = c->num_experts_per_token, D = c->hidden_size;
    sd_scratch *x = &s->scratch;
    for (int t = 0; t < T; t++) { // the logits stay in the scratch (the route tap's margins)
        router_logits(w, c, b + (size_t)t * D, x->router + (size_t)t * E);
        sd_route_select(x->router + (size_t)t * E, w->bias, c, x->route_work, x->sel + (size_t)t * K, x->w + (size_t)t * K,
                        NULL);
    }
}

void sd_moe_forward(const sd_moe_weights *w, const sd_config *c, sd_state *s, const float *b, int T, float *out) {
    sd_moe_route_rows(w, c, s, b, T);
    sd_moe_experts(w, c, s, b, T, out);
}

void sd_moe_experts(const sd_moe_weights *w, const sd_config *c, sd_state *s, const float *b, int T, float *out) {
    const int E = c->num_experts, K = c->num_experts_per_token, D = c->hidden_size;
    sd_scratch *x = &s->scratch;

    // Each selected expert runs once over the tokens that chose it (its weights are read once
    // per forward); its output rows go to exp_out[t][j]. Per token this is the same arithmetic
    // as running the expert alone, since every output element is one fixed-order dot.
    int *rows_t = x->expert_rows, *rows_j = x->expert_rows + (size_t)T * K; // the state's scratch, not the stack
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
