// synth_device.c — sd_synth_model's weights generated in device memory (cuda_synth.h): the
// tensor table is planned on the host (small), the arena laid out by upload.c's
// sd_cuda_model_create, and each tensor filled by one kernel (kernels/synth_fill.h) with the
// host generator's counter, key, name hash and role scale. tests/test_cuda_synth.c pins the
// bytes to the host's.
#include <math.h>
#include <string.h>
#include "cuda_model.h" // sd_cuda_model_create
#include "cuda_synth.h"
#include "synth_fill.h" // sd_cuda_synth_fill

// synth.c's role scales, evaluated by the same host arithmetic (the test compares the bytes).
typedef struct { float scale, offset; } affine;

static affine role_affine(sd_weight_role role, int fan_in, const sd_config *c, int depth) {
    const float L2 = 2.0f * (float)(depth > 0 ? depth : c->num_hidden_layers), D = (float)c->hidden_size;
    switch (role) {
    case SD_ROLE_MATRIX: return (affine){sqrtf(3.0f / (float)fan_in), 0.0f};
    case SD_ROLE_RESIDUAL: return (affine){sqrtf(3.0f / ((float)fan_in * L2)), 0.0f};
    case SD_ROLE_EMBED: return (affine){sqrtf(3.0f), 0.0f};
    case SD_ROLE_HEAD: return (affine){3.0f * sqrtf(3.0f / D), 0.0f};
    case SD_ROLE_NORM: return (affine){0.05f, 1.0f};
    case SD_ROLE_CONV: return (affine){sqrtf(3.0f / (float)c->short_conv_kernel_size), 0.0f};
    case SD_ROLE_A_LOG: return (affine){1.385f, 1.385f};
    case SD_ROLE_DT_BIAS: return (affine){2.35f, -4.65f};
    case SD_ROLE_ROUTER: return (affine){sqrtf(3.0f / D), 0.0f};
    case SD_ROLE_ROUTER_BIAS: return (affine){0.05f, 0.0f};
    }
    return (affine){0.0f, 0.0f};
}

static uint32_t fnv1a32(const char *s) {
    uint32_t h = 2166136261u;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 16777619u;
    return h;
}

// Matrices in the options' dtype, vectors F32 (sd_synth_model's rule).
static sd_code synth_dtypes(void *ctx, sd_weights *w, sd_status *st) {
    (void)st;
    const sd_synth_opts *o = ctx;
    for (int i = 0; i < w->n_specs; i++) w->specs[i].dtype = w->specs[i].keep_dtype ? o->dtype : SD_DT_F32;
    return SD_OK;
}

static sd_code synth_fill(void *ctx, const sd_model *dev, cudaStream_t stream, sd_status *st) {
    const sd_synth_opts *o = ctx;
    const sd_config *c = &dev->cfg;
    for (int i = 0; i < dev->w.n_specs; i++) {
        const sd_weight_spec *s = &dev->w.specs[i];
        const int64_t n = s->shape[0] * (s->ndim == 2 ? s->shape[1] : 1);
        affine af = role_affine(s->role, s->ndim == 2 ? (int)s->shape[1] : 1, c, o->depth);
        if (s->role == SD_ROLE_RESIDUAL && s->layer >= o->tail_from) af.scale *= o->tail_scale;
        sd_code rc = sd_cuda_synth_fill((void *)sd_weight_data(s), n, s->dtype == SD_DT_BF16, o->seed, fnv1a32(s->name),
                                        af.scale, af.offset, stream, st);
        if (rc) return rc;
    }
    return SD_OK;
}

sd_code sd_cuda_model_synth(const sd_config *cfg, const sd_synth_opts *o, int device, sd_model *dev, sd_status *st) {
    if (o->dtype != SD_DT_F32 && o->dtype != SD_DT_BF16) {
        memset(dev, 0, sizeof *dev);
        return sd_fail(st, SD_ERR_USAGE, "init: dtype must be bf16 or f32");
    }
    const sd_cuda_weight_source src = {.set_dtypes = synth_dtypes, .fill = synth_fill, .ctx = (void *)o};
    return sd_cuda_model_create(cfg, device, &src, dev, st);
}
