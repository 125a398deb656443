// acceptance.cu — sd_accept_ref (engine/accept.c) in one block, in the CPU's operation order:
//   the accept loop: one thread, d_i stands while u_i·q_i(d_i) < p_{i-1}(d_i) (two loads a
//                    draft; the float product and compare are the CPU's, bit for bit);
//   residual:        max(0, p - q) in parallel (elementwise: exact), the sum by one thread in
//                    index order (the CPU's rounding), the scale by 1.0f/sum in parallel, or a
//                    copy of p when the sum is not positive (sample.h: sd_residual);
//   bonus:           sd_dev_sample (sampling.cuh: the CPU's loop) on the residual or on p_k.
// Greedy rounds compare argmaxes in one thread. (n, bonus) land in device memory.
#include "acceptance.h"
#include "philox.h"     // sd_uniform, SD_DRAW_ACCEPT, SD_DRAW_BONUS
#include "sampling.cuh" // sd_dev_sample

#define ACCEPT_THREADS 1024

static __global__ void __launch_bounds__(ACCEPT_THREADS)
accept_kernel(const int *__restrict__ drafts, int k, const int *__restrict__ top, const float *__restrict__ p,
              const float *__restrict__ q, float *__restrict__ work, int V, uint64_t seed, sd_dev_draw at,
              int *__restrict__ out) {
    const uint32_t round = at.round_dev ? *at.round_dev : at.round, pos_x = (uint32_t)sd_pos_read(at.pos);
    __shared__ int reject_sh; // the first rejected i (1-based); 0: all k stand
    __shared__ float inv_sh;
    __shared__ int flat_sh;   // the residual's sum is not positive: the bonus is drawn from p
    const int tid = threadIdx.x;
    if (top) {
        if (tid == 0) {
            int i = 0;
            while (i < k && top[i] == drafts[i]) i++;
            out[0] = i;
            out[1] = top[i];
        }
        return;
    }
    if (tid == 0) {
        int reject = 0;
        for (int i = 1; i <= k && !reject; i++) {
            const int d = drafts[i - 1];
            const float pd = p[(size_t)(i - 1) * V + d], qd = q[(size_t)(i - 1) * V + d];
            if (!(sd_uniform(seed, round, pos_x + (uint32_t)i, SD_DRAW_ACCEPT) * qd < pd)) reject = i;
        }
        reject_sh = reject;
    }
    __syncthreads();
    const int reject = reject_sh; // block-uniform
    if (!reject) {
        if (tid == 0) {
            out[0] = k;
            out[1] = sd_dev_sample(p + (size_t)k * V, V, sd_uniform(seed, round, pos_x + (uint32_t)k + 1, SD_DRAW_BONUS));
        }
        return;
    }
    const float *pr = p + (size_t)(reject - 1) * V, *qr = q + (size_t)(reject - 1) * V;
    for (int j = tid; j < V; j += blockDim.x) {
        const float d = pr[j] - qr[j];
        work[j] = d > 0 ? d : 0.0f;
    }
    __syncthreads(); // the block's global writes are visible to thread 0 after the barrier
    if (tid == 0) {
        float s = 0.0f;
        for (int j = 0; j < V; j++) s += work[j];
        flat_sh = !(s > 0);
        inv_sh = 1.0f / s;
    }
    __syncthreads();
    const float inv = inv_sh;
    const bool flat = flat_sh;
    for (int j = tid; j < V; j += blockDim.x) work[j] = flat ? pr[j] : work[j] * inv;
    __syncthreads();
    if (tid == 0) {
        out[0] = reject - 1;
        out[1] = sd_dev_sample(work, V, sd_uniform(seed, round, pos_x + (uint32_t)reject, SD_DRAW_BONUS));
    }
}

extern "C" sd_code sd_cuda_accept(const int *drafts, int k, const int *top, const float *p, const float *q, float *work,
                                  int V, uint64_t seed, sd_dev_draw at, int *out, cudaStream_t stream, sd_status *st) {
    SD_NVTX("sd_cuda_accept");
    if (k < 1 || V < 1) return sd_fail(st, SD_ERR_USAGE, "cuda accept: k = %d and V = %d must be >= 1", k, V);
    accept_kernel<<<1, ACCEPT_THREADS, 0, stream>>>(drafts, k, top, p, q, work, V, seed, at, out);
    SD_LAUNCH_CHECK(st);
    return SD_OK;
}
