// checkpoint.h — a model directory's weights in the Hugging Face layout (MODEL.md "Files"):
// one model.safetensors, or model.safetensors.index.json whose "weight_map" names the shard
// file of every tensor, beside those shards. Opened, every shard validated (safetensors.h) and
// the index checked against the shards; then one lookup by name whatever the layout.
#pragma once
#include "safetensors.h" // sd_st_file, sd_st_tensor
#include "status.h"      // sd_status

#define SD_CKPT_SINGLE "model.safetensors"
#define SD_CKPT_INDEX "model.safetensors.index.json"

typedef struct {
    char *name;     // the file name inside the directory
    char *path;     // dir/name
    sd_st_file file;
} sd_ckpt_shard;

typedef struct {
    const sd_st_tensor *tensor;
    int shard;      // index into shards
} sd_ckpt_entry;

typedef struct {
    char *dir;
    char *index_path;       // NULL for a single model.safetensors
    int n_shards;
    sd_ckpt_shard *shards;  // in name order (one shard, SD_CKPT_SINGLE, without an index)
    int n;
    sd_ckpt_entry *entries; // every tensor of every shard, sorted by name
} sd_checkpoint;

// Open DIR's weights. A directory holding both layouts, or neither, is refused. With an index:
// every tensor it names must be in the shard it names and every shard tensor must be named by
// the index for that shard; a missing shard file, a tensor in two shards, an index naming a
// tensor its shard lacks or a shard tensor the index does not name is SD_ERR_DATA naming the
// file and the tensor. On failure *c needs no close.
sd_code sd_ckpt_open(const char *dir, sd_checkpoint *c, sd_status *st);
// NULL if absent; *shard_path (optional) is the file that holds it.
const sd_st_tensor *sd_ckpt_find(const sd_checkpoint *c, const char *name, const char **shard_path);
// The tensor's index in c->entries, -1 if absent.
int sd_ckpt_find_index(const sd_checkpoint *c, const char *name);
// The file a load error about the checkpoint as a whole names: the index, or the single file.
static inline const char *sd_ckpt_path(const sd_checkpoint *c) { return c->index_path ? c->index_path : c->shards[0].path; }
void sd_ckpt_close(sd_checkpoint *c);

// The weights digest of a receipt (docs/CHECKPOINTS.md): a single file's SHA-256; for a sharded
// checkpoint the SHA-256 of the manifest `sha256sum` prints for every shard in name order and
// then the index ("<hex>  <name>\n" per file), so it covers the index and every shard byte.
sd_code sd_ckpt_digest(const sd_checkpoint *c, char hex[65], sd_status *st);

// ---------------------------------------------------------------------------------------------
// Writing (checkpoint_write.c)

#define SD_CKPT_DEFAULT_SHARD_BYTES 5000000000ull // the hub's default shard size, 5 GB

typedef struct {
    uint64_t shard_bytes; // a shard holds at most this many tensor bytes (a larger tensor gets
                          // a shard of its own); 0: SD_CKPT_DEFAULT_SHARD_BYTES
    void (*progress)(void *ctx, uint64_t done, uint64_t total); // bytes written; NULL: none
    void *progress_ctx;
} sd_ckpt_write_opts;

// Write tensors (in the order given) as DIR's weights: one model.safetensors when they fit in
// one shard, else model-0000N-of-0000M.safetensors + model.safetensors.index.json. Refused
// before anything is written when the file system lacks the space (the message gives needed
// and available bytes). Every file goes to a temporary name first and all are renamed at the
// end, so a failed write leaves none of them; then the other layout's file, if any, is removed
// so the directory holds one model. o may be NULL (defaults).
sd_code sd_ckpt_write(const char *dir, const sd_st_tensor *t, int n, const sd_ckpt_write_opts *o, sd_status *st);
