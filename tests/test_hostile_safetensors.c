// test_hostile_safetensors.c — the hostile-input classes of the safetensors reader
// (engine/base/safetensors.c): a tensor name holding a NUL byte is refused, not accepted under
// its shorter name; and a header listing more tensors than any model holds (SD_MAX_TENSORS,
// engine/base/sizes.h) is refused before the table grows for them — at once, in bounded memory.
#include <criterion/criterion.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "safetensors.h" // sd_st_open, sd_st_find
#include "sizes.h"       // SD_MAX_TENSORS

// header JSON + data bytes as a safetensors file at a fresh temporary path (caller unlinks).
static char *write_st(const char *header, size_t hlen, const void *data, size_t dlen) {
    static char path[64];
    snprintf(path, sizeof path, "/tmp/test_hostile_st.XXXXXX");
    int fd = mkstemp(path);
    cr_assert(fd >= 0);
    unsigned char len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (unsigned char)((uint64_t)hlen >> (8 * i));
    cr_assert_eq(write(fd, len8, 8), 8);
    cr_assert_eq(write(fd, header, hlen), (ssize_t)hlen);
    if (dlen) cr_assert_eq(write(fd, data, dlen), (ssize_t)dlen);
    close(fd);
    return path;
}

// {"a\u0000b": ...} names a tensor "a<NUL>b": refused with a one-line message, and never found
// as "a".
Test(hostile_safetensors, nul_in_name_refused) {
    static const char hdr[] = "{\"a\\u0000b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}";
    const float one = 1.0f;
    char *path = write_st(hdr, sizeof hdr - 1, &one, 4);
    sd_st_file f;
    sd_status st = {0};
    sd_code rc = sd_st_open(path, &f, &st);
    if (rc == SD_OK) {
        cr_expect_null(sd_st_find(&f, "a"), "a tensor named \"a\\0b\" is found as \"a\"");
        sd_st_close(&f);
    }
    unlink(path);
    cr_expect_eq(rc, SD_ERR_DATA, "a NUL in a tensor name was accepted");
    cr_expect(!strchr(st.msg, '\n'), "%s", st.msg);
}

// SD_MAX_TENSORS + 1 one-float tensors: refused naming the count, in well under a second.
Test(hostile_safetensors, table_growth_bounded, .timeout = 30) {
    const int n = SD_MAX_TENSORS + 1;
    size_t cap = (size_t)n * 80 + 16, len = 0;
    char *hdr = malloc(cap);
    cr_assert_not_null(hdr);
    hdr[len++] = '{';
    for (int i = 0; i < n; i++)
        len += (size_t)snprintf(hdr + len, cap - len, "%s\"t%d\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[%d,%d]}",
                                i ? "," : "", i, 4 * i, 4 * i + 4);
    hdr[len++] = '}';
    float *data = calloc((size_t)n, sizeof(float));
    cr_assert_not_null(data);
    char *path = write_st(hdr, len, data, sizeof(float) * (size_t)n);
    free(hdr);
    free(data);
    sd_st_file f;
    sd_status st = {0};
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    sd_code rc = sd_st_open(path, &f, &st);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    if (rc == SD_OK) sd_st_close(&f);
    unlink(path);
    cr_expect_eq(rc, SD_ERR_DATA, "a header of %d tensors was accepted", n);
    cr_expect(strstr(st.msg, "tensors"), "%s", st.msg);
    const double s = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    cr_expect(s < 2.0, "the refusal took %.2f s", s);
}
