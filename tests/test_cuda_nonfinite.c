// test_cuda_nonfinite.c — the GPU's non-finite flag (kernels/finite.h, engine/model.h): a NaN or
// an Inf planted in one weight of one layer of the tiny model fails the device forward with the
// CPU's message (the same site: after that layer's mixer or FFN, the embedding, the head), eager
// and as a replayed graph (the flag's kernels are captured; the readback follows the drain); the
// failed forward leaves the state's cursor where it was, and a clean model's forwards never trip
// the flag. Without a device (or without the CUDA build) every test reports itself skipped.
#include <math.h>
#include <string.h>
#include "common.h"

#if !SPECDEC_HAVE_CUDA
Test(cuda_nonfinite, suite) { cr_skip_test("CUDA backend not built (no toolkit or -DSPECDEC_CUDA=OFF): GPU suite skipped"); }
#else
#include <cuda_runtime_api.h>
#include "cuda_backend.h" // sd_cuda_model_upload, sd_cuda_state_init
#include "cuda_graph.h"   // sd_cuda_graph_capture, sd_cuda_graph_forward

#define NEED_GPU()                                                                          \
    do {                                                                                    \
        if (sd_cuda_device_count() == 0) cr_skip_test("no CUDA device: GPU suite skipped"); \
    } while (0)

typedef enum { PLANT_NONE, PLANT_KDA_O, PLANT_MLA_O, PLANT_POST_NORM, PLANT_EMBED, PLANT_HEAD } plant_at;

typedef struct {
    plant_at at;
    int layer;
    float value;
    const char *expect;
} plant_case;

// tiny.json: KDA layers 0, 1, 3, MLA layer 2 (0-based); the messages are the CPU's (test_hostile.c).
static const plant_case CASES[] = {
    {PLANT_KDA_O, 1, NAN, "non-finite activations first at layer 1 (after the mixer)"},
    {PLANT_MLA_O, 2, INFINITY, "non-finite activations first at layer 2 (after the mixer)"},
    {PLANT_POST_NORM, 3, NAN, "non-finite activations first at layer 3 (after the ffn)"},
    {PLANT_EMBED, -1, NAN, "non-finite activations first at the embedding (the token's row)"},
    {PLANT_HEAD, -1, INFINITY, "non-finite logits (after the head)"},
};

#define TOKEN 6

// A host tiny model (F32) with the case's value planted, uploaded.
static void planted_device_model(const plant_case *k, sd_model *dev) {
    sd_model host;
    synth_from("configs/tiny.json", 5, 0, SD_MAX_LAYERS, 1.0f, &host);
    sd_layer_weights *ly = k->layer >= 0 ? &host.w.layers[k->layer] : NULL;
    switch (k->at) {
    case PLANT_NONE: break;
    case PLANT_KDA_O: ((float *)ly->kda.o.data)[5] = k->value; break;
    case PLANT_MLA_O: ((float *)ly->mla.o.data)[3] = k->value; break;
    case PLANT_POST_NORM: ly->post_norm[0] = k->value; break;
    case PLANT_EMBED: ((float *)host.w.embed.data)[(size_t)TOKEN * host.cfg.hidden_size] = k->value; break;
    case PLANT_HEAD: ((float *)host.w.lm_head.data)[7] = k->value; break;
    }
    sd_status st = {0};
    cr_assert_eq(sd_cuda_model_upload(&host, dev, &st), SD_OK, "%s", st.msg);
    sd_model_free(&host);
}

Test(cuda_nonfinite, eager_names_the_layer) {
    NEED_GPU();
    for (size_t i = 0; i < sizeof CASES / sizeof CASES[0]; i++) {
        const plant_case *k = &CASES[i];
        sd_model dev;
        planted_device_model(k, &dev);
        sd_state s;
        sd_status st = {0};
        cr_assert_eq(sd_cuda_state_init(&s, &dev, 16, 4, &st), SD_OK, "%s", st.msg);
        const int prompt[3] = {3, 4, 5}, next[2] = {TOKEN, 7};
        sd_code rc = sd_prefill(&dev, &s, prompt, 3, NULL, &st);
        if (k->at != PLANT_EMBED && k->at != PLANT_HEAD)
            cr_assert_eq(rc, SD_ERR_NONFINITE, "case %zu: the prompt's forward did not fail: %s", i, st.msg);
        else
            cr_assert_eq(rc, SD_OK, "case %zu: %s", i, st.msg); // the prompt avoids the planted row; no head asked
        const int len = s.len;
        float logits[2 * 64];
        int argmax[2] = {-1, -1};
        sd_forward_opts o = {.argmax = argmax};
        cr_expect_eq(sd_forward(&dev, &s, next, 2, logits, 0, &o, &st), SD_ERR_NONFINITE, "case %zu: no error", i);
        cr_expect_str_eq(st.msg, k->expect, "case %zu", i);
        cr_expect_eq(s.pending, 0, "case %zu: %d positions left pending", i, s.pending);
        cr_expect_eq(s.len, len, "case %zu", i);
        int cursor[2];
        cr_assert_eq(cudaMemcpy(cursor, s.cursor, sizeof cursor, cudaMemcpyDeviceToHost), cudaSuccess);
        cr_expect(cursor[0] == s.len && cursor[1] == 0, "case %zu: the device cursor says {%d, %d}, the host {%d, 0}", i,
                  cursor[0], cursor[1], s.len);
        sd_state_free(&s);
        sd_model_free(&dev);
    }
}

Test(cuda_nonfinite, graph_replay_names_the_layer) {
    NEED_GPU();
    const plant_case *k = &CASES[0];
    sd_model dev;
    planted_device_model(k, &dev);
    sd_state s;
    sd_status st = {0};
    cr_assert_eq(sd_cuda_state_init(&s, &dev, 16, 1, &st), SD_OK, "%s", st.msg);
    sd_cuda_graph g;
    cr_assert_eq(sd_cuda_graph_capture(&dev, &s, 1, &g, &st), SD_OK, "%s", st.msg);
    const int tok = 3;
    int argmax = -1;
    cr_expect_eq(sd_cuda_graph_forward(&g, &tok, &argmax, &st), SD_ERR_NONFINITE, "the replay did not fail");
    cr_expect_str_eq(st.msg, k->expect);
    cr_expect_eq(s.pending, 0);
    sd_cuda_graph_free(&g);
    sd_state_free(&s);
    sd_model_free(&dev);
}

// The flag never trips on a clean model, eager or replayed, over many positions.
Test(cuda_nonfinite, clean_model_never_trips) {
    NEED_GPU();
    const plant_case none = {PLANT_NONE, -1, 0.0f, NULL};
    sd_model dev;
    planted_device_model(&none, &dev);
    sd_state s;
    sd_status st = {0};
    cr_assert_eq(sd_cuda_state_init(&s, &dev, 64, 1, &st), SD_OK, "%s", st.msg);
    sd_cuda_graph g;
    cr_assert_eq(sd_cuda_graph_capture(&dev, &s, 1, &g, &st), SD_OK, "%s", st.msg);
    for (int t = 0; t < 32; t++) {
        int tok = (t * 7) % 64, next;
        if (t % 2) cr_assert_eq(sd_cuda_graph_forward(&g, &tok, &next, &st), SD_OK, "position %d: %s", t, st.msg);
        else {
            sd_forward_opts o = {.argmax = &next};
            cr_assert_eq(sd_forward(&dev, &s, &tok, 1, NULL, 0, &o, &st), SD_OK, "position %d: %s", t, st.msg);
        }
        cr_assert_eq(sd_state_commit(&s, 1, &st), SD_OK);
    }
    sd_cuda_graph_free(&g);
    sd_state_free(&s);
    sd_model_free(&dev);
}
#endif
