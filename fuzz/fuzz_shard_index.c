// fuzz_shard_index.c — a sharded checkpoint's model.safetensors.index.json on arbitrary text,
// beside two fixed, valid shards (made once in a private temporary folder): the index is parsed
// and checked against the shards (checkpoint.h). Every input either opens — and then every
// tensor of the shards is found under its own name in the shard the index names — or is refused
// with a one-line status; never a crash or a leak. (A shard the index does not name is not part
// of the checkpoint, as a stray file beside it: an index naming only c opens with one tensor.)
#include <string.h>
#include "checkpoint.h" // sd_ckpt_open, sd_ckpt_find, sd_ckpt_close
#include "fuzz_input.h"

static char dir[64];
static const char *const names[3] = {"a", "b", "c"};

static void remove_shards(void) {
    const char *files[3] = {"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors", SD_CKPT_INDEX};
    char path[128];
    for (int i = 0; i < 3; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, files[i]);
        unlink(path);
    }
    rmdir(dir);
}

// Two shards: model-00001-of-00002 holds a and b, model-00002-of-00002 holds c.
static void make_shards(void) {
    fuzz_private_dir(dir, "fuzz_index");
    atexit(remove_shards);
    static float v[4] = {1, 2, 3, 4};
    sd_st_tensor t[3];
    for (int i = 0; i < 3; i++)
        t[i] = (sd_st_tensor){.name = (char *)names[i], .dtype = SD_DT_F32, .ndim = 1, .shape = {4}, .data = v,
                              .nbytes = sizeof v};
    char path[128];
    sd_status st = {0};
    snprintf(path, sizeof path, "%s/model-00001-of-00002.safetensors", dir);
    if (sd_st_write(path, t, 2, &st)) abort();
    snprintf(path, sizeof path, "%s/model-00002-of-00002.safetensors", dir);
    if (sd_st_write(path, t + 2, 1, &st)) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!dir[0]) make_shards();
    char path[128];
    snprintf(path, sizeof path, "%s/" SD_CKPT_INDEX, dir);
    fuzz_write_file(path, data, size);
    sd_checkpoint c;
    sd_status st = {0};
    if (sd_ckpt_open(dir, &c, &st) == SD_OK) {
        if (c.n < 1 || c.n > 3) abort(); // the tensors of the shards it names, each once
        for (int i = 0; i < c.n; i++) { // each where it is: a, b in the first shard, c in the second
            const char *name = c.entries[i].tensor->name, *shard = NULL;
            if (strcmp(name, "a") && strcmp(name, "b") && strcmp(name, "c")) abort();
            if (sd_ckpt_find(&c, name, &shard) != c.entries[i].tensor || !shard) abort();
            if (!strstr(shard, strcmp(name, "c") ? "model-00001-of-00002" : "model-00002-of-00002")) abort();
        }
        sd_ckpt_close(&c);
    } else if (!st.msg[0] || strchr(st.msg, '\n')) {
        abort(); // a refusal is one line of text
    }
    return 0;
}
