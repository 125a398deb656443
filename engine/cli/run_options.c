// run_options.c — `specdec run`'s options (run_options.h). One table names every option; each
// group of options has its own check; check_mode refuses the ones the chosen mode would ignore.
#include "run_options.h"
#include <ctype.h>
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "args.h"
#include "file_open.h" // sd_fopen_regular
#include "demo.h" // DEMO_K
#include "spec.h" // SD_SPEC_MAX_K

#define DECODE_GRAPH_ENV "SPECDEC_DECODE_GRAPH"
#define LEDGER_ENV "SPECDEC_GRAPH_SEL_LEDGER"

// A 0/1 switch of the environment: *on; false (and a usage error) for any other value.
static bool env_switch(const char *name, bool *on, sd_status *st) {
    const char *v = getenv(name);
    *on = v && !strcmp(v, "1");
    if (v && strcmp(v, "0") && strcmp(v, "1")) return sd_fail(st, SD_ERR_USAGE, "%s must be 0 or 1, got '%s'", name, v), false;
    return true;
}

static const char *HELP =
    "usage: specdec run [--model DIR] [--draft DIR --k K] [--prompt IDS | --prompt-file FILE | --prompt-len N]\n"
    "                   [--max-new N] [--temperature T] [--seed S] [--ignore-eos] [--backend cpu|cuda]\n"
    "                   [--threads N] [--tp N] [--graph] [--json | --stream] [--progress] [--plain]\n"
    "                   [--trace 1|2] [--trace-tag TAG] [--receipt FILE] [--chrome-trace FILE]\n\n"
    "Generate tokens after a prompt. With a draft, speculative rounds (draft → verify → accept →\n"
    "rollback → maintenance); without, plain decode. With no --model: the embedded demo (the toy\n"
    "config, weights synthesised from seed 0, and its derived draft; k = 4; phase trace level 1).\n\n"
    "models\n"
    "  --model DIR         target model directory (config.json + model.safetensors)\n"
    "  --draft DIR         draft model directory (same vocabulary); enables speculative rounds\n"
    "  --plain             plain decode where the demo would draft\n"
    "  --k K               draft depth 1..16 (default 4)\n"
    "  --backend cpu|cuda  where to run (default: the GPU when one is visible and this build has\n"
    "                      CUDA, else the CPU; cuda where it cannot run is an error, never a fallback)\n"
    "  --threads N         threads of the CPU backend (default: OMP_NUM_THREADS, else the CPUs this\n"
    "                      process may use); idle threads sleep (OMP_WAIT_POLICY=passive)\n"
    "  --graph             rounds and steps replayed from captured CUDA graphs (the decode-graph door,\n"
    "                      docs/CUDA.md; also SPECDEC_DECODE_GRAPH=1): the eager rounds' bits; cuda only\n"
    SD_CLI_TP_HELP
    "input\n"
    "  --prompt IDS        prompt token ids, comma-separated\n"
    "  --prompt-file FILE  prompt token ids in a text file, separated by commas and/or whitespace\n"
    "  --prompt-len N      a prompt of N tokens drawn from --seed (default 16)\n"
    "  --max-new N         tokens to generate at most (default 128)\n"
    "  --ignore-eos        do not stop at the config's eos_token_id (by default the run ends after\n"
    "                      committing one)\n"
    "  --temperature T     0 = greedy (default); > 0 samples (Philox draws keyed by --seed)\n"
    "  --seed S            seed of the prompt and the draws (default 0)\n"
    "outputs\n"
    "  --json              one JSON object on stdout: tokens, tokens_per_s and the metrics (ours and\n"
    "                      vLLM's names, docs/METRICS.md)\n"
    "  --stream            print the tokens as the rounds commit them (not with --json)\n"
    "  --progress          progress lines on stderr even when it is not a terminal (on a terminal\n"
    "                      they show by default unless --stream)\n"
    "  --trace 1|2         phase trace level (overrides SPECDEC_SPEC_TRACE; see docs/FLAGS.md)\n"
    "  --trace-tag TAG     trace line tag (default spec): [TAG-phase] and [TAG-phase-v]\n"
    "  --receipt FILE      write a JSONL receipt: environment, one line per burst, a closing line\n"
    "                      (implies trace level 1 unless a level is set)\n"
    "  --chrome-trace FILE the rounds as a Chrome trace-event JSON for ui.perfetto.dev or\n"
    "                      chrome://tracing (implies trace level 1; level 2 adds the verify buckets)\n\n"
    "The trace options, --receipt and --chrome-trace observe speculative rounds: on a plain run they\n"
    "are usage errors, as are --k and --draft with --plain and any option given twice; --seed with a\n"
    "given prompt on a greedy run and --threads on cuda draw a one-line note. Ctrl-C ends the run after the current\n"
    "round: the tokens so far are printed, the receipt closes with an \"interrupted\" line, exit 130.\n"
    "tokens_per_s = generated tokens / seconds of the generation call (prefill included).\n";

// Every option as given: NULL / false when absent.
typedef struct {
    const char *model, *draft, *backend, *k, *threads, *tp, *tp_timeout, *tp_stop, *rank, *nccl_id;
    const char *prompt, *prompt_file, *prompt_len, *max_new, *temperature, *seed;
    const char *trace, *tag, *receipt, *chrome;
    bool plain, graph, ignore_eos, json, stream, progress;
} run_given;

#define VALUE(name, field) {name, offsetof(run_given, field), false}
#define FLAG(name, field) {name, offsetof(run_given, field), true}
static const struct {
    const char *name;
    size_t offset; // of a const char * (value) or a bool (flag) in run_given
    bool flag;
} options[] = {
    VALUE("--model", model), VALUE("--draft", draft), FLAG("--plain", plain), VALUE("--k", k),
    VALUE("--backend", backend), VALUE("--threads", threads), VALUE("--tp", tp), VALUE("--tp-timeout", tp_timeout),
    VALUE("--tp-stop", tp_stop), VALUE("--rank", rank), VALUE("--nccl-id", nccl_id), FLAG("--graph", graph),
    VALUE("--prompt", prompt), VALUE("--prompt-file", prompt_file), VALUE("--prompt-len", prompt_len),
    VALUE("--max-new", max_new), FLAG("--ignore-eos", ignore_eos), VALUE("--temperature", temperature),
    VALUE("--seed", seed),
    FLAG("--json", json), FLAG("--stream", stream), FLAG("--progress", progress), VALUE("--trace", trace),
    VALUE("--trace-tag", tag), VALUE("--receipt", receipt), VALUE("--chrome-trace", chrome),
};

// Appends x to the growing array *v (capacity *cap); false when out of memory.
static bool push_id(int **v, int *cnt, int *cap, long x) {
    if (*cnt == *cap) {
        int *g = realloc(*v, sizeof **v * (size_t)(*cap = *cap ? 2 * *cap : 1024));
        if (!g) return false;
        *v = g;
    }
    (*v)[(*cnt)++] = (int)x;
    return true;
}

// Token ids from a text file: non-negative integers separated by whitespace and at most one
// comma ("1,2,3", "1 2 3", "1, 2,\n3").
static sd_code read_prompt_file(const char *path, int **out, int *n, sd_status *st) {
    sd_status why = {0};
    FILE *f = sd_fopen_regular(path, &why); // a FIFO or a device must not block the run
    if (!f) return sd_fail(st, SD_ERR_DATA, "--prompt-file %s", why.msg);
    int *v = NULL, cnt = 0, cap = 0, c, commas = 0;
    long x = -1; // the id being read; -1 between ids
    sd_code rc = SD_OK;
    while (!rc && (c = fgetc(f)) != EOF) {
        if (isdigit(c)) {
            if (x < 0 && (commas > 1 || (commas && cnt == 0)))
                rc = sd_fail(st, SD_ERR_DATA, "--prompt-file %s: an empty field before id %d", path, cnt + 1);
            x = (x < 0 ? 0 : x) * 10 + (c - '0');
            if (x > 0x7fffffff) rc = sd_fail(st, SD_ERR_DATA, "--prompt-file %s: id %d is too large", path, cnt + 1);
            continue;
        }
        if (c != ',' && !isspace(c)) {
            rc = sd_fail(st, SD_ERR_DATA, "--prompt-file %s: '%c' where token id %d should be (ids are non-negative "
                         "integers separated by commas or whitespace)", path, isprint(c) ? c : '?', cnt + 1);
            break;
        }
        if (x >= 0 && !push_id(&v, &cnt, &cap, x)) rc = sd_fail(st, SD_ERR_SYS, "--prompt-file %s: out of memory", path);
        commas = (x >= 0 ? 0 : commas) + (c == ',');
        x = -1;
    }
    if (!rc && x >= 0 && !push_id(&v, &cnt, &cap, x)) rc = sd_fail(st, SD_ERR_SYS, "--prompt-file %s: out of memory", path);
    if (!rc && ferror(f)) rc = sd_fail(st, SD_ERR_DATA, "--prompt-file %s: read error", path);
    if (!rc && cnt == 0) rc = sd_fail(st, SD_ERR_DATA, "--prompt-file %s: no token ids", path);
    fclose(f);
    if (rc) { free(v); return rc; }
    *out = v;
    *n = cnt;
    return SD_OK;
}

static bool check_models(const run_given *g, run_opts *o, sd_status *st) {
    o->model = g->model;
    o->draft = g->draft;
    o->plain = g->plain;
    o->demo = !g->model;
    o->spec = (o->demo || g->draft) && !g->plain;
    o->k = DEMO_K;
    if (g->draft && !g->model) return sd_fail(st, SD_ERR_USAGE, "--draft needs --model"), false;
    bool env_graph;
    if (!env_switch(DECODE_GRAPH_ENV, &env_graph, st) || !env_switch(LEDGER_ENV, &o->ledger, st)) return false;
    o->graph = g->graph || env_graph;
    if (o->ledger && !o->graph)
        return sd_fail(st, SD_ERR_USAGE, "%s=1 arms the selection ledger inside the door's graphs: it needs --graph "
                                         "(or %s=1)", LEDGER_ENV, DECODE_GRAPH_ENV), false;
    const sd_cli_tp_args tp = {.tp = g->tp, .timeout = g->tp_timeout, .stop = g->tp_stop, .rank = g->rank, .nccl_id = g->nccl_id};
    return !sd_cli_backend_parse(g->backend, &o->be, st) &&
           !sd_cli_tp_parse(&tp, &o->tp, st) &&
           (!g->k || sd_parse_int("--k", g->k, 1, SD_SPEC_MAX_K, &o->k, st)) &&
           (!g->threads || sd_parse_int("--threads", g->threads, 1, 4096, &o->threads, st));
}

static bool check_input(const run_given *g, run_opts *o, sd_status *st) {
    long n_prompt = 16;
    o->max_new = 128;
    o->ignore_eos = g->ignore_eos;
    if ((g->prompt != NULL) + (g->prompt_file != NULL) + (g->prompt_len != NULL) > 1)
        return sd_fail(st, SD_ERR_USAGE, "give one of --prompt, --prompt-file and --prompt-len"), false;
    if ((g->prompt_len && !sd_parse_int("--prompt-len", g->prompt_len, 1, 1 << 20, &n_prompt, st)) ||
        (g->max_new && !sd_parse_int("--max-new", g->max_new, 1, 1 << 20, &o->max_new, st)) ||
        (g->temperature && !sd_parse_float("--temperature", g->temperature, 0.0, 100.0, &o->temperature, st)) ||
        (g->seed && !sd_parse_u64("--seed", g->seed, &o->seed, st)) ||
        (g->prompt && !sd_parse_int_list("--prompt", g->prompt, &o->prompt, &o->n_prompt, st)))
        return false;
    o->prompt_given = g->prompt || g->prompt_file;
    if (g->prompt_file) return !read_prompt_file(g->prompt_file, &o->prompt, &o->n_prompt, st);
    if (!g->prompt) {
        o->n_prompt = (int)n_prompt;
        o->prompt = malloc(sizeof(int) * (size_t)n_prompt);
        if (!o->prompt) return sd_fail(st, SD_ERR_SYS, "out of memory"), false;
    }
    return true;
}

static bool check_outputs(const run_given *g, run_opts *o, sd_status *st) {
    o->json = g->json;
    o->stream = g->stream;
    o->progress = g->progress;
    o->tag = g->tag ? g->tag : "spec";
    o->receipt = g->receipt;
    o->chrome = g->chrome;
    o->trace = -1;
    if (g->tag && !*g->tag) return sd_fail(st, SD_ERR_USAGE, "--trace-tag must not be empty"), false;
    if (g->stream && g->json)
        return sd_fail(st, SD_ERR_USAGE, "--stream and --json both write stdout: choose one"), false;
    return !g->trace || sd_parse_int("--trace", g->trace, 1, 2, &o->trace, st);
}

// An option the chosen mode would ignore is an error, never silently dropped; --seed, which
// scripts pass alongside a fixed prompt, gets a one-line note where it has nothing to seed.
static bool check_mode(const run_given *g, const run_opts *o, sd_status *st) {
    if (g->plain && g->draft) return sd_fail(st, SD_ERR_USAGE, "--draft with --plain: the draft would not be used"), false;
    if (g->seed && o->prompt_given && o->temperature == 0.0)
        fprintf(stderr, "specdec run: note: --seed does nothing here: the prompt is given and the run is greedy "
                        "(--temperature 0)\n");
    if (o->spec) return true;
    const char *idle = g->k ? "--k" : g->trace ? "--trace" : g->tag ? "--trace-tag" : g->receipt ? "--receipt"
                     : g->chrome ? "--chrome-trace" : NULL;
    if (idle)
        sd_fail(st, SD_ERR_USAGE, "%s does nothing on a plain run: it %s speculative rounds (give --draft DIR%s)", idle,
                g->k ? "sets the draft depth of" : "observes", g->plain ? ", drop --plain" : "");
    return !idle;
}

int run_parse(int argc, char **argv, run_opts *o) {
    const char *cmd = "specdec run";
    memset(o, 0, sizeof *o);
    sd_args a;
    sd_args_init(&a, cmd, argc, argv);
    if (sd_args_help(&a)) { fputs(HELP, stdout); sd_args_free(&a); return -1; }
    run_given g = {0};
    for (size_t i = 0; i < sizeof options / sizeof options[0]; i++) {
        void *field = (char *)&g + options[i].offset;
        if (options[i].flag) *(bool *)field = sd_args_flag(&a, options[i].name);
        else *(const char **)field = sd_args_str(&a, options[i].name);
    }
    bool ok = sd_args_done(&a);
    sd_args_free(&a);
    if (!ok) return EXIT_USAGE;
    sd_status st = {0};
    if (check_models(&g, o, &st) && check_input(&g, o, &st) && check_outputs(&g, o, &st) && check_mode(&g, o, &st))
        return 0;
    free(o->prompt);
    o->prompt = NULL;
    return sd_cli_fail(cmd, &st);
}
