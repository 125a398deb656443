// sizes.c — checked byte counts and the memory-fit check (sizes.h).
#include "sizes.h"
#include <stdio.h>
#include <unistd.h>

uint64_t sd_size_mul4(uint64_t a, uint64_t b, uint64_t c, uint64_t d, bool *over) {
    uint64_t r;
    bool o = __builtin_mul_overflow(a, b, &r);
    o |= __builtin_mul_overflow(r, c, &r);
    o |= __builtin_mul_overflow(r, d, &r);
    if (o) *over = true;
    return o ? UINT64_MAX : r;
}

void sd_size_add(sd_size *s, uint64_t n, uint64_t align) {
    uint64_t up;
    if (__builtin_add_overflow(n, align - 1, &up)) { s->over = true; return; }
    up &= ~(align - 1);
    if (__builtin_add_overflow(s->bytes, up, &s->bytes)) s->over = true;
}

uint64_t sd_host_memory_bytes(void) {
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
    if (pages <= 0 || page <= 0) return 0;
    return (uint64_t)pages * (uint64_t)page;
}

const char *sd_size_str(uint64_t bytes, char buf[static 32]) {
    if (bytes >= (UINT64_C(1) << 30)) snprintf(buf, 32, "%.1f GiB", (double)bytes / (double)(UINT64_C(1) << 30));
    else if (bytes >= (UINT64_C(1) << 20)) snprintf(buf, 32, "%.1f MiB", (double)bytes / (double)(UINT64_C(1) << 20));
    else snprintf(buf, 32, "%llu bytes", (unsigned long long)bytes);
    return buf;
}

sd_code sd_mem_fit(uint64_t need, uint64_t have, const char *what, const char *where, sd_status *st) {
    if (!have || need <= have) return SD_OK;
    char a[32], b[32];
    return sd_fail(st, SD_ERR_UNSUPPORTED, "%s need %s, %s has %s", what, sd_size_str(need, a), where, sd_size_str(have, b));
}
