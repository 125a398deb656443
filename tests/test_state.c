// test_state.c — rollback: forward T tokens then commit(n) ≡ a state that only saw the n
// tokens, bitwise (live-state hash and every later logit), for all n; also across several
// pending forwards (the draft's pattern) and at the edges of the ring buffers.
// The cursor that device kernels read follows len and pending.
#include <string.h>
#include "common.h"

// Live-state hash and next-token logits of a fresh state fed prefix[0..n).
static void reference(const sd_model *m, const int *seq, int n, int next, int cap, int max_T, char hash[65], float *logits) {
    sd_state s;
    sd_status st = {0};
    cr_assert_eq(sd_state_init(&s, &m->cfg, cap, max_T, &st), SD_OK);
    cr_assert_eq(sd_prefill(m, &s, seq, n, NULL, &st), SD_OK, "%s", st.msg);
    sd_state_live_hash(&s, hash);
    cr_assert_eq(sd_forward(m, &s, &next, 1, logits, 0, NULL, &st), SD_OK);
    sd_state_free(&s);
}

static void check_rollback(const char *config, int prefix, int T, int max_T) {
    sd_model m;
    synth_from(config, 11, 0, SD_MAX_LAYERS, 1.0f, &m);
    const int V = m.cfg.vocab_size, cap = prefix + T + 1;
    int seq[prefix + T + 1];
    random_tokens((uint32_t)(prefix * 31 + T), V, prefix + T + 1, seq);
    float *got = malloc(sizeof(float) * V), *want = malloc(sizeof(float) * V);
    sd_status st = {0};
    for (int n = 0; n <= T; n++) {
        sd_state s;
        cr_assert_eq(sd_state_init(&s, &m.cfg, cap, max_T, &st), SD_OK);
        cr_assert_eq(sd_prefill(&m, &s, seq, prefix, NULL, &st), SD_OK);
        cr_assert_eq(sd_forward(&m, &s, seq + prefix, T, NULL, 0, NULL, &st), SD_OK, "%s", st.msg);
        cr_assert_eq(sd_state_commit(&s, n, &st), SD_OK);
        char h_got[65], h_want[65];
        sd_state_live_hash(&s, h_got);
        // The token after the kept prefix: seq[prefix+n] (a different one than the dropped path
        // would have seen when n < T, which is the point).
        const int next = (seq[prefix + n] + 1) % V;
        cr_assert_eq(sd_forward(&m, &s, &next, 1, got, 0, NULL, &st), SD_OK);
        reference(&m, seq, prefix + n, next, cap, max_T, h_want, want);
        cr_assert_str_eq(h_got, h_want, "%s: prefix %d, T %d, commit(%d): live state differs", config, prefix, T, n);
        cr_assert(memcmp(got, want, sizeof(float) * V) == 0, "%s: commit(%d) of %d: next logits differ", config, n, T);
        sd_state_free(&s);
    }
    free(got);
    free(want);
    sd_model_free(&m);
}

Test(rollback, verify_block_every_n) { check_rollback("configs/tiny.json", 6, 5, 5); }
Test(rollback, from_empty_sequence) { check_rollback("configs/tiny.json", 0, 4, 4); }
Test(rollback, max_T_larger_than_block) { check_rollback("configs/tiny.json", 9, 8, 17); }
Test(rollback, conv_window_longer_than_prefix) { check_rollback("configs/tiny.json", 2, 3, 3); }

// The draft's pattern: k single-token forwards pending, then commit(n) for every n.
Test(rollback, accumulated_pending_forwards) {
    sd_model m;
    synth_from("configs/tiny.json", 12, 0, SD_MAX_LAYERS, 1.0f, &m);
    const int V = m.cfg.vocab_size, k = 6, prefix = 5;
    int seq[prefix + k];
    random_tokens(99, V, prefix + k, seq);
    sd_status st = {0};
    for (int n = 0; n <= k; n++) {
        sd_state s;
        cr_assert_eq(sd_state_init(&s, &m.cfg, 64, k, &st), SD_OK);
        cr_assert_eq(sd_prefill(&m, &s, seq, prefix, NULL, &st), SD_OK);
        for (int i = 0; i < k; i++) cr_assert_eq(sd_forward(&m, &s, seq + prefix + i, 1, NULL, 0, NULL, &st), SD_OK);
        cr_assert_eq(s.pending, k);
        cr_assert_eq(sd_forward(&m, &s, seq, 1, NULL, 0, NULL, &st), SD_ERR_USAGE, "pending may not exceed max_T");
        cr_assert_eq(sd_state_commit(&s, n, &st), SD_OK);
        char h_got[65], h_want[65];
        sd_state_live_hash(&s, h_got);
        sd_state r;
        cr_assert_eq(sd_state_init(&r, &m.cfg, 64, k, &st), SD_OK);
        cr_assert_eq(sd_prefill(&m, &r, seq, prefix + n, NULL, &st), SD_OK);
        sd_state_live_hash(&r, h_want);
        cr_assert_str_eq(h_got, h_want, "commit(%d) after %d pending single-token forwards", n, k);
        sd_state_free(&r);
        sd_state_free(&s);
    }
    sd_model_free(&m);
}

// Many rounds in a row wrap the slot and conv rings several times over.
Test(rollback, rings_wrap_over_many_rounds) {
    sd_model m;
    synth_from("configs/tiny.json", 13, 0, SD_MAX_LAYERS, 1.0f, &m);
    const int V = m.cfg.vocab_size, T = 4, rounds = 25;
    int seq[rounds * T];
    random_tokens(5, V, rounds * T, seq);
    sd_status st = {0};
    sd_state s;
    cr_assert_eq(sd_state_init(&s, &m.cfg, rounds * T, T, &st), SD_OK);
    int kept[rounds * T], n_kept = 0;
    for (int r = 0; r < rounds; r++) {
        int n = (r * 7) % (T + 1);
        cr_assert_eq(sd_forward(&m, &s, seq + n_kept, T, NULL, 0, NULL, &st), SD_OK, "%s", st.msg);
        cr_assert_eq(sd_state_commit(&s, n, &st), SD_OK);
        n_kept += n;
    }
    memcpy(kept, seq, sizeof(int) * n_kept);
    char h_got[65], h_want[65];
    sd_state_live_hash(&s, h_got);
    sd_state r;
    cr_assert_eq(sd_state_init(&r, &m.cfg, rounds * T, T, &st), SD_OK);
    cr_assert_eq(sd_prefill(&m, &r, kept, n_kept, NULL, &st), SD_OK);
    sd_state_live_hash(&r, h_want);
    cr_assert_str_eq(h_got, h_want);
    sd_state_free(&r);
    sd_state_free(&s);
    sd_model_free(&m);
}

// The cursor (state.h): {len, pending} in the state's own memory follows every forward, commit
// and reset — what device kernels read instead of a position argument.
Test(state, cursor_follows_len_and_pending) {
    sd_model m;
    synth_from("configs/tiny.json", 11, 0, SD_MAX_LAYERS, 1.0f, &m);
    sd_state s;
    sd_status st = {0};
    cr_assert_eq(sd_state_init(&s, &m.cfg, 16, 4, &st), SD_OK);
    cr_assert(s.cursor[0] == 0 && s.cursor[1] == 0, "a new state's cursor is {0, 0}");
    const int toks[4] = {1, 2, 3, 4};
    cr_assert_eq(sd_forward(&m, &s, toks, 3, NULL, 0, NULL, &st), SD_OK, "%s", st.msg);
    cr_assert(s.cursor[0] == 0 && s.cursor[1] == 3, "after a 3-token forward: {%d, %d}", s.cursor[0], s.cursor[1]);
    cr_assert_eq(sd_forward(&m, &s, toks, 1, NULL, 0, NULL, &st), SD_OK, "%s", st.msg);
    cr_assert(s.cursor[0] == 0 && s.cursor[1] == 4, "pending accumulates: {%d, %d}", s.cursor[0], s.cursor[1]);
    cr_assert_eq(sd_state_commit(&s, 2, &st), SD_OK);
    cr_assert(s.cursor[0] == 2 && s.cursor[1] == 0, "commit(2): {%d, %d}", s.cursor[0], s.cursor[1]);
    cr_assert_eq(sd_forward(&m, &s, toks, 4, NULL, 0, NULL, &st), SD_OK, "%s", st.msg);
    cr_assert_eq(sd_forward(&m, &s, toks, 1, NULL, 0, NULL, &st), SD_ERR_USAGE, "beyond max_T must fail");
    cr_assert(s.cursor[0] == 2 && s.cursor[1] == 4, "a refused forward leaves the cursor: {%d, %d}", s.cursor[0], s.cursor[1]);
    sd_state_reset(&s);
    cr_assert(s.cursor[0] == 0 && s.cursor[1] == 0, "reset: {%d, %d}", s.cursor[0], s.cursor[1]);
    sd_state_free(&s);
    sd_model_free(&m);
}
