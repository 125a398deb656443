// digest.h — SHA-256 (OpenSSL EVP) of a buffer or a file, as 64 lowercase hex digits + NUL.
#pragma once
#include <stddef.h>
#include "status.h" // sd_code, sd_status

// Streams the file in chunks. SD_ERR_SYS naming the path when it cannot be opened or read.
sd_code sd_sha256_file(const char *path, char hex[65], sd_status *st);

// On an OpenSSL failure (out of memory) hex is the empty string, which matches no digest.
void sd_sha256_buf(const void *data, size_t n, char hex[65]);
