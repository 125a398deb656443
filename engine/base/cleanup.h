// cleanup.h — the temporary files and folders a write has created and not yet renamed into
// place, so that a signal that ends the process removes them (engine/cli/interrupt.c calls
// sd_cleanup_run from its handler). A temporary that a killed process (SIGKILL, a crash) leaves
// behind is removed by the next write to the same target (atomic_file.h sd_atomic_sweep).
#pragma once
#include <stdbool.h>

#define SD_CLEANUP_SLOTS 256 // a sharded checkpoint registers every shard until its commit

// Registers path (a file, or with dir a folder, removed once every registered file is).
// Returns its slot, or -1 when the path is too long or every slot is taken (the temporary is
// then still removed by the write's own error path and by the next sweep).
int sd_cleanup_add(const char *path, bool dir);
// The write renamed or removed it itself: forget slot (a no-op for -1).
void sd_cleanup_drop(int slot);
// Removes every registered path: the files, then the folders.
// Async-signal-safe: unlink and rmdir only, no allocation.
void sd_cleanup_run(void);
