// finite.c — the op table's non-finite flag case (kernels/finite.h): reset, then checks of
// finite and planted rows at decreasing and increasing sites; the flag keeps the smallest site
// that saw a NaN or an Inf, exactly.
#include <math.h>
#include "op_cases.h"
#include "finite.h" // sd_cuda_finite_reset, sd_cuda_finite_check

// shape: {rows, width}.
void run_finite(const op_case *c) {
    uint64_t r = seed_of(0);
    const size_t n = (size_t)c->shape[0] * (size_t)c->shape[1];
    float *h = rand_host(n, r, 1.0f);
    gbuf x = gbuf_of(h, n), flag = gbuf_new(1);
    int got;
    OK(sd_cuda_finite_reset(IP(flag), 0, &st_));
    OK(sd_cuda_finite_check(x.p, n, 7, IP(flag), 0, &st_));
    gbuf_get(&flag, &got, 1);
    cr_assert_eq(got, 0x7fffffff, "%s: a finite tensor set the flag to %d", LABEL, got);
    const float planted[3] = {NAN, INFINITY, -INFINITY};
    const int sites[3] = {9, 4, 6}; // the flag keeps 4
    for (int k = 0; k < 3; k++) {
        h[(size_t)rng_int(&r, (int)n)] = planted[k];
        gbuf_put(&x, h, n);
        OK(sd_cuda_finite_check(x.p, n, sites[k], IP(flag), 0, &st_));
        gbuf_get(&flag, &got, 1);
        const int want = k == 0 ? 9 : 4;
        cr_assert_eq(got, want, "%s: after planting %g at site %d the flag is %d, want %d", LABEL, planted[k], sites[k], got, want);
    }
    free(h);
    gbuf_done(&x, "x");
    gbuf_done(&flag, "flag");
}
