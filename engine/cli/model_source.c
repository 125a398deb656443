// model_source.c — see model_source.h.
#include "model_source.h"
#include <string.h>
#include "args.h" // sd_parse_int, sd_parse_float, sd_parse_u64
#include "demo.h" // sd_demo_models
#include "synth.h"

sd_code sd_cli_models_parse(const char *model, const char *draft, const char *config, const char *draft_layers,
                            const char *tail_scale, const char *weights_seed, sd_cli_models *m, sd_status *st) {
    *m = (sd_cli_models){.model = model, .draft = draft, .config = config, .tail_scale = 1.0, .want_draft = true};
    if (model && config) return sd_fail(st, SD_ERR_USAGE, "give --model DIR or --config FILE, not both");
    if (draft && !model) return sd_fail(st, SD_ERR_USAGE, "--draft needs --model");
    const char *synth_only = draft_layers ? "--draft-layers" : tail_scale ? "--tail-scale" : weights_seed ? "--weights-seed" : NULL;
    if (synth_only && !config) return sd_fail(st, SD_ERR_USAGE, "%s needs --config FILE (it shapes synthesised weights)", synth_only);
    if (tail_scale && !draft_layers) return sd_fail(st, SD_ERR_USAGE, "--tail-scale needs --draft-layers N");
    long n = 0;
    if (draft_layers && !sd_parse_int("--draft-layers", draft_layers, 1, SD_MAX_LAYERS, &n, st)) return st->code;
    if (tail_scale && !sd_parse_float("--tail-scale", tail_scale, 0.0, 1e6, &m->tail_scale, st)) return st->code;
    if (weights_seed && !sd_parse_u64("--weights-seed", weights_seed, &m->weights_seed, st)) return st->code;
    m->draft_layers = (int)n;
    return SD_OK;
}

bool sd_cli_models_have_draft(const sd_cli_models *m) {
    return m->model ? m->draft != NULL : m->config ? m->draft_layers > 0 : true;
}

static sd_code from_config(const sd_cli_models *m, sd_cli_backend be, int ordinal, sd_model *target, sd_model *draft,
                           sd_status *st) {
    sd_config cfg, dcfg;
    SD_TRY(sd_config_load(m->config, &cfg, st));
    const bool with_draft = m->want_draft && m->draft_layers > 0;
    if (with_draft && m->draft_layers >= cfg.num_hidden_layers)
        return sd_fail(st, SD_ERR_USAGE, "--draft-layers %d: %s has %d layers (the draft needs fewer)", m->draft_layers,
                       m->config, cfg.num_hidden_layers);
    if (with_draft) SD_TRY(sd_draft_config(&cfg, m->draft_layers, &dcfg, st));
    const sd_synth_opts o = {.seed = m->weights_seed, .dtype = SD_DT_BF16,
                             .tail_from = with_draft ? m->draft_layers : SD_MAX_LAYERS,
                             .tail_scale = (float)m->tail_scale, .depth = cfg.num_hidden_layers};
    SD_TRY(sd_cli_synth_on(be, &cfg, &o, ordinal, target, st));
    if (!with_draft) return SD_OK;
    const sd_code rc = sd_cli_synth_on(be, &dcfg, &o, ordinal, draft, st);
    if (rc) sd_model_free(target);
    return rc;
}

sd_code sd_cli_models_make(const sd_cli_models *m, sd_cli_backend be, int ordinal, sd_model *target, sd_model *draft,
                           sd_status *st) {
    memset(target, 0, sizeof *target);
    memset(draft, 0, sizeof *draft);
    if (m->config) return from_config(m, be, ordinal, target, draft, st);
    // On the CPU the models load in place; on a GPU into host copies, uploaded, then freed
    // (models are never copied by value: their tensor tables point into them).
    const bool two = m->want_draft && sd_cli_models_have_draft(m), cuda = be == SD_CLI_BACKEND_CUDA;
    sd_model host[2];
    memset(host, 0, sizeof host);
    sd_model *h0 = cuda ? &host[0] : target, *h1 = cuda ? &host[1] : draft, *use;
    sd_code rc = m->model ? sd_model_load(h0, m->model, st) : sd_demo_models(h0, two ? h1 : NULL, st);
    if (!rc && m->model && two && (rc = sd_model_load(h1, m->draft, st))) sd_model_free(h0);
    if (rc || !cuda) return rc;
    rc = sd_cli_to_device(be, h0, ordinal, target, &use, st);
    if (!rc && two && (rc = sd_cli_to_device(be, h1, ordinal, draft, &use, st))) sd_model_free(target);
    sd_model_free(h0);
    if (two) sd_model_free(h1);
    return rc;
}
