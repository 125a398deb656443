// sample.c — the CPU reference of the sampling numerics (sample.h states the order).
#include "sample.h"
#include <math.h>
#include <string.h>

int sd_argmax(const float *x, int n) {
    if (n <= 0) return -1;
    int best = -1;
    for (int i = 0; i < n; i++) {
        if (isnan(x[i])) continue;
        if (best < 0 || x[i] > x[best]) best = i; // strict: ties keep the lowest index
    }
    return best < 0 ? 0 : best;
}

static void sd_one_hot(float *p, int n, int at) {
    for (int i = 0; i < n; i++) p[i] = i == at ? 1.0f : 0.0f;
}

void sd_softmax(const float *logits, int n, float temperature, float *p) {
    if (n <= 0) return;
    int top = sd_argmax(logits, n);
    float m = logits[top];
    if (!(temperature > 0) || !isfinite(m)) { sd_one_hot(p, n, top); return; }
    float s = 0.0f;
    for (int i = 0; i < n; i++) {
        float e = isnan(logits[i]) ? 0.0f : expf((logits[i] - m) / temperature);
        p[i] = e;
        s += e;
    }
    float inv = 1.0f / s; // s >= 1: the max contributes expf(0) = 1
    for (int i = 0; i < n; i++) p[i] *= inv;
}

int sd_sample(const float *p, int n, float u) {
    float total = 0.0f;
    int last = -1;
    for (int i = 0; i < n; i++)
        if (p[i] > 0) { total += p[i]; last = i; }
    if (last < 0) return -1;
    float target = u * total, c = 0.0f;
    for (int i = 0; i < n; i++) {
        if (!(p[i] > 0)) continue;
        c += p[i];
        if (c > target) return i;
    }
    return last; // only for u >= 1, u NaN or an infinite total (sample.h)
}

void sd_residual(const float *p, const float *q, int n, float *out) {
    float s = 0.0f;
    for (int i = 0; i < n; i++) {
        float d = p[i] - q[i];
        out[i] = d > 0 ? d : 0.0f;
        s += out[i];
    }
    if (!(s > 0)) { memcpy(out, p, (size_t)n * sizeof *out); return; }
    float inv = 1.0f / s;
    for (int i = 0; i < n; i++) out[i] *= inv;
}

void sd_stats_add_round(sd_accept_stats *s, int k, int n_accepted, int n_emitted) {
    s->rounds++;
    s->drafted += (uint64_t)k;
    s->accepted += (uint64_t)n_accepted;
    s->emitted += (uint64_t)n_emitted;
    for (int i = 0; i < n_accepted && i < SD_STATS_MAX_POSITIONS; i++) s->per_position[i]++;
    if (n_accepted >= 0 && n_accepted <= SD_STATS_MAX_POSITIONS) s->histogram[n_accepted]++;
    s->k = k;
}

double sd_stats_acceptance_rate(const sd_accept_stats *s) {
    return s->drafted ? (double)s->accepted / (double)s->drafted : 0.0;
}

double sd_stats_mean_accepted_length(const sd_accept_stats *s) {
    return s->rounds ? 1.0 + (double)s->accepted / (double)s->rounds : 0.0;
}

double sd_stats_position_rate(const sd_accept_stats *s, int i) {
    if (!s->rounds || i < 0 || i >= SD_STATS_MAX_POSITIONS) return 0.0;
    return (double)s->per_position[i] / (double)s->rounds;
}
