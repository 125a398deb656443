// synth.c — deterministic synthetic weights (generator: synth.h).
//
// Scales (std of u·a is a/√3), chosen so activations stay O(1) through every layer and the
// logits spread enough that temperature-1 sampling is meaningful:
//   Linear read from the residual stream or a gate: std 1/√in (unit-variance outputs)
//   residual writers (o_proj, down_proj):           std 1/√(in·2L) (the stream grows ~√2 over L layers)
//   embedding rows: std 1;  lm_head: std 3/√D (logits on a unit-RMS input have std ≈ 3)
//   norm weights: 1 ± 0.05;  conv taps: std 1/√W;  router: std 1/√D, bias ±0.05
//   A_log ∈ [0, 2.77] (A ∈ [1, 16]);  dt_bias ∈ [-7, -2.3] (softplus ≈ 0.001 .. 0.1): decays
//   from near-1 to fast, as flash-linear-attention initialises them.
#include "synth.h"
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "philox.h" // sd_philox4x32_10

static uint32_t fnv1a32(const char *s) {
    uint32_t h = 2166136261u;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 16777619u;
    return h;
}

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
    case SD_ROLE_A_LOG: return (affine){1.385f, 1.385f};   // [0, 2.77)
    case SD_ROLE_DT_BIAS: return (affine){2.35f, -4.65f};  // [-7, -2.3)
    case SD_ROLE_ROUTER: return (affine){sqrtf(3.0f / D), 0.0f};
    case SD_ROLE_ROUTER_BIAS: return (affine){0.05f, 0.0f};
    }
    return (affine){0.0f, 0.0f};
}

sd_synth_tensor sd_synth_tensor_params(const sd_weight_spec *s, const sd_config *c, const sd_synth_opts *o) {
    const int fan_in = s->ndim == 2 ? (int)s->shape[1] : 1;
    affine af = role_affine(s->role, fan_in, c, o->depth);
    if (s->role == SD_ROLE_RESIDUAL && s->layer >= o->tail_from) af.scale *= o->tail_scale;
    return (sd_synth_tensor){.scale = af.scale, .offset = af.offset, .name_hash = fnv1a32(s->name)};
}

static void fill(const sd_weight_spec *s, const sd_config *c, const sd_synth_opts *o) {
    const int64_t n = s->shape[0] * (s->ndim == 2 ? s->shape[1] : 1);
    const sd_synth_tensor p = sd_synth_tensor_params(s, c, o);
    const affine af = {p.scale, p.offset};
    const uint32_t key[2] = {(uint32_t)o->seed, (uint32_t)(o->seed >> 32)};
    const uint32_t name_hash = p.name_hash;
    void *dst = s->keep_dtype ? (void *)s->mat->data : (void *)*s->vec;
#pragma omp parallel for schedule(static)
    for (int64_t blk = 0; blk < (n + 3) / 4; blk++) {
        const uint32_t ctr[4] = {(uint32_t)blk, (uint32_t)((uint64_t)blk >> 32), name_hash, SD_DRAW_INIT};
        sd_philox_out r = sd_philox4x32_10(ctr, key);
        for (int l = 0; l < 4 && blk * 4 + l < n; l++) {
            float u = 2.0f * sd_u32_to_unit(r.v[l]) - 1.0f;
            float v = u * af.scale + af.offset;
            if (s->dtype == SD_DT_BF16) ((uint16_t *)dst)[blk * 4 + l] = sd_f32_to_bf16(v);
            else ((float *)dst)[blk * 4 + l] = v;
        }
    }
}

sd_code sd_synth_model(sd_model *m, const sd_config *cfg, const sd_synth_opts *o, sd_status *st) {
    memset(m, 0, sizeof *m);
    m->cfg = *cfg;
    if (o->dtype != SD_DT_F32 && o->dtype != SD_DT_BF16)
        return sd_fail(st, SD_ERR_USAGE, "init: dtype must be bf16 or f32");
    sd_code rc = sd_weights_plan(&m->cfg, &m->w, st);
    for (int i = 0; !rc && i < m->w.n_specs; i++)
        m->w.specs[i].dtype = m->w.specs[i].keep_dtype ? o->dtype : SD_DT_F32;
    if (!rc) rc = sd_weights_alloc(&m->w, st);
    for (int i = 0; !rc && i < m->w.n_specs; i++) fill(&m->w.specs[i], &m->cfg, o);
    if (rc) sd_model_free(m);
    return rc;
}

sd_code sd_draft_config(const sd_config *cfg, int n_layers, sd_config *out, sd_status *st) {
    if (n_layers < 1 || n_layers > cfg->num_hidden_layers)
        return sd_fail(st, SD_ERR_USAGE, "--draft-layers must be in 1..%d, got %d", cfg->num_hidden_layers, n_layers);
    *out = *cfg;
    out->num_hidden_layers = n_layers;
    if (out->first_k_dense_replace > n_layers) out->first_k_dense_replace = n_layers;
    return SD_OK;
}
