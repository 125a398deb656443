// gate_graph_sel.h — the graph-selection gate on one device: the same prompt and rounds run
// twice, and the target's MoE routing of every forward after the prefill compared bit for bit.
//   eager arm: the eager loop with the eager MoE arm; each (layer, token)'s sel and w read back
//              on the host (the route tap) into the ledger's host rows — the host oracle;
//   graph arm: the decode-graph door (captured CUDA graphs, device-table MoE) with the ledger's
//              device recorder inside the graphs, its slots drained after every round or step.
// On the CPU backend both arms run the host walk (the graph arm records through the ledger's CPU
// stand-in), so the gate itself is tested without a GPU. The arms' tokens and their last
// forward's logits are compared bit for bit too. Under --tp every rank runs both arms on its
// shard, and the ranks' eager routing is compared across ranks.
#pragma once
#include <stdbool.h>
#include "backend_select.h" // sd_cli_backend
#include "ledger.h"         // ledger_diff
#include "model_source.h"   // sd_cli_models
#include "parallel/route_log.h" // sd_tp_route_verdict
#include "tp_select.h"      // sd_cli_tp

typedef struct {
    int k;              // draft depth; 0: plain decode steps
    int tokens;         // tokens each arm generates
    float temperature;  // 0 greedy; else sampled with seed (the same draws in both arms)
    uint64_t seed;
    int *prompt;        // n_prompt ids; when not prompt_given, drawn from seed once the vocabulary is known
    int n_prompt;
    bool prompt_given;
    bool canary;        // nudge one weight by one ulp in one device slot after it is recorded
} gate_opts;

typedef struct {
    int layer;
    size_t rows, mismatched, missing; // host rows compared; differing; with no graph row
} gate_layer;

typedef struct {
    int device;                       // ordinal (0 on the CPU)
    int rank;                         // the tensor-parallel rank, -1 without --tp
    char name[256];                   // the device's name
    gate_layer layers[SD_MAX_LAYERS]; // the MoE layers, in order
    int n_layers;
    ledger_diff first;                // the first divergence by (layer, token); first.found
    uint64_t entries_eager, entries_graph; // each arm's recorder calls: 0 means nothing was recorded
    size_t rows_eager, rows_graph;
    int n_tokens_eager, n_tokens_graph, first_token_diff; // -1: the tokens agree
    int logits_rows;                  // rows of the last forward compared (0: not comparable)
    const char *logits_why;           // why not compared, when logits_rows is 0
    long logits_first_diff;           // first differing float, -1: equal
    int canary_layer, canary_pos;     // where the canary was planted (-1: none)
    double secs_eager, secs_graph;
    bool pass;                        // every layer matched, something was recorded, tokens and logits equal
} gate_device;

// Both arms on device `ordinal` of backend be, the models made there from src.
sd_code gate_graph_sel_device(const sd_cli_models *src, sd_cli_backend be, int ordinal, const gate_opts *o,
                              gate_device *out, sd_status *st);

// Both arms on every rank of the group tp asks for (tp->ranks of them, all in this process; the
// models made on the host from src, then sharded): out[r] is rank r against its own eager
// oracle, and cross the verdict that every rank routed every (layer, token) alike in the eager
// arm — or the first rank pair that did not (tp->canary_rank's nudge must show there).
sd_code gate_graph_sel_group(const sd_cli_models *src, const sd_cli_tp *tp, const gate_opts *o, gate_device *out,
                             sd_tp_route_verdict *cross, sd_status *st);
