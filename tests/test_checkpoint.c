// test_checkpoint.c — engine/base/checkpoint.{h,c}, checkpoint_write.c: a sharded checkpoint
// loads to the single file's logits; each fault of an index against its shards is named; the
// tensors published checkpoints carry unused are skipped; the digest covers every shard byte;
// `specdec init --shard-size` writes shards that load.
#include <cjson/cJSON.h>
#include <dirent.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include "checkpoint.h"
#include "common.h"
#include "digest.h"

static char tmp_root[64];

static void make_tmp(void) {
    strcpy(tmp_root, "/tmp/sd_ckpt_XXXXXX");
    cr_assert(mkdtemp(tmp_root));
}
static void rm_tmp(void) {
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmp_root);
    cr_assert_eq(system(cmd), 0);
}
TestSuite(checkpoint, .init = make_tmp, .fini = rm_tmp);

static const char *in_tmp(const char *rel) {
    static char buf[4][512];
    static int i;
    i = (i + 1) % 4;
    snprintf(buf[i], sizeof buf[i], "%s/%s", tmp_root, rel);
    return buf[i];
}

static bool exists(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0;
}

enum { SMALL_SHARD = 20000 }; // tiny.json's F32 weights are ~10x this: several shards

// tiny.json, F32, seed 3, saved to tmp/<sub> (shard_bytes 0: one file).
static void save_tiny(sd_model *m, const char *sub, uint64_t shard_bytes) {
    synth_from("configs/tiny.json", 3, 0, SD_MAX_LAYERS, 1.0f, m);
    sd_ckpt_write_opts o = {.shard_bytes = shard_bytes ? shard_bytes : SD_CKPT_DEFAULT_SHARD_BYTES};
    sd_status st = {0};
    cr_assert_eq(sd_model_save(m, in_tmp(sub), &o, &st), SD_OK, "%s", st.msg);
}

static float *logits_of(const sd_model *m) {
    int tokens[10];
    random_tokens(9, m->cfg.vocab_size, 10, tokens);
    return logits_chunked(m, tokens, 10, 3);
}

Test(checkpoint, sharded_loads_to_the_single_files_logits) {
    sd_model m, single, sharded;
    save_tiny(&m, "one", 0);
    sd_model_free(&m);
    save_tiny(&m, "many", SMALL_SHARD);
    cr_assert(exists(in_tmp("one/model.safetensors")) && !exists(in_tmp("one/" SD_CKPT_INDEX)));
    cr_assert(exists(in_tmp("many/" SD_CKPT_INDEX)) && !exists(in_tmp("many/model.safetensors")));
    sd_status st = {0};
    cr_assert_eq(sd_model_load(&single, in_tmp("one"), &st), SD_OK, "%s", st.msg);
    cr_assert_eq(sd_model_load(&sharded, in_tmp("many"), &st), SD_OK, "%s", st.msg);
    sd_checkpoint c;
    cr_assert_eq(sd_ckpt_open(in_tmp("many"), &c, &st), SD_OK, "%s", st.msg);
    cr_assert_gt(c.n_shards, 2, "%d shards", c.n_shards);
    cr_assert_eq(c.n, m.w.n_specs);
    for (int i = 0; i < c.n_shards; i++) {
        uint64_t bytes = 0;
        for (int j = 0; j < c.shards[i].file.n; j++) bytes += c.shards[i].file.tensors[j].nbytes;
        cr_assert(bytes <= SMALL_SHARD || c.shards[i].file.n == 1, "shard %s holds %llu bytes", c.shards[i].name,
                  (unsigned long long)bytes);
    }
    sd_ckpt_close(&c);
    float *a = logits_of(&single), *b = logits_of(&sharded);
    cr_assert(memcmp(a, b, sizeof(float) * 10 * m.cfg.vocab_size) == 0, "sharded and single-file logits differ");
    cr_assert_str_neq(single.weights_sha256, sharded.weights_sha256);
    // Saving one layout over the other leaves one model in the directory.
    cr_assert_eq(sd_model_save(&m, in_tmp("one"), &(sd_ckpt_write_opts){.shard_bytes = SMALL_SHARD}, &st), SD_OK, "%s", st.msg);
    cr_assert(!exists(in_tmp("one/model.safetensors")) && exists(in_tmp("one/" SD_CKPT_INDEX)));
    // Back to one file: the shards of the sharded one go too, and nothing else is left.
    cr_assert_eq(sd_model_save(&m, in_tmp("one"), NULL, &st), SD_OK, "%s", st.msg);
    cr_assert(exists(in_tmp("one/model.safetensors")) && !exists(in_tmp("one/" SD_CKPT_INDEX)));
    DIR *d = opendir(in_tmp("one"));
    cr_assert_not_null(d);
    int files = 0;
    for (struct dirent *e; (e = readdir(d));) files += e->d_name[0] != '.';
    closedir(d);
    cr_assert_eq(files, 2, "config.json and model.safetensors only, %d entries", files);
    free(a);
    free(b);
    sd_model_free(&m);
    sd_model_free(&single);
    sd_model_free(&sharded);
}

// ---------------------------------------------------------------------------------------------
// an index against its shards

static cJSON *read_index(const char *dir) {
    char path[700];
    snprintf(path, sizeof path, "%s/%s", dir, SD_CKPT_INDEX);
    FILE *f = fopen(path, "rb");
    cr_assert(f);
    static char buf[1 << 20];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    cJSON *j = cJSON_Parse(buf);
    cr_assert(j);
    return j;
}

static void write_index(const char *dir, cJSON *j) {
    char path[700], *text = cJSON_Print(j);
    snprintf(path, sizeof path, "%s/%s", dir, SD_CKPT_INDEX);
    FILE *f = fopen(path, "wb");
    cr_assert(f);
    fputs(text, f);
    fclose(f);
    free(text);
}

static void expect_load_error(const char *dir, const char *want1, const char *want2) {
    sd_model l;
    sd_status st = {0};
    cr_assert_eq(sd_model_load(&l, dir, &st), SD_ERR_DATA, "%s loaded (%s)", dir, st.msg);
    cr_assert(strstr(st.msg, want1) && strstr(st.msg, want2), "'%s' lacks '%s' or '%s'", st.msg, want1, want2);
}

// Shard 2 rewritten with one more tensor, taken from shard 1.
static void copy_into_second_shard(const char *dir, const char *s1, const char *s2, const char *name) {
    char p1[700], p2[700];
    snprintf(p1, sizeof p1, "%s/%s", dir, s1);
    snprintf(p2, sizeof p2, "%s/%s", dir, s2);
    sd_st_file a, b;
    sd_status st = {0};
    cr_assert_eq(sd_st_open(p1, &a, &st), SD_OK, "%s", st.msg);
    cr_assert_eq(sd_st_open(p2, &b, &st), SD_OK, "%s", st.msg);
    sd_st_tensor *t = malloc(sizeof *t * (size_t)(b.n + 1));
    memcpy(t, b.tensors, sizeof *t * (size_t)b.n);
    t[b.n] = *sd_st_find(&a, name);
    char tmp[720];
    snprintf(tmp, sizeof tmp, "%s.new", p2);
    cr_assert_eq(sd_st_write(tmp, t, b.n + 1, &st), SD_OK, "%s", st.msg);
    cr_assert_eq(rename(tmp, p2), 0);
    free(t);
    sd_st_close(&a);
    sd_st_close(&b);
}

Test(checkpoint, index_faults_are_named) {
    sd_model m;
    save_tiny(&m, "base", SMALL_SHARD);
    sd_model_free(&m);
    const char *s1 = "model-00001-of-", *embed = "model.embed_tokens.weight";
    enum { MISSING_SHARD, TWO_SHARDS, ABSENT_TENSOR, NOT_IN_INDEX, WRONG_SHARD, N_FAULTS };
    for (int fault = 0; fault < N_FAULTS; fault++) {
        char dir[600], cmd[1400];
        snprintf(dir, sizeof dir, "%s/fault%d", tmp_root, fault);
        snprintf(cmd, sizeof cmd, "cp -r %s %s", in_tmp("base"), dir);
        cr_assert_eq(system(cmd), 0);
        cJSON *ix = read_index(dir), *map = cJSON_GetObjectItem(ix, "weight_map");
        const char *first = cJSON_GetObjectItem(map, embed)->valuestring; // the first shard
        cr_assert(strncmp(first, s1, strlen(s1)) == 0, "%s", first);
        char first_s[64], last_s[64];
        snprintf(first_s, sizeof first_s, "%s", first);
        snprintf(last_s, sizeof last_s, "%s", cJSON_GetObjectItem(map, "lm_head.weight")->valuestring);
        cr_assert_str_neq(first_s, last_s);
        char path[700];
        switch (fault) {
        case MISSING_SHARD:
            snprintf(path, sizeof path, "%s/%s", dir, last_s);
            cr_assert_eq(unlink(path), 0);
            expect_load_error(dir, last_s, "is missing");
            expect_load_error(dir, SD_CKPT_INDEX, "of tensor '");
            break;
        case TWO_SHARDS:
            copy_into_second_shard(dir, first_s, last_s, embed);
            expect_load_error(dir, "tensor 'model.embed_tokens.weight' is in two shards", last_s);
            break;
        case ABSENT_TENSOR:
            cJSON_AddItemToObject(map, "model.layers.0.self_attn.q_norm.weight", cJSON_CreateString(first_s));
            write_index(dir, ix);
            expect_load_error(dir, "tensor 'model.layers.0.self_attn.q_norm.weight' is not in its shard", first_s);
            break;
        case NOT_IN_INDEX:
            cJSON_DeleteItemFromObject(map, embed);
            write_index(dir, ix);
            expect_load_error(dir, "holds tensor 'model.embed_tokens.weight', which the index does not name", first_s);
            break;
        case WRONG_SHARD:
            cJSON_ReplaceItemInObject(map, embed, cJSON_CreateString(last_s));
            write_index(dir, ix);
            expect_load_error(dir, "tensor 'model.embed_tokens.weight' is not in its shard", first_s);
            break;
        }
        cJSON_Delete(ix);
    }
}

// fuzz_shard_index's two findings (both its own assumptions, kept as the rules): a shard the
// index does not name is not part of the checkpoint (a stray file beside it), and an index that
// names no tensor is refused.
Test(checkpoint, index_rules_the_fuzzer_found) {
    sd_model m;
    save_tiny(&m, "stray", SMALL_SHARD);
    sd_model_free(&m);
    cJSON *ix = read_index(in_tmp("stray")), *map = cJSON_GetObjectItem(ix, "weight_map");
    const char *last = cJSON_GetObjectItem(map, "lm_head.weight")->valuestring;
    cJSON *only = cJSON_CreateObject(), *only_map = cJSON_AddObjectToObject(only, "weight_map");
    const cJSON *kv;
    int kept = 0;
    cJSON_ArrayForEach(kv, map) // the last shard's tensors alone
        if (!strcmp(kv->valuestring, last)) cJSON_AddItemToObject(only_map, kv->string, cJSON_CreateString(last)), kept++;
    write_index(in_tmp("stray"), only);
    sd_checkpoint c;
    sd_status st = {0};
    cr_assert_eq(sd_ckpt_open(in_tmp("stray"), &c, &st), SD_OK, "%s", st.msg);
    cr_expect_eq(c.n_shards, 1, "the shards the index names, only");
    cr_expect_eq(c.n, kept);
    sd_ckpt_close(&c);
    cJSON *empty = cJSON_CreateObject();
    cJSON_AddObjectToObject(empty, "weight_map");
    write_index(in_tmp("stray"), empty);
    cr_assert_eq(sd_ckpt_open(in_tmp("stray"), &c, &st), SD_ERR_DATA);
    cr_expect(strstr(st.msg, "names no tensor") && strstr(st.msg, SD_CKPT_INDEX), "%s", st.msg);
    cJSON_Delete(ix);
    cJSON_Delete(only);
    cJSON_Delete(empty);
}

Test(checkpoint, both_layouts_or_neither_refused) {
    sd_model m, l;
    save_tiny(&m, "both", SMALL_SHARD);
    sd_status st = {0};
    cr_assert_eq(sd_st_write(in_tmp("both/model.safetensors"), NULL, 0, &st), SD_OK);
    cr_assert_eq(sd_model_load(&l, in_tmp("both"), &st), SD_ERR_DATA);
    cr_assert(strstr(st.msg, "holds both"), "%s", st.msg);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "cp %s/both/config.json %s/config-only.json && mkdir %s/none && mv %s/config-only.json %s/none/config.json",
             tmp_root, tmp_root, tmp_root, tmp_root, tmp_root);
    cr_assert_eq(system(cmd), 0);
    cr_assert_neq(sd_model_load(&l, in_tmp("none"), &st), SD_OK);
    cr_assert(strstr(st.msg, "model.safetensors") && strstr(st.msg, SD_CKPT_INDEX), "%s", st.msg);
    sd_model_free(&m);
}

// ---------------------------------------------------------------------------------------------
// tensors the published checkpoints carry unused

// m's tensors plus `extra` (a copy of the final norm's data under another name) as dir's single file.
static void save_with_extra(const sd_model *m, const char *dir, const char *extra, const sd_weight_spec *like) {
    sd_status st = {0};
    cr_assert_eq(sd_model_save(m, dir, NULL, &st), SD_OK, "%s", st.msg);
    const sd_weights *w = &m->w;
    sd_st_tensor *t = calloc((size_t)w->n_specs + 1, sizeof *t);
    for (int i = 0; i <= w->n_specs; i++) {
        const sd_weight_spec *s = i < w->n_specs ? &w->specs[i] : like;
        t[i] = (sd_st_tensor){.name = (char *)(i < w->n_specs ? s->name : extra), .dtype = s->dtype, .ndim = s->ndim,
                              .data = sd_weight_data(s)};
        t[i].shape[0] = s->shape[0];
        t[i].shape[1] = s->shape[1];
        t[i].nbytes = (size_t)sd_st_numel(&t[i]) * sd_dtype_size(s->dtype);
    }
    char path[700];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    cr_assert_eq(sd_st_write(path, t, w->n_specs + 1, &st), SD_OK, "%s", st.msg);
    free(t);
}

static const sd_weight_spec *spec_named(const sd_model *m, const char *name) {
    for (int i = 0; i < m->w.n_specs; i++)
        if (!strcmp(m->w.specs[i].name, name)) return &m->w.specs[i];
    cr_assert_fail("no spec %s", name);
    return NULL;
}

Test(checkpoint, mtp_layers_beyond_the_last_are_skipped) {
    sd_model m, l;
    synth_from("configs/tiny.json", 3, 0, SD_MAX_LAYERS, 1.0f, &m);
    const sd_weight_spec *q = spec_named(&m, "model.layers.3.self_attn.q_proj.weight");
    save_with_extra(&m, in_tmp("mtp"), "model.layers.4.self_attn.q_proj.weight", q); // L = 4: an MTP layer
    sd_status st = {0};
    cr_assert_eq(sd_model_load(&l, in_tmp("mtp"), &st), SD_OK, "%s", st.msg);
    float *a = logits_of(&m), *b = logits_of(&l);
    cr_assert(memcmp(a, b, sizeof(float) * 10 * m.cfg.vocab_size) == 0);
    free(a);
    free(b);
    sd_model_free(&l);
    // Inside the model's layers an unknown name stays an error; so does a name that only looks like a layer.
    const char *strays[] = {"model.layers.3.self_attn.q_norm.weight", "model.layers.x4.q.weight", "model.layers.4"};
    for (size_t i = 0; i < sizeof strays / sizeof strays[0]; i++) {
        char dir[600];
        snprintf(dir, sizeof dir, "%s/stray%zu", tmp_root, i);
        save_with_extra(&m, dir, strays[i], q);
        expect_load_error(dir, strays[i], "is not part of this config's model");
    }
    sd_model_free(&m);
}

Test(checkpoint, tied_head_ignores_lm_head) {
    sd_config cfg;
    load_config("configs/tiny.json", &cfg);
    cfg.tie_word_embeddings = true;
    sd_synth_opts o = {.seed = 4, .dtype = SD_DT_F32, .tail_from = SD_MAX_LAYERS, .tail_scale = 1.0f};
    sd_model m, l, untied;
    sd_status st = {0};
    cr_assert_eq(sd_synth_model(&m, &cfg, &o, &st), SD_OK, "%s", st.msg);
    synth_from("configs/tiny.json", 4, 0, SD_MAX_LAYERS, 1.0f, &untied); // its lm_head differs from the embedding
    save_with_extra(&m, in_tmp("tied"), "lm_head.weight", spec_named(&untied, "lm_head.weight"));
    cr_assert_eq(sd_model_load(&l, in_tmp("tied"), &st), SD_OK, "%s", st.msg);
    cr_assert(l.w.lm_head.data == l.w.embed.data, "a tied model's head is its embedding");
    float *a = logits_of(&m), *b = logits_of(&l);
    cr_assert(memcmp(a, b, sizeof(float) * 10 * m.cfg.vocab_size) == 0, "the file's lm_head.weight was used");
    free(a);
    free(b);
    sd_model_free(&l);
    sd_model_free(&m);
    sd_model_free(&untied);
}

// ---------------------------------------------------------------------------------------------
// the digest

static void flip_last_byte(const char *path) {
    FILE *f = fopen(path, "r+b");
    cr_assert(f);
    cr_assert_eq(fseek(f, -1, SEEK_END), 0);
    int c = fgetc(f);
    cr_assert_eq(fseek(f, -1, SEEK_END), 0);
    fputc(c ^ 1, f);
    fclose(f);
}

Test(checkpoint, digest_is_the_manifest_of_every_file) {
    sd_model m;
    save_tiny(&m, "dg", SMALL_SHARD);
    sd_model_free(&m);
    sd_checkpoint c;
    sd_status st = {0};
    char before[65], after[65], want[65], file_hex[65];
    cr_assert_eq(sd_ckpt_open(in_tmp("dg"), &c, &st), SD_OK, "%s", st.msg);
    cr_assert_eq(sd_ckpt_digest(&c, before, &st), SD_OK, "%s", st.msg);
    // The definition (docs/CHECKPOINTS.md): sha256 of `sha256sum <shards in name order> <index>`.
    char manifest[8192];
    size_t len = 0;
    for (int i = 0; i <= c.n_shards; i++) {
        const char *path = i < c.n_shards ? c.shards[i].path : c.index_path;
        cr_assert_eq(sd_sha256_file(path, file_hex, &st), SD_OK);
        len += (size_t)snprintf(manifest + len, sizeof manifest - len, "%s  %s\n", file_hex,
                                i < c.n_shards ? c.shards[i].name : SD_CKPT_INDEX);
    }
    sd_sha256_buf(manifest, len, want);
    cr_assert_str_eq(before, want);
    char last[600];
    snprintf(last, sizeof last, "%s", c.shards[c.n_shards - 1].path);
    sd_ckpt_close(&c);
    flip_last_byte(last); // one data byte of the last shard
    cr_assert_eq(sd_ckpt_open(in_tmp("dg"), &c, &st), SD_OK, "%s", st.msg);
    cr_assert_eq(sd_ckpt_digest(&c, after, &st), SD_OK, "%s", st.msg);
    cr_assert_str_neq(before, after, "a shard byte changed, the digest did not");
    sd_ckpt_close(&c);
}

// ---------------------------------------------------------------------------------------------
// specdec init --shard-size

static int run(const char *args) {
    char cmd[2000];
    snprintf(cmd, sizeof cmd, "%s %s >/dev/null 2>&1", SPECDEC_BIN, args);
    int rc = system(cmd);
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

Test(checkpoint, init_shard_size_writes_shards_that_load) {
    char args[1200];
    snprintf(args, sizeof args, "init --config %s --out %s --dtype f32 --seed 3", src_path("configs/tiny.json"), in_tmp("i1"));
    cr_assert_eq(run(args), 0);
    snprintf(args, sizeof args, "init --config %s --out %s --dtype f32 --seed 3 --shard-size 20KB --progress",
             src_path("configs/tiny.json"), in_tmp("i2"));
    cr_assert_eq(run(args), 0);
    cr_assert(exists(in_tmp("i2/" SD_CKPT_INDEX)) && !exists(in_tmp("i2/model.safetensors")));
    sd_model a, b;
    sd_status st = {0};
    cr_assert_eq(sd_model_load(&a, in_tmp("i1"), &st), SD_OK, "%s", st.msg);
    cr_assert_eq(sd_model_load(&b, in_tmp("i2"), &st), SD_OK, "%s", st.msg);
    float *la = logits_of(&a), *lb = logits_of(&b);
    cr_assert(memcmp(la, lb, sizeof(float) * 10 * a.cfg.vocab_size) == 0);
    free(la);
    free(lb);
    sd_model_free(&a);
    sd_model_free(&b);
    const char *bad[] = {"5x", "0", "-1", "GB", "1.5GB", "99999999999999999999"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(args, sizeof args, "init --config %s --out %s --shard-size %s", src_path("configs/tiny.json"), in_tmp("i3"), bad[i]);
        cr_assert_eq(run(args), 2, "--shard-size %s", bad[i]);
    }
    cr_assert(!exists(in_tmp("i3")), "a refused init wrote nothing");
}
