// grouped_lab.cu — the grouped expert GEMM (kernels/moe_grouped.cuh) at Kimi-Linear's prefill
// shape in several tilings: the routed experts' [gate | up] and down GEMMs of a 4096-token piece
// (256 experts of 2304 × 1024, 8 a token, the rows grouped by expert from a random routing), each
// tiling checked against a float64 dot of sampled outputs (and its bits compared with the first,
// the product's), then timed (median of --reps launches) and printed as ms and TFLOP/s, with one
// JSON line each.
//
// usage: grouped_lab [--tokens N] [--reps N] [--seed S]
#include <cuda_bf16.h>
#include <math.h>
#include <stdint.h>
#include <string.h>
#include <vector>
#include "lab.cuh"
#include "moe_grouped.cuh"

enum { E = 256, K_SEL = 8, D = 2304, IE = 1024 };

static uint64_t rng_state;
static uint32_t rnd() { // xorshift64*
    rng_state ^= rng_state >> 12, rng_state ^= rng_state << 25, rng_state ^= rng_state >> 27;
    return (uint32_t)((rng_state * 0x2545F4914F6CDD1DULL) >> 32);
}
static uint16_t rnd_bf16(float scale) {
    const float v = ((rnd() >> 8) * (1.0f / 16777216.0f) * 2.0f - 1.0f) * scale;
    uint32_t u;
    memcpy(&u, &v, 4);
    return (uint16_t)(u >> 16);
}
static double bf16_to_double(uint16_t h) {
    const uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

typedef cudaError_t (*launch_fn)(int, const sd_cuda_expert *, const int *, const int *, int, const __nv_bfloat16 *, int, int,
                                 int, float *, cudaStream_t);
typedef struct {
    const char *name;
    int bm;
    launch_fn launch;
} shape;
#define SHAPE(BM, BN, BK, WM, WN, S) \
    {#BM "x" #BN " k" #BK " " #WM "x" #WN "w s" #S, BM, sd_grouped_gemm_launch<BM, BN, BK, WM, WN, S>}
static const shape shapes[] = {
    SHAPE(128, 128, 64, 4, 2, 3), // the product's (moe_grouped.cu)
    SHAPE(128, 128, 64, 2, 2, 3), SHAPE(128, 128, 32, 2, 2, 4), SHAPE(128, 256, 64, 2, 4, 3), SHAPE(128, 256, 32, 4, 4, 4),
    SHAPE(64, 128, 64, 2, 2, 4),  SHAPE(64, 128, 32, 2, 2, 3),
};

int main(int argc, char **argv) {
    int tokens = 4096, reps = 20;
    unsigned long long seed = 7;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            printf("usage: grouped_lab [--tokens N] [--reps N] [--seed S]\n");
            return 0;
        }
        if (i + 1 >= argc) { fprintf(stderr, "grouped_lab: %s needs a value\n", argv[i]); return 2; }
        const char *a = argv[i], *v = argv[++i];
        char *end;
        const long n = strtol(v, &end, 10);
        if (*end || n < 1) { fprintf(stderr, "grouped_lab: %s %s is not a positive integer\n", a, v); return 2; }
        if (!strcmp(a, "--tokens")) tokens = (int)n;
        else if (!strcmp(a, "--reps")) reps = (int)n;
        else if (!strcmp(a, "--seed")) seed = (unsigned long long)n;
        else { fprintf(stderr, "grouped_lab: unknown option %s (--help)\n", a); return 2; }
    }
    rng_state = seed * 0x9E3779B97F4A7C15ULL + 1;

    // A routing: K_SEL distinct experts a token; the counts, and the rows (one per entry).
    std::vector<int> counts(E, 0);
    for (int t = 0; t < tokens; t++) {
        int chosen[K_SEL];
        for (int j = 0; j < K_SEL; j++) {
            int e, dup;
            do {
                e = (int)(rnd() % E), dup = 0;
                for (int q = 0; q < j; q++) dup |= chosen[q] == e;
            } while (dup);
            chosen[j] = e;
            counts[e]++;
        }
    }
    const int rows = tokens * K_SEL;
    std::vector<uint16_t> hx((size_t)rows * D), hh((size_t)rows * IE);
    for (auto &v : hx) v = rnd_bf16(1.0f);
    for (auto &v : hh) v = rnd_bf16(1.0f);
    const size_t up_elems = (size_t)IE * D; // gate and up each; down the same count
    std::vector<uint16_t> hw(up_elems * 3 * E);
    for (auto &v : hw) v = rnd_bf16(0.02f);

    cudaStream_t q;
    CK(cudaStreamCreate(&q));
    uint16_t *dw, *dx, *dh;
    float *dy, *dref;
    int *dcounts, *doff, *dtiles, *dn;
    CK(cudaMalloc(&dw, hw.size() * 2));
    CK(cudaMalloc(&dx, hx.size() * 2));
    CK(cudaMalloc(&dh, hh.size() * 2));
    const size_t ymax = (size_t)rows * (2 * IE > D ? 2 * IE : D);
    CK(cudaMalloc(&dy, ymax * 4));
    CK(cudaMalloc(&dref, ymax * 4));
    const int max_tiles = rows / 64 + E + 1;
    CK(cudaMalloc(&dcounts, E * 4));
    CK(cudaMalloc(&doff, E * 4));
    CK(cudaMalloc(&dtiles, (size_t)max_tiles * 3 * 4));
    CK(cudaMalloc(&dn, 4));
    CK(cudaMemcpy(dw, hw.data(), hw.size() * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dx, hx.data(), hx.size() * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dh, hh.data(), hh.size() * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dcounts, counts.data(), E * 4, cudaMemcpyHostToDevice));
    std::vector<sd_cuda_expert> table(E);
    for (int e = 0; e < E; e++) {
        const uint16_t *base = dw + up_elems * 3 * e;
        table[e] = sd_cuda_expert{base, base + up_elems, base + 2 * up_elems, 1, 1, 1};
    }
    sd_cuda_expert *dtable;
    CK(cudaMalloc(&dtable, E * sizeof(sd_cuda_expert)));
    CK(cudaMemcpy(dtable, table.data(), E * sizeof(sd_cuda_expert), cudaMemcpyHostToDevice));
    std::vector<int> offsets(E);
    for (int e = 0, acc = 0; e < E; acc += counts[e], e++) offsets[e] = acc;
    int cmin = rows, cmax = 0;
    for (int c : counts) cmin = c < cmin ? c : cmin, cmax = c > cmax ? c : cmax;

    char dev_name[256] = "?";
    cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, 0) == cudaSuccess) snprintf(dev_name, sizeof dev_name, "%s", prop.name);
    printf("grouped_lab on %s: %d tokens × %d experts = %d rows over %d experts (%d .. %d rows an expert)\n", dev_name,
           tokens, K_SEL, rows, E, cmin, cmax);
    printf("%-26s %-5s %9s %9s %10s %s\n", "tiling", "op", "ms", "TFLOP/s", "max_rel", "bits vs first");
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    int failed = 0;
    for (int op = 0; op < 2; op++) {
        const int N = op == SD_MOE_GROUPED_UP ? 2 * IE : D, Kd = op == SD_MOE_GROUPED_UP ? D : IE;
        const uint16_t *xin = op == SD_MOE_GROUPED_UP ? dx : dh;
        const std::vector<uint16_t> &hin = op == SD_MOE_GROUPED_UP ? hx : hh;
        const double flops = 2.0 * rows * N * Kd;
        std::vector<float> got((size_t)rows * N);
        for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
            const shape &sh = shapes[si];
            if (sh.bm == 64) sd_grouped_tiles_kernel<64><<<1, 32, 0, q>>>(dcounts, E, doff, dtiles, dn);
            else sd_grouped_tiles_kernel<128><<<1, 32, 0, q>>>(dcounts, E, doff, dtiles, dn);
            CK(cudaGetLastError());
            const int tiles_cap = rows / sh.bm + E;
            float *out = si == 0 ? dref : dy;
            CK(cudaMemsetAsync(out, 0xff, (size_t)rows * N * 4, q)); // NaN: a row never written shows
            CK(sh.launch(op, dtable, dtiles, dn, tiles_cap, (const __nv_bfloat16 *)xin, N, Kd, IE, out, q));
            CK(cudaStreamSynchronize(q));
            CK(cudaMemcpy(got.data(), out, got.size() * 4, cudaMemcpyDeviceToHost));
            // 256 sampled outputs against a float64 dot of the same bf16 inputs.
            double max_rel = 0;
            for (int smp = 0; smp < 256; smp++) {
                const int r = (int)(rnd() % rows), n = (int)(rnd() % N);
                int e = 0;
                while (e + 1 < E && offsets[e + 1] <= r) e++;
                const uint16_t *w = hw.data() + up_elems * 3 * e +
                                    (op == SD_MOE_GROUPED_DOWN ? 2 * up_elems + (size_t)n * Kd
                                     : n < IE                  ? (size_t)n * Kd
                                                               : up_elems + (size_t)(n - IE) * Kd);
                double ref = 0, mag = 0;
                for (int k = 0; k < Kd; k++) {
                    const double p = bf16_to_double(hin[(size_t)r * Kd + k]) * bf16_to_double(w[k]);
                    ref += p, mag += fabs(p);
                }
                const double g = got[(size_t)r * N + n], rel = fabs(g - ref) / (mag > 0 ? mag : 1);
                if (!(rel <= max_rel)) max_rel = rel; // NaN sticks
            }
            long long differ = -1;
            if (si > 0) {
                std::vector<float> ref_out(got.size());
                CK(cudaMemcpy(ref_out.data(), dref, got.size() * 4, cudaMemcpyDeviceToHost));
                differ = 0;
                for (size_t i = 0; i < got.size(); i++) differ += memcmp(&got[i], &ref_out[i], 4) != 0;
            }
            const bool ok = max_rel <= 1e-4; // the bits are reported, not required
            failed |= !ok;
            std::vector<float> ms;
            for (int r = 0; r < reps; r++) {
                CK(cudaEventRecord(e0, q));
                CK(sh.launch(op, dtable, dtiles, dn, tiles_cap, (const __nv_bfloat16 *)xin, N, Kd, IE, out, q));
                CK(cudaEventRecord(e1, q));
                CK(cudaEventSynchronize(e1));
                float t;
                CK(cudaEventElapsedTime(&t, e0, e1));
                ms.push_back(t);
            }
            const double med = median(ms);
            char bits[64];
            if (differ < 0) snprintf(bits, sizeof bits, "(the reference)");
            else snprintf(bits, sizeof bits, "%lld differ", differ);
            printf("%-26s %-5s %9.3f %9.1f %10.2e %s%s\n", sh.name, op == SD_MOE_GROUPED_UP ? "up" : "down", med,
                   flops / med / 1e9, max_rel, bits, ok ? "" : "  FAIL");
            printf("{\"bench\":\"grouped_lab\",\"device\":\"%s\",\"tiling\":\"%s\",\"op\":\"%s\",\"tokens\":%d,\"rows\":%d,"
                   "\"ms\":%.4f,\"tflops\":%.2f,\"max_rel\":%.3g,\"bits_differ\":%lld,\"ok\":%s}\n",
                   dev_name, sh.name, op == SD_MOE_GROUPED_UP ? "up" : "down", tokens, rows, med, flops / med / 1e9, max_rel,
                   differ, ok ? "true" : "false");
        }
    }
    printf(failed ? "grouped_lab: FAIL\n" : "grouped_lab: PASS\n");
    return failed ? 1 : 0;
}
