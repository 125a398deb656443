// head.c — the lm_head across a vocabulary split (head.h).
#include "head.h"
#include <math.h>
#include <string.h>
#include "ops.h"    // sd_linear
#include "sample.h" // sd_argmax

int sd_tp_argmax_combine(const sd_tp_argmax *local, int ranks) {
    int best = -1;
    for (int r = 0; r < ranks; r++)
        if (local[r].index >= 0 && (best < 0 || local[r].value > local[best].value)) best = r;
    return best < 0 ? 0 : local[best].index;
}

// This rank's argmax of each of n rows (count wide, ids from first).
static void local_argmax(const float *rows, int n, int count, int first, sd_tp_argmax *out) {
    for (int t = 0; t < n; t++) {
        out[t] = (sd_tp_argmax){.value = NAN, .index = -1};
        if (!count) continue;
        const float *row = rows + (size_t)t * count;
        const int i = sd_argmax(row, count);
        if (!isnan(row[i])) out[t] = (sd_tp_argmax){.value = row[i], .index = first + i};
    }
}

sd_code sd_tp_head(sd_comm *c, const sd_mat *head_rows, const float *a, int n, int V, float *full, int *argmax,
                   sd_status *st) {
    const sd_tp_plan *p = c->plan;
    const sd_tp_range mine = p->rank[c->rank].vocab;
    // This rank's n × count logits, in a block padded to n × vocab_max floats so every rank sends
    // the same bytes; its n argmax pairs after it.
    const size_t block = (size_t)n * (size_t)p->vocab_max * sizeof(float), pairs = (size_t)n * sizeof(sd_tp_argmax);
    if (!sd_comm_reserve(&c->send, &c->send_bytes, block + pairs))
        return sd_fail(st, SD_ERR_SYS, "tp: rank %d: out of memory for the head (%d rows)", c->rank, n);
    float *local = c->send;
    sd_tp_argmax *mine_rows = (sd_tp_argmax *)((char *)c->send + block);
    memset(local, 0, block);
    sd_linear(head_rows, a, n, local);

    const void *g;
    if (full) {
        sd_code rc = sd_comm_all_gather(c, -1, "head logits", local, block, &g, st);
        if (rc) return rc;
        for (int r = 0; r < p->ranks; r++) {
            const sd_tp_range v = p->rank[r].vocab;
            const float *from = (const float *)((const char *)g + (size_t)r * block);
            for (int t = 0; t < n; t++)
                memcpy(full + (size_t)t * V + v.first, from + (size_t)t * v.count, sizeof(float) * (size_t)v.count);
        }
        for (int t = 0; argmax && t < n; t++) argmax[t] = sd_argmax(full + (size_t)t * V, V);
        return SD_OK;
    }
    if (!argmax) return SD_OK;
    local_argmax(local, n, mine.count, mine.first, mine_rows);
    sd_code rc = sd_comm_all_gather(c, -1, "head argmax", mine_rows, pairs, &g, st);
    if (rc) return rc;
    const sd_tp_argmax *all = g;
    for (int t = 0; t < n; t++) {
        sd_tp_argmax col[SD_TP_MAX_RANKS];
        for (int r = 0; r < p->ranks; r++) col[r] = all[(size_t)r * n + t];
        argmax[t] = sd_tp_argmax_combine(col, p->ranks);
    }
    return SD_OK;
}
