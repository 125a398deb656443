// safetensors.h — reader (mmap, header parsed with cJSON, everything validated before use)
// and atomic writer of the safetensors format: u64 little-endian header length N, N bytes of
// JSON header {name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__": {...}}, data.
#pragma once
#include <stddef.h>
#include <stdint.h>
#include "status.h" // sd_status
#include "tensor.h" // sd_dtype

#define SD_ST_MAX_DIMS 8
#define SD_ST_MAX_HEADER (100u << 20) // the format's own 100 MB header bound

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

// Open and validate: header length inside the file and <= SD_ST_MAX_HEADER, valid JSON, known
// dtypes, offsets inside the data section, no overlap, nbytes = dtype size × shape. Any
// violation is SD_ERR_DATA naming the path (and tensor); never a crash.
sd_code sd_st_open(const char *path, sd_st_file *f, sd_status *st);
const sd_st_tensor *sd_st_find(const sd_st_file *f, const char *name); // NULL if absent
void sd_st_close(sd_st_file *f);

// Write tensors (in the order given) to `path` through a temporary file in the same folder
// and a rename: a failed or interrupted write leaves no partial file.
sd_code sd_st_write(const char *path, const sd_st_tensor *tensors, int n, sd_status *st);
