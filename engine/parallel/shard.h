// shard.h — one rank's shard of a model: itself an sd_model, whose config carries the rank's local
// widths (sd_config_shard) and whose weights are copies of its slices of the whole model
// (docs/PARALLEL.md gives the split of every tensor and why). A shard is a host model like a
// loaded one — its tensor table is what sd_weights_plan makes of its config — so the CPU runs it
// as it is and a device backend uploads it as it would any host model (one device model per rank).
#pragma once
#include "model.h" // sd_model
#include "plan.h"  // sd_tp_plan

// The config of rank `rank` under plan p of the whole model's config `full`: the rank's KDA and
// MLA heads and dense width in the ordinary fields, its experts, shared width and vocabulary rows
// in cfg.shard, and an untied head (the shard holds its own copy of its head rows). Not a user
// config: it skips sd_config_parse's rules (0 heads or 0 columns are legal here).
void sd_tp_shard_config(const sd_config *full, const sd_tp_plan *p, int rank, sd_config *out);

// How each tensor of rank `rank`'s shard comes from the whole model's (the split above): a
// matrix is its source's rows [first, first + dst->rows), or with by_cols its columns
// [first, first + dst->cols) of every row; a vector is its source's floats [first, first + n).
// The visitor sees every tensor of the shard once, paired with the whole model's tensor it comes
// from (the embedding for a tied head). dst: the shard's table (sd_weights_plan of
// sd_tp_shard_config); src: the whole model's (its data need not exist: a device generator keys
// each element by the source tensor and index, cuda_synth.h).
typedef struct {
    void (*mat)(void *ctx, sd_mat *dst, const sd_mat *src, bool by_cols, int first);
    void (*vec)(void *ctx, float **dst, float *const *src, size_t first, size_t n);
    void *ctx;
} sd_tp_slicer;
void sd_tp_shard_visit(const sd_tp_plan *p, int rank, const sd_config *full, sd_weights *dst, const sd_weights *src,
                       const sd_tp_slicer *v);

// Rank `rank`'s shard of the host model `full` (loaded or synthesised; the CPU backend), in its
// own arena. Matrices keep the whole model's dtypes.
sd_code sd_tp_shard_model(const sd_model *full, const sd_tp_plan *p, int rank, sd_model *out, sd_status *st);

// The canary of the cross-rank route check: this shard's copy of layer `layer`'s
// post_attention_layernorm weight moves one ulp up (every element), so its router input — the
// FFN's normed input — differs from the other ranks' by about an ulp there and its routing may
// differ. `layer` must be an MoE layer.
sd_code sd_tp_shard_canary(sd_model *shard, int layer, sd_status *st);
