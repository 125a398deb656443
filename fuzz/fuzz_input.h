// fuzz_input.h — what the fuzz targets share: the input as a file the loaders can open by path
// (an anonymous memory file, so runs touch no disk), and the tiny config every model target uses.
#pragma once
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h> // memfd_create
#include <unistd.h>

static inline void fuzz_write_all(int fd, const uint8_t *data, size_t size) {
    for (size_t done = 0; done < size;) {
        ssize_t n = write(fd, data + done, size - done);
        if (n <= 0) abort();
        done += (size_t)n;
    }
}

// The bytes as a file: *path names it (/proc/self/fd/N); close the returned fd when done.
static inline int fuzz_memfile(const uint8_t *data, size_t size, char path[static 64]) {
    int fd = memfd_create("fuzz", MFD_CLOEXEC);
    if (fd < 0) abort();
    fuzz_write_all(fd, data, size);
    snprintf(path, 64, "/proc/self/fd/%d", fd);
    return fd;
}

// The bytes as the file at path (created or truncated), for readers that open a folder.
static inline void fuzz_write_file(const char *path, const uint8_t *data, size_t size) {
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) abort();
    fuzz_write_all(fd, data, size);
    close(fd);
}

// A private folder <shm or tmp>/<name>.XXXXXX into dir (memory-backed where /dev/shm is writable).
static inline void fuzz_private_dir(char dir[static 64], const char *name) {
    snprintf(dir, 64, "%s/%s.XXXXXX", access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp", name);
    if (!mkdtemp(dir)) abort();
}

// A NUL-terminated copy of the bytes (caller frees).
static inline char *fuzz_text(const uint8_t *data, size_t size) {
    char *s = malloc(size + 1);
    if (!s) abort();
    for (size_t i = 0; i < size; i++) s[i] = (char)data[i];
    s[size] = '\0';
    return s;
}
