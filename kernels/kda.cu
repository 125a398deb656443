// kda.cu — the KDA steps that are not Linears.
//   conv:  kernel 1 copies the T new raw rows into the conv ring; kernel 2, one block per
//          (head, q|k|v, token), one thread per channel: W-tap causal conv + silu, then the
//          head's L2 norm for q and k by a fixed-order block sum.
//   gates: elementwise.
//   scan:  one block per head, thread j owns value column j of S_h; S_h lives on chip for
//          d in {8, 16, 32, 64, 128} (registers, plus shared memory for the last 32 rows at
//          d = 128; one read of the start slot, one write per token slot), else in the
//          destination slot in global memory. k, exp(g), q·d^-0.5 of the token are
//          staged in shared memory. The per-column arithmetic is the CPU kda_step's, operation for
//          operation (the device expf is the only difference).
//   out:   one block per (head, token): RMSNorm over d (fixed-order block sum) ⊙ sigmoid(gb).
#include "kda.h"
#include "common.cuh"

static __global__ void conv_store_kernel(float *__restrict__ rows, int n_rows, const float *__restrict__ q,
                                         const float *__restrict__ k, const float *__restrict__ v, int T, int P, int pos0) {
    const size_t n = (size_t)T * 3 * P;
    for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += (size_t)gridDim.x * blockDim.x) {
        const int t = (int)(e / (3 * (size_t)P)), r = (int)(e % (3 * (size_t)P)), which = r / P, ch = r % P;
        const float *src = which == 0 ? q : which == 1 ? k : v;
        rows[(size_t)((pos0 + t) % n_rows) * 3 * P + r] = src[(size_t)t * P + ch];
    }
}

static __global__ void conv_kernel(const float *__restrict__ rows, int n_rows, const float *__restrict__ tq,
                                   const float *__restrict__ tk, const float *__restrict__ tv, int P, int d, int W,
                                   int pos0, float *__restrict__ qc, float *__restrict__ kc, float *__restrict__ vc) {
    __shared__ float sh[32];
    const int h = blockIdx.x, which = blockIdx.y, t = blockIdx.z, c = threadIdx.x;
    const int ch = h * d + c, pos = pos0 + t;
    const float *taps = which == 0 ? tq : which == 1 ? tk : tv;
    float val = 0.0f;
    if (c < d) {
        float acc = 0.0f;
        for (int j = 0; j < W; j++) {
            const int p = pos - (W - 1) + j;
            if (p < 0) continue;
            acc += taps[(size_t)ch * W + j] * rows[(size_t)(p % n_rows) * 3 * P + (size_t)which * P + ch];
        }
        val = sd_dev_silu(acc);
    }
    if (which < 2) { // block-uniform: q and k are L2-normalised per head
        const float ss = sd_block_sum(val * val, sh);
        const float inv = 1.0f / sqrtf(ss + 1e-6f);
        val *= inv;
    }
    float *out = which == 0 ? qc : which == 1 ? kc : vc;
    if (c < d) out[(size_t)t * P + ch] = val;
}

extern "C" sd_code sd_cuda_kda_conv(float *conv_rows, int n_rows, const float *q, const float *k, const float *v,
                                    const float *q_conv, const float *k_conv, const float *v_conv, int T, int H, int d,
                                    int W, int pos0, float *qc, float *kc, float *vc, cudaStream_t stream, sd_status *st) {
    SD_NVTX("sd_cuda_kda_conv");
    if (d < 1 || d > 1024) return sd_fail(st, SD_ERR_UNSUPPORTED, "cuda kda: head_dim %d outside 1..1024", d);
    if (T < 1) return SD_OK;
    const int P = H * d;
    const size_t n = (size_t)T * 3 * P;
    conv_store_kernel<<<(int)(n < 256 * 1024 ? (n + 255) / 256 : 1024), 256, 0, stream>>>(conv_rows, n_rows, q, k, v, T, P, pos0);
    SD_LAUNCH_CHECK(st);
    conv_kernel<<<dim3(H, 3, T), sd_round32(d), 0, stream>>>(conv_rows, n_rows, q_conv, k_conv, v_conv, P, d, W, pos0, qc, kc, vc);
    SD_LAUNCH_CHECK(st);
    return SD_OK;
}

static __global__ void gates_kernel(float *__restrict__ gate, float *__restrict__ beta, const float *__restrict__ A_log,
                                    const float *__restrict__ dt_bias, int T, int H, int d) {
    const size_t P = (size_t)H * d, ng = (size_t)T * P, n = ng + (size_t)T * H;
    for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += (size_t)gridDim.x * blockDim.x) {
        if (e < ng) {
            const int ch = (int)(e % P);
            gate[e] = -expf(A_log[ch / d]) * sd_dev_softplus(gate[e] + dt_bias[ch]);
        } else {
            beta[e - ng] = sd_dev_sigmoid(beta[e - ng]);
        }
    }
}

extern "C" sd_code sd_cuda_kda_gates(float *gate, float *beta, const float *A_log, const float *dt_bias, int T, int H,
                                     int d, cudaStream_t stream, sd_status *st) {
    SD_NVTX("sd_cuda_kda_gates");
    if (T < 1) return SD_OK;
    const size_t n = (size_t)T * H * d + (size_t)T * H;
    gates_kernel<<<(int)(n < 256 * 1024 ? (n + 255) / 256 : 1024), 256, 0, stream>>>(gate, beta, A_log, dt_bias, T, H, d);
    SD_LAUNCH_CHECK(st);
    return SD_OK;
}

// Stage token t's k, exp(g), q·scale for head h (thread j loads entry j; d threads).
__device__ __forceinline__ void scan_stage(int j, size_t o, const float *kc, const float *gate, const float *qc,
                                           float scale, float *ksh, float *esh, float *qsh) {
    ksh[j] = kc[o + j];
    esh[j] = expf(gate[o + j]);
    qsh[j] = qc[o + j] * scale;
}

// Rows 0..DR-1 of the column live in registers, rows DR..D-1 in shared memory (column j of
// ssh, conflict-free); DR < D only where registers alone would spill (d = 128).
template <int D, int DR>
static __global__ void __launch_bounds__(D)
scan_reg_kernel(float *S, int n_slots, int n0, int T, int H, const float *__restrict__ qc, const float *__restrict__ kc,
                const float *__restrict__ vc, const float *__restrict__ gate, const float *__restrict__ beta,
                float *__restrict__ y) {
    __shared__ float ksh[D], esh[D], qsh[D];
    __shared__ float ssh[(D - DR) * D + 1];
    const int h = blockIdx.x, j = threadIdx.x;
    const size_t P = (size_t)H * D, per_slot = P * D, head = (size_t)h * D * D;
    const float scale = 1.0f / sqrtf((float)D);
    float s[DR];
    const float *src = S + (size_t)(n0 % n_slots) * per_slot + head;
#pragma unroll
    for (int i = 0; i < DR; i++) s[i] = src[(size_t)i * D + j];
    for (int i = DR; i < D; i++) ssh[(i - DR) * D + j] = src[(size_t)i * D + j];
    for (int t = 0; t < T; t++) {
        const size_t o = (size_t)t * P + (size_t)h * D;
        scan_stage(j, o, kc, gate, qc, scale, ksh, esh, qsh);
        __syncthreads();
        float ks = 0.0f;
#pragma unroll
        for (int i = 0; i < DR; i++) {
            s[i] = s[i] * esh[i];
            ks += s[i] * ksh[i];
        }
#pragma unroll 8
        for (int i = DR; i < D; i++) {
            const float sv = ssh[(i - DR) * D + j] * esh[i];
            ssh[(i - DR) * D + j] = sv;
            ks += sv * ksh[i];
        }
        const float u = beta[(size_t)t * H + h] * (vc[o + j] - ks);
        float *dst = S + (size_t)((n0 + t + 1) % n_slots) * per_slot + head;
        float acc = 0.0f;
#pragma unroll
        for (int i = 0; i < DR; i++) {
            s[i] += ksh[i] * u;
            acc += s[i] * qsh[i];
            dst[(size_t)i * D + j] = s[i];
        }
#pragma unroll 8
        for (int i = DR; i < D; i++) {
            const float sv = ssh[(i - DR) * D + j] + ksh[i] * u;
            ssh[(i - DR) * D + j] = sv;
            acc += sv * qsh[i];
            dst[(size_t)i * D + j] = sv;
        }
        y[o + j] = acc;
        __syncthreads();
    }
}

// Any d: the column is updated in place in each destination slot (same arithmetic as above).
static __global__ void scan_global_kernel(float *S, int n_slots, int n0, int T, int H, int d, const float *__restrict__ qc,
                                          const float *__restrict__ kc, const float *__restrict__ vc,
                                          const float *__restrict__ gate, const float *__restrict__ beta, float *__restrict__ y) {
    extern __shared__ float smem[];
    float *ksh = smem, *esh = smem + d, *qsh = smem + 2 * d;
    const int h = blockIdx.x, j = threadIdx.x;
    const size_t P = (size_t)H * d, per_slot = P * d, head = (size_t)h * d * d;
    const float scale = 1.0f / sqrtf((float)d);
    for (int t = 0; t < T; t++) {
        const size_t o = (size_t)t * P + (size_t)h * d;
        scan_stage(j, o, kc, gate, qc, scale, ksh, esh, qsh);
        __syncthreads();
        const float *src = S + (size_t)((n0 + t) % n_slots) * per_slot + head;
        float *dst = S + (size_t)((n0 + t + 1) % n_slots) * per_slot + head;
        float ks = 0.0f;
        for (int i = 0; i < d; i++) {
            const float sv = src[(size_t)i * d + j] * esh[i];
            dst[(size_t)i * d + j] = sv;
            ks += sv * ksh[i];
        }
        const float u = beta[(size_t)t * H + h] * (vc[o + j] - ks);
        float acc = 0.0f;
        for (int i = 0; i < d; i++) {
            const float sv = dst[(size_t)i * d + j] + ksh[i] * u;
            dst[(size_t)i * d + j] = sv;
            acc += sv * qsh[i];
        }
        y[o + j] = acc;
        __syncthreads();
    }
}

extern "C" sd_code sd_cuda_kda_scan(float *S, int n_slots, int n0, int T, int H, int d, const float *qc, const float *kc,
                                    const float *vc, const float *gate, const float *beta, float *y, cudaStream_t stream,
                                    sd_status *st) {
    SD_NVTX("sd_cuda_kda_scan");
    if (d < 1 || d > 1024) return sd_fail(st, SD_ERR_UNSUPPORTED, "cuda kda: head_dim %d outside 1..1024", d);
    if (T < 1) return SD_OK;
    if (T >= n_slots) return sd_fail(st, SD_ERR_USAGE, "cuda kda scan: %d tokens need more than %d state slots", T, n_slots);
    switch (d) {
    case 8: scan_reg_kernel<8, 8><<<H, 8, 0, stream>>>(S, n_slots, n0, T, H, qc, kc, vc, gate, beta, y); break;
    case 16: scan_reg_kernel<16, 16><<<H, 16, 0, stream>>>(S, n_slots, n0, T, H, qc, kc, vc, gate, beta, y); break;
    case 32: scan_reg_kernel<32, 32><<<H, 32, 0, stream>>>(S, n_slots, n0, T, H, qc, kc, vc, gate, beta, y); break;
    case 64: scan_reg_kernel<64, 64><<<H, 64, 0, stream>>>(S, n_slots, n0, T, H, qc, kc, vc, gate, beta, y); break;
    case 128: scan_reg_kernel<128, 96><<<H, 128, 0, stream>>>(S, n_slots, n0, T, H, qc, kc, vc, gate, beta, y); break;
    default:
        scan_global_kernel<<<H, d, 3 * (size_t)d * sizeof(float), stream>>>(S, n_slots, n0, T, H, d, qc, kc, vc, gate, beta, y);
    }
    SD_LAUNCH_CHECK(st);
    return SD_OK;
}

static __global__ void out_kernel(float *__restrict__ y, const float *__restrict__ gb, const float *__restrict__ o_norm,
                                  float eps, int H, int d) {
    __shared__ float sh[32];
    const int h = blockIdx.x, t = blockIdx.y, c = threadIdx.x;
    const size_t o = ((size_t)t * H + h) * d + c;
    const float yv = c < d ? y[o] : 0.0f;
    const float ss = sd_block_sum(yv * yv, sh);
    const float scale = 1.0f / sqrtf(ss / (float)d + eps);
    if (c < d) {
        const float r = (yv * scale) * o_norm[c];
        y[o] = r * sd_dev_sigmoid(gb[o]);
    }
}

extern "C" sd_code sd_cuda_kda_out(float *y, const float *gb, const float *o_norm, float eps, int T, int H, int d,
                                   cudaStream_t stream, sd_status *st) {
    SD_NVTX("sd_cuda_kda_out");
    if (d < 1 || d > 1024) return sd_fail(st, SD_ERR_UNSUPPORTED, "cuda kda: head_dim %d outside 1..1024", d);
    if (T < 1) return SD_OK;
    out_kernel<<<dim3(H, T), sd_round32(d), 0, stream>>>(y, gb, o_norm, eps, H, d);
    SD_LAUNCH_CHECK(st);
    return SD_OK;
}
