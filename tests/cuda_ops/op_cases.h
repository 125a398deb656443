// op_cases.h — what the files of the GPU op table share: tests/test_cuda_ops.c holds the table and
// its loop, tests/cuda_ops/<family>.c the run functions of one family of kernels/*.h each. Here: the
// run functions the table names, the CPU twins and bf16 helpers of more than one family, and the
// prefill's tolerances. CUDA builds only.
#pragma once
#define SD_HARNESS_SHARED 1 // one case_seed and LABEL for all the files (test_cuda_ops.c defines them)
#include "cuda_harness.h"
#include "ops.h" // sd_silu (CPU)

// ---------------------------------------------------------------------------- the run functions
// Each draws its case's inputs (seed_of), checks the launchers its .op names and fails on the first
// difference; the shape each reads is named beside its definition.
// linear.c
void run_linear(const op_case *c);
void run_linear_multi(const op_case *c);
void run_linear_multi_norm(const op_case *c);
// rows.c
void run_rmsnorm(const op_case *c);
void run_rmsnorm_flagged(const op_case *c);
void run_embed(const op_case *c);
// cursor.c
void run_cursor(const op_case *c);
// finite.c
void run_finite(const op_case *c);
// kda.c
void run_kda_conv(const op_case *c);
void run_kda_scan(const op_case *c);
void run_kda_out(const op_case *c);
// mla.c
void run_mla(const op_case *c);
// moe_route.c
void run_moe_select(const op_case *c);
void run_moe_route_select(const op_case *c);
// moe_experts.c
void run_moe_experts(const op_case *c);
// sampling.c
void run_argmax(const op_case *c);
void run_softmax(const op_case *c);
void run_sample_rows(const op_case *c);
void run_accept(const op_case *c);
void run_round_publish(const op_case *c);
void run_synth_fill(const op_case *c);
// gemm.c
void run_to_bf16(const op_case *c);
void run_gemm(const op_case *c);
// kda_prefill.c
void run_kda_prefill_conv(const op_case *c);
void run_kda_chunk(const op_case *c);
void run_kda_prefill_out(const op_case *c);
// mla_prefill.c
void run_mla_prefill_cache(const op_case *c);
void run_mla_pack(const op_case *c);
void run_mla_flash(const op_case *c);
// moe_prefill.c
void run_moe_prefill_select(const op_case *c);
void run_moe_prefill_group(const op_case *c);
void run_gather_rows(const op_case *c);
void run_swiglu_rows(const op_case *c);
void run_moe_prefill_combine(const op_case *c);
// moe_grouped.c
void run_moe_grouped(const op_case *c);

// ---------------------------------------------------------------------------- the cursor (cursor.c, kda.c)
static inline void cursor_expect(const gbuf *cur, int len, int pending, const char *after) {
    int got[2], want[2] = {len, pending};
    gbuf_get(cur, got, 2);
    same_bits(fmt("cursor {len, pending} after %s", after), got, want, 2);
}

// ---------------------------------------------------------------------------- the KDA conv (kda.c, kda_prefill.c)
// One conv call's inputs (host), shared by the T-token call, the one-token chain and the twin.
typedef struct {
    int H, d, W, T, pos0, n_rows;
    float *ring, *q, *k, *v, *tq, *tk, *tv, *fa, *ga; // ring (n_rows, 3P); q, k, v (T, P); taps (P, W); fa, ga (T, d)
    tmat fb, gbw;                                     // f_b, g_b (P, d)
} conv_in;

// The CPU twin of the conv (MODEL.md "KDA"; engine/cpu/kda.c conv_token and l2norm_heads, which
// are not separable from sd_kda_forward): for the token at pos and channel ch,
// acc = Σ_j taps[ch][j]·in(pos − (W−1) + j), j increasing, positions below 0 skipped, this call's
// positions (>= pos0) from q/k/v and earlier ones from ring row p % n_rows; out = silu(acc); then
// per head q, k ← x / sqrt(Σx² + 1e-6) with Σx² = sd_dot_f32.
static inline void conv_twin(const conv_in *in, float *qc, float *kc, float *vc) {
    const int H = in->H, d = in->d, W = in->W, P = H * d;
    const float *fresh[3] = {in->q, in->k, in->v}, *taps[3] = {in->tq, in->tk, in->tv};
    float *out[3] = {qc, kc, vc};
    for (int t = 0; t < in->T; t++) {
        const int pos = in->pos0 + t;
        for (int which = 0; which < 3; which++) {
            float *o = out[which] + (size_t)t * P;
            for (int ch = 0; ch < P; ch++) {
                float acc = 0.0f;
                for (int j = 0; j < W; j++) {
                    const int p = pos - (W - 1) + j;
                    if (p < 0) continue;
                    const float xv = p >= in->pos0 ? fresh[which][(size_t)(p - in->pos0) * P + ch]
                                                   : in->ring[(size_t)(p % in->n_rows) * 3 * P + (size_t)which * P + ch];
                    acc += taps[which][(size_t)ch * W + j] * xv;
                }
                o[ch] = sd_silu(acc);
            }
            if (which < 2) unit_heads(o, 1, H, d);
        }
    }
}

// ---------------------------------------------------------------------------- MLA's RoPE (mla.c, mla_prefill.c)
// engine/cpu/mla.c's rope: pairs (2i, 2i+1) turned by pos·θ^(-2i/dr), the angle in double,
// cos/sin rounded to float once.
static inline void rope_twin(float *x, int dr, int pos, double theta) {
    for (int i = 0; i < dr / 2; i++) {
        const double ang = (double)pos * pow(theta, -2.0 * i / dr);
        const float cs = (float)cos(ang), sn = (float)sin(ang), x0 = x[2 * i], x1 = x[2 * i + 1];
        x[2 * i] = x0 * cs - x1 * sn;
        x[2 * i + 1] = x0 * sn + x1 * cs;
    }
}

// ---------------------------------------------------------------------------- bf16 operands (the prefill's files)
// The prefill's kernels (kernels/gemm.h, kda_prefill.h, mla_prefill.h, moe_prefill.h,
// moe_grouped.h) are never bitwise the token path; their own tolerances (the reasons, once):
// TOL_BF16  one rounding to bf16 (nearest even) on the device side only — the staged GEMM
//           activations, the flash's probabilities before P·V, a bf16 output (the grouped expert
//           GEMMs': fp32 sums within TOL_MMA, then rounded): each value within 2^-8 relative, so an
//           elementwise output's NMSE < 2^-16 ≈ 1.5e-5 (with TOL_MMA's sums under
//           (2^-8 + 1e-4)² ≈ 1.6e-5); through a dot the errors
//           average to ≈ 2e-6 for uniform values (every such case has >= 56 outputs, so the ratio of
//           sums stays near its mean).
// TOL_MMA   the same bf16 values on both sides, fp32 accumulation on the tensor cores in cuBLASLt's
//           order (products exact, adds aligned and truncated: NMSE ≲ 1e-10 at K = 2304); 1e-8 stays
//           far below one bf16 rounding of the activations (≈ 2e-6), so it sees how the device rounded.
// TOL_CHUNK the chunked (WY) recurrence against both CPU forms: fp32 with fmaf and the fast __expf
//           through a triangular solve a chunk, in another order; the two CPU forms agree to ≈ 3e-13
//           on these inputs: 1e-9 leaves room, an indexing slip is O(1).
#define TOL_BF16 2e-5
#define TOL_MMA 1e-8
#define TOL_CHUNK 1e-9

static inline uint16_t *bf16_of(const float *x, size_t n) {
    uint16_t *h = xmalloc(2 * n);
    for (size_t i = 0; i < n; i++) h[i] = sd_f32_to_bf16(x[i]);
    return h;
}
static inline float *widen_bf16(const uint16_t *h, size_t n) {
    float *x = xmalloc(sizeof(float) * n);
    for (size_t i = 0; i < n; i++) x[i] = sd_bf16_to_f32(h[i]);
    return x;
}
// A guarded buffer of n bf16 values (n/2 words rounded up; h NULL: left as the sentinel).
static inline gbuf gbuf_halves(const uint16_t *h, size_t n) {
    gbuf g = gbuf_new((n + 1) / 2);
    if (h && n) CU(cudaMemcpy(g.p, h, 2 * n, cudaMemcpyHostToDevice));
    return g;
}
static inline uint16_t *read_halves(const gbuf *g, size_t n) { return gbuf_read(g, (n + 1) / 2); }
// got (read_halves) holds want bit for bit, and the half past the n (n odd) is still the sentinel's.
static inline void check_halves(const char *what, const uint16_t *got, const uint16_t *want, size_t n) {
    const size_t nw = (n + 1) / 2;
    uint32_t *w = xmalloc(4 * nw);
    for (size_t i = 0; i < nw; i++) w[i] = SENTINEL;
    if (n) memcpy(w, want, 2 * n);
    same_bits(what, got, w, nw);
    free(w);
}
static inline void same_halves(const char *what, const gbuf *g, const uint16_t *want, size_t n) {
    uint16_t *got = read_halves(g, n);
    check_halves(what, got, want, n);
    free(got);
}
