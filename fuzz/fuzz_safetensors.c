// fuzz_safetensors.c — the safetensors reader on arbitrary bytes: header length, JSON header,
// the tensor table and its offsets. Every input is either opened (and then every tensor is
// found by its own name and its bytes read) or refused with a status; never a crash.
#include <string.h>
#include "fuzz_input.h"
#include "safetensors.h" // sd_st_open, sd_st_find, sd_st_close

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char path[64];
    int fd = fuzz_memfile(data, size, path);
    sd_st_file f;
    sd_status st = {0};
    if (sd_st_open(path, &f, &st) == SD_OK) {
        volatile unsigned char sink = 0;
        for (int i = 0; i < f.n; i++) {
            const sd_st_tensor *t = sd_st_find(&f, f.tensors[i].name);
            if (!t) abort(); // a listed tensor must be found under its own name
            if (t->nbytes) sink ^= ((const unsigned char *)t->data)[t->nbytes - 1]; // inside the mapping
        }
        (void)sink;
        sd_st_close(&f);
    } else if (!st.msg[0] || strchr(st.msg, '\n')) {
        abort(); // a refusal is one line of text
    }
    close(fd);
    return 0;
}
