// cuda_model.h — how a device model comes to be (upload.c): the weight plan of its config, ONE
// device arena with the host layout (sd_weights_alloc's offsets: tensors in plan order, each
// rounded up to 64 bytes), every tensor pointer set into it, then a source writes the bytes —
// a host model's arena (sd_cuda_model_upload) or a generator on the device (cuda_synth.h) — and
// the backend is finished (routed-expert table, stream, state allocator).
#pragma once
#include "cuda_backend.h" // sd_cuda_backend, sd_model

typedef struct {
    // Set every spec's in-memory dtype of the planned w (and check the plan against the source).
    sd_code (*set_dtypes)(void *ctx, sd_weights *w, sd_status *st);
    // Write every tensor of dev (device pointers already set) on stream; may return before the
    // device is done (sd_cuda_model_create drains the stream).
    sd_code (*fill)(void *ctx, const sd_model *dev, cudaStream_t stream, sd_status *st);
    void *ctx;
} sd_cuda_weight_source;

// A new device model for cfg on `device` (dev: cfg copied, sha256 strings empty); on failure dev
// is left zeroed and everything is released.
sd_code sd_cuda_model_create(const sd_config *cfg, int device, const sd_cuda_weight_source *src, sd_model *dev,
                             sd_status *st);
