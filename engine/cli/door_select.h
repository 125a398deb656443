// door_select.h — the CLI's way to the decode-graph door (engine/cuda/cuda_door.h) and the MoE
// arms, without knowing CUDA: open a door for a run's models and hand the generation loop its
// round runner (generate.h), set a model's MoE arm, and name the selection ledger's device memory.
// With backend_select.c and tp_select.c, the CLI files that know the CUDA backend exists.
#pragma once
#include <stdbool.h>
#include "backend_select.h" // sd_cli_backend
#include "generate.h"       // sd_round_runner
#include "ledger.h"         // ledger, ledger_device
#include "trace.h"          // trace_burst

typedef struct sd_cli_door sd_cli_door;

typedef struct {
    int k;               // draft depth; 0: plain decode steps
    float temperature;
    uint64_t seed;
    trace_burst *trace;  // or NULL; level 2 is put in event mode here (CUDA events inside the graphs)
    ledger *ledger;      // the device arm's slots (the gate), or NULL
    void (*after_target)(void *ctx, int pos0, int T);
    void *ctx;
} sd_cli_door_opts;

// Refuse the door off the cuda backend and in a build without CUDA (SD_ERR_USAGE).
sd_code sd_cli_door_check_backend(sd_cli_backend be, sd_status *st);
// A door on the run's states (draft and ds NULL for plain decode). Refused (SD_ERR_USAGE) off the
// cuda backend, in a build without CUDA, and wherever cuda_door.h refuses.
sd_code sd_cli_door_open(sd_cli_backend be, const sd_model *target, sd_state *ts, const sd_model *draft, sd_state *ds,
                         const sd_cli_door_opts *o, sd_cli_door **door, sd_status *st);
// The runner for sd_gen_control.runner; valid until the door closes.
const sd_round_runner *sd_cli_door_runner(sd_cli_door *door);
void sd_cli_door_close(sd_cli_door *door);

// The MoE arm of a model's forwards: eager (the host reads the routing back: the host oracle) or
// the device table. A CPU model has one arm, the host's: a no-op.
void sd_cli_moe_eager(const sd_model *m, bool eager);

// Where the selection ledger's slots live for a model: CUDA device memory, or the host stand-in
// on the CPU backend; and the device ordinal its rows are keyed by (0 on the CPU).
const ledger_device *sd_cli_ledger_device(const sd_model *m);
int sd_cli_device_ordinal(const sd_model *m);
// The CUDA devices visible to this process (0 without CUDA).
int sd_cli_device_count(void);
