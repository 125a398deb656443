// atomic_file.c — temporary + fsync + rename (atomic_file.h).
#include "atomic_file.h"
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "cleanup.h"   // sd_cleanup_add, sd_cleanup_drop
#include "file_open.h" // sd_file_kind

static void release(sd_atomic_file *a) {
    if (a->slot > 0) sd_cleanup_drop(a->slot - 1);
    free(a->path);
    free(a->tmp);
    memset(a, 0, sizeof *a);
}

// The folder part of path ("." when none) and its last component, in buffers of the caller.
static void split(const char *path, char *dir, size_t dir_cap, const char **base) {
    const char *slash = strrchr(path, '/');
    if (!slash) {
        snprintf(dir, dir_cap, ".");
        *base = path;
    } else {
        snprintf(dir, dir_cap, "%.*s", (int)(slash - path) + (slash == path), path);
        *base = slash + 1;
    }
}

// A pid that no process holds (kill(2) answers ESRCH); our own pid is live.
static int pid_dead(long pid) {
    if (pid <= 0 || pid == (long)getpid()) return 0;
    return kill((pid_t)pid, 0) != 0 && errno == ESRCH;
}

// Removes a stale temporary: a file, or a folder of files (a staged model folder).
static void remove_stale(const char *path) {
    struct stat sb;
    if (lstat(path, &sb) != 0) return;
    if (!S_ISDIR(sb.st_mode)) { unlink(path); return; }
    DIR *d = opendir(path);
    if (d) {
        struct dirent *e;
        char inner[8192];
        while ((e = readdir(d)))
            if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) {
                snprintf(inner, sizeof inner, "%s/%s", path, e->d_name);
                unlink(inner); // a staged folder holds files only
            }
        closedir(d);
    }
    rmdir(path);
}

void sd_atomic_sweep(const char *path) {
    char dir[4096];
    const char *base;
    split(path, dir, sizeof dir, &base);
    const size_t n = strlen(base);
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d))) {
        const char *name = e->d_name;
        if (strncmp(name, base, n) || strncmp(name + n, ".tmp.", 5)) continue;
        char *end;
        long pid = strtol(name + n + 5, &end, 10);
        if (end == name + n + 5 || *end || !pid_dead(pid)) continue;
        char stale[4096 + 256];
        snprintf(stale, sizeof stale, "%s/%s", dir, name);
        remove_stale(stale);
    }
    closedir(d);
}

sd_code sd_atomic_check_target(const char *path, int want_dir, sd_status *st) {
    if (!path || !path[0]) return sd_fail(st, SD_ERR_USAGE, "empty output path");
    struct stat sb;
    if (lstat(path, &sb) == 0) {
        const int ok = want_dir ? S_ISDIR(sb.st_mode) : S_ISREG(sb.st_mode);
        if (!ok)
            return sd_fail(st, SD_ERR_USAGE, "%s: exists and is %s, not a %s: refusing to replace it", path,
                           sd_file_kind(sb.st_mode), want_dir ? "folder" : "regular file");
    } else if (errno != ENOENT) {
        return sd_fail(st, SD_ERR_SYS, "%s: %s", path, strerror(errno));
    }
    sd_atomic_sweep(path);
    return SD_OK;
}

sd_code sd_atomic_open(sd_atomic_file *a, const char *path, sd_status *st) {
    memset(a, 0, sizeof *a);
    SD_TRY(sd_atomic_check_target(path, 0, st));
    size_t len = strlen(path) + 32;
    a->path = strdup(path);
    a->tmp = malloc(len);
    if (!a->path || !a->tmp) {
        release(a);
        return sd_fail(st, SD_ERR_SYS, "%s: out of memory", path);
    }
    snprintf(a->tmp, len, "%s.tmp.%ld", path, (long)getpid());
    // O_EXCL | O_NOFOLLOW: the temporary is a new regular file of ours, never something planted
    // at its name; one of our own pid can only be a leftover of this process, so it goes.
    int fd = open(a->tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd < 0 && errno == EEXIST && unlink(a->tmp) == 0)
        fd = open(a->tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd >= 0) a->slot = sd_cleanup_add(a->tmp, false) + 1;
    a->f = fd >= 0 ? fdopen(fd, "w") : NULL;
    if (!a->f) {
        sd_fail(st, SD_ERR_SYS, "%s: cannot create %s: %s", path, a->tmp, strerror(errno));
        if (fd >= 0) { close(fd); unlink(a->tmp); }
        release(a);
        return SD_ERR_SYS;
    }
    return SD_OK;
}

void sd_atomic_fsync_dir(const char *path) {
    char dir[4096];
    const char *base;
    split(path, dir, sizeof dir, &base);
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd >= 0) { fsync(fd); close(fd); }
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
    sd_atomic_fsync_dir(a->path);
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
