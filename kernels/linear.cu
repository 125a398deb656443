// linear.cu — y = W·x for decode and verify token counts (T <= 32 per launch), several
// Linears per launch.
//
// Memory-bound design: one warp per weight row (linear.cuh: 16-byte weight loads, several in
// flight per lane, the T tokens looped inside so every weight byte is read once per launch; x
// rows are small and come from L1). 8 warps per block; the blocks of all jobs form one grid
// (job k owns blocks blk0[k] .. blk0[k+1]-1), so small matrices ride in the launch of the large
// ones instead of paying a launch and a tail each. SWIGLU jobs compute the gate and the up row
// in the same warp (one x load for both); from 3 tokens up a STORE/ADD warp takes two adjacent
// rows, so each x load feeds two rows (the x loads from L1 are what bounds a many-token tile),
// and so does it in a launch with the norm fused, whose every block recomputes the norm first:
// half the blocks, half the prologues (kimi-linear KDA in-projection at T = 1: 26.8 -> 23.9 us).
// With 4 tokens or more the sums hold the registers, so few chunks a lane are in flight: the
// block's first thread bulk-prefetches the block's rows into L2 (linear.cuh) and the loads hit
// L2. Order per output element: linear.cuh — independent of T, of the rows per warp and of the
// prefetch by construction.
#include "linear.h"
#include "linear.cuh"
#include "rows.cuh" // sd_block_rmsnorm, SD_NORM_THREADS
#include "rows.h"  // sd_cuda_rmsnorm
#include <string.h>

#define LIN_MAXJOB 8
#define LIN_TILE 32

typedef struct {
    const void *w, *w2;
    const float *x;
    float *y;
    int rows, cols, ldx, ldy, mode, bf16, bf16_2, xfast, blk0;
    int rpw;   // weight rows per warp: 2 for STORE/ADD jobs from 3 tokens up (x loads shared by both),
               // and for those of a launch with the norm fused (half the blocks: half the norm prologues)
    int x_norm; // x is the fused norm's output: read the block's shared copy
} lin_seg;

typedef struct {
    lin_seg s[LIN_MAXJOB];
    int n, T;
    // Fused RMSNorm (nn > 0): a = rmsnorm(nx, nw, neps) into shared memory, block 0 writes nout.
    const float *nx, *nw;
    float *nout;
    float neps;
    int nn;
} lin_params;

#define LIN_NORM_SMEM (32 * 1024)
static_assert(SD_LIN_WARPS * 32 == SD_NORM_THREADS, "the fused norm runs sd_block_rmsnorm with the Linear block");

template <int TMAX>
static __global__ void __launch_bounds__(SD_LIN_WARPS * 32, 2) linear_kernel(const __grid_constant__ lin_params p) {
    sd_pdl_trigger();
    int k = 0;
    while (k + 1 < p.n && (int)blockIdx.x >= p.s[k + 1].blk0) k++;
    const lin_seg &s = p.s[k];
    extern __shared__ __align__(16) float a_sh[]; // (T, nn) when the norm is fused
    const size_t esz = s.bf16 ? 2 : 4, esz2 = s.bf16_2 ? 2 : 4, pitch = (size_t)s.cols * esz;
    const int first = ((int)blockIdx.x - s.blk0) * SD_LIN_WARPS * s.rpw;
    // Many tokens: few chunks a lane in flight, so stream the block's rows into L2 first. Weights
    // are never written, so this may precede the wait for the predecessor (pdl.h).
    if (TMAX >= 4 && threadIdx.x == 0) {
        const int n = min(SD_LIN_WARPS * s.rpw, s.rows - first);
        sd_prefetch_l2((const char *)s.w + (size_t)first * pitch, (size_t)n * pitch);
        if (s.mode == SD_LIN_SWIGLU) sd_prefetch_l2((const char *)s.w2 + (size_t)first * s.cols * esz2, (size_t)n * s.cols * esz2);
    }
    sd_pdl_wait();
    if (p.nn) { // rows.cuh's norm, as sd_cuda_rmsnorm computes it (blockDim.x == SD_NORM_THREADS)
        __shared__ float red[32];
        for (int t = 0; t < p.T; t++) sd_block_rmsnorm(p.nx + (size_t)t * p.nn, p.nw, p.nn, p.neps, a_sh + (size_t)t * p.nn, red);
        __syncthreads();
        if (blockIdx.x == 0)
            for (int i = threadIdx.x; i < p.T * p.nn; i += blockDim.x) p.nout[i] = a_sh[i];
    }
    const int row = first + (threadIdx.x >> 5) * s.rpw;
    if (row >= s.rows) return; // whole warp
    const bool glu = s.mode == SD_LIN_SWIGLU;
    const void *w0 = (const char *)s.w + (size_t)row * pitch;
    const void *w1 = glu ? (const char *)s.w2 + (size_t)row * s.cols * esz2
                         : (s.rpw == 2 && row + 1 < s.rows ? (const char *)w0 + pitch : nullptr);
    float acc[2][TMAX];
#pragma unroll
    for (int t = 0; t < TMAX; t++) acc[0][t] = acc[1][t] = 0.0f;
    const sd_lin_rows xs = {s.x_norm ? a_sh : s.x, s.x_norm ? (size_t)p.nn : (size_t)s.ldx};
    sd_lin_dot<TMAX>(w0, s.bf16, w1, glu ? s.bf16_2 : s.bf16, s.cols, xs, p.T, s.x_norm ? true : s.xfast, acc);
#pragma unroll
    for (int t = 0; t < TMAX; t++) {
        if (t >= p.T) break;
        const float v0 = sd_warp_sum(acc[0][t]);
        const float v1 = w1 ? sd_warp_sum(acc[1][t]) : 0.0f;
        if ((threadIdx.x & 31) != 0) continue;
        float *yo = s.y + (size_t)t * s.ldy + row;
        if (glu) {
            *yo = sd_dev_silu(v0) * v1;
        } else {
            *yo = s.mode == SD_LIN_ADD ? *yo + v0 : v0;
            if (w1) yo[1] = s.mode == SD_LIN_ADD ? yo[1] + v1 : v1;
        }
    }
}

static bool aligned16(const void *p) { return ((uintptr_t)p & 15) == 0; }

static sd_code check_mat(const sd_mat *w, sd_status *st) {
    if (w->dtype != SD_DT_BF16 && w->dtype != SD_DT_F32)
        return sd_fail(st, SD_ERR_UNSUPPORTED, "cuda linear: weight dtype %d is not F32 or BF16", (int)w->dtype);
    return SD_OK;
}

// One launch over jobs[0..n) (n <= LIN_MAXJOB) for tokens t0 .. t0+T-1 (norm: fused, or NULL).
static sd_code launch(const sd_lin_job *jobs, int n, int t0, int T, const sd_lin_norm *norm, cudaStream_t stream,
                      sd_status *st) {
    lin_params p;
    memset(&p, 0, sizeof p);
    if (norm) {
        p.nx = norm->x;
        p.nw = norm->w;
        p.neps = norm->eps;
        p.nn = norm->n;
        p.nout = norm->out;
    }
    int blocks = 0;
    for (int i = 0; i < n; i++) {
        const sd_lin_job *j = &jobs[i];
        lin_seg *s = &p.s[p.n];
        if (j->w->rows < 1 || j->w->cols < 1) continue;
        *s = (lin_seg){.w = j->w->data, .w2 = j->mode == SD_LIN_SWIGLU ? j->w2->data : nullptr,
                       .x = j->x + (size_t)t0 * j->ldx, .y = j->y + (size_t)t0 * j->ldy, .rows = j->w->rows,
                       .cols = j->w->cols, .ldx = j->ldx, .ldy = j->ldy, .mode = (int)j->mode,
                       .bf16 = j->w->dtype == SD_DT_BF16,
                       .bf16_2 = j->mode == SD_LIN_SWIGLU && j->w2->dtype == SD_DT_BF16,
                       .xfast = aligned16(j->x) && j->ldx % 4 == 0, .blk0 = blocks,
                       .rpw = j->mode != SD_LIN_SWIGLU && (T >= 3 || norm) ? 2 : 1, .x_norm = norm && j->x == norm->out};
        blocks += sd_ceil_div(j->w->rows, SD_LIN_WARPS * s->rpw);
        p.n++;
    }
    if (!p.n) return SD_OK;
    p.T = T;
    const dim3 grid(blocks), block(SD_LIN_WARPS * 32);
    const size_t smem = norm ? sizeof(float) * (size_t)T * norm->n : 0;
    void (*kernel)(const lin_params) = T <= 1 ? linear_kernel<1> : T <= 2 ? linear_kernel<2> : T <= 4 ? linear_kernel<4>
                                      : T <= 8 ? linear_kernel<8> : T <= 16 ? linear_kernel<16> : linear_kernel<32>;
    SD_CUDA_CHECK(st, sd_launch(kernel, grid, block, smem, stream, p));
    return SD_OK;
}

static sd_code check_jobs(const sd_lin_job *jobs, int n_jobs, sd_status *st) {
    for (int i = 0; i < n_jobs; i++) {
        const sd_lin_job *j = &jobs[i];
        sd_code rc = check_mat(j->w, st);
        if (!rc && j->mode == SD_LIN_SWIGLU) {
            if (!j->w2) return sd_fail(st, SD_ERR_USAGE, "cuda linear: a SwiGLU job needs its up matrix");
            rc = check_mat(j->w2, st);
            if (!rc && (j->w2->rows != j->w->rows || j->w2->cols != j->w->cols))
                return sd_fail(st, SD_ERR_USAGE, "cuda linear: SwiGLU gate %dx%d and up %dx%d differ", j->w->rows,
                               j->w->cols, j->w2->rows, j->w2->cols);
        }
        if (rc) return rc;
        if (j->ldx < j->w->cols || j->ldy < (j->mode == SD_LIN_SWIGLU ? j->w->rows : j->w->rows))
            return sd_fail(st, SD_ERR_USAGE, "cuda linear: row strides %d/%d below the matrix %dx%d", j->ldx, j->ldy,
                           j->w->rows, j->w->cols);
    }
    return SD_OK;
}

extern "C" sd_code sd_cuda_linear_multi(const sd_lin_job *jobs, int n_jobs, int T, cudaStream_t stream, sd_status *st) {
    SD_NVTX("sd_cuda_linear_multi");
    sd_code rc = check_jobs(jobs, n_jobs, st);
    if (rc || T < 1) return rc;
    for (int t0 = 0; t0 < T; t0 += LIN_TILE) {
        const int n = T - t0 < LIN_TILE ? T - t0 : LIN_TILE;
        for (int j0 = 0; j0 < n_jobs; j0 += LIN_MAXJOB) {
            rc = launch(jobs + j0, n_jobs - j0 < LIN_MAXJOB ? n_jobs - j0 : LIN_MAXJOB, t0, n, NULL, stream, st);
            if (rc) return rc;
        }
    }
    return SD_OK;
}

extern "C" sd_code sd_cuda_linear_multi_norm(const sd_lin_job *jobs, int n_jobs, int T, const sd_lin_norm *norm,
                                             cudaStream_t stream, sd_status *st) {
    SD_NVTX("sd_cuda_linear_multi_norm");
    sd_code rc = check_jobs(jobs, n_jobs, st);
    if (rc || T < 1) return rc;
    const bool fuse = T <= 2 && n_jobs <= LIN_MAXJOB && norm->n % 4 == 0 && norm->n > 0 &&
                      sizeof(float) * (size_t)T * norm->n <= LIN_NORM_SMEM;
    if (!fuse) {
        rc = sd_cuda_rmsnorm(norm->x, norm->w, T, norm->n, norm->eps, norm->out, stream, st);
        return rc ? rc : sd_cuda_linear_multi(jobs, n_jobs, T, stream, st);
    }
    for (int i = 0; i < n_jobs; i++)
        if (jobs[i].x == norm->out && jobs[i].ldx != norm->n)
            return sd_fail(st, SD_ERR_USAGE, "cuda linear: a job reads the norm's output with row stride %d != %d", jobs[i].ldx,
                           norm->n);
    return launch(jobs, n_jobs, 0, T, norm, stream, st);
}

extern "C" sd_code sd_cuda_linear(const sd_mat *w, const float *x, int T, float *y, cudaStream_t stream, sd_status *st) {
    SD_NVTX("sd_cuda_linear");
    const sd_lin_job j = {.w = w, .x = x, .ldx = w->cols, .y = y, .ldy = w->rows, .mode = SD_LIN_STORE};
    return sd_cuda_linear_multi(&j, 1, T, stream, st);
}
