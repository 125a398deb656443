// moe_experts.c — the op table's MoE expert cases (kernels/moe_experts.h): sd_cuda_moe_up and
// sd_cuda_moe_down, routed and shared experts with the combine, against the CPU twin; the device
// table arm ≡ the eager arm, bitwise.
#include "op_cases.h"
#include "layers.h"      // sd_ffn_forward, sd_ffn_weights (CPU)
#include "linear.h"      // sd_cuda_linear_multi
#include "moe_experts.h" // sd_cuda_moe_up, sd_cuda_moe_down, sd_cuda_moe_args, sd_cuda_expert
#include "moe_route.h"   // sd_cuda_moe_groups_ints, sd_cuda_moe_groups_host

// A random expert table, selection and grouping (host and device), shared by both arms.
typedef struct {
    int E, K, D, Ie, S, T, acc;
    tmat *gate, *up, *down;  // E experts: (Ie, D), (Ie, D), (D, Ie)
    tmat sg, su, sdn;        // the shared expert (S > 0): (S·Ie, D), (S·Ie, D), (D, S·Ie)
    float *x, *w, *out0;     // (T, D) input, (T, K) routing weights, (T, D) what out holds before
    int *sel, *groups;       // (T, K); the grouping of sel (sd_cuda_moe_groups_host)
    int held_first, held_count; // the experts held (a tensor-parallel rank's); the others' table entries NULL
    sd_cuda_expert *table;   // device: the E experts' matrices
    gbuf dx, dw, dsel, dgroups;
} moe_fix;

static bool fix_holds(const moe_fix *f, int e) { return e >= f->held_first && e < f->held_first + f->held_count; }
typedef struct { float *out, *exp_out, *hs; } moe_res;

// The CPU twin of the block's experts and combine (MODEL.md "MoE"; engine/cpu/moe.c's order, whose
// routing is not separable from sd_moe_forward): out[t] = Σ_j w[t][j]·expert_{sel[t][j]}(x_t)
// (j increasing) + shared(x_t), each expert sd_ffn_forward; with accumulate, out0[t] + that.
static void moe_twin(const moe_fix *f, float *out) {
    const int D = f->D, wide = f->S > 1 ? f->S * f->Ie : f->Ie;
    float *y = xmalloc(sizeof(float) * D), *h1 = xmalloc(sizeof(float) * wide), *h2 = xmalloc(sizeof(float) * wide);
    for (int t = 0; t < f->T; t++) {
        const float *xt = f->x + (size_t)t * D;
        float *o = out + (size_t)t * D;
        for (int i = 0; i < D; i++) o[i] = 0.0f;
        for (int j = 0; j < f->K; j++) {
            const int e = f->sel[t * f->K + j];
            if (!fix_holds(f, e)) continue; // another rank's (engine/cpu/moe.c)
            const sd_ffn_weights ex = {f->gate[e].host, f->up[e].host, f->down[e].host};
            sd_ffn_forward(&ex, xt, 1, y, h1, h2);
            for (int i = 0; i < D; i++) o[i] += f->w[t * f->K + j] * y[i];
        }
        if (f->S) {
            const sd_ffn_weights sh = {f->sg.host, f->su.host, f->sdn.host};
            sd_ffn_forward(&sh, xt, 1, y, h1, h2);
            for (int i = 0; i < D; i++) o[i] += y[i];
        }
        if (f->acc)
            for (int i = 0; i < D; i++) o[i] = f->out0[(size_t)t * D + i] + o[i];
    }
    free(y); free(h1); free(h2);
}

// One arm of engine/cuda/moe_block.c on the fixture. The shared expert's activations ride in the up
// launch at T <= 2 and come from a SwiGLU Linear job before it from three tokens up (the router's
// launch, there). Device table: one up over every group (with the shared expert) and one down with
// the combine, with the readiness counters at T <= 2; eager: per group an up and a down, then the
// shared expert's up and the combine-only down. Row tickets back to zero; the readiness counters as
// the counted launches leave them.
static moe_res moe_on_device(const moe_fix *f, bool table_arm) {
    const int T = f->T, K = f->K, E = f->E, D = f->D, n_ent = T * K, gc = n_ent < E ? n_ent : E;
    const bool shared = f->S > 0, in_up = shared && T <= 2;
    const int ld_hs = shared ? f->S * f->Ie : 1;
    gbuf dh = gbuf_new((size_t)n_ent * f->Ie), dexp = gbuf_new((size_t)n_ent * D), dhs = gbuf_new((size_t)T * ld_hs);
    gbuf dso = gbuf_new((size_t)T * D), dout = gbuf_of(f->out0, (size_t)T * D), dtick = gbuf_zero(D), dready = gbuf_zero((size_t)E + 2);
    if (shared && !in_up) {
        const sd_lin_job j = {.w = &f->sg.dev, .w2 = &f->su.dev, .x = f->dx.p, .ldx = D, .y = dhs.p, .ldy = ld_hs, .mode = SD_LIN_SWIGLU};
        OK(sd_cuda_linear_multi(&j, 1, T, 0, &st_));
    }
    sd_cuda_moe_args a = {.table = f->table, .groups = IP(f->dgroups), .T = T, .K = K, .E = E, .D = D, .Ie = f->Ie,
                          .x = f->dx.p, .w = f->dw.p, .sel = IP(f->dsel), .held_first = f->held_first,
                          .held_count = f->held_count, .h = dh.p, .exp_out = dexp.p, .shared_down = shared ? &f->sdn.dev : NULL,
                          .shared_gate = in_up ? &f->sg.dev : NULL, .shared_up = in_up ? &f->su.dev : NULL, .hs = dhs.p,
                          .ld_hs = shared ? ld_hs : 0, .shared_out = dso.p, .out = dout.p, .accumulate = f->acc,
                          .tickets = IP(dtick)};
    const bool counted = table_arm && T <= 2;
    if (table_arm) {
        if (counted) a.ready = IP(dready);
        OK(sd_cuda_moe_up(&a, 0, gc, 0, n_ent, true, 0, &st_));
        OK(sd_cuda_moe_down(&a, 0, n_ent, true, 0, &st_));
    } else {
        const int *gstart = f->groups + 1 + gc;
        for (int g = 0; g < f->groups[0]; g++) {
            if (!fix_holds(f, f->groups[1 + g])) continue; // moe_block.c: another rank's expert
            OK(sd_cuda_moe_up(&a, g, g + 1, gstart[g], gstart[g + 1], false, 0, &st_));
            OK(sd_cuda_moe_down(&a, gstart[g], gstart[g + 1], false, 0, &st_));
        }
        OK(sd_cuda_moe_up(&a, 0, 0, 0, 0, true, 0, &st_));
        OK(sd_cuda_moe_down(&a, 0, 0, true, 0, &st_));
    }
    CU(cudaDeviceSynchronize());
    const char *arm = table_arm ? "device table" : "eager";
    int *tick = gbuf_read(&dtick, D), *ready = gbuf_read(&dready, (size_t)E + 2), *zeros = calloc((size_t)D + E + 2, sizeof(int));
    same_bits(fmt("%s: row tickets back to zero", arm), tick, zeros, D);
    if (counted) { // each selected expert's up blocks, the same number for each; the shared expert's; the down blocks
        int per_expert = -1;
        for (int e = 0; e < E; e++) {
            bool chosen = false;
            for (int i = 0; i < n_ent; i++) chosen |= f->sel[i] == e && fix_holds(f, e);
            if (!chosen) {
                cr_assert_eq(ready[e], 0, "%s: expert %d (not selected) counted %d", LABEL, e, ready[e]);
                continue;
            }
            if (per_expert < 0) per_expert = ready[e];
            cr_assert(ready[e] == per_expert && ready[e] > 0, "%s: expert %d counted %d, another %d", LABEL, e, ready[e], per_expert);
        }
        cr_assert(shared ? ready[E] > 0 : ready[E] == 0, "%s: the shared expert counted %d", LABEL, ready[E]);
        cr_assert(ready[E + 1] > 0, "%s: the down launch counted %d blocks", LABEL, ready[E + 1]);
    } else {
        same_bits(fmt("%s: readiness counters untouched", arm), ready, zeros, (size_t)E + 2);
    }
    moe_res r = {gbuf_read(&dout, (size_t)T * D), gbuf_read(&dexp, (size_t)n_ent * D), gbuf_read(&dhs, (size_t)T * ld_hs)};
    gbuf *all[] = {&dh, &dexp, &dhs, &dso, &dout, &dtick, &dready};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) gbuf_done(all[i], fmt("%s moe buffer", arm));
    free(tick); free(ready); free(zeros);
    return r;
}

// shape: E, K, D, Ie, S (the shared expert's width in Ie; 0: none), T, accumulate, held (0: every
// expert; 1: a tensor-parallel rank's middle third, the others' table entries NULL — never read).
// Both arms over the same random table, selection and grouping: bitwise equal (out, exp_out of the
// held experts' entries, the shared activations), and the device table's out vs the twin.
void run_moe_experts(const op_case *c) {
    moe_fix f = {.E = c->shape[0], .K = c->shape[1], .D = c->shape[2], .Ie = c->shape[3], .S = c->shape[4], .T = c->shape[5],
                 .acc = c->shape[6]};
    f.held_first = c->shape[7] ? f.E / 3 : 0;
    f.held_count = c->shape[7] ? f.E / 3 + 1 : f.E;
    const int E = f.E, K = f.K, D = f.D, T = f.T, Ie = f.Ie;
    f.gate = xmalloc(sizeof(tmat) * E);
    f.up = xmalloc(sizeof(tmat) * E);
    f.down = xmalloc(sizeof(tmat) * E);
    sd_cuda_expert *table = xmalloc(sizeof(sd_cuda_expert) * E);
    const int bf = c->dt == SD_DT_BF16;
    for (int e = 0; e < E; e++) {
        f.gate[e] = tmat_rand(Ie, D, c->dt, seed_of(3 * e));
        f.up[e] = tmat_rand(Ie, D, c->dt, seed_of(3 * e + 1));
        f.down[e] = tmat_rand(D, Ie, c->dt, seed_of(3 * e + 2));
        table[e] = fix_holds(&f, e) ? (sd_cuda_expert){f.gate[e].dev.data, f.up[e].dev.data, f.down[e].dev.data, bf, bf, bf}
                                    : (sd_cuda_expert){0};
    }
    CU(cudaMalloc((void **)&f.table, sizeof(sd_cuda_expert) * E));
    CU(cudaMemcpy(f.table, table, sizeof(sd_cuda_expert) * E, cudaMemcpyHostToDevice));
    if (f.S) {
        f.sg = tmat_rand(f.S * Ie, D, c->dt, seed_of(1000));
        f.su = tmat_rand(f.S * Ie, D, c->dt, seed_of(1001));
        f.sdn = tmat_rand(D, f.S * Ie, c->dt, seed_of(1002));
    }
    f.x = rand_host((size_t)T * D, seed_of(1003), 1.0f);
    f.w = rand_in((size_t)T * K, seed_of(1004), 0.05f, 0.6f);
    f.out0 = rand_host((size_t)T * D, seed_of(1005), 1.0f); // the residual stream (accumulate) or junk (overwritten)
    f.sel = xmalloc(sizeof(int) * T * K);
    uint64_t r = seed_of(1006);
    int *perm = xmalloc(sizeof(int) * E);
    for (int t = 0; t < T; t++) { // K distinct experts a token, in a random order
        for (int e = 0; e < E; e++) perm[e] = e;
        for (int j = 0; j < K; j++) {
            const int i = j + rng_int(&r, E - j), s = perm[i];
            perm[i] = perm[j];
            perm[j] = s;
            f.sel[t * K + j] = s;
        }
    }
    const size_t n_int = sd_cuda_moe_groups_ints(T, K, E);
    f.groups = xmalloc(sizeof(int) * n_int);
    sd_cuda_moe_groups_host(f.sel, T, K, E, f.groups);
    f.dx = gbuf_of(f.x, (size_t)T * D);
    f.dw = gbuf_of(f.w, (size_t)T * K);
    f.dsel = gbuf_of(f.sel, (size_t)T * K);
    f.dgroups = gbuf_of(f.groups, n_int);
    float *ref = xmalloc(sizeof(float) * T * D);
    moe_twin(&f, ref);
    moe_res table_arm = moe_on_device(&f, true), eager = moe_on_device(&f, false);
    compare(c, "out (device table)", table_arm.out, ref, (size_t)T * D);
    same_bits("out: eager vs device table", eager.out, table_arm.out, (size_t)T * D);
    for (int i = 0; i < T * K; i++) // the entries of experts held (the others' rows are never written)
        if (fix_holds(&f, f.sel[i]))
            same_bits(fmt("routed expert output of entry %d: eager vs device table", i), eager.exp_out + (size_t)i * D,
                      table_arm.exp_out + (size_t)i * D, (size_t)D);
    if (f.S) same_bits("shared activations: eager vs device table", eager.hs, table_arm.hs, (size_t)T * f.S * Ie);
    gbuf_done(&f.dx, "x");
    gbuf_done(&f.dw, "w");
    gbuf_done(&f.dsel, "sel");
    gbuf_done(&f.dgroups, "grouping");
    CU(cudaFree(f.table));
    for (int e = 0; e < E; e++) { tmat_free(&f.gate[e]); tmat_free(&f.up[e]); tmat_free(&f.down[e]); }
    if (f.S) { tmat_free(&f.sg); tmat_free(&f.su); tmat_free(&f.sdn); }
    moe_res *res[2] = {&table_arm, &eager};
    for (int i = 0; i < 2; i++) { free(res[i]->out); free(res[i]->exp_out); free(res[i]->hs); }
    free(f.gate); free(f.up); free(f.down); free(table); free(f.x); free(f.w); free(f.out0); free(f.sel); free(perm);
    free(f.groups); free(ref);
}
