// cuda_synth.h — engine/synth.h's synthetic model made directly in device memory: no host copy
// of the weights and no file, so a model as large as the device (kimi-linear-48b-a3b in bf16,
// ~98 GB) needs only the host memory of its tensor table.
#pragma once
#include "cuda_backend.h" // sd_model, sd_status
#include "synth.h"        // sd_synth_opts
#include "parallel/plan.h" // sd_tp_plan

// The same model as sd_synth_model(cfg, o) — byte for byte in every tensor, same arena layout —
// as a device model on `device` (sd_model_free releases it).
sd_code sd_cuda_model_synth(const sd_config *cfg, const sd_synth_opts *o, int device, sd_model *dev, sd_status *st);

// Rank `rank`'s shard under plan p of the same model (parallel/shard.h), synthesised on `device`
// alone — byte for byte sd_tp_shard_model of sd_synth_model(cfg, o): each shard element is
// generated from its source tensor's name and element index (synth.h's keying), so no rank ever
// makes the whole model.
sd_code sd_cuda_model_synth_shard(const sd_config *cfg, const sd_synth_opts *o, const sd_tp_plan *p, int rank, int device,
                                  sd_model *dev, sd_status *st);
