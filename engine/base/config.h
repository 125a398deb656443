// config.h — config.json of a kimi_linear model (MODEL.md "config.json"), loaded and validated.
#pragma once
#include <stdbool.h>
#include <stdint.h>
#include "status.h" // sd_status

#define SD_MAX_LAYERS 256
#define SD_MAX_EOS_IDS 16

typedef enum { SD_MIXER_KDA = 0, SD_MIXER_MLA = 1 } sd_mixer;

// What one rank of a tensor-parallel group holds beyond the local widths that a shard config
// carries in the ordinary fields (its KDA and MLA heads, its dense intermediate width). Made
// only by the shard constructor (engine/parallel/shard.h), which bypasses the validation of
// sd_config_parse: a shard may hold none of a kind. Zero (ranks == 0) in every config read from
// a file: the whole model.
typedef struct {
    int ranks, rank;                 // ranks == 0: not a shard
    int expert_first, expert_count;  // the routed experts held: [first, first + count) of num_experts
    int shared_width;                // the shared experts' intermediate columns held (of S·Ie)
    int vocab_first, vocab_count;    // the lm_head rows held: [first, first + count) of vocab_size
} sd_config_shard;

typedef struct sd_config {
    int vocab_size;          // V
    int hidden_size;         // D
    int num_hidden_layers;   // L
    float rms_norm_eps;
    bool tie_word_embeddings;
    // MLA geometry
    int num_attention_heads; // Hm
    int kv_lora_rank;        // R
    int qk_nope_head_dim;    // dn
    int qk_rope_head_dim;    // dr
    int v_head_dim;          // dv
    bool mla_use_nope;       // true: no RoPE anywhere
    double rope_theta;
    // KDA geometry (linear_attn_config)
    int kda_num_heads;       // Hk
    int kda_head_dim;        // d (dk = dv = d)
    int short_conv_kernel_size; // W
    sd_mixer mixer[SD_MAX_LAYERS]; // per 0-based layer, from kda_layers / full_attn_layers
    // FFN
    int first_k_dense_replace; // F: layers 0..F-1 are dense
    int intermediate_size;     // I
    int num_experts;           // E
    int num_experts_per_token; // K
    int num_shared_experts;    // S
    int moe_intermediate_size; // Ie
    bool moe_renormalize;
    float routed_scaling_factor;
    int num_expert_group;      // G
    int topk_group;
    sd_config_shard shard;     // a rank's share (above); zero for a user config
    // Generation: eos_token_id, optional, one id or a list (each in 0..V-1); a run stops after
    // committing any of them.
    int eos_token_id[SD_MAX_EOS_IDS];
    int n_eos_token_ids;       // 0: absent or null
} sd_config;

// Parse and validate config JSON text; `name` (the file path) prefixes every error, which names
// the key and the rule it breaks: "configs/x.json: key 'num_experts_per_token': must be <= num_experts (8), got 9".
sd_code sd_config_parse(const char *json, const char *name, sd_config *cfg, sd_status *st);
// Read a file and parse it.
sd_code sd_config_load(const char *path, sd_config *cfg, sd_status *st);
// Serialise to config.json text (every key MODEL.md lists; q_lora_rank null). Caller frees.
char *sd_config_to_json(const sd_config *cfg);

// The sizes the config implies, from the config alone (config_sizes.c): every width the engine
// keeps in an int fits one, the tensor table holds at most SD_MAX_TENSORS and the weights (at
// F32) at most SD_MAX_MODEL_BYTES; else SD_ERR_DATA naming `name` and the key at fault. Part of
// sd_config_parse's validation.
sd_code sd_config_check_sizes(const sd_config *c, const char *name, sd_status *st);
// The weights' bytes at F32 (an upper bound for any dtype mix) and the key of their largest part;
// SD_ERR_DATA (bytes = UINT64_MAX) when they overflow 64 bits.
sd_code sd_config_weight_bytes(const sd_config *c, uint64_t *bytes, const char **key);
// How many tensors the model holds (the weight table's length).
int64_t sd_config_tensor_count(const sd_config *c);

// Derived sizes.
static inline int sd_config_kda_dim(const sd_config *c) { return c->kda_num_heads * c->kda_head_dim; } // P
static inline bool sd_config_is_moe(const sd_config *c, int layer) { return layer >= c->first_k_dense_replace; }
// What this config's model holds: every expert, the whole shared width and the whole head,
// unless it is a rank's shard.
static inline bool sd_config_holds_expert(const sd_config *c, int e) {
    return !c->shard.ranks || (e >= c->shard.expert_first && e < c->shard.expert_first + c->shard.expert_count);
}
static inline int sd_config_shared_width(const sd_config *c) {
    return c->shard.ranks ? c->shard.shared_width : c->num_shared_experts * c->moe_intermediate_size;
}
static inline int sd_config_head_rows(const sd_config *c) { return c->shard.ranks ? c->shard.vocab_count : c->vocab_size; }
