// moe_lab.cu — kernel lab for the MoE block (MODEL.md "MoE"; kernels/moe_route.h, moe_experts.h;
// CPU: engine/cpu/moe.c
// sd_moe_route, sd_moe_forward). For T tokens x (T, D):
//     s = sigmoid(router·x_t);  sel_t = top-K of s + bias (ties to the lower index);
//     w_tj = s[sel_tj] / Σ_j s[sel_tj] · 2.446;
//     out_t = Σ_j w_tj · down_e(silu(gate_e·x_t) ⊙ up_e·x_t) (e = sel_tj, j in order) + shared(x_t)
// at Kimi-Linear dims (configs/kimi-linear-48b-a3b.json): D = 2304, E = 256 experts, K = 8,
// 1 shared expert, Ie = 1024, one expert group, renormalised; bf16 expert weights, f32 router.
// One routed expert is 3 × 1024 × 2304 × 2 B = 14.2 MB; the layer's 256 are 3.6 GB, far beyond
// the 50-60 MB L2, so only the experts the T tokens select (the DISTINCT ones) can be read.
//
// Versions. Both are engine/cuda/moe_block.c's arms with the RMSNorm unfused (norm NULL) and
// out = MoE(x) (accumulate off), calling the production launchers of specdec_kernels.
// Measured (NVIDIA H200, 2026-11-29, copy 4249 GB/s, L2 flushed): v1 T=1 70.8 us (129.8 MB,
// 43.1% of copy), T=5 247.5 us (51.4%), T=9 410.1 us (50.4%); v2 (eager) 2.3-2.7x slower. Every
// check passes: CPU, v2 ≡ v1, verify ≡ decode, and the canary fails as it must.
//   1  the device-table arm: one sd_cuda_linear_multi launch (router logits + the shared
//      expert's gate/up/silu), sd_cuda_moe_select (sel, w and the grouping by expert, on the
//      device), one sd_cuda_moe_up over every group, one sd_cuda_moe_down that also runs the
//      shared expert's down and the combine. Four launches, no host sync, capturable. moe_block.c
//      runs up/down in passes when its FFN scratch holds fewer than T·K activation rows; at
//      these dims it holds max_T·9216 / 1024 = 9·max_T >= 8·T rows: one pass, as here.
//      The shared expert's gate+up rides in the up launch for 1-2 tokens (its blocks overlap
//      the selection) and in the router's launch from 3 tokens, as in moe_block.c. Timed whole, and
//      by pieces (events between the launches): router (+ shared), select, experts up
//      (+ shared), down+combine.
//   2  the eager arm: the same first two launches, then the host reads sel/w back (pinned,
//      stream drained), groups the entries (sd_cuda_moe_groups_host), uploads the grouping and
//      launches up and down once per selected expert, then the combine alone: 2 + 2·distinct + 1
//      launches and one host round trip. moe_experts.h promises both arms give the same bits (checked).
//
// Checks (the output, sel and w are poisoned with NaN / -1 before every run, so a launch that
// writes nothing fails): against the CPU reference (sd_moe_forward over a host copy of the same
// weights) for T = 1, 5, 9: sel equal exactly, w and out by NMSE and max relative error;
// version 2 ≡ version 1 bit for bit; version 1 at T = 9 ≡ nine T = 1 calls bit for bit (verify ≡
// decode); and a canary: one expert's down row negated on the device must fail the check.
//
// Timing: CUDA events around each block, median over reps that rotate 8 input sets (different
// tokens select different experts) with the L2 flushed (a 256 MB read) before every rep, so the
// router and the shared expert, which would otherwise stay in L2 between reps, come from HBM as
// in the model (26 other layers run between two visits of one layer). Bytes = distinct experts
// (counted from each set's sel) × 14.2 MB + the shared expert 14.2 MB + router E·D·4 + bias +
// x and out (T·D·4 each; the scratch round trips, < 1 MB, are left out), mean over the sets,
// against the measured copy bandwidth (a 2 GiB cudaMemcpyDeviceToDevice, read + write counted).
// Random tokens route nearly independently (~61 distinct of 72 entries at T = 9 with these
// weights); a real verify window's tokens share more experts, so fewer bytes.
//
// Usage: moe_lab        (exit status 1 when a check fails)
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <algorithm>
#include <thread>
#include <vector>
extern "C" {
#include "layers.h" // sd_moe_forward (the CPU reference), sd_moe_weights, sd_state, sd_config
#include "tensor.h" // sd_f32_to_bf16, sd_mat
}
#include "linear.h"      // sd_cuda_linear_multi, sd_lin_job
#include "moe_experts.h" // sd_cuda_moe_up, _down, sd_cuda_expert
#include "moe_route.h"   // sd_cuda_moe_select, _route_select, _groups_host, _groups_ints

#include "lab.cuh" // CK, median, lab_copy_gbs
// A launcher's sd_code: the lab stops on the first failure, naming it.
#define OKS(x)                                                                                       \
    do {                                                                                             \
        if ((x) != SD_OK) {                                                                          \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, st_.msg);                     \
            exit(1);                                                                                 \
        }                                                                                            \
    } while (0)
static sd_status st_;

// Kimi-Linear MoE dims.
static const int D = 2304, E = 256, K = 8, IE = 1024, I_DENSE = 9216, MAXT = 9, NSETS = 8;
static const float SCALING = 2.446f;
static const size_t MAT = (size_t)IE * D;             // elements of one expert matrix (gate, up or down)
static const double EXPERT_BYTES = 3.0 * MAT * 2;     // one expert's three bf16 matrices

// ---------------------------------------------------------------------------------------------
// Random inputs and weights: xorshift64, one stream per matrix (so threads can fill the 769·3
// matrices in any order), values in (-1, 1) scaled, never exactly zero.
static uint64_t splitmix(uint64_t z) {
    z += 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
struct rng {
    uint64_t s;
    explicit rng(uint64_t seed) : s(splitmix(seed) | 1) {}
    float uni() { // uniform in (-1, 1), never 0
        s ^= s << 13; s ^= s >> 7; s ^= s << 17;
        return (float)(((double)(s >> 40) + 0.5) / (double)(1 << 23) - 1.0);
    }
};
static void fill_f32(float *p, size_t n, float scale, uint64_t seed) {
    rng r(seed);
    for (size_t i = 0; i < n; i++) p[i] = scale * r.uni();
}
static void fill_bf16(uint16_t *p, size_t n, float scale, uint64_t seed) {
    rng r(seed);
    for (size_t i = 0; i < n; i++) p[i] = sd_f32_to_bf16(scale * r.uni());
}

// One MoE layer on the host and the device. Expert arena: matrix m (0 gate (Ie, D), 1 up (Ie, D),
// 2 down (D, Ie)) of expert e at ((e·3) + m)·Ie·D; "expert" E is the shared one.
struct lab_model {
    uint16_t *h_arena, *d_arena;      // ((E+1)·3, Ie·D) bf16
    float *h_router, *d_router;       // (E, D) f32
    float *h_bias, *d_bias;           // (E) f32
    std::vector<sd_ffn_weights> h_experts; // (E) host views for sd_moe_weights
    sd_moe_weights h_moe;             // the CPU reference's weights
    sd_cuda_expert *d_table;          // (E) device: the device-table arm's expert table
    sd_mat d_router_mat, d_sh_gate, d_sh_up, d_sh_down; // device views
};

static uint16_t *mat_of(uint16_t *arena, int e, int m) { return arena + ((size_t)e * 3 + m) * MAT; }
static sd_mat bf16_mat(const void *p, int rows, int cols) {
    sd_mat m;
    m.dtype = SD_DT_BF16; m.data = p; m.rows = rows; m.cols = cols;
    return m;
}

static void build_model(lab_model &m) {
    const size_t n_arena = (size_t)(E + 1) * 3 * MAT;
    m.h_arena = (uint16_t *)malloc(n_arena * 2);
    m.h_router = (float *)malloc(sizeof(float) * E * D);
    m.h_bias = (float *)malloc(sizeof(float) * E);
    if (!m.h_arena || !m.h_router || !m.h_bias) { fprintf(stderr, "out of host memory\n"); exit(1); }
    // Scales: gate/up rows std 1/√D, down rows 1/√Ie (unit-RMS inputs give unit-scale dots);
    // router std 1/√D (logits of std ~1: sigmoid in its linear range, no saturated ties); bias ±0.05.
    const float s_in = sqrtf(3.0f / D), s_down = sqrtf(3.0f / IE);
    int nth = (int)std::thread::hardware_concurrency();
    nth = std::max(1, std::min(nth, 32));
    std::vector<std::thread> th;
    for (int k = 0; k < nth; k++)
        th.emplace_back([&, k]() {
            for (int i = k; i < (E + 1) * 3; i += nth)
                fill_bf16(m.h_arena + (size_t)i * MAT, MAT, i % 3 == 2 ? s_down : s_in, 1000 + i);
        });
    for (auto &t : th) t.join();
    fill_f32(m.h_router, (size_t)E * D, s_in, 1);
    fill_f32(m.h_bias, E, 0.05f, 2);

    m.h_experts.resize(E);
    for (int e = 0; e <= E; e++) {
        sd_ffn_weights f;
        f.gate = bf16_mat(mat_of(m.h_arena, e, 0), IE, D);
        f.up = bf16_mat(mat_of(m.h_arena, e, 1), IE, D);
        f.down = bf16_mat(mat_of(m.h_arena, e, 2), D, IE);
        if (e < E) m.h_experts[e] = f;
        else m.h_moe.shared = f;
    }
    m.h_moe.router = m.h_router;
    m.h_moe.bias = m.h_bias;
    m.h_moe.experts = m.h_experts.data();

    CK(cudaMalloc(&m.d_arena, n_arena * 2));
    CK(cudaMalloc(&m.d_router, sizeof(float) * E * D));
    CK(cudaMalloc(&m.d_bias, sizeof(float) * E));
    CK(cudaMalloc(&m.d_table, sizeof(sd_cuda_expert) * E));
    CK(cudaMemcpy(m.d_arena, m.h_arena, n_arena * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(m.d_router, m.h_router, sizeof(float) * E * D, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(m.d_bias, m.h_bias, sizeof(float) * E, cudaMemcpyHostToDevice));
    std::vector<sd_cuda_expert> table(E);
    for (int e = 0; e < E; e++) {
        table[e].gate = mat_of(m.d_arena, e, 0);
        table[e].up = mat_of(m.d_arena, e, 1);
        table[e].down = mat_of(m.d_arena, e, 2);
        table[e].gate_bf16 = table[e].up_bf16 = table[e].down_bf16 = 1;
    }
    CK(cudaMemcpy(m.d_table, table.data(), sizeof(sd_cuda_expert) * E, cudaMemcpyHostToDevice));
    m.d_router_mat.dtype = SD_DT_F32; m.d_router_mat.data = m.d_router; m.d_router_mat.rows = E; m.d_router_mat.cols = D;
    m.d_sh_gate = bf16_mat(mat_of(m.d_arena, E, 0), IE, D);
    m.d_sh_up = bf16_mat(mat_of(m.d_arena, E, 1), IE, D);
    m.d_sh_down = bf16_mat(mat_of(m.d_arena, E, 2), D, IE);
}

// The block's device scratch (moe_block.c: x->router, sel, w, xg as the grouping, ffn_h1, ffn_h2,
// exp_out, yg) for up to MAXT tokens, and the eager arm's pinned route copies.
struct lab_scratch {
    float *x;          // (NSETS, MAXT, D) input sets
    float *logits;     // (MAXT, E)
    int *sel;          // (MAXT, K)
    float *w;          // (MAXT, K)
    int *groups;       // sd_cuda_moe_groups_ints(MAXT, K, E)
    float *h;          // (MAXT·K, Ie) routed activations
    float *hs;         // (MAXT, Ie) shared activations
    float *exp_out;    // (MAXT·K, D)
    float *shared_out; // (MAXT, D)
    float *out;        // (MAXT, D)
    int *tickets;      // (D) zeroed: the down launch's row-block counters
    int *ready;        // (E + 3): the readiness counters (moe.h), then the route + select ticket (zeroed)
    int *sel_host;     // (MAXT, K) pinned
    float *w_host;     // (MAXT, K) pinned
};

static void build_scratch(lab_scratch &s, const std::vector<float> &xh) {
    CK(cudaMalloc(&s.x, sizeof(float) * xh.size()));
    CK(cudaMemcpy(s.x, xh.data(), sizeof(float) * xh.size(), cudaMemcpyHostToDevice));
    CK(cudaMalloc(&s.logits, sizeof(float) * MAXT * E));
    CK(cudaMalloc(&s.sel, sizeof(int) * MAXT * K));
    CK(cudaMalloc(&s.w, sizeof(float) * MAXT * K));
    CK(cudaMalloc(&s.groups, sizeof(int) * sd_cuda_moe_groups_ints(MAXT, K, E)));
    CK(cudaMalloc(&s.h, sizeof(float) * MAXT * K * IE));
    CK(cudaMalloc(&s.hs, sizeof(float) * MAXT * IE));
    CK(cudaMalloc(&s.exp_out, sizeof(float) * MAXT * K * D));
    CK(cudaMalloc(&s.shared_out, sizeof(float) * MAXT * D));
    CK(cudaMalloc(&s.tickets, sizeof(int) * D));
    CK(cudaMemset(s.tickets, 0, sizeof(int) * D));
    CK(cudaMalloc(&s.ready, sizeof(int) * (E + 3)));
    CK(cudaMemset(s.ready, 0, sizeof(int) * (E + 3)));
    CK(cudaMalloc(&s.out, sizeof(float) * MAXT * D));
    CK(cudaMallocHost(&s.sel_host, sizeof(int) * MAXT * K));
    CK(cudaMallocHost(&s.w_host, sizeof(float) * MAXT * K));
}

// Every output and intermediate to NaN (0xFF bytes; sel = -1, n_groups = -1).
static void poison(const lab_scratch &s, cudaStream_t q) {
    CK(cudaMemsetAsync(s.logits, 0xFF, sizeof(float) * MAXT * E, q));
    CK(cudaMemsetAsync(s.sel, 0xFF, sizeof(int) * MAXT * K, q));
    CK(cudaMemsetAsync(s.w, 0xFF, sizeof(float) * MAXT * K, q));
    CK(cudaMemsetAsync(s.groups, 0xFF, sizeof(int) * sd_cuda_moe_groups_ints(MAXT, K, E), q));
    CK(cudaMemsetAsync(s.h, 0xFF, sizeof(float) * MAXT * K * IE, q));
    CK(cudaMemsetAsync(s.hs, 0xFF, sizeof(float) * MAXT * IE, q));
    CK(cudaMemsetAsync(s.exp_out, 0xFF, sizeof(float) * MAXT * K * D, q));
    CK(cudaMemsetAsync(s.shared_out, 0xFF, sizeof(float) * MAXT * D, q));
    CK(cudaMemsetAsync(s.out, 0xFF, sizeof(float) * MAXT * D, q));
}

// ---------------------------------------------------------------------------------------------
// The versions: moe_block.c moe_block on x (T, D) into s.out. marks (5 events, or NULL) are recorded
// around version 1's four launches.
// moe_block.c's MOE_SHARED_IN_UP_MAX_T: the shared expert's gate+up in the up launch for 1-2 tokens.
static bool shared_in_up(int T) { return T <= 2; }

static void route_part(const lab_model &m, const lab_scratch &s, const float *x, int T, cudaStream_t q,
                       cudaEvent_t *marks) {
    sd_lin_job in[2];
    memset(in, 0, sizeof in);
    in[0].w = &m.d_router_mat; in[0].x = x; in[0].ldx = D; in[0].y = s.logits; in[0].ldy = E; in[0].mode = SD_LIN_STORE;
    in[1].w = &m.d_sh_gate; in[1].w2 = &m.d_sh_up; in[1].x = x; in[1].ldx = D; in[1].y = s.hs; in[1].ldy = IE;
    in[1].mode = SD_LIN_SWIGLU;
    if (marks) CK(cudaEventRecord(marks[0], q));
    if (sd_cuda_moe_route_select_fits(T, E, D, 1)) { // moe_block.c: one launch at one token (the select piece reads 0)
        OKS(sd_cuda_moe_route_select(m.d_router, m.d_bias, x, nullptr,
                                     T, E, D, K, 1, true, SCALING, s.logits, s.sel, s.w, s.groups, s.ready + E + 2, s.ready,
                                     q, &st_));
        if (marks) CK(cudaEventRecord(marks[1], q));
    } else {
        OKS(sd_cuda_linear_multi(in, shared_in_up(T) ? 1 : 2, T, q, &st_)); // moe_block.c: the shared expert here from 3 tokens
        if (marks) CK(cudaEventRecord(marks[1], q));
        OKS(sd_cuda_moe_select(s.logits, m.d_bias, T, E, K, 1, 1, true, SCALING, s.sel, s.w, s.groups, s.ready, q, &st_));
    }
    if (marks) CK(cudaEventRecord(marks[2], q));
}

static sd_cuda_moe_args args_of(const lab_model &m, const lab_scratch &s, const float *x, int T) {
    sd_cuda_moe_args a;
    memset(&a, 0, sizeof a);
    a.table = m.d_table; a.groups = s.groups;
    a.T = T; a.K = K; a.E = E; a.D = D; a.Ie = IE;
    a.x = x; a.w = s.w; a.sel = s.sel; a.held_first = 0; a.held_count = E; a.h = s.h; a.exp_out = s.exp_out;
    a.shared_down = &m.d_sh_down;
    if (shared_in_up(T)) a.shared_gate = &m.d_sh_gate, a.shared_up = &m.d_sh_up;
    a.hs = s.hs; a.ld_hs = IE; a.shared_out = s.shared_out;
    a.out = s.out; a.accumulate = false;
    a.tickets = s.tickets;
    return a;
}

static void moe1(const lab_model &m, const lab_scratch &s, const float *x, int T, cudaStream_t q, cudaEvent_t *marks) {
    route_part(m, s, x, T, q, marks);
    sd_cuda_moe_args a = args_of(m, s, x, T);
    const int n_ent = T * K, gc = std::min(n_ent, E);
    // moe_block.c's pass size: its FFN scratch rows over Ie (>= n_ent at these dims: one pass).
    const int per_pass = MAXT * std::max(I_DENSE, IE) / IE;
    if (per_pass >= n_ent && T <= 2) a.ready = s.ready; // moe_block.c: one pass of 1-2 tokens (MOE_READY_MAX_T)
    for (int lo = 0; lo < n_ent; lo += per_pass) {
        const int hi = n_ent - lo < per_pass ? n_ent : lo + per_pass;
        OKS(sd_cuda_moe_up(&a, 0, gc, lo, hi, lo == 0, q, &st_)); // the shared expert with the first pass
        if (marks) CK(cudaEventRecord(marks[3], q));
        OKS(sd_cuda_moe_down(&a, lo, hi, hi == n_ent, q, &st_));
    }
    if (marks) CK(cudaEventRecord(marks[4], q));
}

static void moe2(const lab_model &m, const lab_scratch &s, const float *x, int T, cudaStream_t q) {
    route_part(m, s, x, T, q, nullptr);
    const sd_cuda_moe_args a = args_of(m, s, x, T);
    CK(cudaMemcpyAsync(s.sel_host, s.sel, sizeof(int) * T * K, cudaMemcpyDeviceToHost, q));
    CK(cudaMemcpyAsync(s.w_host, s.w, sizeof(float) * T * K, cudaMemcpyDeviceToHost, q));
    CK(cudaStreamSynchronize(q));
    const size_t n_int = sd_cuda_moe_groups_ints(T, K, E);
    std::vector<int> groups(n_int);
    sd_cuda_moe_groups_host(s.sel_host, T, K, E, groups.data());
    CK(cudaMemcpyAsync(s.groups, groups.data(), n_int * sizeof(int), cudaMemcpyHostToDevice, q)); // pageable: staged
    const int n_ent = T * K, gc = std::min(n_ent, E), *gstart = groups.data() + 1 + gc;
    for (int g = 0; g < groups[0]; g++) {
        OKS(sd_cuda_moe_up(&a, g, g + 1, gstart[g], gstart[g + 1], false, q, &st_));
        OKS(sd_cuda_moe_down(&a, gstart[g], gstart[g + 1], false, q, &st_));
    }
    OKS(sd_cuda_moe_up(&a, 0, 0, 0, 0, true, q, &st_)); // the shared expert
    OKS(sd_cuda_moe_down(&a, 0, 0, true, q, &st_));
}

static void run_version(int v, const lab_model &m, const lab_scratch &s, const float *x, int T, cudaStream_t q,
                        cudaEvent_t *marks = nullptr) {
    if (v == 1) moe1(m, s, x, T, q, marks);
    else moe2(m, s, x, T, q);
}

// ---------------------------------------------------------------------------------------------
// CPU reference: sd_moe_forward on the host weights (sel, w left in the scratch by it).
static void moe_cpu(const lab_model &m, const sd_config &c, const float *x, int T, float *out, int *sel, float *w) {
    std::vector<float> h1((size_t)T * IE), h2((size_t)T * IE), eo((size_t)T * K * D), xg((size_t)T * D),
        yg((size_t)T * D), ws((size_t)T * K);
    std::vector<int> ss((size_t)T * K);
    sd_state s;
    memset(&s, 0, sizeof s);
    s.cfg = &c;
    s.max_T = T;
    s.scratch.ffn_h1 = h1.data(); s.scratch.ffn_h2 = h2.data(); s.scratch.exp_out = eo.data();
    s.scratch.xg = xg.data(); s.scratch.yg = yg.data(); s.scratch.sel = ss.data(); s.scratch.w = ws.data();
    sd_moe_forward(&m.h_moe, &c, &s, x, T, out);
    memcpy(sel, ss.data(), sizeof(int) * T * K);
    memcpy(w, ws.data(), sizeof(float) * T * K);
}

// ‖got − ref‖² / ‖ref‖² and max |got − ref| / max |ref|; a non-finite value in got gives +inf.
struct err { double nmse, rel; };
static err compare(const float *got, const float *ref, size_t n) {
    double num = 0, den = 0, dmax = 0, rmax = 0;
    for (size_t i = 0; i < n; i++) {
        if (!std::isfinite(got[i])) return {INFINITY, INFINITY};
        const double d = (double)got[i] - ref[i];
        num += d * d;
        den += (double)ref[i] * ref[i];
        dmax = std::max(dmax, fabs(d));
        rmax = std::max(rmax, fabs((double)ref[i]));
    }
    return {den > 0 ? num / den : num, rmax > 0 ? dmax / rmax : dmax};
}
// The output: the FFN's three Linears + silu (device expf ≤ 2 ulp from glibc, fma, another dot
// order) give fp32-level differences; tests/test_cuda_ops.c bounds the MoE experts at NMSE 1e-10. The
// max relative bound is loose for fp32 noise (~1e-6 expected) but a wrong weight row, a missing
// expert or shared term moves it by > 1e-2 (the canary below).
static const double TOL_NMSE = 1e-10, TOL_REL = 1e-4;
// Route weights: sigmoid of one fp32 dot in another order, the same normalisation.
static const double TOL_W_NMSE = 1e-10;

// The lab's work runs on a non-blocking stream, which a plain cudaMemcpy does not wait for:
// drain the device first, or the copy races the kernels (and reads the NaN poison).
static std::vector<float> get(const float *d, size_t n) {
    std::vector<float> h(n);
    CK(cudaDeviceSynchronize());
    CK(cudaMemcpy(h.data(), d, sizeof(float) * n, cudaMemcpyDeviceToHost));
    return h;
}

// ---------------------------------------------------------------------------------------------
// Timing helpers.
static __global__ void flush_l2_kernel(const uint4 *__restrict__ p, size_t n, unsigned *sink) {
    unsigned acc = 0;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const uint4 v = __ldcg(p + i);
        acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    if (acc == 0x9E3779B9u) *sink = acc; // keeps the loads; (almost) never taken
}

struct flusher {
    uint4 *buf;
    size_t n;
    unsigned *sink;
    int blocks;
    void operator()(cudaStream_t q) const {
        flush_l2_kernel<<<blocks, 512, 0, q>>>(buf, n, sink);
        CK(cudaGetLastError());
    }
};

// ---------------------------------------------------------------------------------------------
int main() {
    setvbuf(stdout, NULL, _IOLBF, 0); // a killed run keeps what it printed
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    printf("moe_lab: %s, %d SMs, L2 %d MB; D %d, E %d, K %d, Ie %d, 1 shared expert, bf16 experts (%.1f MB each), "
           "f32 router\n", prop.name, prop.multiProcessorCount, prop.l2CacheSize >> 20, D, E, K, IE, EXPERT_BYTES / 1e6);
    cudaStream_t q;
    CK(cudaStreamCreateWithFlags(&q, cudaStreamNonBlocking));

    sd_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.hidden_size = D; cfg.num_experts = E; cfg.num_experts_per_token = K; cfg.num_shared_experts = 1;
    cfg.moe_intermediate_size = IE; cfg.intermediate_size = I_DENSE; cfg.moe_renormalize = true;
    cfg.routed_scaling_factor = SCALING; cfg.num_expert_group = 1; cfg.topk_group = 1;

    lab_model m;
    build_model(m);
    // Input sets: unit-RMS rows (uniform in ±√3), as after the post-attention RMSNorm.
    std::vector<float> xh((size_t)NSETS * MAXT * D);
    fill_f32(xh.data(), xh.size(), sqrtf(3.0f), 3);
    lab_scratch s;
    build_scratch(s, xh);
    auto xset = [&](int set) { return s.x + (size_t)set * MAXT * D; };

    // ------------------------------------------------------------------ validation
    printf("\nvalidation vs CPU sd_moe_forward (out: NMSE <= %.0e and max|err|/max|ref| <= %.0e; w: NMSE <= %.0e; "
           "sel exact)\n", TOL_NMSE, TOL_REL, TOL_W_NMSE);
    int fails = 0;
    std::vector<float> ref(MAXT * D), w_ref(MAXT * K);
    std::vector<int> sel_ref(MAXT * K), sel_got(MAXT * K);
    std::vector<int> sel_t1(K); // token 0's experts (the canary's target)
    const int vT[] = {1, 5, 9};
    for (int T : vT) {
        moe_cpu(m, cfg, xh.data(), T, ref.data(), sel_ref.data(), w_ref.data());
        std::vector<float> out_v[3];
        for (int v = 1; v <= 2; v++) {
            poison(s, q);
            run_version(v, m, s, xset(0), T, q);
            CK(cudaStreamSynchronize(q));
            out_v[v] = get(s.out, (size_t)T * D);
            CK(cudaMemcpy(sel_got.data(), s.sel, sizeof(int) * T * K, cudaMemcpyDeviceToHost));
            const std::vector<float> w_got = get(s.w, (size_t)T * K);
            int sel_bad = 0;
            for (int i = 0; i < T * K; i++) sel_bad += sel_got[i] != sel_ref[i];
            const err ew = compare(w_got.data(), w_ref.data(), (size_t)T * K);
            const err eo = compare(out_v[v].data(), ref.data(), (size_t)T * D);
            const bool ok = !sel_bad && ew.nmse <= TOL_W_NMSE && eo.nmse <= TOL_NMSE && eo.rel <= TOL_REL;
            fails += !ok;
            printf("  v%d T=%d: sel %s (%d/%d differ)  w NMSE %.2e  out NMSE %.2e max rel %.2e  %s\n", v, T,
                   sel_bad ? "DIFFERENT" : "exact", sel_bad, T * K, ew.nmse, eo.nmse, eo.rel, ok ? "ok" : "FAIL");
            for (int t = 0; sel_bad && t < T; t++)
                if (memcmp(&sel_got[t * K], &sel_ref[t * K], sizeof(int) * K)) {
                    printf("    token %d: gpu", t);
                    for (int j = 0; j < K; j++) printf(" %d", sel_got[t * K + j]);
                    printf(" | cpu");
                    for (int j = 0; j < K; j++) printf(" %d", sel_ref[t * K + j]);
                    printf("\n");
                }
        }
        const bool same = !memcmp(out_v[1].data(), out_v[2].data(), sizeof(float) * T * D);
        fails += !same;
        printf("  T=%d: v2 (eager) ≡ v1 (device table): %s\n", T, same ? "bitwise equal" : "DIFFERENT");
        if (T == 1) std::copy(sel_ref.begin(), sel_ref.begin() + K, sel_t1.begin());
    }
    { // verify ≡ decode: version 1 over 9 tokens, row t, against a 1-token call on row t.
        poison(s, q);
        run_version(1, m, s, xset(0), MAXT, q);
        const std::vector<float> all = get(s.out, (size_t)MAXT * D);
        int differ = 0;
        for (int t = 0; t < MAXT; t++) {
            poison(s, q);
            run_version(1, m, s, xset(0) + (size_t)t * D, 1, q);
            const std::vector<float> one = get(s.out, D);
            if (memcmp(one.data(), all.data() + (size_t)t * D, sizeof(float) * D) == 0) continue;
            differ++;
            int n_el = 0, first = -1;
            float max_abs = 0.0f;
            for (int o = 0; o < D; o++) {
                const float a = one[o], b = all[(size_t)t * D + o];
                if (memcmp(&a, &b, sizeof a) == 0) continue;
                n_el++;
                if (first < 0) first = o;
                max_abs = fmaxf(max_abs, fabsf(a - b));
            }
            printf("    row %d: %d of %d elements differ (first at %d), max |T=9 - T=1| = %.3g\n", t, n_el, D, first,
                   max_abs);
        }
        fails += differ != 0;
        printf("  verify ≡ decode: v1 T=9 rows vs 9 calls of T=1: %s (%d rows differ)\n",
               differ ? "DIFFERENT" : "bitwise equal", differ);
    }
    { // canary: token 0's first expert with its down row 0 negated on the device must fail.
        moe_cpu(m, cfg, xh.data(), 1, ref.data(), sel_ref.data(), w_ref.data());
        uint16_t *row = mat_of(m.d_arena, sel_t1[0], 2);
        std::vector<uint16_t> saved(IE), bad(IE);
        CK(cudaMemcpy(saved.data(), row, IE * 2, cudaMemcpyDeviceToHost));
        for (int i = 0; i < IE; i++) bad[i] = saved[i] ^ 0x8000;
        CK(cudaMemcpy(row, bad.data(), IE * 2, cudaMemcpyHostToDevice));
        poison(s, q);
        run_version(1, m, s, xset(0), 1, q);
        const err ec = compare(get(s.out, D).data(), ref.data(), D);
        CK(cudaMemcpy(row, saved.data(), IE * 2, cudaMemcpyHostToDevice));
        const bool caught = !(ec.nmse <= TOL_NMSE && ec.rel <= TOL_REL);
        fails += !caught;
        printf("  canary (expert %d's down row 0 negated): out NMSE %.2e max rel %.2e: %s\n", sel_t1[0], ec.nmse,
               ec.rel, caught ? "caught (fails, as it must)" : "NOT CAUGHT: the check cannot fail");
    }
    printf("validation: %s (%d failing)\n", fails ? "FAIL" : "all passed", fails);

    // ------------------------------------------------------------------ ceilings
    const double copy = lab_copy_gbs(q, (size_t)2 << 30, 7); // 2 GiB copied: 4 GiB moved
    flusher flush;
    flush.n = std::max((size_t)256 << 20, (size_t)prop.l2CacheSize * 4) / sizeof(uint4);
    flush.blocks = prop.multiProcessorCount * 4;
    CK(cudaMalloc(&flush.buf, flush.n * sizeof(uint4)));
    CK(cudaMalloc(&flush.sink, sizeof(unsigned)));
    CK(cudaMemset(flush.buf, 1, flush.n * sizeof(uint4)));
    printf("\ncopy bandwidth (2 GiB cudaMemcpyDeviceToDevice, read + write): %.0f GB/s; L2 flush: %zu MB read before "
           "each rep\n", copy, flush.n * sizeof(uint4) >> 20);

    // ------------------------------------------------------------------ timing
    const int REPS = 10; // per input set
    cudaEvent_t ev[5];
    for (auto &e : ev) CK(cudaEventCreate(&e));
    struct row { int T; double distinct, bytes, v1, v2, piece[4]; };
    std::vector<row> rows;
    for (int T = 1; T <= MAXT; T++) {
        row r;
        r.T = T;
        // Distinct experts per set (version 1's sel), and a warm-up of every version and set.
        double distinct = 0;
        for (int set = 0; set < NSETS; set++) {
            run_version(2, m, s, xset(set), T, q);
            run_version(1, m, s, xset(set), T, q);
            CK(cudaMemcpyAsync(sel_got.data(), s.sel, sizeof(int) * T * K, cudaMemcpyDeviceToHost, q));
            CK(cudaStreamSynchronize(q));
            std::vector<int> v(sel_got.begin(), sel_got.begin() + T * K);
            std::sort(v.begin(), v.end());
            distinct += std::unique(v.begin(), v.end()) - v.begin();
        }
        r.distinct = distinct / NSETS;
        r.bytes = (r.distinct + 1) * EXPERT_BYTES + (double)E * D * 4 + E * 4 + 2.0 * T * D * 4;
        for (int v = 1; v <= 2; v++) {
            std::vector<float> ms;
            for (int i = 0; i < NSETS * REPS; i++) {
                flush(q);
                CK(cudaEventRecord(ev[0], q));
                run_version(v, m, s, xset(i % NSETS), T, q);
                CK(cudaEventRecord(ev[1], q));
                CK(cudaEventSynchronize(ev[1]));
                float t; CK(cudaEventElapsedTime(&t, ev[0], ev[1]));
                ms.push_back(1e3f * t);
            }
            (v == 1 ? r.v1 : r.v2) = median(ms);
        }
        std::vector<float> pm[4];
        for (int i = 0; i < NSETS * REPS; i++) {
            flush(q);
            run_version(1, m, s, xset(i % NSETS), T, q, ev);
            CK(cudaEventSynchronize(ev[4]));
            for (int p = 0; p < 4; p++) {
                float t; CK(cudaEventElapsedTime(&t, ev[p], ev[p + 1]));
                pm[p].push_back(1e3f * t);
            }
        }
        for (int p = 0; p < 4; p++) r.piece[p] = median(pm[p]);
        rows.push_back(r);
    }
    CK(cudaGetLastError());

    printf("\n%s\n", fails ? "moe_lab: CHECKS FAILED" : "moe_lab: all checks passed");
    printf("\nMoE block, µs (median, L2 flushed, %d input sets × %d reps). v1 = device table, v2 = eager; v1 pieces: "
           "router (+shared, T>=3) | select | experts up (+shared, T<=2) | down+combine. GB/s = bytes / v1 time, %% of copy %.0f GB/s\n",
           NSETS, REPS, copy);
    printf("%2s %8s %8s | %8s %8s %6s | %7s %7s %7s %7s | %7s %6s\n", "T", "distinct", "MB", "v1", "v2", "v2/v1",
           "route", "select", "up", "down", "GB/s", "% copy");
    for (const row &r : rows) {
        const double gbs = r.bytes / (r.v1 * 1e-6) / 1e9;
        printf("%2d %8.1f %8.1f | %8.1f %8.1f %6.2f | %7.1f %7.1f %7.1f %7.1f | %7.0f %5.1f%%\n", r.T, r.distinct,
               r.bytes / 1e6, r.v1, r.v2, r.v2 / r.v1, r.piece[0], r.piece[1], r.piece[2], r.piece[3], gbs,
               100.0 * gbs / copy);
    }
    return fails ? 1 : 0;
}
