// cuda_harness.h — what the GPU op and layer suites share (the test-backend-ops habit): fresh
// random inputs per case (never zeros), guarded device buffers whose sentinels are checked when
// each is released, NMSE or bitwise comparisons where NaN/Inf always fails, and random matrices
// on both sides (host data for the CPU op, a device copy for the GPU op). CUDA builds only.
#pragma once
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <string.h>
#include "common.h"
#include <cuda_runtime_api.h>
#include "cuda_backend.h" // sd_cuda_device_count
#include "ops.h"          // sd_f32_to_bf16 (through tensor.h)

#define NEED_GPU()                                                                          \
    do {                                                                                    \
        if (sd_cuda_device_count() == 0) cr_skip_test("no CUDA device: GPU suite skipped"); \
    } while (0)

#define CU(call)                                                                          \
    do {                                                                                  \
        cudaError_t e_ = (call);                                                          \
        cr_assert_eq(e_, cudaSuccess, "%s: %s", #call, cudaGetErrorString(e_));           \
    } while (0)
#define OK(call)                                                                          \
    do {                                                                                  \
        sd_status st_ = {0};                                                              \
        sd_code rc_ = (call);                                                             \
        cr_assert_eq(rc_, SD_OK, "%s: %s", #call, st_.msg);                               \
    } while (0)

// ---------------------------------------------------------------------------- harness
// The running case's seed (every input of a case is drawn from it) and label (at the head of every
// message). A suite of several files defines SD_HARNESS_SHARED in each: one pair for all of them, which
// its main file defines.
#ifdef SD_HARNESS_SHARED
extern uint64_t case_seed;
extern char LABEL[256];
#else
static uint64_t case_seed;
static char LABEL[256];
#endif

static inline uint64_t seed_of(int k) { return case_seed + 7919u * (uint64_t)k; }

static inline const char *fmt(const char *f, ...) {
    static char buf[4][192];
    static int i;
    i = (i + 1) % 4;
    va_list ap;
    va_start(ap, f);
    vsnprintf(buf[i], sizeof buf[i], f, ap);
    va_end(ap);
    return buf[i];
}

static inline void *xmalloc(size_t bytes) {
    void *p = malloc(bytes ? bytes : 1);
    cr_assert(p, "out of host memory (%zu bytes)", bytes);
    return p;
}
static inline float *copy_floats(const float *x, size_t n) { return memcpy(xmalloc(sizeof(float) * n), x, sizeof(float) * n); }

// ---- random inputs (fresh per case; uniform, never a zero buffer) ----
static inline uint64_t rng_next(uint64_t *s) {
    *s ^= *s >> 12; *s ^= *s << 25; *s ^= *s >> 27;
    return *s * 2685821657736338717ull;
}
static inline float rng_unit(uint64_t *s) { return (float)(rng_next(s) >> 40) * (1.0f / 16777216.0f); }
static inline int rng_int(uint64_t *s, int n) { return (int)(rng_next(s) % (uint64_t)n); }
// n values uniform in [-scale, scale).
static inline float *rand_host(size_t n, uint64_t seed, float scale) {
    float *x = xmalloc(sizeof(float) * n);
    uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
    for (size_t i = 0; i < n; i++) x[i] = (rng_unit(&s) * 2.0f - 1.0f) * scale;
    return x;
}
// n values uniform in [lo, hi).
static inline float *rand_in(size_t n, uint64_t seed, float lo, float hi) {
    float *x = rand_host(n, seed, 1.0f);
    for (size_t i = 0; i < n; i++) x[i] = lo + (x[i] + 1.0f) * 0.5f * (hi - lo);
    return x;
}
// Each (token, head) slice of d values scaled to unit L2 norm (what the KDA conv hands the scan).
static inline void unit_heads(float *x, int T, int H, int d) {
    for (int th = 0; th < T * H; th++) {
        float *v = x + (size_t)th * d;
        const float inv = 1.0f / sqrtf(sd_dot_f32(v, v, d) + 1e-6f);
        for (int i = 0; i < d; i++) v[i] *= inv;
    }
}

// ---- guarded device buffers: GUARD sentinel words either side, checked when released ----
#define GUARD 256
static const uint32_t SENTINEL = 0x7fa5a5a5u; // a NaN payload no kernel writes
typedef struct { float *base, *p; size_t n; } gbuf; // n 4-byte words (floats or ints) between the guards
#define IP(g) ((int *)(g).p)

static inline gbuf gbuf_new(size_t n) {
    gbuf g = {.n = n};
    const size_t total = n + 2 * GUARD;
    CU(cudaMalloc((void **)&g.base, total * sizeof(float)));
    uint32_t *fill = xmalloc(total * sizeof(uint32_t));
    for (size_t i = 0; i < total; i++) fill[i] = SENTINEL;
    CU(cudaMemcpy(g.base, fill, total * sizeof(uint32_t), cudaMemcpyHostToDevice));
    free(fill);
    g.p = g.base + GUARD;
    return g;
}
static inline void gbuf_put(gbuf *g, const void *h, size_t n) {
    cr_assert(n <= g->n);
    if (n) CU(cudaMemcpy(g->p, h, n * 4, cudaMemcpyHostToDevice));
}
static inline gbuf gbuf_of(const void *h, size_t n) {
    gbuf g = gbuf_new(n);
    gbuf_put(&g, h, n);
    return g;
}
static inline gbuf gbuf_zero(size_t n) {
    gbuf g = gbuf_new(n);
    if (n) CU(cudaMemset(g.p, 0, n * 4));
    return g;
}
static inline void gbuf_get(const gbuf *g, void *h, size_t n) {
    cr_assert(n <= g->n);
    if (n) CU(cudaMemcpy(h, g->p, n * 4, cudaMemcpyDeviceToHost));
}
static inline void *gbuf_read(const gbuf *g, size_t n) {
    void *h = xmalloc(n * 4);
    gbuf_get(g, h, n);
    return h;
}
// Guards untouched, then freed.
static inline void gbuf_done(gbuf *g, const char *what) {
    const size_t total = g->n + 2 * GUARD;
    uint32_t *all = xmalloc(total * sizeof(uint32_t));
    CU(cudaMemcpy(all, g->base, total * sizeof(uint32_t), cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < GUARD; i++) {
        cr_assert_eq(all[i], SENTINEL, "%s: %s: a write %zu words before the buffer", LABEL, what, GUARD - i);
        cr_assert_eq(all[GUARD + g->n + i], SENTINEL, "%s: %s: a write %zu words past the end", LABEL, what, i);
    }
    free(all);
    CU(cudaFree(g->base));
}

// A device cursor {len, pending} (cursor.h) whose position len + pending is pos, both parts used
// when pos >= 2.
static inline gbuf cursor_at(int pos) {
    const int cur[2] = {pos >= 2 ? pos - 2 : pos, pos >= 2 ? 2 : 0};
    return gbuf_of(cur, 2);
}

// ---- comparisons ----
#define TOL_BITWISE (-1.0)

// got against ref (n 4-byte words): TOL_BITWISE compares the bits and names the first differing
// word; otherwise NMSE = ‖got − ref‖² / ‖ref‖² <= tol, any non-finite value in got fails, and a
// reference that is non-finite or all zeros fails too (the comparison could not fail).
static inline void check_close(double tol, const char *what, const void *got, const void *ref, size_t n) {
    if (tol == TOL_BITWISE) {
        if (n == 0 || memcmp(got, ref, 4 * n) == 0) return;
        const uint32_t *a = got, *b = ref;
        size_t i = 0;
        while (a[i] == b[i]) i++;
        float fa, fb;
        memcpy(&fa, a + i, 4);
        memcpy(&fb, b + i, 4);
        cr_assert_fail("%s: %s: word %zu of %zu is 0x%08x (%.9g, int %d), want 0x%08x (%.9g, int %d)", LABEL, what, i, n,
                       a[i], fa, (int)a[i], b[i], fb, (int)b[i]);
    }
    const float *g = got, *r = ref;
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(r[i])) cr_assert_fail("%s: %s: reference [%zu] is %g", LABEL, what, i, r[i]);
        if (!isfinite(g[i])) cr_assert_fail("%s: %s: [%zu] is %g (NaN/Inf fails)", LABEL, what, i, g[i]);
        const double d = (double)g[i] - r[i];
        num += d * d;
        den += (double)r[i] * r[i];
    }
    cr_assert(den > 0, "%s: %s: the reference is all zeros", LABEL, what);
    cr_log_info("%s: %s NMSE %.3g (bound %.0e)", LABEL, what, num / den, tol);
    cr_assert(num / den <= tol, "%s: %s: NMSE %.3g > %.0e", LABEL, what, num / den, tol);
}
static inline void same_bits(const char *what, const void *got, const void *ref, size_t n) {
    check_close(TOL_BITWISE, what, got, ref, n);
}

// Tolerances against the CPU (each case's .tol; the reason stands here, once):
// TOL_DOT  fp32 dots in another order than the CPU's (32 lane chains with fmaf and a warp tree,
//          linear.cuh, vs 16 partial chains, ops.h): NMSE ~(n/16)·u² ≈ 3e-12 at the widest rows
//          here (n = 12288, u = 2^-24); chained dots (an FFN) add theirs.
// TOL_ELEM a few ulps an element: one fp32 reduction in another order (a norm's Σx²), fmaf
//          contraction, the device expf (≤ 2 ulp from glibc's) in silu/sigmoid/softmax.
// TOL_SEQ  a recurrence or a causal softmax: d- or row-long fp32 chains in another order with the
//          device expf, compounded over up to 17 tokens (KDA state) or 700 cache rows (MLA).
#define TOL_DOT 1e-10
#define TOL_ELEM 1e-11
#define TOL_SEQ 1e-9

// ---- a random matrix on both sides: host data for the CPU op, a device copy for the GPU op ----
typedef struct { sd_mat host, dev; } tmat;
static inline tmat tmat_rand(int rows, int cols, sd_dtype dt, uint64_t seed) {
    tmat m = {.host = {.dtype = dt, .rows = rows, .cols = cols}, .dev = {.dtype = dt, .rows = rows, .cols = cols}};
    const size_t n = (size_t)rows * cols, bytes = n * sd_dtype_size(dt);
    float *f = rand_host(n, seed, 1.0f / sqrtf((float)cols) * 1.7f);
    void *h = xmalloc(bytes);
    if (dt == SD_DT_BF16)
        for (size_t i = 0; i < n; i++) ((uint16_t *)h)[i] = sd_f32_to_bf16(f[i]);
    else
        memcpy(h, f, bytes);
    free(f);
    void *d;
    CU(cudaMalloc(&d, bytes));
    CU(cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice));
    m.host.data = h;
    m.dev.data = d;
    return m;
}
static inline void tmat_free(tmat *m) {
    free((void *)m->host.data);
    CU(cudaFree((void *)m->dev.data));
}

// One case of the table.
typedef struct op_case op_case;
struct op_case {
    const char *op;   // the launchers the case checks, comma-separated (test_op_coverage reads these)
    const char *note; // what the shape exercises (may be NULL)
    void (*run)(const op_case *);
    int shape[8];     // named beside each run function
    sd_dtype dt;      // the weights' dtype, for ops with weights
    double tol;       // against the CPU: an NMSE bound (TOL_*) or TOL_BITWISE
};
static inline void compare(const op_case *c, const char *what, const void *got, const void *ref, size_t n) {
    check_close(c->tol, what, got, ref, n);
}

// A target and its derived draft (the target's first n_layers, its tail scaled by `tail`, seed 21)
// synthesised on the host and uploaded to the GPU.
static inline void device_pair(const char *config, int n_layers, float tail, int bf16, sd_model *t, sd_model *d) {
    sd_config cfg, dcfg;
    load_config(config, &cfg);
    sd_status st = {0};
    cr_assert_eq(sd_draft_config(&cfg, n_layers, &dcfg, &st), SD_OK, "%s", st.msg);
    sd_synth_opts o = {.seed = 21, .dtype = bf16 ? SD_DT_BF16 : SD_DT_F32, .tail_from = n_layers, .tail_scale = tail,
                       .depth = cfg.num_hidden_layers};
    sd_model ht, hd;
    cr_assert_eq(sd_synth_model(&ht, &cfg, &o, &st), SD_OK, "%s", st.msg);
    cr_assert_eq(sd_synth_model(&hd, &dcfg, &o, &st), SD_OK, "%s", st.msg);
    cr_assert_eq(sd_cuda_model_upload(&ht, t, &st), SD_OK, "%s", st.msg);
    cr_assert_eq(sd_cuda_model_upload(&hd, d, &st), SD_OK, "%s", st.msg);
    sd_model_free(&ht);
    sd_model_free(&hd);
}
