// synth_device.c — sd_synth_model's weights generated in device memory (cuda_synth.h): the
// tensor table is planned on the host (small), the arena laid out by upload.c's
// sd_cuda_model_create, and each tensor filled by one kernel (kernels/synth_fill.h) with the
// host generator's counter, key, name hash and role scale. tests/test_cuda_synth.c pins the
// bytes to the host's.
#include <stdlib.h>
#include <string.h>
#include "cuda_model.h"     // sd_cuda_model_create
#include "cuda_synth.h"
#include "parallel/shard.h" // sd_tp_shard_config, sd_tp_shard_visit
#include "synth_fill.h"     // sd_cuda_synth_fill, sd_cuda_synth_fill_slice

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

// ---------------------------------------------------------------------------- a rank's shard
// The whole model's tensor table (planned only: no data), each spec found by the address of the
// field it describes (its sd_mat, or its float *), and the visit's running state.
typedef struct {
    const void *field;
    int spec;
} field_key;

typedef struct {
    const sd_config *full;
    const sd_synth_opts *o;
    const sd_tp_plan *p;
    int rank;
    sd_weights whole;
    field_key *keys;
    int n_keys;
    cudaStream_t stream;
    sd_code rc;
    sd_status *st;
} shard_src;

static int key_cmp(const void *a, const void *b) {
    const uintptr_t x = (uintptr_t)((const field_key *)a)->field, y = (uintptr_t)((const field_key *)b)->field;
    return x < y ? -1 : x > y;
}

static const sd_weight_spec *source_of(const shard_src *src, const void *field) {
    const field_key k = {field, 0}, *hit = bsearch(&k, src->keys, (size_t)src->n_keys, sizeof k, key_cmp);
    return hit ? &src->whole.specs[hit->spec] : NULL;
}

// dst (n elements of the shard, device memory) from its source tensor's elements at
// base + (i / width) · stride + i % width.
static void fill_from(shard_src *src, const void *field, void *dst, int64_t n, bool bf16, int64_t base, int64_t width,
                      int64_t stride) {
    if (src->rc || n <= 0) return;
    const sd_weight_spec *s = source_of(src, field);
    if (!s) {
        src->rc = sd_fail(src->st, SD_ERR_SYS, "cuda synth shard: a tensor of rank %d's shard has no source", src->rank);
        return;
    }
    const sd_synth_tensor t = sd_synth_tensor_params(s, src->full, src->o); // the source's scale (its fan-in) and name
    src->rc = sd_cuda_synth_fill_slice(dst, n, bf16, src->o->seed, t.name_hash, t.scale, t.offset, base, width, stride, src->stream,
                                       src->st);
}

static void slice_mat(void *ctx, sd_mat *dst, const sd_mat *from, bool by_cols, int first) {
    const int64_t n = (int64_t)dst->rows * dst->cols, cols = from->cols;
    const bool bf16 = dst->dtype == SD_DT_BF16;
    if (by_cols) fill_from(ctx, from, (void *)dst->data, n, bf16, first, dst->cols, cols);
    else fill_from(ctx, from, (void *)dst->data, n, bf16, (int64_t)first * cols, n ? n : 1, n ? n : 1);
}

static void slice_vec(void *ctx, float **dst, float *const *from, size_t first, size_t n) {
    fill_from(ctx, from, *dst, (int64_t)n, false, (int64_t)first, n ? (int64_t)n : 1, n ? (int64_t)n : 1);
}

// The shard's dtypes by sd_synth_model's rule (matrices in the options' dtype, vectors F32).
static sd_code shard_dtypes(void *ctx, sd_weights *w, sd_status *st) { return synth_dtypes((void *)((shard_src *)ctx)->o, w, st); }

static sd_code shard_fill(void *ctx, const sd_model *dev, cudaStream_t stream, sd_status *st) {
    shard_src *src = ctx;
    src->stream = stream;
    src->st = st;
    src->rc = SD_OK;
    sd_tp_shard_visit(src->p, src->rank, src->full, (sd_weights *)&dev->w, &src->whole,
                      &(sd_tp_slicer){.mat = slice_mat, .vec = slice_vec, .ctx = src});
    return src->rc;
}

sd_code sd_cuda_model_synth_shard(const sd_config *cfg, const sd_synth_opts *o, const sd_tp_plan *p, int rank, int device,
                                  sd_model *dev, sd_status *st) {
    memset(dev, 0, sizeof *dev);
    if (o->dtype != SD_DT_F32 && o->dtype != SD_DT_BF16) return sd_fail(st, SD_ERR_USAGE, "init: dtype must be bf16 or f32");
    if (rank < 0 || rank >= p->ranks) return sd_fail(st, SD_ERR_USAGE, "cuda synth shard: rank %d of %d", rank, p->ranks);
    shard_src src = {.full = cfg, .o = o, .p = p, .rank = rank};
    sd_code rc = sd_weights_plan(cfg, &src.whole, st);
    if (!rc && !(src.keys = malloc(sizeof *src.keys * (size_t)(src.whole.n_specs ? src.whole.n_specs : 1))))
        rc = sd_fail(st, SD_ERR_SYS, "cuda synth shard: out of memory for the tensor index");
    for (int i = 0; !rc && i < src.whole.n_specs; i++) {
        const sd_weight_spec *s = &src.whole.specs[i];
        src.keys[src.n_keys++] = (field_key){s->keep_dtype ? (const void *)s->mat : (const void *)s->vec, i};
    }
    if (!rc) {
        qsort(src.keys, (size_t)src.n_keys, sizeof *src.keys, key_cmp);
        sd_config shard;
        sd_tp_shard_config(cfg, p, rank, &shard);
        const sd_cuda_weight_source ws = {.set_dtypes = shard_dtypes, .fill = shard_fill, .ctx = &src};
        rc = sd_cuda_model_create(&shard, device, &ws, dev, st);
    }
    free(src.keys);
    sd_weights_free(&src.whole);
    return rc;
}
