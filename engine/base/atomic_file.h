// atomic_file.h — write a file so that readers see the old file or the whole new one, never a
// part: the text goes to <path>.tmp.<pid>, is fsynced, and is renamed over <path>.
#pragma once
#include <stdio.h>
#include "status.h" // sd_status

typedef struct sd_atomic_file {
    FILE *f;    // write here between open and commit
    char *path; // the destination
    char *tmp;  // <path>.tmp.<pid>
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
