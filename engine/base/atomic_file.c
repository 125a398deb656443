// atomic_file.c — temporary + fsync + rename (atomic_file.h).
#include "atomic_file.h"
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void release(sd_atomic_file *a) {
    free(a->path);
    free(a->tmp);
    memset(a, 0, sizeof *a);
}

sd_code sd_atomic_open(sd_atomic_file *a, const char *path, sd_status *st) {
    memset(a, 0, sizeof *a);
    if (!path || !path[0]) return sd_fail(st, SD_ERR_USAGE, "empty output path");
    size_t len = strlen(path) + 32;
    a->path = strdup(path);
    a->tmp = malloc(len);
    if (!a->path || !a->tmp) {
        release(a);
        return sd_fail(st, SD_ERR_SYS, "%s: out of memory", path);
    }
    snprintf(a->tmp, len, "%s.tmp.%ld", path, (long)getpid());
    a->f = fopen(a->tmp, "w");
    if (!a->f) {
        sd_fail(st, SD_ERR_SYS, "%s: cannot create %s: %s", path, a->tmp, strerror(errno));
        release(a);
        return SD_ERR_SYS;
    }
    return SD_OK;
}

// Best effort: make the rename itself durable.
static void fsync_dir(const char *path) {
    const char *slash = strrchr(path, '/');
    char *dir = slash ? strndup(path, (size_t)(slash - path) + 1) : strdup(".");
    if (!dir) return;
    int fd = open(dir, O_RDONLY | O_DIRECTORY);
    if (fd >= 0) { fsync(fd); close(fd); }
    free(dir);
}

sd_code sd_atomic_finish(sd_atomic_file *a, sd_status *st) {
    if (!a->f) return sd_fail(st, SD_ERR_USAGE, "atomic file: finish without open");
    const char *step = NULL;
    int err = 0;
    if (fflush(a->f) != 0 || ferror(a->f)) step = "write";
    else if (fsync(fileno(a->f)) != 0) step = "fsync";
    if (step) err = errno;
    if (fclose(a->f) != 0 && !step) { step = "close"; err = errno; }
    a->f = NULL;
    if (step) {
        unlink(a->tmp);
        sd_fail(st, SD_ERR_SYS, "%s: %s: %s", a->path, step, strerror(err ? err : EIO));
        release(a);
        return SD_ERR_SYS;
    }
    return SD_OK;
}

sd_code sd_atomic_publish(sd_atomic_file *a, sd_status *st) {
    if (a->f || !a->tmp) return sd_fail(st, SD_ERR_USAGE, "atomic file: publish before finish");
    if (rename(a->tmp, a->path) != 0) {
        int err = errno;
        unlink(a->tmp);
        sd_fail(st, SD_ERR_SYS, "%s: rename: %s", a->path, strerror(err));
        release(a);
        return SD_ERR_SYS;
    }
    fsync_dir(a->path);
    release(a);
    return SD_OK;
}

sd_code sd_atomic_commit(sd_atomic_file *a, sd_status *st) {
    if (!a->f) return sd_fail(st, SD_ERR_USAGE, "atomic file: commit without open");
    SD_TRY(sd_atomic_finish(a, st));
    return sd_atomic_publish(a, st);
}

void sd_atomic_abort(sd_atomic_file *a) {
    if (a->f) fclose(a->f);
    if (a->tmp) unlink(a->tmp); // open or finished: the temporary exists
    release(a);
}
