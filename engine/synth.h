// synth.h — synthetic weights for a config (`specdec init` and the embedded default demo), and
// the derived draft whose agreement with the target is tuned by one number.
//
// Generator: tensor element e of the tensor named NAME is drawn from Philox-4x32-10 with key =
// the seed's two 32-bit halves and counter = (e/4 low, e/4 high, FNV-1a-32(NAME), SD_DRAW_INIT),
// output word e%4, mapped to u in [-1, 1) with 24 bits; the value is u · scale(role) [+ offset].
// Only integer work, one exact multiply and IEEE-correct sqrt: the same seed gives the same bytes
// on any machine. Keying by name makes a layer's tensors independent of the layer count, so the
// draft's layers are exactly the target's first N.
#pragma once
#include "model.h"      // sd_model
#include "model_save.h" // sd_model_save: writing a model folder (init, the tests)

typedef struct {
    uint64_t seed;
    sd_dtype dtype;     // matrices: SD_DT_BF16 or SD_DT_F32 (vectors are always F32)
    int tail_from;      // layers tail_from..L-1 have o_proj and every down_proj scaled by
    float tail_scale;   //   tail_scale (tail_from >= L: no scaling)
    int depth;          // the L residual writers are scaled for (0: the config's own L); a
                        // derived draft passes its target's L so its layers equal the target's
} sd_synth_opts;

// The generator's parameters for one tensor (shared with the device generator, so both fill the
// same values): value = u · scale + offset with u the tensor's Philox draw, and the name hash
// that keys its counter.
typedef struct {
    float scale, offset;
    uint32_t name_hash;
} sd_synth_tensor;
sd_synth_tensor sd_synth_tensor_params(const sd_weight_spec *s, const sd_config *cfg, const sd_synth_opts *o);

// Synthesise a model for cfg in memory.
sd_code sd_synth_model(sd_model *m, const sd_config *cfg, const sd_synth_opts *o, sd_status *st);

// The derived draft's config: the first n_layers of cfg (layer lists cut, dense prefix capped).
sd_code sd_draft_config(const sd_config *cfg, int n_layers, sd_config *out, sd_status *st);
