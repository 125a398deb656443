// upload.c — a host model onto one device: the weight arena copied as one allocation, every
// tensor pointer rebased, the routed experts' pointers gathered into a device table, and the
// backend object that the device model's forward, sync and free go through.
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "check.h"         // SD_CUDA_CHECK
#include "cuda_internal.h" // sd_cuda_init_allocator, sd_cuda_sync, sd_cuda_forward

static void cuda_free_model(sd_model *m);

sd_cuda_backend *sd_cuda_backend_of(const sd_model *m) {
    if (!m->backend || m->backend->free_model != cuda_free_model) return NULL;
    return (sd_cuda_backend *)m->backend;
}

static void backend_release(sd_cuda_backend *b) {
    if (!b) return;
    cudaSetDevice(b->device);
    if (b->stream) cudaStreamSynchronize(b->stream);
    cudaFree(b->arena);
    cudaFree(b->experts);
    cudaFree(b->tokens);
    cudaFree(b->logits);
    cudaFreeHost(b->tokens_host);
    cudaFreeHost(b->sel_host);
    cudaFreeHost(b->w_host);
    if (b->stream) cudaStreamDestroy(b->stream);
    free(b);
}

static void cuda_free_model(sd_model *m) {
    backend_release((sd_cuda_backend *)m->backend);
    m->backend = NULL;
    m->w.arena = NULL; // device memory, released above; the tables are host memory
    sd_weights_free(&m->w);
}

// device pointer of a host tensor pointer p inside the host arena.
static const void *rebase(const sd_weights *hw, const sd_cuda_backend *b, const void *p) {
    return (const char *)b->arena + ((const char *)p - (const char *)hw->arena);
}

static bool in_arena(const sd_weights *hw, const void *p, size_t bytes) {
    const char *lo = hw->arena, *c = p;
    return c >= lo && c + bytes <= lo + hw->arena_bytes;
}

// Point every destination of dev->w (planned for the same config) at the device copy.
static sd_code rebase_all(const sd_model *host, sd_model *dev, const sd_cuda_backend *b, sd_status *st) {
    const sd_weights *hw = &host->w;
    sd_weights *dw = &dev->w;
    if (hw->n_specs != dw->n_specs)
        return sd_fail(st, SD_ERR_DATA, "cuda upload: host model has %d tensors, its config plans %d", hw->n_specs, dw->n_specs);
    for (int i = 0; i < dw->n_specs; i++) {
        const sd_weight_spec *hs = &hw->specs[i];
        sd_weight_spec *ds = &dw->specs[i];
        const void *hp = sd_weight_data(hs);
        size_t bytes = (size_t)hs->shape[0] * (size_t)(hs->ndim == 2 ? hs->shape[1] : 1) * sd_dtype_size(hs->dtype);
        if (strcmp(hs->name, ds->name) != 0 || hs->keep_dtype != ds->keep_dtype)
            return sd_fail(st, SD_ERR_DATA, "cuda upload: tensor %d is '%s' on the host, '%s' in the plan", i, hs->name, ds->name);
        if (!hp || !in_arena(hw, hp, bytes))
            return sd_fail(st, SD_ERR_DATA, "cuda upload: tensor '%s' is not inside the host weight arena", hs->name);
        ds->dtype = hs->dtype;
        if (ds->keep_dtype) {
            ds->mat->data = rebase(hw, b, hp);
            ds->mat->dtype = hs->dtype;
        } else {
            *ds->vec = (float *)rebase(hw, b, hp);
        }
    }
    if (!dw->lm_head.data) dw->lm_head = dw->embed; // tied head (weights.c does the same)
    dw->arena = b->arena;
    dw->arena_bytes = b->arena_bytes;
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

static sd_code upload(const sd_model *host, int device, sd_model *dev, sd_cuda_backend *b, sd_status *st) {
    b->device = device;
    b->moe_arm = SD_CUDA_MOE_DEVICE_TABLE;
    SD_CUDA_CHECK(st, cudaSetDevice(device));
    sd_code rc = sd_cuda_device_name(device, b->device_name, sizeof b->device_name, st);
    if (rc) return rc;
    SD_CUDA_CHECK(st, cudaStreamCreateWithFlags(&b->stream, cudaStreamNonBlocking));
    b->arena_bytes = host->w.arena_bytes;
    SD_CUDA_CHECK(st, cudaMalloc(&b->arena, b->arena_bytes ? b->arena_bytes : 64));
    SD_CUDA_CHECK(st, cudaMemcpy(b->arena, host->w.arena, b->arena_bytes, cudaMemcpyHostToDevice));

    dev->cfg = host->cfg;
    memcpy(dev->config_sha256, host->config_sha256, sizeof dev->config_sha256);
    memcpy(dev->weights_sha256, host->weights_sha256, sizeof dev->weights_sha256);
    rc = sd_weights_plan(&dev->cfg, &dev->w, st);
    if (!rc) rc = rebase_all(host, dev, b, st);
    if (!rc) rc = upload_expert_table(dev, b, st);
    if (rc) return rc;

    sd_cuda_init_allocator(b);
    b->base = (sd_backend){.name = "cuda", .mem = &b->mem, .forward = sd_cuda_forward, .sync = sd_cuda_sync,
                           .sync_ctx = b, .free_model = cuda_free_model};
    dev->backend = &b->base;
    return SD_OK;
}

sd_code sd_cuda_model_upload_on(const sd_model *host, int device, sd_model *dev, sd_status *st) {
    memset(dev, 0, sizeof *dev);
    if (host->backend) return sd_fail(st, SD_ERR_USAGE, "cuda upload: the source model must be a host model");
    if (device < 0 || device >= sd_cuda_device_count())
        return sd_fail(st, SD_ERR_UNSUPPORTED, "cuda upload: device %d not present (%d visible)", device, sd_cuda_device_count());
    sd_cuda_backend *b = calloc(1, sizeof *b);
    if (!b) return sd_fail(st, SD_ERR_SYS, "cuda upload: out of memory");
    sd_code rc = upload(host, device, dev, b, st);
    if (rc) {
        dev->w.arena = NULL;
        sd_weights_free(&dev->w);
        backend_release(b);
        memset(dev, 0, sizeof *dev);
    }
    return rc;
}

sd_code sd_cuda_model_upload(const sd_model *host, sd_model *dev, sd_status *st) {
    int device = 0;
    if (sd_cuda_device_count() > 0 && cudaGetDevice(&device) != cudaSuccess) device = 0;
    return sd_cuda_model_upload_on(host, device, dev, st);
}
