// cmd_init.c — `specdec init`: synthesise a model directory, and optionally its derived draft.
#include <stdio.h>
#include <string.h>
#include "args.h"
#include "commands.h"
#include "synth.h"

static const char *HELP =
    "usage: specdec init --config FILE --out DIR [--seed S] [--dtype bf16|f32]\n"
    "                    [--draft-out DIR --draft-layers N [--tail-scale E]]\n\n"
    "Synthesise DIR/config.json + DIR/model.safetensors from a config. The same seed writes the\n"
    "same bytes on any machine (generator and scales: engine/synth.h, engine/synth.c).\n\n"
    "  --config FILE      config.json to synthesise (e.g. configs/toy.json)\n"
    "  --out DIR          model directory to write (created if missing)\n"
    "  --seed S           generator seed (default 0)\n"
    "  --dtype bf16|f32   dtype of the matrices (default bf16; vectors and routing stay f32)\n"
    "  --draft-out DIR    also write the derived draft: the target's first N layers with its\n"
    "                     embedding, final norm and head\n"
    "  --draft-layers N   N for the draft (1..L)\n"
    "  --tail-scale E     in the target, layers N..L-1 have o_proj and every down_proj scaled by\n"
    "                     E (default 1): E = 0 makes the draft agree with the target on every\n"
    "                     token; larger E lowers acceptance toward chance\n";

int cmd_init(int argc, char **argv) {
    const char *cmd = "specdec init";
    sd_args a;
    sd_args_init(&a, cmd, argc, argv);
    if (sd_args_help(&a)) { fputs(HELP, stdout); sd_args_free(&a); return 0; }
    const char *config = sd_args_str(&a, "--config"), *out = sd_args_str(&a, "--out");
    const char *seed_s = sd_args_str(&a, "--seed"), *dtype_s = sd_args_str(&a, "--dtype");
    const char *draft_out = sd_args_str(&a, "--draft-out"), *layers_s = sd_args_str(&a, "--draft-layers");
    const char *tail_s = sd_args_str(&a, "--tail-scale");
    bool ok = sd_args_done(&a);
    sd_args_free(&a);
    if (!ok) return EXIT_USAGE;

    sd_status st = {0};
    sd_synth_opts o = {.seed = 0, .dtype = SD_DT_BF16, .tail_from = SD_MAX_LAYERS, .tail_scale = 1.0f};
    long n_draft = 0;
    double tail = 1.0;
    if (!config || !out) { sd_fail(&st, SD_ERR_USAGE, "--config and --out are required (see --help)"); return sd_cli_fail(cmd, &st); }
    if (seed_s && !sd_parse_u64("--seed", seed_s, &o.seed, &st)) return sd_cli_fail(cmd, &st);
    if (dtype_s && strcmp(dtype_s, "bf16") && strcmp(dtype_s, "f32")) {
        sd_fail(&st, SD_ERR_USAGE, "--dtype must be bf16 or f32, got '%s'", dtype_s);
        return sd_cli_fail(cmd, &st);
    }
    if (dtype_s && !strcmp(dtype_s, "f32")) o.dtype = SD_DT_F32;
    if (!draft_out != !layers_s) {
        sd_fail(&st, SD_ERR_USAGE, "--draft-out and --draft-layers go together");
        return sd_cli_fail(cmd, &st);
    }
    if (tail_s && !layers_s) {
        sd_fail(&st, SD_ERR_USAGE, "--tail-scale needs --draft-out and --draft-layers");
        return sd_cli_fail(cmd, &st);
    }
    if (layers_s && !sd_parse_int("--draft-layers", layers_s, 1, SD_MAX_LAYERS, &n_draft, &st)) return sd_cli_fail(cmd, &st);
    if (tail_s && !sd_parse_float("--tail-scale", tail_s, 0.0, 1e6, &tail, &st)) return sd_cli_fail(cmd, &st);

    sd_config cfg, dcfg;
    if (sd_config_load(config, &cfg, &st)) return sd_cli_fail(cmd, &st);
    if (draft_out && sd_draft_config(&cfg, (int)n_draft, &dcfg, &st)) return sd_cli_fail(cmd, &st);
    if (draft_out) { o.tail_from = (int)n_draft; o.tail_scale = (float)tail; o.depth = cfg.num_hidden_layers; }

    // Both folders are staged before either is committed: a failure (or a signal: the stages are
    // registered for removal) leaves neither folder half-written, and a draft never lands without
    // its target.
    sd_model m;
    sd_model_staged target = {0}, draft = {0};
    if (sd_synth_model(&m, &cfg, &o, &st)) return sd_cli_fail(cmd, &st);
    sd_code rc = sd_model_stage(&m, out, &target, &st);
    const int n_specs = m.w.n_specs;
    const double mb = m.w.arena_bytes / 1e6;
    sd_model_free(&m);
    if (!rc && draft_out) {
        rc = sd_synth_model(&m, &dcfg, &o, &st);
        if (!rc) {
            rc = sd_model_stage(&m, draft_out, &draft, &st);
            sd_model_free(&m);
        }
    }
    if (!rc) rc = sd_model_commit(&target, &st);
    if (!rc) fprintf(stderr, "%s: wrote %s (%d tensors, %.1f MB)\n", cmd, out, n_specs, mb);
    if (!rc && draft_out) rc = sd_model_commit(&draft, &st);
    if (!rc && draft_out)
        fprintf(stderr, "%s: wrote draft %s (%d of %d layers)\n", cmd, draft_out, dcfg.num_hidden_layers, cfg.num_hidden_layers);
    sd_model_discard(&target);
    sd_model_discard(&draft);
    return rc ? sd_cli_fail(cmd, &st) : 0;
}
