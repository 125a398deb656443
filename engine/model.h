// model.h — a loaded model (config + weights on a backend) and its forward function.
//
// A forward's head can end in the backend: argmaxes, or softmax rows plus Philox draws
// (sd_forward_opts), so a round moves a few ints to the host while its distributions stay in
// the backend's memory (sd_model_mem_alloc: host memory for the CPU, device memory for CUDA).
#pragma once
#include <stddef.h>
#include <stdint.h>
#include "config.h"  // sd_config
#include "state.h"   // sd_state
#include "trace.h"   // trace_burst
#include "weights.h" // sd_weights

struct sd_backend;
struct ledger;
struct sd_comm;

// Never copy an sd_model by value: its weight table (w.specs) points into the struct itself.
typedef struct sd_model {
    sd_config cfg;
    sd_weights w;                    // host tensors (CPU backend), or device tensors of a backend
    const struct sd_backend *backend; // NULL: the CPU reference
    char config_sha256[65];  // of config.json as read ("" for an in-memory model)
    char weights_sha256[65]; // sd_ckpt_digest of the weights as read ("" for an in-memory model)
    // NULL: the whole model on one device. Else this model is one rank's shard of a tensor-parallel
    // group (engine/parallel/): the walk all-reduces every mixer's and FFN's output there, and the
    // head works across the vocabulary split, so every rank gets the same tokens.
    struct sd_comm *comm;
} sd_model;

// Load DIR/config.json and DIR's weights, one model.safetensors or an index and its shards
// (validated: config.c, checkpoint.c, safetensors.c, weights.c).
sd_code sd_model_load(sd_model *m, const char *dir, sd_status *st);
void sd_model_free(sd_model *m);

// A sampling draw for a forward's output rows: row r uses
// u_r = sd_uniform(seed, round, pos + r, purpose) (philox.h), the same number on every backend.
typedef struct {
    uint64_t seed;
    uint32_t round;
    uint32_t pos;     // the draw position of output row 0
    uint32_t purpose; // sd_draw_purpose (philox.h)
} sd_draw;

// A route tap: one (MoE layer, token)'s selection read back on the host, in walk order, and its
// routing margin (route.h: how far the selection stands from changing, expert and group).
typedef void (*sd_route_tap)(void *ctx, int layer, int pos, const int *sel, const float *w, int k, float margin);

// A route override: called once per (MoE layer, token) after the router has chosen and before the
// experts run; it may rewrite sel[0..k) (expert ids, 0 .. num_experts-1) and w[0..k) (the weights
// the combine uses). The teacher-forced reference: the token path under another path's routing
// (tests/test_cuda_prefill.c holds the prefill to the token path routed as the prefill routed).
// The route tap then reports the rewritten selection beside the router's own margin. The CPU
// reference honours it; a forward on any other backend with an override refuses (SD_ERR_UNSUPPORTED).
typedef void (*sd_route_override)(void *ctx, int layer, int pos, int *sel, float *w, int k);

// What a forward reports besides logits. All optional.
typedef struct {
    trace_burst *trace; // level-2 verify buckets tick here when trace->level >= 2 (verify only)
    // Called once per (MoE layer, token) with the router's selection, in walk order.
    sd_route_tap on_route;
    void *route_ctx;
    // Called once per (MoE layer, token) before its experts run (the CPU reference only).
    sd_route_override override_route;
    void *override_ctx;
    // The selection ledger's device arm (ledger/ledger.h): each MoE layer's sel/w copied into its
    // pre-armed slot where the walk keeps them (device memory on a GPU, inside a captured graph
    // too; the CPU stand-in on the host). No host readback; NULL: off.
    struct ledger *ledger;
    // Each output row's sd_argmax (T rows, or 1 with last_only) when not NULL. With logits NULL
    // the head still runs but its logits stay in the backend: greedy rounds move T ints, not
    // T·V floats.
    int *argmax;
    // Sampling in the backend, active when probs or sampled is set. Output row r (n_out rows:
    // T, or 1 with last_only) becomes P_r = sd_softmax(logits_r, V, temperature) in probs + r·V
    // (n_out × V floats in the model's backend memory: host for the CPU, the device's for CUDA;
    // NULL: the state's logits scratch, overwritten), and sampled[r] (host memory) =
    // sd_sample(P_r, V, u_r) with u_r from draw. temperature > 0 samples; <= 0 gives
    // sd_softmax's limit (one-hot rows, sampled = argmax). The logits leave the backend only
    // when the logits argument asks for them.
    float temperature;
    float *probs;
    sd_draw draw;
    int *sampled;
} sd_forward_opts;

// Run T tokens at the next positions p0 = s->len + s->pending .. p0+T-1 (T = 1 decode, k+1
// verify, a prompt chunk) and add them to the pending positions (sd_state_commit keeps a
// prefix). logits (T, V) may be NULL (skips the head), or last_only: only row T-1 is computed,
// into logits[0..V). Errors: pending + T above max_T, a token outside the vocabulary, the
// context full (capacity), or — for a rank of a group — a failed collective (the group is then
// broken) — each leaves the state as it was.
sd_code sd_forward(const sd_model *m, sd_state *s, const int *tokens, int T, float *logits, int last_only,
                   const sd_forward_opts *opts, sd_status *st);

// Non-finite activations. A forward whose activations hold a NaN or an Inf fails with
// SD_ERR_NONFINITE and one line naming where the first one appeared, never with NaN logits and
// SD_OK: the residual stream is checked after the embedding, after each layer's mixer and FFN
// (their outputs added), and the logits after the head. The site of a check, as one int so a
// device flag can keep the first one with atomicMin (engine/cuda): 0 the embedding, 1 + 2i after
// layer i's mixer, 2 + 2i after its FFN, 1 + 2L the head; SD_NONFINITE_NONE when all is finite.
// The failed forward leaves the state as it was (its pending positions are not advanced).
#define SD_NONFINITE_NONE 0x7fffffff
static inline int sd_nonfinite_site_mixer(int layer) { return 1 + 2 * layer; }
static inline int sd_nonfinite_site_ffn(int layer) { return 2 + 2 * layer; }
static inline int sd_nonfinite_site_head(const sd_config *c) { return 1 + 2 * c->num_hidden_layers; }
// "non-finite activations first at layer N (after the mixer)" and the like, as SD_ERR_NONFINITE.
sd_code sd_nonfinite_fail(const sd_config *c, int site, sd_status *st);
// true when none of x[0..n) is a NaN or an Inf (one pass, no branch per element).
bool sd_all_finite(const float *x, size_t n);

// The checks every forward makes before it runs (sd_forward's errors above; a graph replay's too).
sd_code sd_forward_check(const sd_model *m, const sd_state *s, const int *tokens, int T, sd_status *st);

// A state for m on m's backend (host memory for the CPU, the device's for a device model).
sd_code sd_model_state_init(const sd_model *m, sd_state *s, int capacity, int max_T, sd_status *st);

// bytes of the model's backend memory (malloc for the CPU; the state allocator of a backend),
// e.g. a round's distributions for sd_forward_opts.probs. NULL on failure. Release with
// sd_model_mem_free (p may be NULL).
void *sd_model_mem_alloc(const sd_model *m, size_t bytes);
void sd_model_mem_free(const sd_model *m, void *p);

// Drain the model's backend (a no-op on the CPU): the sync a trace boundary calls.
void sd_model_sync(void *model);

// Feed n tokens and commit them; logits of the last token (V) if last_logits is not NULL.
// Prompts of up to SD_PREFILL_TOKEN_PATH_MAX tokens, and every prompt on a backend without a
// prefill entry (the CPU reference), run as forwards of at most s->max_T tokens, each committed;
// longer ones as the backend's prefill (docs/PREFILL.md: equal to the token path within MODEL.md's
// tolerance, not bit for bit) — except on a rank of a tensor-parallel group, which always takes the
// token path (the backend's prefill has no collectives). The path depends on n alone, never on the state, so a plain and a
// speculative run of one prompt prefill alike (spec ≡ greedy holds after either).
#define SD_PREFILL_TOKEN_PATH_MAX 32
sd_code sd_prefill(const sd_model *m, sd_state *s, const int *tokens, int n, float *last_logits, sd_status *st);
// What a prefill reports besides logits: the route tap, once per (MoE layer, token) in walk order
// (a piece's layers, each layer's tokens). On the token path it is the forward's tap; the CUDA
// prefill reads each MoE layer's selection and router logits back for it (a diagnostic readback,
// not the fast path).
typedef struct {
    sd_route_tap on_route;
    void *route_ctx;
} sd_prefill_opts;
// The same with the logits of every position (n × V) when all_rows (`specdec forward --mode
// prefill`); logits and opts may be NULL.
sd_code sd_prefill_rows(const sd_model *m, sd_state *s, const int *tokens, int n, float *logits, bool all_rows,
                        const sd_prefill_opts *opts, sd_status *st);
