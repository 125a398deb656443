// run_report.c — progress, streaming and the final report of `specdec run` (run_report.h).
#include "run_report.h"
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
#include "metrics.h" // trace_metrics_add_vllm
#include "trace.h"   // trace_now_ns

#define REPORT_EVERY_NS 1000000000ull

void run_reporter_init(run_reporter *r, const run_opts *o) {
    *r = (run_reporter){.tty = isatty(STDERR_FILENO), .stream = o->stream, .max_new = (int)o->max_new,
                        .n_prompt = o->n_prompt};
    r->progress = o->progress || (r->tty && !o->stream);
    r->t_last = r->t_gen = trace_now_ns();
    if (r->stream) {
        fputs("tokens:", stdout);
        fflush(stdout);
    }
}

// One progress report: a terminal line rewritten in place, or a line of its own in a log.
static void show(run_reporter *r, const char *text) {
    if (r->tty) fprintf(stderr, "\r%s\033[K", text);
    else fprintf(stderr, "%s\n", text);
    r->line_shown = r->tty;
    fflush(stderr);
}

static bool due(run_reporter *r, bool last) {
    uint64_t now = trace_now_ns();
    if (!r->progress || (!last && now - r->t_last < REPORT_EVERY_NS)) return false;
    r->t_last = now;
    return true;
}

static void on_prefill(void *ctx, int done, int total) {
    run_reporter *r = ctx;
    if (done == total) r->t_gen = trace_now_ns(); // generation's rate counts from here
    if (!due(r, done == total)) return;
    char text[128];
    snprintf(text, sizeof text, "specdec run: prefill %d/%d tokens", done, total);
    show(r, text);
}

static void report_generation(run_reporter *r, bool last) {
    if (!due(r, last)) return;
    double secs = (double)(trace_now_ns() - r->t_gen) * 1e-9;
    char text[160];
    snprintf(text, sizeof text, "specdec run: %d/%d tokens, %.1f tokens/s%s", r->generated, r->max_new,
             secs > 0 ? r->generated / secs : 0.0, last ? " (done)" : "");
    show(r, text);
}

static void on_commit(void *ctx, const int *tokens, int n) {
    run_reporter *r = ctx;
    r->generated += n;
    if (r->stream) {
        for (int i = 0; i < n; i++) printf(" %d", tokens[i]);
        fflush(stdout);
    }
    report_generation(r, false);
}

void run_reporter_attach(run_reporter *r, sd_gen_control *c) {
    c->on_prefill = on_prefill;
    c->on_commit = on_commit;
    c->ctx = r;
}

void run_reporter_end(run_reporter *r) {
    if (r->progress && !r->tty) report_generation(r, true);
    if (r->line_shown) fputs("\r\033[K", stderr);
    fflush(stderr);
}

const char *run_stop_reason(sd_gen_end end) {
    return end == SD_GEN_EOS ? "eos" : end == SD_GEN_STOPPED ? "interrupted" : "max_new";
}

void run_print_json(const run_opts *o, const run_result *res) {
    const sd_accept_stats *s = res->stats;
    cJSON *j = cJSON_CreateObject();
    cJSON_AddItemToObject(j, "tokens", cJSON_CreateIntArray(res->tokens, res->n));
    cJSON_AddNumberToObject(j, "tokens_per_s", res->secs > 0 ? res->n / res->secs : 0.0);
    cJSON_AddNumberToObject(j, "seconds", res->secs);
    cJSON_AddNumberToObject(j, "prompt_tokens", o->n_prompt);
    cJSON_AddStringToObject(j, "stop_reason", run_stop_reason(res->end));
    cJSON_AddStringToObject(j, "backend", sd_cli_backend_name(o->be));
    cJSON_AddNumberToObject(j, "threads", res->threads);
    cJSON_AddStringToObject(j, "mode", s ? "speculative" : "plain");
    cJSON_AddBoolToObject(j, "decode_graph", o->graph);
    cJSON_AddNumberToObject(j, "ranks", res->ranks);
    if (res->layout) cJSON_AddStringToObject(j, "layout", res->layout);
    if (s) {
        cJSON_AddNumberToObject(j, "k", (double)o->k);
        cJSON_AddNumberToObject(j, "rounds", (double)s->rounds);
        cJSON_AddNumberToObject(j, "drafted", (double)s->drafted);
        cJSON_AddNumberToObject(j, "accepted", (double)s->accepted);
        cJSON_AddNumberToObject(j, "acceptance_rate", sd_stats_acceptance_rate(s));
        cJSON_AddNumberToObject(j, "mean_accepted_length", sd_stats_mean_accepted_length(s));
        cJSON *pp = cJSON_AddArrayToObject(j, "per_position");
        for (int i = 0; i < o->k; i++) cJSON_AddItemToArray(pp, cJSON_CreateNumber(sd_stats_position_rate(s, i)));
        trace_metrics_add_vllm(j, s, (int)o->k);
    }
    char *txt = cJSON_PrintUnformatted(j);
    puts(txt);
    free(txt);
    cJSON_Delete(j);
}

void run_print_human(const run_opts *o, const run_result *res) {
    const sd_accept_stats *s = res->stats;
    if (!o->stream) {
        printf("tokens:");
        for (int i = 0; i < res->n; i++) printf(" %d", res->tokens[i]);
    }
    char ranks[32] = "";
    if (res->ranks > 1 || o->tp.ranks) snprintf(ranks, sizeof ranks, ", %d ranks", res->ranks);
    printf("\n%d tokens in %.3f s: %.1f tokens/s (%s, %s%s%s)\n", res->n, res->secs,
           res->secs > 0 ? res->n / res->secs : 0.0, s ? "speculative" : "plain", sd_cli_backend_name(o->be),
           o->graph ? ", graph" : "", ranks);
    if (res->end == SD_GEN_EOS) printf("stopped at the end-of-sequence id %d\n", res->tokens[res->n - 1]);
    if (!s) return;
    printf("rounds %llu, drafted %llu, accepted %llu: acceptance %.1f%%, mean accepted length %.2f (k = %ld)\n",
           (unsigned long long)s->rounds, (unsigned long long)s->drafted, (unsigned long long)s->accepted,
           100.0 * sd_stats_acceptance_rate(s), sd_stats_mean_accepted_length(s), o->k);
    printf("per position:");
    for (int i = 0; i < o->k; i++) printf(" %.2f", sd_stats_position_rate(s, i));
    printf("\n");
}
