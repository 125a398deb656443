// prefill_internal.h — what prefill.c (the driver: scratch, pieces, head) and prefill_layers.c (the
// sublayers) share: the scratch of one device model's prefill and the sublayer entries.
#pragma once
#include <stdint.h>
#include "cuda_prefill.h"
#include "gemm.h"        // sd_gemm
#include "moe_grouped.h" // sd_moe_grouped, sd_cuda_expert

// Device scratch for a piece of up to `chunk` tokens (C), one arena: the residual stream and the
// head's rows live throughout; the four sublayer kinds run one at a time, so their buffers share
// one region (each kind's layout starts at the region's start; the region is the largest). Buffers
// that feed a GEMM as its activations or take its output in the experts' dtype (act, xg, h1, hb, yexp)
// hold 4 bytes an element, enough for f32 or bf16.
typedef struct {
    float *qkv, *qkvc;       // (C, 3P) raw projections [q | k | v], then convolved and normalised
    float *fa, *ga;          // (C, d) the gates' low-rank first halves
    float *gate, *gb, *y;    // (C, P) decay gate (raw, then log decay), output gate, recurrence output
    float *beta;             // (C, H rounded up to 4)
    float *work;             // sd_cuda_kda_chunk_work_floats(C, H, d)
    void *act;               // (C, P) the o_proj input
} sd_prefill_kda;

typedef struct {
    float *qm;               // (C, sd_prefill_mla_ld): [q (Hm·(dn+dr)) | kv_a (R + dr)] per row
    float *kvb;              // (C, Hm·(dn+dv)) a block of cache rows' keys and values, c · kv_bᵀ
    float *mo;               // (C, Hm·dv) the heads' attention outputs
    uint16_t *qpack;         // (C·Hm, head width) bf16 queries
} sd_prefill_mla;

typedef struct {
    float *router;           // (C, E)
    int *sel;                // (C, K)
    float *w;                // (C, K)
    int *counts, *offsets;   // (E), (E)
    int *row_tok, *inv;      // (C·K)
    // The routed experts' rows, in the experts' dtype: bf16 for BF16 experts (the grouped GEMMs'
    // operands and outputs), f32 for F32 experts.
    void *xg;                // (C·K, D) gathered rows
    void *h1;                // (C·K, 2·Ie) [gate | up]
    void *hb;                // (C·K, Ie) SwiGLU
    void *yexp;              // (C·K, D) expert outputs
    float *h1s;              // (C, 2·S·Ie) the shared expert
    void *hbs;               // (C, S·Ie)
    float *shared;           // (C, D)
} sd_prefill_moe;

typedef struct {
    float *h1;               // (C, 2I)
    void *hb;                // (C, I)
} sd_prefill_dense;

typedef struct sd_prefill_scratch {
    int chunk;               // C
    sd_gemm *gemm;
    sd_moe_grouped *grouped;        // the routed experts' grouped GEMMs (NULL: the model has none)
    sd_cuda_expert *experts_host;   // a host copy of the device's expert table (cuda_backend.h), their pointers
    void *arena;
    size_t arena_bytes;
    float *x, *a;            // (C, D) residual stream, normed input
    uint16_t *a16;           // (C, D) the normed input in bf16
    int *tokens;             // (C)
    float *head;             // (SD_PREFILL_HEAD_ROWS, V) logits of a block of rows
    sd_prefill_kda kda;
    sd_prefill_mla mla;
    sd_prefill_moe moe;
    sd_prefill_dense dense;
    uint16_t *kpack, *vpack; // (kv_rows·Hm, head width), (kv_rows·Hm, value width) bf16 keys and values of an MLA
    int kv_rows;             // layer's cache rows, grown to a state's capacity
    int *counts_host;        // (2, E) pinned: a MoE layer's expert counts read back, then their offsets
} sd_prefill_scratch;

#define SD_PREFILL_HEAD_ROWS 64

// The row stride of the MLA [q | kv_a] rows: a multiple of 8 elements, so their bf16 copy keeps
// 16-byte rows for the GEMMs.
static inline int sd_prefill_mla_ld(const sd_config *c) {
    const int n = c->num_attention_heads * (c->qk_nope_head_dim + c->qk_rope_head_dim) + c->kv_lora_rank + c->qk_rope_head_dim;
    return (n + 7) / 8 * 8;
}

// The scratch of device model m (made at the first call), on m's device: the op suite's way into
// the sublayers below.
sd_code sd_prefill_scratch_of(const sd_model *m, sd_prefill_scratch **p, sd_status *st);

// One sublayer of layer i over the piece's C tokens at positions s->len .. s->len+C-1, reading
// p->a / p->a16 (the normed input) and adding its output into p->x.
sd_code sd_prefill_kda_mixer(sd_cuda_backend *b, sd_prefill_scratch *p, const sd_model *m, sd_state *s, int i, int C,
                             sd_status *st);
sd_code sd_prefill_mla_mixer(sd_cuda_backend *b, sd_prefill_scratch *p, const sd_model *m, sd_state *s, int i, int C,
                             sd_status *st);
sd_code sd_prefill_moe_ffn(sd_cuda_backend *b, sd_prefill_scratch *p, const sd_model *m, int i, int C, sd_status *st);
sd_code sd_prefill_dense_ffn(sd_cuda_backend *b, sd_prefill_scratch *p, const sd_model *m, int i, int C, sd_status *st);

// y (M, w->rows, ld ldy) = the normed input · wᵀ (a16 for a BF16 weight, a for F32), stored or added.
sd_code sd_prefill_lin_a(sd_prefill_scratch *p, sd_cuda_backend *b, const sd_mat *w, int M, float *y, int ldy, float beta,
                         sd_status *st);
// The matrices a and b as one [a.rows + b.rows, cols] matrix when b directly follows a in memory
// (the arena's order: q, k, v; gate, up; q_proj, kv_a): *out set, true.
bool sd_prefill_stacked(const sd_mat *a, const sd_mat *b, sd_mat *out);

// Releases what p holds on the device and keeps its piece size (sd_cuda_prefill_release frees p).
void sd_prefill_free(sd_prefill_scratch *p);
