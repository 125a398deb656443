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

static sd_code eager_arm(arm *a, gate_device *out, sd_status *st) {
    a->ctl = (sd_gen_control){.on_route = record_host, .route_ctx = a};
    sd_cli_moe_eager(a->target, true);
    const uint64_t t0 = trace_now_ns();
    sd_code rc = arm_generate(a, st);
    out->secs_eager = (double)(trace_now_ns() - t0) * 1e-9;
    sd_cli_moe_eager(a->target, false);
    out->n_tokens_eager = a->ctl.n_out;
    return rc;
}

static sd_code graph_arm(arm *a, sd_cli_backend be, gate_device *out, sd_status *st) {
    a->ctl = (sd_gen_control){.after_target = drain, .target_ctx = a};
    a->canary_due = a->o->canary;
    a->canary_layer = a->target->cfg.first_k_dense_replace;
    sd_cli_door *door = NULL;
    sd_code rc = SD_OK;
    if (be == SD_CLI_BACKEND_CUDA) { // the door: graphs with the recorder inside; it calls drain
        const sd_cli_door_opts dopt = {.k = a->draft ? a->o->k : 0, .temperature = a->o->temperature, .seed = a->o->seed,
                                       .ledger = a->L, .after_target = drain, .ctx = a};
        rc = sd_cli_door_open(be, a->target, &a->ts, a->draft, &a->ds, &dopt, &door, st);
        a->ctl = (sd_gen_control){.runner = door ? sd_cli_door_runner(door) : NULL};
    } else { // the host walk records through the ledger's CPU stand-in; the loop calls drain
        a->ctl.ledger = a->L;
    }
    const uint64_t t0 = trace_now_ns();
    if (!rc) rc = arm_generate(a, st);
    out->secs_graph = (double)(trace_now_ns() - t0) * 1e-9;
    sd_cli_door_close(door);
    out->n_tokens_graph = a->ctl.n_out;
    out->canary_layer = a->o->canary ? a->canary_layer : -1;
    out->canary_pos = a->canary_pos;
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

sd_code gate_graph_sel_device(const sd_cli_models *src, sd_cli_backend be, int ordinal, const gate_opts *o,
                              gate_device *out, sd_status *st) {
    memset(out, 0, sizeof *out);
    out->device = ordinal;
    out->canary_layer = out->canary_pos = -1;
    sd_model t, d;
    SD_TRY(sd_cli_models_make(src, be, ordinal, &t, &d, st));
    sd_cli_device_name(&t, out->name, sizeof out->name);
    const int V = t.cfg.vocab_size;
    if (!o->prompt_given) sd_synth_prompt(o->seed, V, o->n_prompt, o->prompt);
    for (int i = 0; i < o->n_prompt; i++)
        if (o->prompt[i] >= V) {
            sd_model_free(&t);
            if (d.w.arena || d.backend) sd_model_free(&d);
            return sd_fail(st, SD_ERR_DATA, "--prompt: token %d is outside the vocabulary 0..%d", o->prompt[i], V - 1);
        }
    const int dev = sd_cli_device_ordinal(&t);
    ledger L;
    ledger_init(&L, sd_cli_ledger_device(&t), true);
    arm e, g;
    memset(&e, 0, sizeof e);
    memset(&g, 0, sizeof g);
    const int max_T = o->k + 1 > 32 ? o->k + 1 : 32;
    sd_code rc = SD_OK;
    // The slots before any capture opens: the largest target forward after the prefill.
    for (int i = 0; i < t.cfg.num_hidden_layers && !rc; i++)
        if (sd_config_is_moe(&t.cfg, i)) rc = ledger_prearm(&L, dev, i, max_T * t.cfg.num_experts_per_token, st);
    const char *why;
    out->logits_rows = logits_rows(o, &why);
    out->logits_why = why;
    if (!rc) rc = arm_init(&e, o, &t, &d, &L, dev, st);
    if (!rc) rc = eager_arm(&e, out, st);
    if (!rc && out->logits_rows) rc = sd_cli_read_logits(&t, &e.ts, out->logits_rows, e.logits, st);
    ledger_row *host = NULL;
    size_t nh = 0;
    ledger_take_host(&L, &host, &nh);
    if (!rc) rc = arm_init(&g, o, &t, &d, &L, dev, st);
    if (!rc) rc = graph_arm(&g, be, out, st);
    if (!rc && out->logits_rows) rc = sd_cli_read_logits(&t, &g.ts, out->logits_rows, g.logits, st);
    if (!rc) verdicts(&e, &g, host, nh, &L, out);
    free(host);
    arm_free(&e);
    arm_free(&g);
    ledger_free(&L);
    sd_model_free(&t);
    if (d.w.arena || d.backend) sd_model_free(&d);
    return rc;
}
