// cuda_scratch.c — the layout of a device state's GPU-only scratch (cuda_scratch.h): one bump over
// the state's backend_scratch, measured with the same walk.
#include "cuda_scratch.h"
#include "mla.h"      // SD_MLA_SPLIT
#include "sampling.h" // SD_ARGMAX_WS_INTS
#include "parallel/plan.h" // sd_tp_split
#include "tp_head.h"       // sd_cuda_tp_pick

static size_t round64(size_t n) { return (n + 63) & ~(size_t)63; }

int sd_cuda_tp_vocab_max(const sd_config *cfg) {
    return cfg->shard.ranks ? sd_tp_split(cfg->vocab_size, cfg->shard.ranks, 0).count : 0; // rank 0 holds the most
}

// Lays the scratch out from base (NULL: measures only); returns its bytes.
static size_t layout(const sd_config *c, int max_T, char *base, sd_cuda_scratch *g) {
    const size_t T = (size_t)max_T, Hm = c->num_attention_heads, R = c->kv_lora_rank;
    const size_t N = (size_t)c->shard.ranks, Vm = (size_t)sd_cuda_tp_vocab_max(c), D = (size_t)c->hidden_size;
    const size_t sizes[] = {
        sizeof(float) * T * Hm * SD_MLA_SPLIT * (R + 2),
        sizeof(int) * (size_t)c->hidden_size,
        sizeof(int) * ((size_t)c->num_experts + 2),
        sizeof(int),
        sizeof(int) * SD_ARGMAX_WS_INTS(T),
        sizeof(float) * N * T * (D > Vm ? D : Vm),
        sizeof(float) * T * Vm,
        sizeof(sd_cuda_tp_pick) * (N ? T : 0),
        sizeof(int) * (N ? T : 0),
    };
    void **slots[] = {(void **)&g->mla_part, (void **)&g->tickets, (void **)&g->moe_ready, (void **)&g->route_ticket,
                      (void **)&g->argmax_ws, (void **)&g->tp_gather, (void **)&g->tp_head, (void **)&g->tp_pairs,
                      (void **)&g->tp_idx};
    size_t used = 0;
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        *slots[i] = base && sizes[i] ? base + used : NULL;
        used += round64(sizes[i]);
    }
    return used;
}

size_t sd_cuda_scratch_bytes(const sd_config *cfg, int max_T) {
    sd_cuda_scratch g;
    return layout(cfg, max_T, NULL, &g);
}

sd_cuda_scratch sd_cuda_scratch_of(const sd_state *s) {
    sd_cuda_scratch g;
    layout(s->cfg, s->max_T, s->backend_scratch, &g);
    return g;
}
