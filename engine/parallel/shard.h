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

// Rank `rank`'s shard of the host model `full` (loaded or synthesised; the CPU backend), in its
// own arena. Matrices keep the whole model's dtypes.
sd_code sd_tp_shard_model(const sd_model *full, const sd_tp_plan *p, int rank, sd_model *out, sd_status *st);

// The canary of the cross-rank route check: this shard's copy of layer `layer`'s
// post_attention_layernorm weight moves one ulp up (every element), so its router input — the
// FFN's normed input — differs from the other ranks' by about an ulp there and its routing may
// differ. `layer` must be an MoE layer.
sd_code sd_tp_shard_canary(sd_model *shard, int layer, sd_status *st);
