// decode.c — plain decode: prefill, then one forward + commit(1) per token (the stop flag and
// the stop ids checked between steps: generate.h).
//
// Every new token is chosen in the backend by the forward that computes its logits: greedy
// steps ask for the argmax, sampled steps for a draw (sd_forward_opts: the softmax lands in the
// state's logits scratch) — one int comes back per step, never V floats. The draw of the token
// that follows committed length L is sd_uniform(seed, 0, L, SD_DRAW_DECODE), as sd_pick_token
// takes it from host logits.
#include "decode.h"
#include <stdbool.h>
#include "philox.h" // sd_uniform
#include "sample.h" // sd_argmax, sd_softmax, sd_sample

int sd_pick_token(const float *logits, int V, float temperature, uint64_t seed, int pos, float *scratch) {
    if (temperature <= 0.0f) return sd_argmax(logits, V);
    sd_softmax(logits, V, temperature, scratch);
    return sd_sample(scratch, V, sd_uniform(seed, 0, (uint32_t)pos, SD_DRAW_DECODE));
}

sd_code sd_decode(const sd_model *m, sd_state *s, const int *prompt, int n_prompt, int max_new,
                  float temperature, uint64_t seed, sd_gen_control *ctl, int *out, sd_status *st) {
    if (n_prompt < 1) return sd_fail(st, SD_ERR_USAGE, "decode: the prompt needs at least one token, got %d", n_prompt);
    sd_gen_begin(ctl);
    // The prompt but its last token; that token's forward chooses the first new one.
    sd_code rc = sd_gen_prefill(m, s, prompt, n_prompt - 1, ctl, true, st);
    const bool greedy = temperature <= 0.0f;
    int tok = prompt[n_prompt - 1];
    for (int i = 0; !rc && i < max_new && !sd_gen_should_stop(ctl); i++) {
        // tok sits at position L - 1; the token after it is drawn at L (its committed length).
        const uint32_t L = (uint32_t)sd_state_next_pos(s) + 1;
        const int pos0 = s->len;
        if (ctl && ctl->runner) {
            rc = ctl->runner->step(ctl->runner->ctx, tok, &out[i], st);
        } else {
            sd_forward_opts pick = {.argmax = &out[i]};
            if (!greedy)
                pick = (sd_forward_opts){.temperature = temperature, .draw = {seed, 0, L, SD_DRAW_DECODE}, .sampled = &out[i]};
            if (ctl) pick.on_route = ctl->on_route, pick.route_ctx = ctl->route_ctx, pick.ledger = ctl->ledger;
            rc = sd_forward(m, s, &tok, 1, NULL, 0, &pick, st);
            if (!rc) rc = sd_state_commit(s, 1, st);
        }
        if (!rc && ctl && ctl->after_target) ctl->after_target(ctl->target_ctx, pos0, 1);
        tok = out[i];
        if (!rc && sd_gen_committed(ctl, &out[i], 1, i + 1)) break;
    }
    return rc;
}

void sd_synth_prompt(uint64_t seed, int V, int n, int *out) {
    for (int i = 0; i < n; i++) out[i] = (int)(sd_uniform(seed, 0xFFFFFFFFu, (uint32_t)i, SD_DRAW_DECODE) * (float)V) % V;
}
