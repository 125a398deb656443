// model_source.h — where a command's target (and draft) come from, made on one device: model
// directories (--model, --draft), a config synthesised with its derived draft (--config,
// --draft-layers, --tail-scale, --weights-seed: on a GPU the weights are made in device memory,
// so a model as large as the device needs no file), or, with neither, the embedded demo pair.
#pragma once
#include <stdbool.h>
#include <stdint.h>
#include "backend_select.h" // sd_cli_backend

typedef struct {
    const char *model, *draft; // directories; the draft optional
    const char *config;        // instead of --model: synthesise this config
    int draft_layers;          // with config: the derived draft's layers (0: no draft)
    double tail_scale;         // with config: the target's layers >= draft_layers scaled by this
    uint64_t weights_seed;     // with config: the generator's seed
    bool want_draft;           // make the draft where the source has one
} sd_cli_models;

// The option lines the commands that take a model source add to their --help.
#define SD_CLI_MODELS_HELP                                                                          \
    "  --model DIR         target model directory (config.json + model.safetensors)\n"             \
    "  --draft DIR         draft model directory (same vocabulary)\n"                                \
    "  --config FILE       instead of --model: synthesise FILE's model (engine/synth.h); on a GPU\n" \
    "                      the weights are made in device memory\n"                                  \
    "  --draft-layers N    with --config: the derived draft, the target's first N layers\n"         \
    "  --tail-scale E      with --config: the target's layers N.. scaled by E (default 1; larger\n"  \
    "                      lowers acceptance)\n"                                                     \
    "  --weights-seed S    with --config: the generator's seed (default 0)\n"                        \
    "  (neither --model nor --config: the embedded demo, toy config and its derived draft)\n"

// Reads the options' values (NULL: not given) into m; usage errors name the option.
sd_code sd_cli_models_parse(const char *model, const char *draft, const char *config, const char *draft_layers,
                            const char *tail_scale, const char *weights_seed, sd_cli_models *m, sd_status *st);
// True when the source has a draft.
bool sd_cli_models_have_draft(const sd_cli_models *m);

// The target (and, when m->want_draft and the source has one, the draft: else *draft is zeroed)
// on backend be, CUDA device `ordinal`. Free each with sd_model_free.
sd_code sd_cli_models_make(const sd_cli_models *m, sd_cli_backend be, int ordinal, sd_model *target, sd_model *draft,
                           sd_status *st);
