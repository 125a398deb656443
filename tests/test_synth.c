// test_synth.c — `specdec init`'s generator (determinism by sha256), save → load round trip,
// the derived draft (E = 0 agrees with the target everywhere), and weight-file validation.
#include <string.h>
#include <unistd.h>
#include "common.h"
#include "digest.h"
#include "sample.h" // sd_argmax

static char tmp_root[64];

static void make_tmp(void) {
    strcpy(tmp_root, "/tmp/sd_synth_XXXXXX");
    cr_assert(mkdtemp(tmp_root));
}
static void rm_tmp(void) {
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmp_root);
    cr_assert_eq(system(cmd), 0);
}
TestSuite(synth, .init = make_tmp, .fini = rm_tmp);

static void save_and_hash(const char *config, uint64_t seed, int bf16, const char *sub, char hex[65]) {
    sd_model m;
    synth_from(config, seed, bf16, SD_MAX_LAYERS, 1.0f, &m);
    char dir[256], path[300];
    snprintf(dir, sizeof dir, "%s/%s", tmp_root, sub);
    sd_status st = {0};
    cr_assert_eq(sd_model_save(&m, dir, NULL, &st), SD_OK, "%s", st.msg);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    cr_assert_eq(sd_sha256_file(path, hex, &st), SD_OK);
    sd_model_free(&m);
}

Test(synth, same_seed_same_bytes_other_seed_other_bytes) {
    char a[65], b[65], c[65], d[65];
    save_and_hash("configs/tiny.json", 42, 1, "a", a);
    save_and_hash("configs/tiny.json", 42, 1, "b", b);
    save_and_hash("configs/tiny.json", 43, 1, "c", c);
    save_and_hash("configs/tiny.json", 42, 0, "d", d);
    cr_assert_str_eq(a, b, "same seed must give byte-identical files");
    cr_assert_str_neq(a, c, "a different seed must change the file");
    cr_assert_str_neq(a, d, "bf16 and f32 files differ");
}

// The generator is pinned: this digest is what `specdec init --config configs/tiny.json --seed 42
// --dtype bf16` writes on every machine. A change to the generator, the scales, the tensor
// order or the writer changes it — update it deliberately, never silently.
Test(synth, generator_is_pinned) {
    char a[65];
    save_and_hash("configs/tiny.json", 42, 1, "pin", a);
    cr_assert_str_eq(a, "3e7ae5694f0afbcc8c82dbaf685a8f318359a97185241eb7d2e26a024662b1ff");
}

Test(synth, save_then_load_is_the_same_model) {
    sd_model m, l;
    synth_from("configs/tiny.json", 5, 1, SD_MAX_LAYERS, 1.0f, &m);
    char dir[256];
    snprintf(dir, sizeof dir, "%s/rt", tmp_root);
    sd_status st = {0};
    cr_assert_eq(sd_model_save(&m, dir, NULL, &st), SD_OK, "%s", st.msg);
    cr_assert_eq(sd_model_load(&l, dir, &st), SD_OK, "%s", st.msg);
    int tokens[12];
    random_tokens(1, m.cfg.vocab_size, 12, tokens);
    float *a = logits_chunked(&m, tokens, 12, 4), *b = logits_chunked(&l, tokens, 12, 4);
    cr_assert(memcmp(a, b, sizeof(float) * 12 * m.cfg.vocab_size) == 0, "loaded model computes other logits");
    free(a);
    free(b);
    sd_model_free(&m);
    sd_model_free(&l);
}

// The derived draft with tail scale 0: the target's layers N..L-1 write exactly zero into the
// residual stream, so its logits — and surely its argmax — equal the draft's on every position.
static void check_draft(const char *config, int n_layers, float tail, int *agree, int *total) {
    sd_config cfg, dcfg;
    load_config(config, &cfg);
    sd_status st = {0};
    cr_assert_eq(sd_draft_config(&cfg, n_layers, &dcfg, &st), SD_OK);
    sd_synth_opts o = {.seed = 3, .dtype = SD_DT_BF16, .tail_from = n_layers, .tail_scale = tail, .depth = cfg.num_hidden_layers};
    sd_model t, d;
    cr_assert_eq(sd_synth_model(&t, &cfg, &o, &st), SD_OK);
    cr_assert_eq(sd_synth_model(&d, &dcfg, &o, &st), SD_OK);
    enum { N = 24 };
    int tokens[N];
    random_tokens(17, cfg.vocab_size, N, tokens);
    float *lt = logits_chunked(&t, tokens, N, 1), *ld = logits_chunked(&d, tokens, N, 1);
    *agree = 0;
    *total = N;
    for (int i = 0; i < N; i++)
        *agree += sd_argmax(lt + (size_t)i * cfg.vocab_size, cfg.vocab_size) == sd_argmax(ld + (size_t)i * cfg.vocab_size, cfg.vocab_size);
    free(lt);
    free(ld);
    sd_model_free(&t);
    sd_model_free(&d);
}

Test(synth, derived_draft_tail_zero_agrees_everywhere) {
    int agree, total;
    check_draft("configs/tiny.json", 2, 0.0f, &agree, &total);
    cr_assert_eq(agree, total, "tiny: E = 0 agreed on %d of %d positions", agree, total);
    check_draft("configs/tiny.json", 1, 0.0f, &agree, &total);
    cr_assert_eq(agree, total);
}

Test(synth, derived_draft_large_tail_disagrees) {
    int agree, total;
    check_draft("configs/tiny.json", 1, 4.0f, &agree, &total);
    cr_assert_lt(agree, total, "E = 4 should change some argmax (agreed on all %d)", total);
}

// Weight-file validation: each fault is named. Files are built by saving a model and then
// re-writing its tensor list with one change.
static void write_variant(const sd_model *m, const char *dir, const char *drop, const char *reshape, const char *extra) {
    const sd_weights *w = &m->w;
    sd_st_tensor *t = calloc((size_t)w->n_specs + 1, sizeof *t);
    int n = 0;
    static float pad[4096];
    for (int i = 0; i < w->n_specs; i++) {
        const sd_weight_spec *s = &w->specs[i];
        if (drop && !strcmp(s->name, drop)) continue;
        sd_st_tensor *x = &t[n++];
        *x = (sd_st_tensor){.name = (char *)s->name, .dtype = s->dtype, .ndim = s->ndim, .data = sd_weight_data(s)};
        x->shape[0] = s->shape[0];
        x->shape[1] = s->shape[1];
        if (reshape && !strcmp(s->name, reshape)) x->shape[0] -= 1;
        x->nbytes = (size_t)sd_st_numel(x) * sd_dtype_size(x->dtype);
    }
    if (extra) t[n++] = (sd_st_tensor){.name = (char *)extra, .dtype = SD_DT_F32, .ndim = 1, .shape = {4}, .data = pad, .nbytes = 16};
    sd_status st = {0};
    char path[512];
    cr_assert_eq(sd_model_save(m, dir, NULL, &st), SD_OK);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    cr_assert_eq(sd_st_write(path, t, n, &st), SD_OK, "%s", st.msg);
    free(t);
}

Test(synth, weight_faults_are_named) {
    sd_model m, l;
    synth_from("configs/tiny.json", 1, 0, SD_MAX_LAYERS, 1.0f, &m);
    struct { const char *drop, *reshape, *extra, *want; } cases[] = {
        {"model.layers.2.self_attn.kv_b_proj.weight", NULL, NULL, "missing tensor 'model.layers.2.self_attn.kv_b_proj.weight'"},
        {NULL, "model.layers.1.block_sparse_moe.experts.3.w3.weight", NULL, "tensor 'model.layers.1.block_sparse_moe.experts.3.w3.weight': shape must be [16, 32], got [15, 32]"},
        {NULL, NULL, "model.layers.1.self_attn.q_norm.weight", "tensor 'model.layers.1.self_attn.q_norm.weight' is not part of this config's model"},
        {NULL, NULL, "model.visual.proj.weight", "tensor 'model.visual.proj.weight' is not part of this config's model"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char dir[300];
        snprintf(dir, sizeof dir, "%s/bad%zu", tmp_root, i);
        write_variant(&m, dir, cases[i].drop, cases[i].reshape, cases[i].extra);
        sd_status st = {0};
        cr_assert_eq(sd_model_load(&l, dir, &st), SD_ERR_DATA, "case %zu loaded", i);
        cr_assert(strstr(st.msg, cases[i].want), "case %zu: '%s' lacks '%s'", i, st.msg, cases[i].want);
        cr_assert(strstr(st.msg, "model.safetensors"), "the message names the file: %s", st.msg);
    }
    sd_model_free(&m);
}
