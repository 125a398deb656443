// checkpoint.c — open a model directory's weights, single file or index + shards (checkpoint.h).
#include "checkpoint.h"
#include "file_open.h" // sd_fopen_regular
#include <cjson/cJSON.h> // cJSON_ParseWithOpts
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdint.h>
#include <sys/stat.h>
#include "digest.h" // sd_sha256_file, sd_sha256_buf

#define INDEX_MAX_BYTES (64u << 20) // a 10^5-tensor index is a few MB

static char *join(const char *dir, const char *name) {
    size_t n = strlen(dir) + strlen(name) + 2;
    char *p = malloc(n);
    if (p) snprintf(p, n, "%s/%s", dir, name);
    return p;
}

static bool exists(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0;
}

// ---------------------------------------------------------------------------------------------
// the index: (tensor name, shard name) pairs, sorted by tensor name

typedef struct {
    const char *tensor, *shard; // point into the parsed JSON
} index_pair;

static int cmp_pair(const void *a, const void *b) {
    return strcmp(((const index_pair *)a)->tensor, ((const index_pair *)b)->tensor);
}

static int cmp_str_ptr(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static int cmp_entry(const void *a, const void *b) {
    return strcmp(((const sd_ckpt_entry *)a)->tensor->name, ((const sd_ckpt_entry *)b)->tensor->name);
}

static sd_code read_text(const char *path, char **out, size_t *len, sd_status *st) {
    FILE *f = sd_fopen_regular(path, st); // a FIFO must not block the open
    if (!f) return st ? st->code : SD_ERR_SYS;
    // The buffer is the file's size (refused above INDEX_MAX_BYTES before anything is allocated),
    // plus one byte to see a file that grew since.
    struct stat sb;
    if (fstat(fileno(f), &sb) != 0) {
        fclose(f);
        return sd_fail(st, SD_ERR_SYS, "%s: fstat: %s", path, strerror(errno));
    }
    if ((uint64_t)sb.st_size > INDEX_MAX_BYTES) {
        fclose(f);
        return sd_fail(st, SD_ERR_DATA, "%s: larger than %u bytes", path, INDEX_MAX_BYTES);
    }
    const size_t cap = (size_t)sb.st_size + 1;
    char *buf = malloc(cap + 1);
    size_t n = buf ? fread(buf, 1, cap, f) : 0;
    bool err = ferror(f);
    fclose(f);
    if (!buf) return sd_fail(st, SD_ERR_SYS, "%s: out of memory", path);
    if (err) { free(buf); return sd_fail(st, SD_ERR_SYS, "%s: read error", path); }
    if (n == cap) { free(buf); return sd_fail(st, SD_ERR_DATA, "%s: changed while it was read", path); }
    buf[n] = '\0';
    if (strlen(buf) != n) { free(buf); return sd_fail(st, SD_ERR_DATA, "%s: holds a NUL byte", path); }
    *out = buf;
    *len = n;
    return SD_OK;
}

// A shard is a plain file name beside the index: no folder part, never "." or "..".
static bool plain_name(const char *s) {
    return s[0] && !strchr(s, '/') && strcmp(s, ".") && strcmp(s, "..");
}

// Parse the index into pairs (sorted, each tensor once). *doc owns the strings.
static sd_code parse_index(const char *path, cJSON **doc, index_pair **pairs, int *n_pairs, sd_status *st) {
    char *text = NULL;
    size_t len = 0;
    SD_TRY(read_text(path, &text, &len, st));
    cJSON *root = cJSON_ParseWithOpts(text, NULL, true); // text is NUL-terminated and holds no other NUL
    free(text);
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return sd_fail(st, SD_ERR_DATA, "%s: not a JSON object", path);
    }
    const cJSON *map = cJSON_GetObjectItemCaseSensitive(root, "weight_map");
    if (!cJSON_IsObject(map)) {
        cJSON_Delete(root);
        return sd_fail(st, SD_ERR_DATA, "%s: key 'weight_map': must be an object of tensor name -> shard file", path);
    }
    int n = cJSON_GetArraySize(map);
    if (n == 0) {
        cJSON_Delete(root);
        return sd_fail(st, SD_ERR_DATA, "%s: key 'weight_map': names no tensor", path);
    }
    index_pair *p = malloc((size_t)(n ? n : 1) * sizeof *p);
    if (!p) { cJSON_Delete(root); return sd_fail(st, SD_ERR_SYS, "%s: out of memory", path); }
    int i = 0;
    sd_code rc = SD_OK;
    const cJSON *kv;
    cJSON_ArrayForEach(kv, map) {
        if (!cJSON_IsString(kv) || !plain_name(kv->valuestring)) {
            rc = sd_fail(st, SD_ERR_DATA, "%s: weight_map: tensor '%s': the shard must be a file name beside the index", path, kv->string);
            break;
        }
        p[i++] = (index_pair){kv->string, kv->valuestring};
    }
    if (!rc) qsort(p, (size_t)n, sizeof *p, cmp_pair);
    for (int j = 1; j < n && !rc; j++)
        if (strcmp(p[j - 1].tensor, p[j].tensor) == 0)
            rc = sd_fail(st, SD_ERR_DATA, "%s: weight_map names tensor '%s' twice", path, p[j].tensor);
    if (rc) { free(p); cJSON_Delete(root); return rc; }
    *doc = root;
    *pairs = p;
    *n_pairs = n;
    return SD_OK;
}

// ---------------------------------------------------------------------------------------------
// opening

static sd_code add_shard(sd_checkpoint *c, const char *name, sd_status *st) {
    sd_ckpt_shard *s = &c->shards[c->n_shards];
    memset(s, 0, sizeof *s);
    s->name = strdup(name);
    s->path = join(c->dir, name);
    if (!s->name || !s->path) {
        free(s->name);
        free(s->path);
        return sd_fail(st, SD_ERR_SYS, "%s: out of memory", c->dir);
    }
    c->n_shards++;
    return sd_st_open(s->path, &s->file, st);
}

// Every tensor of every shard, sorted by name; a name in two shards is refused.
static sd_code build_entries(sd_checkpoint *c, sd_status *st) {
    size_t n = 0;
    for (int i = 0; i < c->n_shards; i++) n += (size_t)c->shards[i].file.n;
    c->entries = malloc((n ? n : 1) * sizeof *c->entries);
    if (!c->entries) return sd_fail(st, SD_ERR_SYS, "%s: out of memory for %zu tensors", c->dir, n);
    for (int i = 0; i < c->n_shards; i++)
        for (int j = 0; j < c->shards[i].file.n; j++) c->entries[c->n++] = (sd_ckpt_entry){&c->shards[i].file.tensors[j], i};
    qsort(c->entries, (size_t)c->n, sizeof *c->entries, cmp_entry);
    for (int i = 1; i < c->n; i++) {
        const sd_ckpt_entry *a = &c->entries[i - 1], *b = &c->entries[i];
        if (strcmp(a->tensor->name, b->tensor->name) == 0)
            return sd_fail(st, SD_ERR_DATA, "%s: tensor '%s' is in two shards, %s and %s", c->index_path ? c->index_path : c->dir,
                           b->tensor->name, c->shards[a->shard].name, c->shards[b->shard].name);
    }
    return SD_OK;
}

// The index and the shards say the same: the two sorted lists are merged name by name.
static sd_code check_index(const sd_checkpoint *c, const index_pair *p, int n_pairs, sd_status *st) {
    const char *ix = c->index_path;
    int i = 0, j = 0;
    while (i < n_pairs || j < c->n) {
        int cmp = i == n_pairs ? 1 : j == c->n ? -1 : strcmp(p[i].tensor, c->entries[j].tensor->name);
        if (cmp < 0)
            return sd_fail(st, SD_ERR_DATA, "%s: tensor '%s' is not in its shard %s", ix, p[i].tensor, p[i].shard);
        const sd_ckpt_shard *holder = &c->shards[c->entries[j].shard];
        if (cmp > 0)
            return sd_fail(st, SD_ERR_DATA, "%s: shard %s holds tensor '%s', which the index does not name", ix, holder->name,
                           c->entries[j].tensor->name);
        if (strcmp(p[i].shard, holder->name) != 0)
            return sd_fail(st, SD_ERR_DATA, "%s: tensor '%s' is not in its shard %s (it is in %s)", ix, p[i].tensor, p[i].shard,
                           holder->name);
        i++, j++;
    }
    return SD_OK;
}

static sd_code open_sharded(sd_checkpoint *c, sd_status *st) {
    cJSON *doc = NULL;
    index_pair *p = NULL;
    int n = 0;
    SD_TRY(parse_index(c->index_path, &doc, &p, &n, st));
    // The shard files, each once, in name order.
    const char **names = malloc((size_t)(n ? n : 1) * sizeof *names);
    c->shards = calloc((size_t)(n ? n : 1), sizeof *c->shards);
    sd_code rc = names && c->shards ? SD_OK : sd_fail(st, SD_ERR_SYS, "%s: out of memory", c->index_path);
    int n_names = 0;
    for (int i = 0; i < n && !rc; i++) names[n_names++] = p[i].shard;
    if (!rc) qsort(names, (size_t)n_names, sizeof *names, cmp_str_ptr);
    for (int i = 0; i < n_names && !rc; i++) {
        if (i > 0 && strcmp(names[i - 1], names[i]) == 0) continue;
        char *path = join(c->dir, names[i]);
        if (path && !exists(path)) {
            const char *tensor = NULL;
            for (int k = 0; k < n && !tensor; k++) if (strcmp(p[k].shard, names[i]) == 0) tensor = p[k].tensor;
            rc = sd_fail(st, SD_ERR_DATA, "%s: shard %s (of tensor '%s') is missing: %s: %s", c->index_path, names[i], tensor,
                         path, strerror(errno));
        }
        free(path);
        if (!rc) rc = add_shard(c, names[i], st);
    }
    if (!rc) rc = build_entries(c, st);
    if (!rc) rc = check_index(c, p, n, st);
    free(names);
    free(p);
    cJSON_Delete(doc);
    return rc;
}

sd_code sd_ckpt_open(const char *dir, sd_checkpoint *c, sd_status *st) {
    memset(c, 0, sizeof *c);
    c->dir = strdup(dir);
    char *single = join(dir, SD_CKPT_SINGLE), *index = join(dir, SD_CKPT_INDEX);
    sd_code rc = c->dir && single && index ? SD_OK : sd_fail(st, SD_ERR_SYS, "%s: out of memory", dir);
    bool has_single = !rc && exists(single), has_index = !rc && exists(index);
    if (!rc && has_single && has_index)
        rc = sd_fail(st, SD_ERR_DATA, "%s: holds both %s and %s: which one is the model is unclear; remove one", dir,
                     SD_CKPT_SINGLE, SD_CKPT_INDEX);
    else if (!rc && !has_single && !has_index)
        rc = sd_fail(st, SD_ERR_SYS, "%s: open: %s (and no %s beside it)", single, strerror(ENOENT), SD_CKPT_INDEX);
    else if (!rc && has_index) {
        c->index_path = index;
        index = NULL;
        rc = open_sharded(c, st);
    } else if (!rc) {
        c->shards = calloc(1, sizeof *c->shards);
        rc = c->shards ? add_shard(c, SD_CKPT_SINGLE, st) : sd_fail(st, SD_ERR_SYS, "%s: out of memory", dir);
        if (!rc) rc = build_entries(c, st);
    }
    free(single);
    free(index);
    if (rc) sd_ckpt_close(c);
    return rc;
}

int sd_ckpt_find_index(const sd_checkpoint *c, const char *name) {
    int lo = 0, hi = c->n - 1;
    while (lo <= hi) {
        int mid = lo + (hi - lo) / 2, cmp = strcmp(name, c->entries[mid].tensor->name);
        if (cmp == 0) return mid;
        if (cmp < 0) hi = mid - 1;
        else lo = mid + 1;
    }
    return -1;
}

const sd_st_tensor *sd_ckpt_find(const sd_checkpoint *c, const char *name, const char **shard_path) {
    int i = sd_ckpt_find_index(c, name);
    if (i < 0) return NULL;
    if (shard_path) *shard_path = c->shards[c->entries[i].shard].path;
    return c->entries[i].tensor;
}

void sd_ckpt_close(sd_checkpoint *c) {
    for (int i = 0; i < c->n_shards; i++) {
        sd_st_close(&c->shards[i].file);
        free(c->shards[i].name);
        free(c->shards[i].path);
    }
    free(c->shards);
    free(c->entries);
    free(c->index_path);
    free(c->dir);
    memset(c, 0, sizeof *c);
}

// ---------------------------------------------------------------------------------------------
// the digest

sd_code sd_ckpt_digest(const sd_checkpoint *c, char hex[65], sd_status *st) {
    hex[0] = '\0';
    if (!c->index_path) return sd_sha256_file(c->shards[0].path, hex, st);
    // "<sha256>  <name>\n" per shard in name order, then the index's line.
    size_t cap = 0;
    for (int i = 0; i < c->n_shards; i++) cap += 64 + 2 + strlen(c->shards[i].name) + 1;
    cap += 64 + 2 + strlen(SD_CKPT_INDEX) + 2;
    char *manifest = malloc(cap), file_hex[65];
    if (!manifest) return sd_fail(st, SD_ERR_SYS, "%s: out of memory", c->dir);
    size_t len = 0;
    for (int i = 0; i <= c->n_shards; i++) {
        const char *path = i < c->n_shards ? c->shards[i].path : c->index_path;
        const char *name = i < c->n_shards ? c->shards[i].name : SD_CKPT_INDEX;
        sd_code rc = sd_sha256_file(path, file_hex, st);
        if (rc) { free(manifest); return rc; }
        len += (size_t)snprintf(manifest + len, cap - len, "%s  %s\n", file_hex, name);
    }
    sd_sha256_buf(manifest, len, hex);
    free(manifest);
    return hex[0] ? SD_OK : sd_fail(st, SD_ERR_SYS, "%s: sha256: OpenSSL failure", c->dir);
}
