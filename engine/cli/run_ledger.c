// run_ledger.c — see run_ledger.h.
#include "run_ledger.h"
#include <stdlib.h>
#include "door_select.h" // sd_cli_ledger_device, sd_cli_device_ordinal

void run_ledger_init(run_ledger *r, const sd_model *target) {
    *r = (run_ledger){.dev = sd_cli_device_ordinal(target), .K = target->cfg.num_experts_per_token, .first_layer = -1,
                      .first_pos = -1};
    ledger_init(&r->L, sd_cli_ledger_device(target), true);
}

void run_ledger_after_target(void *ctx, int pos0, int T) {
    run_ledger *r = ctx;
    if (r->failed) return;
    ledger_row *rows = NULL;
    size_t n = 0;
    r->failed = ledger_drain_device(&r->L, r->dev, pos0, T, r->K, &rows, &n, &r->st);
    for (size_t i = 0; !r->failed && i < n; i++) {
        bool unwritten = false;
        for (int j = 0; j < rows[i].k; j++) unwritten |= rows[i].sel[j] < 0;
        if (unwritten && !r->unwritten++) r->first_layer = rows[i].layer, r->first_pos = rows[i].pos;
    }
    r->rows += n;
    free(rows);
    if (!r->failed) r->failed = ledger_poison(&r->L, r->dev, &r->st);
}

sd_code run_ledger_finish(const run_ledger *r, sd_status *st) {
    if (r->failed) return sd_fail(st, r->failed, "selection ledger: %s", r->st.msg);
    if (!r->rows || !r->L.device_entries)
        return sd_fail(st, SD_ERR_DATA, "selection ledger: nothing was recorded inside the graphs");
    if (r->unwritten)
        return sd_fail(st, SD_ERR_DATA, "selection ledger: %zu of %zu rows unwritten, the first at layer %d token %d",
                       r->unwritten, r->rows, r->first_layer, r->first_pos);
    return SD_OK;
}

void run_ledger_free(run_ledger *r) { ledger_free(&r->L); }
