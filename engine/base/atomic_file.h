// atomic_file.h — write a file so that readers see the old file or the whole new one, never a
// part: the text goes to <path>.tmp.<pid> in the target's folder, is fsynced, and is renamed
// over <path> only after the fsync succeeded.
//
// Targets: a path that exists and is not a regular file (a symbolic link, a FIFO, a device node,
// a folder) is refused, never replaced. Temporaries: each is registered with cleanup.h while it
// exists, so a signal that ends the process removes it; one left by a process that was killed
// outright (its pid no longer running) is removed by the next write to the same target (the
// pid in the name is how a stale temporary is told from a live writer's).
#pragma once
#include <stdio.h>
#include "status.h" // sd_status

typedef struct sd_atomic_file {
    FILE *f;    // write here between open and commit
    char *path; // the destination
    char *tmp;  // <path>.tmp.<pid>
    int slot;   // tmp's cleanup.h slot + 1 (0: not registered), so a zeroed struct holds none
} sd_atomic_file;

// Creates the temporary. On failure nothing exists on disk and *a needs no abort.
sd_code sd_atomic_open(sd_atomic_file *a, const char *path, sd_status *st);
// Flushes, fsyncs and renames the temporary over the destination (then fsyncs the folder, best
// effort). On any failure the temporary is removed and the destination is untouched.
sd_code sd_atomic_commit(sd_atomic_file *a, sd_status *st);
// Closes and removes the temporary (after a failed write; a no-op on a zeroed or committed a).
void sd_atomic_abort(sd_atomic_file *a);

// Commit in two steps, for a set of files that appear together (a sharded checkpoint): finish
// every file (flush, fsync, close; the temporary stays), then publish each (rename, fsync the
// folder). After a failed finish or publish the temporary is gone; sd_atomic_abort removes the
// temporary of a finished, unpublished file.
sd_code sd_atomic_finish(sd_atomic_file *a, sd_status *st);
sd_code sd_atomic_publish(sd_atomic_file *a, sd_status *st);
// The checks sd_atomic_open makes of a target before it writes, for writers with their own
// temporary (safetensors.h sd_st_write, the model folder of synth.h): SD_ERR_USAGE when path
// exists and is not a regular file (want_dir: not a folder; symbolic links are refused either
// way); then stale temporaries <path>.tmp.<pid> of dead processes are removed.
sd_code sd_atomic_check_target(const char *path, int want_dir, sd_status *st);
// Removes <path>.tmp.<pid> entries (files, or folders with their files) whose pid is not running.
void sd_atomic_sweep(const char *path);
// Makes entries of the folder holding path durable (fsync of the folder; best effort).
void sd_atomic_fsync_dir(const char *path);
