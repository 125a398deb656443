// tp_select.h — the CLI's tensor-parallel options (run, forward): --tp N, --tp-timeout S (or
// SPECDEC_TP_TIMEOUT), --tp-stop R:N, --rank R with --nccl-id FILE, and the group they ask for:
// on the CPU N emulated ranks (engine/parallel/ranks.h); on CUDA N device ranks over NCCL
// (engine/cuda/cuda_tp.h), all in this process (rank r on device r), or with --rank this process
// running rank R alone (one process per GPU).
#pragma once
#include "args.h"             // sd_args
#include "backend_select.h"   // sd_cli_backend
#include "parallel/ranks.h"   // sd_tp_group

// The options as given (NULL: absent).
typedef struct {
    const char *tp, *timeout, *stop, *rank, *nccl_id;
} sd_cli_tp_args;

typedef struct {
    int ranks;           // 0: --tp not given (one device, no group)
    double timeout_s;    // every collective's timeout
    int stop_rank;       // --tp-stop R:N (the watchdog's fault): rank R stops answering at its
    uint64_t stop_at;    //   collective #N; stop_at 0: none
    int rank;            // --rank R: this process runs rank R alone; -1: every rank
    const char *nccl_id; // --nccl-id FILE (with --rank)
    sd_cli_backend backend; // where the group runs (sd_cli_tp_check_backend)
    int canary_rank;     // the gate's --canary-rank R: rank R's copy of layer canary_layer's
    int canary_layer;    //   router input nudged by one ulp (sd_tp_shard_canary); -1: none
} sd_cli_tp;

// The lines each command's --help adds.
#define SD_CLI_TP_HELP                                                                            \
    "  --tp N              run as N tensor-parallel ranks: on the CPU N threads, each holding its\n" \
    "                      shard; on cuda rank r on device r, over NCCL (docs/PARALLEL.md)\n"     \
    "  --rank R            with --tp N --backend cuda: this process runs rank R alone (one process\n" \
    "                      per GPU, on device R mod the devices it sees); needs --nccl-id\n"      \
    "  --nccl-id FILE      with --rank: rank 0 writes the group's NCCL id there (FILE must not\n"  \
    "                      exist), the others wait for it\n"                                      \
    "  --tp-timeout S      every collective's timeout in seconds (default SPECDEC_TP_TIMEOUT, else\n" \
    "                      5): a rank that does not arrive in time fails the run, naming it\n"    \
    "  --tp-stop R:N       fault injection: rank R stops answering at its collective #N\n"

// Read the options from a (before sd_args_done).
sd_cli_tp_args sd_cli_tp_read(sd_args *a);

// Check the options' values and read the environment. Usage errors name the option or variable.
sd_code sd_cli_tp_parse(const sd_cli_tp_args *a, sd_cli_tp *out, sd_status *st);

// The group's backend (recorded in tp): --rank and --nccl-id are cuda's only; cuda needs NCCL.
sd_code sd_cli_tp_check_backend(sd_cli_tp *tp, sd_cli_backend be, sd_status *st);

// The ranks this process runs: N in one process, 1 with --rank or without --tp.
int sd_cli_tp_local_ranks(const sd_cli_tp *tp);

// sd_cli_to_backend, except that a model for a device group stays on the host (*use = host):
// the group cuts it into shards and puts each on its rank's device.
sd_code sd_cli_tp_to_backend(const sd_cli_tp *tp, sd_model *host, sd_model *dev, sd_model **use, sd_status *st);

// The group of host model `full` and its draft (NULL: none; on the CPU the ranks share it, on
// cuda each rank gets a replica: sd_tp_group_draft). full and draft stay the caller's.
sd_code sd_cli_tp_group(const sd_cli_tp *tp, const sd_model *full, const sd_model *draft, sd_tp_group *g, sd_status *st);

// "3 ranks: r0 kda 0-0 ...", for a device group followed by "; devices: r0 NVIDIA H200 (device
// 0), ...", for receipts and --json (buf, or NULL without a group).
const char *sd_cli_tp_layout(const sd_tp_group *g, char *buf, size_t len);
