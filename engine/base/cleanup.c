// cleanup.c — the registry of temporaries (cleanup.h). Fixed storage, so the signal handler
// touches no allocator; slots are taken and dropped by the writing thread only.
#include "cleanup.h"
#include <signal.h>
#include <string.h>
#include <unistd.h>

#define PATH_CAP 4096

static char paths[SD_CLEANUP_SLOTS][PATH_CAP];
static volatile sig_atomic_t state[SD_CLEANUP_SLOTS]; // 0 free, 1 file, 2 folder

int sd_cleanup_add(const char *path, bool dir) {
    size_t n = strlen(path);
    if (n >= PATH_CAP) return -1;
    for (int i = 0; i < SD_CLEANUP_SLOTS; i++)
        if (!state[i]) {
            memcpy(paths[i], path, n + 1);
            state[i] = dir ? 2 : 1; // set last: the handler sees a slot only once its path is whole
            return i;
        }
    return -1;
}

void sd_cleanup_drop(int slot) {
    if (slot >= 0 && slot < SD_CLEANUP_SLOTS) state[slot] = 0;
}

void sd_cleanup_run(void) {
    for (int i = 0; i < SD_CLEANUP_SLOTS; i++)
        if (state[i] == 1) unlink(paths[i]), state[i] = 0;
    for (int i = 0; i < SD_CLEANUP_SLOTS; i++) // the folders, once their files are gone
        if (state[i] == 2) rmdir(paths[i]), state[i] = 0;
}
