// generate.c — the generation control shared by decode.c and spec.c (generate.h).
#include "generate.h"

void sd_gen_begin(sd_gen_control *c) {
    if (!c) return;
    c->n_out = 0;
    c->end = SD_GEN_MAX_NEW;
}

bool sd_gen_should_stop(sd_gen_control *c) {
    if (!c || !c->stop || !*c->stop) return false;
    c->end = SD_GEN_STOPPED;
    return true;
}

static bool is_eos(const sd_gen_control *c, int token) {
    for (int i = 0; c && i < c->n_eos; i++)
        if (c->eos[i] == token) return true;
    return false;
}

int sd_gen_keep(const sd_gen_control *c, const int *tokens, int n, int room) {
    int keep = n < room ? n : room;
    for (int i = 0; i < keep; i++)
        if (is_eos(c, tokens[i])) return i + 1;
    return keep;
}

bool sd_gen_committed(sd_gen_control *c, const int *tokens, int n, int done) {
    if (!c) return false;
    c->n_out = done;
    if (c->on_commit && n > 0) c->on_commit(c->ctx, tokens, n);
    if (n > 0 && is_eos(c, tokens[n - 1])) {
        c->end = SD_GEN_EOS;
        return true;
    }
    return false;
}

sd_code sd_gen_prefill(const sd_model *m, sd_state *s, const int *tokens, int n, sd_gen_control *c, bool report,
                       sd_status *st) {
    for (int done = 0; done < n && !sd_gen_should_stop(c);) {
        int T = n - done < s->max_T ? n - done : s->max_T;
        sd_code rc = sd_prefill(m, s, tokens + done, T, NULL, st);
        if (rc) return rc;
        done += T;
        if (report && c && c->on_prefill) c->on_prefill(c->ctx, done, n);
    }
    return SD_OK;
}
