// test_cuda_synth.c — device synthesis (engine/cuda/cuda_synth.h) against host synthesis
// (engine/synth.h): every tensor's bytes equal, the same arena layout, and the device-made model
// computes the same logits bits as the host model uploaded. Without a device (or without the
// CUDA build) every test reports itself skipped — never passed.
#include <stdint.h>
#include <string.h>
#include "common.h"

#if !SPECDEC_HAVE_CUDA
Test(cuda_synth, suite) { cr_skip_test("CUDA backend not built (no toolkit or -DSPECDEC_CUDA=OFF): GPU suite skipped"); }
#else
#include <cuda_runtime_api.h>
#include "cuda_backend.h" // sd_cuda_model_upload, sd_cuda_state_init
#include "cuda_synth.h"   // sd_cuda_model_synth

#define NEED_GPU()                                                                          \
    do {                                                                                    \
        if (sd_cuda_device_count() == 0) cr_skip_test("no CUDA device: GPU suite skipped"); \
    } while (0)

typedef struct {
    const char *config;
    sd_dtype dtype;
    uint64_t seed;
    int tail_from; // SD_MAX_LAYERS: no tail scaling
    float tail_scale;
    int depth;
} synth_case;

static const synth_case CASES[] = {
    {"configs/tiny.json", SD_DT_F32, 11, SD_MAX_LAYERS, 1.0f, 0},
    {"configs/tiny.json", SD_DT_BF16, 0x123456789abcdef0ull, 2, 0.37f, 9}, // both key halves, tail, depth
    {"configs/toy.json", SD_DT_BF16, 7, SD_MAX_LAYERS, 1.0f, 0},
    {"configs/toy.json", SD_DT_F32, 3, 5, 0.5f, 0},
};

// Device logits of tokens[0..n) in single-token forwards (caller frees).
static float *device_logits(const sd_model *dev, const int *tokens, int n) {
    const int V = dev->cfg.vocab_size;
    sd_state s;
    sd_status st = {0};
    cr_assert_eq(sd_cuda_state_init(&s, dev, n, 1, &st), SD_OK, "%s", st.msg);
    float *lg = malloc(sizeof(float) * (size_t)n * V);
    for (int t = 0; t < n; t++) {
        cr_assert_eq(sd_forward(dev, &s, tokens + t, 1, lg + (size_t)t * V, 0, NULL, &st), SD_OK, "%s", st.msg);
        cr_assert_eq(sd_state_commit(&s, 1, &st), SD_OK);
    }
    sd_state_free(&s);
    return lg;
}

static void check_case(const synth_case *k) {
    sd_config cfg;
    load_config(k->config, &cfg);
    const sd_synth_opts o = {.seed = k->seed, .dtype = k->dtype, .tail_from = k->tail_from, .tail_scale = k->tail_scale,
                             .depth = k->depth};
    sd_model host, dev, up;
    sd_status st = {0};
    cr_assert_eq(sd_synth_model(&host, &cfg, &o, &st), SD_OK, "%s", st.msg);
    cr_assert_eq(sd_cuda_model_synth(&cfg, &o, 0, &dev, &st), SD_OK, "%s", st.msg);
    cr_assert_eq(dev.w.n_specs, host.w.n_specs);
    cr_assert_eq(dev.w.arena_bytes, host.w.arena_bytes, "%s: arena %zu vs host %zu", k->config, dev.w.arena_bytes,
                 host.w.arena_bytes);
    size_t bytes_total = 0;
    for (int i = 0; i < host.w.n_specs; i++) {
        const sd_weight_spec *hs = &host.w.specs[i], *ds = &dev.w.specs[i];
        cr_assert_str_eq(ds->name, hs->name);
        cr_assert_eq(ds->dtype, hs->dtype, "%s: dtype", hs->name);
        const size_t n = (size_t)hs->shape[0] * (size_t)(hs->ndim == 2 ? hs->shape[1] : 1) * sd_dtype_size(hs->dtype);
        const char *hp = sd_weight_data(hs), *dp = sd_weight_data(ds);
        cr_assert_eq(dp - (const char *)dev.w.arena, hp - (const char *)host.w.arena, "%s: offset", hs->name);
        void *got = malloc(n);
        cr_assert_eq(cudaMemcpy(got, dp, n, cudaMemcpyDeviceToHost), cudaSuccess);
        if (memcmp(got, hp, n) != 0) {
            size_t first = 0;
            while (((const unsigned char *)got)[first] == ((const unsigned char *)hp)[first]) first++;
            cr_assert_fail("%s (%s, seed %llu): tensor '%s' differs from host synthesis at byte %zu of %zu", k->config,
                           sd_dtype_name(k->dtype), (unsigned long long)k->seed, hs->name, first, n);
        }
        free(got);
        bytes_total += n;
    }
    cr_log_info("%s %s: %d tensors, %zu bytes identical", k->config, sd_dtype_name(k->dtype), host.w.n_specs, bytes_total);
    // The whole device model (tied head, expert table, layer tables) is the uploaded host model.
    cr_assert_eq(sd_cuda_model_upload(&host, &up, &st), SD_OK, "%s", st.msg);
    int tokens[6];
    random_tokens(17, cfg.vocab_size, 6, tokens);
    float *a = device_logits(&dev, tokens, 6), *b = device_logits(&up, tokens, 6);
    cr_assert(memcmp(a, b, sizeof(float) * 6 * (size_t)cfg.vocab_size) == 0, "%s: logits of the device-made model differ",
              k->config);
    free(a);
    free(b);
    sd_model_free(&up);
    sd_model_free(&dev);
    sd_model_free(&host);
}

Test(cuda_synth, bytes_equal_host) {
    NEED_GPU();
    for (size_t i = 0; i < sizeof CASES / sizeof *CASES; i++) check_case(&CASES[i]);
}

// A dtype synthesis refuses is refused on the device too, leaving nothing behind.
Test(cuda_synth, refuses_bad_dtype) {
    NEED_GPU();
    sd_config cfg;
    load_config("configs/tiny.json", &cfg);
    const sd_synth_opts o = {.seed = 1, .dtype = SD_DT_F16, .tail_from = SD_MAX_LAYERS, .tail_scale = 1.0f};
    sd_model dev;
    sd_status st = {0};
    cr_assert_eq(sd_cuda_model_synth(&cfg, &o, 0, &dev, &st), SD_ERR_USAGE);
    cr_assert(dev.backend == NULL && dev.w.arena == NULL);
}
#endif
