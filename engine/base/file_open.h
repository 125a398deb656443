// file_open.h — how the engine opens a file it reads: without blocking, and only a regular file.
// open() of a FIFO blocks until a writer appears (forever, for a config.json that is one), and a
// device node or a directory is no model file; so the path is opened O_NONBLOCK, fstat'd, and
// anything but a regular file is refused naming the path and what it is.
#pragma once
#include <stdio.h>
#include "status.h" // sd_status

// A read-only descriptor of the regular file at path (blocking mode restored), or -1 with the
// reason in st (SD_ERR_SYS: it cannot be opened, or it is not a regular file).
int sd_open_regular(const char *path, sd_status *st);
// The same as a stdio stream ("rb"); NULL with the reason in st.
FILE *sd_fopen_regular(const char *path, sd_status *st);
// What a file mode is, for messages: "a FIFO", "a directory", "a device", ...
const char *sd_file_kind(unsigned mode);
