// route_log.c — the per-rank route records and the cross-rank verdict (route_log.h).
#include "route_log.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void sd_tp_route_record(void *ctx, int layer, int pos, const int *sel, const float *w, int k, float margin) {
    (void)margin; // the ranks compare sel and w; the margin follows from the same logits
    sd_tp_route_log *log = ctx;
    if (log->broken) return;
    if (k > 16 || (log->k && k != log->k)) { log->broken = true; return; }
    if (log->n == log->cap) {
        size_t cap = log->cap ? 2 * log->cap : 256;
        sd_tp_route *v = realloc(log->v, cap * sizeof *v);
        if (!v) { log->broken = true; return; }
        log->v = v;
        log->cap = cap;
    }
    sd_tp_route *r = &log->v[log->n++];
    memset(r, 0, sizeof *r);
    r->layer = layer;
    r->pos = pos;
    memcpy(r->sel, sel, sizeof(int) * (size_t)k);
    memcpy(r->w, w, sizeof(float) * (size_t)k);
    log->k = k;
}

void sd_tp_route_log_free(sd_tp_route_log *log) {
    free(log->v);
    memset(log, 0, sizeof *log);
}

static bool same(const sd_tp_route *a, const sd_tp_route *b, int k) {
    return a->layer == b->layer && a->pos == b->pos && memcmp(a->sel, b->sel, sizeof(int) * (size_t)k) == 0 &&
           memcmp(a->w, b->w, sizeof(float) * (size_t)k) == 0;
}

static int show(char *buf, size_t len, const sd_tp_route *r, int k) {
    int o = snprintf(buf, len, "sel");
    for (int j = 0; j < k; j++) o += snprintf(buf + o, len - (size_t)o, "%s%d", j ? "," : " ", r->sel[j]);
    o += snprintf(buf + o, len - (size_t)o, " w");
    for (int j = 0; j < k; j++) o += snprintf(buf + o, len - (size_t)o, "%s%.9g", j ? "," : " ", r->w[j]);
    return o;
}

// The rank at record i that agrees with the fewest others (the odd one out; ties: the higher
// rank, so two ranks alone name rank 1 against rank 0), and a rank of the largest agreeing set.
static void odd_one(const sd_tp_route_log *logs, int ranks, size_t i, int k, int *odd, int *base) {
    int fewest = ranks + 1, most = -1;
    for (int r = 0; r < ranks; r++) {
        int agree = 0;
        for (int q = 0; q < ranks; q++) agree += same(&logs[r].v[i], &logs[q].v[i], k);
        if (agree <= fewest) { fewest = agree; *odd = r; }
        if (agree > most) { most = agree; *base = r; }
    }
}

void sd_tp_routes_compare(const sd_tp_route_log *logs, int ranks, sd_tp_route_verdict *v) {
    memset(v, 0, sizeof *v);
    v->rank = v->other = v->layer = v->pos = -1;
    for (int r = 0; r < ranks; r++)
        if (logs[r].broken) {
            v->rank = r;
            snprintf(v->msg, sizeof v->msg, "tp routes: rank %d's log is unusable (out of memory or k > 16)", r);
            return;
        }
    size_t n = logs[0].n;
    for (int r = 1; r < ranks; r++)
        if (logs[r].n != n) {
            v->rank = r;
            v->other = 0;
            snprintf(v->msg, sizeof v->msg, "tp routes: rank %d recorded %zu routes, rank 0 %zu", r, logs[r].n, n);
            return;
        }
    const int k = logs[0].k;
    for (size_t i = 0; i < n; i++) {
        bool all = true;
        for (int r = 1; r < ranks && all; r++) all = same(&logs[r].v[i], &logs[0].v[i], k);
        if (all) continue;
        odd_one(logs, ranks, i, k, &v->rank, &v->other);
        if (v->other == v->rank) v->other = v->rank ? 0 : 1;
        const sd_tp_route *a = &logs[v->rank].v[i], *b = &logs[v->other].v[i];
        v->layer = b->layer;
        v->pos = b->pos;
        char sa[96], sb[96];
        show(sa, sizeof sa, a, k);
        show(sb, sizeof sb, b, k);
        snprintf(v->msg, sizeof v->msg, "tp routes: rank %d differs from rank %d at layer %d, token %d: %s vs %s", v->rank,
                 v->other, b->layer, b->pos, sa, sb);
        return;
    }
    v->agree = true;
    snprintf(v->msg, sizeof v->msg, "tp routes: %d ranks agree on %zu routes", ranks, n);
}
