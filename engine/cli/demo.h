// demo.h — the embedded default demo: configs/toy.json (compiled in), weights synthesised in
// memory from seed 0, and its derived draft. Nothing to download, nothing to prepare.
#pragma once
#include "model.h" // sd_model

// The derived draft of the demo: the first DEMO_DRAFT_LAYERS layers; the target's tail layers
// scaled by DEMO_TAIL_SCALE, tuned so greedy acceptance at k = 4 is about 70%.
#define DEMO_DRAFT_LAYERS 2
#define DEMO_TAIL_SCALE 0.1f
#define DEMO_K 4

// Build the demo target and (when draft is not NULL) its draft.
sd_code sd_demo_models(sd_model *target, sd_model *draft, sd_status *st);
