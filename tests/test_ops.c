// test_ops.c — the CPU reference ops against MODEL.md and ops.h:
//   kda    the KDA layer vs a float64 line-by-line transcription of MODEL.md's pseudocode
//   mla    the absorbed MLA layer vs the naive (per-head K and V) float64 form, RoPE on and off
//   route  the MoE router on hand-built scores: ordering, ties, groups, bias, renormalisation
//   moe    sd_moe_forward ≡ Σ_j w_j·expert_{sel_j} + shared, bitwise, whatever T
//   dot    ops.h's accumulation order, bitwise; sd_linear independent of T and of threads
//   conv   bf16 and f16 conversions
#include <math.h>
#include <omp.h> // omp_set_num_threads (sd_linear's thread independence)
#include <string.h>
#include "common.h" // synth_from, load_config
#include "layers.h" // sd_kda_forward, sd_mla_forward, sd_moe_route, sd_moe_forward, sd_ffn_forward
#include "ops.h"    // sd_dot_*, sd_linear, sd_rmsnorm, conversions
#include "route.h"  // sd_route_select, sd_route_margin

#define TINY "configs/tiny.json" // 4 layers: KDA 0,1,3, MLA 2; dense 0, MoE 1-3 (E=8, K=2, G=2)
#define SEED 0x5eed0b5ull

// ---------------------------------------------------------------------------------------------
// Small helpers

// xorshift32 → uniform in [-1, 1).
static float frand(uint32_t *x) {
    *x ^= *x << 13; *x ^= *x >> 17; *x ^= *x << 5;
    return (float)((double)(*x >> 8) * (1.0 / 8388608.0) - 1.0);
}

// n values uniform in [-scale, scale).
static void fill_uniform(float *v, size_t n, uint32_t seed, float scale) {
    uint32_t x = seed * 2654435761u + 1u;
    for (size_t i = 0; i < n; i++) v[i] = frand(&x) * scale;
}

static int same_bits(const float *a, const float *b, size_t n) { return memcmp(a, b, sizeof(float) * n) == 0; }

static uint32_t f32_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static float bits_f32(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

// One weight element as double (F32 or BF16 matrices alike).
static double mat_at(const sd_mat *m, int r, int c) {
    size_t i = (size_t)r * m->cols + c;
    return m->dtype == SD_DT_BF16 ? sd_bf16_to_f32(((const uint16_t *)m->data)[i]) : ((const float *)m->data)[i];
}

// y = W·x in double.
static void mv(const sd_mat *m, const double *x, double *y) {
    for (int r = 0; r < m->rows; r++) {
        double acc = 0;
        for (int c = 0; c < m->cols; c++) acc += mat_at(m, r, c) * x[c];
        y[r] = acc;
    }
}

// MODEL.md rmsnorm in double: x / sqrt(mean(x²) + eps) ⊙ w.
static void rmsnorm_d(const double *x, const float *w, int n, double eps, double *out) {
    double ss = 0;
    for (int i = 0; i < n; i++) ss += x[i] * x[i];
    double inv = 1.0 / sqrt(ss / n + eps);
    for (int i = 0; i < n; i++) out[i] = x[i] * inv * w[i];
}

static double sigmoid_d(double x) { return 1.0 / (1.0 + exp(-x)); }
static double silu_d(double x) { return x * sigmoid_d(x); }
static double softplus_d(double x) { return log1p(exp(x)); }

// ‖out − ref‖ / ‖ref‖ over n values.
static double rel_err(const float *out, const double *ref, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        num += (out[i] - ref[i]) * (out[i] - ref[i]);
        den += ref[i] * ref[i];
    }
    return sqrt(num / den);
}

// ---------------------------------------------------------------------------------------------
// Running one mixer layer directly (the walk sd_forward does, minus the residual stream)

// Feed a (n, D) through layer `layer`'s mixer in forwards of `chunk` tokens, committing each.
// s is initialised here (capacity n, max_T chunk); the caller inspects it and frees it.
static void run_mixer(const sd_model *m, const sd_config *c, int layer, const float *a, int n, int chunk,
                      float *out, sd_state *s) {
    sd_status st = {0};
    const int D = c->hidden_size;
    cr_assert_eq(sd_state_init(s, c, n, chunk, &st), SD_OK, "%s", st.msg);
    const sd_layer_weights *ly = &m->w.layers[layer];
    for (int t = 0; t < n; t += chunk) {
        const int T = n - t < chunk ? n - t : chunk;
        if (ly->mixer == SD_MIXER_KDA) sd_kda_forward(&ly->kda, c, s, layer, a + (size_t)t * D, T, out + (size_t)t * D, NULL);
        else sd_mla_forward(&ly->mla, c, s, layer, a + (size_t)t * D, T, out + (size_t)t * D);
        sd_state_advance(s, T); // what sd_forward does after its layer walk
        cr_assert_eq(sd_state_commit(s, T, &st), SD_OK, "%s", st.msg);
    }
}

// The chunkings every layer test runs: one forward, single-token decode steps, and a ragged split.
static const int CHUNKS[] = {0 /* = all n at once */, 1, 5};
#define N_CHUNKS (int)(sizeof CHUNKS / sizeof CHUNKS[0])

// ---------------------------------------------------------------------------------------------
// KDA: MODEL.md's pseudocode, transcribed in double

// a (T, D) → out (T, D); S (Hk, d, d) is the state after T tokens from zero history.
static void kda_ref(const sd_kda_weights *w, const sd_config *c, const float *a, int T, double *out, double *S) {
    const int D = c->hidden_size, H = c->kda_num_heads, d = c->kda_head_dim, P = H * d, W = c->short_conv_kernel_size;
    double *raw = calloc((size_t)T * 3 * P, sizeof(double)); // raw q, k, v projections by position
    double av[D], qkv[3][P], g[P], fa[d], fb[P], bl[H], ga[d], gb[P], y[P], u[d], o[d];
    memset(S, 0, sizeof(double) * H * d * d);
    for (int t = 0; t < T; t++) {
        for (int i = 0; i < D; i++) av[i] = a[(size_t)t * D + i];
        // qr, kr, vr = q_proj·a, k_proj·a, v_proj·a
        double *r = raw + (size_t)t * 3 * P;
        mv(&w->q, av, r); mv(&w->k, av, r + P); mv(&w->v, av, r + 2 * P);
        // causal depthwise conv, zero history; tap j multiplies position t-(W-1)+j; then silu
        const float *taps[3] = {w->q_conv, w->k_conv, w->v_conv};
        for (int which = 0; which < 3; which++)
            for (int ch = 0; ch < P; ch++) {
                double acc = 0;
                for (int j = 0; j < W; j++) {
                    int p = t - (W - 1) + j;
                    double x = p < 0 ? 0.0 : raw[(size_t)p * 3 * P + which * P + ch];
                    acc += taps[which][(size_t)ch * W + j] * x;
                }
                qkv[which][ch] = silu_d(acc);
            }
        double *q = qkv[0], *k = qkv[1], *v = qkv[2];
        // per head: q, k ← x / sqrt(Σx² + 1e-6)
        for (int h = 0; h < H; h++)
            for (int which = 0; which < 2; which++) {
                double *x = qkv[which] + h * d, ss = 0;
                for (int i = 0; i < d; i++) ss += x[i] * x[i];
                for (int i = 0; i < d; i++) x[i] /= sqrt(ss + 1e-6);
            }
        // g = -exp(A_log[h]) · softplus(f_b·(f_a·a) + dt_bias);  β = sigmoid(b·a)
        mv(&w->f_a, av, fa); mv(&w->f_b, fa, fb);
        for (int ch = 0; ch < P; ch++) g[ch] = -exp((double)w->A_log[ch / d]) * softplus_d(fb[ch] + w->dt_bias[ch]);
        mv(&w->b, av, bl);
        mv(&w->g_a, av, ga); mv(&w->g_b, ga, gb);
        for (int h = 0; h < H; h++) {
            double *Sh = S + (size_t)h * d * d; // Sh[i*d + j]: key dim i, value dim j
            const double *qh = q + h * d, *kh = k + h * d, *vh = v + h * d, *gh = g + h * d;
            const double beta = sigmoid_d(bl[h]);
            for (int i = 0; i < d; i++)          // S ⊙ exp(g)[:, None]
                for (int j = 0; j < d; j++) Sh[i * d + j] *= exp(gh[i]);
            for (int j = 0; j < d; j++) {         // u = β (v − Sᵀk)
                double stk = 0;
                for (int i = 0; i < d; i++) stk += Sh[i * d + j] * kh[i];
                u[j] = beta * (vh[j] - stk);
            }
            for (int i = 0; i < d; i++)          // S += k uᵀ
                for (int j = 0; j < d; j++) Sh[i * d + j] += kh[i] * u[j];
            for (int j = 0; j < d; j++) {         // o = Sᵀ (q · d^-0.5)
                double acc = 0;
                for (int i = 0; i < d; i++) acc += Sh[i * d + j] * (qh[i] / sqrt((double)d));
                o[j] = acc;
            }
            rmsnorm_d(o, w->o_norm, d, c->rms_norm_eps, y + h * d); // rmsnorm(o, o_norm) ⊙ sigmoid(g_b·(g_a·a))
            for (int j = 0; j < d; j++) y[h * d + j] *= sigmoid_d(gb[h * d + j]);
        }
        mv(&w->o, y, out + (size_t)t * D);
    }
    free(raw);
}

// Tolerance: the engine runs fp32 (rounding ~6e-8 per op) through ~10 dependent ops per token
// and a recurrence over a dozen steps whose decays are ≤ 1, so errors do not compound
// beyond a few 1e-7 (measured: ≤ 5e-7 per token, 2e-7 on S); 1e-5 relative leaves a factor
// 20 of margin and still catches any wrong term (a wrong sign, tap, norm or gate moves the
// result by ≥ 1e-3).
#define KDA_TOL 1e-5

Test(kda, matches_model_md_transcription) {
    sd_model m;
    synth_from(TINY, SEED, 0, 99, 1.0f, &m);
    const sd_config *c = &m.cfg;
    const int layer = 0, n = 12, D = c->hidden_size, H = c->kda_num_heads, d = c->kda_head_dim;
    cr_assert_eq(c->mixer[layer], SD_MIXER_KDA);
    float *a = malloc(sizeof(float) * n * D), *out = malloc(sizeof(float) * n * D), *first = malloc(sizeof(float) * n * D);
    double *ref = malloc(sizeof(double) * n * D), *S_ref = malloc(sizeof(double) * H * d * d);
    fill_uniform(a, (size_t)n * D, 11, sqrtf(3.0f)); // unit RMS, like a normed residual
    kda_ref(&m.w.layers[layer].kda, c, a, n, ref, S_ref);

    for (int k = 0; k < N_CHUNKS; k++) {
        const int chunk = CHUNKS[k] ? CHUNKS[k] : n;
        sd_state s;
        run_mixer(&m, c, layer, a, n, chunk, out, &s);
        // Per token, so an error confined to the first positions (conv history) is not diluted.
        for (int t = 0; t < n; t++) {
            double e = rel_err(out + (size_t)t * D, ref + (size_t)t * D, D);
            cr_assert(e <= KDA_TOL, "chunk %d token %d: relative error %.3g > %g", chunk, t, e, KDA_TOL);
        }
        // The state after n tokens, every head, key dim i, value dim j.
        const float *S = sd_state_kda_S(&s, layer, n);
        double num = 0, den = 0;
        for (int i = 0; i < H * d * d; i++) {
            num += (S[i] - S_ref[i]) * (S[i] - S_ref[i]);
            den += S_ref[i] * S_ref[i];
        }
        cr_assert(sqrt(num / den) <= KDA_TOL, "chunk %d: state S relative error %.3g > %g", chunk, sqrt(num / den), KDA_TOL);
        // layers.h: a token's arithmetic is the same whatever T is — bitwise.
        if (k == 0) memcpy(first, out, sizeof(float) * n * D);
        else cr_assert(same_bits(out, first, (size_t)n * D), "chunk %d differs bitwise from one forward of %d", chunk, n);
        sd_state_free(&s);
    }
    free(a); free(out); free(first); free(ref); free(S_ref);
    sd_model_free(&m);
}

// ---------------------------------------------------------------------------------------------
// MLA: the naive form (per-head keys W_UK,h c_j and values W_UV,h c_j), in double

// Interleaved pairs (2i, 2i+1) rotated by pos·θ^(-2i/dr).
static void rope_d(double *x, int dr, int pos, double theta) {
    for (int i = 0; i < dr / 2; i++) {
        double ang = pos * pow(theta, -2.0 * i / dr), x0 = x[2 * i], x1 = x[2 * i + 1];
        x[2 * i] = x0 * cos(ang) - x1 * sin(ang);
        x[2 * i + 1] = x0 * sin(ang) + x1 * cos(ang);
    }
}

// a (T, D) → out (T, D); cache_c (T, R), cache_kpe (T, dr) as MODEL.md appends them.
static void mla_ref(const sd_mla_weights *w, const sd_config *c, const float *a, int T, double *out,
                    double *cache_c, double *cache_kpe) {
    const int D = c->hidden_size, Hm = c->num_attention_heads, R = c->kv_lora_rank;
    const int dn = c->qk_nope_head_dim, dr = c->qk_rope_head_dim, dv = c->v_head_dim, qw = dn + dr;
    double av[D], q[Hm * qw], kv[R + dr], kn[dn], vj[dv], o[Hm * dv], score[T];
    for (int t = 0; t < T; t++) {
        for (int i = 0; i < D; i++) av[i] = a[(size_t)t * D + i];
        mv(&w->q, av, q);
        mv(&w->kv_a, av, kv);
        double *ct = cache_c + (size_t)t * R, *kpe = cache_kpe + (size_t)t * dr;
        rmsnorm_d(kv, w->kv_a_norm, R, c->rms_norm_eps, ct);
        memcpy(kpe, kv + R, sizeof(double) * dr);
        if (!c->mla_use_nope) {
            rope_d(kpe, dr, t, c->rope_theta);
            for (int h = 0; h < Hm; h++) rope_d(q + h * qw + dn, dr, t, c->rope_theta);
        }
        for (int h = 0; h < Hm; h++) {
            const double *qn = q + h * qw, *qp = qn + dn;
            const int row0 = h * (dn + dv); // W_UK,h: rows row0.., W_UV,h: rows row0+dn..
            double mx = -INFINITY, sum = 0;
            for (int j = 0; j <= t; j++) {
                const double *cj = cache_c + (size_t)j * R;
                for (int i = 0; i < dn; i++) {
                    kn[i] = 0;
                    for (int r = 0; r < R; r++) kn[i] += mat_at(&w->kv_b, row0 + i, r) * cj[r];
                }
                double sc = 0;
                for (int i = 0; i < dn; i++) sc += qn[i] * kn[i];
                for (int i = 0; i < dr; i++) sc += qp[i] * cache_kpe[(size_t)j * dr + i];
                score[j] = sc / sqrt((double)qw);
                if (score[j] > mx) mx = score[j];
            }
            for (int j = 0; j <= t; j++) sum += (score[j] = exp(score[j] - mx));
            for (int v = 0; v < dv; v++) o[h * dv + v] = 0;
            for (int j = 0; j <= t; j++) {
                const double *cj = cache_c + (size_t)j * R;
                for (int v = 0; v < dv; v++) {
                    vj[v] = 0;
                    for (int r = 0; r < R; r++) vj[v] += mat_at(&w->kv_b, row0 + dn + v, r) * cj[r];
                    o[h * dv + v] += score[j] / sum * vj[v];
                }
            }
        }
        mv(&w->o, o, out + (size_t)t * D);
    }
}

// Tolerance: fp32 vs fp64 of a few dot products, a softmax over ≤ 10 positions and the
// reassociation the absorbed form makes (W_UKᵀq scored against c instead of q against W_UK c):
// a few 1e-7 relative (measured: ≤ 2.4e-7 per token); 1e-5 catches any wrong rotation,
// scale or head slice.
#define MLA_TOL 1e-5

static void check_mla(bool use_nope) {
    sd_model m;
    synth_from(TINY, SEED, 0, 99, 1.0f, &m);
    sd_config c = m.cfg; // the weights do not depend on mla_use_nope
    c.mla_use_nope = use_nope;
    const int layer = 2, n = 10, D = c.hidden_size, R = c.kv_lora_rank, dr = c.qk_rope_head_dim;
    cr_assert_eq(c.mixer[layer], SD_MIXER_MLA);
    float *a = malloc(sizeof(float) * n * D), *out = malloc(sizeof(float) * n * D), *first = malloc(sizeof(float) * n * D);
    double *ref = malloc(sizeof(double) * n * D), *rc = malloc(sizeof(double) * n * R), *rk = malloc(sizeof(double) * n * dr);
    fill_uniform(a, (size_t)n * D, 22, sqrtf(3.0f));
    mla_ref(&m.w.layers[layer].mla, &c, a, n, ref, rc, rk);

    for (int k = 0; k < N_CHUNKS; k++) {
        const int chunk = CHUNKS[k] ? CHUNKS[k] : n;
        sd_state s;
        run_mixer(&m, &c, layer, a, n, chunk, out, &s);
        for (int t = 0; t < n; t++) {
            double e = rel_err(out + (size_t)t * D, ref + (size_t)t * D, D);
            cr_assert(e <= MLA_TOL, "nope=%d chunk %d token %d: relative error %.3g > %g", use_nope, chunk, t, e, MLA_TOL);
        }
        // The cache rows: normalised latents and (rotated) rope keys.
        double ec = rel_err(s.mla[layer].c, rc, (size_t)n * R), ek = rel_err(s.mla[layer].kpe, rk, (size_t)n * dr);
        cr_assert(ec <= MLA_TOL && ek <= MLA_TOL, "nope=%d chunk %d: cache c error %.3g, kpe error %.3g", use_nope, chunk, ec, ek);
        if (k == 0) memcpy(first, out, sizeof(float) * n * D);
        else cr_assert(same_bits(out, first, (size_t)n * D), "nope=%d chunk %d differs bitwise from one forward", use_nope, chunk);
        sd_state_free(&s);
    }
    free(a); free(out); free(first); free(ref); free(rc); free(rk);
    sd_model_free(&m);
}

Test(mla, absorbed_equals_naive_rope) { check_mla(false); }
Test(mla, absorbed_equals_naive_nope) { check_mla(true); }

// ---------------------------------------------------------------------------------------------
// Routing: hand-built router rows. D = 4 and b = e_0, so gate·b = router[e][0] exactly; that
// column holds logit(s_e), so sigmoid(gate·b) is the case's score s_e (to ~1 ulp) and equal
// scores are bit-equal. The other columns hold junk that b's zeros must ignore.

#define RE 8 // experts in every case
typedef struct {
    const char *name;
    int K, G, topk_group;
    bool renorm;
    double scale;     // routed_scaling_factor
    double s[RE];     // the scores sigmoid(gate·b)
    double bias[RE];  // e_score_correction_bias
    int sel[4];       // expected selection, in order
    double w[4];      // expected weights
} route_case;

static const route_case ROUTE_CASES[] = {
    {"descending order", 4, 1, 1, false, 1.0,
     {0.1, 0.5, 0.3, 0.9, 0.2, 0.7, 0.4, 0.6}, {0},
     {3, 5, 7, 1}, {0.9, 0.7, 0.6, 0.5}},
    {"ties: lower index first", 3, 1, 1, false, 1.0,
     {0.3, 0.8, 0.5, 0.8, 0.8, 0.1, 0.2, 0.4}, {0},
     {1, 3, 4}, {0.8, 0.8, 0.8}},
    {"tie for first behind a later best", 3, 1, 1, false, 1.0,
     {0.2, 0.6, 0.9, 0.1, 0.6, 0.3, 0.3, 0.9}, {0},
     {2, 7, 1}, {0.9, 0.9, 0.6}},
    {"renormalise on, scaled", 2, 1, 1, true, 2.446,
     {0.1, 0.5, 0.3, 0.9, 0.2, 0.7, 0.4, 0.6}, {0},
     {3, 5}, {0.9 / 1.6 * 2.446, 0.7 / 1.6 * 2.446}},
    {"renormalise off, scaled", 2, 1, 1, false, 2.446,
     {0.1, 0.5, 0.3, 0.9, 0.2, 0.7, 0.4, 0.6}, {0},
     {3, 5}, {0.9 * 2.446, 0.7 * 2.446}},
    {"K = 1 renormalised is the scale", 1, 1, 1, true, 2.5,
     {0.1, 0.5, 0.3, 0.9, 0.2, 0.7, 0.4, 0.6}, {0},
     {3}, {2.5}},
    // Bias: selection by s + bias, weights from s (so w need not descend).
    {"positive bias promotes, w uncorrected", 2, 1, 1, false, 1.0,
     {0.5, 0.6, 0.4, 0.1, 0.1, 0.1, 0.1, 0.1}, {0.2, 0, 0, 0, 0, 0, 0, 0},
     {0, 1}, {0.5, 0.6}},
    {"negative bias demotes, renormalised", 2, 1, 1, true, 1.0,
     {0.9, 0.8, 0.7, 0.1, 0.1, 0.1, 0.1, 0.1}, {-0.25, 0, 0, 0, 0, 0, 0, 0},
     {1, 2}, {0.8 / 1.5, 0.7 / 1.5}},
    // Groups {0..3} {4..7}, one kept. Group 0 holds the single best expert (0.95) but its top-2
    // sum 1.05 loses to group 1's 0.7 + 0.6 = 1.3. Ungrouped: {0, 5}.
    {"group top-2 sum beats the single best", 2, 2, 1, false, 1.0,
     {0.95, 0.1, 0.05, 0.02, 0.6, 0.7, 0.3, 0.2}, {0},
     {5, 4}, {0.7, 0.6}},
    // Group 0: top-2 0.9+0.5 = 1.4 (sum of all 1.5); group 1: 0.8+0.55 = 1.35 (sum of all 2.35).
    {"group score is the top-2 sum, not the total", 2, 2, 1, false, 1.0,
     {0.9, 0.5, 0.05, 0.05, 0.8, 0.55, 0.5, 0.5}, {0},
     {0, 1}, {0.9, 0.5}},
    // Same two values in both groups (bit-equal sums): group 0 kept. Both kept would give {0, 5}.
    {"group tie keeps the lower group", 2, 2, 1, false, 1.0,
     {0.6, 0.3, 0.1, 0.1, 0.3, 0.6, 0.1, 0.1}, {0},
     {0, 1}, {0.6, 0.3}},
    // The bias decides the group: s' sums 1.1 vs 1.15; weights from s.
    {"bias decides the group", 2, 2, 1, true, 2.0,
     {0.6, 0.5, 0.1, 0.1, 0.55, 0.5, 0.1, 0.1}, {0, 0, 0, 0, 0, 0.1, 0, 0},
     {5, 4}, {0.5 / 1.05 * 2.0, 0.55 / 1.05 * 2.0}},
    // Four groups of two, two kept: group 2 (1.05), then groups 0 and 1 tie at 0.9 + 0.1 → 0.
    {"G = 4, two kept, tie to the lower group", 3, 4, 2, false, 1.0,
     {0.9, 0.1, 0.1, 0.9, 0.6, 0.45, 0.2, 0.2}, {0},
     {0, 4, 5}, {0.9, 0.6, 0.45}},
};

// Tolerance on w: the scores pass through float logit → sigmoid and a float renormalisation,
// a few ulp (~1e-7 relative) from the double expressions; 1e-6 still separates every case.
#define ROUTE_TOL 1e-6

Test(route, table) {
    enum { D = 4 };
    for (size_t n = 0; n < sizeof ROUTE_CASES / sizeof ROUTE_CASES[0]; n++) {
        const route_case *rc = &ROUTE_CASES[n];
        sd_config c = {.hidden_size = D, .num_experts = RE, .num_experts_per_token = rc->K,
                       .num_expert_group = rc->G, .topk_group = rc->topk_group,
                       .moe_renormalize = rc->renorm, .routed_scaling_factor = (float)rc->scale};
        float router[RE * D], bias[RE], b[D] = {1, 0, 0, 0};
        for (int e = 0; e < RE; e++) {
            router[e * D] = (float)log(rc->s[e] / (1.0 - rc->s[e]));
            for (int i = 1; i < D; i++) router[e * D + i] = 0.37f * (float)(e + i); // ignored: b[i] = 0
            bias[e] = (float)rc->bias[e];
        }
        sd_moe_weights w = {.router = router, .bias = bias};
        int sel[4] = {-1, -1, -1, -1};
        float wts[4] = {0};
        sd_moe_route(&w, &c, b, sel, wts);
        for (int j = 0; j < rc->K; j++) { // cr_expect: every failing case is reported, not just the first
            cr_expect_eq(sel[j], rc->sel[j], "%s: sel[%d] = %d, expected %d", rc->name, j, sel[j], rc->sel[j]);
            double e = fabs(wts[j] - rc->w[j]) / fabs(rc->w[j]);
            cr_expect(e <= ROUTE_TOL, "%s: w[%d] = %.9g, expected %.9g", rc->name, j, wts[j], rc->w[j]);
        }
        // The host selection from the logits (route.h) is the same routing, bit for bit, and its
        // margin is the K-th chosen s' minus the best eligible one left out, or the group margin when
        // smaller (brute force here).
        float logits[RE], work_sel[4], margin = NAN;
        int sel2[4];
        unsigned char work[sizeof(float) * (2 * RE + RE) + 2 * RE];
        cr_assert(sd_route_work_bytes(&c) <= sizeof work);
        for (int e = 0; e < RE; e++) logits[e] = sd_dot_f32(router + e * D, b, D);
        sd_route_select(logits, bias, &c, work, sel2, work_sel, &margin);
        cr_expect(!memcmp(sel2, sel, sizeof(int) * rc->K) && !memcmp(work_sel, wts, sizeof(float) * rc->K),
                  "%s: sd_route_select differs from sd_moe_route", rc->name);
        const int per = RE / rc->G;
        float chosen = INFINITY, best_out = -INFINITY;
        for (int j = 0; j < rc->K; j++) {
            const float sp = 1.0f / (1.0f + expf(-logits[sel[j]])) + bias[sel[j]];
            chosen = sp < chosen ? sp : chosen;
        }
        for (int e = 0; e < RE; e++) {
            bool in_sel = false, group_kept = false;
            for (int j = 0; j < rc->K; j++) in_sel |= sel[j] == e, group_kept |= sel[j] / per == e / per;
            const float sp = 1.0f / (1.0f + expf(-logits[e])) + bias[e];
            if (!in_sel && (rc->G == 1 || group_kept) && sp > best_out) best_out = sp;
        }
        float want = best_out == -INFINITY ? INFINITY : chosen - best_out;
        if (rc->G > 1) { // and the group margin: the weakest kept group's top-2 sum minus the best dropped one's
            float gs[RE], kept_min = INFINITY, dropped_max = -INFINITY;
            for (int g = 0; g < rc->G; g++) {
                float top = -INFINITY, second = -INFINITY;
                for (int e = g * per; e < (g + 1) * per; e++) {
                    const float sp = 1.0f / (1.0f + expf(-logits[e])) + bias[e];
                    if (sp > top) second = top, top = sp;
                    else if (sp > second) second = sp;
                }
                gs[g] = top + second;
            }
            for (int g = 0; g < rc->G; g++) {
                int better = 0; // groups ranked above g (ties: the lower index first)
                for (int h = 0; h < rc->G; h++) better += gs[h] > gs[g] || (gs[h] == gs[g] && h < g);
                if (better < c.topk_group) kept_min = gs[g] < kept_min ? gs[g] : kept_min;
                else dropped_max = gs[g] > dropped_max ? gs[g] : dropped_max;
            }
            if (dropped_max > -INFINITY && kept_min - dropped_max < want) want = kept_min - dropped_max;
        }
        cr_expect(margin == want, "%s: margin %.9g, expected %.9g", rc->name, margin, want);
        cr_expect(sd_route_margin(logits, bias, &c) == margin, "%s: sd_route_margin", rc->name);
    }
}

// ---------------------------------------------------------------------------------------------
// MoE forward ≡ its definition, bitwise: out = Σ_j w_j·expert_{sel_j}(b) in selection order
// (starting from 0) + shared(b), each expert a T = 1 sd_ffn_forward. Both sides are fp32 with
// the same op order, so any difference is a real deviation: no tolerance.

static void moe_by_definition(const sd_moe_weights *w, const sd_config *c, const float *b, float *out, int *sel, float *wts) {
    const int D = c->hidden_size, K = c->num_experts_per_token;
    const int width = c->moe_intermediate_size * (c->num_shared_experts > 1 ? c->num_shared_experts : 1);
    float y[D], h1[width], h2[width];
    sd_moe_route(w, c, b, sel, wts);
    for (int i = 0; i < D; i++) out[i] = 0.0f;
    for (int j = 0; j < K; j++) {
        sd_ffn_forward(&w->experts[sel[j]], b, 1, y, h1, h2);
        for (int i = 0; i < D; i++) out[i] += wts[j] * y[i];
    }
    if (c->num_shared_experts > 0) {
        sd_ffn_forward(&w->shared, b, 1, y, h1, h2);
        for (int i = 0; i < D; i++) out[i] += y[i];
    }
}

// K = 2 (tiny.json) and K = 4 on a copy of the config (the weights do not depend on K): with
// two terms the sum's order is invisible (0 + a + b = 0 + b + a exactly), with four it is not.
static void check_moe(int K) {
    sd_model m;
    synth_from(TINY, SEED, 0, 99, 1.0f, &m);
    sd_config cfg = m.cfg;
    cfg.num_experts_per_token = K;
    const sd_config *c = &cfg;
    enum { T = 5 };
    const int D = c->hidden_size;
    sd_status st = {0};
    for (int layer = c->first_k_dense_replace; layer < c->num_hidden_layers; layer++) {
        const sd_moe_weights *w = &m.w.layers[layer].moe;
        float b[T * D], out5[T * D], out1[D], ref[D], wts[K];
        int sel[K], picks[c->num_experts];
        memset(picks, 0, sizeof picks);
        fill_uniform(b, (size_t)T * D, 33 + layer, sqrtf(3.0f));
        sd_state s;
        cr_assert_eq(sd_state_init(&s, c, T, T, &st), SD_OK, "%s", st.msg);
        sd_moe_forward(w, c, &s, b, T, out5);
        for (int t = 0; t < T; t++) {
            moe_by_definition(w, c, b + t * D, ref, sel, wts);
            cr_assert(same_bits(out5 + t * D, ref, D), "K=%d layer %d token %d of T=%d differs from the definition", K, layer, t, T);
            for (int j = 0; j < K; j++) {
                cr_assert_eq(s.scratch.sel[t * K + j], sel[j], "K=%d layer %d token %d: recorded sel[%d]", K, layer, t, j);
                cr_assert_eq(f32_bits(s.scratch.w[t * K + j]), f32_bits(wts[j]), "K=%d layer %d token %d: recorded w[%d]", K, layer, t, j);
                picks[sel[j]]++;
            }
        }
        // T·K ≥ 10 picks among E = 8 experts: some expert serves two tokens in one batch.
        int shared = 0;
        for (int e = 0; e < c->num_experts; e++) shared |= picks[e] > 1;
        cr_assert(shared, "K=%d layer %d: no expert served two tokens; the batch case is not exercised", K, layer);
        for (int t = 0; t < T; t++) { // each token alone (T = 1)
            sd_moe_forward(w, c, &s, b + t * D, 1, out1);
            cr_assert(same_bits(out1, out5 + t * D, D), "K=%d layer %d token %d: T=1 differs from row %d of T=%d", K, layer, t, t, T);
        }
        sd_state_free(&s);
    }
    sd_model_free(&m);
}

Test(moe, forward_is_weighted_sum_bitwise_k2) { check_moe(2); }
Test(moe, forward_is_weighted_sum_bitwise_k4) { check_moe(4); }

// ---------------------------------------------------------------------------------------------
// ops.h's accumulation contract. Bitwise: the contract is an exact order, so any other order
// shows up as a last-bit difference on inputs with a wide dynamic range.

// Element i into partial i % 16 in increasing i; then fold p[l] += p[l+8], +4, +2, +1.
static float dot_contract(const float *a, const float *b, int n) {
    float p[16] = {0};
    for (int i = 0; i < n; i++) p[i % 16] += a[i] * b[i];
    for (int w = 8; w >= 1; w /= 2)
        for (int l = 0; l < w; l++) p[l] += p[l + w];
    return p[0];
}

// Values over ~2^±12 so that reassociation changes the rounding.
static void fill_wide(float *v, int n, uint32_t seed) {
    uint32_t x = seed * 2654435761u + 7u;
    for (int i = 0; i < n; i++) {
        float u = frand(&x);
        v[i] = ldexpf(u, (int)(x % 25) - 12);
    }
}

Test(dot, f32_follows_the_stated_order) {
    float a[100], b[100];
    for (int n = 1; n <= 100; n++) {
        fill_wide(a, n, 100 + n);
        fill_wide(b, n, 200 + n);
        float got = sd_dot_f32(a, b, n), want = dot_contract(a, b, n);
        cr_assert_eq(f32_bits(got), f32_bits(want), "n=%d: sd_dot_f32 %.9g, contract order %.9g", n, got, want);
    }
}

Test(dot, bf16_equals_f32_on_the_widened_row) {
    uint16_t w[100];
    float wide[100], x[100];
    for (int n = 1; n <= 100; n++) {
        fill_wide(wide, n, 300 + n);
        for (int i = 0; i < n; i++) w[i] = sd_f32_to_bf16(wide[i]);
        for (int i = 0; i < n; i++) wide[i] = sd_bf16_to_f32(w[i]);
        fill_wide(x, n, 400 + n);
        float got = sd_dot_bf16(w, x, n), want = sd_dot_f32(wide, x, n);
        cr_assert_eq(f32_bits(got), f32_bits(want), "n=%d: sd_dot_bf16 %.9g, widened sd_dot_f32 %.9g", n, got, want);
    }
}

// A (rows, cols) matrix in F32 and in BF16, and T input rows. rows·cols·T = 2^20 reaches
// sd_linear's threshold for the thread team (so thread count matters); T = 1 does not.
enum { LR = 256, LC = 512, LT = 8 };

typedef struct {
    float *wf, *x;
    uint16_t *wb;
    sd_mat mat[2]; // F32, BF16
} linear_case;

static void linear_case_init(linear_case *lc) {
    lc->wf = malloc(sizeof(float) * LR * LC);
    lc->wb = malloc(sizeof(uint16_t) * LR * LC);
    lc->x = malloc(sizeof(float) * LT * LC);
    fill_wide(lc->wf, LR * LC, 5);
    for (int i = 0; i < LR * LC; i++) lc->wb[i] = sd_f32_to_bf16(lc->wf[i]);
    fill_wide(lc->x, LT * LC, 6);
    lc->mat[0] = (sd_mat){SD_DT_F32, lc->wf, LR, LC};
    lc->mat[1] = (sd_mat){SD_DT_BF16, lc->wb, LR, LC};
}

static void linear_case_free(linear_case *lc) { free(lc->wf); free(lc->wb); free(lc->x); }

Test(linear, row_t_of_a_batch_equals_the_single_token_call) {
    linear_case lc;
    linear_case_init(&lc);
    float *yT = malloc(sizeof(float) * LT * LR), y1[LR];
    for (int d = 0; d < 2; d++) {
        const sd_mat *w = &lc.mat[d];
        sd_linear(w, lc.x, LT, yT);
        for (int t = 0; t < LT; t++) {
            sd_linear(w, lc.x + (size_t)t * LC, 1, y1);
            cr_assert(same_bits(yT + (size_t)t * LR, y1, LR), "%s: row %d of T=%d differs from T=1", d ? "bf16" : "f32", t, LT);
            for (int o = 0; o < LR; o += 37) // and every element is one sd_mat_dot_row
                cr_assert_eq(f32_bits(y1[o]), f32_bits(sd_mat_dot_row(w, o, lc.x + (size_t)t * LC)));
        }
        // A T = 7 call (below the threading threshold) agrees as well.
        sd_linear(w, lc.x, 7, yT);
        for (int t = 0; t < 7; t++) {
            sd_linear(w, lc.x + (size_t)t * LC, 1, y1);
            cr_assert(same_bits(yT + (size_t)t * LR, y1, LR), "%s: row %d of T=7 differs from T=1", d ? "bf16" : "f32", t);
        }
    }
    free(yT);
    linear_case_free(&lc);
}

Test(linear, independent_of_thread_count) {
    linear_case lc;
    linear_case_init(&lc);
    const int threads[] = {1, 2, 3};
    float *y[3];
    for (int d = 0; d < 2; d++) {
        for (int k = 0; k < 3; k++) {
            y[k] = malloc(sizeof(float) * LT * LR);
            omp_set_num_threads(threads[k]);
            cr_assert_eq(omp_get_max_threads(), threads[k]);
            sd_linear(&lc.mat[d], lc.x, LT, y[k]);
        }
        for (int k = 1; k < 3; k++)
            cr_assert(same_bits(y[0], y[k], (size_t)LT * LR), "%s: %d threads differ from 1", d ? "bf16" : "f32", threads[k]);
        for (int k = 0; k < 3; k++) free(y[k]);
    }
    linear_case_free(&lc);
}

// sd_rmsnorm: sum(x²) = sd_dot_f32(x, x, n), out = (x · 1/sqrt(ss/n + eps)) · w, out may alias x.
Test(dot, rmsnorm_uses_the_dot) {
    enum { N = 45 };
    float x[N], w[N], out[N], want[N];
    fill_wide(x, N, 7);
    fill_uniform(w, N, 8, 1.0f);
    const float scale = 1.0f / sqrtf(sd_dot_f32(x, x, N) / (float)N + 1e-5f);
    for (int i = 0; i < N; i++) want[i] = (x[i] * scale) * w[i];
    sd_rmsnorm(x, w, N, 1e-5f, out);
    cr_assert(same_bits(out, want, N));
    sd_rmsnorm(x, w, N, 1e-5f, x); // in place
    cr_assert(same_bits(x, want, N));
}

// ---------------------------------------------------------------------------------------------
// Conversions

typedef struct { uint32_t f32; uint16_t bf16; const char *why; } bf16_case;

static const bf16_case BF16_CASES[] = {
    {0x3f800000u, 0x3f80, "1.0 exact"},
    {0x3f807fffu, 0x3f80, "just below half: down"},
    {0x3f808000u, 0x3f80, "half, even below: down"},
    {0x3f808001u, 0x3f81, "just above half: up"},
    {0x3f818000u, 0x3f82, "half, odd below: up to even"},
    {0xbf808000u, 0xbf80, "negative half, even: down in magnitude"},
    {0xbf818000u, 0xbf82, "negative half, odd: up in magnitude"},
    {0x3fffffffu, 0x4000, "carry into the exponent"},
    {0x7f7fffffu, 0x7f80, "FLT_MAX rounds to +inf"},
    {0x7f800000u, 0x7f80, "+inf"},
    {0xff800000u, 0xff80, "-inf"},
    {0x00000000u, 0x0000, "+0"},
    {0x80000000u, 0x8000, "-0"},
    {0x00008000u, 0x0000, "subnormal half, even: down"},
    {0x00018000u, 0x0002, "subnormal half, odd: up"},
    {0x007fffffu, 0x0080, "largest subnormal rounds to the smallest normal"},
};

static int bf16_is_nan(uint16_t h) { return (h & 0x7f80) == 0x7f80 && (h & 0x007f); }

Test(conv, bf16_round_to_nearest_even) {
    for (size_t i = 0; i < sizeof BF16_CASES / sizeof BF16_CASES[0]; i++) {
        const bf16_case *k = &BF16_CASES[i];
        uint16_t got = sd_f32_to_bf16(bits_f32(k->f32));
        cr_assert_eq(got, k->bf16, "%s: 0x%08x → 0x%04x, expected 0x%04x", k->why, k->f32, got, k->bf16);
    }
    // NaN stays NaN, including payloads only in the bits rounding drops, and keeps its sign.
    const uint32_t nans[] = {0x7fc00000u, 0x7f800001u, 0x7f80ffffu, 0xffc00001u, 0xff800001u, 0x7fffffffu};
    for (size_t i = 0; i < sizeof nans / sizeof nans[0]; i++) {
        uint16_t h = sd_f32_to_bf16(bits_f32(nans[i]));
        cr_assert(bf16_is_nan(h), "NaN 0x%08x → 0x%04x is not NaN", nans[i], h);
        cr_assert_eq(h & 0x8000, (nans[i] >> 16) & 0x8000, "NaN 0x%08x lost its sign", nans[i]);
    }
    // Every bf16 widens exactly and narrows back to itself (NaNs to a NaN).
    for (uint32_t h = 0; h <= 0xffff; h++) {
        float f = sd_bf16_to_f32((uint16_t)h);
        cr_assert_eq(f32_bits(f), h << 16);
        uint16_t back = sd_f32_to_bf16(f);
        if (bf16_is_nan((uint16_t)h)) cr_assert(bf16_is_nan(back), "0x%04x", h);
        else cr_assert_eq(back, h, "0x%04x → 0x%04x", h, back);
    }
}

// f16: sign, 5 exponent bits (bias 15), 10 mantissa bits; subnormals man·2^-24.
static double f16_ref(uint16_t h) {
    int sign = h >> 15, e = (h >> 10) & 0x1f, man = h & 0x3ff;
    double v = e == 0 ? ldexp(man, -24) : e == 31 ? (man ? NAN : INFINITY) : ldexp(1024 + man, e - 25);
    return sign ? -v : v;
}

typedef struct { uint16_t f16; float f32; const char *why; } f16_case;

static const f16_case F16_CASES[] = {
    {0x3c00, 1.0f, "1"},
    {0xc000, -2.0f, "-2"},
    {0x3555, 0.333251953125f, "1/3 rounded"},
    {0x7bff, 65504.0f, "largest normal"},
    {0x0400, 0x1p-14f, "smallest normal"},
    {0x03ff, 0x1.ff8p-15f, "largest subnormal"},
    {0x0001, 0x1p-24f, "smallest subnormal"},
    {0x8001, -0x1p-24f, "negative subnormal"},
    {0x7c00, INFINITY, "+inf"},
    {0xfc00, -INFINITY, "-inf"},
};

Test(conv, f16_to_f32) {
    for (size_t i = 0; i < sizeof F16_CASES / sizeof F16_CASES[0]; i++) {
        const f16_case *k = &F16_CASES[i];
        float got = sd_f16_to_f32(k->f16);
        cr_assert_eq(f32_bits(got), f32_bits(k->f32), "%s: 0x%04x → %a, expected %a", k->why, k->f16, got, k->f32);
    }
    cr_assert_eq(f32_bits(sd_f16_to_f32(0x8000)), 0x80000000u, "-0 keeps its sign");
    cr_assert(isnan(sd_f16_to_f32(0x7e00)) && isnan(sd_f16_to_f32(0x7c01)) && isnan(sd_f16_to_f32(0xfe00)), "NaN stays NaN");
    // Exhaustive: every f16 is exact in f32.
    for (uint32_t h = 0; h <= 0xffff; h++) {
        float got = sd_f16_to_f32((uint16_t)h);
        double want = f16_ref((uint16_t)h);
        if (isnan(want)) cr_assert(isnan(got), "0x%04x", h);
        else cr_assert(got == want && !signbit(got) == !signbit(want), "0x%04x → %a, expected %a", h, got, want);
    }
}
