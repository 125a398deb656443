// upload.c — a device model: the weight arena as ONE device allocation with the host layout,
// every tensor pointer set into it, the bytes written by a source (a host model's arena copied
// here; the device generator in synth_device.c), the routed experts' pointers gathered into a
// device table, and the backend object that the device model's forward, accept, sync and free go
// through.
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "check.h"         // SD_CUDA_CHECK
#include "finite.h"        // sd_cuda_finite_reset
#include "sizes.h"         // sd_mem_fit
#include "cuda_internal.h" // sd_cuda_init_allocator, sd_cuda_sync, sd_cuda_forward, sd_cuda_accept_op
#include "cuda_model.h"    // sd_cuda_weight_source, sd_cuda_model_create
#include "cuda_prefill.h"  // sd_cuda_prefill, sd_cuda_prefill_release

static void cuda_free_model(sd_model *m);

sd_cuda_backend *sd_cuda_backend_of(const sd_model *m) {
    if (!m->backend || m->backend->free_model != cuda_free_model) return NULL;
    return (sd_cuda_backend *)m->backend;
}

static void backend_release(sd_cuda_backend *b) {
    if (!b) return;
    cudaSetDevice(b->device);
    // Only the model's own stream: a borrowed one may be gone with its owner (cudaFree below
    // waits for the device's work either way).
    if (b->own_stream) cudaStreamSynchronize(b->own_stream);
    cudaFree(b->arena);
    cudaFree(b->experts);
    cudaFree(b->accept_ints);
    cudaFree(b->nonfinite);
    cudaFreeHost(b->nonfinite_host);
    cudaFreeHost(b->tokens_host);
    cudaFreeHost(b->argmax_host);
    cudaFreeHost(b->sampled_host);
    cudaFreeHost(b->accept_ints_host);
    cudaFreeHost(b->sel_host);
    cudaFreeHost(b->w_host);
    cudaFreeHost(b->router_host);
    cudaFreeHost(b->groups_host);
    sd_cuda_prefill_release(b);
    if (b->own_stream) cudaStreamDestroy(b->own_stream);
    free(b);
}

static void cuda_free_model(sd_model *m) {
    backend_release((sd_cuda_backend *)m->backend);
    m->backend = NULL;
    m->w.arena = NULL; // device memory, released above; the tables are host memory
    sd_weights_free(&m->w);
}

static size_t spec_bytes(const sd_weight_spec *s) {
    return (size_t)s->shape[0] * (size_t)(s->ndim == 2 ? s->shape[1] : 1) * sd_dtype_size(s->dtype);
}
static size_t round64(size_t n) { return (n + 63) & ~(size_t)63; }

// The device arena of w (dtypes set) with sd_weights_alloc's layout; every destination points
// into it (device pointers).
// The bytes are counted with overflow checks and compared with the device's free memory before
// the allocation: "the weights need X GiB, the free memory of device 0 (NVIDIA H200) has Y GiB".
static sd_code arena_alloc(sd_weights *w, sd_cuda_backend *b, sd_status *st) {
    uint64_t need;
    SD_TRY(sd_weights_arena_bytes(w, &need, st));
    size_t free_b = 0, total_b = 0;
    SD_CUDA_CHECK(st, cudaMemGetInfo(&free_b, &total_b));
    char where[300];
    snprintf(where, sizeof where, "the free memory of device %d (%s)", b->device, b->device_name);
    SD_TRY(sd_mem_fit(need, free_b, "the weights", where, st));
    const size_t total = (size_t)need;
    SD_CUDA_CHECK(st, cudaMalloc(&b->arena, total ? total : 64));
    b->arena_bytes = total;
    char *p = b->arena;
    for (int i = 0; i < w->n_specs; i++) {
        sd_weight_spec *s = &w->specs[i];
        if (s->keep_dtype) {
            s->mat->data = p;
            s->mat->dtype = s->dtype;
        } else {
            *s->vec = (float *)p;
        }
        p += round64(spec_bytes(s));
    }
    if (!w->lm_head.data) w->lm_head = w->embed; // tied head (weights.c does the same)
    w->arena = b->arena;
    w->arena_bytes = total;
    return SD_OK;
}

static sd_code copy_table(sd_cuda_backend *b, const sd_cuda_expert *tab, size_t n, sd_status *st) {
    SD_CUDA_CHECK(st, cudaMalloc((void **)&b->experts, n * sizeof *tab));
    SD_CUDA_CHECK(st, cudaMemcpy(b->experts, tab, n * sizeof *tab, cudaMemcpyHostToDevice));
    return SD_OK;
}

// The routed experts of every MoE layer as one device table (layer-major, E per layer).
static sd_code upload_expert_table(const sd_model *dev, sd_cuda_backend *b, sd_status *st) {
    const sd_config *c = &dev->cfg;
    const int E = c->num_experts, F = c->first_k_dense_replace, n_moe = c->num_hidden_layers - F;
    if (n_moe <= 0 || E <= 0) return SD_OK;
    const size_t n = (size_t)n_moe * E;
    sd_cuda_expert *tab = calloc(n, sizeof *tab);
    if (!tab) return sd_fail(st, SD_ERR_SYS, "cuda upload: out of memory for the expert table");
    for (int i = F; i < c->num_hidden_layers; i++)
        for (int e = 0; e < E; e++) {
            const sd_ffn_weights *x = &dev->w.layers[i].moe.experts[e];
            tab[(size_t)(i - F) * E + e] = (sd_cuda_expert){
                .gate = x->gate.data, .up = x->up.data, .down = x->down.data,
                .gate_bf16 = x->gate.dtype == SD_DT_BF16, .up_bf16 = x->up.dtype == SD_DT_BF16,
                .down_bf16 = x->down.dtype == SD_DT_BF16};
        }
    sd_code rc = copy_table(b, tab, n, st);
    free(tab);
    return rc;
}

static sd_code create(const sd_config *cfg, int device, const sd_cuda_weight_source *src, sd_model *dev,
                      sd_cuda_backend *b, sd_status *st) {
    b->device = device;
    b->moe_arm = SD_CUDA_MOE_DEVICE_TABLE;
    SD_CUDA_CHECK(st, cudaSetDevice(device));
    sd_code rc = sd_cuda_device_name(device, b->device_name, sizeof b->device_name, st);
    if (rc) return rc;
    SD_CUDA_CHECK(st, cudaStreamCreateWithFlags(&b->own_stream, cudaStreamNonBlocking));
    b->stream = b->own_stream;

    dev->cfg = *cfg;
    rc = sd_weights_plan(&dev->cfg, &dev->w, st);
    if (!rc) rc = src->set_dtypes(src->ctx, &dev->w, st);
    if (!rc) rc = arena_alloc(&dev->w, b, st);
    if (!rc) rc = src->fill(src->ctx, dev, b->stream, st);
    if (rc) return rc;
    SD_CUDA_CHECK(st, cudaStreamSynchronize(b->stream));
    rc = upload_expert_table(dev, b, st);
    if (rc) return rc;
    // The non-finite flag, made with the model so a captured forward finds it at a fixed address.
    SD_CUDA_CHECK(st, cudaMalloc((void **)&b->nonfinite, sizeof(int)));
    SD_CUDA_CHECK(st, cudaMallocHost((void **)&b->nonfinite_host, sizeof(int)));
    *b->nonfinite_host = SD_NONFINITE_NONE;
    SD_TRY(sd_cuda_finite_reset(b->nonfinite, b->stream, st));

    sd_cuda_init_allocator(b);
    b->base = (sd_backend){.name = "cuda", .mem = &b->mem, .forward = sd_cuda_forward, .prefill = sd_cuda_prefill,
                           .accept = sd_cuda_accept_op, .sync = sd_cuda_sync, .sync_ctx = b, .free_model = cuda_free_model};
    dev->backend = &b->base;
    return SD_OK;
}

sd_code sd_cuda_model_create(const sd_config *cfg, int device, const sd_cuda_weight_source *src, sd_model *dev,
                             sd_status *st) {
    memset(dev, 0, sizeof *dev);
    if (device < 0 || device >= sd_cuda_device_count())
        return sd_fail(st, SD_ERR_UNSUPPORTED, "cuda model: device %d not present (%d visible)", device, sd_cuda_device_count());
    sd_cuda_backend *b = calloc(1, sizeof *b);
    if (!b) return sd_fail(st, SD_ERR_SYS, "cuda model: out of memory");
    sd_code rc = create(cfg, device, src, dev, b, st);
    if (rc) {
        dev->w.arena = NULL;
        sd_weights_free(&dev->w);
        backend_release(b);
        memset(dev, 0, sizeof *dev);
    }
    return rc;
}

// ---------------------------------------------------------------------------- upload
static bool in_arena(const sd_weights *hw, const void *p, size_t bytes) {
    const char *lo = hw->arena, *c = p;
    return c >= lo && c + bytes <= lo + hw->arena_bytes;
}

// The plan must name the host model's tensors in the same order; dtypes are the host's.
static sd_code host_dtypes(void *ctx, sd_weights *dw, sd_status *st) {
    const sd_weights *hw = &((const sd_model *)ctx)->w;
    if (hw->n_specs != dw->n_specs)
        return sd_fail(st, SD_ERR_DATA, "cuda upload: host model has %d tensors, its config plans %d", hw->n_specs, dw->n_specs);
    for (int i = 0; i < dw->n_specs; i++) {
        const sd_weight_spec *hs = &hw->specs[i];
        sd_weight_spec *ds = &dw->specs[i];
        if (strcmp(hs->name, ds->name) != 0 || hs->keep_dtype != ds->keep_dtype)
            return sd_fail(st, SD_ERR_DATA, "cuda upload: tensor %d is '%s' on the host, '%s' in the plan", i, hs->name, ds->name);
        if (!sd_weight_data(hs) || !in_arena(hw, sd_weight_data(hs), spec_bytes(hs)))
            return sd_fail(st, SD_ERR_DATA, "cuda upload: tensor '%s' is not inside the host weight arena", hs->name);
        ds->dtype = hs->dtype;
    }
    return SD_OK;
}

// One copy of the whole arena when the host layout is the device's (always, for arenas made by
// sd_weights_alloc); otherwise tensor by tensor.
static sd_code host_fill(void *ctx, const sd_model *dev, cudaStream_t stream, sd_status *st) {
    (void)stream;
    const sd_weights *hw = &((const sd_model *)ctx)->w, *dw = &dev->w;
    bool same = hw->arena_bytes == dw->arena_bytes;
    for (int i = 0; same && i < dw->n_specs; i++)
        same = (const char *)sd_weight_data(&hw->specs[i]) - (const char *)hw->arena ==
               (const char *)sd_weight_data(&dw->specs[i]) - (const char *)dw->arena;
    if (same) {
        SD_CUDA_CHECK(st, cudaMemcpy(dw->arena, hw->arena, dw->arena_bytes, cudaMemcpyHostToDevice));
        return SD_OK;
    }
    for (int i = 0; i < dw->n_specs; i++)
        SD_CUDA_CHECK(st, cudaMemcpy((void *)sd_weight_data(&dw->specs[i]), sd_weight_data(&hw->specs[i]),
                                     spec_bytes(&hw->specs[i]), cudaMemcpyHostToDevice));
    return SD_OK;
}

sd_code sd_cuda_model_upload_on(const sd_model *host, int device, sd_model *dev, sd_status *st) {
    memset(dev, 0, sizeof *dev);
    if (host->backend) return sd_fail(st, SD_ERR_USAGE, "cuda upload: the source model must be a host model");
    const sd_cuda_weight_source src = {.set_dtypes = host_dtypes, .fill = host_fill, .ctx = (void *)host};
    sd_code rc = sd_cuda_model_create(&host->cfg, device, &src, dev, st);
    if (rc) return rc;
    memcpy(dev->config_sha256, host->config_sha256, sizeof dev->config_sha256);
    memcpy(dev->weights_sha256, host->weights_sha256, sizeof dev->weights_sha256);
    return SD_OK;
}

sd_code sd_cuda_backend_share_stream(sd_cuda_backend *b, const sd_cuda_backend *owner, sd_status *st) {
    if (b->stream == owner->stream) return SD_OK;
    if (b->device != owner->device)
        return sd_fail(st, SD_ERR_USAGE, "cuda: a model on device %d cannot share the stream of one on device %d", b->device,
                       owner->device);
    SD_CUDA_CHECK(st, cudaSetDevice(b->device));
    SD_CUDA_CHECK(st, cudaStreamSynchronize(b->stream));
    b->stream = owner->stream;
    return SD_OK;
}

sd_code sd_cuda_state_init(sd_state *s, const sd_model *dev, int capacity, int max_T, sd_status *st) {
    const sd_cuda_backend *b = sd_cuda_backend_of(dev);
    if (!b) return sd_fail(st, SD_ERR_USAGE, "cuda state: the model is not on a CUDA device");
    return sd_state_init_on(s, &dev->cfg, capacity, max_T, &b->mem, st);
}

sd_code sd_cuda_model_upload(const sd_model *host, sd_model *dev, sd_status *st) {
    int device = 0;
    if (sd_cuda_device_count() > 0 && cudaGetDevice(&device) != cudaSuccess) device = 0;
    return sd_cuda_model_upload_on(host, device, dev, st);
}
