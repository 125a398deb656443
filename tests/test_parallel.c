// test_parallel.c — the parts of a tensor-parallel group below the model: the even split, the
// fixed-order all-reduce (the same bits for a row whatever message holds it), the head's
// cross-rank argmax, and the watchdog (a rank that stops answering, fails or ends early makes
// every rank fail within a bounded time, naming it).
#include <criterion/criterion.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "parallel/head.h"      // sd_tp_argmax_combine
#include "parallel/host_comm.h" // sd_host_comm_*
#include "parallel/monitor.h"   // sd_tp_monitor_*
#include "parallel/plan.h"      // sd_tp_split
#include "parallel/ranks.h"     // sd_tp_run
#include "sample.h"             // sd_argmax

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

// N bare models (no weights) whose comms meet in h; mp[r] points at model r.
static void bare_ranks(int N, const sd_tp_plan *plan, sd_host_comm *h, sd_comm *comms, sd_model *models, sd_model **mp) {
    for (int r = 0; r < N; r++) {
        sd_comm_init(&comms[r], r, plan, sd_host_comm_transport(h));
        memset(&models[r], 0, sizeof models[r]);
        models[r].comm = &comms[r];
        mp[r] = &models[r];
    }
}

// ---- the split ----

Test(tp_split, even_covering_and_in_rank_order) {
    const int counts[] = {0, 1, 2, 3, 5, 7, 13, 47, 67, 256};
    for (size_t c = 0; c < sizeof counts / sizeof *counts; c++)
        for (int N = 1; N <= 9; N++) {
            int next = 0, lo = counts[c], hi = 0;
            for (int r = 0; r < N; r++) {
                sd_tp_range g = sd_tp_split(counts[c], N, r);
                cr_assert_eq(g.first, next, "n %d over %d: rank %d starts at %d, not %d", counts[c], N, r, g.first, next);
                next += g.count;
                if (g.count < lo) lo = g.count;
                if (g.count > hi) hi = g.count;
                if (r) cr_assert_leq(g.count, sd_tp_split(counts[c], N, r - 1).count, "the larger shares come first");
            }
            cr_assert_eq(next, counts[c], "n %d over %d ranks: covered %d", counts[c], N, next);
            cr_assert_leq(hi - lo, 1, "n %d over %d ranks: shares %d..%d", counts[c], N, lo, hi);
        }
}

Test(tp_split, plan_of_odd_counts_lets_a_rank_hold_none) {
    sd_config c = {.vocab_size = 67, .kda_num_heads = 3, .num_attention_heads = 5, .intermediate_size = 47,
                   .num_experts = 7, .num_shared_experts = 1, .moe_intermediate_size = 13};
    sd_tp_plan p;
    sd_status st = {0};
    cr_assert_eq(sd_tp_plan_make(&c, 4, &p, &st), SD_OK, "%s", st.msg);
    cr_assert_eq(p.rank[3].kda_heads.count, 0, "3 KDA heads over 4 ranks: rank 3 holds none");
    cr_assert_eq(p.rank[0].experts.count, 2);
    cr_assert_eq(p.rank[3].experts.count, 1);
    cr_assert_eq(p.vocab_max, 17);
    char line[512];
    sd_tp_plan_describe(&p, line, sizeof line);
    cr_assert(strstr(line, "4 ranks: r0 kda 0-0 mla 0-1") && strstr(line, "r3 kda - mla 4-4"), "%s", line);
    cr_assert_eq(sd_tp_plan_make(&c, 0, &p, &st), SD_ERR_USAGE);
    cr_assert_eq(sd_tp_plan_make(&c, SD_TP_MAX_RANKS + 1, &p, &st), SD_ERR_USAGE);
}

// ---- the fixed-order all-reduce ----

// Rank r's partial of row j, element i: values whose sum depends on the order of the adds.
static float partial(int r, int j, int i) {
    static const float big[] = {1e8f, -1e8f, 1.0f, 3e-1f, -7.0f};
    return big[r % 5] * (1.0f + 0.125f * (float)((j + i) % 4)) + (float)(r * 3 + j) * 1e-3f;
}

enum { ROW = 24, MAX_ROWS = 64 };

typedef struct {
    sd_comm comm[SD_TP_MAX_RANKS];
    float alone[SD_TP_MAX_RANKS][MAX_ROWS][ROW];  // row j reduced alone
    float inside[SD_TP_MAX_RANKS][MAX_ROWS][ROW]; // the same rows reduced in one message of n rows
    int n;
} reduce_job;

static sd_code reduce_rank(void *ctx, int rank, const sd_model *m, sd_status *st) {
    (void)m;
    reduce_job *job = ctx;
    sd_comm *c = &job->comm[rank];
    for (int j = 0; j < job->n; j++) {
        for (int i = 0; i < ROW; i++) job->alone[rank][j][i] = partial(rank, j, i);
        sd_code rc = sd_comm_all_reduce(c, j, "row alone", job->alone[rank][j], ROW, st);
        if (rc) return rc;
    }
    for (int j = 0; j < job->n; j++)
        for (int i = 0; i < ROW; i++) job->inside[rank][j][i] = partial(rank, j, i);
    return sd_comm_all_reduce(c, -1, "rows inside one message", &job->inside[rank][0][0], (size_t)job->n * ROW, st);
}

static void check_reduce_order(int N, int n) {
    static reduce_job job;
    memset(&job, 0, sizeof job);
    job.n = n;
    sd_tp_plan plan = {.ranks = N};
    sd_host_comm *h;
    sd_status st = {0};
    cr_assert_eq(sd_host_comm_new(&h, N, 10, &st), SD_OK);
    sd_model models[SD_TP_MAX_RANKS], *mp[SD_TP_MAX_RANKS];
    bare_ranks(N, &plan, h, job.comm, models, mp);
    bool abandoned;
    cr_assert_eq(sd_tp_run(N, mp, reduce_rank, &job, 10, NULL, &abandoned, &st), SD_OK, "%s", st.msg);
    int order_matters = 0;
    for (int j = 0; j < n; j++)
        for (int i = 0; i < ROW; i++) {
            float want = partial(0, j, i), reverse = partial(N - 1, j, i);
            for (int r = 1; r < N; r++) want += partial(r, j, i);
            for (int r = N - 2; r >= 0; r--) reverse += partial(r, j, i);
            order_matters += memcmp(&want, &reverse, sizeof want) != 0;
            for (int r = 0; r < N; r++) {
                cr_assert(memcmp(&job.alone[r][j][i], &want, sizeof want) == 0, "N %d: rank %d row %d [%d] alone: %.9g, want %.9g",
                          N, r, j, i, job.alone[r][j][i], want);
                cr_assert(memcmp(&job.inside[r][j][i], &want, sizeof want) == 0,
                          "N %d: rank %d row %d [%d] inside %d rows: %.9g, alone %.9g", N, r, j, i, n, job.inside[r][j][i], want);
            }
        }
    if (N >= 3) cr_assert_gt(order_matters, 0, "the test values must tell the rank order from its reverse");
    for (int r = 0; r < N; r++) sd_comm_free(&job.comm[r]);
    sd_host_comm_free(h);
}

// The bits of a reduced row never depend on the message: alone, inside 5 rows (a k = 4 verify),
// inside 64 — and they are ((p0 + p1) + p2) + ... on every rank.
Test(tp_reduce, same_bits_alone_and_inside_messages_of_any_size) {
    const int ranks[] = {1, 2, 3, 4, 5, 8}, sizes[] = {1, 2, 5, 9, 64};
    for (size_t a = 0; a < sizeof ranks / sizeof *ranks; a++)
        for (size_t b = 0; b < sizeof sizes / sizeof *sizes; b++) check_reduce_order(ranks[a], sizes[b]);
}

// ---- the head's argmax across the vocabulary split ----

// Each case: a whole row cut into the ranks' slices; the combined argmax must be sd_argmax of the row.
Test(tp_head, split_argmax_is_the_whole_rows_argmax) {
    const float nan = NAN, inf = INFINITY;
    const struct { int n; float row[8]; } rows[] = {
        {8, {1, 2, 3, 4, 5, 6, 7, 8}},           {8, {8, 7, 6, 5, 4, 3, 2, 1}},
        {8, {0, 5, 1, 5, 2, 5, 3, 5}},           {8, {nan, nan, 2, nan, 2, nan, nan, 1}},
        {8, {nan, nan, nan, nan, nan, nan, nan, nan}}, {8, {-inf, -inf, -inf, -inf, -inf, -inf, -inf, -inf}},
        {8, {1, 1, 1, 1, 1, 1, 1, inf}},         {8, {-0.0f, 0.0f, -0.0f, 0.0f, 0, 0, 0, 0}},
        {3, {1, 3, 3}},                          {1, {nan}},
    };
    for (size_t c = 0; c < sizeof rows / sizeof *rows; c++)
        for (int N = 1; N <= 6; N++) {
            sd_tp_argmax local[SD_TP_MAX_RANKS];
            for (int r = 0; r < N; r++) {
                sd_tp_range v = sd_tp_split(rows[c].n, N, r);
                local[r] = (sd_tp_argmax){.value = NAN, .index = -1};
                if (!v.count) continue;
                int i = sd_argmax(rows[c].row + v.first, v.count);
                if (!isnan(rows[c].row[v.first + i])) local[r] = (sd_tp_argmax){rows[c].row[v.first + i], v.first + i};
            }
            cr_assert_eq(sd_tp_argmax_combine(local, N), sd_argmax(rows[c].row, rows[c].n), "case %zu over %d ranks", c, N);
        }
}

// ---- the watchdog ----

typedef struct {
    sd_comm comm[SD_TP_MAX_RANKS];
    int fail_rank, end_rank, sleep_rank; // -1: none
} chat_job;

// Ten all-reduces; fail_rank fails before its first, end_rank returns early, sleep_rank sleeps
// outside any collective.
static sd_code chat_rank(void *ctx, int rank, const sd_model *m, sd_status *st) {
    (void)m;
    chat_job *job = ctx;
    if (rank == job->fail_rank) return sd_fail(st, SD_ERR_DATA, "rank-local fault");
    if (rank == job->sleep_rank) usleep(1500 * 1000);
    float x[4] = {1, 2, 3, 4};
    for (int i = 0; i < 10; i++) {
        if (rank == job->end_rank && i == 3) return SD_OK;
        sd_code rc = sd_comm_all_reduce(&job->comm[rank], i, "step", x, 4, st);
        if (rc) return rc;
    }
    return SD_OK;
}

static chat_job chat;

// Runs the chat on N ranks (timeout_s each collective; rank stop_rank stops at collective
// stop_at when stop_at > 0); returns the run's code, the seconds it took, every rank's status.
static sd_code run_chat(int N, double timeout_s, int stop_rank, uint64_t stop_at, double grace_s, double *secs,
                        sd_status *rank_st, sd_status *st, bool *abandoned) {
    static sd_tp_plan plan;
    static sd_model models[SD_TP_MAX_RANKS];
    static sd_host_comm *h;
    plan = (sd_tp_plan){.ranks = N};
    sd_status s0 = {0};
    cr_assert_eq(sd_host_comm_new(&h, N, timeout_s, &s0), SD_OK);
    if (stop_at) sd_host_comm_stop_at(h, stop_rank, stop_at);
    sd_model *mp[SD_TP_MAX_RANKS];
    bare_ranks(N, &plan, h, chat.comm, models, mp);
    double t0 = now_s();
    sd_code rc = sd_tp_run(N, mp, chat_rank, &chat, grace_s, rank_st, abandoned, st);
    *secs = now_s() - t0;
    if (!*abandoned) {
        for (int r = 0; r < N; r++) sd_comm_free(&chat.comm[r]);
        sd_host_comm_free(h);
    }
    return rc;
}

Test(tp_watchdog, a_rank_that_stops_answering_fails_every_rank_naming_it) {
    chat = (chat_job){.fail_rank = -1, .end_rank = -1, .sleep_rank = -1};
    sd_status rank_st[3], st = {0};
    double secs;
    bool abandoned;
    sd_code rc = run_chat(3, 1.0, 2, 5, 1.0, &secs, rank_st, &st, &abandoned);
    cr_assert_neq(rc, SD_OK);
    cr_assert_not(abandoned);
    cr_assert_str_eq(st.msg, "tp: rank 2 did not reach all-reduce #5 (layer 4 step) within 1 s");
    for (int r = 0; r < 3; r++) cr_assert_str_eq(rank_st[r].msg, st.msg, "rank %d: %s", r, rank_st[r].msg);
    cr_assert_lt(secs, 6.0, "the group broke after %.2f s (timeout 1 s)", secs);
    cr_assert_geq(secs, 0.95, "the group broke after %.2f s, before its timeout", secs);
}

Test(tp_watchdog, a_failing_rank_fails_the_others_at_once) {
    chat = (chat_job){.fail_rank = 1, .end_rank = -1, .sleep_rank = -1};
    sd_status rank_st[4], st = {0};
    double secs;
    bool abandoned;
    cr_assert_eq(run_chat(4, 30, -1, 0, 30, &secs, rank_st, &st, &abandoned), SD_ERR_DATA);
    cr_assert_str_eq(st.msg, "rank-local fault");
    cr_assert_str_eq(rank_st[0].msg, "tp: rank 1 failed: rank-local fault");
    cr_assert_lt(secs, 5.0, "took %.2f s with a 30 s timeout: the others waited it out", secs);
}

Test(tp_watchdog, a_rank_that_ends_early_is_named) {
    chat = (chat_job){.fail_rank = -1, .end_rank = 0, .sleep_rank = -1};
    sd_status rank_st[2], st = {0};
    double secs;
    bool abandoned;
    cr_assert_neq(run_chat(2, 30, -1, 0, 30, &secs, rank_st, &st, &abandoned), SD_OK);
    cr_assert_str_eq(st.msg, "tp: rank 0 ended its run without reaching all-reduce #4 (layer 3 step)");
    cr_assert_lt(secs, 5.0);
}

// A thread stuck outside any collective cannot be woken: the run returns after the grace, names
// it, and leaves it behind (its memory kept) rather than hang.
Test(tp_watchdog, a_stuck_thread_is_left_behind_not_waited_for) {
    chat = (chat_job){.fail_rank = 0, .end_rank = -1, .sleep_rank = 1};
    sd_status st = {0};
    double secs;
    bool abandoned;
    cr_assert_neq(run_chat(2, 30, -1, 0, 0.2, &secs, NULL, &st, &abandoned), SD_OK);
    cr_assert(abandoned);
    cr_assert_str_eq(st.msg, "rank-local fault; rank 1 did not return within 0.2 s after it and was left behind");
    cr_assert_lt(secs, 1.2, "took %.2f s: the run waited for the stuck thread", secs);
    usleep(2000 * 1000); // let it end before the process does
}

// ---- the monitor of asynchronous collectives (monitor.h), over a fake device transport ----
// A collective "runs on the device" after its rank enqueues it: its marker completes once every
// rank has enqueued that collective (NCCL's all-gather), or never when the fake hangs from
// collective #hang_from on — unless the communicators are aborted, which makes every pending
// marker complete (an aborted NCCL kernel returns). Each rank "drains" after every collective:
// it polls its marker as cudaStreamSynchronize would wait, then asks the group (check).

typedef struct {
    sd_tp_monitor *mon;
    pthread_mutex_t mu;
    int ranks;
    uint64_t enqueued[SD_TP_MAX_RANKS];
    uint64_t hang_from;     // 0: never
    int aborts;             // abort hook calls
    pthread_t abort_thread; // the thread that called it
    bool aborted;
    pthread_t rank_thread[SD_TP_MAX_RANKS];
    int fail_rank;          // fails before its collective #3 (-1: none)
    sd_comm comm[SD_TP_MAX_RANKS];
} fake_dev;

static fake_dev fd;

static bool fake_done(void *ctx, int rank, void *mark) {
    (void)ctx, (void)rank;
    const uint64_t seq = (uint64_t)(uintptr_t)mark;
    pthread_mutex_lock(&fd.mu);
    bool done = fd.aborted || !fd.hang_from || seq < fd.hang_from;
    for (int r = 0; r < fd.ranks && !fd.aborted; r++) done &= fd.enqueued[r] >= seq;
    pthread_mutex_unlock(&fd.mu);
    return done;
}

static void fake_abort(void *ctx) {
    (void)ctx;
    pthread_mutex_lock(&fd.mu);
    fd.aborts++;
    fd.abort_thread = pthread_self();
    fd.aborted = true;
    pthread_mutex_unlock(&fd.mu);
}

static sd_code fake_all_gather(void *ctx, int rank, uint64_t seq, const sd_comm_op *op, const void *send, size_t bytes,
                               void *recv, sd_status *st) {
    (void)ctx, (void)send, (void)bytes, (void)recv;
    SD_TRY(sd_tp_monitor_enter(fd.mon, rank, seq, op, 1, st));
    pthread_mutex_lock(&fd.mu);
    fd.enqueued[rank] = seq;
    pthread_mutex_unlock(&fd.mu);
    SD_TRY(sd_tp_monitor_enqueued(fd.mon, rank, (void *)(uintptr_t)seq, st));
    while (!fake_done(NULL, rank, (void *)(uintptr_t)seq)) usleep(1000); // the drain
    return sd_tp_monitor_check(fd.mon, st);
}

static void fake_leave(void *ctx, int rank, sd_code rc, const sd_status *st) {
    (void)ctx;
    sd_tp_monitor_leave(fd.mon, rank, rc, st);
}

// Eight collectives a rank ("layer i step"), each drained; fail_rank fails before its #3.
static sd_code fake_rank(void *ctx, int rank, const sd_model *m, sd_status *st) {
    (void)ctx;
    fd.rank_thread[rank] = pthread_self();
    for (int i = 0; i < 8; i++) {
        if (rank == fd.fail_rank && i == 2) return sd_fail(st, SD_ERR_DATA, "rank-local fault");
        SD_TRY(sd_comm_gather_to(m->comm, SD_COMM_ALL_REDUCE, i, "step", NULL, 16, NULL, st));
    }
    return SD_OK;
}

static sd_code run_fake(int N, uint64_t hang_from, int stop_rank, uint64_t stop_at, int fail_rank, double *secs,
                        sd_status *rank_st, sd_status *st) {
    static sd_tp_plan plan;
    static sd_model models[SD_TP_MAX_RANKS];
    memset(&fd, 0, sizeof fd);
    pthread_mutex_init(&fd.mu, NULL);
    fd.ranks = N;
    fd.hang_from = hang_from;
    fd.fail_rank = fail_rank;
    plan = (sd_tp_plan){.ranks = N};
    const sd_tp_monitor_hooks h = {.done = fake_done, .abort = fake_abort};
    sd_status s0 = {0};
    cr_assert_eq(sd_tp_monitor_new(&fd.mon, N, 0, N, 1.0, &h, &s0), SD_OK, "%s", s0.msg);
    if (stop_at) sd_tp_monitor_stop_at(fd.mon, stop_rank, stop_at);
    sd_model *mp[SD_TP_MAX_RANKS];
    for (int r = 0; r < N; r++) {
        sd_comm_init(&fd.comm[r], r, &plan, (sd_comm_transport){.all_gather = fake_all_gather, .leave = fake_leave});
        memset(&models[r], 0, sizeof models[r]);
        models[r].comm = &fd.comm[r];
        mp[r] = &models[r];
    }
    bool abandoned = false;
    const double t0 = now_s();
    const sd_code rc = sd_tp_run(N, mp, fake_rank, NULL, 2.0, rank_st, &abandoned, st);
    *secs = now_s() - t0;
    cr_assert_not(abandoned);
    sd_status again;
    if (rc) cr_assert_not(sd_tp_monitor_restart(fd.mon, &again), "a broken group stays broken");
    cr_assert(sd_tp_monitor_free(fd.mon), "the monitor's thread ended");
    for (int r = 0; r < N; r++) sd_comm_free(&fd.comm[r]);
    return rc;
}

// The abort ran once, from the monitor's own thread (none of the ranks').
static void expect_one_abort_off_the_ranks(int N) {
    cr_assert_eq(fd.aborts, 1, "the communicators were aborted %d times", fd.aborts);
    for (int r = 0; r < N; r++) cr_assert_not(pthread_equal(fd.abort_thread, fd.rank_thread[r]), "rank %d's thread aborted", r);
}

Test(tp_monitor, every_collective_completes_and_nothing_is_aborted) {
    sd_status st = {0};
    double secs;
    cr_assert_eq(run_fake(3, 0, -1, 0, -1, &secs, NULL, &st), SD_OK, "%s", st.msg);
    cr_assert_eq(fd.aborts, 0);
}

Test(tp_monitor, a_rank_that_stops_answering_is_blamed_by_the_monitor) {
    for (int N = 1; N <= 3; N += 2) { // N = 1: the stopped rank is blamed by its own watch
        sd_status rank_st[3], st = {0};
        double secs;
        cr_assert_neq(run_fake(N, 0, N - 1, 5, -1, &secs, rank_st, &st), SD_OK);
        char want[128];
        snprintf(want, sizeof want, "tp: rank %d did not reach all-reduce #5 (layer 4 step) within 1 s", N - 1);
        cr_assert_str_eq(st.msg, want);
        for (int r = 0; r < N; r++) cr_assert_str_eq(rank_st[r].msg, want, "%d ranks: rank %d", N, r);
        cr_assert(secs >= 0.95 && secs < 6.0, "%d ranks: the group broke after %.2f s (timeout 1 s)", N, secs);
        expect_one_abort_off_the_ranks(N);
    }
}

Test(tp_monitor, a_collective_that_never_completes_is_named_and_aborted) {
    sd_status rank_st[2], st = {0};
    double secs;
    cr_assert_neq(run_fake(2, 3, -1, 0, -1, &secs, rank_st, &st), SD_OK);
    cr_assert(strstr(st.msg, "all-reduce #3 (layer 2 step) did not complete within 1 s on rank ") &&
              strstr(st.msg, "though every rank reached it"), "%s", st.msg);
    for (int r = 0; r < 2; r++) cr_assert_str_eq(rank_st[r].msg, st.msg, "rank %d", r);
    cr_assert(secs >= 0.95 && secs < 6.0, "the group broke after %.2f s", secs);
    expect_one_abort_off_the_ranks(2);
}

Test(tp_monitor, a_failing_rank_breaks_the_group_at_once) {
    sd_status rank_st[3], st = {0};
    double secs;
    cr_assert_neq(run_fake(3, 0, -1, 0, 1, &secs, rank_st, &st), SD_OK);
    cr_assert_str_eq(rank_st[1].msg, "rank-local fault");
    cr_assert_str_eq(rank_st[0].msg, "tp: rank 1 failed: rank-local fault");
    cr_assert_lt(secs, 0.9, "took %.2f s: the others waited out the timeout", secs);
    expect_one_abort_off_the_ranks(3);
}
