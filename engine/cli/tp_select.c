// tp_select.c — see tp_select.h.
#include "tp_select.h"
#include <stdlib.h>
#include <string.h>
#include "args.h"                  // sd_parse_int, sd_parse_float
#include "parallel/watchdog.h"     // SD_TP_TIMEOUT_DEFAULT_S

#define TP_TIMEOUT_ENV "SPECDEC_TP_TIMEOUT"

static bool parse_stop(const char *s, sd_cli_tp *out, sd_status *st) {
    const char *colon = s ? strchr(s, ':') : NULL;
    char rank[32];
    long r, n;
    if (!colon || (size_t)(colon - s) >= sizeof rank) {
        sd_fail(st, SD_ERR_USAGE, "--tp-stop must be RANK:COLLECTIVE (e.g. 2:40), got '%s'", s);
        return false;
    }
    memcpy(rank, s, (size_t)(colon - s));
    rank[colon - s] = 0;
    if (!sd_parse_int("--tp-stop (rank)", rank, 0, out->ranks - 1, &r, st) ||
        !sd_parse_int("--tp-stop (collective)", colon + 1, 1, 1L << 40, &n, st))
        return false;
    out->stop_rank = (int)r;
    out->stop_at = (uint64_t)n;
    return true;
}

sd_code sd_cli_tp_parse(const char *tp, const char *timeout, const char *stop, sd_cli_tp *out, sd_status *st) {
    memset(out, 0, sizeof *out);
    out->timeout_s = SD_TP_TIMEOUT_DEFAULT_S;
    if (!tp && (timeout || stop)) return sd_fail(st, SD_ERR_USAGE, "--%s needs --tp", timeout ? "tp-timeout" : "tp-stop");
    if (!tp) return SD_OK;
    long n;
    if (!sd_parse_int("--tp", tp, 1, SD_TP_MAX_RANKS, &n, st)) return st->code;
    out->ranks = (int)n;
    const char *env = getenv(TP_TIMEOUT_ENV);
    if (!timeout && env && !sd_parse_float(TP_TIMEOUT_ENV, env, 1e-3, 3600, &out->timeout_s, st)) return st->code;
    if (timeout && !sd_parse_float("--tp-timeout", timeout, 1e-3, 3600, &out->timeout_s, st)) return st->code;
    if (stop && !parse_stop(stop, out, st)) return st->code;
    return SD_OK;
}

sd_code sd_cli_tp_check_backend(const sd_cli_tp *tp, sd_cli_backend be, sd_status *st) {
    if (tp->ranks && be == SD_CLI_BACKEND_CUDA)
        return sd_fail(st, SD_ERR_UNSUPPORTED, "--tp with --backend cuda: not built yet");
    return SD_OK;
}

sd_code sd_cli_tp_group(const sd_cli_tp *tp, const sd_model *full, sd_tp_group *g, sd_status *st) {
    const sd_tp_group_opts o = {.ranks = tp->ranks, .timeout_s = tp->timeout_s, .canary_layer = -1,
                                .stop_rank = tp->stop_rank, .stop_at = tp->stop_at};
    return sd_tp_group_init(g, full, &o, st);
}

const char *sd_cli_tp_layout(const sd_tp_group *g, char *buf, size_t len) {
    if (!g->ranks) return NULL;
    sd_tp_plan_describe(&g->plan, buf, len);
    return buf;
}
