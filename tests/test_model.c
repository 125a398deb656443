// test_model.c — the forward against MODEL.md's golden vectors (an independent float64
// implementation), verify ≡ decode bitwise, the forward's input errors, and its head's
// requests (argmaxes; softmax rows and Philox draws: sd_forward_opts).
#include <cjson/cJSON.h>
#include <math.h>
#include <string.h>
#include "common.h"
#include "philox.h" // sd_uniform
#include "sample.h" // sd_argmax, sd_softmax, sd_sample

typedef struct { int layer, pos, sel[8]; double w[8]; } route_row;
typedef struct { route_row *rows; int n, cap; } route_log;

static void record_route(void *ctx, int layer, int pos, const int *sel, const float *w, int k, float margin) {
    (void)margin;
    route_log *l = ctx;
    if (l->n == l->cap) l->rows = realloc(l->rows, sizeof *l->rows * (size_t)(l->cap = l->cap ? 2 * l->cap : 64));
    route_row *r = &l->rows[l->n++];
    r->layer = layer;
    r->pos = pos;
    for (int j = 0; j < k; j++) { r->sel[j] = sel[j]; r->w[j] = w[j]; }
}

// Golden rows are in decode walk order (position-major); a verify walk records layer-major
// within a chunk, so compare in (pos, layer) order.
static int by_pos_layer(const void *a, const void *b) {
    const route_row *x = a, *y = b;
    return x->pos != y->pos ? x->pos - y->pos : x->layer - y->layer;
}

static char *slurp(const char *path) {
    FILE *f = fopen(path, "rb");
    cr_assert(f, "cannot open %s", path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)n + 1);
    cr_assert_eq(fread(b, 1, (size_t)n, f), (size_t)n);
    b[n] = 0;
    fclose(f);
    return b;
}

// MODEL.md / tests/golden-hf/README.md (tiny-rope-bf16 is sharded: index + two shards): ‖logits − expected‖ / ‖expected‖ ≤ 1e-4 on the CPU (F32 and
// BF16 weights alike: the weights are exact, only fp32-vs-fp64 arithmetic differs). Routing:
// sel exact (the golden sequences have no near-ties at these margins), w within 1e-5 relative.
static void check_golden(const char *name, int chunk) {
    char dir[4096], path[4200];
    snprintf(dir, sizeof dir, "%s/tests/golden-hf/%s", src_dir(), name);
    snprintf(path, sizeof path, "%s/expected.safetensors", dir);

    sd_status st = {0};
    sd_model m;
    cr_assert_eq(sd_model_load(&m, dir, &st), SD_OK, "%s", st.msg);
    sd_st_file ex;
    cr_assert_eq(sd_st_open(path, &ex, &st), SD_OK, "%s", st.msg);
    const sd_st_tensor *tok = sd_st_find(&ex, "tokens"), *lg = sd_st_find(&ex, "logits");
    cr_assert(tok && lg && tok->dtype == SD_DT_I32 && lg->dtype == SD_DT_F64);
    const int T = (int)tok->shape[0], V = m.cfg.vocab_size;
    int tokens[T];
    memcpy(tokens, tok->data, sizeof tokens);

    route_log routes = {0};
    sd_forward_opts opts = {.on_route = record_route, .route_ctx = &routes};
    sd_state s;
    cr_assert_eq(sd_state_init(&s, &m.cfg, T, chunk, &st), SD_OK);
    float *out = malloc(sizeof(float) * (size_t)T * V);
    for (int t = 0; t < T; t += chunk) {
        int n = T - t < chunk ? T - t : chunk;
        cr_assert_eq(sd_forward(&m, &s, tokens + t, n, out + (size_t)t * V, 0, &opts, &st), SD_OK, "%s", st.msg);
        sd_state_commit(&s, n, &st);
    }
    double num = 0, den = 0;
    for (size_t i = 0; i < (size_t)T * V; i++) {
        double e;
        memcpy(&e, (const char *)lg->data + 8 * i, 8);
        num += (out[i] - e) * (out[i] - e);
        den += e * e;
    }
    double rel = sqrt(num / den);
    cr_assert(rel <= 1e-4, "%s: relative logit error %.3g > 1e-4", name, rel);

    snprintf(path, sizeof path, "%s/routing.json", dir);
    char *text = slurp(path);
    cJSON *rows = cJSON_Parse(text);
    cr_assert(cJSON_IsArray(rows));
    cr_assert_eq(cJSON_GetArraySize(rows), routes.n, "routing rows: golden %d, engine %d", cJSON_GetArraySize(rows), routes.n);
    const int K = m.cfg.num_experts_per_token;
    qsort(routes.rows, (size_t)routes.n, sizeof *routes.rows, by_pos_layer);
    for (int i = 0; i < routes.n; i++) {
        cJSON *r = cJSON_GetArrayItem(rows, i);
        cr_assert_eq(routes.rows[i].layer, cJSON_GetObjectItem(r, "layer")->valueint);
        cr_assert_eq(routes.rows[i].pos, cJSON_GetObjectItem(r, "pos")->valueint);
        for (int j = 0; j < K; j++) {
            cr_assert_eq(routes.rows[i].sel[j], cJSON_GetArrayItem(cJSON_GetObjectItem(r, "sel"), j)->valueint,
                         "row %d (layer %d pos %d) sel[%d]", i, routes.rows[i].layer, routes.rows[i].pos, j);
            double we = cJSON_GetArrayItem(cJSON_GetObjectItem(r, "w"), j)->valuedouble;
            cr_assert(fabs(routes.rows[i].w[j] - we) <= 1e-5 * fabs(we), "row %d w[%d]: %.9g vs %.9g", i, j, routes.rows[i].w[j], we);
        }
    }
    cJSON_Delete(rows);
    free(text);
    free(routes.rows);
    free(out);
    sd_st_close(&ex);
    sd_state_free(&s);
    sd_model_free(&m);
}

Test(golden, nope_f32_decode) { check_golden("tiny-nope-f32", 1); }
Test(golden, nope_f32_verify_chunks) { check_golden("tiny-nope-f32", 5); }
Test(golden, rope_bf16_decode) { check_golden("tiny-rope-bf16", 1); }
Test(golden, rope_bf16_verify_chunks) { check_golden("tiny-rope-bf16", 7); }

// Verify ≡ decode, bitwise: every chunk size gives the same logits as one token at a time.
static void check_verify_equals_decode(const char *config, int bf16) {
    sd_model m;
    synth_from(config, 7, bf16, SD_MAX_LAYERS, 1.0f, &m);
    enum { N = 37 };
    int tokens[N];
    random_tokens(3, m.cfg.vocab_size, N, tokens);
    float *ref = logits_chunked(&m, tokens, N, 1);
    for (int chunk = 2; chunk <= 9; chunk++) {
        float *got = logits_chunked(&m, tokens, N, chunk);
        cr_assert(memcmp(ref, got, sizeof(float) * N * m.cfg.vocab_size) == 0, "%s: chunk %d differs from decode", config, chunk);
        free(got);
    }
    free(ref);
    sd_model_free(&m);
}

Test(verify_decode, tiny_f32) { check_verify_equals_decode("configs/tiny.json", 0); }
Test(verify_decode, tiny_bf16) { check_verify_equals_decode("configs/tiny.json", 1); }
Test(verify_decode, toy_bf16, .timeout = 120) {
    sd_model m;
    synth_from("configs/toy.json", 1, 1, SD_MAX_LAYERS, 1.0f, &m);
    enum { N = 10 };
    int tokens[N];
    random_tokens(5, m.cfg.vocab_size, N, tokens);
    float *ref = logits_chunked(&m, tokens, N, 1), *got = logits_chunked(&m, tokens, N, 5);
    cr_assert(memcmp(ref, got, sizeof(float) * N * m.cfg.vocab_size) == 0, "toy: verify chunk 5 differs from decode");
    free(ref);
    free(got);
    sd_model_free(&m);
}

Test(forward_errors, context_full_and_bad_tokens) {
    sd_model m;
    synth_from("configs/tiny.json", 1, 0, SD_MAX_LAYERS, 1.0f, &m);
    sd_state s;
    sd_status st = {0};
    cr_assert_eq(sd_state_init(&s, &m.cfg, 4, 3, &st), SD_OK);
    int tokens[4] = {1, 2, 3, 4};
    cr_assert_eq(sd_forward(&m, &s, tokens, 3, NULL, 0, NULL, &st), SD_OK);
    cr_assert_eq(sd_state_commit(&s, 3, &st), SD_OK);
    cr_assert_eq(sd_forward(&m, &s, tokens, 2, NULL, 0, NULL, &st), SD_ERR_FULL);
    cr_assert(strstr(st.msg, "context full"), "%s", st.msg);
    cr_assert_eq(s.len, 3);
    cr_assert_eq(s.pending, 0, "a refused forward leaves the state as it was");
    int bad = m.cfg.vocab_size;
    cr_assert_eq(sd_forward(&m, &s, &bad, 1, NULL, 0, NULL, &st), SD_ERR_DATA);
    cr_assert(strstr(st.msg, "outside the vocabulary"), "%s", st.msg);
    cr_assert_eq(sd_forward(&m, &s, tokens, 4, NULL, 0, NULL, &st), SD_ERR_USAGE, "more than max_T tokens");
    cr_assert_eq(sd_state_commit(&s, 1, &st), SD_ERR_USAGE, "commit beyond pending");
    sd_state_free(&s);
    sd_model_free(&m);
}

// A forward asked for argmaxes only returns exactly the argmax of the logits it would return.
Test(forward_argmax, equals_argmax_of_logits) {
    sd_model m;
    synth_from("configs/tiny.json", 3, 1, SD_MAX_LAYERS, 1.0f, &m);
    const int V = m.cfg.vocab_size, T = 6;
    int tokens[T], top_a[T], top_b[T];
    random_tokens(21, V, T, tokens);
    float *lg = malloc(sizeof(float) * T * V);
    sd_status st = {0};
    sd_state s;
    for (int pass = 0; pass < 2; pass++) {
        cr_assert_eq(sd_state_init(&s, &m.cfg, 16, T, &st), SD_OK);
        sd_forward_opts o = {.argmax = pass ? top_b : top_a};
        cr_assert_eq(sd_forward(&m, &s, tokens, T, pass ? NULL : lg, 0, &o, &st), SD_OK, "%s", st.msg);
        sd_state_free(&s);
    }
    for (int t = 0; t < T; t++) {
        cr_assert_eq(top_a[t], sd_argmax(lg + (size_t)t * V, V), "row %d", t);
        cr_assert_eq(top_b[t], top_a[t], "row %d: argmax without logits differs", t);
    }
    free(lg);
    sd_model_free(&m);
}

// A forward asked to sample: probs rows are sd_softmax of the logits it would return, bit for
// bit, and sampled[r] is sd_sample of row r with the draw at pos + r — with the logits copied
// out too (they stay raw), or kept in the state (probs NULL: the softmax overwrites the scratch).
Test(forward_sample, equals_softmax_and_draw_of_logits) {
    sd_model m;
    synth_from("configs/tiny.json", 3, 1, SD_MAX_LAYERS, 1.0f, &m);
    const int V = m.cfg.vocab_size, T = 5;
    const float temp = 0.8f;
    const sd_draw draw = {.seed = 41, .round = 2, .pos = 17, .purpose = SD_DRAW_DRAFT};
    int tokens[T], got_a[T], got_b[T], top[T];
    random_tokens(22, V, T, tokens);
    float *lg = malloc(sizeof(float) * T * V), *probs = malloc(sizeof(float) * T * V), *ref = malloc(sizeof(float) * V);
    sd_status st = {0};
    sd_state s;
    for (int pass = 0; pass < 2; pass++) {
        cr_assert_eq(sd_state_init(&s, &m.cfg, 16, T, &st), SD_OK);
        sd_forward_opts o = {.argmax = pass ? NULL : top, .temperature = temp, .probs = pass ? NULL : probs, .draw = draw,
                             .sampled = pass ? got_b : got_a};
        cr_assert_eq(sd_forward(&m, &s, tokens, T, pass ? NULL : lg, 0, &o, &st), SD_OK, "%s", st.msg);
        sd_state_free(&s);
    }
    for (int t = 0; t < T; t++) {
        sd_softmax(lg + (size_t)t * V, V, temp, ref);
        cr_assert(memcmp(ref, probs + (size_t)t * V, sizeof(float) * V) == 0, "row %d: probs differ from sd_softmax", t);
        cr_assert_eq(top[t], sd_argmax(lg + (size_t)t * V, V), "row %d: argmax beside the draws", t);
        cr_assert_eq(got_a[t], sd_sample(ref, V, sd_uniform(41, 2, 17 + (uint32_t)t, SD_DRAW_DRAFT)), "row %d", t);
        cr_assert_eq(got_b[t], got_a[t], "row %d: the draw without probs differs", t);
    }
    free(lg);
    free(probs);
    free(ref);
    sd_model_free(&m);
}

// ---------------------------------------------------------------------------- route override
// The override's tokens: the router's own selection (identity) or a rotation of every expert id.
typedef struct { int calls, shift, bad_at; const sd_config *c; route_log *chosen; } override_ctx;
static void override_rotate(void *ctx, int layer, int pos, int *sel, float *w, int k) {
    override_ctx *o = ctx;
    o->calls++;
    if (o->chosen) record_route(o->chosen, layer, pos, sel, w, k, 0.0f); // what the router chose
    for (int j = 0; j < k; j++) sel[j] = (sel[j] + o->shift) % o->c->num_experts;
    if (pos == o->bad_at) sel[0] = o->c->num_experts; // one expert id past the end
}

// The route override on the CPU reference: the router's own selection gives the same bits; a
// rewritten one is what the experts run and the tap reports; an expert id out of range is refused
// and leaves the state as it was. Verify chunks call it once per (MoE layer, token) as decode does.
Test(route_override, identity_rewrite_and_refusal) {
    sd_model m;
    synth_from("configs/tiny.json", 5, 1, SD_MAX_LAYERS, 1.0f, &m);
    const sd_config *c = &m.cfg;
    enum { T = 6 };
    const int V = c->vocab_size;
    int tokens[T];
    random_tokens(31, V, T, tokens);
    float *plain = malloc(sizeof(float) * T * V), *same = malloc(sizeof(float) * T * V), *moved = malloc(sizeof(float) * T * V);
    sd_status st = {0};
    int moe_layers = 0;
    for (int i = 0; i < c->num_hidden_layers; i++) moe_layers += sd_config_is_moe(c, i);
    cr_assert(moe_layers > 0);
    float *outs[3] = {plain, same, moved};
    route_log logs[3] = {{0}}, chosen = {0};
    for (int pass = 0; pass < 3; pass++) {
        override_ctx o = {.shift = pass == 2 ? 1 : 0, .bad_at = -1, .c = c, .chosen = pass == 2 ? &chosen : NULL};
        sd_forward_opts opts = {.on_route = record_route, .route_ctx = &logs[pass],
                                .override_route = pass ? override_rotate : NULL, .override_ctx = &o};
        sd_state s;
        cr_assert_eq(sd_state_init(&s, c, 16, T, &st), SD_OK);
        cr_assert_eq(sd_forward(&m, &s, tokens, T, outs[pass], 0, &opts, &st), SD_OK, "%s", st.msg);
        if (pass) cr_assert_eq(o.calls, T * moe_layers, "override calls: %d, expected %d", o.calls, T * moe_layers);
        sd_state_free(&s);
    }
    cr_assert(memcmp(plain, same, sizeof(float) * T * V) == 0, "the identity override changed the logits");
    cr_assert(memcmp(plain, moved, sizeof(float) * T * V) != 0, "a rotated selection left the logits unchanged");
    cr_assert_eq(logs[2].n, chosen.n);
    for (int r = 0; r < chosen.n; r++)
        for (int j = 0; j < c->num_experts_per_token; j++)
            cr_assert_eq(logs[2].rows[r].sel[j], (chosen.rows[r].sel[j] + 1) % c->num_experts,
                         "the tap reports the rewritten selection (row %d, slot %d)", r, j);

    override_ctx bad = {.bad_at = 3, .c = c};
    const sd_forward_opts refuse = {.override_route = override_rotate, .override_ctx = &bad};
    sd_state s;
    cr_assert_eq(sd_state_init(&s, c, 16, T, &st), SD_OK);
    cr_assert_eq(sd_forward(&m, &s, tokens, T, moved, 0, &refuse, &st), SD_ERR_USAGE);
    cr_assert(strstr(st.msg, "route override") && strstr(st.msg, "position 3"), "the error names the position: %s", st.msg);
    cr_assert_eq(s.len, 0);
    cr_assert_eq(s.pending, 0, "a refused forward leaves nothing pending");
    sd_state_free(&s);
    for (int pass = 0; pass < 3; pass++) free(logs[pass].rows);
    free(chosen.rows);
    free(plain); free(same); free(moved);
    sd_model_free(&m);
}

// sd_prefill_rows on the CPU reference: the prefill's route tap is the token path's, once per
// (MoE layer, position), the same rows as forwards of max_T with the forward's tap.
Test(route_override, prefill_route_tap_on_the_token_path) {
    sd_model m;
    synth_from("configs/tiny.json", 5, 1, SD_MAX_LAYERS, 1.0f, &m);
    const sd_config *c = &m.cfg;
    enum { N = 45, MAX_T = 8 };
    int tokens[N];
    random_tokens(32, c->vocab_size, N, tokens);
    sd_status st = {0};
    route_log pre = {0}, fwd = {0};
    sd_state s;
    cr_assert_eq(sd_state_init(&s, c, N, MAX_T, &st), SD_OK);
    const sd_prefill_opts po = {.on_route = record_route, .route_ctx = &pre};
    cr_assert_eq(sd_prefill_rows(&m, &s, tokens, N, NULL, false, &po, &st), SD_OK, "%s", st.msg);
    cr_assert_eq(s.len, N);
    sd_state_free(&s);
    cr_assert_eq(sd_state_init(&s, c, N, MAX_T, &st), SD_OK);
    const sd_forward_opts fo = {.on_route = record_route, .route_ctx = &fwd};
    for (int t = 0; t < N; t += MAX_T) {
        const int T = N - t < MAX_T ? N - t : MAX_T;
        cr_assert_eq(sd_forward(&m, &s, tokens + t, T, NULL, 0, &fo, &st), SD_OK, "%s", st.msg);
        sd_state_commit(&s, T, &st);
    }
    int moe_layers = 0;
    for (int i = 0; i < c->num_hidden_layers; i++) moe_layers += sd_config_is_moe(c, i);
    cr_assert_eq(pre.n, N * moe_layers, "prefill tap rows: %d, expected %d", pre.n, N * moe_layers);
    cr_assert_eq(fwd.n, pre.n);
    for (int r = 0; r < pre.n; r++) {
        cr_assert(pre.rows[r].layer == fwd.rows[r].layer && pre.rows[r].pos == fwd.rows[r].pos, "row %d", r);
        cr_assert(!memcmp(pre.rows[r].sel, fwd.rows[r].sel, sizeof(int) * c->num_experts_per_token), "row %d sel", r);
    }
    free(pre.rows);
    free(fwd.rows);
    sd_state_free(&s);
    sd_model_free(&m);
}
