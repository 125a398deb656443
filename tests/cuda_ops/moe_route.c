// moe_route.c — the op table's MoE routing cases (kernels/moe_route.h): sd_cuda_moe_select against
// the CPU route and grouping, and the one-token sd_cuda_moe_route_select ≡ the launches it replaces.
#include "op_cases.h"
#include "layers.h"    // sd_moe_route, sd_moe_weights (CPU)
#include "linear.h"    // sd_cuda_linear_multi, sd_cuda_linear_multi_norm
#include "moe_route.h" // sd_cuda_moe_select, sd_cuda_moe_route_select, the grouping

// shape: E, K, G, topk_group, T, tie. The selection from router logits (the walk's path from two
// tokens up) against the CPU route of the same logits (an identity router: each score is its logit
// exactly), its grouping against sd_cuda_moe_groups_host, bitwise; the weights within the case's
// tolerance; the readiness counters zeroed. Shapes take the one-block rank kernel with and without
// the warp sort and the warp-per-token kernel; with tie every token's scores tie — K-1 experts at
// one value, two more at a lower one across the K-th place, bias 0 — so the lower index must win.
void run_moe_select(const op_case *c) {
    const int E = c->shape[0], K = c->shape[1], G = c->shape[2], topk = c->shape[3], T = c->shape[4], tie = c->shape[5];
    sd_config cfg = {.hidden_size = E, .num_experts = E, .num_experts_per_token = K, .num_expert_group = G,
                     .topk_group = topk, .moe_renormalize = true, .routed_scaling_factor = 2.446f};
    float *logits = rand_host((size_t)T * E, seed_of(0), 2.0f), *bias = rand_host(E, seed_of(1), 0.1f);
    float *eye = calloc((size_t)E * E, sizeof(float));
    for (int e = 0; e < E; e++) eye[(size_t)e * E + e] = 1.0f;
    if (tie) {
        memset(bias, 0, sizeof(float) * E);
        for (int t = 0; t < T; t++) {
            float *l = logits + (size_t)t * E;
            for (int j = 0; j < K - 1; j++) l[(size_t)(E - 1 - 3 * j - t) % E] = 6.0f; // E a power of two
            l[1 + t] = 5.0f; // ties l[E - 2 - t] for the K-th place: the lower index wins
            l[E - 2 - t] = 5.0f;
        }
    }
    sd_moe_weights mw = {.router = eye, .bias = bias};
    int *sel = xmalloc(sizeof(int) * T * K);
    float *w = xmalloc(sizeof(float) * T * K);
    for (int t = 0; t < T; t++) sd_moe_route(&mw, &cfg, logits + (size_t)t * E, sel + t * K, w + t * K);
    const size_t n_int = sd_cuda_moe_groups_ints(T, K, E);
    int *groups = xmalloc(sizeof(int) * n_int);
    sd_cuda_moe_groups_host(sel, T, K, E, groups);
    gbuf dl = gbuf_of(logits, (size_t)T * E), db = gbuf_of(bias, E), dsel = gbuf_new((size_t)T * K), dw = gbuf_new((size_t)T * K);
    gbuf dg = gbuf_new(n_int), dready = gbuf_new((size_t)E + 2);
    CU(cudaMemset(dready.p, 0x7f, sizeof(int) * (E + 2)));
    OK(sd_cuda_moe_select(dl.p, db.p, T, E, K, G, topk, true, 2.446f, IP(dsel), dw.p, IP(dg), IP(dready), 0, &st_));
    int *ready = gbuf_read(&dready, (size_t)E + 2), *zeros = calloc((size_t)E + 2, sizeof(int));
    same_bits("readiness counters zeroed", ready, zeros, (size_t)E + 2);
    int *sel_got = gbuf_read(&dsel, (size_t)T * K), *g_got = gbuf_read(&dg, n_int);
    float *w_got = gbuf_read(&dw, (size_t)T * K);
    same_bits("sel", sel_got, sel, (size_t)T * K);
    // The grouping's used part: the count, each group's expert, the ng + 1 starts, every entry.
    const int gc = T * K < E ? T * K : E, ng = groups[0];
    same_bits("number of groups", g_got, groups, 1);
    same_bits("group experts", g_got + 1, groups + 1, ng);
    same_bits("group starts", g_got + 1 + gc, groups + 1 + gc, (size_t)ng + 1);
    same_bits("grouped entries", g_got + 2 + 2 * gc, groups + 2 + 2 * gc, n_int - 2 - 2 * (size_t)gc);
    compare(c, "weights", w_got, w, (size_t)T * K);
    gbuf *all[] = {&dl, &db, &dsel, &dw, &dg, &dready};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) gbuf_done(all[i], "select buffer");
    free(logits); free(bias); free(eye); free(sel); free(w); free(groups); free(ready); free(zeros);
    free(sel_got); free(g_got); free(w_got);
}

// shape: E, K, D, norm. The one-token route + select launch (the walk's path at T = 1) bitwise
// against the two launches it replaces — the router Linear (its norm fused, or x as is) and
// sd_cuda_moe_select: logits, the normed row, sel, w and the grouping; twice, so the ticket's
// return to zero is exercised; the readiness counters zeroed each time.
void run_moe_route_select(const op_case *c) {
    const int E = c->shape[0], K = c->shape[1], D = c->shape[2], norm_on = c->shape[3];
    cr_assert(sd_cuda_moe_route_select_fits(1, E, D, 1), "%s: the shape fits the one launch", LABEL);
    float *x = rand_host(D, seed_of(0), 1.5f), *nw = rand_host(D, seed_of(1), 1.0f), *bias = rand_host(E, seed_of(2), 0.1f);
    tmat router = tmat_rand(E, D, SD_DT_F32, seed_of(3));
    const size_t n_int = sd_cuda_moe_groups_ints(1, K, E);
    gbuf dx = gbuf_of(x, D), dnw = gbuf_of(nw, D), db = gbuf_of(bias, E), dticket = gbuf_zero(1), dready = gbuf_new((size_t)E + 2);
    gbuf out[2][5]; // [reference, one launch] × what
    const size_t n_of[5] = {(size_t)D, (size_t)E, (size_t)K, (size_t)K, n_int};
    static const char *what[5] = {"normed row", "logits", "sel", "w", "grouping"};
    for (int v = 0; v < 2; v++)
        for (int i = 0; i < 5; i++) out[v][i] = gbuf_new(n_of[i]);
    for (int rep = 0; rep < 2; rep++) {
        const sd_lin_norm ref_norm = {.x = dx.p, .w = dnw.p, .eps = 1e-5f, .n = D, .out = out[0][0].p};
        const sd_lin_job job = {.w = &router.dev, .x = norm_on ? out[0][0].p : dx.p, .ldx = D, .y = out[0][1].p, .ldy = E,
                                .mode = SD_LIN_STORE};
        if (norm_on) OK(sd_cuda_linear_multi_norm(&job, 1, 1, &ref_norm, 0, &st_));
        else OK(sd_cuda_linear_multi(&job, 1, 1, 0, &st_));
        OK(sd_cuda_moe_select(out[0][1].p, db.p, 1, E, K, 1, 1, true, 2.446f, IP(out[0][2]), out[0][3].p, IP(out[0][4]), NULL, 0,
                              &st_));
        CU(cudaMemset(dready.p, 0x7f, sizeof(int) * (E + 2)));
        const sd_lin_norm norm = {.x = dx.p, .w = dnw.p, .eps = 1e-5f, .n = D, .out = out[1][0].p};
        OK(sd_cuda_moe_route_select(router.dev.data, db.p, dx.p, norm_on ? &norm : NULL, 1, E, D, K, 1, true, 2.446f,
                                    out[1][1].p, IP(out[1][2]), out[1][3].p, IP(out[1][4]), IP(dticket), IP(dready), 0, &st_));
        CU(cudaDeviceSynchronize());
        for (int i = norm_on ? 0 : 1; i < 5; i++) { // at one token every int of the grouping is used (K distinct experts)
            uint32_t *a = gbuf_read(&out[0][i], n_of[i]), *b = gbuf_read(&out[1][i], n_of[i]);
            compare(c, fmt("call %d: %s", rep, what[i]), b, a, n_of[i]);
            free(a); free(b);
        }
        int ticket = -1, *ready = gbuf_read(&dready, (size_t)E + 2), *zeros = calloc((size_t)E + 2, sizeof(int));
        gbuf_get(&dticket, &ticket, 1);
        same_bits(fmt("call %d: the ticket back to zero", rep), &ticket, zeros, 1);
        same_bits(fmt("call %d: readiness counters zeroed", rep), ready, zeros, (size_t)E + 2);
        free(ready); free(zeros);
    }
    gbuf *all[] = {&dx, &dnw, &db, &dticket, &dready};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) gbuf_done(all[i], "route+select buffer");
    for (int v = 0; v < 2; v++)
        for (int i = 0; i < 5; i++) gbuf_done(&out[v][i], what[i]);
    tmat_free(&router);
    free(x); free(nw); free(bias);
}
