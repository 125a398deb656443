// weights.h — the model's tensors as plain structs (llama2.c style), one arena per model, and
// the table that names every tensor MODEL.md requires for a config. The same table drives
// loading (names and shapes validated against the file) and synthesis (`specdec init`).
#pragma once
#include <stdbool.h>
#include "config.h"      // sd_config
#include "tensor.h"      // sd_mat
#include "checkpoint.h"  // sd_checkpoint

typedef struct {
    sd_mat q, k, v;            // (P, D) each, P = Hk·d
    float *q_conv, *k_conv, *v_conv; // (P, W) depthwise causal taps; tap W-1 is the current token
    float *A_log;              // (Hk)
    float *dt_bias;            // (P)
    sd_mat f_a, f_b;           // (d, D), (P, d): decay gate, low rank
    sd_mat b;                  // (Hk, D): beta
    sd_mat g_a, g_b;           // (d, D), (P, d): output gate, low rank
    float *o_norm;             // (d)
    sd_mat o;                  // (D, P)
} sd_kda_weights;

typedef struct {
    sd_mat q;                  // (Hm·(dn+dr), D)
    sd_mat kv_a;               // (R+dr, D)
    float *kv_a_norm;          // (R)
    sd_mat kv_b;               // (Hm·(dn+dv), R): per head dn rows W_UK,h then dv rows W_UV,h
    sd_mat o;                  // (D, Hm·dv)
} sd_mla_weights;

typedef struct {
    sd_mat gate, up;           // (I, D)
    sd_mat down;               // (D, I)
} sd_ffn_weights;

typedef struct {
    float *router;             // (E, D), F32 whatever the file dtype
    float *bias;               // (E) e_score_correction_bias, F32
    sd_ffn_weights *experts;   // E of them, Ie wide
    sd_ffn_weights shared;     // S·Ie wide
} sd_moe_weights;

typedef struct {
    float *input_norm;         // (D)
    float *post_norm;          // (D)
    sd_mixer mixer;
    sd_kda_weights kda;        // when mixer == SD_MIXER_KDA
    sd_mla_weights mla;        // when mixer == SD_MIXER_MLA
    bool is_moe;
    sd_ffn_weights dense;      // when !is_moe
    sd_moe_weights moe;        // when is_moe
} sd_layer_weights;

typedef struct {
    sd_mat embed;              // (V, D)
    float *final_norm;         // (D)
    sd_mat lm_head;            // (V, D); = embed when tie_word_embeddings
    sd_layer_weights *layers;  // L
    sd_ffn_weights *expert_pool; // L·E experts, sliced into layers[i].moe.experts
    struct sd_weight_spec *specs; // the index of every tensor (below), in file order
    int n_specs;
    void *arena;               // every tensor lives here
    size_t arena_bytes;
} sd_weights;

// How synthesis scales a tensor (see synth.c for the values and why).
typedef enum {
    SD_ROLE_MATRIX,    // a Linear read by the residual stream: std 1/sqrt(in)
    SD_ROLE_RESIDUAL,  // a Linear writing the residual stream (o_proj, down_proj)
    SD_ROLE_EMBED,     // embedding rows: unit RMS
    SD_ROLE_HEAD,      // lm_head: logit spread
    SD_ROLE_NORM,      // norm weights: 1 ± small
    SD_ROLE_CONV,      // short-conv taps
    SD_ROLE_A_LOG,
    SD_ROLE_DT_BIAS,
    SD_ROLE_ROUTER,
    SD_ROLE_ROUTER_BIAS,
} sd_weight_role;

// One tensor MODEL.md requires: its name, canonical shape, where it goes, how it is synthesised.
typedef struct sd_weight_spec {
    char name[96];
    int ndim;
    int64_t shape[2];
    bool keep_dtype;        // big matrices keep BF16/F32; vectors and routing are forced to F32
    sd_dtype dtype;         // in-memory dtype, set before sd_weights_alloc (F32 unless keep_dtype)
    sd_weight_role role;
    int layer;              // -1 for global tensors
    sd_mat *mat;            // destination when keep_dtype
    float **vec;            // destination when !keep_dtype
} sd_weight_spec;

// Plan w for cfg: the layer tables and w->specs (every tensor, dtype F32 until the caller sets
// the matrices' dtype), destinations pointing into w. Nothing allocated for the data yet.
sd_code sd_weights_plan(const sd_config *cfg, sd_weights *w, sd_status *st);

// The bytes of w's arena (each tensor in its spec's dtype, 64-byte aligned), checked for overflow
// before any allocation.
sd_code sd_weights_arena_bytes(const sd_weights *w, uint64_t *bytes, sd_status *st);

// Allocate one arena for w->specs (each tensor in its spec's dtype, 64-byte aligned) and point
// every destination into it. Contents are uninitialised. Refused (naming both sizes) when the
// arena exceeds this host's physical memory.
sd_code sd_weights_alloc(sd_weights *w, sd_status *st);

// The data of a planned, allocated tensor.
static inline const void *sd_weight_data(const sd_weight_spec *s) {
    return s->keep_dtype ? s->mat->data : (const void *)*s->vec;
}

// Load from an opened checkpoint: every required tensor present with its shape (the
// alternatives MODEL.md allows accepted), dtypes F32/BF16/F16; each fault named with the file
// that holds it. Tensors the published checkpoints carry that this model does not use are
// skipped: layers at or beyond num_hidden_layers (multi-token prediction) and lm_head.weight
// beside tie_word_embeddings; any other tensor the config does not require is an error.
// Matrices keep BF16 when the file has BF16 (F16 → F32).
sd_code sd_weights_load(const sd_config *cfg, const sd_checkpoint *c, sd_weights *w, sd_status *st);

void sd_weights_free(sd_weights *w);
