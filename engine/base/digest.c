// digest.c — SHA-256 through OpenSSL EVP: one call for a buffer, chunked reads for a file.
#include "file_open.h" // sd_open_regular
#include "digest.h"
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <openssl/evp.h> // EVP_Digest, EVP_DigestInit_ex/Update/Final_ex, EVP_sha256
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define CHUNK_BYTES (1u << 20)

static void to_hex(const unsigned char md[32], char hex[65]) {
    static const char digits[] = "0123456789abcdef";
    for (int i = 0; i < 32; i++) {
        hex[2 * i] = digits[md[i] >> 4];
        hex[2 * i + 1] = digits[md[i] & 15];
    }
    hex[64] = '\0';
}

void sd_sha256_buf(const void *data, size_t n, char hex[65]) {
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int len = 0;
    if (EVP_Digest(data, n, md, &len, EVP_sha256(), NULL) != 1 || len != 32) {
        hex[0] = '\0';
        return;
    }
    to_hex(md, hex);
}

// Feed the whole of fd to ctx; false with errno set on a read error.
static bool hash_fd(EVP_MD_CTX *ctx, int fd, unsigned char *buf) {
    for (;;) {
        ssize_t r = read(fd, buf, CHUNK_BYTES);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return false;
        if (r == 0) return true;
        if (EVP_DigestUpdate(ctx, buf, (size_t)r) != 1) {
            errno = ENOMEM;
            return false;
        }
    }
}

sd_code sd_sha256_file(const char *path, char hex[65], sd_status *st) {
    hex[0] = '\0';
    int fd = sd_open_regular(path, st);
    if (fd < 0) return st ? st->code : SD_ERR_SYS;
    unsigned char *buf = malloc(CHUNK_BYTES);
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int len = 0;
    sd_code code = SD_OK;
    if (!buf || !ctx || EVP_DigestInit_ex(ctx, EVP_sha256(), NULL) != 1)
        code = sd_fail(st, SD_ERR_SYS, "%s: sha256: out of memory", path);
    else if (!hash_fd(ctx, fd, buf))
        code = sd_fail(st, SD_ERR_SYS, "%s: read: %s", path, strerror(errno));
    else if (EVP_DigestFinal_ex(ctx, md, &len) != 1 || len != 32)
        code = sd_fail(st, SD_ERR_SYS, "%s: sha256: OpenSSL failure", path);
    else
        to_hex(md, hex);
    EVP_MD_CTX_free(ctx);
    free(buf);
    close(fd);
    return code;
}
