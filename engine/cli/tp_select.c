// tp_select.c — see tp_select.h.
#include "tp_select.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "parallel/watchdog.h"     // SD_TP_TIMEOUT_DEFAULT_S
#ifdef SPECDEC_HAVE_CUDA
#include "cuda_tp.h"               // sd_cuda_tp_group_init, sd_cuda_tp_devices
#include "nccl_comm.h"             // sd_nccl_available
#endif

#define TP_TIMEOUT_ENV "SPECDEC_TP_TIMEOUT"

sd_cli_tp_args sd_cli_tp_read(sd_args *a) {
    return (sd_cli_tp_args){.tp = sd_args_str(a, "--tp"), .timeout = sd_args_str(a, "--tp-timeout"),
                            .stop = sd_args_str(a, "--tp-stop"), .rank = sd_args_str(a, "--rank"),
                            .nccl_id = sd_args_str(a, "--nccl-id")};
}

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

sd_code sd_cli_tp_parse(const sd_cli_tp_args *a, sd_cli_tp *out, sd_status *st) {
    memset(out, 0, sizeof *out);
    out->timeout_s = SD_TP_TIMEOUT_DEFAULT_S;
    out->rank = -1;
    out->canary_layer = -1;
    const char *needs_tp = a->timeout ? "tp-timeout" : a->stop ? "tp-stop" : a->rank ? "rank" : a->nccl_id ? "nccl-id" : NULL;
    if (!a->tp && needs_tp) return sd_fail(st, SD_ERR_USAGE, "--%s needs --tp", needs_tp);
    if (!a->tp) return SD_OK;
    long n;
    if (!sd_parse_int("--tp", a->tp, 1, SD_TP_MAX_RANKS, &n, st)) return st->code;
    out->ranks = (int)n;
    const char *env = getenv(TP_TIMEOUT_ENV);
    if (!a->timeout && env && !sd_parse_float(TP_TIMEOUT_ENV, env, 1e-3, 3600, &out->timeout_s, st)) return st->code;
    if (a->timeout && !sd_parse_float("--tp-timeout", a->timeout, 1e-3, 3600, &out->timeout_s, st)) return st->code;
    if (a->stop && !parse_stop(a->stop, out, st)) return st->code;
    if (!a->rank != !a->nccl_id) return sd_fail(st, SD_ERR_USAGE, "--rank and --nccl-id come together (one process per GPU)");
    if (a->nccl_id && !*a->nccl_id) return sd_fail(st, SD_ERR_USAGE, "--nccl-id must not be empty");
    long r;
    if (a->rank && !sd_parse_int("--rank", a->rank, 0, out->ranks - 1, &r, st)) return st->code;
    if (a->rank) out->rank = (int)r;
    out->nccl_id = a->nccl_id;
    return SD_OK;
}

sd_code sd_cli_tp_check_backend(sd_cli_tp *tp, sd_cli_backend be, sd_status *st) {
    tp->backend = be;
    if (!tp->ranks) return SD_OK;
    if (be == SD_CLI_BACKEND_CPU && tp->rank >= 0)
        return sd_fail(st, SD_ERR_USAGE, "--rank needs --backend cuda (the CPU's emulated ranks run in one process)");
#ifdef SPECDEC_HAVE_CUDA
    if (be == SD_CLI_BACKEND_CUDA && !sd_nccl_available())
        return sd_fail(st, SD_ERR_UNSUPPORTED, "--tp with --backend cuda: this build has no NCCL");
#endif
    return SD_OK;
}

int sd_cli_tp_local_ranks(const sd_cli_tp *tp) { return tp->ranks && tp->rank < 0 ? tp->ranks : 1; }

sd_code sd_cli_tp_to_backend(const sd_cli_tp *tp, sd_model *host, sd_model *dev, sd_model **use, sd_status *st) {
    if (tp->ranks && tp->backend == SD_CLI_BACKEND_CUDA) {
        *use = host;
        return SD_OK;
    }
    return sd_cli_to_backend(tp->backend, host, dev, use, st);
}

sd_code sd_cli_tp_group(const sd_cli_tp *tp, const sd_model *full, const sd_model *draft, sd_tp_group *g, sd_status *st) {
#ifdef SPECDEC_HAVE_CUDA
    if (tp->backend == SD_CLI_BACKEND_CUDA) {
        const sd_cuda_tp_opts o = {.ranks = tp->ranks, .rank = tp->rank, .nccl_id = tp->nccl_id, .timeout_s = tp->timeout_s,
                                   .stop_rank = tp->stop_rank, .stop_at = tp->stop_at, .canary_rank = tp->canary_rank,
                                   .canary_layer = tp->canary_layer};
        return sd_cuda_tp_group_init(g, full, draft, &o, st);
    }
#endif
    (void)draft; // the CPU's ranks share the host draft (sd_tp_group_draft)
    const sd_tp_group_opts o = {.ranks = tp->ranks, .timeout_s = tp->timeout_s, .canary_rank = tp->canary_rank,
                                .canary_layer = tp->canary_layer, .stop_rank = tp->stop_rank, .stop_at = tp->stop_at};
    return sd_tp_group_init(g, full, &o, st);
}

const char *sd_cli_tp_layout(const sd_tp_group *g, char *buf, size_t len) {
    if (!g->ranks) return NULL;
    sd_tp_plan_describe(&g->plan, buf, len);
#ifdef SPECDEC_HAVE_CUDA
    if (g->shards && g->shards[0].backend) {
        const size_t at = strlen(buf);
        if (at + 12 < len) {
            snprintf(buf + at, len - at, "; devices: ");
            sd_cuda_tp_devices(g, buf + strlen(buf), len - strlen(buf));
        }
    }
#endif
    return buf;
}
