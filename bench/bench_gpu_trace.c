// bench_gpu_trace.c — the phase trace on the GPU, drain mode against event mode (printed, never
// asserted). Toy target + the demo's derived draft, k = 4, greedy, on device 0:
//   - tokens/s at level 0, level 1, level 2 (drain: the stream is drained around every mixer and
//     FFN call of verify) and level 2 (events: CUDA events recorded there, summed after the
//     burst), best of 3 runs each, and the overhead of each against level 0;
//   - the verify sub-split of both level-2 modes as shares of verify (vkda, scan, vmla, vrest,
//     vffn), side by side: drains serialise the verify pass, events only observe it.
// usage: bench_gpu_trace [--tokens N]
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "cuda_backend.h" // sd_cuda_device_count, sd_cuda_model_upload
#include "decode.h"       // sd_synth_prompt
#include "events.h"       // sd_cuda_event_pool
#include "spec.h"
#include "synth.h"

#ifndef SPECDEC_SOURCE_DIR
#define SPECDEC_SOURCE_DIR "."
#endif

static void die(const sd_status *st) {
    fprintf(stderr, "bench_gpu_trace: %s\n", st->msg);
    exit(1);
}

static void device_model(const sd_config *cfg, const sd_synth_opts *o, sd_model *dev) {
    sd_status st = {0};
    sd_model host;
    if (sd_synth_model(&host, cfg, o, &st) || sd_cuda_model_upload(&host, dev, &st)) die(&st);
    sd_model_free(&host);
}

static void sync_model(void *m) { sd_model_sync(m); }

typedef struct { double tok_s; trace_burst tb; } result;

static void run(const sd_model *t, const sd_model *d, int n, int level, sd_cuda_event_pool *pool, result *r) {
    sd_status st = {0};
    sd_state ts, ds;
    int prompt[16], *out = malloc(sizeof(int) * (size_t)n);
    sd_synth_prompt(0, t->cfg.vocab_size, 16, prompt);
    if (sd_model_state_init(t, &ts, 16 + n + 8, 8, &st) || sd_model_state_init(d, &ds, 16 + n + 8, 8, &st)) die(&st);
    trace_burst_begin(&r->tb, level, 4, sync_model, (void *)t);
    if (pool) trace_burst_use_events(&r->tb, &pool->hooks);
    sd_spec_opts o = {.k = 4, .trace = level ? &r->tb : NULL};
    sd_accept_stats stats = {0};
    sd_model_sync((void *)t);
    uint64_t t0 = trace_now_ns();
    if (sd_spec_generate(t, &ts, d, &ds, prompt, 16, n, &o, out, &stats, &st)) die(&st);
    sd_model_sync((void *)t);
    sd_model_sync((void *)d);
    r->tok_s = n / ((trace_now_ns() - t0) * 1e-9);
    trace_burst_collect(&r->tb);
    sd_state_free(&ts);
    sd_state_free(&ds);
    free(out);
}

int main(int argc, char **argv) {
    int n = 256;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--tokens") && i + 1 < argc) n = atoi(argv[++i]);
        else { fprintf(stderr, "usage: bench_gpu_trace [--tokens N]\n"); return 2; }
    }
    if (sd_cuda_device_count() == 0) { printf("bench_gpu_trace: no CUDA device, nothing measured\n"); return 0; }
    sd_config cfg, dcfg;
    sd_status st = {0};
    if (sd_config_load(SPECDEC_SOURCE_DIR "/configs/toy.json", &cfg, &st) || sd_draft_config(&cfg, 2, &dcfg, &st)) die(&st);
    sd_synth_opts o = {.seed = 0, .dtype = SD_DT_BF16, .tail_from = 2, .tail_scale = 0.1f, .depth = cfg.num_hidden_layers};
    sd_model t, d;
    device_model(&cfg, &o, &t);
    device_model(&dcfg, &o, &d);
    sd_cuda_event_pool pool;
    if (sd_cuda_events_init(&pool, &t, 2 * TRACE_MAX_EVENT_PAIRS, &st)) die(&st);

    const char *names[4] = {"level 0", "level 1", "level 2 drain", "level 2 events"};
    static result best[4], r;
    run(&t, &d, 32, 1, NULL, &r); // warm-up: module load, first allocations
    for (int rep = 0; rep < 3; rep++)
        for (int m = 0; m < 4; m++) {
            run(&t, &d, n, m < 3 ? m : 2, m == 3 ? &pool : NULL, &r);
            if (r.tok_s > best[m].tok_s) best[m] = r;
        }
    printf("== phase trace on the GPU (toy + derived draft, k = 4, %d tokens, best of 3) ==\n", n);
    for (int m = 0; m < 4; m++)
        printf("%-15s %9.1f tokens/s  overhead vs level 0: %+6.1f%%\n", names[m], best[m].tok_s,
               100.0 * (best[0].tok_s / best[m].tok_s - 1.0));
    printf("\nverify sub-split as %% of verify:   vkda   (scan)   vmla   vrest  (vffn)   verify ms/round\n");
    for (int m = 2; m < 4; m++) {
        const trace_burst *b = &best[m].tb;
        double v = (double)b->phase_ns[TRACE_PHASE_VERIFY];
        double kda = b->bucket_ns[TRACE_BUCKET_VKDA], mla = b->bucket_ns[TRACE_BUCKET_VMLA];
        double rest = v - kda - mla > 0 ? v - kda - mla : 0;
        printf("%-32s %6.1f  (%5.1f) %6.1f  %6.1f  (%5.1f)   %.3f%s\n", names[m], 100 * kda / v,
               100 * b->bucket_ns[TRACE_BUCKET_SCAN] / v, 100 * mla / v, 100 * rest / v,
               100 * b->bucket_ns[TRACE_BUCKET_VFFN] / v, v / 1e6 / (double)b->acc.rounds,
               b->pairs_lost ? " (event pairs lost)" : "");
        char line[1024];
        trace_burst_format(b, m == 2 ? "drain" : "events", line, sizeof line);
        printf("%s", line);
    }
    sd_cuda_events_free(&pool);
    sd_model_free(&t);
    sd_model_free(&d);
    return 0;
}
