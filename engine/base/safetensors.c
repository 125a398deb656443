// safetensors.c — reader (mmap, header parsed with cJSON, every field validated before use) and
// writer (to a stream; to a path through atomic_file.h: temporary, fsync, rename).
//
// Alignment: a tensor's bytes start at map + 8 + N + begin. The format puts no alignment rule on
// the header length N or on begin (our writer pads N to a multiple of 8, other writers may not),
// so a reader's data pointer may be unaligned for its dtype. Consumers copy or convert through
// memcpy; they never cast it to float * (or any wider type) and dereference it.
//
// The mapping is read-only and private: a file truncated by another process while it is mapped
// raises SIGBUS on access, which no validation at open time can rule out.
#include "safetensors.h"
#include "file_open.h" // sd_open_regular
#include "atomic_file.h" // sd_atomic_open, sd_atomic_commit, sd_atomic_abort
#include <cjson/cJSON.h> // cJSON_ParseWithLengthOpts, cJSON_PrintUnformatted
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define METADATA_KEY "__metadata__"
#define JSON_MAX_EXACT_INT 9007199254740992.0 // 2^53: cJSON parses every number to a double

// ---------------------------------------------------------------------------------------------
// dtypes and sizes

static bool dtype_parse(const char *s, sd_dtype *out) {
    for (int i = SD_DT_F32; i <= SD_DT_I64; i++) {
        if (strcmp(s, sd_dtype_name((sd_dtype)i)) == 0) {
            *out = (sd_dtype)i;
            return true;
        }
    }
    return false;
}

// The dtypes of the format (the reference library's list) that specdec does not read: a file
// holding one is valid safetensors, so it is named as unsupported, not as unknown.
static bool dtype_unsupported(const char *s) {
    static const char *const names[] = {"BOOL", "U8",  "I8",  "F8_E5M2", "F8_E4M3", "F8_E8M0", "I16",     "U16",
                                        "U32",  "U64", "C64", "F4",      "F6_E2M3", "F6_E3M2", "F8_E4M3FNUZ", "F8_E5M2FNUZ"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (strcmp(s, names[i]) == 0) return true;
    return false;
}

// Π shape; false if a dim is negative or the product overflows int64. A zero dim gives 0 whatever
// the other dims are.
static bool numel_checked(const int64_t *shape, int ndim, int64_t *out) {
    for (int i = 0; i < ndim; i++)
        if (shape[i] < 0) return false;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] == 0) {
            *out = 0;
            return true;
        }
    }
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) {
        if (n > INT64_MAX / shape[i]) return false;
        n *= shape[i];
    }
    *out = n;
    return true;
}

// Bytes a tensor of this dtype and shape occupies; false if the dtype is unknown, the shape
// invalid or the size does not fit in size_t.
static bool tensor_bytes(sd_dtype dt, const int64_t *shape, int ndim, size_t *out) {
    size_t esize = sd_dtype_size(dt);
    int64_t numel;
    if (esize == 0 || ndim < 0 || ndim > SD_ST_MAX_DIMS || !numel_checked(shape, ndim, &numel))
        return false;
    if ((uint64_t)numel > SIZE_MAX / esize) return false;
    *out = (size_t)numel * esize;
    return true;
}

// -1 if the shape is negative or its product overflows (never for a tensor sd_st_open returned).
int64_t sd_st_numel(const sd_st_tensor *t) {
    int64_t n;
    if (t->ndim < 0 || t->ndim > SD_ST_MAX_DIMS || !numel_checked(t->shape, t->ndim, &n)) return -1;
    return n;
}

// ---------------------------------------------------------------------------------------------
// checks shared by the reader and the writer

static int cmp_name_ptr(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

// SD_ERR_DATA naming the first name (in sorted order) that appears twice.
static sd_code check_unique_names(const char *path, const sd_st_tensor *t, int n, sd_status *st) {
    if (n < 2) return SD_OK;
    const char **names = malloc((size_t)n * sizeof *names);
    if (!names) return sd_fail(st, SD_ERR_SYS, "%s: out of memory checking tensor names", path);
    for (int i = 0; i < n; i++) names[i] = t[i].name;
    qsort(names, (size_t)n, sizeof *names, cmp_name_ptr);
    sd_code code = SD_OK;
    for (int i = 1; i < n && code == SD_OK; i++) {
        if (strcmp(names[i - 1], names[i]) == 0)
            code = sd_fail(st, SD_ERR_DATA, "%s: duplicate tensor name '%s'", path, names[i]);
    }
    free(names);
    return code;
}

// ---------------------------------------------------------------------------------------------
// reader

static uint64_t read_u64_le(const unsigned char *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = v << 8 | p[i];
    return v;
}

// A JSON number holding a non-negative integer no larger than 2^53 (the range a double holds
// exactly). A value written as 8.0 passes: cJSON does not tell it from 8.
static bool json_get_uint(const cJSON *j, uint64_t *out) {
    if (!cJSON_IsNumber(j)) return false;
    double d = j->valuedouble;
    if (!(d >= 0 && d <= JSON_MAX_EXACT_INT)) return false; // also rejects NaN
    if (d != (double)(uint64_t)d) return false;
    *out = (uint64_t)d;
    return true;
}

static sd_code map_file(const char *path, sd_st_file *f, sd_status *st) {
    int fd = sd_open_regular(path, st); // a FIFO must not block the open
    if (fd < 0) return st ? st->code : SD_ERR_SYS;
    struct stat sb;
    sd_code code = SD_OK;
    if (fstat(fd, &sb) != 0) {
        code = sd_fail(st, SD_ERR_SYS, "%s: fstat: %s", path, strerror(errno));
    } else if (!S_ISREG(sb.st_mode)) {
        code = sd_fail(st, SD_ERR_DATA, "%s: not a regular file", path);
    } else if (sb.st_size < 8) {
        code = sd_fail(st, SD_ERR_DATA, "%s: file is %lld bytes, shorter than the 8-byte header length",
                       path, (long long)sb.st_size);
    } else {
        void *map = mmap(NULL, (size_t)sb.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (map == MAP_FAILED) {
            code = sd_fail(st, SD_ERR_SYS, "%s: mmap: %s", path, strerror(errno));
        } else {
            f->map = map;
            f->size = (size_t)sb.st_size;
        }
    }
    close(fd);
    return code;
}

static bool is_json_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

// Parse the header into a JSON object. cJSON 1.7.15 reads one byte past a length-bounded buffer
// on some inputs (DaveGamble/cJSON#800, fixed in 1.7.17), so it parses a NUL-terminated copy,
// never the mapping itself. Only JSON whitespace (the writers' padding) may follow the object.
static sd_code parse_json(const char *path, const char *hdr, size_t len, cJSON **out, sd_status *st) {
    char *copy = malloc(len + 1);
    if (!copy) return sd_fail(st, SD_ERR_SYS, "%s: out of memory for a %zu-byte header", path, len);
    memcpy(copy, hdr, len);
    copy[len] = '\0';
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(copy, len, &end, 0);
    size_t at = end ? (size_t)(end - copy) : 0;
    while (root && at < len && is_json_space(copy[at])) at++;
    free(copy);
    if (!root || at < len) {
        cJSON_Delete(root);
        return sd_fail(st, SD_ERR_DATA, "%s: header is not valid JSON (at byte %zu of %zu)", path, at, len);
    }
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return sd_fail(st, SD_ERR_DATA, "%s: header is not a JSON object", path);
    }
    *out = root;
    return SD_OK;
}

static sd_code check_metadata(const char *path, const cJSON *m, sd_status *st) {
    if (!cJSON_IsObject(m)) return sd_fail(st, SD_ERR_DATA, "%s: " METADATA_KEY " is not an object", path);
    const cJSON *kv;
    cJSON_ArrayForEach(kv, m) {
        if (!cJSON_IsString(kv))
            return sd_fail(st, SD_ERR_DATA, "%s: " METADATA_KEY " value '%s' is not a string", path, kv->string);
    }
    return SD_OK;
}

static sd_code parse_shape(const char *path, const cJSON *j, sd_st_tensor *t, sd_status *st) {
    if (!cJSON_IsArray(j))
        return sd_fail(st, SD_ERR_DATA, "%s: tensor '%s': shape is missing or not an array", path, t->name);
    int ndim = cJSON_GetArraySize(j);
    if (ndim > SD_ST_MAX_DIMS)
        return sd_fail(st, SD_ERR_DATA, "%s: tensor '%s': shape has %d dims, more than %d", path,
                       t->name, ndim, SD_ST_MAX_DIMS);
    int i = 0;
    const cJSON *d;
    cJSON_ArrayForEach(d, j) {
        uint64_t v;
        if (!json_get_uint(d, &v))
            return sd_fail(st, SD_ERR_DATA, "%s: tensor '%s': shape[%d] is not a non-negative integer",
                           path, t->name, i);
        t->shape[i++] = (int64_t)v;
    }
    t->ndim = ndim;
    return SD_OK;
}

static sd_code parse_offsets(const char *path, const cJSON *j, size_t data_size, const sd_st_tensor *t,
                             uint64_t *begin, uint64_t *end, sd_status *st) {
    if (!cJSON_IsArray(j) || cJSON_GetArraySize(j) != 2 || !json_get_uint(j->child, begin) ||
        !json_get_uint(j->child->next, end))
        return sd_fail(st, SD_ERR_DATA, "%s: tensor '%s': data_offsets is not two non-negative integers",
                       path, t->name);
    if (*begin > *end)
        return sd_fail(st, SD_ERR_DATA, "%s: tensor '%s': data_offsets begin %" PRIu64 " > end %" PRIu64,
                       path, t->name, *begin, *end);
    if (*end > data_size)
        return sd_fail(st, SD_ERR_DATA,
                       "%s: tensor '%s': data_offsets end %" PRIu64 " is beyond the data section (%zu bytes)",
                       path, t->name, *end, data_size);
    return SD_OK;
}

// Fill t (whose name is already set) from its header entry; data points into the data section.
static sd_code parse_entry(const char *path, const cJSON *e, const char *data, size_t data_size,
                           sd_st_tensor *t, sd_status *st) {
    if (!cJSON_IsObject(e))
        return sd_fail(st, SD_ERR_DATA, "%s: tensor '%s': entry is not an object", path, t->name);
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(e, "dtype");
    if (!cJSON_IsString(dt))
        return sd_fail(st, SD_ERR_DATA, "%s: tensor '%s': dtype is missing or not a string", path, t->name);
    if (!dtype_parse(dt->valuestring, &t->dtype) && dtype_unsupported(dt->valuestring))
        return sd_fail(st, SD_ERR_DATA, "%s: dtype %s of tensor '%s' is not supported (specdec reads F32, BF16, "
                       "F16, F64, I32, I64)", path, dt->valuestring, t->name);
    if (!dtype_parse(dt->valuestring, &t->dtype))
        return sd_fail(st, SD_ERR_DATA, "%s: tensor '%s': unknown dtype '%s'", path, t->name, dt->valuestring);
    sd_code code = parse_shape(path, cJSON_GetObjectItemCaseSensitive(e, "shape"), t, st);
    if (code) return code;
    uint64_t begin = 0, end = 0;
    code = parse_offsets(path, cJSON_GetObjectItemCaseSensitive(e, "data_offsets"), data_size, t, &begin,
                         &end, st);
    if (code) return code;
    size_t need;
    if (!tensor_bytes(t->dtype, t->shape, t->ndim, &need))
        return sd_fail(st, SD_ERR_DATA, "%s: tensor '%s': element count of the shape overflows", path, t->name);
    if (need != end - begin)
        return sd_fail(st, SD_ERR_DATA, "%s: tensor '%s': data_offsets span %" PRIu64 " bytes, %s x shape needs %zu",
                       path, t->name, end - begin, sd_dtype_name(t->dtype), need);
    t->data = data + begin;
    t->nbytes = need;
    return SD_OK;
}

static bool is_metadata(const cJSON *e) { return strcmp(e->string, METADATA_KEY) == 0; }

// Build f->tensors (in header order) from the header object. The entries are counted first and
// one block, allocated once, holds the tensor array followed by the names it points into (so
// the table never grows, and sd_st_close frees it with one call).
static sd_code parse_tensors(const char *path, const cJSON *root, const char *data, size_t data_size,
                             sd_st_file *f, sd_status *st) {
    int n = 0, n_meta = 0;
    size_t name_bytes = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, root) {
        if (is_metadata(e)) {
            if (++n_meta > 1) return sd_fail(st, SD_ERR_DATA, "%s: duplicate " METADATA_KEY, path);
            sd_code code = check_metadata(path, e, st);
            if (code) return code;
            continue;
        }
        n++;
        name_bytes += strlen(e->string) + 1;
    }
    if (n == 0) return SD_OK;
    if ((unsigned)n > SD_ST_MAX_TENSORS)
        return sd_fail(st, SD_ERR_DATA, "%s: header lists %d tensors, more than the limit of %u", path, n, SD_ST_MAX_TENSORS);
    f->tensors = calloc(1, (size_t)n * sizeof *f->tensors + name_bytes);
    if (!f->tensors) return sd_fail(st, SD_ERR_SYS, "%s: out of memory for %d tensors", path, n);
    char *names = (char *)(f->tensors + n);
    int i = 0;
    cJSON_ArrayForEach(e, root) {
        if (is_metadata(e)) continue;
        sd_st_tensor *t = &f->tensors[i++];
        size_t len = strlen(e->string) + 1;
        t->name = memcpy(names, e->string, len);
        names += len;
        sd_code code = parse_entry(path, e, data, data_size, t, st);
        if (code) return code;
    }
    f->n = n;
    return SD_OK;
}

// By data offset, then size (a zero-size tensor sorts before the one that starts where it
// sits), then name, so the order is the same on every run.
static int cmp_offset(const void *a, const void *b) {
    const sd_st_tensor *x = a, *y = b;
    uintptr_t px = (uintptr_t)x->data, py = (uintptr_t)y->data;
    if (px != py) return px < py ? -1 : 1;
    if (x->nbytes != y->nbytes) return x->nbytes < y->nbytes ? -1 : 1;
    return strcmp(x->name, y->name);
}

// The reference library's rule: sorted by begin, the tensors tile the data section — the
// first starts at 0, each starts where the one before it ends, the last ends at the end of the
// file. A gap, an overlap or bytes after the last tensor are refused.
static sd_code sort_and_check_tiling(const char *path, sd_st_file *f, const char *data, size_t data_size,
                                     sd_status *st) {
    if (f->n > 1) qsort(f->tensors, (size_t)f->n, sizeof *f->tensors, cmp_offset);
    const char *at = data;
    for (int i = 0; i < f->n; i++) {
        const sd_st_tensor *cur = &f->tensors[i];
        const char *start = cur->data;
        if (start < at)
            return sd_fail(st, SD_ERR_DATA, "%s: tensors '%s' and '%s' overlap", path, f->tensors[i - 1].name, cur->name);
        if (start > at)
            return sd_fail(st, SD_ERR_DATA, "%s: tensor '%s' starts at byte %zu of the data section, %zu bytes after "
                           "the end of the tensor before it (a gap)", path, cur->name, (size_t)(start - data),
                           (size_t)(start - at));
        at = start + cur->nbytes;
    }
    size_t covered = (size_t)(at - data);
    if (covered != data_size)
        return sd_fail(st, SD_ERR_DATA, "%s: file not fully covered: the tensors end at byte %zu of the data section, "
                       "%zu bytes before the end of the file", path, covered, data_size - covered);
    return SD_OK;
}

// One pass over the header text before any parse allocates: counts the top-level members
// (tensors and __metadata__: one ':' each at depth 1) and refuses a string holding a NUL —
// raw or as the escape \u0000 — or any other raw control byte (JSON allows none). cJSON's keys
// are C strings, so a name "a\u0000b" would otherwise be read as "a"; after this pass every
// name's length is its strlen and strcmp compares names exactly.
static sd_code prescan_header(const char *path, const char *hdr, size_t len, size_t *members, sd_status *st) {
    size_t n = 0;
    int depth = 0;
    bool in_str = false;
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)hdr[i];
        if (in_str) {
            if (c < 0x20)
                return sd_fail(st, SD_ERR_DATA, "%s: header string holds the control byte 0x%02x at byte %zu", path, c, i);
            if (c == '\\' && i + 1 < len) {
                if (hdr[i + 1] == 'u' && i + 5 < len && memcmp(hdr + i + 2, "0000", 4) == 0)
                    return sd_fail(st, SD_ERR_DATA, "%s: header string holds a NUL (\\u0000) at byte %zu", path, i);
                i++; // the escaped character cannot end the string
            } else if (c == '"') {
                in_str = false;
            }
            continue;
        }
        if (c == '"') in_str = true;
        else if (c == '{' || c == '[') depth++;
        else if (c == '}' || c == ']') depth--;
        else if (c == ':' && depth == 1) n++;
        else if (c == 0) return sd_fail(st, SD_ERR_DATA, "%s: header holds a NUL byte at byte %zu", path, i);
    }
    *members = n;
    return SD_OK;
}

// The tensor count is bounded before cJSON builds its tree (several hundred bytes of nodes per
// entry): by the header's size (an entry takes at least SD_ST_MIN_ENTRY_BYTES of text) and by
// SD_ST_MAX_TENSORS, so a header of a million empty entries is refused without building it.
static sd_code check_tensor_count(const char *path, size_t members, size_t hlen, sd_status *st) {
    size_t tensors = members > 0 ? members - 1 : 0; // one member may be __metadata__
    if (tensors > SD_ST_MAX_TENSORS)
        return sd_fail(st, SD_ERR_DATA, "%s: header lists %zu tensors, more than the limit of %u", path, tensors,
                       SD_ST_MAX_TENSORS);
    if (tensors > hlen / SD_ST_MIN_ENTRY_BYTES + 1)
        return sd_fail(st, SD_ERR_DATA, "%s: header of %zu bytes cannot hold %zu tensor entries", path, hlen, tensors);
    return SD_OK;
}

static sd_code parse_file(const char *path, sd_st_file *f, sd_status *st) {
    uint64_t hlen = read_u64_le(f->map);
    if (hlen == 0) return sd_fail(st, SD_ERR_DATA, "%s: header length is 0", path);
    if (hlen > SD_ST_MAX_HEADER)
        return sd_fail(st, SD_ERR_DATA, "%s: header length %" PRIu64 " exceeds the limit of %u bytes", path,
                       hlen, SD_ST_MAX_HEADER);
    if (hlen > f->size - 8)
        return sd_fail(st, SD_ERR_DATA, "%s: header length %" PRIu64 " runs past the end of the file (%zu bytes)",
                       path, hlen, f->size);
    const char *hdr = (const char *)f->map + 8;
    size_t members = 0;
    sd_code code = prescan_header(path, hdr, (size_t)hlen, &members, st);
    if (!code) code = check_tensor_count(path, members, (size_t)hlen, st);
    if (code) return code;
    cJSON *root = NULL;
    code = parse_json(path, hdr, (size_t)hlen, &root, st);
    if (code) return code;
    const char *data = hdr + hlen;
    const size_t data_size = f->size - 8 - (size_t)hlen;
    code = parse_tensors(path, root, data, data_size, f, st);
    cJSON_Delete(root);
    if (code) return code;
    code = check_unique_names(path, f->tensors, f->n, st);
    if (code) return code;
    return sort_and_check_tiling(path, f, data, data_size, st);
}

// Names and dtype strings from a file may hold control bytes; the message stays one line.
static void keep_one_line(sd_status *st) {
    if (!st) return;
    for (char *c = st->msg; *c; c++)
        if ((unsigned char)*c < 0x20 || *c == 0x7f) *c = '?';
}

sd_code sd_st_open(const char *path, sd_st_file *f, sd_status *st) {
    memset(f, 0, sizeof *f);
    sd_code code = map_file(path, f, st);
    if (!code) code = parse_file(path, f, st);
    if (code) {
        sd_st_close(f);
        keep_one_line(st);
    }
    return code;
}

const sd_st_tensor *sd_st_find(const sd_st_file *f, const char *name) {
    for (int i = 0; i < f->n; i++)
        if (strcmp(f->tensors[i].name, name) == 0) return &f->tensors[i];
    return NULL;
}

void sd_st_close(sd_st_file *f) {
    if (f->map) munmap(f->map, f->size);
    free(f->tensors);
    memset(f, 0, sizeof *f);
}

// ---------------------------------------------------------------------------------------------
// writer

static sd_code check_write_input(const char *path, const sd_st_tensor *t, int n, sd_status *st) {
    if (n < 0 || (n > 0 && !t)) return sd_fail(st, SD_ERR_DATA, "%s: invalid tensor list (n = %d)", path, n);
    for (int i = 0; i < n; i++) {
        const char *name = t[i].name;
        size_t need;
        if (!name || strcmp(name, METADATA_KEY) == 0)
            return sd_fail(st, SD_ERR_DATA, "%s: tensor %d: missing or reserved name", path, i);
        if (!tensor_bytes(t[i].dtype, t[i].shape, t[i].ndim, &need))
            return sd_fail(st, SD_ERR_DATA, "%s: tensor '%s': invalid dtype, ndim or shape", path, name);
        if (need != t[i].nbytes)
            return sd_fail(st, SD_ERR_DATA, "%s: tensor '%s': nbytes %zu, %s x shape needs %zu", path, name,
                           t[i].nbytes, sd_dtype_name(t[i].dtype), need);
        if (need > 0 && !t[i].data) return sd_fail(st, SD_ERR_DATA, "%s: tensor '%s': data is NULL", path, name);
    }
    return check_unique_names(path, t, n, st);
}

// Add item to parent (an array when key is NULL); on failure item is freed and false returned,
// so a chain of adds either builds the whole tree or leaks nothing.
static bool json_add(cJSON *parent, const char *key, cJSON *item) {
    bool ok = item && parent && (key ? cJSON_AddItemToObject(parent, key, item) : cJSON_AddItemToArray(parent, item));
    if (!ok) cJSON_Delete(item);
    return ok;
}

// Integers are written as raw digits: exact for every uint64, never an exponent.
static cJSON *json_new_uint(uint64_t v) {
    char buf[24];
    snprintf(buf, sizeof buf, "%" PRIu64, v);
    return cJSON_CreateRaw(buf);
}

static cJSON *tensor_entry(const sd_st_tensor *t, uint64_t begin) {
    cJSON *e = cJSON_CreateObject(), *shape = cJSON_CreateArray(), *offs = cJSON_CreateArray();
    bool ok = json_add(e, "dtype", cJSON_CreateString(sd_dtype_name(t->dtype)));
    for (int i = 0; i < t->ndim; i++) ok &= json_add(shape, NULL, json_new_uint((uint64_t)t->shape[i]));
    ok &= json_add(offs, NULL, json_new_uint(begin));
    ok &= json_add(offs, NULL, json_new_uint(begin + t->nbytes));
    ok &= json_add(e, "shape", shape);
    ok &= json_add(e, "data_offsets", offs);
    if (!ok) {
        cJSON_Delete(e);
        return NULL;
    }
    return e;
}

// The header text padded with spaces to a multiple of 8 bytes, so data starts 8-aligned.
static sd_code build_header(const char *path, const sd_st_tensor *t, int n, char **out, size_t *out_len,
                            sd_status *st) {
    cJSON *root = cJSON_CreateObject(), *meta = cJSON_CreateObject();
    bool ok = json_add(meta, "format", cJSON_CreateString("pt"));
    ok &= json_add(root, METADATA_KEY, meta);
    uint64_t offset = 0;
    for (int i = 0; i < n && ok; i++) {
        ok = json_add(root, t[i].name, tensor_entry(&t[i], offset));
        offset += t[i].nbytes;
    }
    char *text = ok ? cJSON_PrintUnformatted(root) : NULL;
    cJSON_Delete(root);
    if (!text) return sd_fail(st, SD_ERR_SYS, "%s: out of memory building the header", path);
    size_t len = strlen(text), padded = (len + 7) & ~(size_t)7;
    char *hdr = padded <= SD_ST_MAX_HEADER ? malloc(padded) : NULL;
    if (hdr) {
        memcpy(hdr, text, len);
        memset(hdr + len, ' ', padded - len);
    }
    cJSON_free(text);
    if (!hdr) return sd_fail(st, SD_ERR_DATA, "%s: cannot hold a %zu-byte header", path, padded);
    *out = hdr;
    *out_len = padded;
    return SD_OK;
}

#define WRITE_CHUNK_BYTES ((size_t)64 << 20) // progress is reported at least this often

static bool write_body(FILE *f, const char *hdr, size_t hlen, const sd_st_tensor *t, int n, sd_st_progress *p) {
    unsigned char len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (unsigned char)((uint64_t)hlen >> (8 * i));
    if (fwrite(len8, 1, sizeof len8, f) != sizeof len8 || fwrite(hdr, 1, hlen, f) != hlen) return false;
    for (int i = 0; i < n; i++) {
        const char *data = t[i].data;
        for (size_t off = 0; off < t[i].nbytes; off += WRITE_CHUNK_BYTES) {
            size_t len = t[i].nbytes - off < WRITE_CHUNK_BYTES ? t[i].nbytes - off : WRITE_CHUNK_BYTES;
            if (fwrite(data + off, 1, len, f) != len) return false;
            if (p && p->report) {
                p->done += len;
                p->report(p->ctx, p->done, p->total);
            }
        }
    }
    return true;
}

size_t sd_st_file_bytes_bound(const sd_st_tensor *t, int n) {
    size_t bytes = 8 + 64; // the length field, "__metadata__" and padding
    for (int i = 0; i < n; i++) bytes += t[i].nbytes + strlen(t[i].name) + 64 + 24 * (size_t)(t[i].ndim + 2);
    return bytes;
}

sd_code sd_st_write_stream(FILE *f, const char *path, const sd_st_tensor *tensors, int n, sd_st_progress *p,
                           sd_status *st) {
    sd_code code = check_write_input(path, tensors, n, st);
    if (code) return code;
    char *hdr = NULL;
    size_t hlen = 0;
    code = build_header(path, tensors, n, &hdr, &hlen, st);
    if (code) return code;
    if (!write_body(f, hdr, hlen, tensors, n, p)) code = sd_fail(st, SD_ERR_SYS, "%s: write: %s", path, strerror(errno));
    free(hdr);
    return code;
}

sd_code sd_st_write(const char *path, const sd_st_tensor *tensors, int n, sd_status *st) {
    sd_code code = check_write_input(path, tensors, n, st); // before a temporary exists
    if (code) return code;
    sd_atomic_file a;
    SD_TRY(sd_atomic_open(&a, path, st));
    code = sd_st_write_stream(a.f, path, tensors, n, NULL, st);
    if (code) {
        sd_atomic_abort(&a);
        return code;
    }
    return sd_atomic_commit(&a, st);
}
