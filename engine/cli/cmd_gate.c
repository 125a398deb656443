// cmd_gate.c — `specdec gate graph-sel`: the decode-graph door's MoE routing against the eager
// host oracle, per (device, layer, token), bit for bit, on every visible device
// (gate_graph_sel.h runs the arms); one verdict line per (device, layer), a summary, and exit 0
// only when everything matched.
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "args.h"
#include "commands.h"
#include "demo.h"           // DEMO_K
#include "door_select.h"    // sd_cli_device_count
#include "gate_graph_sel.h" // gate_graph_sel_device
#include "spec.h"           // SD_SPEC_MAX_K

static const char *GATES_HELP =
    "usage: specdec gate GATE [options]   (specdec gate GATE --help for its options)\n\n"
    "gates:\n"
    "  graph-sel   the decode-graph door routes every MoE token exactly as the eager path does\n";

static const char *HELP =
    "usage: specdec gate graph-sel [--model DIR [--draft DIR] | --config FILE [--draft-layers N]]\n"
    "                              [--k K] [--tokens N] [--prompt IDS | --prompt-len N] [--temperature T]\n"
    "                              [--seed S] [--backend cpu|cuda] [--canary] [--json]\n"
    "                              [--tp N [--tp-timeout S] [--canary-rank R]]\n\n"
    "Runs the same prompt and rounds twice on every visible device — the eager arm (eager MoE arm,\n"
    "each token's routing read back on the host: the oracle) and the graph arm (the decode-graph\n"
    "door's captured graphs, the device-table MoE arm, the selection ledger's recorder inside the\n"
    "graphs) — and compares the target's sel and w per (device, layer, token) bit for bit, and the\n"
    "tokens and the last forward's logits. One verdict line per (device, layer), then a summary;\n"
    "on a mismatch the first (device, layer, token), both rows and the routing margin there (the\n"
    "K-th chosen minus the best left-out biased score, or the group margin when smaller: a near-tie\n"
    "shows as a margin of a few ulps).\n"
    "On the CPU backend both arms run the host walk (the ledger's CPU stand-in records the graph\n"
    "arm). Exit 0 only when everything matched, 1 on any mismatch, 2 on bad usage.\n\n"
    SD_CLI_MODELS_HELP
    "  --k K               draft depth 1..16 (default 4 with a draft); 0: plain decode steps\n"
    "  --tokens N          tokens each arm generates (default 64)\n"
    "  --prompt IDS        prompt token ids, comma-separated\n"
    "  --prompt-len N      a prompt of N tokens drawn from --seed (default 16)\n"
    "  --temperature T     0 = greedy (default); > 0 sampled rounds, the same draws in both arms\n"
    "  --seed S            seed of the prompt and the draws (default 0)\n"
    "  --backend cpu|cuda  where to run (default: the GPUs when visible, else the CPU)\n"
    "  --canary            nudge one routing weight by one ulp in one device slot after it is\n"
    "                      recorded: the gate must FAIL, naming that slot (a check of the gate)\n"
    "  --json              one JSON object on stdout with the same verdicts\n"
    "  --tp N              both arms on N tensor-parallel ranks (on the CPU N threads; on cuda rank\n"
    "                      r on device r over NCCL): every rank against its own eager oracle, and a\n"
    "                      verdict that all ranks routed every (layer, token) alike\n"
    "  --tp-timeout S      every collective's timeout in seconds (default 5)\n"
    "  --canary-rank R     with --tp: nudge rank R's router input by one ulp in the first MoE layer:\n"
    "                      the cross-rank verdict must FAIL, naming rank R (a check of the gate)\n";

typedef struct {
    sd_cli_models src;
    sd_cli_backend be;
    sd_cli_tp tp;       // tp.ranks 0: every visible device on its own
    gate_opts g;
    int *prompt;
    bool json;
} gate_cli;

static int parse(int argc, char **argv, gate_cli *c) {
    const char *cmd = "specdec gate graph-sel";
    sd_args a;
    sd_args_init(&a, cmd, argc, argv);
    if (sd_args_help(&a)) { fputs(HELP, stdout); sd_args_free(&a); return -1; }
    const char *model = sd_args_str(&a, "--model"), *draft = sd_args_str(&a, "--draft");
    const char *config = sd_args_str(&a, "--config"), *layers = sd_args_str(&a, "--draft-layers");
    const char *tail = sd_args_str(&a, "--tail-scale"), *wseed = sd_args_str(&a, "--weights-seed");
    const char *k = sd_args_str(&a, "--k"), *tokens = sd_args_str(&a, "--tokens"), *prompt = sd_args_str(&a, "--prompt");
    const char *plen = sd_args_str(&a, "--prompt-len"), *temp = sd_args_str(&a, "--temperature");
    const char *seed = sd_args_str(&a, "--seed"), *backend = sd_args_str(&a, "--backend");
    const char *tp = sd_args_str(&a, "--tp"), *tp_timeout = sd_args_str(&a, "--tp-timeout");
    const char *canary_rank = sd_args_str(&a, "--canary-rank");
    c->g.canary = sd_args_flag(&a, "--canary");
    c->json = sd_args_flag(&a, "--json");
    const bool ok = sd_args_done(&a);
    sd_args_free(&a);
    if (!ok) return EXIT_USAGE;

    sd_status st = {0};
    long kv = 0, nt = 64, np = 16;
    double t = 0.0;
    const sd_cli_tp_args ta = {.tp = tp, .timeout = tp_timeout};
    if (sd_cli_models_parse(model, draft, config, layers, tail, wseed, &c->src, &st) ||
        sd_cli_backend_parse(backend, &c->be, &st) || sd_cli_tp_parse(&ta, &c->tp, &st))
        return sd_cli_fail(cmd, &st);
    long cr = -1;
    if (canary_rank && !tp) sd_fail(&st, SD_ERR_USAGE, "--canary-rank needs --tp N");
    else if (canary_rank && !sd_parse_int("--canary-rank", canary_rank, 0, c->tp.ranks - 1, &cr, &st)) {
    }
    if (st.code) return sd_cli_fail(cmd, &st);
    c->tp.canary_rank = (int)cr;
    const bool has_draft = sd_cli_models_have_draft(&c->src);
    kv = has_draft ? DEMO_K : 0;
    if ((k && !sd_parse_int("--k", k, 0, SD_SPEC_MAX_K, &kv, &st)) ||
        (tokens && !sd_parse_int("--tokens", tokens, 1, 1 << 20, &nt, &st)) ||
        (plen && !sd_parse_int("--prompt-len", plen, 1, 1 << 20, &np, &st)) ||
        (temp && !sd_parse_float("--temperature", temp, 0.0, 100.0, &t, &st)) ||
        (seed && !sd_parse_u64("--seed", seed, &c->g.seed, &st)))
        return sd_cli_fail(cmd, &st);
    if (prompt && plen) sd_fail(&st, SD_ERR_USAGE, "give --prompt or --prompt-len, not both");
    else if (kv > 0 && !has_draft) sd_fail(&st, SD_ERR_USAGE, "--k %ld needs a draft (--draft DIR or --draft-layers N)", kv);

    else if (prompt && !sd_parse_int_list("--prompt", prompt, &c->prompt, &c->g.n_prompt, &st)) {
    }
    if (st.code) return sd_cli_fail(cmd, &st);
    if (kv == 0 && (draft || layers)) // a model pair gated at both depths stays one command line: a note, not an error
        fprintf(stderr, "%s: note: --k 0 runs plain decode steps: %s not used\n", cmd,
                draft ? "--draft is" : tail ? "--draft-layers and --tail-scale are" : "--draft-layers is");
    c->src.want_draft = kv > 0;
    c->g.k = (int)kv;
    c->g.tokens = (int)nt;
    c->g.temperature = (float)t;
    if (!prompt) {
        c->g.n_prompt = (int)np;
        if (!(c->prompt = malloc(sizeof(int) * (size_t)np))) return sd_fail(&st, SD_ERR_SYS, "out of memory"), sd_cli_fail(cmd, &st);
    }
    c->g.prompt = c->prompt;
    c->g.prompt_given = prompt != NULL;
    return 0;
}

// A row as "sel 3 5  w 0.601234567 (0x3f19ea12) ...".
static void print_row(const char *arm, const ledger_row *r) {
    printf("  %-6s", arm);
    if (!r->k) {
        printf(" (no row)\n");
        return;
    }
    printf(" sel");
    for (int j = 0; j < r->k; j++) printf(" %d", r->sel[j]);
    printf("  w");
    for (int j = 0; j < r->k; j++) {
        unsigned bits;
        memcpy(&bits, &r->w[j], sizeof bits);
        printf(" %.9g (0x%08x)", r->w[j], bits);
    }
    printf("\n");
}

// "device 0", or under --tp "rank 1 (device 0)".
static const char *who(const gate_device *d, char *buf, size_t len) {
    if (d->rank < 0) snprintf(buf, len, "device %d", d->device);
    else snprintf(buf, len, "rank %d (device %d)", d->rank, d->device);
    return buf;
}

static void print_device(const gate_cli *c, const gate_device *d) {
    char w[64];
    who(d, w, sizeof w);
    for (int i = 0; i < d->n_layers; i++) {
        const gate_layer *l = &d->layers[i];
        const bool ok = !l->mismatched && !l->missing && l->rows;
        printf("%s layer %d: %s  %zu rows", w, l->layer, ok ? "PASS" : "FAIL", l->rows);
        if (!ok) printf(", %zu mismatched, %zu missing", l->mismatched, l->missing);
        printf("\n");
    }
    printf("%s tokens: %s (%d eager, %d graph", w, d->first_token_diff < 0 ? "PASS" : "FAIL", d->n_tokens_eager,
           d->n_tokens_graph);
    if (d->first_token_diff >= 0) printf("; first difference at token %d", d->first_token_diff);
    printf(")\n");
    if (!d->logits_rows) printf("%s logits: not compared: %s\n", w, d->logits_why);
    else
        printf("%s logits: %s (the last forward's %d rows%s)\n", w, d->logits_first_diff < 0 ? "PASS" : "FAIL",
               d->logits_rows, d->logits_first_diff < 0 ? ", bit for bit" : ", first difference at float #");
    if (d->logits_first_diff >= 0) printf("  first differing float: #%ld\n", d->logits_first_diff);
    if (!d->entries_eager || !d->entries_graph)
        printf("%s: FAIL: nothing was recorded (%llu eager entries, %llu graph entries)\n", w,
               (unsigned long long)d->entries_eager, (unsigned long long)d->entries_graph);
    if (d->first.found) {
        printf("first divergence: %s layer %d token %d (routing #%d of that token)\n", w,
               d->first.a.k ? d->first.a.layer : d->first.b.layer, d->first.a.k ? d->first.a.pos : d->first.b.pos,
               (d->first.a.k ? d->first.a.occ : d->first.b.occ) + 1);
        print_row("eager", &d->first.a);
        print_row("graph", &d->first.b);
        if (d->first.a.k) printf("  margin %.9g (the K-th chosen minus the best left-out biased score, or the group margin)\n", d->first.a.margin);
    }
    if (c->g.canary && d->canary_layer >= 0)
        printf("canary: one ulp planted at %s layer %d token %d, entry 0\n", w, d->canary_layer, d->canary_pos);
}

static cJSON *row_json(const ledger_row *r) {
    if (!r->k) return cJSON_CreateNull();
    cJSON *o = cJSON_CreateObject();
    cJSON_AddItemToObject(o, "sel", cJSON_CreateIntArray(r->sel, r->k));
    cJSON_AddItemToObject(o, "w", cJSON_CreateFloatArray(r->w, r->k));
    if (!isnan(r->margin)) cJSON_AddNumberToObject(o, "margin", isinf(r->margin) ? 1e308 : r->margin);
    return o;
}

static cJSON *device_json(const gate_cli *c, const gate_device *d) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "device", d->device);
    if (d->rank >= 0) cJSON_AddNumberToObject(o, "rank", d->rank);
    cJSON_AddStringToObject(o, "name", d->name);
    cJSON_AddBoolToObject(o, "pass", d->pass);
    cJSON *layers = cJSON_AddArrayToObject(o, "layers");
    for (int i = 0; i < d->n_layers; i++) {
        const gate_layer *l = &d->layers[i];
        cJSON *lj = cJSON_CreateObject();
        cJSON_AddNumberToObject(lj, "layer", l->layer);
        cJSON_AddBoolToObject(lj, "pass", !l->mismatched && !l->missing && l->rows);
        cJSON_AddNumberToObject(lj, "rows", (double)l->rows);
        cJSON_AddNumberToObject(lj, "mismatched", (double)l->mismatched);
        cJSON_AddNumberToObject(lj, "missing", (double)l->missing);
        cJSON_AddItemToArray(layers, lj);
    }
    cJSON_AddBoolToObject(o, "tokens_equal", d->first_token_diff < 0);
    cJSON_AddNumberToObject(o, "tokens_eager", d->n_tokens_eager);
    cJSON_AddNumberToObject(o, "tokens_graph", d->n_tokens_graph);
    if (d->logits_rows) cJSON_AddBoolToObject(o, "logits_equal", d->logits_first_diff < 0);
    else cJSON_AddNullToObject(o, "logits_equal");
    cJSON_AddNumberToObject(o, "entries_eager", (double)d->entries_eager);
    cJSON_AddNumberToObject(o, "entries_graph", (double)d->entries_graph);
    cJSON_AddNumberToObject(o, "rows_eager", (double)d->rows_eager);
    cJSON_AddNumberToObject(o, "rows_graph", (double)d->rows_graph);
    cJSON_AddNumberToObject(o, "seconds_eager", d->secs_eager);
    cJSON_AddNumberToObject(o, "seconds_graph", d->secs_graph);
    if (d->first.found) {
        cJSON *f = cJSON_AddObjectToObject(o, "first_divergence");
        const ledger_row *k = d->first.a.k ? &d->first.a : &d->first.b;
        cJSON_AddNumberToObject(f, "layer", k->layer);
        cJSON_AddNumberToObject(f, "token", k->pos);
        cJSON_AddNumberToObject(f, "occurrence", k->occ);
        cJSON_AddItemToObject(f, "eager", row_json(&d->first.a));
        cJSON_AddItemToObject(f, "graph", row_json(&d->first.b));
    } else {
        cJSON_AddNullToObject(o, "first_divergence");
    }
    if (c->g.canary && d->canary_layer >= 0) {
        cJSON *cj = cJSON_AddObjectToObject(o, "canary");
        cJSON_AddNumberToObject(cj, "layer", d->canary_layer);
        cJSON_AddNumberToObject(cj, "token", d->canary_pos);
    }
    return o;
}

static void print_summary(const gate_device *devs, int n, const char *unit, bool pass) {
    size_t rows = 0, bad = 0, missing = 0;
    int layers = 0;
    for (int i = 0; i < n; i++)
        for (int l = 0; l < devs[i].n_layers; l++) {
            rows += devs[i].layers[l].rows;
            bad += devs[i].layers[l].mismatched;
            missing += devs[i].layers[l].missing;
            layers++;
        }
    printf("graph-sel: %s — %d %s%s, %d (%s, layer) verdicts, %zu rows compared, %zu mismatched, %zu missing\n",
           pass ? "PASS" : "FAIL", n, unit, n == 1 ? "" : "s", layers, unit, rows, bad, missing);
}

// The cross-rank verdict: every rank routed every (layer, token) alike in the eager arm.
static void print_cross(const sd_tp_route_verdict *v, int ranks) {
    if (v->agree) printf("ranks: PASS  all %d ranks selected the same experts with the same weights at every (layer, token)\n", ranks);
    else printf("ranks: FAIL  %s\n", v->msg);
}

static cJSON *cross_json(const sd_tp_route_verdict *v, int ranks) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "ranks", ranks);
    cJSON_AddBoolToObject(o, "pass", v->agree);
    if (!v->agree) {
        cJSON_AddNumberToObject(o, "rank", v->rank);
        cJSON_AddNumberToObject(o, "other", v->other);
        cJSON_AddNumberToObject(o, "layer", v->layer);
        cJSON_AddNumberToObject(o, "token", v->pos);
        cJSON_AddStringToObject(o, "message", v->msg);
    }
    return o;
}

static int graph_sel(int argc, char **argv) {
    const char *cmd = "specdec gate graph-sel";
    gate_cli c = {0};
    int rc = parse(argc, argv, &c);
    if (rc) { free(c.prompt); return rc < 0 ? 0 : rc; }
    sd_status st = {0};
    sd_code code = sd_cli_backend_resolve(&c.be, &st);
    if (!code) code = sd_cli_tp_check_backend(&c.tp, c.be, &st);
    const bool group = c.tp.ranks > 0;
    const int n_dev = group ? c.tp.ranks : c.be == SD_CLI_BACKEND_CUDA ? sd_cli_device_count() : 1;
    gate_device *devs = calloc((size_t)(n_dev > 0 ? n_dev : 1), sizeof *devs);
    if (!code && !devs) code = sd_fail(&st, SD_ERR_SYS, "out of memory");
    bool pass = true;
    sd_tp_route_verdict cross = {.agree = true};
    if (!code && group) {
        if (!c.json) fprintf(stderr, "%s: %d ranks on %s: eager arm, then graph arm (%d tokens, k = %d)\n", cmd, n_dev,
                             sd_cli_backend_name(c.be), c.g.tokens, c.g.k);
        code = gate_graph_sel_group(&c.src, &c.tp, &c.g, devs, &cross, &st);
        for (int i = 0; !code && i < n_dev; i++) {
            if (!c.json) print_device(&c, &devs[i]);
            pass &= devs[i].pass;
        }
        if (!code && !c.json) print_cross(&cross, n_dev);
        pass &= !code && cross.agree;
    }
    for (int i = 0; !code && !group && i < n_dev; i++) {
        if (!c.json) fprintf(stderr, "%s: device %d of %d: eager arm, then graph arm (%d tokens, k = %d)\n", cmd, i + 1, n_dev,
                             c.g.tokens, c.g.k);
        code = gate_graph_sel_device(&c.src, c.be, i, &c.g, &devs[i], &st);
        if (!code && !c.json) print_device(&c, &devs[i]);
        pass &= !code && devs[i].pass;
    }
    if (!code && c.json) {
        cJSON *j = cJSON_CreateObject();
        cJSON_AddStringToObject(j, "gate", "graph-sel");
        cJSON_AddBoolToObject(j, "pass", pass);
        cJSON_AddStringToObject(j, "backend", sd_cli_backend_name(c.be));
        cJSON_AddNumberToObject(j, "k", c.g.k);
        cJSON_AddNumberToObject(j, "tokens", c.g.tokens);
        cJSON_AddNumberToObject(j, "temperature", c.g.temperature);
        cJSON_AddBoolToObject(j, "canary", c.g.canary);
        if (group) cJSON_AddNumberToObject(j, "canary_rank", c.tp.canary_rank);
        cJSON *dj = cJSON_AddArrayToObject(j, "devices");
        for (int i = 0; i < n_dev; i++) cJSON_AddItemToArray(dj, device_json(&c, &devs[i]));
        if (group) cJSON_AddItemToObject(j, "ranks", cross_json(&cross, n_dev));
        char *txt = cJSON_PrintUnformatted(j);
        puts(txt);
        free(txt);
        cJSON_Delete(j);
    } else if (!code) {
        print_summary(devs, n_dev, group ? "rank" : "device", pass);
    }
    free(devs);
    free(c.prompt);
    if (code) return sd_cli_fail(cmd, &st);
    return pass ? 0 : EXIT_DATA;
}

int cmd_gate(int argc, char **argv) {
    if (argc < 1 || !strcmp(argv[0], "--help") || !strcmp(argv[0], "-h")) {
        fputs(GATES_HELP, argc < 1 ? stderr : stdout);
        return argc < 1 ? EXIT_USAGE : 0;
    }
    if (!strcmp(argv[0], "graph-sel")) return graph_sel(argc - 1, argv + 1);
    fprintf(stderr, "specdec gate: unknown gate '%s' (gates: graph-sel)\n", argv[0]);
    return EXIT_USAGE;
}
