// head.c — the end of the CUDA forward (model.c's head on the device): rmsnorm + lm_head of the
// output rows into the state's logits scratch, then each request of the caller on b->stream in
// this order — the logits copied to the host, the argmaxes, the softmax rows (into opts->probs
// in device memory, or in place over the scratch), the draws — then the forward's one drain,
// after which the host results are copied out of pinned memory (the argmax and draw kernels write
// there directly: cuda_backend.h). The order makes the in-place softmax safe: the copy and the
// argmax read the scratch before the softmax overwrites it. Numerics are kernels/sampling.cu's:
// the CPU's operation order (expf may differ by an ulp).
//
// A rank of a tensor-parallel group (m->comm) holds the head's rows of its vocabulary slice
// (docs/PARALLEL.md "The head", engine/parallel/head.h on the CPU): argmaxes alone come from each
// rank's slice as (value, global id) pairs, all-gathered and combined in rank order; whole rows
// (logits asked for, or sampling) are the ranks' slices all-gathered and laid out, then the same
// softmax and draws as on one device. Each collective is capturable, so the door's graphs hold them.
#include <stdbool.h>
#include <string.h>
#include "check.h"         // SD_CUDA_CHECK
#include "cuda_internal.h" // sd_cuda_head
#include "cuda_scratch.h"  // sd_cuda_scratch_of
#include "linear.h"        // sd_cuda_linear_multi_norm
#include "sampling.h"      // sd_cuda_argmax, sd_cuda_softmax, sd_cuda_sample_rows
#include "finite.h"        // sd_cuda_finite_check
#include "tp_head.h"       // sd_cuda_tp_argmax_pairs, _combine, _lay_rows
#include "parallel/comm.h" // sd_comm_gather_to, sd_comm_check

// The pinned (device-mapped) buffer for the draws of n rows (grown, never shrunk). Called before
// the head's launches: no kernel still writes the old buffer (every forward drains).
static sd_code ensure_sample_buffers(sd_cuda_backend *b, int n, sd_status *st) {
    if ((size_t)n <= b->sample_cap) return SD_OK;
    cudaFreeHost(b->sampled_host);
    b->sampled_host = NULL;
    b->sample_cap = 0;
    SD_CUDA_CHECK(st, cudaMallocHost((void **)&b->sampled_host, (size_t)n * sizeof(int)));
    b->sample_cap = (size_t)n;
    return SD_OK;
}

// rmsnorm + lm_head of rows first .. first+n_out-1 into y (n_out rows of ldy: the head's rows).
// The final norm rides in the lm_head launch, as every sublayer's norm rides in its first
// launch (linear.h: bitwise sd_cuda_rmsnorm then sd_cuda_linear).
static sd_code head_rows(sd_cuda_backend *b, const sd_model *m, sd_state *s, int first, int n_out, float *y, sd_status *st) {
    const sd_config *c = &m->cfg;
    const int D = c->hidden_size;
    sd_scratch *x = &s->scratch;
    const sd_lin_norm norm = {.x = x->x + (size_t)first * D, .w = m->w.final_norm, .eps = c->rms_norm_eps, .n = D,
                              .out = x->a, .flag = b->nonfinite, .site = sd_nonfinite_site_ffn(c->num_hidden_layers - 1)};
    // The logits are checked as the launch writes them (linear.h: a finite stream can still
    // overflow there).
    const sd_lin_job j = {.w = &m->w.lm_head, .x = x->a, .ldx = D, .y = y, .ldy = m->w.lm_head.rows, .mode = SD_LIN_STORE,
                          .flag = b->nonfinite, .site = sd_nonfinite_site_head(c)};
    return sd_cuda_linear_multi_norm(&j, 1, n_out, &norm, b->stream, st);
}

// A rank's whole rows: its slice (n_out × vocab_count) in a block padded to n_out × vocab_max
// floats — the same bytes from every rank — all-gathered and laid into the logits scratch.
static sd_code group_logits(sd_cuda_backend *b, const sd_model *m, sd_state *s, int first, int n_out, sd_status *st) {
    sd_comm *comm = m->comm;
    const sd_tp_plan *p = comm->plan;
    const sd_cuda_scratch g = sd_cuda_scratch_of(s);
    const size_t block = (size_t)n_out * (size_t)p->vocab_max;
    SD_TRY(head_rows(b, m, s, first, n_out, g.tp_head, st));
    SD_TRY(sd_comm_gather_to(comm, SD_COMM_ALL_GATHER, -1, "head logits", g.tp_head, block * sizeof(float), g.tp_gather, st));
    sd_cuda_tp_vocab v = {.ranks = p->ranks};
    for (int r = 0; r < p->ranks; r++) {
        v.first[r] = p->rank[r].vocab.first;
        v.count[r] = p->rank[r].vocab.count;
    }
    return sd_cuda_tp_lay_rows(g.tp_gather, &v, n_out, block, m->cfg.vocab_size, s->scratch.logits, b->stream, st);
}

// The flag's copy (the lm_head launch has checked the rows): the last launch of every head,
// captured or eager.
static sd_code check_rows(sd_cuda_backend *b, sd_status *st) { return sd_cuda_nonfinite_copy(b, st); }

sd_code sd_cuda_head_logits(sd_cuda_backend *b, const sd_model *m, sd_state *s, int first, int n_out, sd_status *st) {
    if (m->comm) SD_TRY(group_logits(b, m, s, first, n_out, st));
    else SD_TRY(head_rows(b, m, s, first, n_out, s->scratch.logits, st));
    return check_rows(b, st);
}

sd_code sd_cuda_head_argmax(sd_cuda_backend *b, const sd_model *m, sd_state *s, int first, int n_out, int *out, sd_status *st) {
    const sd_cuda_scratch g = sd_cuda_scratch_of(s);
    if (!m->comm) {
        SD_TRY(head_rows(b, m, s, first, n_out, s->scratch.logits, st));
        SD_TRY(check_rows(b, st));
        return sd_cuda_argmax(s->scratch.logits, n_out, m->cfg.vocab_size, out, g.argmax_ws, b->stream, st);
    }
    sd_comm *comm = m->comm;
    const sd_tp_range mine = comm->plan->rank[comm->rank].vocab;
    SD_TRY(head_rows(b, m, s, first, n_out, g.tp_head, st));
    SD_TRY(check_rows(b, st)); // this rank's slice, checked by its lm_head launch
    SD_TRY(sd_cuda_argmax(g.tp_head, n_out, mine.count, g.tp_idx, g.argmax_ws, b->stream, st)); // none at count 0
    SD_TRY(sd_cuda_tp_argmax_pairs(g.tp_head, n_out, mine.count, mine.first, g.tp_idx, g.tp_pairs, b->stream, st));
    SD_TRY(sd_comm_gather_to(comm, SD_COMM_ALL_GATHER, -1, "head argmax", g.tp_pairs, sizeof(sd_cuda_tp_pick) * (size_t)n_out,
                             g.tp_gather, st));
    return sd_cuda_tp_argmax_combine((const sd_cuda_tp_pick *)g.tp_gather, comm->ranks, n_out, out, b->stream, st);
}

bool sd_cuda_head_launches(const float *logits, const sd_forward_opts *opts) {
    return logits || (opts && (opts->argmax || opts->probs || opts->sampled));
}

sd_code sd_cuda_head(sd_cuda_backend *b, const sd_model *m, sd_state *s, int T, float *logits, int last_only,
                     const sd_forward_opts *opts, sd_status *st) {
    const sd_config *c = &m->cfg;
    const int V = c->vocab_size;
    const int first = last_only ? T - 1 : 0, n_out = T - first;
    int *argmax = opts ? opts->argmax : NULL, *sampled = opts ? opts->sampled : NULL;
    float *probs = opts ? opts->probs : NULL;
    const bool sampling = probs || sampled;
    cudaStream_t q = b->stream;
    sd_scratch *x = &s->scratch;
    const sd_cuda_scratch g = sd_cuda_scratch_of(s);

    if (sampled) SD_TRY(ensure_sample_buffers(b, s->max_T > T ? s->max_T : T, st));
    if (!sd_cuda_head_launches(logits, opts)) { // no head: no final norm checks what the last FFN left
        SD_TRY(sd_cuda_finite_check(x->x, (size_t)T * c->hidden_size, sd_nonfinite_site_ffn(c->num_hidden_layers - 1),
                                    b->nonfinite, q, st));
        SD_TRY(sd_cuda_nonfinite_copy(b, st)); // else the head's rows copy it
    }
    if (!logits && !sampling && argmax) { // argmaxes alone: the logits stay on the device
        SD_TRY(sd_cuda_head_argmax(b, m, s, first, n_out, b->argmax_host, st));
    } else if (sd_cuda_head_launches(logits, opts)) { // whole rows
        SD_TRY(sd_cuda_head_logits(b, m, s, first, n_out, st));
        if (logits)
            SD_CUDA_CHECK(st, cudaMemcpyAsync(logits, x->logits, sizeof(float) * (size_t)n_out * V, cudaMemcpyDeviceToHost, q));
        if (argmax) SD_TRY(sd_cuda_argmax(x->logits, n_out, V, b->argmax_host, g.argmax_ws, q, st));
        if (sampling) { // p rows stay on the device; n_out ints come back
            float *p = probs ? probs : x->logits;
            SD_TRY(sd_cuda_softmax(x->logits, n_out, V, opts->temperature, p, q, st));
            if (sampled) {
                const sd_draw *d = &opts->draw;
                SD_TRY(sd_cuda_sample_rows(p, n_out, V, d->seed, sd_draw_fixed(d->round, d->pos), d->purpose, b->sampled_host, q,
                                           st));
            }
        }
    }
    SD_CUDA_CHECK(st, cudaStreamSynchronize(q));
    SD_TRY(sd_comm_check(m->comm, st)); // an aborted collective leaves nothing here worth reading
    SD_TRY(sd_cuda_nonfinite_take(b, c, st)); // never a result computed from NaN
    if (argmax) memcpy(argmax, b->argmax_host, sizeof(int) * (size_t)n_out);
    if (sampled) memcpy(sampled, b->sampled_host, sizeof(int) * (size_t)n_out);
    return SD_OK;
}
