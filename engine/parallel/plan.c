// plan.c — the even split and the group plan (plan.h).
#include "plan.h"
#include <stdio.h>
#include <string.h>

sd_tp_range sd_tp_split(int n, int ranks, int rank) {
    const int base = n / ranks, extra = n % ranks;
    return (sd_tp_range){.first = rank * base + (rank < extra ? rank : extra), .count = base + (rank < extra)};
}

sd_code sd_tp_plan_make(const sd_config *c, int ranks, sd_tp_plan *p, sd_status *st) {
    memset(p, 0, sizeof *p);
    if (ranks < 1 || ranks > SD_TP_MAX_RANKS)
        return sd_fail(st, SD_ERR_USAGE, "tp: the number of ranks must be in 1..%d, got %d", SD_TP_MAX_RANKS, ranks);
    if (c->shard.ranks) return sd_fail(st, SD_ERR_USAGE, "tp: a plan splits a whole model, not rank %d's shard", c->shard.rank);
    p->ranks = ranks;
    for (int r = 0; r < ranks; r++) {
        sd_tp_share *s = &p->rank[r];
        s->kda_heads = sd_tp_split(c->kda_num_heads, ranks, r);
        s->mla_heads = sd_tp_split(c->num_attention_heads, ranks, r);
        s->dense = sd_tp_split(c->intermediate_size, ranks, r);
        s->shared = sd_tp_split(sd_config_shared_width(c), ranks, r);
        s->experts = sd_tp_split(c->num_experts, ranks, r);
        s->vocab = sd_tp_split(c->vocab_size, ranks, r);
        if (s->vocab.count > p->vocab_max) p->vocab_max = s->vocab.count;
    }
    return SD_OK;
}

static int range_str(char *buf, size_t len, const char *name, sd_tp_range r) {
    if (!r.count) return snprintf(buf, len, " %s -", name);
    return snprintf(buf, len, " %s %d-%d", name, r.first, r.first + r.count - 1);
}

void sd_tp_plan_describe(const sd_tp_plan *p, char *buf, size_t len) {
    size_t o = (size_t)snprintf(buf, len, "%d rank%s:", p->ranks, p->ranks == 1 ? "" : "s");
    for (int r = 0; r < p->ranks && o < len; r++) {
        const sd_tp_share *s = &p->rank[r];
        o += (size_t)snprintf(buf + o, len - o, "%s r%d", r ? ";" : "", r);
        if (o < len) o += (size_t)range_str(buf + o, len - o, "kda", s->kda_heads);
        if (o < len) o += (size_t)range_str(buf + o, len - o, "mla", s->mla_heads);
        if (o < len) o += (size_t)range_str(buf + o, len - o, "dense", s->dense);
        if (o < len) o += (size_t)range_str(buf + o, len - o, "shared", s->shared);
        if (o < len) o += (size_t)range_str(buf + o, len - o, "experts", s->experts);
        if (o < len) o += (size_t)range_str(buf + o, len - o, "vocab", s->vocab);
    }
}
