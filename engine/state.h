// state.h — one sequence's caches: MLA latent caches, KDA states and conv windows, plus the
// scratch a forward of up to max_T tokens needs.
//
// Everything is indexed by absolute position, so rollback is bookkeeping, not copying:
//   - MLA: c and kpe of position p live in row p (capacity rows; overflow is "context full").
//   - KDA state: S after the first n tokens lives in slot n % (max_T + 1). A forward of T <= max_T
//     tokens from length n writes slots n+1 .. n+T and never the slot of n.
//   - conv windows: the raw q/k/v projections of position p live in row p % (max_T + W - 1), so
//     the W-1 committed inputs a window needs are never overwritten by a forward's T new rows.
// The committed and pending counts live twice: len and pending on the host (the bookkeeping every
// check reads) and cursor = {len, pending} in the state's own memory, where device kernels read
// the position a launch starts at (kernels/cursor.h) — so a captured forward needs no position
// argument. Every change of len/pending here updates both; a device forward advances the cursor
// on its stream.
// Forwards append pending positions (up to max_T in all, e.g. a draft's k single-token steps or
// one (k+1)-token verify); sd_state_commit(n) keeps exactly the first n of them and drops the
// rest, after which every live byte equals that of a state that only ever saw those tokens.
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include "config.h" // sd_config

typedef struct {
    float *S;    // (max_T+1, Hk, d, d) fp32; S[slot][h][i][j]: key dim i, value dim j
    float *conv; // (max_T+W-1, 3P): raw q, k, v projections by position
} sd_kda_state;

typedef struct {
    float *c;    // (capacity, R) normalised latents
    float *kpe;  // (capacity, dr) rope keys (rotated when RoPE is on)
} sd_mla_state;

// Scratch for one forward of up to max_T tokens (contents meaningless between calls).
typedef struct {
    float *x, *a, *mix;                 // (T, D) residual, normed input, sublayer output
    float *q, *k, *v, *qc, *kc, *vc;    // (T, P) KDA raw and convolved
    float *gate, *fa, *ga, *gb, *beta, *y; // KDA gates (T,P), (T,d), (T,d), (T,P), (T,Hk), (T,P)
    float *mq, *kv, *qabs, *lat, *mo;   // MLA (T,Hm(dn+dr)), (T,R+dr), (T,Hm,R), (T,Hm,R), (T,Hm dv)
    float *scores;                      // (Hm, capacity) one row per head
    float *ffn_h1, *ffn_h2;             // (T, max FFN width)
    float *exp_out;                     // (T, K, D) routed expert outputs
    float *xg, *yg;                     // (T, D) gathered tokens of one expert and their outputs
    float *router;                      // (T, E) the router's logits
    void *route_work;                   // the host selection's work (route.h; the CPU walk's)
    float *logits;                      // (T, V) the head's output when the caller wants argmaxes only
    int *sel;                           // (T, K)
    float *w;                           // (T, K)
    int *expert_rows;                   // (2, T·K) the CPU MoE's (token, slot) of each gathered row
} sd_scratch;

// Where a state's arena lives: host memory (NULL allocator) or a backend's device memory.
typedef struct sd_allocator {
    void *(*alloc)(size_t bytes, void *ctx); // NULL on failure
    void (*free)(void *p, void *ctx);
    void (*zero)(void *p, size_t bytes, void *ctx);
    // cursor = {len, pending} in this memory, ordered before any later work on the state.
    void (*set_cursor)(int *cursor, int len, int pending, void *ctx);
    // Bytes of scratch of the backend's own that each state carries at the end of its arena
    // (sd_state.backend_scratch, zeroed with the state), or NULL: none.
    size_t (*scratch_bytes)(const sd_config *cfg, int max_T, void *ctx);
    void *ctx;
} sd_allocator;

typedef struct sd_state {
    const sd_config *cfg;
    const sd_allocator *mem; // NULL: host memory
    int capacity; // positions the MLA caches hold
    int max_T;    // the largest forward
    int len;      // committed positions
    int pending;  // positions computed since the last commit (len .. len+pending-1)
    int *cursor;  // {len, pending} in the state's memory (what device kernels read)
    sd_kda_state *kda; // per layer (NULL arrays for MLA layers)
    sd_mla_state *mla; // per layer (NULL arrays for KDA layers)
    sd_scratch scratch;
    void *backend_scratch; // the allocator's scratch_bytes at the arena's end, or NULL
    void *arena;
    size_t arena_bytes;
} sd_state;

// A state for cfg holding `capacity` positions, forwards of up to max_T tokens; zeroed caches.
// Its bytes are counted in 64 bits first: a count that overflows is SD_ERR_DATA, a host state
// beyond the host's physical memory SD_ERR_UNSUPPORTED naming both sizes — before any allocation.
sd_code sd_state_init(sd_state *s, const sd_config *cfg, int capacity, int max_T, sd_status *st);
// The same layout in memory from `mem` (e.g. device memory: the pointers are the device's).
sd_code sd_state_init_on(sd_state *s, const sd_config *cfg, int capacity, int max_T, const sd_allocator *mem,
                         sd_status *st);
void sd_state_free(sd_state *s);
// Back to the empty sequence (length 0).
void sd_state_reset(sd_state *s);
// T more pending positions, after a forward of T tokens: pending += T (a host state's cursor too;
// a device state's cursor was advanced on the device's stream by the forward's last launch).
void sd_state_advance(sd_state *s, int T);
// Keep the first n of the pending positions (0 <= n <= pending) and drop the rest.
sd_code sd_state_commit(sd_state *s, int n, sd_status *st);
// The host's side of a commit the device already made (a captured round: its cursor says
// {len + n, 0}, kernels/cursor.h sd_cuda_cursor_commit): len += n, pending = 0, no cursor write.
void sd_state_committed_on_device(sd_state *s, int n);

// Slot and row helpers (the indexing rules above).
static inline int sd_state_slot(const sd_state *s, int n) { return n % (s->max_T + 1); }
static inline int sd_state_conv_row(const sd_state *s, int pos) {
    return pos % (s->max_T + s->cfg->short_conv_kernel_size - 1);
}
// The position the next forward's first token takes.
static inline int sd_state_next_pos(const sd_state *s) { return s->len + s->pending; }
float *sd_state_kda_S(const sd_state *s, int layer, int n); // S after n tokens, all heads

// sha256 (hex) of the live state only (host states): len, each KDA layer's S after len tokens and the conv
// inputs of positions len-W+1 .. len-1 (zeros before position 0), each MLA layer's rows
// 0 .. len-1. Equal hashes ⇔ equal observable state (what rollback promises).
void sd_state_live_hash(const sd_state *s, char hex[65]);
