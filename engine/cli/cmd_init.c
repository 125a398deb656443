// cmd_init.c — `specdec init`: synthesise a model directory, and optionally its derived draft.
#include <cjson/cJSON.h>
#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "args.h"
#include "commands.h"
#include "synth.h"

static const char *HELP =
    "usage: specdec init --config FILE --out DIR [--seed S] [--dtype bf16|f32]\n"
    "                    [--shard-size BYTES] [--progress] [--json]\n"
    "                    [--draft-out DIR --draft-layers N [--tail-scale E]]\n\n"
    "Synthesise DIR/config.json + DIR/model.safetensors from a config, or, above --shard-size,\n"
    "the shards model-0000N-of-0000M.safetensors + model.safetensors.index.json. The same seed\n"
    "writes the same bytes on any machine (generator and scales: engine/synth.h, engine/synth.c).\n"
    "Refused before writing when the disk lacks the space.\n\n"
    "  --config FILE      config.json to synthesise (e.g. configs/toy.json)\n"
    "  --out DIR          model directory to write (created if missing)\n"
    "  --seed S           generator seed (default 0)\n"
    "  --dtype bf16|f32   dtype of the matrices (default bf16; vectors and routing stay f32)\n"
    "  --shard-size BYTES most tensor bytes per shard (default 5GB, as the hub writes); a number\n"
    "                     with an optional suffix KB MB GB TB (powers of 1000) or KiB MiB GiB TiB\n"
    "  --progress         bytes written on stderr even when it is not a terminal\n"
    "  --json             one JSON object on stdout: the folders written, tensors, bytes, seed, dtype\n"
    "  --draft-out DIR    also write the derived draft: the target's first N layers with its\n"
    "                     embedding, final norm and head (a directory other than --out)\n"
    "  --draft-layers N   N for the draft (1..L)\n"
    "  --tail-scale E     in the target, layers N..L-1 have o_proj and every down_proj scaled by\n"
    "                     E (default 1): E = 0 makes the draft agree with the target on every\n"
    "                     token; larger E lowers acceptance toward chance\n";

// p made absolute and canonical into out (PATH_MAX): the longest prefix that exists resolved by
// realpath (symbolic links, "..", "."), the rest appended by name, "." and ".." applied. False
// when it does not fit.
static bool canonical_path(const char *p, char *out) {
    char path[PATH_MAX];
    if (snprintf(path, sizeof path, "%s", p) >= (int)sizeof path) return false;
    size_t n = strlen(path);
    while (n > 1 && path[n - 1] == '/') path[--n] = 0;
    if (realpath(path, out)) return true;
    char *slash = strrchr(path, '/');
    const char *base = slash ? slash + 1 : path;
    char parent[PATH_MAX];
    snprintf(parent, sizeof parent, "%s", slash == path ? "/" : slash ? path : ".");
    if (slash && slash != path) parent[slash - path] = 0;
    if (!canonical_path(parent, out)) return false;
    if (!strcmp(base, ".")) return true;
    if (!strcmp(base, "..")) {
        char *up = strrchr(out, '/');
        if (up && up != out) *up = 0;
        else snprintf(out, PATH_MAX, "/");
        return true;
    }
    const size_t len = strlen(out);
    return snprintf(out + len, PATH_MAX - len, "%s%s", len > 1 ? "/" : "", base) < (int)(PATH_MAX - len);
}

// "5GB", "500MB", "1GiB", "123": a byte count > 0 (decimal suffixes as the hub's max_shard_size).
static bool parse_size(const char *opt, const char *s, uint64_t *out, sd_status *st) {
    static const struct { const char *suffix; uint64_t mul; } units[] = {
        {"", 1}, {"B", 1}, {"KB", 1000}, {"MB", 1000000}, {"GB", 1000000000}, {"TB", 1000000000000},
        {"KiB", 1ull << 10}, {"MiB", 1ull << 20}, {"GiB", 1ull << 30}, {"TiB", 1ull << 40},
    };
    const char *p = s;
    uint64_t v = 0;
    while (isdigit((unsigned char)*p)) {
        if (v > (UINT64_MAX - 9) / 10) break;
        v = v * 10 + (uint64_t)(*p++ - '0');
    }
    for (size_t i = 0; p > s && i < sizeof units / sizeof units[0]; i++) {
        if (strcasecmp(p, units[i].suffix) != 0) continue;
        if (v == 0 || v > UINT64_MAX / units[i].mul) break;
        *out = v * units[i].mul;
        return true;
    }
    sd_fail(st, SD_ERR_USAGE, "%s must be a byte count > 0 with an optional suffix (KB, MB, GB, TB, KiB, MiB, GiB, TiB), "
            "got '%s'", opt, s);
    return false;
}

typedef struct {
    const char *cmd, *dir;
    bool tty;
    uint64_t shown; // bytes at the last line printed
} progress_ctx;

// One line rewritten in place on a terminal (every 0.5%), else a line every 10% and at the end.
static void report_progress(void *ctx, uint64_t done, uint64_t total) {
    progress_ctx *p = ctx;
    if (done < p->shown) p->shown = 0; // the next model
    if (done < total && done - p->shown < total / (p->tty ? 200 : 10)) return;
    p->shown = done;
    fprintf(stderr, "%s%s: %s: wrote %.1f of %.1f MB%s", p->tty ? "\r" : "", p->cmd, p->dir, done / 1e6, total / 1e6,
            p->tty && done < total ? "" : "\n");
}

int cmd_init(int argc, char **argv) {
    const char *cmd = "specdec init";
    sd_args a;
    sd_args_init(&a, cmd, argc, argv);
    if (sd_args_help(&a)) { fputs(HELP, stdout); sd_args_free(&a); return 0; }
    const char *config = sd_args_str(&a, "--config"), *out = sd_args_str(&a, "--out");
    const char *seed_s = sd_args_str(&a, "--seed"), *dtype_s = sd_args_str(&a, "--dtype");
    const char *draft_out = sd_args_str(&a, "--draft-out"), *layers_s = sd_args_str(&a, "--draft-layers");
    const char *tail_s = sd_args_str(&a, "--tail-scale"), *shard_s = sd_args_str(&a, "--shard-size");
    const bool progress = sd_args_flag(&a, "--progress"), json = sd_args_flag(&a, "--json");
    bool ok = sd_args_done(&a);
    sd_args_free(&a);
    if (!ok) return EXIT_USAGE;

    sd_status st = {0};
    sd_synth_opts o = {.seed = 0, .dtype = SD_DT_BF16, .tail_from = SD_MAX_LAYERS, .tail_scale = 1.0f};
    long n_draft = 0;
    double tail = 1.0;
    if (!config || !out) { sd_fail(&st, SD_ERR_USAGE, "--config and --out are required (see --help)"); return sd_cli_fail(cmd, &st); }
    if (seed_s && !sd_parse_u64("--seed", seed_s, &o.seed, &st)) return sd_cli_fail(cmd, &st);
    if (dtype_s && strcmp(dtype_s, "bf16") && strcmp(dtype_s, "f32")) {
        sd_fail(&st, SD_ERR_USAGE, "--dtype must be bf16 or f32, got '%s'", dtype_s);
        return sd_cli_fail(cmd, &st);
    }
    if (dtype_s && !strcmp(dtype_s, "f32")) o.dtype = SD_DT_F32;
    if (!draft_out != !layers_s) {
        sd_fail(&st, SD_ERR_USAGE, "--draft-out and --draft-layers go together");
        return sd_cli_fail(cmd, &st);
    }
    if (tail_s && !layers_s) {
        sd_fail(&st, SD_ERR_USAGE, "--tail-scale needs --draft-out and --draft-layers");
        return sd_cli_fail(cmd, &st);
    }
    char out_abs[PATH_MAX], draft_abs[PATH_MAX];
    if (draft_out && canonical_path(out, out_abs) && canonical_path(draft_out, draft_abs) && !strcmp(out_abs, draft_abs)) {
        sd_fail(&st, SD_ERR_USAGE, "--draft-out %s is --out %s (%s): the draft would overwrite the target", draft_out, out,
                out_abs);
        return sd_cli_fail(cmd, &st);
    }
    if (layers_s && !sd_parse_int("--draft-layers", layers_s, 1, SD_MAX_LAYERS, &n_draft, &st)) return sd_cli_fail(cmd, &st);
    if (tail_s && !sd_parse_float("--tail-scale", tail_s, 0.0, 1e6, &tail, &st)) return sd_cli_fail(cmd, &st);
    sd_ckpt_write_opts wo = {.shard_bytes = SD_CKPT_DEFAULT_SHARD_BYTES};
    if (shard_s && !parse_size("--shard-size", shard_s, &wo.shard_bytes, &st)) return sd_cli_fail(cmd, &st);
    progress_ctx pc = {.cmd = cmd, .tty = isatty(STDERR_FILENO)};
    if (progress || pc.tty) { wo.progress = report_progress; wo.progress_ctx = &pc; }

    sd_config cfg, dcfg;
    if (sd_config_load(config, &cfg, &st)) return sd_cli_fail(cmd, &st);
    if (draft_out && sd_draft_config(&cfg, (int)n_draft, &dcfg, &st)) return sd_cli_fail(cmd, &st);
    if (draft_out) { o.tail_from = (int)n_draft; o.tail_scale = (float)tail; o.depth = cfg.num_hidden_layers; }

    // Both folders are staged before either is committed: a failure (or a signal: the stages are
    // registered for removal) leaves neither folder half-written, and a draft never lands without
    // its target.
    sd_model m;
    sd_model_staged target = {0}, draft = {0};
    if (sd_synth_model(&m, &cfg, &o, &st)) return sd_cli_fail(cmd, &st);
    pc.dir = out;
    sd_code rc = sd_model_stage(&m, out, &wo, &target, &st);
    const int n_specs = m.w.n_specs;
    const size_t bytes = m.w.arena_bytes;
    const double mb = bytes / 1e6;
    sd_model_free(&m);
    if (!rc && draft_out) {
        rc = sd_synth_model(&m, &dcfg, &o, &st);
        if (!rc) {
            pc.dir = draft_out;
            rc = sd_model_stage(&m, draft_out, &wo, &draft, &st);
            sd_model_free(&m);
        }
    }
    // "wrote" is said once everything is written: the target, then the draft.
    if (!rc) rc = sd_model_commit(&target, &st);
    if (!rc && draft_out) rc = sd_model_commit(&draft, &st);
    if (!rc) fprintf(stderr, "%s: wrote %s (%d tensors, %.1f MB)\n", cmd, out, n_specs, mb);
    if (!rc && draft_out)
        fprintf(stderr, "%s: wrote draft %s (%d of %d layers)\n", cmd, draft_out, dcfg.num_hidden_layers, cfg.num_hidden_layers);
    if (!rc && json) {
        cJSON *j = cJSON_CreateObject();
        cJSON_AddStringToObject(j, "out", out);
        cJSON_AddNumberToObject(j, "tensors", n_specs);
        cJSON_AddNumberToObject(j, "bytes", (double)bytes);
        cJSON_AddNumberToObject(j, "seed", (double)o.seed);
        cJSON_AddStringToObject(j, "dtype", o.dtype == SD_DT_BF16 ? "bf16" : "f32");
        if (draft_out) {
            cJSON_AddStringToObject(j, "draft", draft_out);
            cJSON_AddNumberToObject(j, "draft_layers", dcfg.num_hidden_layers);
        } else {
            cJSON_AddNullToObject(j, "draft");
        }
        char *txt = cJSON_PrintUnformatted(j);
        puts(txt);
        free(txt);
        cJSON_Delete(j);
    }
    sd_model_discard(&target);
    sd_model_discard(&draft);
    return rc ? sd_cli_fail(cmd, &st) : 0;
}
