// fuzz_model.c — load + one forward of a tiny model: the input is a model.safetensors for
// configs/tiny.json (the seed corpus holds synthesised ones), written into a private folder and
// opened as that folder's checkpoint (checkpoint.h), as a model directory is. Every file is refused with a
// status, or loaded and run over two tokens; a forward either succeeds with finite logits or
// fails naming the layer where a non-finite value first appeared — never a crash, never NaN
// logits with success.
#include <math.h>
#include <string.h>
#include "checkpoint.h" // sd_ckpt_open, SD_CKPT_SINGLE
#include "fuzz_input.h"
#include "model.h" // sd_forward, sd_model_state_init

static sd_config tiny;
static char dir[64], file[128];

static void remove_dir(void) {
    unlink(file);
    rmdir(dir);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    sd_status st = {0};
    if (sd_config_load(SPECDEC_SOURCE_DIR "/configs/tiny.json", &tiny, &st)) { fprintf(stderr, "%s\n", st.msg); abort(); }
    fuzz_private_dir(dir, "fuzz_model");
    snprintf(file, sizeof file, "%s/" SD_CKPT_SINGLE, dir);
    atexit(remove_dir);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_write_file(file, data, size);
    sd_checkpoint f;
    sd_status st = {0};
    if (sd_ckpt_open(dir, &f, &st) == SD_OK) {
        sd_model m;
        memset(&m, 0, sizeof m);
        m.cfg = tiny;
        if (sd_weights_load(&m.cfg, &f, &m.w, &st) == SD_OK) {
            sd_state s;
            if (sd_model_state_init(&m, &s, 4, 2, &st)) abort();
            const int tokens[2] = {size % 64, (size / 64) % 64};
            float logits[2 * 64];
            sd_code rc = sd_forward(&m, &s, tokens, 2, logits, 0, NULL, &st);
            if (rc == SD_OK) {
                for (int i = 0; i < 2 * 64; i++)
                    if (!isfinite(logits[i])) abort(); // success with a NaN: the silent class
            } else if (rc != SD_ERR_NONFINITE) {
                abort();
            }
            sd_state_free(&s);
            sd_weights_free(&m.w);
        }
        sd_ckpt_close(&f);
    }
    return 0;
}
