// run_report.h — what `specdec run` shows while and after it generates: progress on stderr
// (about once a second), the tokens streamed as rounds commit them, and the final report
// (human text or one JSON object).
#pragma once
#include <stdbool.h>
#include <stdint.h>
#include "generate.h"    // sd_gen_control, sd_gen_end
#include "run_options.h" // run_opts
#include "sample.h"      // sd_accept_stats

typedef struct run_reporter {
    bool progress;   // progress on stderr
    bool tty;        // ... rewriting one terminal line (else one line per report, for logs)
    bool stream;     // tokens to stdout as they commit
    bool line_shown; // a terminal progress line is on screen
    int max_new, n_prompt, generated;
    uint64_t t_gen, t_last; // clock at the first commit's stage start, and at the last report
} run_reporter;

// Progress shows when --progress, or when stderr is a terminal and --stream is off.
void run_reporter_init(run_reporter *r, const run_opts *o);
// Hooks the reporter into a generation control (on_prefill, on_commit).
void run_reporter_attach(run_reporter *r, sd_gen_control *c);
// After the generation: the last log line, or the terminal line cleared.
void run_reporter_end(run_reporter *r);

// The run's outcome, for the final report.
typedef struct run_result {
    const int *tokens;
    int n;
    double secs;
    sd_gen_end end;
    int threads;
    const sd_accept_stats *stats; // NULL on a plain run
    int ranks;                    // tensor-parallel ranks (1: one device)
    const char *layout;           // what each rank holds (NULL: one device)
} run_result;

const char *run_stop_reason(sd_gen_end end); // "max_new", "eos", "interrupted"
void run_print_json(const run_opts *o, const run_result *res);
// After --stream the tokens are already out: only the line break and the summary follow.
void run_print_human(const run_opts *o, const run_result *res);
