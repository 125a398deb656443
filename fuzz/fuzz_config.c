// fuzz_config.c — config.json on arbitrary text: parsed and validated, and a config that is
// accepted must (1) write back to text that parses to the same config (so `init` never writes a
// config specdec refuses), (2) have sizes that were checked before anything is allocated: the
// weight table is planned and a small state laid out when the model is small enough to try.
#include <string.h>
#include "config.h"  // sd_config_parse, sd_config_to_json, sd_config_weight_bytes
#include "fuzz_input.h"
#include "state.h"   // sd_state_init
#include "weights.h" // sd_weights_plan

#define TRY_BYTES (8u << 20) // plan and lay out only what a fuzz run can afford

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *text = fuzz_text(data, size);
    sd_config cfg, back;
    sd_status st = {0};
    if (sd_config_parse(text, "fuzz.json", &cfg, &st) == SD_OK) {
        char *json = sd_config_to_json(&cfg);
        if (!json) abort();
        if (sd_config_parse(json, "written.json", &back, &st) != SD_OK) abort(); // written, then refused
        free(json);
        uint64_t bytes;
        const char *key;
        if (sd_config_weight_bytes(&cfg, &bytes, &key) != SD_OK) abort(); // validation bounds it
        if (bytes <= TRY_BYTES) {
            sd_weights w;
            if (sd_weights_plan(&cfg, &w, &st) == SD_OK && w.n_specs != sd_config_tensor_count(&cfg)) abort();
            sd_weights_free(&w);
            sd_state s;
            if (sd_state_init(&s, &cfg, 8, 2, &st) == SD_OK) sd_state_free(&s);
        }
    } else if (!st.msg[0] || strchr(st.msg, '\n')) {
        abort();
    }
    free(text);
    return 0;
}
