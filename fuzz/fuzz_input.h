// fuzz_input.h — what the fuzz targets share: the input as a file the loaders can open by path
// (an anonymous memory file, so runs touch no disk), and the tiny config every model target uses.
#pragma once
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h> // memfd_create
#include <unistd.h>

// The bytes as a file: *path names it (/proc/self/fd/N); close the returned fd when done.
static inline int fuzz_memfile(const uint8_t *data, size_t size, char path[static 64]) {
    int fd = memfd_create("fuzz", MFD_CLOEXEC);
    if (fd < 0) abort();
    for (size_t done = 0; done < size;) {
        ssize_t n = write(fd, data + done, size - done);
        if (n <= 0) abort();
        done += (size_t)n;
    }
    snprintf(path, 64, "/proc/self/fd/%d", fd);
    return fd;
}

// A NUL-terminated copy of the bytes (caller frees).
static inline char *fuzz_text(const uint8_t *data, size_t size) {
    char *s = malloc(size + 1);
    if (!s) abort();
    for (size_t i = 0; i < size; i++) s[i] = (char)data[i];
    s[size] = '\0';
    return s;
}
