// cmd_run.c — `specdec run`: plain or speculative generation, with metrics, trace and receipt.
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "args.h"
#include "backend_select.h" // sd_cli_backend_*
#include "commands.h"
#include "decode.h"  // sd_decode, sd_synth_prompt
#include "demo.h"    // sd_demo_models
#include "receipt.h" // receipt_writer
#include "spec.h"    // sd_spec_generate
#include "tp_select.h" // sd_cli_tp_*

static const char *HELP =
    "usage: specdec run [--model DIR] [--draft DIR --k K] (--prompt 1,2,3 | --prompt-len N)\n"
    "                   [--max-new N] [--temperature T] [--seed S] [--json] [--backend cpu|cuda]\n"
    "                   [--trace 1|2] [--trace-tag TAG] [--receipt FILE] [--plain] [--tp N]\n\n"
    "Generate tokens after a prompt. With a draft, speculative rounds (draft → verify → accept →\n"
    "rollback → maintenance); without, plain decode. With no --model: the embedded demo (the toy\n"
    "config, weights synthesised from seed 0, and its derived draft; k = 4; phase trace level 1).\n\n"
    "  --model DIR         target model directory (config.json + model.safetensors)\n"
    "  --draft DIR         draft model directory (same vocabulary); enables speculative rounds\n"
    "  --plain             plain decode even where a draft is available (the demo's)\n"
    "  --k K               draft depth 1..16 (default 4)\n"
    "  --prompt IDS        prompt token ids, comma-separated\n"
    "  --prompt-len N      a prompt of N tokens drawn from --seed (default 16)\n"
    "  --max-new N         tokens to generate (default 128)\n"
    "  --temperature T     0 = greedy (default); > 0 samples (Philox draws keyed by --seed)\n"
    "  --seed S            seed of the prompt and the draws (default 0)\n"
    "  --json              one JSON object on stdout: tokens, tokens_per_s and the metrics\n"
    "  --backend cpu|cuda  where to run (default: the GPU when one is visible and this build has\n"
    "                      CUDA, else the CPU; cuda where it cannot run is an error, never a fallback)\n"
    "  --trace 1|2         phase trace level (overrides SPECDEC_SPEC_TRACE; see docs/FLAGS.md)\n"
    "  --trace-tag TAG     trace line tag (default spec): [TAG-phase] and [TAG-phase-v]\n"
    "  --receipt FILE      write a JSONL receipt: environment, then one line per burst\n"
    "                      (implies trace level 1 unless a level is set)\n"
    SD_CLI_TP_HELP
    "tokens_per_s = generated tokens / seconds of the generation call (prefill included).\n";

typedef struct {
    const char *model, *draft, *receipt, *tag, *backend;
    sd_cli_backend be;
    sd_cli_tp tp;
    int *prompt, n_prompt;
    long max_new, k, trace;
    double temperature;
    uint64_t seed;
    bool json, plain, demo, prompt_given;
} run_opts;

// Read and check every option; returns 0 or an exit code.
static int parse(int argc, char **argv, run_opts *o) {
    const char *cmd = "specdec run";
    sd_args a;
    sd_args_init(&a, cmd, argc, argv);
    if (sd_args_help(&a)) { fputs(HELP, stdout); sd_args_free(&a); return -1; }
    o->model = sd_args_str(&a, "--model");
    o->draft = sd_args_str(&a, "--draft");
    o->receipt = sd_args_str(&a, "--receipt");
    o->tag = sd_args_str(&a, "--trace-tag");
    o->backend = sd_args_str(&a, "--backend");
    const char *prompt = sd_args_str(&a, "--prompt"), *plen = sd_args_str(&a, "--prompt-len");
    const char *max_new = sd_args_str(&a, "--max-new"), *k = sd_args_str(&a, "--k");
    const char *temp = sd_args_str(&a, "--temperature"), *seed = sd_args_str(&a, "--seed");
    const char *trace = sd_args_str(&a, "--trace");
    const char *tp = sd_args_str(&a, "--tp"), *tp_timeout = sd_args_str(&a, "--tp-timeout");
    const char *tp_stop = sd_args_str(&a, "--tp-stop");
    o->json = sd_args_flag(&a, "--json");
    o->plain = sd_args_flag(&a, "--plain");
    bool ok = sd_args_done(&a);
    sd_args_free(&a);
    if (!ok) return EXIT_USAGE;

    sd_status st = {0};
    long n_prompt = 16;
    o->max_new = 128; o->k = DEMO_K; o->trace = -1;
    o->demo = !o->model;
    if (o->draft && !o->model) sd_fail(&st, SD_ERR_USAGE, "--draft needs --model");
    else if (prompt && plen) sd_fail(&st, SD_ERR_USAGE, "give --prompt or --prompt-len, not both");
    else if (o->tag && !*o->tag) sd_fail(&st, SD_ERR_USAGE, "--trace-tag must not be empty");
    else if (sd_cli_backend_parse(o->backend, &o->be, &st) || sd_cli_tp_parse(tp, tp_timeout, tp_stop, &o->tp, &st)) {
    } else if ((plen && !sd_parse_int("--prompt-len", plen, 1, 1 << 20, &n_prompt, &st)) ||
             (max_new && !sd_parse_int("--max-new", max_new, 1, 1 << 20, &o->max_new, &st)) ||
             (k && !sd_parse_int("--k", k, 1, SD_SPEC_MAX_K, &o->k, &st)) ||
             (temp && !sd_parse_float("--temperature", temp, 0.0, 100.0, &o->temperature, &st)) ||
             (seed && !sd_parse_u64("--seed", seed, &o->seed, &st)) ||
             (trace && !sd_parse_int("--trace", trace, 1, 2, &o->trace, &st)) ||
             (prompt && !sd_parse_int_list("--prompt", prompt, &o->prompt, &o->n_prompt, &st))) {
    }
    if (st.code) return sd_cli_fail(cmd, &st);
    o->prompt_given = prompt != NULL;
    if (!prompt) {
        o->n_prompt = (int)n_prompt;
        o->prompt = malloc(sizeof(int) * (size_t)n_prompt);
    }
    if (!o->tag) o->tag = "spec";
    return 0;
}

static void print_json(const run_opts *o, const int *tokens, int n, double secs, const sd_accept_stats *s, bool spec,
                       const char *layout) {
    cJSON *j = cJSON_CreateObject();
    cJSON_AddItemToObject(j, "tokens", cJSON_CreateIntArray(tokens, n));
    cJSON_AddNumberToObject(j, "tokens_per_s", n / secs);
    cJSON_AddNumberToObject(j, "seconds", secs);
    cJSON_AddNumberToObject(j, "prompt_tokens", o->n_prompt);
    cJSON_AddStringToObject(j, "backend", sd_cli_backend_name(o->be));
    cJSON_AddStringToObject(j, "mode", spec ? "speculative" : "plain");
    cJSON_AddNumberToObject(j, "ranks", o->tp.ranks ? o->tp.ranks : 1);
    if (layout) cJSON_AddStringToObject(j, "layout", layout);
    if (spec) {
        cJSON_AddNumberToObject(j, "k", (double)o->k);
        cJSON_AddNumberToObject(j, "rounds", (double)s->rounds);
        cJSON_AddNumberToObject(j, "drafted", (double)s->drafted);
        cJSON_AddNumberToObject(j, "accepted", (double)s->accepted);
        cJSON_AddNumberToObject(j, "acceptance_rate", sd_stats_acceptance_rate(s));
        cJSON_AddNumberToObject(j, "mean_accepted_length", sd_stats_mean_accepted_length(s));
        cJSON *pp = cJSON_AddArrayToObject(j, "per_position");
        for (int i = 0; i < o->k; i++) cJSON_AddItemToArray(pp, cJSON_CreateNumber(sd_stats_position_rate(s, i)));
    }
    char *txt = cJSON_PrintUnformatted(j);
    puts(txt);
    free(txt);
    cJSON_Delete(j);
}

static void print_human(const run_opts *o, const int *tokens, int n, double secs, const sd_accept_stats *s, bool spec) {
    printf("tokens:");
    for (int i = 0; i < n; i++) printf(" %d", tokens[i]);
    char ranks[32] = "";
    if (o->tp.ranks) snprintf(ranks, sizeof ranks, ", %d ranks", o->tp.ranks);
    printf("\n%d tokens in %.3f s: %.1f tokens/s (%s, %s%s)\n", n, secs, n / secs, spec ? "speculative" : "plain",
           sd_cli_backend_name(o->be), ranks);
    if (!spec) return;
    printf("rounds %llu, drafted %llu, accepted %llu: acceptance %.1f%%, mean accepted length %.2f (k = %ld)\n",
           (unsigned long long)s->rounds, (unsigned long long)s->drafted, (unsigned long long)s->accepted,
           100.0 * sd_stats_acceptance_rate(s), sd_stats_mean_accepted_length(s), o->k);
    printf("per position:");
    for (int i = 0; i < o->k; i++) printf(" %.2f", sd_stats_position_rate(s, i));
    printf("\n");
}

static sd_code open_receipt(receipt_writer *w, const run_opts *o, const sd_model *t, const sd_model *d,
                            int level, const char *layout, sd_status *st) {
    char flags[128], device[256];
    sd_cli_device_name(t, device, sizeof device);
    const char *env_level = getenv("SPECDEC_SPEC_TRACE");
    snprintf(flags, sizeof flags, "SPECDEC_SPEC_TRACE=%s", env_level ? env_level : "");
    receipt_env env = {
        .version = SPECDEC_VERSION, .commit = SPECDEC_GIT_COMMIT,
        .config_sha256 = t->config_sha256,
        .weights_sha256 = t->weights_sha256[0] ? t->weights_sha256 : "synthesised:seed=0",
        .draft_sha256 = d ? (d->weights_sha256[0] ? d->weights_sha256 : "synthesised:seed=0") : NULL,
        .backend = sd_cli_backend_name(o->be), .device = device, .driver = NULL, .tp_layout = layout, .tag = o->tag,
        .flags = flags,
        .k = d ? (int)o->k : 0, .seed = o->seed, .temperature = o->temperature, .trace_level = level,
    };
    return receipt_open(w, o->receipt, &env, st);
}

// Load (or synthesise) the models on the host, then move them to the backend.
static sd_code setup(run_opts *o, sd_model host[2], sd_model dev[2], sd_model *use[2], bool spec, sd_status *st) {
    sd_code rc = o->demo ? sd_demo_models(&host[0], spec ? &host[1] : NULL, st) : sd_model_load(&host[0], o->model, st);
    if (!rc && o->draft && spec) rc = sd_model_load(&host[1], o->draft, st);
    if (rc) return rc;
    const int V = host[0].cfg.vocab_size;
    if (!o->prompt) return sd_fail(st, SD_ERR_SYS, "out of memory");
    if (!o->prompt_given) sd_synth_prompt(o->seed, V, o->n_prompt, o->prompt);
    for (int i = 0; i < o->n_prompt; i++)
        if (o->prompt[i] >= V) return sd_fail(st, SD_ERR_DATA, "--prompt: token %d is outside the vocabulary 0..%d", o->prompt[i], V - 1);
    rc = sd_cli_to_backend(o->be, &host[0], &dev[0], &use[0], st);
    if (!rc && spec) rc = sd_cli_to_backend(o->be, &host[1], &dev[1], &use[1], st);
    return rc;
}

static double now_s(void) { return (double)trace_now_ns() * 1e-9; }

// A trace boundary drains both models' backends (they may run on different streams).
static void sync_both(void *ctx) {
    sd_model **m = ctx;
    sd_model_sync(m[0]);
    if (m[1]) sd_model_sync(m[1]);
}

static void free_model(sd_model *m) {
    if (m->w.arena || m->backend) sd_model_free(m);
}

// One generation on one target model (with --tp, every rank runs it on its shard, the draft
// replicated: each rank runs the same draft, so all see the same drafts; rank 0 keeps the trace).
// The states are made before the clock starts.
typedef struct {
    const run_opts *o;
    const sd_model *draft; // NULL: plain decode
    trace_burst *tb;       // rank 0's
    int *out[SD_TP_MAX_RANKS];
    sd_state ts[SD_TP_MAX_RANKS], ds[SD_TP_MAX_RANKS];
    sd_accept_stats stats[SD_TP_MAX_RANKS];
} generation;

static sd_code init_states(generation *g, int rank, const sd_model *target, sd_status *st) {
    const run_opts *o = g->o;
    const int cap = o->n_prompt + (int)o->max_new + (int)o->k + 1, chunk = 32, k = (int)o->k;
    sd_code c = sd_model_state_init(target, &g->ts[rank], cap, g->draft && k + 1 > chunk ? k + 1 : chunk, st);
    if (!c && g->draft) c = sd_model_state_init(g->draft, &g->ds[rank], cap, k > chunk ? k : chunk, st);
    return c;
}

static sd_code generate_rank(void *ctx, int rank, const sd_model *target, sd_status *st) {
    generation *g = ctx;
    const run_opts *o = g->o;
    if (!g->draft)
        return sd_decode(target, &g->ts[rank], o->prompt, o->n_prompt, (int)o->max_new, (float)o->temperature, o->seed,
                         g->out[rank], st);
    sd_spec_opts so = {.k = (int)o->k, .temperature = (float)o->temperature, .seed = o->seed, .trace = rank ? NULL : g->tb};
    return sd_spec_generate(target, &g->ts[rank], g->draft, &g->ds[rank], o->prompt, o->n_prompt, (int)o->max_new, &so,
                            g->out[rank], &g->stats[rank], st);
}

// Every rank must have generated rank 0's tokens (they hold identical bits).
static sd_code ranks_agree(const generation *g, int ranks, sd_status *st) {
    for (int r = 1; r < ranks; r++)
        if (memcmp(g->out[r], g->out[0], sizeof(int) * (size_t)g->o->max_new))
            return sd_fail(st, SD_ERR_DATA, "tp: rank %d generated other tokens than rank 0", r);
    return SD_OK;
}

int cmd_run(int argc, char **argv) {
    const char *cmd = "specdec run";
    run_opts o = {0};
    int rc = parse(argc, argv, &o);
    if (rc) { free(o.prompt); return rc < 0 ? 0 : rc; }

    const bool spec = (o.demo || o.draft) && !o.plain;
    sd_status st = {0};
    sd_model host[2], dev[2], *use[2] = {NULL, NULL};
    memset(host, 0, sizeof host);
    memset(dev, 0, sizeof dev);
    sd_tp_group g = {0};
    receipt_writer rw = {0};
    char layout_buf[2048];
    const int ranks = o.tp.ranks ? o.tp.ranks : 1;
    static generation gen; // per-rank states and outputs: too big for the stack
    gen = (generation){.o = &o};
    bool have_out = true;
    for (int r = 0; r < ranks; r++) have_out &= (gen.out[r] = malloc(sizeof(int) * (size_t)o.max_new)) != NULL;
    int level = trace_level("KIMI_LINEAR", (int)o.trace);
    // The demo prints its one-line phase summary; a receipt records the phase clocks.
    if ((o.demo || o.receipt) && o.trace < 0 && level == 0) level = 1;

    // An explicit cuda is refused before resolving it (which needs a device), auto's choice after.
    sd_code c = have_out ? sd_cli_tp_check_backend(&o.tp, o.be, &st) : sd_fail(&st, SD_ERR_SYS, "out of memory");
    if (!c) c = sd_cli_backend_resolve(&o.be, &st);
    if (!c) c = sd_cli_tp_check_backend(&o.tp, o.be, &st);
    if (!c) c = setup(&o, host, dev, use, spec, &st);
    if (!c && o.tp.ranks) c = sd_cli_tp_group(&o.tp, use[0], &g, &st);
    gen.draft = !c && spec ? use[1] : NULL;
    for (int r = 0; !c && r < ranks; r++) c = init_states(&gen, r, o.tp.ranks ? &g.shards[r] : use[0], &st);
    const char *layout = sd_cli_tp_layout(&g, layout_buf, sizeof layout_buf);
    if (!c && o.receipt) c = open_receipt(&rw, &o, use[0], spec ? use[1] : NULL, level, layout, &st);

    trace_burst tb;
    trace_burst_begin(&tb, c ? 0 : level, spec ? (int)o.k : 0, sync_both, use);
    gen.tb = level ? &tb : NULL;
    double t0 = now_s();
    if (!c) c = o.tp.ranks ? sd_tp_group_run(&g, generate_rank, &gen, NULL, &st) : generate_rank(&gen, 0, use[0], &st);
    double secs = now_s() - t0;
    if (!c) c = ranks_agree(&gen, ranks, &st);
    if (!c && spec) {
        trace_burst_emit(&tb, o.tag, stderr);
        if (o.receipt) c = receipt_add_burst(&rw, &tb, o.tag, &st);
    }
    if (!c && o.json) print_json(&o, gen.out[0], (int)o.max_new, secs, &gen.stats[0], spec, layout);
    else if (!c) print_human(&o, gen.out[0], (int)o.max_new, secs, &gen.stats[0], spec);

    if (g.abandoned) return sd_cli_fail(cmd, &st); // a rank's thread may still read what we hold
    receipt_close(&rw);
    for (int r = 0; r < ranks; r++) {
        sd_state_free(&gen.ts[r]);
        sd_state_free(&gen.ds[r]);
    }
    sd_tp_group_free(&g);
    for (int i = 0; i < 2; i++) free_model(use[i] ? use[i] : &host[i]);
    for (int r = 0; r < ranks; r++) free(gen.out[r]);
    free(o.prompt);
    return c ? sd_cli_fail(cmd, &st) : 0;
}
