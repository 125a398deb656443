// gemm.cu — the cuBLASLt wrapper of gemm.h and its f32 → bf16 staging kernel.
//
// Row-major Y (M, N) is column-major Yᵀ (N, M), so every call is the column-major product
// Yᵀ = op(W)ᵀ · Xᵀ: cuBLASLt's A is the weight (transposed for SD_GEMM_WT, as stored for
// SD_GEMM_WN), B the activations as stored (K × M column-major, ld ldx), C = D = Y (N × M, ld ldy):
// m = N, n = M, k = K. A weight stored [N, K] against activations stored [M, K] is the "TN" layout
// cuBLASLt serves best on Hopper.
//
// Plans live in an open-addressing table keyed by the whole shape (every field that changes the
// layouts or the heuristic's answer, pointer alignments included); a plan is allocated once, on
// its shape's first call, and never moves (the table holds pointers), so the layouts cuBLASLt
// reads stay where they were initialised.
#include <cuda_bf16.h> // __nv_bfloat16, __float2bfloat16_rn
#include <stdlib.h>
#include <string.h>
#include "common.cuh" // SD_NVTX, sd_ceil_div
#include "gemm.h"

#define GEMM_WORKSPACE (32u << 20) // cuBLASLt's workspace: what its Hopper kernels ask for at most

typedef struct {
    int w_dtype, x_dtype, op, acc;
    int M, N, K, ldw, ldx, ldy, batch;
    int align_w, align_x, align_y;
    long long stride_w, stride_x, stride_y;
} plan_key;

typedef struct {
    plan_key key;
    cublasLtMatrixLayoutOpaque_t la, lb, lc;
    cublasLtMatmulAlgo_t algo;
} plan;

struct sd_gemm {
    cublasLtHandle_t lt;
    void *workspace;
    uint16_t *stage;
    size_t stage_elems;
    cublasLtMatmulDescOpaque_t desc[4]; // [w bf16][op]
    bool desc_ready[4];
    plan **table; // open addressing, capacity a power of two, at most half full
    size_t cap, n;
};

static uint64_t key_hash(const plan_key *k) {
    const unsigned char *p = (const unsigned char *)k;
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < sizeof *k; i++) h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

static int align_of(const void *p, long long stride_bytes, int batch) {
    uintptr_t a = (uintptr_t)p | 256u;
    if (batch > 1) a |= (uintptr_t)stride_bytes | 256u;
    return (int)(a & (~a + 1)); // the lowest set bit: the largest power of two dividing both, at most 256
}

extern "C" sd_code sd_gemm_create(sd_gemm **out, size_t stage_elems, sd_status *st) {
    *out = NULL;
    sd_gemm *g = (sd_gemm *)calloc(1, sizeof *g);
    if (!g) return sd_fail(st, SD_ERR_SYS, "gemm: out of memory");
    g->cap = 256;
    g->table = (plan **)calloc(g->cap, sizeof *g->table);
    sd_code rc = g->table ? SD_OK : sd_fail(st, SD_ERR_SYS, "gemm: out of memory for the plan table");
    cublasStatus_t cs = rc ? CUBLAS_STATUS_SUCCESS : cublasLtCreate(&g->lt);
    if (!rc && cs != CUBLAS_STATUS_SUCCESS)
        rc = sd_fail(st, SD_ERR_SYS, "gemm: cublasLtCreate: %s", cublasLtGetStatusString(cs));
    if (!rc && cudaMalloc(&g->workspace, GEMM_WORKSPACE) != cudaSuccess)
        rc = sd_fail(st, SD_ERR_SYS, "gemm: cannot allocate the %u-byte cuBLASLt workspace", GEMM_WORKSPACE);
    if (!rc && stage_elems && cudaMalloc((void **)&g->stage, stage_elems * sizeof(uint16_t)) != cudaSuccess)
        rc = sd_fail(st, SD_ERR_SYS, "gemm: cannot allocate the bf16 staging buffer (%zu elements)", stage_elems);
    g->stage_elems = stage_elems;
    if (rc) {
        (void)cudaGetLastError();
        sd_gemm_free(g);
        return rc;
    }
    *out = g;
    return SD_OK;
}

extern "C" void sd_gemm_free(sd_gemm *g) {
    if (!g) return;
    for (size_t i = 0; i < g->cap; i++) free(g->table ? g->table[i] : NULL);
    free(g->table);
    cudaFree(g->workspace);
    cudaFree(g->stage);
    if (g->lt) cublasLtDestroy(g->lt);
    free(g);
}

extern "C" size_t sd_gemm_plans(const sd_gemm *g) { return g ? g->n : 0; }

static plan **slot_of(plan **table, size_t cap, const plan_key *k) {
    size_t i = (size_t)key_hash(k) & (cap - 1);
    while (table[i] && memcmp(&table[i]->key, k, sizeof *k) != 0) i = (i + 1) & (cap - 1);
    return &table[i];
}

static sd_code table_grow(sd_gemm *g, sd_status *st) {
    const size_t cap = g->cap * 2;
    plan **t = (plan **)calloc(cap, sizeof *t);
    if (!t) return sd_fail(st, SD_ERR_SYS, "gemm: out of memory growing the plan table to %zu", cap);
    for (size_t i = 0; i < g->cap; i++)
        if (g->table[i]) *slot_of(t, cap, &g->table[i]->key) = g->table[i];
    free(g->table);
    g->table = t;
    g->cap = cap;
    return SD_OK;
}

static cudaDataType_t cuda_type(int dt) { return dt == SD_DT_BF16 ? CUDA_R_16BF : CUDA_R_32F; }

static sd_code get_desc(sd_gemm *g, int w_bf16, int op, cublasLtMatmulDesc_t *out, sd_status *st) {
    const int i = w_bf16 * 2 + op;
    cublasLtMatmulDesc_t d = &g->desc[i];
    if (!g->desc_ready[i]) {
        SD_CUBLAS_CHECK(st, cublasLtMatmulDescInit(d, CUBLAS_COMPUTE_32F, CUDA_R_32F));
        const cublasOperation_t ta = op == SD_GEMM_WT ? CUBLAS_OP_T : CUBLAS_OP_N, tb = CUBLAS_OP_N;
        SD_CUBLAS_CHECK(st, cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
        SD_CUBLAS_CHECK(st, cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
        g->desc_ready[i] = true;
    }
    *out = d;
    return SD_OK;
}

static sd_code layout(cublasLtMatrixLayout_t l, int dtype, int rows, int cols, int ld, int batch, long long stride,
                      sd_status *st) {
    SD_CUBLAS_CHECK(st, cublasLtMatrixLayoutInit(l, cuda_type(dtype), (uint64_t)rows, (uint64_t)cols, (int64_t)ld));
    if (batch > 1) {
        const int32_t n = batch;
        const int64_t s = stride;
        SD_CUBLAS_CHECK(st, cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &n, sizeof n));
        SD_CUBLAS_CHECK(st, cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &s, sizeof s));
    }
    return SD_OK;
}

// The layouts and the heuristic's algorithm of one shape.
static sd_code make_plan(sd_gemm *g, const plan_key *k, cublasLtMatmulDesc_t desc, plan *p, sd_status *st) {
    p->key = *k;
    const bool wt = k->op == SD_GEMM_WT;
    sd_code rc = layout(&p->la, k->w_dtype, wt ? k->K : k->N, wt ? k->N : k->K, k->ldw, k->batch, k->stride_w, st);
    if (!rc) rc = layout(&p->lb, k->x_dtype, k->K, k->M, k->ldx, k->batch, k->stride_x, st);
    if (!rc) rc = layout(&p->lc, SD_DT_F32, k->N, k->M, k->ldy, k->batch, k->stride_y, st);
    if (rc) return rc;
    cublasLtMatmulPreferenceOpaque_t pref;
    SD_CUBLAS_CHECK(st, cublasLtMatmulPreferenceInit(&pref));
    const uint64_t ws = GEMM_WORKSPACE;
    const uint32_t aa = (uint32_t)k->align_w, ab = (uint32_t)k->align_x, ac = (uint32_t)k->align_y;
    SD_CUBLAS_CHECK(st, cublasLtMatmulPreferenceSetAttribute(&pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
    SD_CUBLAS_CHECK(st, cublasLtMatmulPreferenceSetAttribute(&pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &aa, sizeof aa));
    SD_CUBLAS_CHECK(st, cublasLtMatmulPreferenceSetAttribute(&pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &ab, sizeof ab));
    SD_CUBLAS_CHECK(st, cublasLtMatmulPreferenceSetAttribute(&pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &ac, sizeof ac));
    SD_CUBLAS_CHECK(st, cublasLtMatmulPreferenceSetAttribute(&pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &ac, sizeof ac));
    cublasLtMatmulHeuristicResult_t res;
    int n = 0;
    SD_CUBLAS_CHECK(st, cublasLtMatmulAlgoGetHeuristic(g->lt, desc, &p->la, &p->lb, &p->lc, &p->lc, &pref, 1, &res, &n));
    if (n < 1)
        return sd_fail(st, SD_ERR_UNSUPPORTED,
                       "gemm: cuBLASLt has no algorithm for M=%d N=%d K=%d (%s weight, %s, ld %d/%d/%d, batch %d, "
                       "alignments %d/%d/%d)",
                       k->M, k->N, k->K, k->w_dtype == SD_DT_BF16 ? "bf16" : "f32", wt ? "X·Wt" : "X·W", k->ldw, k->ldx,
                       k->ldy, k->batch, k->align_w, k->align_x, k->align_y);
    p->algo = res.algo;
    return SD_OK;
}

static sd_code find_plan(sd_gemm *g, const plan_key *k, cublasLtMatmulDesc_t desc, plan **out, sd_status *st) {
    plan **slot = slot_of(g->table, g->cap, k);
    if (*slot) {
        *out = *slot;
        return SD_OK;
    }
    if (2 * (g->n + 1) > g->cap) {
        sd_code rc = table_grow(g, st);
        if (rc) return rc;
        slot = slot_of(g->table, g->cap, k);
    }
    plan *p = (plan *)calloc(1, sizeof *p);
    if (!p) return sd_fail(st, SD_ERR_SYS, "gemm: out of memory for a plan");
    sd_code rc = make_plan(g, k, desc, p, st);
    if (rc) {
        free(p);
        return rc;
    }
    *slot = p;
    g->n++;
    *out = p;
    return SD_OK;
}

// ---------------------------------------------------------------------------- staging
static __global__ void to_bf16_kernel(const float *__restrict__ x, size_t n, __nv_bfloat16 *__restrict__ y) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        y[i] = __float2bfloat16_rn(x[i]);
}

// The (batch, M, K) activations a call reads (rows of stride ldx, problems stride_x apart) as a
// compact bf16 copy: problem b's row m at y + (b·M + m)·ldk, ldk = K rounded up to 8, so every
// row and problem of the staged operand starts 16-byte aligned whatever the source's strides.
static __global__ void stage_kernel(const float *__restrict__ x, int ldx, long long stride_x, int M, int K, int batch,
                                    int ldk, __nv_bfloat16 *__restrict__ y) {
    const size_t n = (size_t)batch * M * K;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const size_t bm = i / K, k = i % K, b = bm / M, m = bm % M;
        y[bm * ldk + k] = __float2bfloat16_rn(x[b * stride_x + m * ldx + k]);
    }
}

extern "C" sd_code sd_cuda_to_bf16(const float *x, size_t n, uint16_t *y, cudaStream_t stream, sd_status *st) {
    if (!n) return SD_OK;
    const int blocks = (int)(n < (size_t)256 * 2048 ? (n + 255) / 256 : 2048);
    to_bf16_kernel<<<blocks, 256, 0, stream>>>(x, n, (__nv_bfloat16 *)y);
    SD_LAUNCH_CHECK(st);
    return SD_OK;
}

// ---------------------------------------------------------------------------- calls
extern "C" sd_code sd_gemm_run(sd_gemm *g, const sd_gemm_args *a, cudaStream_t stream, sd_status *st) {
    SD_NVTX("sd_gemm_run");
    const int batch = a->batch > 1 ? a->batch : 1;
    if (a->M == 0) return SD_OK;
    const bool wt = a->op == SD_GEMM_WT;
    if (a->M < 0 || a->N < 1 || a->K < 1 || a->ldx < a->K || a->ldy < a->N || a->ldw < (wt ? a->K : a->N))
        return sd_fail(st, SD_ERR_USAGE, "gemm: bad shape M=%d N=%d K=%d with ld %d/%d/%d", a->M, a->N, a->K, a->ldw, a->ldx,
                       a->ldy);
    if ((a->w_dtype != SD_DT_BF16 && a->w_dtype != SD_DT_F32) || (a->x_dtype != SD_DT_BF16 && a->x_dtype != SD_DT_F32) ||
        (a->w_dtype == SD_DT_F32 && a->x_dtype == SD_DT_BF16))
        return sd_fail(st, SD_ERR_UNSUPPORTED, "gemm: weight %s with activations %s (bf16 activations need a bf16 weight)",
                       sd_dtype_name(a->w_dtype), sd_dtype_name(a->x_dtype));
    const void *x = a->x;
    int x_dtype = a->x_dtype, ldx = a->ldx;
    long long stride_x = a->stride_x;
    if (a->w_dtype == SD_DT_BF16 && a->x_dtype == SD_DT_F32) { // a compact, aligned bf16 copy (stage_kernel)
        const int ldk = (a->K + 7) / 8 * 8;
        const size_t need = (size_t)batch * a->M * ldk, n = (size_t)batch * a->M * a->K;
        if (need > g->stage_elems)
            return sd_fail(st, SD_ERR_USAGE, "gemm: %zu activations to stage, the buffer holds %zu (M=%d K=%d batch %d)", need,
                           g->stage_elems, a->M, a->K, batch);
        const int blocks = (int)(n < (size_t)256 * 4096 ? (n + 255) / 256 : 4096);
        stage_kernel<<<blocks, 256, 0, stream>>>((const float *)a->x, a->ldx, a->stride_x, a->M, a->K, batch, ldk,
                                                 (__nv_bfloat16 *)g->stage);
        SD_LAUNCH_CHECK(st);
        x = g->stage;
        x_dtype = SD_DT_BF16;
        ldx = ldk;
        stride_x = (long long)a->M * ldk;
    }
    plan_key k;
    memset(&k, 0, sizeof k); // padding included: the key is hashed and compared as bytes
    k.w_dtype = a->w_dtype;
    k.x_dtype = x_dtype;
    k.op = a->op;
    k.acc = a->beta != 0.0f;
    k.M = a->M; k.N = a->N; k.K = a->K;
    k.ldw = a->ldw; k.ldx = ldx; k.ldy = a->ldy;
    k.batch = batch;
    if (batch > 1) {
        k.stride_w = a->stride_w;
        k.stride_x = stride_x;
        k.stride_y = a->stride_y;
    }
    const long long wsz = (long long)sd_dtype_size((sd_dtype)a->w_dtype), xsz = (long long)sd_dtype_size((sd_dtype)x_dtype);
    k.align_w = align_of(a->w, k.stride_w * wsz, batch);
    k.align_x = align_of(x, k.stride_x * xsz, batch);
    k.align_y = align_of(a->y, k.stride_y * 4, batch);
    cublasLtMatmulDesc_t desc;
    plan *p;
    sd_code rc = get_desc(g, a->w_dtype == SD_DT_BF16, a->op, &desc, st);
    if (!rc) rc = find_plan(g, &k, desc, &p, st);
    if (rc) return rc;
    const float alpha = 1.0f, beta = a->beta;
    SD_CUBLAS_CHECK(st, cublasLtMatmul(g->lt, desc, &alpha, a->w, &p->la, x, &p->lb, &beta, a->y, &p->lc, a->y, &p->lc,
                                       &p->algo, g->workspace, GEMM_WORKSPACE, stream));
    return SD_OK;
}

// The Linear of ops.h (w as stored, [N, K]).
static sd_gemm_args linear_args(const sd_mat *w, const void *x, sd_dtype x_dtype, int ldx, int M, float *y, int ldy,
                                float beta) {
    sd_gemm_args a;
    memset(&a, 0, sizeof a);
    a.w = w->data;
    a.w_dtype = w->dtype;
    a.ldw = w->cols;
    a.op = SD_GEMM_WT;
    a.x = x;
    a.x_dtype = x_dtype;
    a.ldx = ldx;
    a.y = y;
    a.ldy = ldy;
    a.M = M;
    a.N = w->rows;
    a.K = w->cols;
    a.beta = beta;
    return a;
}

extern "C" sd_code sd_gemm_linear(sd_gemm *g, const sd_mat *w, const float *x, int ldx, int M, float *y, int ldy, float beta,
                                  cudaStream_t stream, sd_status *st) {
    const sd_gemm_args a = linear_args(w, x, SD_DT_F32, ldx, M, y, ldy, beta);
    return sd_gemm_run(g, &a, stream, st);
}

extern "C" sd_code sd_gemm_linear_bf16(sd_gemm *g, const sd_mat *w, const uint16_t *x, int ldx, int M, float *y, int ldy,
                                       float beta, cudaStream_t stream, sd_status *st) {
    const sd_gemm_args a = linear_args(w, x, SD_DT_BF16, ldx, M, y, ldy, beta);
    return sd_gemm_run(g, &a, stream, st);
}
