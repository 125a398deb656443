// receipt.h — banked phase-share receipts (DESIGN.md "Receipts").
//
// A receipt is a JSONL file: line 1 {"kind":"env",...}, then one {"kind":"burst",...} per
// burst, then {"kind":"end","status":"complete"|"interrupted",...} when the run closed it. A
// burst record holds exactly the numbers its trace lines print (the writer formats the trace
// line and parses it back), so parsing a banked trace log and loading a receipt of the same run
// give identical records; the acceptance counts ride beside them, under our names and vLLM's
// (metrics.h).
//
// The writer keeps every line in memory and, after the env line and after every burst,
// rewrites the whole file atomically (atomic_file.h): a run that dies leaves the finished bursts
// readable and never a partial file.
#pragma once
#include "trace.h"  // trace_burst (sample.h: SD_STATS_MAX_POSITIONS)
#include "status.h"
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stddef.h>

#define RECEIPT_TAG_MAX 64

// The run's environment, the receipt's first line. NULL strings are written as null.
typedef struct receipt_env {
    const char *version, *commit;
    const char *config_sha256, *weights_sha256, *draft_sha256;
    const char *backend, *device, *driver;
    const char *tp_layout; // a tensor-parallel run's ranks and what each holds (NULL: one device)
    bool decode_graph;     // the rounds ran through the decode-graph door (captured CUDA graphs)
    const char *tag;
    const char *flags; // the SPECDEC_* settings of the run, e.g. "SPECDEC_SPEC_TRACE=1"
    const char *trace_level_source; // what set trace_level: "--trace", "--receipt", "environment", ...
    const char *cpu_model;          // the host CPU ("model name" of /proc/cpuinfo)
    int cpu_threads;                // threads of the CPU backend
    const char *omp_wait_policy;    // OMP_WAIT_POLICY as the OpenMP runtime read it (NULL: unset)
    int k;
    uint64_t seed;     // written as an exact integer
    double temperature;
    int trace_level;
} receipt_env;

// One burst, as its trace lines print it. Milliseconds; the %.2f / %.3f values of the lines.
typedef struct receipt_burst {
    char tag[RECEIPT_TAG_MAX];
    uint64_t rounds;
    int k;
    double total_ms;                         // burst total (sum of the five phases)
    double phase_ms[TRACE_N_PHASES];         // burst totals, indexed by trace_phase
    double per_round_ms[TRACE_N_PHASES];     // per round, indexed by trace_phase
    double per_round_total_ms;
    int has_v;                               // the level-2 line was present
    double v_ms[TRACE_N_BUCKETS];            // per round, indexed by trace_bucket
    double vrest_ms;                         // per round
    int64_t drafted, accepted, emitted;      // acceptance counts; -1 = unknown (parsed logs)
    int has_positions;                       // per_position and histogram known (k entries, k+1)
    uint64_t per_position[SD_STATS_MAX_POSITIONS];  // vLLM's num_accepted_tokens_per_pos
    uint64_t histogram[SD_STATS_MAX_POSITIONS + 1]; // rounds that accepted exactly n drafts
} receipt_burst;

// A set of burst records (from a log or a receipt) and the receipt's env line, if any.
typedef struct receipt_set {
    receipt_burst *bursts;
    size_t n, cap;
    char *env_json;  // the env line as read (NULL: none, e.g. a parsed log)
    int ended;       // an end line was read
    int interrupted; // ... and it says the run was interrupted
} receipt_set;

void receipt_set_free(receipt_set *s);

// ---- writing a receipt during a run ----
typedef struct receipt_writer {
    char *path;
    char **lines; // every line written so far, without newlines
    size_t n, cap;
} receipt_writer;

// Starts the receipt at `path` with the env line (written atomically before returning).
sd_code receipt_open(receipt_writer *w, const char *path, const receipt_env *env, sd_status *st);
// Appends one burst (b->level >= 1; a burst with 0 rounds is skipped) and rewrites the file.
// tag NULL = "spec".
sd_code receipt_add_burst(receipt_writer *w, const trace_burst *b, const char *tag, sd_status *st);
// Appends the closing line {"kind":"end","status":...,"stop_reason":...,"tokens":N} and rewrites
// the file: status "complete", or "interrupted" when a signal ended the run.
sd_code receipt_finish(receipt_writer *w, const char *status, const char *stop_reason, int tokens, sd_status *st);
// Frees the writer; the file on disk is already complete.
void receipt_close(receipt_writer *w);

// ---- reading ----
// Scans text for "[TAG-phase] ..." lines of any TAG (anywhere in a line, so logger prefixes
// are fine) and pairs each "[TAG-phase-v] ..." line with the latest [TAG-phase] record of the
// same TAG. Other lines are ignored. A line carrying a trace marker that does not parse, or a
// -v line with no phase line to pair, is an error naming `name` and the line number.
// Records are appended to `out`.
sd_code receipt_parse_text(const char *text, const char *name, receipt_set *out, sd_status *st);
// receipt_parse_text on a file's contents; a file with no trace line at all is an error.
sd_code receipt_parse_file(const char *path, receipt_set *out, sd_status *st);
// Reads a JSONL receipt (env line kept in out->env_json; burst lines as records).
sd_code receipt_load(const char *path, receipt_set *out, sd_status *st);
// Either form: a receipt when the first non-blank character is '{', else a trace log.
sd_code receipt_read_any(const char *path, receipt_set *out, sd_status *st);

// Writes the set as JSONL: its env line if any, then one burst line per record.
sd_code receipt_write_jsonl(const receipt_set *s, FILE *out, sd_status *st);

// ---- comparing (receipt_compare.c) ----
#define RECEIPT_N_VROWS 5      // vkda, scan, vmla, vrest, vffn
#define RECEIPT_MAX_ENV_DIFFS 8

typedef struct receipt_row {
    const char *name;   // "draft" ... "maint", then "vkda" ... "vffn"
    int verify_split;   // 0: share of the round, 1: share of verify
    double a, b, diff;  // percent, percent, b - a in percentage points
    int over;           // |diff| > tolerance
} receipt_row;

typedef struct receipt_side {
    size_t n_bursts;
    uint64_t rounds;
    int k, k_mixed, has_v, has_env, interrupted;
} receipt_side;

typedef struct receipt_comparison {
    char tag[RECEIPT_TAG_MAX];
    double tol_pp;
    receipt_side side[2];                   // A, B
    receipt_row rows[TRACE_N_PHASES + RECEIPT_N_VROWS];
    int n_rows, n_over;
    int v_only;                             // 0, or 1 / 2: only A / B carries level-2 lines
    // What makes two receipts measure different things: config, weights, draft weights, k,
    // backend, as their env lines give them (only where both have one).
    int n_env_diffs;
    char env_diffs[RECEIPT_MAX_ENV_DIFFS][192]; // "k (A 3, B 4)"
} receipt_comparison;

// Sums each phase over the bursts of each set and compares shares (percent of the five-phase
// total); when both sets carry level-2 data, also the verify sub-split (percent of verify, over
// the bursts that carry it). A row is over when |diff| > tol_pp percentage points. The env
// lines' differences are listed, not judged: the caller refuses or warns.
// tag: compare only bursts of this TAG; NULL = each set must hold exactly one TAG and the
// two must be equal. Errors (SD_ERR_DATA): a set with no bursts (of the tag), mixed or
// mismatched tags, a zero phase total, an env line that is not JSON. SD_ERR_USAGE: tol_pp
// negative or not finite.
sd_code receipt_compare(const receipt_set *a, const receipt_set *b, const char *tag, double tol_pp,
                        receipt_comparison *c, sd_status *st);
// The side-by-side table ("phase A% B% diff(pp)" rows) and its verdict line.
void receipt_comparison_print(const receipt_comparison *c, FILE *out);
// The same as one JSON object (malloc'd text, no newline; NULL when out of memory).
char *receipt_comparison_json(const receipt_comparison *c, int forced);
