// cmd_forward.c — `specdec forward`: teacher-forced logits of every position to safetensors.
#include <cjson/cJSON.h>
#include <unistd.h>      // getpid
#include "atomic_file.h" // sd_atomic_check_target
#include "cleanup.h"     // sd_cleanup_add
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "args.h"
#include "backend_select.h" // sd_cli_backend_*
#include "commands.h"
#include "model.h"
#include "sample.h"    // sd_argmax
#include "trace.h"     // trace_now_ns
#include "tp_select.h" // sd_cli_tp_*

static const char *HELP =
    "usage: specdec forward --model DIR --tokens 1,2,3,... --out FILE\n"
    "                       [--mode decode|verify|prefill] [--chunk N] [--backend cpu|cuda] [--tp N] [--json]\n\n"
    "Teacher-forced forward of the token sequence from position 0. Writes FILE (safetensors):\n"
    "`logits` F32 [T, V] (row t = the logits after token t) and `tokens` I32 [T].\n\n"
    "  --mode decode   one token per forward (default)\n"
    "  --mode verify   forwards of --chunk N tokens (default 5 = k+1 for k = 4; --chunk with --mode\n"
    "                  decode is a usage error)\n"
    "  --mode prefill  the sequence as one prompt (sd_prefill): on a GPU, more than 32 tokens take the\n"
    "                  prefill path (GEMMs, chunked KDA, flash MLA), equal to decode within MODEL.md's\n"
    "                  GPU tolerance, not bit for bit; otherwise forwards of --chunk N tokens\n"
    "  --backend cpu|cuda  default: the GPU when one is visible and this build has CUDA, else the CPU\n"
    "  --json          one JSON object on stdout: the file written, positions, vocabulary, mode,\n"
    "                  backend, ranks, seconds, and each position's argmax\n"
    SD_CLI_TP_HELP
    "On one backend both modes give bit-identical logits (the verify ≡ decode law), with --tp too.\n";

// The teacher-forced pass on one model (a rank's shard with --tp: every rank runs it, rank 0's
// logits are written; the others land in their own buffers, bit-identical).
typedef struct {
    const int *tokens;
    int T, chunk;
    bool prefill;  // the sequence as one prompt (sd_prefill_rows), not forwards of `chunk`
    float *logits; // (T, V)
} forced;

static sd_code forced_rank(void *ctx, int rank, const sd_model *m, sd_status *st) {
    const forced *f = ctx;
    const int V = m->cfg.vocab_size;
    sd_state s = {0};
    float *logits = rank ? malloc(sizeof(float) * (size_t)f->T * V) : f->logits;
    sd_code rc = logits ? sd_model_state_init(m, &s, f->T, f->chunk, st) : sd_fail(st, SD_ERR_SYS, "out of memory");
    if (!rc && f->prefill) rc = sd_prefill_rows(m, &s, f->tokens, f->T, logits, true, NULL, st);
    for (int t = 0; !rc && !f->prefill && t < f->T; t += f->chunk) {
        int n = f->T - t < f->chunk ? f->T - t : f->chunk;
        rc = sd_forward(m, &s, f->tokens + t, n, logits + (size_t)t * V, 0, NULL, st);
        if (!rc) rc = sd_state_commit(&s, n, st);
    }
    sd_state_free(&s);
    if (rank) free(logits);
    return rc;
}

// --json: what was written, and each position's argmax (ties: the lower id, as sd_argmax).
static void print_json(const char *out, const float *logits, int T, int V, const char *mode, const char *backend, int ranks,
                       double secs) {
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "out", out);
    cJSON_AddNumberToObject(j, "positions", T);
    cJSON_AddNumberToObject(j, "vocab", V);
    cJSON_AddStringToObject(j, "mode", mode);
    cJSON_AddStringToObject(j, "backend", backend);
    cJSON_AddNumberToObject(j, "ranks", ranks);
    cJSON_AddNumberToObject(j, "seconds", secs);
    cJSON *am = cJSON_AddArrayToObject(j, "argmax");
    for (int t = 0; t < T; t++) cJSON_AddItemToArray(am, cJSON_CreateNumber(sd_argmax(logits + (size_t)t * V, V)));
    char *txt = cJSON_PrintUnformatted(j);
    puts(txt);
    free(txt);
    cJSON_Delete(j);
}

int cmd_forward(int argc, char **argv) {
    const char *cmd = "specdec forward";
    sd_args a;
    sd_args_init(&a, cmd, argc, argv);
    if (sd_args_help(&a)) { fputs(HELP, stdout); sd_args_free(&a); return 0; }
    const char *dir = sd_args_str(&a, "--model"), *tokens_s = sd_args_str(&a, "--tokens");
    const char *out = sd_args_str(&a, "--out"), *mode = sd_args_str(&a, "--mode");
    const char *chunk_s = sd_args_str(&a, "--chunk"), *backend = sd_args_str(&a, "--backend");
    const sd_cli_tp_args tpa = sd_cli_tp_read(&a);
    const bool json = sd_args_flag(&a, "--json");
    bool ok = sd_args_done(&a);
    sd_args_free(&a);
    if (!ok) return EXIT_USAGE;

    sd_status st = {0};
    long chunk = 5;
    int *tokens = NULL, T = 0;
    if (!dir || !tokens_s || !out) { sd_fail(&st, SD_ERR_USAGE, "--model, --tokens and --out are required (see --help)"); return sd_cli_fail(cmd, &st); }
    if (mode && strcmp(mode, "decode") && strcmp(mode, "verify") && strcmp(mode, "prefill")) {
        sd_fail(&st, SD_ERR_USAGE, "--mode must be decode, verify or prefill, got '%s'", mode);
        return sd_cli_fail(cmd, &st);
    }
    // An existing --out that is not a regular file (a link, FIFO, device) is refused, not replaced.
    if (sd_atomic_check_target(out, 0, &st)) return sd_cli_fail(cmd, &st);
    sd_cli_backend be;
    if (sd_cli_backend_parse(backend, &be, &st)) return sd_cli_fail(cmd, &st);
    if (chunk_s && !sd_parse_int("--chunk", chunk_s, 1, 64, &chunk, &st)) return sd_cli_fail(cmd, &st);
    if (chunk_s && (!mode || !strcmp(mode, "decode"))) {
        sd_fail(&st, SD_ERR_USAGE, "--chunk does nothing with --mode decode (one token per forward): give --mode verify");
        return sd_cli_fail(cmd, &st);
    }
    sd_cli_tp tp;
    if (sd_cli_tp_parse(&tpa, &tp, &st)) return sd_cli_fail(cmd, &st);
    if (!mode || !strcmp(mode, "decode")) chunk = 1;
    if (!sd_parse_int_list("--tokens", tokens_s, &tokens, &T, &st)) return sd_cli_fail(cmd, &st);

    sd_model host, dev, *m = &host;
    memset(&host, 0, sizeof host);
    memset(&dev, 0, sizeof dev);
    sd_tp_group g = {0};
    float *logits = NULL;
    // An explicit cuda is refused before resolving it (which needs a device), auto's choice after.
    sd_code rc = sd_cli_tp_check_backend(&tp, be, &st);
    if (!rc) rc = sd_cli_backend_resolve(&be, &st);
    if (!rc) rc = sd_cli_tp_check_backend(&tp, be, &st);
    if (!rc) rc = sd_model_load(&host, dir, &st);
    if (!rc) rc = sd_cli_tp_to_backend(&tp, &host, &dev, &m, &st);
    if (!rc && tp.ranks) rc = sd_cli_tp_group(&tp, m, NULL, &g, &st);
    const int V = m->cfg.vocab_size;
    if (!rc && !(logits = malloc(sizeof(float) * (size_t)T * V))) rc = sd_fail(&st, SD_ERR_SYS, "out of memory");
    const bool prefill = mode && !strcmp(mode, "prefill");
    forced f = {.tokens = tokens, .T = T, .chunk = (int)chunk, .prefill = prefill, .logits = logits};
    const uint64_t t0 = trace_now_ns();
    if (!rc) rc = tp.ranks ? sd_tp_group_run(&g, forced_rank, &f, NULL, &st) : forced_rank(&f, 0, m, &st);
    const double secs = (double)(trace_now_ns() - t0) * 1e-9;
    if (!rc) {
        sd_st_tensor t[2] = {
            {.name = "logits", .dtype = SD_DT_F32, .ndim = 2, .shape = {T, V}, .data = logits, .nbytes = sizeof(float) * (size_t)T * V},
            {.name = "tokens", .dtype = SD_DT_I32, .ndim = 1, .shape = {T}, .data = tokens, .nbytes = sizeof(int) * (size_t)T},
        };
        char tmp[4200]; // sd_st_write's temporary beside out (safetensors.c), removed if a signal ends us
        snprintf(tmp, sizeof tmp, "%s.tmp.%ld", out, (long)getpid());
        const int slot = sd_cleanup_add(tmp, false);
        rc = sd_st_write(out, t, 2, &st);
        sd_cleanup_drop(slot);
    }
    char ranks[32] = "";
    if (tp.ranks) snprintf(ranks, sizeof ranks, ", %d ranks", tp.ranks);
    const char *mode_name = prefill ? "prefill" : chunk > 1 ? "verify" : "decode";
    if (!rc)
        fprintf(stderr, "%s: wrote %s (%d positions, %s mode, %s%s)\n", cmd, out, T, mode_name, sd_cli_backend_name(be),
                ranks);
    if (!rc && json) print_json(out, logits, T, V, mode_name, sd_cli_backend_name(be), tp.ranks ? tp.ranks : 1, secs);
    if (g.abandoned) return sd_cli_fail(cmd, &st); // a rank's thread may still read what we hold
    free(logits);
    free(tokens);
    sd_tp_group_free(&g);
    if (m->w.arena || m->backend) sd_model_free(m);
    return rc ? sd_cli_fail(cmd, &st) : 0;
}
