// demo.c — the embedded default models (demo.h).
#include "demo.h"
#include <string.h>
#include "digest.h"      // sd_sha256_buf
#include "synth.h"       // sd_synth_model, sd_draft_config
#include "toy_config.h"  // SD_TOY_CONFIG_JSON (generated from configs/toy.json)

sd_code sd_demo_models(sd_model *target, sd_model *draft, sd_status *st) {
    sd_config cfg, dcfg;
    sd_code rc = sd_config_parse(SD_TOY_CONFIG_JSON, "embedded configs/toy.json", &cfg, st);
    if (!rc) rc = sd_draft_config(&cfg, DEMO_DRAFT_LAYERS, &dcfg, st);
    if (rc) return rc;
    sd_synth_opts o = {.seed = 0, .dtype = SD_DT_BF16, .tail_from = DEMO_DRAFT_LAYERS, .tail_scale = DEMO_TAIL_SCALE,
                       .depth = cfg.num_hidden_layers};
    rc = sd_synth_model(target, &cfg, &o, st);
    if (!rc) sd_sha256_buf(SD_TOY_CONFIG_JSON, strlen(SD_TOY_CONFIG_JSON), target->config_sha256);
    if (!rc && draft) {
        rc = sd_synth_model(draft, &dcfg, &o, st);
        if (rc) sd_model_free(target);
    }
    return rc;
}
