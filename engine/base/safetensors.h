// safetensors.h — reader (mmap, header parsed with cJSON, everything validated before use)
// and atomic writer of the safetensors format: u64 little-endian header length N, N bytes of
// JSON header {name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__": {...}}, data.
#pragma once
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include "status.h" // sd_status
#include "tensor.h" // sd_dtype

#define SD_ST_MAX_DIMS 8
#define SD_ST_MAX_HEADER (100u << 20) // the format's own 100 MB header bound
// Our bound on the tensors of one file, checked before the header is parsed: far above any
// published file (a whole 671B-parameter checkpoint holds about 10^5 tensors, one of its
// shards a few thousand), far below what would make the parsed header take gigabytes.
#define SD_ST_MAX_TENSORS (1u << 18)
// The shortest text a tensor entry can take: "":{"dtype":"I8","shape":[],"data_offsets":[0,0]}
#define SD_ST_MIN_ENTRY_BYTES 48

typedef struct {
    char *name;
    sd_dtype dtype;
    int ndim;
    int64_t shape[SD_ST_MAX_DIMS];
    const void *data; // inside the mapping (reader) or the caller's buffer (writer)
    size_t nbytes;    // = dtype size × Π shape (validated)
} sd_st_tensor;

typedef struct {
    void *map;
    size_t size;
    int n;
    sd_st_tensor *tensors; // in data-offset order
} sd_st_file;

int64_t sd_st_numel(const sd_st_tensor *t);

// Open and validate as the reference library does: header length inside the file and <=
// SD_ST_MAX_HEADER, at most SD_ST_MAX_TENSORS entries, valid JSON with no NUL in a string,
// dtypes specdec reads (a dtype of the format it does not read is named as unsupported, any
// other string as unknown), nbytes = dtype size × shape, and the tensors tiling the data
// section exactly (no gap, no overlap, no byte after the last: "file not fully covered"). Any
// violation is SD_ERR_DATA naming the path (and tensor); never a crash.
sd_code sd_st_open(const char *path, sd_st_file *f, sd_status *st);
const sd_st_tensor *sd_st_find(const sd_st_file *f, const char *name); // NULL if absent
void sd_st_close(sd_st_file *f);

// Write tensors (in the order given) to `path` through a temporary file in the same folder
// and a rename (atomic_file.h): a failed or interrupted write leaves no partial file.
sd_code sd_st_write(const char *path, const sd_st_tensor *tensors, int n, sd_status *st);

// Bytes written so far of a multi-file write, reported after each chunk of at most 64 MiB.
typedef struct {
    uint64_t done, total;
    void (*report)(void *ctx, uint64_t done, uint64_t total); // NULL: none
    void *ctx;
} sd_st_progress;

// The same file written to an open stream (path names it in messages); p may be NULL.
sd_code sd_st_write_stream(FILE *f, const char *path, const sd_st_tensor *tensors, int n, sd_st_progress *p,
                           sd_status *st);
// An upper bound on the bytes sd_st_write writes for these tensors (free-space checks).
size_t sd_st_file_bytes_bound(const sd_st_tensor *t, int n);
