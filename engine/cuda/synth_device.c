// synth_device.c — sd_synth_model's weights generated in device memory (cuda_synth.h): the
// tensor table is planned on the host (small), the arena laid out by upload.c's
// sd_cuda_model_create, and each tensor filled by one kernel (kernels/synth_fill.h) with the
// host generator's counter, key, name hash and role scale. tests/test_cuda_synth.c pins the
// bytes to the host's.
#include <string.h>
#include "cuda_model.h" // sd_cuda_model_create
#include "cuda_synth.h"
#include "synth_fill.h" // sd_cuda_synth_fill

// Matrices in the options' dtype, vectors F32 (sd_synth_model's rule).
static sd_code synth_dtypes(void *ctx, sd_weights *w, sd_status *st) {
    (void)st;
    const sd_synth_opts *o = ctx;
    for (int i = 0; i < w->n_specs; i++) w->specs[i].dtype = w->specs[i].keep_dtype ? o->dtype : SD_DT_F32;
    return SD_OK;
}

static sd_code synth_fill(void *ctx, const sd_model *dev, cudaStream_t stream, sd_status *st) {
    const sd_synth_opts *o = ctx;
    const sd_config *c = &dev->cfg;
    for (int i = 0; i < dev->w.n_specs; i++) {
        const sd_weight_spec *s = &dev->w.specs[i];
        const int64_t n = s->shape[0] * (s->ndim == 2 ? s->shape[1] : 1);
        const sd_synth_tensor p = sd_synth_tensor_params(s, c, o); // the host generator's values
        sd_code rc = sd_cuda_synth_fill((void *)sd_weight_data(s), n, s->dtype == SD_DT_BF16, o->seed, p.name_hash,
                                        p.scale, p.offset, stream, st);
        if (rc) return rc;
    }
    return SD_OK;
}

sd_code sd_cuda_model_synth(const sd_config *cfg, const sd_synth_opts *o, int device, sd_model *dev, sd_status *st) {
    if (o->dtype != SD_DT_F32 && o->dtype != SD_DT_BF16) {
        memset(dev, 0, sizeof *dev);
        return sd_fail(st, SD_ERR_USAGE, "init: dtype must be bf16 or f32");
    }
    const sd_cuda_weight_source src = {.set_dtypes = synth_dtypes, .fill = synth_fill, .ctx = (void *)o};
    return sd_cuda_model_create(cfg, device, &src, dev, st);
}
