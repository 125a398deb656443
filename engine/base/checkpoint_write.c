// checkpoint_write.c — a model directory's weights as one file or as shards + index
// (checkpoint.h), every file through atomic_file.h and all of them renamed at the end.
#include "checkpoint.h"
#include <cjson/cJSON.h> // cJSON_Print
#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statvfs.h>
#include <unistd.h>
#include "atomic_file.h" // sd_atomic_open, sd_atomic_finish, sd_atomic_publish, sd_atomic_abort

#define SHARD_NAME_MAX 64

typedef struct {
    int first, count;          // tensors [first, first + count)
    char name[SHARD_NAME_MAX]; // model-0000N-of-0000M.safetensors, or model.safetensors
} shard_plan;

// Greedy in the given order, as the hub's writer does: a shard closes before a tensor that
// would take it past the limit, unless it is empty.
static int plan_shards(const sd_st_tensor *t, int n, uint64_t limit, shard_plan *s) {
    int m = 0;
    uint64_t bytes = 0;
    for (int i = 0; i < n; i++) {
        if (m == 0 || (s[m - 1].count > 0 && bytes + t[i].nbytes > limit)) {
            s[m++] = (shard_plan){.first = i};
            bytes = 0;
        }
        s[m - 1].count++;
        bytes += t[i].nbytes;
    }
    if (m == 0) s[m++] = (shard_plan){0};
    for (int k = 0; k < m; k++) {
        if (m == 1) snprintf(s[k].name, SHARD_NAME_MAX, "%s", SD_CKPT_SINGLE);
        else snprintf(s[k].name, SHARD_NAME_MAX, "model-%05d-of-%05d.safetensors", k + 1, m);
    }
    return m;
}

static char *join(const char *dir, const char *name) {
    size_t n = strlen(dir) + strlen(name) + 2;
    char *p = malloc(n);
    if (p) snprintf(p, n, "%s/%s", dir, name);
    return p;
}

typedef struct {
    const char *tensor, *shard;
} map_pair;

static int cmp_map_pair(const void *a, const void *b) {
    return strcmp(((const map_pair *)a)->tensor, ((const map_pair *)b)->tensor);
}

// {"metadata": {"total_size": N}, "weight_map": {name: shard}}, names sorted as the hub writes them.
static char *index_text(const sd_st_tensor *t, int n, const shard_plan *s, int m) {
    map_pair *pairs = malloc((size_t)(n ? n : 1) * sizeof *pairs);
    cJSON *root = cJSON_CreateObject(), *meta = cJSON_CreateObject(), *map = cJSON_CreateObject();
    bool ok = pairs && root && meta && map;
    uint64_t total = 0;
    for (int k = 0; k < m && ok; k++)
        for (int i = s[k].first; i < s[k].first + s[k].count; i++) {
            pairs[i] = (map_pair){t[i].name, s[k].name};
            total += t[i].nbytes;
        }
    if (ok) qsort(pairs, (size_t)n, sizeof *pairs, cmp_map_pair);
    char num[24];
    snprintf(num, sizeof num, "%" PRIu64, total);
    ok = ok && cJSON_AddItemToObject(meta, "total_size", cJSON_CreateRaw(num));
    for (int i = 0; i < n && ok; i++) ok = cJSON_AddItemToObject(map, pairs[i].tensor, cJSON_CreateString(pairs[i].shard));
    if (root && meta && cJSON_AddItemToObject(root, "metadata", meta)) meta = NULL;
    if (root && map && cJSON_AddItemToObject(root, "weight_map", map)) map = NULL;
    char *text = ok && !meta && !map ? cJSON_Print(root) : NULL;
    cJSON_Delete(root);
    cJSON_Delete(meta);
    cJSON_Delete(map);
    free(pairs);
    return text;
}

// Refuse before writing when the file system holding dir has less than `need` bytes free.
static sd_code check_space(const char *dir, uint64_t need, sd_status *st) {
    struct statvfs vfs;
    if (statvfs(dir, &vfs) != 0) return sd_fail(st, SD_ERR_SYS, "%s: statvfs: %s", dir, strerror(errno));
    uint64_t avail = (uint64_t)vfs.f_bavail * (uint64_t)vfs.f_frsize;
    if (avail < need)
        return sd_fail(st, SD_ERR_SYS, "%s: not enough free disk space: the weights need %" PRIu64 " bytes (%.2f GB), "
                       "%" PRIu64 " bytes (%.2f GB) are available", dir, need, need / 1e9, avail, avail / 1e9);
    return SD_OK;
}

// The temporaries of every file, written and finished; nothing published.
static sd_code write_all(const char *dir, const sd_st_tensor *t, const shard_plan *s, int m, const char *index,
                         sd_atomic_file *files, sd_st_progress *p, sd_status *st) {
    for (int k = 0; k < m; k++) {
        char *path = join(dir, s[k].name);
        if (!path) return sd_fail(st, SD_ERR_SYS, "%s: out of memory", dir);
        sd_code rc = sd_atomic_open(&files[k], path, st);
        if (!rc) rc = sd_st_write_stream(files[k].f, path, t + s[k].first, s[k].count, p, st);
        if (!rc) rc = sd_atomic_finish(&files[k], st);
        free(path);
        if (rc) return rc;
    }
    if (!index) return SD_OK;
    char *path = join(dir, SD_CKPT_INDEX);
    if (!path) return sd_fail(st, SD_ERR_SYS, "%s: out of memory", dir);
    sd_code rc = sd_atomic_open(&files[m], path, st);
    if (!rc && fputs(index, files[m].f) == EOF) rc = sd_fail(st, SD_ERR_SYS, "%s: write: %s", path, strerror(errno));
    if (!rc) rc = sd_atomic_finish(&files[m], st);
    free(path);
    return rc;
}

sd_code sd_ckpt_write(const char *dir, const sd_st_tensor *t, int n, const sd_ckpt_write_opts *o, sd_status *st) {
    const uint64_t limit = o && o->shard_bytes ? o->shard_bytes : SD_CKPT_DEFAULT_SHARD_BYTES;
    shard_plan *s = malloc((size_t)(n ? n : 1) * sizeof *s);
    if (!s) return sd_fail(st, SD_ERR_SYS, "%s: out of memory", dir);
    const int m = plan_shards(t, n, limit, s);
    char *index = m > 1 ? index_text(t, n, s, m) : NULL;
    sd_atomic_file *files = calloc((size_t)m + 1, sizeof *files);
    sd_code rc = files && (m == 1 || index) ? SD_OK : sd_fail(st, SD_ERR_SYS, "%s: out of memory", dir);
    uint64_t need = index ? strlen(index) : 0, data = 0;
    for (int k = 0; k < m; k++) need += sd_st_file_bytes_bound(t + s[k].first, s[k].count);
    for (int i = 0; i < n; i++) data += t[i].nbytes;
    if (!rc) rc = check_space(dir, need, st);
    sd_st_progress p = {.total = data, .report = o ? o->progress : NULL, .ctx = o ? o->progress_ctx : NULL};
    if (!rc) rc = write_all(dir, t, s, m, index, files, &p, st);
    // Publish the shards, then the index that names them.
    for (int k = 0; k <= m && !rc; k++)
        if (k < m || index) rc = sd_atomic_publish(&files[k], st);
    for (int k = 0; files && k <= m; k++) sd_atomic_abort(&files[k]); // no-op on the published
    if (!rc) { // the directory holds one model: the other layout's file goes
        char *other = join(dir, m > 1 ? SD_CKPT_SINGLE : SD_CKPT_INDEX);
        if (other) unlink(other);
        free(other);
    }
    free(files);
    free(index);
    free(s);
    return rc;
}
