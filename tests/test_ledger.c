// test_ledger.c — ledger/ on the CPU stand-in (ledger_host_device): pre-armed slots read as the
// -1 sentinel until written, records copy the router's rows, a layer without a slot is skipped and
// never allocated, the entry counters tick armed or not, the drain maps entries to (layer, pos)
// rows, the comparison finds the first divergence, and the canary's one-ulp nudge is caught.
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <criterion/criterion.h>
#include "ledger.h"

enum { K = 3, T = 4 };

// A router's output for T tokens: token t selects experts (t + j) % 7 with weights 0.1·(j + 1) + t.
static void route_rows(int *sel, float *w, int salt) {
    for (int t = 0; t < T; t++)
        for (int j = 0; j < K; j++) {
            sel[t * K + j] = (t + j + salt) % 7;
            w[t * K + j] = 0.1f * (float)(j + 1) + (float)t;
        }
}

// The host arm's rows of the same routing, positions pos0 .. pos0+T-1.
static void record_host_rows(ledger *L, int dev, int layer, int pos0, const int *sel, const float *w) {
    sd_status st = {0};
    for (int t = 0; t < T; t++)
        cr_assert_eq(ledger_record_host(L, dev, layer, pos0 + t, sel + t * K, w + t * K, K, 0.5f, &st), SD_OK, "%s", st.msg);
}

Test(ledger, prearmed_slot_reads_as_sentinel_until_recorded) {
    ledger L;
    ledger_init(&L, ledger_host_device(), true);
    sd_status st = {0};
    cr_assert_eq(ledger_prearm(&L, 0, 2, T * K, &st), SD_OK, "%s", st.msg);
    ledger_row *rows = NULL;
    size_t n = 0;
    cr_assert_eq(ledger_drain_device(&L, 0, 10, T, K, &rows, &n, &st), SD_OK, "%s", st.msg);
    cr_assert_eq(n, (size_t)T);
    for (size_t i = 0; i < n; i++) {
        cr_assert_eq(rows[i].layer, 2);
        cr_assert_eq(rows[i].pos, 10 + (int)i);
        for (int j = 0; j < K; j++) cr_assert_eq(rows[i].sel[j], -1, "an unwritten slot reads as expert -1, never 0");
    }
    // Against a host arm that did record: every row is a mismatch, none a match.
    int sel[T * K];
    float w[T * K];
    route_rows(sel, w, 0);
    record_host_rows(&L, 0, 2, 10, sel, w);
    ledger_row *host;
    size_t nh;
    ledger_take_host(&L, &host, &nh);
    ledger_diff d;
    ledger_compare(host, nh, rows, n, &d);
    cr_assert_eq(d.compared, (size_t)T);
    cr_assert_eq(d.mismatched, (size_t)T);
    cr_assert(d.found && d.a.pos == 10 && d.b.sel[0] == -1);
    free(host);
    free(rows);
    ledger_free(&L);
}

Test(ledger, device_and_host_arms_agree_bit_for_bit) {
    ledger L;
    ledger_init(&L, ledger_host_device(), true);
    sd_status st = {0};
    int sel[T * K];
    float w[T * K];
    for (int layer = 1; layer <= 3; layer++) cr_assert_eq(ledger_prearm(&L, 0, layer, T * K, &st), SD_OK);
    ledger_row *dev_rows = NULL;
    size_t nd = 0;
    for (int step = 0; step < 3; step++) { // three steps of T tokens: drained after each
        for (int layer = 1; layer <= 3; layer++) {
            route_rows(sel, w, layer + step);
            cr_assert_eq(ledger_record_device(&L, 0, layer, sel, w, T * K, NULL, &st), SD_OK);
            record_host_rows(&L, 0, layer, 100 + step * T, sel, w);
        }
        cr_assert_eq(ledger_drain_device(&L, 0, 100 + step * T, T, K, &dev_rows, &nd, &st), SD_OK, "%s", st.msg);
        cr_assert_eq(ledger_poison(&L, 0, &st), SD_OK);
    }
    ledger_row *host;
    size_t nh;
    ledger_take_host(&L, &host, &nh);
    cr_assert_eq(nh, (size_t)3 * 3 * T);
    cr_assert_eq(nd, nh);
    ledger_diff d;
    ledger_compare(host, nh, dev_rows, nd, &d);
    cr_assert(!d.found && d.compared == nh && d.mismatched == 0 && d.missing == 0, "compared %zu mismatched %zu missing %zu",
              d.compared, d.mismatched, d.missing);
    ledger_compare_layer(host, nh, dev_rows, nd, 0, 2, &d);
    cr_assert(!d.found && d.compared == (size_t)3 * T);
    cr_assert_eq(L.device_entries, 9u);
    cr_assert_eq(L.host_entries, (uint64_t)9 * T);
    free(host);
    free(dev_rows);
    ledger_free(&L);
}

// Rounds re-verify a position after a rejection: the same (layer, pos) routed again, on other
// tokens. The n-th routing of a position in one arm is compared with the n-th in the other, so
// overlapping rounds match, and a difference in the second routing alone is found there.
Test(ledger, a_position_routed_again_is_matched_by_occurrence) {
    ledger L;
    ledger_init(&L, ledger_host_device(), true);
    sd_status st = {0};
    cr_assert_eq(ledger_prearm(&L, 0, 1, T * K, &st), SD_OK);
    int sel[T * K];
    float w[T * K];
    ledger_row *dev_rows = NULL;
    size_t nd = 0;
    const int pos0[3] = {20, 22, 25}; // rounds of T = 4 accepting 1, then 2: positions 22, 23 twice
    for (int r = 0; r < 3; r++) {
        route_rows(sel, w, 10 * r); // another routing each round, at the same positions too
        cr_assert_eq(ledger_record_device(&L, 0, 1, sel, w, T * K, NULL, &st), SD_OK);
        record_host_rows(&L, 0, 1, pos0[r], sel, w);
        cr_assert_eq(ledger_drain_device(&L, 0, pos0[r], T, K, &dev_rows, &nd, &st), SD_OK, "%s", st.msg);
    }
    ledger_row *host;
    size_t nh;
    ledger_take_host(&L, &host, &nh);
    ledger_diff d;
    ledger_compare(host, nh, dev_rows, nd, &d);
    cr_assert(!d.found && d.compared == (size_t)3 * T, "overlapping rounds: mismatched %zu missing %zu at pos %d",
              d.mismatched, d.missing, d.a.pos);
    // The second round's routing of position 23 (its 2nd token) differs in the device arm only.
    for (size_t i = 0; i < nd; i++)
        if (dev_rows[i].pos == 23 && dev_rows[i].seq == 1) dev_rows[i].w[0] = nextafterf(dev_rows[i].w[0], INFINITY);
    ledger_compare(host, nh, dev_rows, nd, &d);
    cr_assert(d.found && d.mismatched == 1 && d.missing == 0 && d.a.pos == 23 && d.a.occ == 1,
              "found %d mismatched %zu at pos %d occ %d", d.found, d.mismatched, d.a.pos, d.a.occ);
    free(host);
    free(dev_rows);
    ledger_free(&L);
}

Test(ledger, unarmed_slotless_layers_are_skipped_and_counted) {
    ledger L;
    ledger_init(&L, ledger_host_device(), true);
    sd_status st = {0};
    int sel[T * K];
    float w[T * K];
    route_rows(sel, w, 0);
    // No slot for layer 5: skipped, nothing allocated, the counter still ticks.
    cr_assert_eq(ledger_record_device(&L, 0, 5, sel, w, T * K, NULL, &st), SD_OK);
    cr_assert_eq(L.n_slots, 0, "a record never allocates a slot");
    cr_assert_eq(L.device_entries, 1u);
    ledger_free(&L);
    // Disarmed: every call is a no-op but for its counter.
    ledger_init(&L, ledger_host_device(), false);
    cr_assert_eq(ledger_prearm(&L, 0, 1, T * K, &st), SD_OK);
    cr_assert_eq(L.n_slots, 0);
    cr_assert_eq(ledger_record_device(&L, 0, 1, sel, w, T * K, NULL, &st), SD_OK);
    cr_assert_eq(ledger_record_host(&L, 0, 1, 0, sel, w, K, NAN, &st), SD_OK);
    cr_assert(L.device_entries == 1 && L.host_entries == 1 && L.n_host == 0);
    ledger_free(&L);
}

Test(ledger, the_canary_is_caught_where_it_was_planted) {
    ledger L;
    ledger_init(&L, ledger_host_device(), true);
    sd_status st = {0};
    int sel[T * K];
    float w[T * K];
    for (int layer = 0; layer < 2; layer++) {
        cr_assert_eq(ledger_prearm(&L, 0, layer, T * K, &st), SD_OK);
        route_rows(sel, w, layer);
        cr_assert_eq(ledger_record_device(&L, 0, layer, sel, w, T * K, NULL, &st), SD_OK);
        record_host_rows(&L, 0, layer, 40, sel, w);
    }
    // Entry 2·K + 1: token 2's second weight in layer 1.
    cr_assert_eq(ledger_canary(&L, 0, 1, 2 * K + 1, &st), SD_OK, "%s", st.msg);
    ledger_row *dev_rows = NULL, *host;
    size_t nd = 0, nh;
    cr_assert_eq(ledger_drain_device(&L, 0, 40, T, K, &dev_rows, &nd, &st), SD_OK);
    ledger_take_host(&L, &host, &nh);
    ledger_diff d;
    ledger_compare(host, nh, dev_rows, nd, &d);
    cr_assert(d.found && d.mismatched == 1 && d.missing == 0, "mismatched %zu missing %zu", d.mismatched, d.missing);
    cr_assert(d.a.layer == 1 && d.a.pos == 42, "first divergence at layer %d pos %d", d.a.layer, d.a.pos);
    cr_assert(memcmp(d.a.sel, d.b.sel, sizeof(int) * K) == 0, "the selection is the same");
    cr_assert(d.b.w[1] == nextafterf(d.a.w[1], INFINITY), "one ulp apart: %.9g vs %.9g", d.a.w[1], d.b.w[1]);
    ledger_compare_layer(host, nh, dev_rows, nd, 0, 0, &d);
    cr_assert(!d.found, "layer 0 is untouched");
    cr_assert_eq(ledger_canary(&L, 0, 9, 0, &st), SD_ERR_USAGE, "no slot for layer 9");
    cr_assert_eq(ledger_canary(&L, 0, 1, T * K, &st), SD_ERR_USAGE, "entry past the slot");
    free(host);
    free(dev_rows);
    ledger_free(&L);
}

Test(ledger, rows_only_one_arm_has_are_missing) {
    ledger L;
    ledger_init(&L, ledger_host_device(), true);
    sd_status st = {0};
    int sel[T * K];
    float w[T * K];
    route_rows(sel, w, 0);
    record_host_rows(&L, 0, 3, 0, sel, w);
    ledger_row *host;
    size_t nh;
    ledger_take_host(&L, &host, &nh);
    ledger_diff d;
    ledger_compare(host, nh, NULL, 0, &d); // the device arm recorded nothing
    cr_assert(d.found && d.missing == (size_t)T && d.mismatched == 0 && d.b.k == 0);
    ledger_compare(NULL, 0, host, nh, &d);
    cr_assert(d.found && d.missing == (size_t)T && d.a.k == 0);
    cr_assert_eq(ledger_record_host(&L, 0, 3, 0, sel, w, LEDGER_MAX_K + 1, NAN, &st), SD_ERR_USAGE);
    free(host);
    ledger_free(&L);
}
