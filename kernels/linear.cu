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
// half the blocks, half the prologues (docs/EXPERIMENTS.md#linear-two-rows-a-warp). A verify-sized
// launch (3..9 tokens, each count its own instance) whose rows fill the device at four rows a
// warp takes four, and its pairs load the next chunks while they fold
// (docs/EXPERIMENTS.md#linear-verify-four-rows); one of 5..9 tokens whose rows leave the device
// short of two blocks a multiprocessor dots each job's rows twice, for the first half of the tokens
// and for the rest (docs/EXPERIMENTS.md#linear-verify-token-split).
// One or two tokens (BULK): the block's first thread bulk-copies the block's weight rows into
// shared memory at once, before the wait for the predecessor and the fused norm, and the warps
// dot them from there. With 4 tokens or more the sums hold the registers, so few chunks a lane
// are in flight: the block's first thread bulk-prefetches the block's rows into L2 (linear.cuh)
// and the loads hit L2. Order per output element: linear.cuh — independent of T, of the rows
// per warp, of where the rows are read from and of the prefetch by construction. A launch lets
// its successor start after its wait, not at its first instruction (pdl.h).
#include "linear.h"
#include "linear.cuh"
#include "rows.cuh" // sd_block_rmsnorm, SD_NORM_THREADS
#include "rows.h"  // sd_cuda_rmsnorm
#include <string.h>

#define LIN_MAXJOB 8
#define LIN_TILE 32
// BULK: the most weight bytes a block holds in shared memory (two blocks a multiprocessor). Wider
// blocks, persistent grids, BULK beyond two tokens and x staged in shared memory were all slower:
// docs/EXPERIMENTS.md#linear-bulk.
#define LIN_BULK_MAX (80 * 1024)

typedef struct {
    const void *w, *w2;
    const float *x;
    float *y;
    int rows, cols, ldx, ldy, mode, bf16, bf16_2, xfast, blk0;
    int rpw;   // weight rows per warp, dotted two at a time: 2 for STORE/ADD jobs from 3 tokens up (x
               // loads shared by both), and for those of a launch with the norm fused (half the
               // blocks: half the norm prologues); more for narrow rows (narrow_rpw); 1 for SwiGLU
               // jobs and in a BULK launch where two would pass LIN_BULK_MAX
    int x_norm; // x is the fused norm's output: read the block's shared copy
    int *flag, site; // the job's non-finite flag (STORE/ADD outputs), or NULL
    int T;      // the tokens this segment dots: the launch's, or its share of them (LIN_SPLIT_MIN_T)
} lin_seg;

typedef struct {
    lin_seg s[LIN_MAXJOB]; // a job's one segment, or two when its tokens are split (at most LIN_MAXJOB / 2 jobs)
    int n, T;              // segments; the launch's tokens (what the fused norm computes)
    // Fused RMSNorm (nn > 0): a = rmsnorm(nx, nw, neps) into shared memory, block 0 writes nout.
    const float *nx, *nw;
    float *nout;
    float neps;
    int nn;
    int *nflag, nsite; // the non-finite flag the norm sets (block 0 only), or NULL
    int wt_off, bar_off; // BULK: shared-memory offsets of the weight rows and of their barrier
} lin_params;

#define LIN_NORM_SMEM (32 * 1024)
static_assert(SD_LIN_WARPS * 32 == SD_NORM_THREADS, "the fused norm runs sd_block_rmsnorm with the Linear block");

// The fused norm: a_sh (T, nn) = rows.cuh's norm of nx, as sd_cuda_rmsnorm computes it
// (blockDim.x == SD_NORM_THREADS); block 0 writes nout. Ends with a block barrier.
__device__ __forceinline__ void lin_norm(const lin_params &p, float *a_sh) {
    __shared__ float red[32];
    int *flag = blockIdx.x == 0 ? p.nflag : nullptr; // every block computes the same sums
    for (int t = 0; t < p.T; t++)
        sd_block_rmsnorm(p.nx + (size_t)t * p.nn, p.nw, p.nn, p.neps, a_sh + (size_t)t * p.nn, red, flag, p.nsite);
    __syncthreads();
    if (blockIdx.x == 0)
        for (int i = threadIdx.x; i < p.T * p.nn; i += blockDim.x) p.nout[i] = a_sh[i];
}

// Lane 0 writes the warp's outputs for `row` (and row + 1 when two rows were dotted, or the
// SwiGLU product of the gate and up dots).
template <int TMAX>
__device__ __forceinline__ void lin_store(const lin_seg &s, int row, bool two, int T, float (*acc)[TMAX]) {
    const bool glu = s.mode == SD_LIN_SWIGLU;
#pragma unroll
    for (int t = 0; t < TMAX; t++) {
        if (t >= T) break;
        const float v0 = sd_warp_sum(acc[0][t]);
        const float v1 = two ? sd_warp_sum(acc[1][t]) : 0.0f;
        if ((threadIdx.x & 31) != 0) continue;
        float *yo = s.y + (size_t)t * s.ldy + row;
        if (glu) {
            *yo = sd_dev_silu(v0) * v1;
        } else {
            const float o0 = s.mode == SD_LIN_ADD ? *yo + v0 : v0, o1 = two ? (s.mode == SD_LIN_ADD ? yo[1] + v1 : v1) : 0.0f;
            *yo = o0;
            if (two) yo[1] = o1;
            if (s.flag && !(isfinite(o0) && isfinite(o1))) atomicMin(s.flag, s.site);
        }
    }
}

// Rows held in shared memory (BULK): the same dots as sd_lin_dot's fast path.
template <int TMAX>
__device__ __forceinline__ void lin_dot_shared(const char *w0, bool bf0, const char *w1, bool bf1, int cols,
                                               const sd_lin_rows &xs, int n, float (*acc)[TMAX]) {
    constexpr int U1 = sd_lin_unroll<TMAX>::one, U2 = sd_lin_unroll<TMAX>::two;
    if (w1 && bf0 == bf1) {
        const char *w[2] = {w0, w1};
        if (bf0) sd_lin_dot_fast<TMAX, 2, true, U2, sd_lin_rows, true>(w, cols, xs, n, acc);
        else sd_lin_dot_fast<TMAX, 2, false, U2, sd_lin_rows, true>(w, cols, xs, n, acc);
        return;
    }
#pragma unroll
    for (int r = 0; r < 2; r++) {
        if (r == 1 && !w1) break;
        const char *w[1] = {r ? w1 : w0};
        if (r ? bf1 : bf0) sd_lin_dot_fast<TMAX, 1, true, U1, sd_lin_rows, true>(w, cols, xs, n, acc + r);
        else sd_lin_dot_fast<TMAX, 1, false, U1, sd_lin_rows, true>(w, cols, xs, n, acc + r);
    }
}

// Rows a warp of a verify-sized (3..9 tokens) STORE/ADD launch with enough rows to fill the
// device at that many: four rows share each x load, halving the L1 traffic that bounds a many-token warp (the x
// loads: T per weight chunk); a job too small for two blocks a multiprocessor at four keeps two.
#define LIN_QUAD_ROWS 4
// The fewest tokens a launch splits between two segments a job (launch()).
#define LIN_SPLIT_MIN_T 5

// Rows row .. row+3 (those below s.rows) of a STORE/ADD job at TMAX >= 3 tokens: one four-row dot
// when all four are there on the fast path (bf16, aligned), else two pairs; then their stores.
template <int TMAX>
__device__ __forceinline__ void lin_quad(const lin_seg &s, int row, size_t pitch, const sd_lin_rows &xs, int T, uint64_t pol) {
    const int nq = min(4, s.rows - row);
    const char *w0 = (const char *)s.w + (size_t)row * pitch;
    float acc[4][TMAX];
#pragma unroll
    for (int r = 0; r < 4; r++)
#pragma unroll
        for (int t = 0; t < TMAX; t++) acc[r][t] = 0.0f;
    if (nq == 4 && s.bf16 && s.xfast && sd_lin_fast_w<true>(w0, s.cols)) {
        const char *w[4] = {w0, w0 + pitch, w0 + 2 * pitch, w0 + 3 * pitch};
        sd_lin_dot_fast<TMAX, 4, true, 1, sd_lin_rows>(w, s.cols, xs, T, acc, pol);
    } else {
        sd_lin_dot<TMAX, sd_lin_rows, sd_lin_unroll<TMAX>::one, sd_lin_unroll<TMAX>::two, (TMAX <= 9)>(
            w0, s.bf16, nq > 1 ? w0 + pitch : nullptr, s.bf16, s.cols, xs, T, s.xfast, acc, pol);
        if (nq > 2)
            sd_lin_dot<TMAX, sd_lin_rows, sd_lin_unroll<TMAX>::one, sd_lin_unroll<TMAX>::two, (TMAX <= 9)>(
                w0 + 2 * pitch, s.bf16, nq > 3 ? w0 + 3 * pitch : nullptr, s.bf16, s.cols, xs, T, s.xfast, acc + 2, pol);
    }
    lin_store<TMAX>(s, row, nq > 1, T, acc);
    if (nq > 2) lin_store<TMAX>(s, row + 2, nq > 3, T, acc + 2);
}

// A block of SD_LIN_WARPS warps per SD_LIN_WARPS·rpw rows of one job (grid: every job's blocks, blk0
// onwards). BULK (one or two tokens; every job's rows 16-byte aligned, a block's rows within
// LIN_BULK_MAX bytes): thread 0 bulk-copies the block's weight rows (and, for SwiGLU, its up
// rows) into shared memory before the wait for the predecessor and before the fused norm —
// weights are never written — so a block has all of its weight bytes in flight from its first
// instruction, without registers; the warps dot them from there: the same chunks, order and bits
// as the register path.
template <int TMAX, bool BULK>
static __global__ void __launch_bounds__(SD_LIN_WARPS * 32, TMAX <= 2 ? 4 : 2)
linear_kernel(const __grid_constant__ lin_params p) {
    int k = 0;
    while (k + 1 < p.n && (int)blockIdx.x >= p.s[k + 1].blk0) k++;
    const lin_seg &s = p.s[k];
    extern __shared__ __align__(128) unsigned char lin_sm[];
    float *a_sh = (float *)lin_sm;                    // (T, nn) when the norm is fused
    unsigned char *wt = lin_sm + p.wt_off;            // BULK: the block's rows of w, then of w2
    uint64_t *bar = (uint64_t *)(lin_sm + p.bar_off); // BULK: their completion
    const bool glu = s.mode == SD_LIN_SWIGLU;
    const size_t esz = s.bf16 ? 2 : 4, esz2 = s.bf16_2 ? 2 : 4, pitch = (size_t)s.cols * esz, pitch2 = (size_t)s.cols * esz2;
    const int first = ((int)blockIdx.x - s.blk0) * SD_LIN_WARPS * s.rpw;
    const uint64_t pol = sd_l2_evict_first();
    if (BULK && threadIdx.x == 0) {
        const int nrow = min(SD_LIN_WARPS * s.rpw, s.rows - first);
        const uint32_t b1 = (uint32_t)(nrow * pitch), b2 = glu ? (uint32_t)(nrow * pitch2) : 0u;
        sd_bulk_init(bar);
        sd_bulk_expect(bar, b1 + b2);
        sd_bulk_copy_pol(wt, (const char *)s.w + (size_t)first * pitch, b1, bar, pol);
        if (glu) sd_bulk_copy_pol(wt + (size_t)SD_LIN_WARPS * s.rpw * pitch, (const char *)s.w2 + (size_t)first * pitch2, b2, bar, pol);
    }
    // Many tokens: few chunks a lane in flight, so stream the block's rows into L2 first (also
    // before the wait).
    if (!BULK && TMAX >= 4 && threadIdx.x == 0) {
        const int n = min(SD_LIN_WARPS * s.rpw, s.rows - first);
        sd_prefetch_l2((const char *)s.w + (size_t)first * pitch, (size_t)n * pitch);
        if (glu) sd_prefetch_l2((const char *)s.w2 + (size_t)first * pitch2, (size_t)n * pitch2);
    }
    sd_pdl_wait_trigger(); // pdl.h: the successor starts once this launch's predecessor is complete
    if (p.nn) lin_norm(p, a_sh);
    else if (BULK) __syncthreads(); // the barrier is initialised before any thread waits on it
    const sd_lin_rows xs = {s.x_norm ? a_sh : s.x, s.x_norm ? (size_t)p.nn : (size_t)s.ldx};
    // The segment's tokens: only the verify sizes' instances split them (launch()); the others read
    // the launch's count, a kernel argument, and keep a register.
    const int T = TMAX >= 3 && TMAX <= 9 ? s.T : p.T;
    if (BULK) sd_bulk_wait(bar, 0);
    // The warp's rows wi .. wi+rpw-1 of the block, two at a time (a SwiGLU job: its one gate/up
    // pair) or, many-token STORE/ADD jobs of LIN_QUAD_ROWS rows a warp, four at a time.
    constexpr bool QUAD = !BULK && TMAX >= 3 && TMAX <= 9; // lin_quad's instances
    const int step = QUAD && !glu && s.rpw % 4 == 0 ? 4 : 2;
    for (int rr = 0; rr < s.rpw; rr += step) {
        const int wi = (threadIdx.x >> 5) * s.rpw + rr, row = first + wi; // in the block, in the matrix
        if (row >= s.rows) return;                                          // whole warp
        if (QUAD && step == 4) {
            lin_quad<TMAX>(s, row, pitch, xs, T, pol);
            continue;
        }
        const bool two = glu || (rr + 1 < s.rpw && row + 1 < s.rows);
        float acc[2][TMAX];
#pragma unroll
        for (int t = 0; t < TMAX; t++) acc[0][t] = acc[1][t] = 0.0f;
        if (BULK) {
            const char *w0 = (const char *)wt + (size_t)wi * pitch;
            const char *w1 = !two ? nullptr
                             : glu ? (const char *)wt + (size_t)SD_LIN_WARPS * s.rpw * pitch + (size_t)wi * pitch2
                                   : w0 + pitch;
            lin_dot_shared<TMAX>(w0, s.bf16, w1, glu ? s.bf16_2 : s.bf16, s.cols, xs, T, acc);
        } else {
            const void *w0 = (const char *)s.w + (size_t)row * pitch;
            const void *w1 = !two ? nullptr : glu ? (const char *)s.w2 + (size_t)row * pitch2 : (const char *)w0 + pitch;
            sd_lin_dot<TMAX, sd_lin_rows, sd_lin_unroll<TMAX>::one, sd_lin_unroll<TMAX>::two, (TMAX >= 3 && TMAX <= 9)>(
                w0, s.bf16, w1, glu ? s.bf16_2 : s.bf16, s.cols, xs, T, s.x_norm ? true : s.xfast, acc, pol);
        }
        lin_store<TMAX>(s, row, two, T, acc);
    }
}

// Narrow rows (at most LIN_NARROW_BYTES): enough rows a warp that the job's blocks fit one wave
// of the device's multiprocessors (up to LIN_NARROW_RPW). A grid of several waves of tiny blocks
// costs its block turnover, and its successor launches only once its last wave has started
// (pdl.h): the f_b/g_b launch of kimi-linear KDA (8192 rows of 128) would take 1024 blocks.
#define LIN_NARROW_BYTES 1024
#define LIN_NARROW_RPW 32
static int narrow_rpw(const sd_lin_job *j, int rpw, int sms) {
    const size_t pitch = (size_t)j->w->cols * (j->w->dtype == SD_DT_BF16 ? 2 : 4);
    if (j->mode == SD_LIN_SWIGLU || pitch > LIN_NARROW_BYTES || sms < 1) return rpw;
    int want = sd_ceil_div(j->w->rows, SD_LIN_WARPS * sms);
    want = want < LIN_NARROW_RPW ? want + (want & 1) : LIN_NARROW_RPW;
    return want > rpw ? want : rpw;
}

// The current device's multiprocessors (0 if unknown), read once per device ordinal.
static int device_sms(void) {
    static int sms[64];
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) return 0;
    if (!sms[dev] && cudaDeviceGetAttribute(&sms[dev], cudaDevAttrMultiProcessorCount, dev) != cudaSuccess) sms[dev] = 0;
    return sms[dev];
}

static sd_code check_mat(const sd_mat *w, sd_status *st) {
    if (w->dtype != SD_DT_BF16 && w->dtype != SD_DT_F32)
        return sd_fail(st, SD_ERR_UNSUPPORTED, "cuda linear: weight dtype %d is not F32 or BF16", (int)w->dtype);
    return SD_OK;
}

// The rows per warp a job takes in a BULK launch (its block's rows within LIN_BULK_MAX, one
// row a warp if two do not fit), or 0 when the job cannot be bulk-copied (alignment, x not in
// 16-byte aligned rows, or even one row a warp too wide).
static int bulk_rpw(const sd_lin_job *j, int rpw, bool x_norm) {
    const bool glu = j->mode == SD_LIN_SWIGLU;
    const size_t p1 = (size_t)j->w->cols * (j->w->dtype == SD_DT_BF16 ? 2 : 4);
    const size_t p2 = glu ? (size_t)j->w2->cols * (j->w2->dtype == SD_DT_BF16 ? 2 : 4) : 0;
    if (p1 % 16 || p2 % 16 || !sd_aligned16(j->w->data) || (glu && !sd_aligned16(j->w2->data))) return 0;
    if (!x_norm && !(sd_aligned16(j->x) && j->ldx % 4 == 0)) return 0;
    for (int r = rpw; r >= 1; r--)
        if ((size_t)SD_LIN_WARPS * r * (p1 + p2) <= LIN_BULK_MAX) return r;
    return 0;
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
        p.nflag = norm->flag;
        p.nsite = norm->site;
    }
    // Rows a warp before BULK's limit: 2 for STORE/ADD jobs from 3 tokens up or with the norm
    // fused, more for narrow rows.
    const int sms = device_sms();
    int rpw0[LIN_MAXJOB];
    long plain_rows = 0; // the launch's STORE/ADD rows: four a warp when they fill the device at four
    for (int i = 0; i < n; i++)
        if (jobs[i].mode != SD_LIN_SWIGLU) plain_rows += jobs[i].w->rows;
    const bool quad = T >= 3 && T <= 9 && sms > 0 && plain_rows >= 2L * sms * SD_LIN_WARPS * LIN_QUAD_ROWS;
    for (int i = 0; i < n; i++) {
        const bool q4 = quad && jobs[i].mode != SD_LIN_SWIGLU;
        rpw0[i] = narrow_rpw(&jobs[i], q4 ? LIN_QUAD_ROWS : jobs[i].mode != SD_LIN_SWIGLU && (T >= 3 || norm) ? 2 : 1, sms);
    }
    // BULK for one or two tokens when every job can take it, at its BULK rows a warp.
    bool bulk = T <= 2;
    int rpws[LIN_MAXJOB];
    memcpy(rpws, rpw0, sizeof rpws);
    for (int i = 0; i < n && bulk; i++)
        if (jobs[i].w->rows >= 1 && jobs[i].w->cols >= 1)
            bulk = (rpws[i] = bulk_rpw(&jobs[i], rpw0[i], norm && jobs[i].x == norm->out)) > 0;
    if (!bulk) memcpy(rpws, rpw0, sizeof rpws);
    // A launch of 5..9 tokens (and at most LIN_MAXJOB / 2 jobs: a larger segment table costs every
    // instance registers) that leaves the device short of two blocks a multiprocessor splits its
    // tokens: each job twice, the first ceil(T/2) tokens and the rest, so twice the warps stream the
    // same rows (the second read mostly from L2) with half the sums each — a many-token warp is bound
    // by its x loads' latency, not by its weight bytes. A token's dot is the same either way.
    int blocks = 0;
    for (int i = 0; i < n; i++)
        if (jobs[i].w->rows >= 1 && jobs[i].w->cols >= 1) blocks += sd_ceil_div(jobs[i].w->rows, SD_LIN_WARPS * rpws[i]);
    const bool split = T >= LIN_SPLIT_MIN_T && T <= 9 && !quad && !norm && sms > 0 && blocks < 2 * sms && 2 * n <= LIN_MAXJOB;
    const int parts = split ? 2 : 1, T0 = split ? (T + 1) / 2 : T;
    blocks = 0;
    size_t tile = 0;
    for (int i = 0; i < n; i++) {
        const sd_lin_job *j = &jobs[i];
        if (j->w->rows < 1 || j->w->cols < 1) continue;
        const bool x_norm = norm && j->x == norm->out, glu = j->mode == SD_LIN_SWIGLU;
        const int rpw = rpws[i];
        for (int part = 0; part < parts; part++) {
            const int ts = t0 + part * T0; // this segment's first token
            p.s[p.n] = (lin_seg){.w = j->w->data, .w2 = glu ? j->w2->data : nullptr,
                                 .x = j->x + (size_t)ts * j->ldx, .y = j->y + (size_t)ts * j->ldy, .rows = j->w->rows,
                                 .cols = j->w->cols, .ldx = j->ldx, .ldy = j->ldy, .mode = (int)j->mode,
                                 .bf16 = j->w->dtype == SD_DT_BF16, .bf16_2 = glu && j->w2->dtype == SD_DT_BF16,
                                 .xfast = sd_aligned16(j->x) && j->ldx % 4 == 0, .blk0 = blocks, .rpw = rpw,
                                 .x_norm = x_norm, .flag = j->flag, .site = j->site, .T = part ? T - T0 : T0};
            blocks += sd_ceil_div(j->w->rows, SD_LIN_WARPS * rpw);
            p.n++;
        }
        const size_t tb = (size_t)SD_LIN_WARPS * rpw * j->w->cols *
                          ((j->w->dtype == SD_DT_BF16 ? 2 : 4) + (glu ? (j->w2->dtype == SD_DT_BF16 ? 2 : 4) : 0));
        if (tb > tile) tile = tb;
    }
    if (!p.n) return SD_OK;
    p.T = T;
    size_t smem = norm ? sizeof(float) * (size_t)T * norm->n : 0;
    if (bulk) {
        p.wt_off = (int)((smem + 127) & ~(size_t)127);
        p.bar_off = (int)(p.wt_off + tile);
        smem = (size_t)p.bar_off + sizeof(uint64_t);
    }
    void (*kernel)(const lin_params) = T0 <= 1 ? (bulk ? linear_kernel<1, true> : linear_kernel<1, false>)
                                      : T0 <= 2 ? (bulk ? linear_kernel<2, true> : linear_kernel<2, false>)
                                      // the verify sizes (k + 1 <= 9) each at its own count: no idle sums
                                      : T0 == 3 ? linear_kernel<3, false> : T0 == 4 ? linear_kernel<4, false>
                                      : T0 == 5 ? linear_kernel<5, false> : T0 == 6 ? linear_kernel<6, false>
                                      : T0 == 7 ? linear_kernel<7, false> : T0 == 8 ? linear_kernel<8, false>
                                      : T0 == 9 ? linear_kernel<9, false>
                                      : T0 <= 16 ? linear_kernel<16, false> : linear_kernel<32, false>;
    if (bulk) SD_CUDA_CHECK(st, sd_allow_smem((const void *)kernel, smem));
    SD_CUDA_CHECK(st, sd_launch(kernel, blocks, SD_LIN_WARPS * 32, smem, stream, p));
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
        if (j->ldx < j->w->cols || j->ldy < j->w->rows)
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
        SD_TRY(sd_cuda_rmsnorm_flagged(norm->x, norm->w, T, norm->n, norm->eps, norm->out, norm->flag, norm->site, stream, st));
        return sd_cuda_linear_multi(jobs, n_jobs, T, stream, st);
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
