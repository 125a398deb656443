// mla.c — multi-head latent attention on the CPU, absorbed form (MODEL.md "MLA"):
// q̃_h = W_UK,hᵀ qn_h is scored against the cached latents c_j, and W_UV,h is applied once to
// the probability-weighted latent sum. Causal: the token at position t sees rows 0..t.
#include <string.h>
#include "ops.h"    // sd_dot_*, sd_linear, sd_rmsnorm, activations
#include "layers.h"

// Interleaved-pair rotary embedding at position pos: pairs (2i, 2i+1) turn by pos·θ^(-2i/dr).
// Angles in double, then rounded to float once, so every backend can reproduce them.
static void rope(float *x, int dr, int pos, double theta) {
    for (int i = 0; i < dr / 2; i++) {
        double ang = (double)pos * pow(theta, -2.0 * i / dr);
        float cs = (float)cos(ang), sn = (float)sin(ang);
        float x0 = x[2 * i], x1 = x[2 * i + 1];
        x[2 * i] = x0 * cs - x1 * sn;
        x[2 * i + 1] = x0 * sn + x1 * cs;
    }
}

// One head, one query token at position pos over cache rows 0..pos; writes o_h (dv).
static void attend(const sd_mla_weights *w, const sd_config *c, const sd_mla_state *m, int h,
                   const float *qh, int pos, float *qabs, float *lat, float *scores, float *o) {
    const int R = c->kv_lora_rank, dn = c->qk_nope_head_dim, dr = c->qk_rope_head_dim, dv = c->v_head_dim;
    const int row0 = h * (dn + dv); // W_UK,h rows row0 .. row0+dn-1, then W_UV,h
    // q̃ = Σ_i qn[i] · W_UK,h[i] (i increasing), each weight widened to f32 where it is read
    // (no row buffer: a latent width from the config never sizes a stack array).
    for (int r = 0; r < R; r++) qabs[r] = 0.0f;
    for (int i = 0; i < dn; i++) {
        const size_t at = (size_t)(row0 + i) * R;
        if (w->kv_b.dtype == SD_DT_BF16) {
            const uint16_t *row = (const uint16_t *)w->kv_b.data + at;
            for (int r = 0; r < R; r++) qabs[r] += qh[i] * sd_bf16_to_f32(row[r]);
        } else {
            const float *row = (const float *)w->kv_b.data + at;
            for (int r = 0; r < R; r++) qabs[r] += qh[i] * row[r];
        }
    }
    // score_j = (q̃·c_j + qp·kpe_j) · (dn+dr)^-0.5; softmax with the max subtracted, sum in j order.
    const float scale = 1.0f / sqrtf((float)(dn + dr));
    float mx = -INFINITY;
    for (int j = 0; j <= pos; j++) {
        float sc = (sd_dot_f32(qabs, m->c + (size_t)j * R, R) + sd_dot_f32(qh + dn, m->kpe + (size_t)j * dr, dr)) * scale;
        scores[j] = sc;
        if (sc > mx) mx = sc;
    }
    float sum = 0.0f;
    for (int j = 0; j <= pos; j++) {
        scores[j] = expf(scores[j] - mx);
        sum += scores[j];
    }
    const float inv = 1.0f / sum;
    // lat = Σ_j p_j c_j (j increasing), o_h = W_UV,h · lat.
    for (int r = 0; r < R; r++) lat[r] = 0.0f;
    for (int j = 0; j <= pos; j++) {
        const float p = scores[j] * inv;
        const float *cj = m->c + (size_t)j * R;
        for (int r = 0; r < R; r++) lat[r] += p * cj[r];
    }
    for (int v = 0; v < dv; v++) o[v] = sd_mat_dot_row(&w->kv_b, row0 + dn + v, lat);
}

void sd_mla_forward(const sd_mla_weights *w, const sd_config *c, sd_state *s, int layer,
                    const float *a, int T, float *out) {
    const int Hm = c->num_attention_heads, R = c->kv_lora_rank, dn = c->qk_nope_head_dim;
    const int dr = c->qk_rope_head_dim, dv = c->v_head_dim, qw = dn + dr;
    const int pos0 = sd_state_next_pos(s);
    sd_scratch *x = &s->scratch;
    sd_mla_state *m = &s->mla[layer];

    sd_linear(&w->q, a, T, x->mq);
    sd_linear(&w->kv_a, a, T, x->kv);
    for (int t = 0; t < T; t++) {
        const int pos = pos0 + t;
        const float *kv = x->kv + (size_t)t * (R + dr);
        sd_rmsnorm(kv, w->kv_a_norm, R, c->rms_norm_eps, m->c + (size_t)pos * R);
        memcpy(m->kpe + (size_t)pos * dr, kv + R, sizeof(float) * dr);
        if (!c->mla_use_nope) {
            rope(m->kpe + (size_t)pos * dr, dr, pos, c->rope_theta);
            for (int h = 0; h < Hm; h++) rope(x->mq + (size_t)t * Hm * qw + (size_t)h * qw + dn, dr, pos, c->rope_theta);
        }
    }
#pragma omp parallel for schedule(static) if (Hm > 1 && (long)T * Hm * (pos0 + T) * R >= SD_PARALLEL_MIN_WORK)
    for (int h = 0; h < Hm; h++)
        for (int t = 0; t < T; t++)
            attend(w, c, m, h, x->mq + (size_t)t * Hm * qw + (size_t)h * qw, pos0 + t,
                   x->qabs + ((size_t)t * Hm + h) * R, x->lat + ((size_t)t * Hm + h) * R,
                   x->scores + (size_t)h * s->capacity, x->mo + (size_t)t * Hm * dv + (size_t)h * dv);
    sd_linear(&w->o, x->mo, T, out);
}
