// file_open.c — non-blocking open of regular files only (file_open.h).
#include "file_open.h"
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

const char *sd_file_kind(unsigned mode) {
    if (S_ISFIFO(mode)) return "a FIFO";
    if (S_ISDIR(mode)) return "a directory";
    if (S_ISCHR(mode)) return "a character device";
    if (S_ISBLK(mode)) return "a block device";
    if (S_ISSOCK(mode)) return "a socket";
    if (S_ISLNK(mode)) return "a symbolic link";
    return "not a regular file";
}

int sd_open_regular(const char *path, sd_status *st) {
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) {
        sd_fail(st, SD_ERR_SYS, "%s: cannot open: %s", path, strerror(errno));
        return -1;
    }
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        sd_fail(st, SD_ERR_SYS, "%s: fstat: %s", path, strerror(errno));
        close(fd);
        return -1;
    }
    if (!S_ISREG(sb.st_mode)) {
        sd_fail(st, SD_ERR_SYS, "%s: not a regular file (%s)", path, sd_file_kind(sb.st_mode));
        close(fd);
        return -1;
    }
    int fl = fcntl(fd, F_GETFL);
    if (fl >= 0) fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
    return fd;
}

FILE *sd_fopen_regular(const char *path, sd_status *st) {
    int fd = sd_open_regular(path, st);
    if (fd < 0) return NULL;
    FILE *f = fdopen(fd, "rb");
    if (!f) {
        sd_fail(st, SD_ERR_SYS, "%s: cannot open: %s", path, strerror(errno));
        close(fd);
    }
    return f;
}
