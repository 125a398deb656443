// model_save.h — writing a model folder DIR (config.json + its weights: one model.safetensors,
// or shards + model.safetensors.index.json, checkpoint.h) so that a failure or a signal leaves
// nothing behind.
//
// Every file is written and fsynced in the stage <DIR>.tmp.<pid> beside DIR (the same file
// system, so the renames that commit it are atomic). While the stage exists its files are
// registered with cleanup.h, so a signal removes them (a shard being written is registered by
// atomic_file.h under its own temporary name); a stage of a killed run is removed by the next
// write to DIR (atomic_file.h sd_atomic_sweep). Commit: a new DIR is the stage renamed (every
// file appears at once); into an existing DIR the config is renamed first, then the shards, the
// index last, so weights never stand without a config and an index never names a shard that is
// not there; the other layout's file and the shards of an earlier checkpoint that this one does
// not hold are then removed, so DIR holds one model. DIR, if it exists,
// must be a folder and the files it replaces regular files (a symbolic link, FIFO or device there
// is refused, not replaced).
#pragma once
#include <stdbool.h>
#include "checkpoint.h" // sd_ckpt_write_opts
#include "model.h"      // sd_model

#define SD_MODEL_PATH_MAX 4000
#define SD_MODEL_STAGE_SLOTS 128 // cleanup.h slots a stage may hold: its folder and its files

typedef struct {
    char dir[SD_MODEL_PATH_MAX];
    char stage[SD_MODEL_PATH_MAX + 32]; // "" when nothing is staged
    bool existed;                       // DIR existed when staged
    int slots[SD_MODEL_STAGE_SLOTS];    // cleanup.h slots + 1 (0: none)
    int n_slots;
} sd_model_staged;

// Stage m for DIR (o: the shard size and progress; NULL for the defaults). On failure nothing
// is left on disk.
sd_code sd_model_stage(const sd_model *m, const char *dir, const sd_ckpt_write_opts *o, sd_model_staged *sg,
                       sd_status *st);
// Move a staged model into DIR (above); the stage is gone afterwards, whatever the outcome.
sd_code sd_model_commit(sd_model_staged *sg, sd_status *st);
// Remove a stage that will not be committed (a no-op on a committed or zeroed one).
void sd_model_discard(sd_model_staged *sg);
// Stage and commit.
sd_code sd_model_save(const sd_model *m, const char *dir, const sd_ckpt_write_opts *o, sd_status *st);
