// kda.c — Kimi Delta Attention on the CPU (MODEL.md "KDA"; flash-linear-attention's
// naive_recurrent_kda with q, k L2-normalised and scale d^-0.5).
#include <string.h>
#include "ops.h"    // sd_dot_*, sd_linear, sd_rmsnorm, activations
#include "layers.h"
#include "kda_scan.h" // sd_kda_step

// Depthwise causal conv of one projection (which: 0 q, 1 k, 2 v) for the token at pos, then
// silu. Tap j multiplies the input of position pos-(W-1)+j; positions before 0 are zero; the sum
// runs over j in increasing order.
static void conv_token(const float *conv_rows, const sd_state *s, const float *taps, int which,
                       int pos, int P, int W, float *out) {
    for (int ch = 0; ch < P; ch++) {
        float acc = 0.0f;
        for (int j = 0; j < W; j++) {
            int p = pos - (W - 1) + j;
            if (p < 0) continue;
            const float *row = conv_rows + (size_t)sd_state_conv_row(s, p) * 3 * P;
            acc += taps[(size_t)ch * W + j] * row[which * P + ch];
        }
        out[ch] = sd_silu(acc);
    }
}

// x_h / sqrt(Σ x_h² + 1e-6) for each head, in place.
static void l2norm_heads(float *x, int H, int d) {
    for (int h = 0; h < H; h++) {
        float *v = x + (size_t)h * d;
        float inv = 1.0f / sqrtf(sd_dot_f32(v, v, d) + 1e-6f);
        for (int i = 0; i < d; i++) v[i] *= inv;
    }
}

// One head, one token of the delta rule (kda_scan.h). o holds ks = Sᵀk and then u until the last
// pass overwrites it with the output, so the step needs no buffer of its own (none sized by d on
// the stack); the sums run in the same order as written in kda_scan.h.
void sd_kda_step(const float *S_src, float *S_dst, const float *q, const float *k, const float *v,
                     const float *g, float beta, int d, float *o) {
    float *ks = o, *u = o;
    for (int j = 0; j < d; j++) ks[j] = 0.0f;
    for (int i = 0; i < d; i++) {
        const float e = expf(g[i]);
        const float *src = S_src + (size_t)i * d;
        float *dst = S_dst + (size_t)i * d;
        for (int j = 0; j < d; j++) {
            dst[j] = src[j] * e;
            ks[j] += dst[j] * k[i];
        }
    }
    for (int j = 0; j < d; j++) u[j] = beta * (v[j] - ks[j]);
    for (int i = 0; i < d; i++) {
        float *dst = S_dst + (size_t)i * d;
        for (int j = 0; j < d; j++) dst[j] += k[i] * u[j];
    }
    const float scale = 1.0f / sqrtf((float)d);
    for (int j = 0; j < d; j++) o[j] = 0.0f;
    for (int i = 0; i < d; i++) {
        const float *dst = S_dst + (size_t)i * d;
        const float qs = q[i] * scale;
        for (int j = 0; j < d; j++) o[j] += dst[j] * qs;
    }
}

void sd_kda_forward(const sd_kda_weights *w, const sd_config *c, sd_state *s, int layer,
                    const float *a, int T, float *out, trace_burst *tb) {
    const int H = c->kda_num_heads, d = c->kda_head_dim, P = H * d, W = c->short_conv_kernel_size;
    const int pos0 = sd_state_next_pos(s);
    sd_scratch *x = &s->scratch;
    float *conv_rows = s->kda[layer].conv;

    sd_linear(&w->q, a, T, x->q);
    sd_linear(&w->k, a, T, x->k);
    sd_linear(&w->v, a, T, x->v);
    for (int t = 0; t < T; t++) {
        float *row = conv_rows + (size_t)sd_state_conv_row(s, pos0 + t) * 3 * P;
        memcpy(row, x->q + (size_t)t * P, sizeof(float) * P);
        memcpy(row + P, x->k + (size_t)t * P, sizeof(float) * P);
        memcpy(row + 2 * P, x->v + (size_t)t * P, sizeof(float) * P);
    }
    for (int t = 0; t < T; t++) {
        conv_token(conv_rows, s, w->q_conv, 0, pos0 + t, P, W, x->qc + (size_t)t * P);
        conv_token(conv_rows, s, w->k_conv, 1, pos0 + t, P, W, x->kc + (size_t)t * P);
        conv_token(conv_rows, s, w->v_conv, 2, pos0 + t, P, W, x->vc + (size_t)t * P);
        l2norm_heads(x->qc + (size_t)t * P, H, d);
        l2norm_heads(x->kc + (size_t)t * P, H, d);
    }

    // Gates: g = -exp(A_log) · softplus(f_b·(f_a·a) + dt_bias) (log decay <= 0), β = sigmoid(b·a).
    sd_linear(&w->f_a, a, T, x->fa);
    sd_linear(&w->f_b, x->fa, T, x->gate);
    sd_linear(&w->b, a, T, x->beta);
    for (int t = 0; t < T; t++) {
        for (int ch = 0; ch < P; ch++) {
            float *g = &x->gate[(size_t)t * P + ch];
            *g = -expf(w->A_log[ch / d]) * sd_softplus(*g + w->dt_bias[ch]);
        }
        for (int h = 0; h < H; h++) x->beta[(size_t)t * H + h] = sd_sigmoid(x->beta[(size_t)t * H + h]);
    }

    // The recurrence: sequential over tokens, independent over heads.
    uint64_t t_scan = trace_bucket_start(tb);
    const size_t head_elems = (size_t)d * d;
#pragma omp parallel for schedule(static) if (H > 1 && (long)(T * head_elems * H) >= SD_PARALLEL_MIN_WORK)
    for (int h = 0; h < H; h++)
        for (int t = 0; t < T; t++) {
            const size_t o = (size_t)t * P + (size_t)h * d;
            sd_kda_step(sd_state_kda_S(s, layer, pos0 + t) + h * head_elems,
                     sd_state_kda_S(s, layer, pos0 + t + 1) + h * head_elems,
                     x->qc + o, x->kc + o, x->vc + o, x->gate + o, x->beta[(size_t)t * H + h], d, x->y + o);
        }
    trace_bucket_stop(tb, TRACE_BUCKET_SCAN, t_scan);

    // Output: rmsnorm(o_h, o_norm) ⊙ sigmoid(g_b·(g_a·a)), then o_proj.
    sd_linear(&w->g_a, a, T, x->ga);
    sd_linear(&w->g_b, x->ga, T, x->gb);
    for (int t = 0; t < T; t++)
        for (int h = 0; h < H; h++) {
            float *y = x->y + (size_t)t * P + (size_t)h * d;
            const float *gb = x->gb + (size_t)t * P + (size_t)h * d;
            sd_rmsnorm(y, w->o_norm, d, c->rms_norm_eps, y);
            for (int j = 0; j < d; j++) y[j] *= sd_sigmoid(gb[j]);
        }
    sd_linear(&w->o, x->y, T, out);
}
