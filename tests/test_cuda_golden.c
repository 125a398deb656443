// test_cuda_golden.c — the CUDA backend against MODEL.md's golden vectors (tests/golden-hf: an
// independent float64 implementation; tiny-rope-bf16 is sharded), decode and verify chunks:
// ‖logits − expected‖ / ‖expected‖ ≤ 2e-2 (MODEL.md's GPU tolerance) and the greedy token
// wherever the expected top-2 margin is clear. A missing golden file fails; without a device
// every test reports itself skipped.
#include "common.h"

#if !SPECDEC_HAVE_CUDA
Test(cuda_golden, suite) { cr_skip_test("CUDA backend not built (no toolkit or -DSPECDEC_CUDA=OFF): GPU suite skipped"); }
#else
#include <string.h>
#include "cuda_harness.h" // NEED_GPU
#include "cuda_backend.h" // sd_cuda_model_upload

static void check_golden_gpu(const char *name, int chunk) {
    NEED_GPU();
    char dir[4096], path[4200];
    snprintf(dir, sizeof dir, "%s/tests/golden-hf/%s", src_dir(), name);
    snprintf(path, sizeof path, "%s/expected.safetensors", dir);
    sd_status st = {0};
    sd_model host, dev;
    cr_assert_eq(sd_model_load(&host, dir, &st), SD_OK, "%s", st.msg);
    cr_assert_eq(sd_cuda_model_upload(&host, &dev, &st), SD_OK, "%s", st.msg);
    sd_st_file ex;
    cr_assert_eq(sd_st_open(path, &ex, &st), SD_OK, "%s", st.msg);
    const sd_st_tensor *tok = sd_st_find(&ex, "tokens"), *lg = sd_st_find(&ex, "logits");
    cr_assert(tok && lg && tok->dtype == SD_DT_I32 && lg->dtype == SD_DT_F64);
    const int T = (int)tok->shape[0], V = host.cfg.vocab_size;
    int *tokens = malloc(sizeof(int) * (size_t)T);
    memcpy(tokens, tok->data, sizeof(int) * (size_t)T);
    float *out = logits_chunked(&dev, tokens, T, chunk), *ref = malloc(sizeof(float) * (size_t)T * V);
    double num = 0, den = 0;
    for (size_t i = 0; i < (size_t)T * V; i++) {
        double e;
        memcpy(&e, (const char *)lg->data + 8 * i, 8);
        cr_assert(isfinite(out[i]), "%s: logit %zu is not finite", name, i);
        num += (out[i] - e) * (out[i] - e);
        den += e * e;
        ref[i] = (float)e;
    }
    double rel = sqrt(num / den);
    cr_assert(rel <= 2e-2, "%s (chunk %d): relative logit error %.3g > 2e-2", name, chunk, rel);
    expect_greedy_where_clear(out, ref, T, V, name);
    free(out);
    free(ref);
    free(tokens);
    sd_st_close(&ex);
    sd_model_free(&dev);
    sd_model_free(&host);
}

Test(cuda_golden, nope_f32_decode) { check_golden_gpu("tiny-nope-f32", 1); }
Test(cuda_golden, nope_f32_verify_chunks) { check_golden_gpu("tiny-nope-f32", 5); }
Test(cuda_golden, rope_bf16_decode) { check_golden_gpu("tiny-rope-bf16", 1); }
Test(cuda_golden, rope_bf16_verify_chunks) { check_golden_gpu("tiny-rope-bf16", 7); }
#endif
