// cursor.c — the op table's cursor case (kernels/cursor.h): set, advance and commit, every value
// exact.
#include "op_cases.h"
#include "cursor.h" // sd_cuda_cursor_set, sd_cuda_cursor_advance, sd_cuda_cursor_commit

// No shape: set, then advances of random sizes with a commit of a device count (plus 0 or 1, the
// bonus) after every second one, then set again; every value exact.
void run_cursor(const op_case *c) {
    (void)c;
    uint64_t r = seed_of(0);
    gbuf cur = gbuf_new(2), n = gbuf_new(1);
    int len = 1 + rng_int(&r, 5000), pending = rng_int(&r, 9);
    OK(sd_cuda_cursor_set(IP(cur), len, pending, 0, &st_));
    cursor_expect(&cur, len, pending, "set");
    for (int step = 0; step < 6; step++) {
        const int T = 1 + rng_int(&r, 9);
        OK(sd_cuda_cursor_advance(IP(cur), T, 0, &st_));
        pending += T;
        cursor_expect(&cur, len, pending, fmt("advance %d", T));
        if (step % 2) {
            const int kept = rng_int(&r, pending + 1), plus = step % 4 == 1;
            gbuf_put(&n, &kept, 1);
            OK(sd_cuda_cursor_commit(IP(cur), IP(n), plus, 0, &st_));
            len += kept + plus;
            pending = 0;
            cursor_expect(&cur, len, pending, fmt("commit %d + %d", kept, plus));
        }
    }
    OK(sd_cuda_cursor_set(IP(cur), 0, 0, 0, &st_));
    cursor_expect(&cur, 0, 0, "set 0");
    gbuf_done(&cur, "cursor");
    gbuf_done(&n, "count");
}
