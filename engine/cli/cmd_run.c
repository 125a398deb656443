// cmd_run.c — `specdec run`: plain or speculative generation, with metrics, trace, receipt and
// Chrome trace; on one device, through the decode-graph door (--graph), or as tensor-parallel
// ranks (--tp). The options are in run_options.c, what the run shows in run_report.c.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "args.h"
#include "backend_select.h" // sd_cli_backend_*
#include "chrome.h"         // trace_timeline, trace_chrome_write
#include "commands.h"
#include "decode.h"         // sd_decode, sd_synth_prompt
#include "demo.h"           // sd_demo_models
#include "door_select.h"    // sd_cli_door_*
#include "host_cpu.h"       // sd_cli_threads, sd_cli_cpu_model, sd_cli_omp_wait_policy
#include "interrupt.h"      // sd_cli_stop_signal
#include "receipt.h"        // receipt_writer
#include "run_options.h"    // run_opts, run_parse
#include "run_ledger.h"     // run_ledger (SPECDEC_GRAPH_SEL_LEDGER)
#include "run_report.h"     // run_reporter, run_print_*
#include "spec.h"           // sd_spec_generate
#include "tp_select.h"      // sd_cli_tp_*

// The trace level and what set it: --trace, the environment, or an output that needs the
// phase clocks (a receipt, a Chrome trace, the demo's one-line summary).
static int resolve_level(const run_opts *o, const char **source) {
    int level = trace_level("KIMI_LINEAR", (int)o->trace);
    *source = o->trace >= 0 ? "--trace" : level ? "environment" : "off";
    if (o->trace < 0 && level == 0 && o->spec && (o->receipt || o->chrome || o->demo)) {
        level = 1;
        *source = o->receipt ? "--receipt" : o->chrome ? "--chrome-trace" : "demo";
    }
    return level;
}

static sd_code open_receipt(receipt_writer *w, const run_opts *o, const sd_model *t, const sd_model *d, int level,
                            const char *source, int threads, const char *layout, sd_status *st) {
    char flags[96], device[256], cpu[256];
    sd_cli_device_name(t, device, sizeof device);
    sd_cli_cpu_model(cpu, sizeof cpu);
    snprintf(flags, sizeof flags, "SPECDEC_SPEC_TRACE=%d SPECDEC_DECODE_GRAPH=%d%s", level, o->graph,
             o->ledger ? " SPECDEC_GRAPH_SEL_LEDGER=1" : "");
    receipt_env env = {
        .version = SPECDEC_VERSION, .commit = SPECDEC_GIT_COMMIT,
        .config_sha256 = t->config_sha256,
        .weights_sha256 = t->weights_sha256[0] ? t->weights_sha256 : "synthesised:seed=0",
        .draft_sha256 = d ? (d->weights_sha256[0] ? d->weights_sha256 : "synthesised:seed=0") : NULL,
        .backend = sd_cli_backend_name(o->be), .device = device, .driver = NULL, .tp_layout = layout,
        .decode_graph = o->graph, .tag = o->tag, .flags = flags,
        .trace_level_source = source, .cpu_model = cpu, .cpu_threads = threads,
        .omp_wait_policy = sd_cli_omp_wait_policy(),
        .k = d ? (int)o->k : 0, .seed = o->seed, .temperature = o->temperature, .trace_level = level,
    };
    return receipt_open(w, o->receipt, &env, st);
}

// Load (or synthesise) the models on the host, then move them to the backend.
static sd_code setup(run_opts *o, sd_model host[2], sd_model dev[2], sd_model *use[2], sd_status *st) {
    sd_code rc = o->demo ? sd_demo_models(&host[0], o->spec ? &host[1] : NULL, st) : sd_model_load(&host[0], o->model, st);
    if (!rc && o->draft && o->spec) rc = sd_model_load(&host[1], o->draft, st);
    if (rc) return rc;
    const int V = host[0].cfg.vocab_size;
    if (!o->prompt_given) sd_synth_prompt(o->seed, V, o->n_prompt, o->prompt);
    for (int i = 0; i < o->n_prompt; i++)
        if (o->prompt[i] >= V) return sd_fail(st, SD_ERR_DATA, "prompt: token %d is outside the vocabulary 0..%d", o->prompt[i], V - 1);
    rc = sd_cli_tp_to_backend(&o->tp, &host[0], &dev[0], &use[0], st); // a device group's stay here: it shards them
    if (!rc && o->spec) rc = sd_cli_tp_to_backend(&o->tp, &host[1], &dev[1], &use[1], st);
    return rc;
}

// The Chrome trace's track names: the backend and its device.
static sd_code write_chrome(const run_opts *o, const trace_timeline *tl, sd_model *use[2], sd_status *st) {
    char td[300], dd[300], name[256];
    sd_cli_device_name(use[0], name, sizeof name);
    snprintf(td, sizeof td, "%s: %s", sd_cli_backend_name(o->be), name);
    sd_cli_device_name(use[1], name, sizeof name);
    snprintf(dd, sizeof dd, "%s: %s", sd_cli_backend_name(o->be), name);
    trace_chrome_info info = {.tag = o->tag, .k = (int)o->k, .target_device = td, .draft_device = dd};
    return trace_chrome_write(tl, &info, o->chrome, st);
}

// A trace boundary drains both models' backends (they may run on different streams).
static void sync_both(void *ctx) {
    sd_model **m = ctx;
    sd_model_sync(m[0]);
    if (m[1]) sd_model_sync(m[1]);
}

static void free_model(sd_model *m) {
    if (m->w.arena || m->backend) sd_model_free(m);
}

// One generation per target model: with --tp every rank runs it on its shard, the draft
// replicated (each rank runs the same draft, so all see the same drafts); rank 0 keeps the trace
// and the reporter, every rank the stop flag and the stop ids. The states are made before the
// clock starts.
typedef struct {
    const run_opts *o;
    const sd_model *draft; // NULL: plain decode
    const sd_tp_group *group; // with --tp: where each rank's draft is (sd_tp_group_draft)
    trace_burst *tb;       // rank 0's, or NULL
    sd_gen_control ctl[SD_TP_MAX_RANKS];
    int *out[SD_TP_MAX_RANKS];
    sd_state ts[SD_TP_MAX_RANKS], ds[SD_TP_MAX_RANKS];
    sd_accept_stats stats[SD_TP_MAX_RANKS];
} generation;

static sd_code init_states(generation *g, int rank, const sd_model *target, sd_status *st) {
    const run_opts *o = g->o;
    const int cap = o->n_prompt + (int)o->max_new + (int)o->k + 1, chunk = 32, k = (int)o->k;
    sd_code c = sd_model_state_init(target, &g->ts[rank], cap, g->draft && k + 1 > chunk ? k + 1 : chunk, st);
    const sd_model *draft = sd_tp_group_draft(g->group, rank, g->draft);
    if (!c && g->draft) c = sd_model_state_init(draft, &g->ds[rank], cap, k + 1 > chunk ? k + 1 : chunk, st);
    return c;
}

static sd_code generate_rank(void *ctx, int rank, const sd_model *target, sd_status *st) {
    generation *g = ctx;
    const run_opts *o = g->o;
    if (!g->draft)
        return sd_decode(target, &g->ts[rank], o->prompt, o->n_prompt, (int)o->max_new, (float)o->temperature, o->seed,
                         &g->ctl[rank], g->out[rank], st);
    sd_spec_opts so = {.k = (int)o->k, .temperature = (float)o->temperature, .seed = o->seed,
                       .trace = rank ? NULL : g->tb, .control = &g->ctl[rank]};
    return sd_spec_generate(target, &g->ts[rank], sd_tp_group_draft(g->group, rank, g->draft), &g->ds[rank], o->prompt,
                            o->n_prompt, (int)o->max_new, &so, g->out[rank], &g->stats[rank], st);
}

// Every rank must have generated rank 0's tokens (they hold identical bits).
static sd_code ranks_agree(const generation *g, int ranks, sd_status *st) {
    for (int r = 1; r < ranks; r++)
        if (g->ctl[r].n_out != g->ctl[0].n_out ||
            memcmp(g->out[r], g->out[0], sizeof(int) * (size_t)g->ctl[0].n_out))
            return sd_fail(st, SD_ERR_DATA, "tp: rank %d generated other tokens than rank 0", r);
    return SD_OK;
}

// --graph: a door on each rank's states (rank 0's keeps the trace and, when armed, the
// selection ledger's recorder inside its graphs).
static sd_code open_door(const run_opts *o, generation *g, int rank, const sd_model *target, trace_burst *tb, run_ledger *rl,
                         sd_cli_door **door, sd_status *st) {
    sd_cli_door_opts dopt = {.k = g->draft ? (int)o->k : 0, .temperature = (float)o->temperature, .seed = o->seed,
                             .trace = tb->level && !rank ? tb : NULL};
    if (o->ledger && !rank) {
        run_ledger_init(rl, target);
        dopt.ledger = &rl->L;
        dopt.after_target = run_ledger_after_target;
        dopt.ctx = rl;
    }
    const sd_model *draft = g->draft ? sd_tp_group_draft(g->group, rank, g->draft) : NULL;
    SD_TRY(sd_cli_door_open(o->be, target, &g->ts[rank], draft, &g->ds[rank], &dopt, door, st));
    g->ctl[rank].runner = sd_cli_door_runner(*door);
    return SD_OK;
}

int cmd_run(int argc, char **argv) {
    const char *cmd = "specdec run";
    run_opts o;
    int rc = run_parse(argc, argv, &o);
    if (rc) return rc < 0 ? 0 : rc;

    sd_status st = {0};
    sd_model host[2], dev[2], *use[2] = {NULL, NULL};
    memset(host, 0, sizeof host);
    memset(dev, 0, sizeof dev);
    sd_tp_group group = {0};
    sd_cli_door *door[SD_TP_MAX_RANKS] = {NULL};
    run_ledger rl = {0};
    receipt_writer rw = {0};
    trace_timeline tl = {0};
    char layout_buf[2048];
    const char *source;
    const int level = resolve_level(&o, &source), threads = sd_cli_threads(o.threads);
    const int ranks = sd_cli_tp_local_ranks(&o.tp);
    static generation gen; // per-rank states and outputs: too big for the stack
    gen = (generation){.o = &o, .group = &group};
    bool have_out = true;
    for (int r = 0; r < ranks; r++) have_out &= (gen.out[r] = malloc(sizeof(int) * (size_t)o.max_new)) != NULL;
    sd_cli_interrupt_install();

    // An explicit cuda is refused before resolving it (which needs a device), auto's choice after.
    sd_code c = have_out ? sd_cli_tp_check_backend(&o.tp, o.be, &st) : sd_fail(&st, SD_ERR_SYS, "out of memory");
    if (!c) c = sd_cli_backend_resolve(&o.be, &st);
    if (!c && o.threads && o.be == SD_CLI_BACKEND_CUDA)
        fprintf(stderr, "%s: note: --threads sets the CPU backend's threads; this run is on cuda\n", cmd);
    if (!c) c = sd_cli_tp_check_backend(&o.tp, o.be, &st);
    if (!c && o.graph) c = sd_cli_door_check_backend(o.be, &st); // before loading anything
    if (!c) c = setup(&o, host, dev, use, &st);
    if (!c && o.tp.ranks) c = sd_cli_tp_group(&o.tp, use[0], o.spec ? use[1] : NULL, &group, &st);
    gen.draft = !c && o.spec ? use[1] : NULL;
    for (int r = 0; !c && r < ranks; r++) c = init_states(&gen, r, o.tp.ranks ? &group.shards[r] : use[0], &st);
    const char *layout = sd_cli_tp_layout(&group, layout_buf, sizeof layout_buf);
    // Rank 0's models: what the trace drains and the receipt and the Chrome trace name.
    sd_model *first[2] = {use[0], use[1]};
    if (!c && o.tp.ranks) {
        first[0] = &group.shards[0];
        if (use[1]) first[1] = (sd_model *)sd_tp_group_draft(&group, 0, use[1]);
    }

    for (int r = 0; r < ranks; r++) {
        gen.ctl[r] = (sd_gen_control){.stop = &sd_cli_stop_signal};
        if (!c && !o.ignore_eos) {
            gen.ctl[r].eos = use[0]->cfg.eos_token_id;
            gen.ctl[r].n_eos = use[0]->cfg.n_eos_token_ids;
        }
    }
    trace_burst tb;
    trace_burst_begin(&tb, c ? 0 : level, o.spec ? (int)o.k : 0, sync_both, first);
    if (o.chrome) trace_burst_use_timeline(&tb, &tl);
    gen.tb = level ? &tb : NULL;
    for (int r = 0; !c && o.graph && r < ranks; r++)
        c = open_door(&o, &gen, r, o.tp.ranks ? &group.shards[r] : use[0], &tb, &rl, &door[r], &st);
    if (!c && o.receipt) c = open_receipt(&rw, &o, first[0], first[1], level, source, threads, layout, &st);

    run_reporter rep;
    double t0 = (double)trace_now_ns() * 1e-9;
    const bool generating = !c; // from here on the reporter may have written to stdout
    if (generating) {
        run_reporter_init(&rep, &o);
        run_reporter_attach(&rep, &gen.ctl[0]);
    }
    if (!c) c = o.tp.ranks ? sd_tp_group_run(&group, generate_rank, &gen, NULL, &st) : generate_rank(&gen, 0, use[0], &st);
    const double secs = (double)trace_now_ns() * 1e-9 - t0;
    const int sig = sd_cli_stop_signal;
    sd_cli_interrupt_restore();
    if (generating) run_reporter_end(&rep);
    if (!c) c = ranks_agree(&gen, ranks, &st);
    if (!c && o.ledger && !(c = run_ledger_finish(&rl, &st)))
        fprintf(stderr, "%s: selection ledger: %zu rows recorded inside the graphs, every slot written\n", cmd, rl.rows);
    const sd_gen_control *ctl = &gen.ctl[0];

    // Everything the run finished is reported and banked, interrupted or not.
    if (!c && o.spec) trace_burst_emit(&tb, o.tag, stderr);
    if (!c && o.receipt) c = receipt_add_burst(&rw, &tb, o.tag, &st);
    if (!c && o.receipt)
        c = receipt_finish(&rw, ctl->end == SD_GEN_STOPPED ? "interrupted" : "complete", run_stop_reason(ctl->end),
                           ctl->n_out, &st);
    if (!c && o.chrome) c = write_chrome(&o, &tl, first, &st);
    if (c && rw.path) receipt_finish(&rw, "failed", NULL, ctl->n_out, &(sd_status){0}); // what st says stays
    run_result res = {.tokens = gen.out[0], .n = ctl->n_out, .secs = secs, .end = ctl->end, .threads = threads,
                      .stats = o.spec ? &gen.stats[0] : NULL, .ranks = o.tp.ranks ? o.tp.ranks : 1, .layout = layout};
    if (!c && o.json) run_print_json(&o, &res);
    else if (!c) run_print_human(&o, &res);
    else if (generating && o.stream) putchar('\n'); // end the streamed tokens' line before the error
    fflush(stdout);

    if (group.abandoned) return sd_cli_fail(cmd, &st); // a rank's thread may still read what we hold
    for (int r = 0; r < ranks; r++) sd_cli_door_close(door[r]);
    if (o.ledger) run_ledger_free(&rl);
    receipt_close(&rw);
    trace_timeline_free(&tl);
    for (int r = 0; r < ranks; r++) {
        sd_state_free(&gen.ts[r]);
        sd_state_free(&gen.ds[r]);
    }
    sd_tp_group_free(&group);
    for (int i = 0; i < 2; i++) free_model(use[i] ? use[i] : &host[i]);
    for (int r = 0; r < ranks; r++) free(gen.out[r]);
    free(o.prompt);
    if (c) return sd_cli_fail(cmd, &st);
    if (ctl->end != SD_GEN_STOPPED) return 0;
    fprintf(stderr, "%s: interrupted (%s) after %d of %d tokens\n", cmd, sig == SIGTERM ? "SIGTERM" : "SIGINT",
            res.n, (int)o.max_new);
    return 128 + sig;
}
