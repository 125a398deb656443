// tp_select.h — the CLI's tensor-parallel options (run, forward): --tp N, --tp-timeout S (or
// SPECDEC_TP_TIMEOUT), --tp-stop R:N, and the group they ask for. The CPU runs N emulated ranks
// (engine/parallel/ranks.h); the cuda backend is refused until its ranks exist.
#pragma once
#include "backend_select.h"   // sd_cli_backend
#include "parallel/ranks.h"   // sd_tp_group

typedef struct {
    int ranks;         // 0: --tp not given (one device, no group)
    double timeout_s;  // every collective's timeout
    int stop_rank;     // --tp-stop R:N (the watchdog's fault): rank R stops answering at its
    uint64_t stop_at;  //   collective #N; stop_at 0: none
} sd_cli_tp;

// The lines each command's --help adds.
#define SD_CLI_TP_HELP                                                                            \
    "  --tp N              run as N tensor-parallel ranks (emulated on the CPU: N threads, each\n" \
    "                      holding its shard; docs/PARALLEL.md)\n"                                 \
    "  --tp-timeout S      every collective's timeout in seconds (default SPECDEC_TP_TIMEOUT, else\n" \
    "                      5): a rank that does not arrive in time fails the run, naming it\n"    \
    "  --tp-stop R:N       fault injection: rank R stops answering at its collective #N\n"

// Read the three options' values (NULL: not given) and the environment. Usage errors name the
// option or variable.
sd_code sd_cli_tp_parse(const char *tp, const char *timeout, const char *stop, sd_cli_tp *out, sd_status *st);

// Refuse a group on a backend that cannot run one yet (cuda).
sd_code sd_cli_tp_check_backend(const sd_cli_tp *tp, sd_cli_backend be, sd_status *st);

// The emulated group of host model `full` (still owned by the caller).
sd_code sd_cli_tp_group(const sd_cli_tp *tp, const sd_model *full, sd_tp_group *g, sd_status *st);

// "3 ranks: r0 kda 0-0 ..." for receipts and --json (buf, or NULL without a group).
const char *sd_cli_tp_layout(const sd_tp_group *g, char *buf, size_t len);
