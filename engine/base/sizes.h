// sizes.h — byte counts computed in 64 bits with overflow checks, and the memory-fit check
// every allocation of weights or state makes before it asks for the memory.
//
// A hostile config can name widths whose products wrap size_t; a wrapped sum would allocate a
// few hundred bytes and let the fill run off its end. So every size that a config or a run
// option drives is summed here, and a wrap is reported, never used.
#pragma once
#include <stdbool.h>
#include <stdint.h>
#include "status.h" // sd_status

// The largest model this engine loads (weights at F32): 4 TiB, ~20x Kimi-Linear-48B at F32.
#define SD_MAX_MODEL_BYTES (UINT64_C(4) << 40)
// The largest tensor table: ~12x the tensors of Kimi-Linear-48B (27 layers x 256 experts x 3).
#define SD_MAX_TENSORS (1 << 18)

// A running checked sum: once a step wraps, `over` stays set and `bytes` means nothing.
typedef struct {
    uint64_t bytes;
    bool over;
} sd_size;

// a·b·c·d (pass 1 for unused factors); *over set on a wrap.
uint64_t sd_size_mul4(uint64_t a, uint64_t b, uint64_t c, uint64_t d, bool *over);
// s += n rounded up to `align` (a power of two, or 1).
void sd_size_add(sd_size *s, uint64_t n, uint64_t align);

// Physical memory of this host (sysconf), 0 when unknown.
uint64_t sd_host_memory_bytes(void);
// need <= have, or SD_ERR_UNSUPPORTED with "WHAT need X GiB, WHERE has Y GiB". have == 0:
// unknown, no check.
sd_code sd_mem_fit(uint64_t need, uint64_t have, const char *what, const char *where, sd_status *st);
// bytes as "12.3 GiB" / "45.6 MiB" / "789 bytes" into buf.
const char *sd_size_str(uint64_t bytes, char buf[static 32]);
