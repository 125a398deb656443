// synth.c — deterministic synthetic weights (generator: synth.h) and model directories.
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
#include "atomic_file.h" // sd_atomic_open, sd_atomic_check_target, sd_atomic_fsync_dir
#include "cleanup.h"     // sd_cleanup_add, sd_cleanup_drop

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

// The folder's files, staged in <dir>.tmp.<pid> beside it (the same file system, so the renames
// that commit them are atomic).
static const char *const staged_files[2] = {"config.json", "model.safetensors"};

static void stage_path(const sd_model_staged *sg, const char *name, char *out, size_t cap) {
    snprintf(out, cap, "%s/%s", sg->stage, name);
}

static void unregister(sd_model_staged *sg) {
    for (int i = 0; i < SD_MODEL_STAGE_SLOTS; i++) {
        if (sg->slots[i] > 0) sd_cleanup_drop(sg->slots[i] - 1);
        sg->slots[i] = 0;
    }
}

void sd_model_discard(sd_model_staged *sg) {
    if (!sg->stage[0]) return;
    char p[SD_MODEL_PATH_MAX + 128];
    for (int i = 0; i < 2; i++) {
        stage_path(sg, staged_files[i], p, sizeof p);
        unlink(p);
    }
    snprintf(p, sizeof p, "%s/model.safetensors.tmp.%ld", sg->stage, (long)getpid());
    unlink(p);
    rmdir(sg->stage);
    unregister(sg);
    memset(sg, 0, sizeof *sg);
}

static sd_code write_config(const sd_model *m, const char *path, sd_status *st) {
    char *json = sd_config_to_json(&m->cfg);
    if (!json) return sd_fail(st, SD_ERR_SYS, "out of memory");
    sd_atomic_file af;
    sd_code rc = sd_atomic_open(&af, path, st);
    if (!rc && fputs(json, af.f) == EOF) {
        sd_atomic_abort(&af);
        rc = sd_fail(st, SD_ERR_SYS, "%s: write: %s", path, strerror(errno));
    }
    if (!rc) rc = sd_atomic_commit(&af, st);
    free(json);
    return rc;
}

static sd_code write_weights(const sd_model *m, const char *path, sd_status *st) {
    const sd_weights *w = &m->w;
    sd_st_tensor *t = calloc((size_t)w->n_specs, sizeof *t);
    if (!t) return sd_fail(st, SD_ERR_SYS, "out of memory");
    for (int i = 0; i < w->n_specs; i++) {
        const sd_weight_spec *s = &w->specs[i];
        t[i] = (sd_st_tensor){.name = (char *)s->name, .dtype = s->dtype, .ndim = s->ndim,
                              .data = sd_weight_data(s)};
        t[i].shape[0] = s->shape[0];
        t[i].shape[1] = s->shape[1];
        t[i].nbytes = (size_t)sd_st_numel(&t[i]) * sd_dtype_size(s->dtype);
    }
    sd_code rc = sd_st_write(path, t, w->n_specs, st);
    free(t);
    return rc;
}

sd_code sd_model_stage(const sd_model *m, const char *dir, sd_model_staged *sg, sd_status *st) {
    memset(sg, 0, sizeof *sg);
    // config.json has no words for a shard's share (cfg.shard): its files would describe another model.
    if (m->cfg.shard.ranks)
        return sd_fail(st, SD_ERR_USAGE, "%s: rank %d's shard is not a model one can save", dir, m->cfg.shard.rank);
    if (strlen(dir) >= SD_MODEL_PATH_MAX) return sd_fail(st, SD_ERR_USAGE, "%s: path too long", dir);
    SD_TRY(sd_atomic_check_target(dir, 1, st)); // a folder or nothing; stale stages of dead runs go
    struct stat sb;
    sg->existed = stat(dir, &sb) == 0;
    char p[SD_MODEL_PATH_MAX + 128];
    for (int i = 0; sg->existed && i < 2; i++) { // the files it will replace must be regular files
        snprintf(p, sizeof p, "%s/%s", dir, staged_files[i]);
        SD_TRY(sd_atomic_check_target(p, 0, st));
    }
    snprintf(sg->dir, sizeof sg->dir, "%s", dir);
    snprintf(sg->stage, sizeof sg->stage, "%s.tmp.%ld", dir, (long)getpid());
    if (mkdir(sg->stage, 0755) != 0) {
        sd_code rc = sd_fail(st, SD_ERR_SYS, "%s: cannot create %s: %s", dir, sg->stage, strerror(errno));
        sg->stage[0] = '\0';
        return rc;
    }
    sg->slots[0] = sd_cleanup_add(sg->stage, true) + 1;
    for (int i = 0; i < 2; i++) {
        stage_path(sg, staged_files[i], p, sizeof p);
        sg->slots[1 + i] = sd_cleanup_add(p, false) + 1;
    }
    // sd_st_write's own temporary beside its target (safetensors.c: <path>.tmp.<pid>).
    snprintf(p, sizeof p, "%s/model.safetensors.tmp.%ld", sg->stage, (long)getpid());
    sg->slots[3] = sd_cleanup_add(p, false) + 1;

    stage_path(sg, "model.safetensors", p, sizeof p);
    sd_code rc = write_weights(m, p, st);
    stage_path(sg, "config.json", p, sizeof p);
    if (!rc) rc = write_config(m, p, st);
    if (rc) sd_model_discard(sg);
    else sd_atomic_fsync_dir(p);
    return rc;
}

sd_code sd_model_commit(sd_model_staged *sg, sd_status *st) {
    sd_code rc = SD_OK;
    if (!sg->existed) { // the whole folder appears at once
        if (rename(sg->stage, sg->dir) != 0) rc = sd_fail(st, SD_ERR_SYS, "%s: rename: %s", sg->dir, strerror(errno));
        else sg->stage[0] = '\0';
    } else { // config first: a failure between the two renames never leaves weights without a config
        char from[SD_MODEL_PATH_MAX + 128], to[SD_MODEL_PATH_MAX + 128];
        for (int i = 0; !rc && i < 2; i++) {
            stage_path(sg, staged_files[i], from, sizeof from);
            snprintf(to, sizeof to, "%s/%s", sg->dir, staged_files[i]);
            if (rename(from, to) != 0) rc = sd_fail(st, SD_ERR_SYS, "%s: rename: %s", to, strerror(errno));
        }
    }
    char probe[SD_MODEL_PATH_MAX + 128];
    snprintf(probe, sizeof probe, "%s/config.json", sg->dir);
    sd_atomic_fsync_dir(probe);
    sd_atomic_fsync_dir(sg->dir);
    sd_model_discard(sg); // what is left of the stage (nothing, after a whole-folder rename)
    unregister(sg);
    return rc;
}

sd_code sd_model_save(const sd_model *m, const char *dir, sd_status *st) {
    sd_model_staged sg;
    SD_TRY(sd_model_stage(m, dir, &sg, st));
    return sd_model_commit(&sg, st);
}
