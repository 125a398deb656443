// bench_gpu_prefill.c — prefill throughput on one GPU against its floor (docs/PREFILL.md).
//   1. the ceilings, measured here (ceilings.h): the copy bandwidth (bytes read + written per second
//      of a 1 GiB device-to-device copy) and the bf16 GEMM rate (cuBLASLt, 8192^3, bf16 in, f32 out);
//   2. the config's weights synthesised ON the device (cuda_synth.h; kimi-linear-48b-a3b is ~98 GB
//      in bf16), one state holding the longest prompt;
//   3. per prompt length: a warm-up prefill (it makes the GEMM plans of the shapes it meets), then
//      --reps prefills from the empty state (sd_prefill, the last position's logits to the host),
//      host clock, the best; tokens/s = length / time;
//   4. the floor of each length: the larger of
//        bytes / copy bandwidth — every weight read once (the embedding only its rows; every expert
//          is chosen at these lengths: n·K entries over E experts, n·K ≫ E), the MLA cache rows
//          written, each KDA state read and written once;
//        FLOPs / GEMM rate — 2 per multiply-add of every matrix a token meets (its projections, its
//          K experts and the shared one, the dense FFN, the MLA absorptions dn·R and R·dv a head),
//          the causal attention's 2·Hm·(pairs)·((R + dr) + R) (the absorbed form's scores and value
//          sums), the KDA recurrence's 6·d² a head and token, and lm_head for the last position;
//      and the ratio time / floor.
// Prints a table and one JSON line per length ("bench":"gpu_prefill").
// usage: bench_gpu_prefill [--config NAME] [--lens N,N,...] [--chunk N] [--reps N] [--seed S] [--profile]
//        (NAME: a file in configs/ without .json, default kimi-linear-48b-a3b; lens default
//        512,4096,32768; chunk: the prefill's piece size, default SD_CUDA_PREFILL_CHUNK).
//        --profile: after a warm-up, one prefill of the first length between cudaProfilerStart and
//        Stop (for bench/ktrace.c and `ncu --profile-from-start off`), no timing.
#include <cuda_profiler_api.h>
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "gpu_bench.h"    // SD_BENCH_CK, SD_BENCH_OK, the ceilings
#include "cuda_backend.h" // sd_cuda_state_init, sd_cuda_device_name
#include "cuda_prefill.h" // sd_cuda_prefill_set_chunk, sd_cuda_prefill_scratch_bytes
#include "cuda_synth.h"   // sd_cuda_model_synth
#include "trace.h"        // trace_now_ns

#ifndef SPECDEC_SOURCE_DIR
#define SPECDEC_SOURCE_DIR "."
#endif

#define MAX_LENS 16

// FLOPs of one token's matrices (2 per multiply-add), without the head and the attention.
static double token_flops(const sd_config *c) {
    const double D = c->hidden_size, H = c->kda_num_heads, d = c->kda_head_dim, P = H * d;
    const double Hm = c->num_attention_heads, R = c->kv_lora_rank, dn = c->qk_nope_head_dim, dr = c->qk_rope_head_dim;
    const double dv = c->v_head_dim, E = c->num_experts, K = c->num_experts_per_token, Ie = c->moe_intermediate_size;
    const double S = c->num_shared_experts, I = c->intermediate_size;
    double f = 0;
    for (int i = 0; i < c->num_hidden_layers; i++) {
        if (c->mixer[i] == SD_MIXER_KDA)
            f += 2 * (3 * P * D + 2 * d * D + H * D + 2 * P * d + D * P) + 6 * d * d * H;
        else
            f += 2 * (Hm * (dn + dr) * D + (R + dr) * D + Hm * (dn * R + R * dv) + D * Hm * dv);
        f += sd_config_is_moe(c, i) ? 2 * (E * D + (K + S) * 3 * D * Ie) : 2 * 3 * D * I;
    }
    return f;
}

// The causal attention of n tokens from the empty sequence, every MLA layer.
static double attention_flops(const sd_config *c, double n) {
    const double Hm = c->num_attention_heads, R = c->kv_lora_rank, dr = c->qk_rope_head_dim;
    int n_mla = 0;
    for (int i = 0; i < c->num_hidden_layers; i++) n_mla += c->mixer[i] == SD_MIXER_MLA;
    return n_mla * 2 * Hm * (n * (n + 1) / 2) * ((R + dr) + R);
}

// Bytes a prefill of n tokens must move at the least.
static double floor_bytes(const sd_model *m, double n) {
    const sd_config *c = &m->cfg;
    const double D = c->hidden_size, esz = m->w.embed.dtype == SD_DT_BF16 ? 2 : 4;
    const double embed = (double)c->vocab_size * D * esz;
    double b = (double)m->w.arena_bytes - (c->tie_word_embeddings ? 0 : embed) + n * D * esz;
    for (int i = 0; i < c->num_hidden_layers; i++)
        b += c->mixer[i] == SD_MIXER_MLA ? n * (c->kv_lora_rank + c->qk_rope_head_dim) * 4.0
                                         : 2.0 * c->kda_num_heads * c->kda_head_dim * c->kda_head_dim * 4;
    return b;
}

static int parse_lens(const char *s, int *lens) {
    int n = 0;
    for (const char *p = s; *p && n < MAX_LENS;) {
        char *end;
        const long v = strtol(p, &end, 10);
        if (end == p || v < 1 || v > (1 << 20)) return -1;
        lens[n++] = (int)v;
        p = *end == ',' ? end + 1 : end;
        if (*end && *end != ',') return -1;
    }
    return n;
}

const char *sd_bench_prog = "bench_gpu_prefill";

int main(int argc, char **argv) {
    const char *name = "kimi-linear-48b-a3b", *lens_s = "512,4096,32768";
    int chunk = 0, reps = 2, profile = 0;
    unsigned long long seed = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help")) {
            printf("usage: bench_gpu_prefill [--config NAME] [--lens N,N,...] [--chunk N] [--reps N] [--seed S] [--profile]\n");
            return 0;
        }
        if (!strcmp(a, "--profile")) { profile = 1; continue; }
        if (!v) { fprintf(stderr, "bench_gpu_prefill: %s needs a value (see --help)\n", a); return 2; }
        if (!strcmp(a, "--config")) name = v;
        else if (!strcmp(a, "--lens")) lens_s = v;
        else if (!strcmp(a, "--chunk")) chunk = atoi(v);
        else if (!strcmp(a, "--reps")) reps = atoi(v);
        else if (!strcmp(a, "--seed")) seed = strtoull(v, NULL, 10);
        else { fprintf(stderr, "bench_gpu_prefill: unknown option '%s' (see --help)\n", a); return 2; }
        i++;
    }
    int lens[MAX_LENS];
    const int n_lens = parse_lens(lens_s, lens);
    if (n_lens < 1 || reps < 1 || chunk < 0) { fprintf(stderr, "bench_gpu_prefill: bad --lens, --reps or --chunk\n"); return 2; }
    int max_len = 0;
    for (int i = 0; i < n_lens; i++) max_len = lens[i] > max_len ? lens[i] : max_len;
    int n_dev = 0;
    if (cudaGetDeviceCount(&n_dev) != cudaSuccess || n_dev < 1) { fprintf(stderr, "bench_gpu_prefill: no CUDA device\n"); return 1; }

    char dev_name[256];
    SD_BENCH_OK(sd_cuda_device_name(0, dev_name, sizeof dev_name, &st_));
    const double copy_gbs = sd_bench_copy_gbs((size_t)1 << 30, 10), gemm_tflops = sd_bench_gemm_tflops(8192, 10);
    printf("bench_gpu_prefill on %s: copy %.0f GB/s (read + written), bf16 GEMM %.0f TFLOP/s (cuBLASLt 8192^3)\n", dev_name,
           copy_gbs, gemm_tflops);

    char path[4096];
    const char *src = getenv("SPECDEC_SOURCE_DIR");
    snprintf(path, sizeof path, "%s/configs/%s.json", src ? src : SPECDEC_SOURCE_DIR, name);
    sd_config cfg;
    SD_BENCH_OK(sd_config_load(path, &cfg, &st_));
    const sd_synth_opts so = {.seed = seed, .dtype = SD_DT_BF16, .tail_from = SD_MAX_LAYERS, .tail_scale = 1.0f};
    sd_model dev;
    uint64_t t0 = trace_now_ns();
    SD_BENCH_OK(sd_cuda_model_synth(&cfg, &so, 0, &dev, &st_));
    const double synth_ms = (double)(trace_now_ns() - t0) * 1e-6;
    if (chunk) SD_BENCH_OK(sd_cuda_prefill_set_chunk(&dev, chunk, &st_));
    sd_state s;
    SD_BENCH_OK(sd_cuda_state_init(&s, &dev, max_len + 1, 16, &st_));
    int *tokens = malloc(sizeof(int) * (size_t)max_len);
    for (int i = 0; i < max_len; i++) tokens[i] = (int)(((uint64_t)i * 2654435761u + seed) % (uint64_t)cfg.vocab_size);
    float *logits = malloc(sizeof(float) * (size_t)cfg.vocab_size);

    if (profile) { // one prefill of the first length, warm, inside the profiled region
        for (int r = 0; r < 2; r++) {
            sd_state_reset(&s);
            if (r) SD_BENCH_CK(cudaProfilerStart());
            SD_BENCH_OK(sd_prefill(&dev, &s, tokens, lens[0], logits, &st_));
            if (r) SD_BENCH_CK(cudaProfilerStop());
        }
        printf("%s: one prefill of %d tokens profiled\n", name, lens[0]);
        free(tokens);
        free(logits);
        sd_state_free(&s);
        sd_model_free(&dev);
        return 0;
    }
    const double tf = token_flops(&cfg);
    printf("%s: %.2f GB of bf16 weights synthesised on the device in %.0f ms; %.2f GFLOP a token in its matrices\n", name,
           dev.w.arena_bytes / 1e9, synth_ms, tf / 1e9);
    printf("%8s %10s %10s %10s %10s %10s %8s\n", "tokens", "ms", "tokens/s", "floor_ms", "bytes_ms", "flops_ms", "x_floor");
    for (int li = 0; li < n_lens; li++) {
        const int n = lens[li];
        double best = 1e30;
        for (int r = -1; r < reps; r++) { // r = -1: the warm-up
            sd_state_reset(&s);
            t0 = trace_now_ns();
            SD_BENCH_OK(sd_prefill(&dev, &s, tokens, n, logits, &st_));
            const double ms = (double)(trace_now_ns() - t0) * 1e-6;
            if (r >= 0 && ms < best) best = ms;
        }
        const double flops = tf * n + attention_flops(&cfg, n) + 2.0 * cfg.vocab_size * cfg.hidden_size;
        const double bytes = floor_bytes(&dev, n);
        const double bytes_ms = bytes / (copy_gbs * 1e9) * 1e3, flops_ms = flops / (gemm_tflops * 1e12) * 1e3;
        const double floor_ms = bytes_ms > flops_ms ? bytes_ms : flops_ms;
        printf("%8d %10.1f %10.0f %10.1f %10.1f %10.1f %8.2f\n", n, best, n / best * 1e3, floor_ms, bytes_ms, flops_ms,
               best / floor_ms);
        printf("{\"bench\":\"gpu_prefill\",\"config\":\"%s\",\"device\":\"%s\",\"tokens\":%d,\"ms\":%.3f,\"tokens_per_s\":%.1f,"
               "\"floor_ms\":%.3f,\"bytes\":%.0f,\"flops\":%.0f,\"copy_gbs\":%.1f,\"gemm_tflops\":%.1f,\"x_floor\":%.3f,"
               "\"chunk\":%d,\"scratch_bytes\":%zu}\n",
               name, dev_name, n, best, n / best * 1e3, floor_ms, bytes, flops, copy_gbs, gemm_tflops, best / floor_ms,
               chunk ? chunk : SD_CUDA_PREFILL_CHUNK, sd_cuda_prefill_scratch_bytes(&dev));
        fflush(stdout);
    }
    free(tokens);
    free(logits);
    sd_state_free(&s);
    sd_model_free(&dev);
    return 0;
}
