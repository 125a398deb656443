// moe.cu — router, SwiGLU FFN, the device-table expert arm and the combine.
//   route:   one block per token; 8 warps score experts e ≡ warp (mod 8) with the fixed-order
//            warp dot; thread 0 then runs the CPU's selection code unchanged (E is small).
//   experts: per (token, slot) a grid row reads the expert id from device memory; one warp per
//            output row computes gate and up dots with the same device function as the Linear
//            (sd_warp_dot ≡ sd_row_dot + warp tree), then silu·up; a second kernel applies down.
//            Hence its bits equal the eager arm's sd_cuda_ffn on the gathered tokens.
//   combine: elementwise, Σ_j in selection order, then + shared (the CPU's order).
#include "moe.h"
#include "common.cuh"
#include "linear.h"

#define MOE_WARPS 8

// The CPU's take_max: the largest untaken v[i], ties to the lower index.
__device__ static int take_max(const float *v, int n, const unsigned char *taken) {
    int best = -1;
    for (int i = 0; i < n; i++)
        if (!taken[i] && (best < 0 || v[i] > v[best])) best = i;
    return best;
}

static __global__ void __launch_bounds__(MOE_WARPS * 32)
route_kernel(const float *__restrict__ router, const float *__restrict__ bias, const float *__restrict__ b, int E, int D,
             int K, int G, int topk_group, int renormalize, float scaling, int *__restrict__ sel, float *__restrict__ wts) {
    extern __shared__ float sm[];
    float *s = sm, *sp = sm + E, *gscore = sp + E;
    unsigned char *taken = (unsigned char *)(gscore + G), *gtaken = taken + E;
    const int t = blockIdx.x, lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    const float *bt = b + (size_t)t * D;
    for (int e = w; e < E; e += MOE_WARPS) {
        const float dot = sd_warp_dot<false>(router, D, e, bt);
        if (lane == 0) {
            s[e] = sd_dev_sigmoid(dot);
            sp[e] = s[e] + bias[e];
        }
    }
    __syncthreads();
    if (threadIdx.x != 0) return;
    const int per = E / G;
    if (G > 1) { // keep the topk_group groups with the best top-2 sums; mask the rest
        for (int g = 0; g < G; g++) {
            const float *v = sp + g * per;
            float top = v[0] > v[1] ? v[0] : v[1], second = v[0] > v[1] ? v[1] : v[0];
            for (int i = 2; i < per; i++) {
                if (v[i] > top) { second = top; top = v[i]; }
                else if (v[i] > second) second = v[i];
            }
            gscore[g] = top + second;
            gtaken[g] = 0;
        }
        for (int kept = 0; kept < topk_group; kept++) gtaken[take_max(gscore, G, gtaken)] = 1;
        for (int e = 0; e < E; e++)
            if (!gtaken[e / per]) sp[e] = -INFINITY;
    }
    for (int e = 0; e < E; e++) taken[e] = 0;
    int *st = sel + (size_t)t * K;
    float *wt = wts + (size_t)t * K, sum = 0.0f;
    for (int j = 0; j < K; j++) {
        st[j] = take_max(sp, E, taken);
        taken[st[j]] = 1;
        wt[j] = s[st[j]];
        sum += wt[j];
    }
    for (int j = 0; j < K; j++) {
        if (renormalize) wt[j] = wt[j] / sum;
        wt[j] = wt[j] * scaling;
    }
}

extern "C" sd_code sd_cuda_moe_route(const float *router, const float *bias, const float *b, int T, int E, int D, int K,
                                     int G, int topk_group, bool renormalize, float scaling, int *sel, float *w,
                                     cudaStream_t stream, sd_status *st) {
    SD_NVTX("sd_cuda_moe_route");
    if (G < 1 || E % G || K > E) return sd_fail(st, SD_ERR_USAGE, "cuda moe route: E %d, G %d, K %d", E, G, K);
    if (T < 1) return SD_OK;
    const size_t smem = sizeof(float) * (2 * (size_t)E + G) + 2 * (size_t)E + G;
    route_kernel<<<T, MOE_WARPS * 32, smem, stream>>>(router, bias, b, E, D, K, G, topk_group, renormalize ? 1 : 0, scaling, sel, w);
    SD_LAUNCH_CHECK(st);
    return SD_OK;
}

static __global__ void silu_mul_kernel(float *__restrict__ h, const float *__restrict__ h2, size_t n) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        h[i] = sd_dev_silu(h[i]) * h2[i];
}

extern "C" sd_code sd_cuda_silu_mul(float *h, const float *h2, size_t n, cudaStream_t stream, sd_status *st) {
    SD_NVTX("sd_cuda_silu_mul");
    if (!n) return SD_OK;
    silu_mul_kernel<<<(int)(n < 256 * 1024 ? (n + 255) / 256 : 1024), 256, 0, stream>>>(h, h2, n);
    SD_LAUNCH_CHECK(st);
    return SD_OK;
}

extern "C" sd_code sd_cuda_ffn(const sd_ffn_weights *w, const float *x, int T, float *out, float *h1, float *h2,
                               cudaStream_t stream, sd_status *st) {
    SD_NVTX("sd_cuda_ffn");
    sd_code rc = sd_cuda_linear(&w->gate, x, T, h1, stream, st);
    if (!rc) rc = sd_cuda_linear(&w->up, x, T, h2, stream, st);
    if (!rc) rc = sd_cuda_silu_mul(h1, h2, (size_t)T * w->gate.rows, stream, st);
    if (!rc) rc = sd_cuda_linear(&w->down, h1, T, out, stream, st);
    return rc;
}

// Grid (row blocks of Ie, T·n_slots): slot j = j0 + blockIdx.y % n_slots of token blockIdx.y / n_slots.
static __global__ void __launch_bounds__(MOE_WARPS * 32)
experts_up_kernel(const sd_cuda_expert *__restrict__ table, int Ie, int D, const int *__restrict__ sel,
                  const float *__restrict__ x, int K, int j0, int n_slots, float *__restrict__ h) {
    const int r = blockIdx.x * MOE_WARPS + (threadIdx.x >> 5);
    if (r >= Ie) return;
    const int t = blockIdx.y / n_slots, j = j0 + blockIdx.y % n_slots;
    const sd_cuda_expert ex = table[sel[(size_t)t * K + j]];
    const float *xt = x + (size_t)t * D;
    const float g = sd_warp_dot_dt(ex.gate, ex.gate_bf16, D, r, xt);
    const float u = sd_warp_dot_dt(ex.up, ex.up_bf16, D, r, xt);
    if ((threadIdx.x & 31) == 0) h[(size_t)blockIdx.y * Ie + r] = sd_dev_silu(g) * u;
}

static __global__ void __launch_bounds__(MOE_WARPS * 32)
experts_down_kernel(const sd_cuda_expert *__restrict__ table, int Ie, int D, const int *__restrict__ sel, int K, int j0,
                    int n_slots, const float *__restrict__ h, float *__restrict__ exp_out) {
    const int o = blockIdx.x * MOE_WARPS + (threadIdx.x >> 5);
    if (o >= D) return;
    const int t = blockIdx.y / n_slots, j = j0 + blockIdx.y % n_slots;
    const size_t slot = (size_t)t * K + j;
    const sd_cuda_expert ex = table[sel[slot]];
    const float y = sd_warp_dot_dt(ex.down, ex.down_bf16, Ie, o, h + (size_t)blockIdx.y * Ie);
    if ((threadIdx.x & 31) == 0) exp_out[slot * D + o] = y;
}

extern "C" sd_code sd_cuda_moe_experts(const sd_cuda_expert *table, int Ie, int D, const int *sel, const float *x, int T,
                                       int K, float *h, size_t h_cap, float *exp_out, cudaStream_t stream, sd_status *st) {
    SD_NVTX("sd_cuda_moe_experts");
    if (T < 1) return SD_OK;
    const size_t per_slot = (size_t)T * Ie;
    if (h_cap < per_slot)
        return sd_fail(st, SD_ERR_USAGE, "cuda moe experts: scratch of %zu floats < %d tokens x %d", h_cap, T, Ie);
    const int group = (int)(h_cap / per_slot < (size_t)K ? h_cap / per_slot : (size_t)K);
    for (int j0 = 0; j0 < K; j0 += group) {
        const int n = K - j0 < group ? K - j0 : group;
        experts_up_kernel<<<dim3(sd_ceil_div(Ie, MOE_WARPS), T * n), MOE_WARPS * 32, 0, stream>>>(table, Ie, D, sel, x, K, j0, n, h);
        SD_LAUNCH_CHECK(st);
        experts_down_kernel<<<dim3(sd_ceil_div(D, MOE_WARPS), T * n), MOE_WARPS * 32, 0, stream>>>(table, Ie, D, sel, K, j0, n, h, exp_out);
        SD_LAUNCH_CHECK(st);
    }
    return SD_OK;
}

static __global__ void combine_kernel(const float *__restrict__ exp_out, const float *__restrict__ w,
                                      const float *__restrict__ shared, int T, int K, int D, float *__restrict__ out) {
    const size_t n = (size_t)T * D;
    for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += (size_t)gridDim.x * blockDim.x) {
        const size_t t = e / D, i = e % D;
        float o = 0.0f;
        for (int j = 0; j < K; j++) o += w[t * K + j] * exp_out[(t * K + j) * D + i];
        if (shared) o += shared[e];
        out[e] = o;
    }
}

extern "C" sd_code sd_cuda_moe_combine(const float *exp_out, const float *w, const float *shared, int T, int K, int D,
                                       float *out, cudaStream_t stream, sd_status *st) {
    SD_NVTX("sd_cuda_moe_combine");
    if (T < 1) return SD_OK;
    const size_t n = (size_t)T * D;
    combine_kernel<<<(int)(n < 256 * 1024 ? (n + 255) / 256 : 1024), 256, 0, stream>>>(exp_out, w, shared, T, K, D, out);
    SD_LAUNCH_CHECK(st);
    return SD_OK;
}
