// bench_cpu_decode.c — CPU numbers (printed, never asserted):
//   1. plain decode tokens/s on toy and tiny, and the per-layer-class time split of a decode
//      step (KDA mixers, MLA mixers, FFN; the rest is norms, embedding and the head);
//   2. speculative vs plain on toy with the demo's derived draft at k = 1..8: tokens/s, the
//      measured acceptance, and the speedup the phase costs predict (mean accepted length /
//      per-round ms against plain ms per token);
//   3. trace overhead: level 1 and level 2 against level 0 at k = 4.
// usage: bench_cpu_decode [--tokens N] [--json]  (configs are read from the source tree)
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "decode.h"
#include "spec.h"
#include "synth.h"

#ifndef SPECDEC_SOURCE_DIR
#define SPECDEC_SOURCE_DIR "."
#endif

static int json_out;

static double now_s(void) { return (double)trace_now_ns() * 1e-9; }

static void synth(const char *name, int tail_from, float tail, int depth, int n_layers, sd_model *m) {
    char path[4096];
    snprintf(path, sizeof path, "%s/configs/%s.json", SPECDEC_SOURCE_DIR, name);
    sd_config cfg;
    sd_status st = {0};
    if (sd_config_load(path, &cfg, &st) || (n_layers && sd_draft_config(&cfg, n_layers, &cfg, &st))) {
        fprintf(stderr, "bench: %s\n", st.msg);
        exit(1);
    }
    sd_synth_opts o = {.seed = 0, .dtype = SD_DT_BF16, .tail_from = tail_from, .tail_scale = tail, .depth = depth};
    if (sd_synth_model(m, &cfg, &o, &st)) { fprintf(stderr, "bench: %s\n", st.msg); exit(1); }
}

// Plain decode of n tokens after a 16-token prompt; returns tokens/s of the decode loop and
// fills the per-class split (ms per token) from a second, level-2 instrumented pass.
static double bench_plain(const sd_model *m, int n, double split_ms[4]) {
    sd_status st = {0};
    sd_state s;
    int prompt[16], tok = 0;
    sd_synth_prompt(0, m->cfg.vocab_size, 16, prompt);
    float *lg = malloc(sizeof(float) * 2 * (size_t)m->cfg.vocab_size);
    double best = 0;
    for (int pass = 0; pass < 2; pass++) { // pass 0: clean timing; pass 1: level-2 buckets
        sd_state_init(&s, &m->cfg, 16 + n + 1, 16, &st);
        sd_prefill(m, &s, prompt, 16, lg, &st);
        trace_burst tb;
        trace_burst_begin(&tb, pass ? 2 : 0, 0, NULL, NULL);
        sd_forward_opts opts = {.trace = pass ? &tb : NULL};
        uint64_t t_head = 0;
        double t0 = now_s();
        for (int i = 0; i < n; i++) {
            tok = sd_argmax(lg, m->cfg.vocab_size);
            uint64_t a = trace_now_ns();
            sd_forward(m, &s, &tok, 1, lg, 0, &opts, &st);
            t_head += trace_now_ns() - a;
            sd_state_commit(&s, 1, &st);
        }
        double secs = now_s() - t0;
        if (!pass) best = n / secs;
        else {
            split_ms[0] = tb.bucket_ns[TRACE_BUCKET_VKDA] / 1e6 / n;
            split_ms[1] = tb.bucket_ns[TRACE_BUCKET_VMLA] / 1e6 / n;
            split_ms[2] = tb.bucket_ns[TRACE_BUCKET_VFFN] / 1e6 / n;
            split_ms[3] = t_head / 1e6 / n - split_ms[0] - split_ms[1] - split_ms[2];
        }
        sd_state_free(&s);
    }
    free(lg);
    return best;
}

typedef struct { double tok_s, acceptance, mean_len, round_ms, predicted_tok_s; } spec_result;

static spec_result bench_spec(const sd_model *t, const sd_model *d, int k, int n, int level) {
    sd_status st = {0};
    sd_state ts, ds;
    int prompt[16], *out = malloc(sizeof(int) * (size_t)n);
    sd_synth_prompt(0, t->cfg.vocab_size, 16, prompt);
    sd_state_init(&ts, &t->cfg, 16 + n + k + 1, k + 1 > 16 ? k + 1 : 16, &st);
    sd_state_init(&ds, &d->cfg, 16 + n + k + 1, k > 16 ? k : 16, &st);
    trace_burst tb;
    trace_burst_begin(&tb, level ? level : 1, k, NULL, NULL); // phase costs always (level 0 runs unclocked below)
    sd_spec_opts o = {.k = k, .temperature = 0, .seed = 0, .trace = level ? &tb : NULL};
    sd_accept_stats stats = {0};
    double t0 = now_s();
    if (sd_spec_generate(t, &ts, d, &ds, prompt, 16, n, &o, out, &stats, &st)) { fprintf(stderr, "bench: %s\n", st.msg); exit(1); }
    double secs = now_s() - t0;
    spec_result r = {.tok_s = n / secs, .acceptance = sd_stats_acceptance_rate(&stats),
                     .mean_len = sd_stats_mean_accepted_length(&stats)};
    if (level) {
        uint64_t total = 0;
        for (int i = 0; i < TRACE_N_PHASES; i++) total += tb.phase_ns[i];
        r.round_ms = total / 1e6 / (double)stats.rounds;
        r.predicted_tok_s = r.mean_len / r.round_ms * 1e3;
    }
    sd_state_free(&ts);
    sd_state_free(&ds);
    free(out);
    return r;
}

int main(int argc, char **argv) {
    int n = 128;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--json")) json_out = 1;
        else if (!strcmp(argv[i], "--tokens") && i + 1 < argc) n = atoi(argv[++i]);
        else { fprintf(stderr, "usage: bench_cpu_decode [--tokens N] [--json]\n"); return 2; }
    }
    const char *names[2] = {"toy", "tiny"};
    printf("== plain decode (CPU, %d tokens after a 16-token prompt) ==\n", n);
    printf("%-6s %10s | ms/token: %7s %7s %7s %7s\n", "config", "tokens/s", "kda", "mla", "ffn", "rest");
    double plain_toy = 0;
    for (int c = 0; c < 2; c++) {
        sd_model m;
        synth(names[c], SD_MAX_LAYERS, 1.0f, 0, 0, &m);
        double split[4];
        double tps = bench_plain(&m, n, split);
        if (!c) plain_toy = tps;
        printf("%-6s %10.1f | ms/token: %7.3f %7.3f %7.3f %7.3f\n", names[c], tps, split[0], split[1], split[2], split[3]);
        if (json_out)
            printf("{\"bench\":\"cpu_plain\",\"config\":\"%s\",\"tokens_per_s\":%.2f,\"kda_ms\":%.4f,\"mla_ms\":%.4f,\"ffn_ms\":%.4f,\"rest_ms\":%.4f}\n",
                   names[c], tps, split[0], split[1], split[2], split[3]);
        sd_model_free(&m);
    }

    // The demo pair: toy target with tail scale 0.1 past layer 2, and its 2-layer draft.
    sd_model t, d;
    synth("toy", 2, 0.1f, 8, 0, &t);
    synth("toy", 2, 0.1f, 8, 2, &d);
    double split[4];
    double plain = bench_plain(&t, n, split);
    printf("\n== speculative vs plain (CPU, toy + derived draft: 2 of 8 layers, tail scale 0.1) ==\n");
    printf("plain: %.1f tokens/s (%.3f ms/token)\n", plain, 1e3 / plain);
    printf("%3s %10s %8s %10s %10s %10s %9s\n", "k", "tokens/s", "speedup", "accept", "mean_len", "round_ms", "predicted");
    for (int k = 1; k <= 8; k++) {
        spec_result r = bench_spec(&t, &d, k, n, 1);
        printf("%3d %10.1f %7.2fx %9.1f%% %10.2f %10.3f %8.2fx\n", k, r.tok_s, r.tok_s / plain, 100 * r.acceptance,
               r.mean_len, r.round_ms, r.predicted_tok_s / plain);
        if (json_out)
            printf("{\"bench\":\"cpu_spec\",\"k\":%d,\"tokens_per_s\":%.2f,\"plain_tokens_per_s\":%.2f,\"acceptance_rate\":%.4f,\"mean_accepted_length\":%.3f,\"round_ms\":%.4f,\"predicted_speedup\":%.3f}\n",
                   k, r.tok_s, plain, r.acceptance, r.mean_len, r.round_ms, r.predicted_tok_s / plain);
    }

    printf("\n== trace overhead (k = 4; best of 3 runs each) ==\n");
    double best[3] = {0};
    for (int rep = 0; rep < 3; rep++)
        for (int level = 0; level <= 2; level++) {
            double tps = bench_spec(&t, &d, 4, n, level).tok_s;
            if (tps > best[level]) best[level] = tps;
        }
    for (int level = 0; level <= 2; level++)
        printf("level %d: %8.1f tokens/s (%+.1f%% vs level 0)\n", level, best[level], 100 * (best[0] / best[level] - 1));
    if (json_out)
        printf("{\"bench\":\"cpu_trace_overhead\",\"level0\":%.2f,\"level1\":%.2f,\"level2\":%.2f}\n", best[0], best[1], best[2]);
    (void)plain_toy;
    sd_model_free(&t);
    sd_model_free(&d);
    return 0;
}
