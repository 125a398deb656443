// gate_graph_sel.c — the two arms of the graph-selection gate on one device (gate_graph_sel.h).
#include "gate_graph_sel.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "decode.h"      // sd_decode, sd_synth_prompt
#include "door_select.h" // sd_cli_door_*, sd_cli_moe_eager, sd_cli_ledger_device
#include "spec.h"        // sd_spec_generate
#include "trace.h"       // trace_now_ns

// One arm's run: its states, what it generated, and its recorder's context.
typedef struct {
    const gate_opts *o;
    const sd_model *target, *draft; // draft NULL: plain decode
    sd_state ts, ds;
    sd_gen_control ctl;
    ledger *L;
    sd_tp_route_log *routes; // under a group: this rank's eager routing, for the cross-rank verdict
    int dev, K;
    int *tokens;
    float *logits;        // the last target forward's rows
    ledger_row *rows;     // the graph arm's drained rows
    size_t n_rows;
    bool canary_due;      // plant the canary at the next drain
    int canary_layer, canary_pos;
    sd_code failed;       // a recorder error inside a callback (reported after the arm)
    sd_status cb_st;
} arm;

static void record_host(void *ctx, int layer, int pos, const int *sel, const float *w, int k, float margin) {
    arm *a = ctx;
    if (!a->failed) a->failed = ledger_record_host(a->L, a->dev, layer, pos, sel, w, k, margin, &a->cb_st);
    if (a->routes) sd_tp_route_record(a->routes, layer, pos, sel, w, k, margin);
}

// After each graph round or step, outside any capture: the canary (once), the drain, then the
// slots back to the sentinel so what the next forward does not write reads as a mismatch.
static void drain(void *ctx, int pos0, int T) {
    arm *a = ctx;
    if (a->failed) return;
    if (a->canary_due) {
        a->canary_due = false;
        a->canary_pos = pos0;
        if ((a->failed = ledger_canary(a->L, a->dev, a->canary_layer, 0, &a->cb_st))) return;
    }
    a->failed = ledger_drain_device(a->L, a->dev, pos0, T, a->K, &a->rows, &a->n_rows, &a->cb_st);
    if (!a->failed) a->failed = ledger_poison(a->L, a->dev, &a->cb_st);
}

static sd_code arm_init(arm *a, const gate_opts *o, const sd_model *target, const sd_model *draft, ledger *L, int dev,
                        sd_status *st) {
    const int cap = o->n_prompt + o->tokens + 2 * (o->k + 1), max_T = o->k + 1 > 32 ? o->k + 1 : 32;
    *a = (arm){.o = o, .target = target, .draft = o->k ? draft : NULL, .L = L, .dev = dev,
               .K = target->cfg.num_experts_per_token, .canary_layer = -1, .canary_pos = -1};
    a->tokens = malloc(sizeof(int) * (size_t)o->tokens);
    a->logits = malloc(sizeof(float) * (size_t)(o->k + 1) * target->cfg.vocab_size);
    if (!a->tokens || !a->logits) return sd_fail(st, SD_ERR_SYS, "gate: out of memory");
    SD_TRY(sd_model_state_init(target, &a->ts, cap, max_T, st));
    if (a->draft) SD_TRY(sd_model_state_init(draft, &a->ds, cap, max_T, st));
    return SD_OK;
}

static void arm_free(arm *a) {
    sd_state_free(&a->ts);
    sd_state_free(&a->ds);
    free(a->tokens);
    free(a->logits);
    free(a->rows);
}

// The generation both arms run: the same prompt, rounds and draws; no stop ids (both arms make
// exactly o->tokens).
static sd_code arm_generate(arm *a, sd_status *st) {
    const gate_opts *o = a->o;
    sd_code rc;
    if (a->draft) {
        sd_accept_stats stats = {0};
        const sd_spec_opts so = {.k = o->k, .temperature = o->temperature, .seed = o->seed, .control = &a->ctl};
        rc = sd_spec_generate(a->target, &a->ts, a->draft, &a->ds, o->prompt, o->n_prompt, o->tokens, &so, a->tokens,
                              &stats, st);
    } else {
        rc = sd_decode(a->target, &a->ts, o->prompt, o->n_prompt, o->tokens, o->temperature, o->seed, &a->ctl, a->tokens,
                       st);
    }
    if (!rc && a->failed) rc = sd_fail(st, a->failed, "gate: %s", a->cb_st.msg);
    return rc;
}

// The rows of the last target forward whose logits both arms leave in the state's scratch: a
// verify's k + 1, or a greedy step's one. A sampled plain step turns them into probabilities in
// place on one path and not the other, so those are not compared (and the gate says so).
static int logits_rows(const gate_opts *o, const char **why) {
    *why = NULL;
    if (o->k) return o->k + 1;
    if (o->temperature <= 0.0f) return 1;
    *why = "a sampled plain step keeps no logits to compare (its softmax works in place)";
    return 0;
}

// Every arm's generation at once: one rank a thread under a group, else arms[0] here.
static sd_code rank_generate(void *ctx, int rank, const sd_model *model, sd_status *st) {
    (void)model; // the arm holds its rank's shard
    return arm_generate(&((arm *)ctx)[rank], st);
}

static sd_code generate_all(sd_tp_group *grp, arm *a, sd_status *st) {
    return grp ? sd_tp_group_run(grp, rank_generate, a, NULL, st) : arm_generate(&a[0], st);
}

static sd_code eager_arms(sd_tp_group *grp, arm *a, int n, gate_device *out, sd_status *st) {
    for (int r = 0; r < n; r++) {
        a[r].ctl = (sd_gen_control){.on_route = record_host, .route_ctx = &a[r]};
        sd_cli_moe_eager(a[r].target, true);
    }
    const uint64_t t0 = trace_now_ns();
    const sd_code rc = generate_all(grp, a, st);
    const double secs = (double)(trace_now_ns() - t0) * 1e-9;
    for (int r = 0; r < n; r++) {
        sd_cli_moe_eager(a[r].target, false);
        out[r].secs_eager = secs;
        out[r].n_tokens_eager = a[r].ctl.n_out;
    }
    return rc;
}

static sd_code graph_arms(sd_tp_group *grp, sd_cli_backend be, arm *a, int n, gate_device *out, sd_status *st) {
    sd_cli_door *door[SD_TP_MAX_RANKS] = {0};
    sd_code rc = SD_OK;
    for (int r = 0; r < n && !rc; r++) {
        a[r].ctl = (sd_gen_control){.after_target = drain, .target_ctx = &a[r]};
        a[r].canary_due = a[r].o->canary && r == 0;
        a[r].canary_layer = a[r].target->cfg.first_k_dense_replace;
        if (be == SD_CLI_BACKEND_CUDA) { // the door: graphs with the recorder inside; it calls drain
            const sd_cli_door_opts dopt = {.k = a[r].draft ? a[r].o->k : 0, .temperature = a[r].o->temperature,
                                           .seed = a[r].o->seed, .ledger = a[r].L, .after_target = drain, .ctx = &a[r]};
            rc = sd_cli_door_open(be, a[r].target, &a[r].ts, a[r].draft, &a[r].ds, &dopt, &door[r], st);
            a[r].ctl = (sd_gen_control){.runner = door[r] ? sd_cli_door_runner(door[r]) : NULL};
        } else { // the host walk records through the ledger's CPU stand-in; the loop calls drain
            a[r].ctl.ledger = a[r].L;
        }
    }
    const uint64_t t0 = trace_now_ns();
    if (!rc) rc = generate_all(grp, a, st);
    const double secs = (double)(trace_now_ns() - t0) * 1e-9;
    for (int r = 0; r < n; r++) {
        if (!(grp && grp->abandoned)) sd_cli_door_close(door[r]);
        out[r].secs_graph = secs;
        out[r].n_tokens_graph = a[r].ctl.n_out;
        out[r].canary_layer = a[r].o->canary && r == 0 ? a[r].canary_layer : -1;
        out[r].canary_pos = a[r].canary_pos;
    }
    return rc;
}

// Per MoE layer, the whole comparison, the tokens and the logits.
static void verdicts(const arm *e, const arm *g, const ledger_row *host, size_t nh, const ledger *L, gate_device *out) {
    const sd_config *c = &e->target->cfg;
    bool ok = true;
    for (int i = 0; i < c->num_hidden_layers; i++) {
        if (!sd_config_is_moe(c, i)) continue;
        ledger_diff d;
        ledger_compare_layer(host, nh, g->rows, g->n_rows, out->device, i, &d);
        gate_layer *gl = &out->layers[out->n_layers++];
        *gl = (gate_layer){.layer = i, .rows = d.compared, .mismatched = d.mismatched, .missing = d.missing};
        ok &= !d.found && d.compared > 0;
    }
    ledger_compare(host, nh, g->rows, g->n_rows, &out->first);
    out->entries_eager = L->host_entries;
    out->entries_graph = L->device_entries;
    out->rows_eager = nh;
    out->rows_graph = g->n_rows;
    out->first_token_diff = -1;
    const int n = out->n_tokens_eager < out->n_tokens_graph ? out->n_tokens_eager : out->n_tokens_graph;
    for (int i = 0; i < n && out->first_token_diff < 0; i++)
        if (e->tokens[i] != g->tokens[i]) out->first_token_diff = i;
    if (out->first_token_diff < 0 && out->n_tokens_eager != out->n_tokens_graph) out->first_token_diff = n;
    out->logits_first_diff = -1;
    const size_t nf = (size_t)out->logits_rows * c->vocab_size;
    for (size_t i = 0; i < nf && out->logits_first_diff < 0; i++)
        if (memcmp(&e->logits[i], &g->logits[i], sizeof(float))) out->logits_first_diff = (long)i;
    out->pass = ok && !out->first.found && out->entries_eager > 0 && out->entries_graph > 0 && out->first_token_diff < 0 &&
                out->logits_first_diff < 0;
}

// The prompt: drawn once the vocabulary is known, or checked against it.
static sd_code prompt_for(const gate_opts *o, int V, sd_status *st) {
    if (!o->prompt_given) sd_synth_prompt(o->seed, V, o->n_prompt, o->prompt);
    for (int i = 0; i < o->n_prompt; i++)
        if (o->prompt[i] >= V)
            return sd_fail(st, SD_ERR_DATA, "--prompt: token %d is outside the vocabulary 0..%d", o->prompt[i], V - 1);
    return SD_OK;
}

// Both arms over n ranks (the group's shards; n = 1 and grp NULL: the one model), each rank
// with its own ledger, prearmed before any capture opens (the largest target forward after the
// prefill), and each rank's eager routing in routes[r] when routes is given.
static sd_code gate_ranks(sd_tp_group *grp, const sd_model *const *targets, const sd_model *const *drafts, int n,
                          sd_cli_backend be, const gate_opts *o, gate_device *out, sd_tp_route_log *routes,
                          sd_status *st) {
    const sd_config *c = &targets[0]->cfg;
    arm *e = calloc((size_t)n, sizeof *e), *g = calloc((size_t)n, sizeof *g);
    ledger *L = calloc((size_t)n, sizeof *L);
    ledger_row **host = calloc((size_t)n, sizeof *host);
    size_t *nh = calloc((size_t)n, sizeof *nh);
    sd_code rc = e && g && L && host && nh ? SD_OK : sd_fail(st, SD_ERR_SYS, "gate: out of memory");
    const int max_T = o->k + 1 > 32 ? o->k + 1 : 32;
    const char *why;
    const int rows = logits_rows(o, &why);
    for (int r = 0; r < n && !rc; r++) {
        // The ledger's device index: the GPU's ordinal; on the CPU an emulated rank records as
        // device `rank` (engine/model.c), one stand-in device per rank.
        const int dev = be == SD_CLI_BACKEND_CUDA ? sd_cli_device_ordinal(targets[r])
                                                  : targets[r]->comm ? targets[r]->comm->rank : 0;
        out[r].device = dev;
        out[r].rank = grp ? grp->first_rank + r : -1;
        out[r].canary_layer = out[r].canary_pos = -1;
        out[r].logits_rows = rows;
        out[r].logits_why = why;
        sd_cli_device_name(targets[r], out[r].name, sizeof out[r].name);
        ledger_init(&L[r], sd_cli_ledger_device(targets[r]), true);
        for (int i = 0; i < c->num_hidden_layers && !rc; i++)
            if (sd_config_is_moe(c, i)) rc = ledger_prearm(&L[r], dev, i, max_T * c->num_experts_per_token, st);
        if (!rc) rc = arm_init(&e[r], o, targets[r], drafts[r], &L[r], dev, st);
        if (!rc) rc = arm_init(&g[r], o, targets[r], drafts[r], &L[r], dev, st);
        if (routes) e[r].routes = &routes[r];
    }
    if (!rc) rc = eager_arms(grp, e, n, out, st);
    for (int r = 0; r < n && !rc && rows; r++) rc = sd_cli_read_logits(targets[r], &e[r].ts, rows, e[r].logits, st);
    for (int r = 0; r < n && L; r++) ledger_take_host(&L[r], &host[r], &nh[r]);
    if (!rc) rc = graph_arms(grp, be, g, n, out, st);
    for (int r = 0; r < n && !rc && rows; r++) rc = sd_cli_read_logits(targets[r], &g[r].ts, rows, g[r].logits, st);
    for (int r = 0; r < n && !rc; r++) verdicts(&e[r], &g[r], host[r], nh[r], &L[r], &out[r]);
    if (grp && grp->abandoned) return rc; // a rank's thread may still use what the arms hold
    for (int r = 0; r < n && e && g && L && host; r++) {
        free(host[r]);
        arm_free(&e[r]);
        arm_free(&g[r]);
        ledger_free(&L[r]);
    }
    free(e), free(g), free(L), free(host), free(nh);
    return rc;
}

sd_code gate_graph_sel_device(const sd_cli_models *src, sd_cli_backend be, int ordinal, const gate_opts *o,
                              gate_device *out, sd_status *st) {
    memset(out, 0, sizeof *out);
    sd_model t, d;
    SD_TRY(sd_cli_models_make(src, be, ordinal, &t, &d, st));
    const sd_model *tp = &t, *dp = &d;
    sd_code rc = prompt_for(o, t.cfg.vocab_size, st);
    if (!rc) rc = gate_ranks(NULL, &tp, &dp, 1, be, o, out, NULL, st);
    sd_model_free(&t);
    if (d.w.arena || d.backend) sd_model_free(&d);
    return rc;
}

sd_code gate_graph_sel_group(const sd_cli_models *src, const sd_cli_tp *tp, const gate_opts *o, gate_device *out,
                             sd_tp_route_verdict *cross, sd_status *st) {
    const int n = tp->ranks;
    memset(out, 0, sizeof *out * (size_t)n);
    memset(cross, 0, sizeof *cross);
    sd_model t, d; // on the host: the group cuts them into shards (and, on cuda, puts each on its device)
    SD_TRY(sd_cli_models_make(src, SD_CLI_BACKEND_CPU, 0, &t, &d, st));
    const bool with_draft = d.w.arena != NULL;
    sd_tp_group grp = {0};
    sd_tp_route_log *routes = calloc((size_t)n, sizeof *routes);
    sd_code rc = routes ? prompt_for(o, t.cfg.vocab_size, st) : sd_fail(st, SD_ERR_SYS, "gate: out of memory");
    sd_cli_tp use = *tp;
    if (use.canary_rank >= 0) use.canary_layer = t.cfg.first_k_dense_replace; // the first MoE layer
    if (!rc) rc = sd_cli_tp_group(&use, &t, with_draft ? &d : NULL, &grp, st);
    const sd_model *targets[SD_TP_MAX_RANKS] = {0}, *drafts[SD_TP_MAX_RANKS] = {0};
    for (int r = 0; r < n && !rc; r++) {
        targets[r] = &grp.shards[r];
        drafts[r] = with_draft ? sd_tp_group_draft(&grp, r, &d) : NULL;
    }
    if (!rc) rc = gate_ranks(&grp, targets, drafts, n, tp->backend, o, out, routes, st);
    if (!rc) {
        for (int r = 0; r < n; r++)
            if (routes[r].broken) rc = sd_fail(st, SD_ERR_SYS, "gate: rank %d's route log is unusable", r);
        if (!rc) sd_tp_routes_compare(routes, n, cross);
    }
    if (grp.abandoned) return rc; // a rank's thread may still use the group
    for (int r = 0; r < n && routes; r++) sd_tp_route_log_free(&routes[r]);
    free(routes);
    sd_tp_group_free(&grp);
    sd_model_free(&t);
    if (with_draft) sd_model_free(&d);
    return rc;
}
