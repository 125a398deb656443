// norm.c — RMSNorm of the CPU reference.
#include "ops.h"

void sd_rmsnorm(const float *x, const float *w, int n, float eps, float *out) {
    float ss = sd_dot_f32(x, x, n);
    float scale = 1.0f / sqrtf(ss / (float)n + eps);
    for (int i = 0; i < n; i++) out[i] = (x[i] * scale) * w[i];
}
