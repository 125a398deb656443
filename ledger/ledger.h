// ledger.h — the graph selection ledger: a gate instrument, never a serving mode. It records the
// MoE routing (sel, w) of two arms so a gate can compare them per (device, layer, token), bit for
// bit (`specdec gate graph-sel`):
//   device arm: inside the captured CUDA graph, the router's own sel/w buffers are copied
//               device-to-device into a persistent slot per (device, layer) — a memcpy node at a
//               fixed address: no sync, no allocation, no readback inside the capture. The slots
//               are pre-armed (allocated, sel filled with -1) before any capture opens, because an
//               allocation inside a capture becomes a graph memory node whose address is recycled;
//               a layer with no slot is skipped, never allocated. After the step, outside the
//               capture, the slots are drained to host rows.
//   host arm:   the eager walk's host-read selection (the host oracle), appended to host rows.
// An unwritten slot reads as expert -1: a mismatch, never a match with expert 0. Each arm's entry
// counter ticks before any guard, so "nothing was recorded" is never mistaken for "nothing
// differed". Disarmed, every call returns at once: the ledger changes no kernel, operand or
// launch order.
//
// The ledger knows no device API: the memory of its slots and the copies go through an
// ledger_device table (the CUDA backend's, or ledger_host_device(), a CPU stand-in).
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "status.h" // sd_code, sd_status

#define LEDGER_MAX_K 32 // experts a token selects, at most

// Where the slots live and how bytes move there. dev is the device ordinal; stream is the
// forward's stream (opaque here: a cudaStream_t for the CUDA backend, unused by the stand-in).
typedef struct {
    void *(*alloc)(int dev, size_t bytes, void *ctx); // NULL on failure
    void (*free)(int dev, void *p, void *ctx);
    // host -> slot, synchronous (the sentinel fill, the canary).
    sd_code (*upload)(int dev, void *dst, const void *src, size_t bytes, void *ctx, sd_status *st);
    // device buffer -> slot, ordered on `stream` (inside a capture: a memcpy node).
    sd_code (*copy)(int dev, void *dst, const void *src, size_t bytes, void *stream, void *ctx, sd_status *st);
    // slot -> host, synchronous with every earlier copy of the device.
    sd_code (*download)(int dev, void *dst, const void *src, size_t bytes, void *ctx, sd_status *st);
    void *ctx;
} ledger_device;

// The CPU stand-in: slots in host memory, every copy a memcpy (tests and the CPU backend's gate).
const ledger_device *ledger_host_device(void);

// One token's selection at one layer: K expert ids in selection order and their weights.
typedef struct {
    int dev, layer, pos;
    int k;
    int sel[LEDGER_MAX_K];
    float w[LEDGER_MAX_K];
    float margin; // route.h's routing margin (expert and group) where the arm knows it, else NAN
    // A position is routed again when a round re-verifies it after a rejection, so a row is known
    // by (dev, layer, pos, occ): occ is the how-many-th row of its (dev, layer, pos) in its arm,
    // from 0, in record order (seq) — set by the comparison; the n-th routing of a position in
    // one arm is compared with the n-th in the other.
    uint64_t seq; // the arm's record order: the host arm's call count, the device arm's drain count
    int occ;
} ledger_row;

typedef struct {
    int dev, layer;
    int n;      // entries (token, slot) the slot holds: the largest forward's T·K
    int *sel;   // (n) in the device's memory
    float *w;   // (n)
    int filled; // entries the last record wrote
} ledger_slot;

typedef struct ledger {
    const ledger_device *d;
    bool armed;
    ledger_slot *slots;
    int n_slots, cap_slots;
    ledger_row *host;
    size_t n_host, cap_host;
    uint64_t device_entries, host_entries; // calls of record_device / record_host, armed or not
    uint64_t drains;                       // drain_device calls: the device rows' seq
} ledger;

// A ledger over d; disarmed, every record is a no-op (beyond its entry counter).
void ledger_init(ledger *L, const ledger_device *d, bool armed);
void ledger_free(ledger *L);

// Allocates the slot of (dev, layer) for n entries if it has none (sel = -1, w = 0). Call before
// any capture opens. Errors: out of the device's memory, n < 1.
sd_code ledger_prearm(ledger *L, int dev, int layer, int n, sd_status *st);

// Device arm: copies n entries of sel/w (the router's buffers, in dev's memory) into the slot of
// (dev, layer) on `stream`. No slot: skipped. More entries than the slot holds: the slot's n.
sd_code ledger_record_device(ledger *L, int dev, int layer, const int *sel, const float *w, int n, void *stream,
                             sd_status *st);

// Host arm: one token's host-read selection.
sd_code ledger_record_host(ledger *L, int dev, int layer, int pos, const int *sel, const float *w, int k, float margin,
                           sd_status *st);

// The device slots of dev after a step of T tokens at positions pos0 .. pos0+T-1 with K experts a
// token, as rows ordered by (layer, pos), appended to *rows (grown with realloc; *n_rows counts).
// Every slot yields T rows; entries past what the last record wrote read as the -1 sentinel.
sd_code ledger_drain_device(ledger *L, int dev, int pos0, int T, int K, ledger_row **rows, size_t *n_rows,
                            sd_status *st);

// The host rows recorded since the last take or reset (moved out: the caller frees *rows).
void ledger_take_host(ledger *L, ledger_row **rows, size_t *n_rows);
void ledger_reset_host(ledger *L);

// Fills every slot of dev with the sentinel again (sel -1, w 0), outside a capture: what the
// next step does not write reads as a mismatch.
sd_code ledger_poison(ledger *L, int dev, sd_status *st);

// The canary: nudges the weight of entry `entry` of (dev, layer)'s slot by one ulp (towards +inf)
// after a record, so a gate that compares must fail there. Errors: no such slot or entry.
sd_code ledger_canary(ledger *L, int dev, int layer, int entry, sd_status *st);

// The comparison of two arms' rows (each sorted by (dev, layer, pos) or not: matched by key).
typedef struct {
    size_t compared, mismatched, missing; // rows of `a` compared; differing; with no row in `b`
    bool found;                           // a first divergence exists (mismatch or missing)
    ledger_row a, b;                      // at the first divergence by (dev, layer, pos); b.k = 0 if missing
} ledger_diff;

// Rows equal bit for bit: the same k, sel and the same bits of w, matched by (dev, layer, pos,
// occ). Every row of b without a row in a counts as missing too (into `missing`, with first
// divergence reported from b's side). The first divergence is the earliest by (dev, layer, pos).
void ledger_compare(const ledger_row *a, size_t na, const ledger_row *b, size_t nb, ledger_diff *out);
// Only the rows of one (dev, layer).
void ledger_compare_layer(const ledger_row *a, size_t na, const ledger_row *b, size_t nb, int dev, int layer,
                          ledger_diff *out);
