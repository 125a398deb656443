// run_options.h — the options of `specdec run`, read and checked in groups (the models, the
// input, the outputs), and the rule that an option which would do nothing in the chosen mode is
// a usage error rather than silently dropped.
#pragma once
#include <stdbool.h>
#include <stdint.h>
#include "backend_select.h" // sd_cli_backend
#include "tp_select.h"     // sd_cli_tp

typedef struct run_opts {
    // models
    const char *model, *draft; // NULL model: the embedded demo
    sd_cli_backend be;
    bool demo, plain, spec;    // spec: speculative rounds (a draft, not --plain)
    long k, threads;           // threads 0: the default (host_cpu.h)
    sd_cli_tp tp;              // --tp: emulated or device ranks (tp.ranks 0: one device)
    bool graph;                // --graph / SPECDEC_DECODE_GRAPH=1: rounds through the decode-graph door
    bool ledger;               // SPECDEC_GRAPH_SEL_LEDGER=1: the selection ledger armed in the door's graphs
    // input
    int *prompt, n_prompt;     // malloc'd; synthesised from seed unless prompt_given
    bool prompt_given;
    long max_new;
    double temperature;
    uint64_t seed;
    bool ignore_eos;
    // outputs
    bool json, stream, progress;
    long trace;                // --trace 1|2, -1 = not given
    const char *tag, *receipt, *chrome;
} run_opts;

// Reads argv into o. Returns 0 (run), -1 (--help was printed: exit 0) or an exit code after
// printing the one-line usage error. o->prompt is malloc'd on 0 (free it).
int run_parse(int argc, char **argv, run_opts *o);
