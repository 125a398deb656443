// cuda_scratch.c — the layout of a device state's GPU-only scratch (cuda_scratch.h): one bump over
// the state's backend_scratch, measured with the same walk.
#include "cuda_scratch.h"
#include "mla.h"      // SD_MLA_SPLIT
#include "sampling.h" // SD_ARGMAX_WS_INTS

static size_t round64(size_t n) { return (n + 63) & ~(size_t)63; }

// Lays the scratch out from base (NULL: measures only); returns its bytes.
static size_t layout(const sd_config *c, int max_T, char *base, sd_cuda_scratch *g) {
    const size_t T = (size_t)max_T, Hm = c->num_attention_heads, R = c->kv_lora_rank;
    const size_t sizes[] = {
        sizeof(float) * T * Hm * SD_MLA_SPLIT * (R + 2),
        sizeof(int) * (size_t)c->hidden_size,
        sizeof(int) * ((size_t)c->num_experts + 2),
        sizeof(int),
        sizeof(int) * SD_ARGMAX_WS_INTS(T),
    };
    void **slots[] = {(void **)&g->mla_part, (void **)&g->tickets, (void **)&g->moe_ready, (void **)&g->route_ticket,
                      (void **)&g->argmax_ws};
    size_t used = 0;
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        *slots[i] = base ? base + used : NULL;
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
