// model_save.c — a model folder staged beside its target and committed by renames (model_save.h).
#include "model_save.h"
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "atomic_file.h" // sd_atomic_open, sd_atomic_check_target, sd_atomic_fsync_dir
#include "cleanup.h"     // sd_cleanup_add, sd_cleanup_drop

#define NAME_CAP 256

static void keep(sd_model_staged *sg, const char *path, bool dir) {
    if (sg->n_slots < SD_MODEL_STAGE_SLOTS) sg->slots[sg->n_slots++] = sd_cleanup_add(path, dir) + 1;
}

static void unregister(sd_model_staged *sg) {
    for (int i = 0; i < sg->n_slots; i++)
        if (sg->slots[i] > 0) sd_cleanup_drop(sg->slots[i] - 1);
    sg->n_slots = 0;
}

// The stage's file names (regular entries), sorted; *n of them. NULL with *n = 0 when unreadable.
static char (*stage_names(const sd_model_staged *sg, int *n))[NAME_CAP] {
    *n = 0;
    DIR *d = opendir(sg->stage);
    if (!d) return NULL;
    char (*v)[NAME_CAP] = NULL;
    int cap = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..") || strlen(e->d_name) >= NAME_CAP) continue;
        if (*n == cap) {
            cap = cap ? 2 * cap : 16;
            char (*w)[NAME_CAP] = realloc(v, (size_t)cap * NAME_CAP);
            if (!w) break;
            v = w;
        }
        snprintf(v[(*n)++], NAME_CAP, "%s", e->d_name);
    }
    closedir(d);
    if (v) qsort(v, (size_t)*n, NAME_CAP, (int (*)(const void *, const void *))strcmp);
    return v;
}

void sd_model_discard(sd_model_staged *sg) {
    if (sg->stage[0]) {
        int n;
        char (*names)[NAME_CAP] = stage_names(sg, &n);
        char p[SD_MODEL_PATH_MAX + 32 + NAME_CAP];
        for (int i = 0; i < n; i++) {
            snprintf(p, sizeof p, "%s/%s", sg->stage, names[i]);
            unlink(p);
        }
        free(names);
        rmdir(sg->stage);
    }
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

static sd_code write_weights(const sd_model *m, const char *dir, const sd_ckpt_write_opts *o, sd_status *st) {
    const sd_weights *w = &m->w;
    sd_st_tensor *t = calloc((size_t)w->n_specs, sizeof *t);
    if (!t) return sd_fail(st, SD_ERR_SYS, "out of memory");
    for (int i = 0; i < w->n_specs; i++) {
        const sd_weight_spec *s = &w->specs[i];
        t[i] = (sd_st_tensor){.name = (char *)s->name, .dtype = s->dtype, .ndim = s->ndim, .data = sd_weight_data(s)};
        t[i].shape[0] = s->shape[0];
        t[i].shape[1] = s->shape[1];
        t[i].nbytes = (size_t)sd_st_numel(&t[i]) * sd_dtype_size(s->dtype);
    }
    const sd_code rc = sd_ckpt_write(dir, t, w->n_specs, o, st);
    free(t);
    return rc;
}

sd_code sd_model_stage(const sd_model *m, const char *dir, const sd_ckpt_write_opts *o, sd_model_staged *sg,
                       sd_status *st) {
    memset(sg, 0, sizeof *sg);
    // config.json has no words for a shard's share (cfg.shard): its files would describe another model.
    if (m->cfg.shard.ranks)
        return sd_fail(st, SD_ERR_USAGE, "%s: rank %d's shard is not a model one can save", dir, m->cfg.shard.rank);
    if (strlen(dir) >= SD_MODEL_PATH_MAX) return sd_fail(st, SD_ERR_USAGE, "%s: path too long", dir);
    SD_TRY(sd_atomic_check_target(dir, 1, st)); // a folder or nothing; stale stages of dead runs go
    struct stat sb;
    sg->existed = stat(dir, &sb) == 0;
    snprintf(sg->dir, sizeof sg->dir, "%s", dir);
    snprintf(sg->stage, sizeof sg->stage, "%s.tmp.%ld", dir, (long)getpid());
    if (mkdir(sg->stage, 0755) != 0) {
        const sd_code rc = sd_fail(st, SD_ERR_SYS, "%s: cannot create %s: %s", dir, sg->stage, strerror(errno));
        sg->stage[0] = '\0';
        return rc;
    }
    keep(sg, sg->stage, true);
    char p[SD_MODEL_PATH_MAX + 32 + NAME_CAP];
    sd_code rc = write_weights(m, sg->stage, o, st); // each file under its own registered temporary
    snprintf(p, sizeof p, "%s/config.json", sg->stage);
    if (!rc) rc = write_config(m, p, st);
    if (rc) {
        sd_model_discard(sg);
        return rc;
    }
    int n;
    char (*names)[NAME_CAP] = stage_names(sg, &n);
    for (int i = 0; i < n; i++) { // the finished files, until the commit moves them
        snprintf(p, sizeof p, "%s/%s", sg->stage, names[i]);
        keep(sg, p, false);
    }
    free(names);
    sd_atomic_fsync_dir(p);
    return SD_OK;
}

// A shard's name as checkpoint_write.c and the hub write it: model-NNNNN-of-NNNNN.safetensors.
static bool is_shard_name(const char *name) {
    int a, b, used = 0;
    return sscanf(name, "model-%5d-of-%5d.safetensors%n", &a, &b, &used) == 2 && used == (int)strlen(name) &&
           strlen(name) == strlen("model-00001-of-00001.safetensors");
}

// After a commit into an existing folder: the shards of an earlier checkpoint that this one does
// not hold go, so the folder holds one model.
static void remove_old_shards(const char *dir, char (*names)[NAME_CAP], int n) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    char p[SD_MODEL_PATH_MAX + NAME_CAP + 2];
    while ((e = readdir(d))) {
        if (!is_shard_name(e->d_name)) continue;
        bool ours = false;
        for (int i = 0; i < n && !ours; i++) ours = !strcmp(names[i], e->d_name);
        if (ours) continue;
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        unlink(p);
    }
    closedir(d);
}

// The commit order into an existing folder: config.json, the shards (or model.safetensors), the index.
static int rank_of(const char *name) {
    return !strcmp(name, "config.json") ? 0 : !strcmp(name, SD_CKPT_INDEX) ? 2 : 1;
}

static sd_code commit_into(sd_model_staged *sg, sd_status *st) {
    int n;
    char (*names)[NAME_CAP] = stage_names(sg, &n);
    if (!names) return sd_fail(st, SD_ERR_SYS, "%s: cannot read %s", sg->dir, sg->stage);
    char from[SD_MODEL_PATH_MAX + 32 + NAME_CAP], to[SD_MODEL_PATH_MAX + NAME_CAP + 2];
    sd_code rc = SD_OK;
    bool sharded = false;
    for (int i = 0; i < n && !rc; i++) { // every file it replaces is a regular file, before any rename
        snprintf(to, sizeof to, "%s/%s", sg->dir, names[i]);
        rc = sd_atomic_check_target(to, 0, st);
        sharded |= rank_of(names[i]) == 2;
    }
    for (int r = 0; r < 3 && !rc; r++)
        for (int i = 0; i < n && !rc; i++) {
            if (rank_of(names[i]) != r) continue;
            snprintf(from, sizeof from, "%s/%s", sg->stage, names[i]);
            snprintf(to, sizeof to, "%s/%s", sg->dir, names[i]);
            if (rename(from, to) != 0) rc = sd_fail(st, SD_ERR_SYS, "%s: rename: %s", to, strerror(errno));
        }
    if (!rc) { // the folder holds one model: the other layout's file and earlier shards go
        snprintf(to, sizeof to, "%s/%s", sg->dir, sharded ? SD_CKPT_SINGLE : SD_CKPT_INDEX);
        unlink(to);
        remove_old_shards(sg->dir, names, n);
    }
    free(names);
    return rc;
}

sd_code sd_model_commit(sd_model_staged *sg, sd_status *st) {
    if (!sg->stage[0]) return sd_fail(st, SD_ERR_USAGE, "model folder: commit without a stage");
    sd_code rc = SD_OK;
    if (!sg->existed) { // the whole folder appears at once
        if (rename(sg->stage, sg->dir) != 0) rc = sd_fail(st, SD_ERR_SYS, "%s: rename: %s", sg->dir, strerror(errno));
        else sg->stage[0] = '\0';
    } else {
        rc = commit_into(sg, st);
    }
    char probe[SD_MODEL_PATH_MAX + 16];
    snprintf(probe, sizeof probe, "%s/config.json", sg->dir);
    sd_atomic_fsync_dir(probe);
    sd_atomic_fsync_dir(sg->dir);
    sd_model_discard(sg); // what is left of the stage (nothing, after a whole-folder rename)
    return rc;
}

sd_code sd_model_save(const sd_model *m, const char *dir, const sd_ckpt_write_opts *o, sd_status *st) {
    sd_model_staged sg;
    SD_TRY(sd_model_stage(m, dir, o, &sg, st));
    return sd_model_commit(&sg, st);
}
