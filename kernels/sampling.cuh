// sampling.cuh — the inverse-CDF draw of engine/sample.c as a device function, shared by
// sampling.cu (a forward's draws) and acceptance.cu (the bonus token), so both run the CPU's
// loop as written.
#pragma once
#include "common.cuh"

// sd_sample(p, n, u) in one thread: the smallest i with p_i > 0 and c_i > u·total, where c_i is
// the float running sum of the positive entries in index order and total the same sum to the
// end; the last positive index when none qualifies (u >= 1, NaN, infinite total); -1 when no
// entry is positive. A float running sum is inherently sequential: one thread keeps the CPU's
// rounding.
__device__ __forceinline__ int sd_dev_sample(const float *p, int n, float u) {
    float total = 0.0f;
    int last = -1;
    for (int i = 0; i < n; i++)
        if (p[i] > 0) { total += p[i]; last = i; }
    if (last < 0) return -1;
    const float target = u * total;
    float c = 0.0f;
    for (int i = 0; i < n; i++) {
        if (!(p[i] > 0)) continue;
        c += p[i];
        if (c > target) return i;
    }
    return last;
}
