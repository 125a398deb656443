// head.c — the end of the CUDA forward (model.c's head on the device): rmsnorm + lm_head of the
// output rows into the state's logits scratch, then each request of the caller on b->stream in
// this order — the logits copied to the host, the argmaxes, the softmax rows (into opts->probs
// in device memory, or in place over the scratch), the draws — then the forward's one drain (or,
// when argmaxes are all it returns and argmax_spin, their arrival: every kernel before the argmax
// is complete then, the argmax's own exit may not be), after which the host results are copied
// out of pinned memory (the argmax and draw kernels write there directly: cuda_backend.h). The
// order makes the in-place softmax safe: the copy and the argmax read the scratch before the
// softmax overwrites it. Numerics are kernels/sampling.cu's: the CPU's operation order (expf may
// differ by an ulp).
#include <stdbool.h>
#include <string.h>
#include "check.h"         // SD_CUDA_CHECK
#include "cuda_internal.h" // sd_cuda_head
#include "linear.h"        // sd_cuda_linear, sd_cuda_linear_multi_norm
#include "cursor.h"        // sd_cuda_cursor_advance
#include "rows.h"          // sd_cuda_rmsnorm
#include "sampling.h"      // sd_cuda_argmax, sd_cuda_softmax, sd_cuda_sample_rows
#include "trace.h"         // trace_now_ns

#define TRY(call)                      \
    do {                               \
        sd_code try_rc_ = (call);      \
        if (try_rc_) return try_rc_;   \
    } while (0)

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

sd_code sd_cuda_head_logits(sd_cuda_backend *b, const sd_model *m, sd_state *s, int first, int n_out, int adv_T,
                            sd_status *st) {
    const sd_config *c = &m->cfg;
    const int D = c->hidden_size;
    sd_scratch *x = &s->scratch;
    const float *h = x->x + (size_t)first * D;
    int *adv = adv_T > 0 ? s->cursor : NULL;
    if (b->head_norm_fused) { // the norm (and the advance) in the lm_head launch (linear.h: the same bits)
        const sd_lin_norm norm = {.x = h, .w = m->w.final_norm, .eps = c->rms_norm_eps, .n = D, .out = x->a};
        const sd_lin_job j = {.w = &m->w.lm_head, .x = x->a, .ldx = D, .y = x->logits, .ldy = c->vocab_size,
                              .mode = SD_LIN_STORE};
        return sd_cuda_linear_multi_norm_advance(&j, 1, n_out, &norm, adv, adv_T, b->stream, st);
    }
    if (adv) TRY(sd_cuda_cursor_advance(adv, adv_T, b->stream, st));
    TRY(sd_cuda_rmsnorm(h, m->w.final_norm, n_out, D, c->rms_norm_eps, x->a, b->stream, st));
    return sd_cuda_linear(&m->w.lm_head, x->a, n_out, x->logits, b->stream, st);
}

// Have the n argmax rows landed in pinned memory (each >= 0 over the -1 the host left)?
static bool rows_landed(volatile const int *out, int n) {
    for (int r = 0; r < n; r++)
        if (out[r] < 0) return false;
    return true;
}

// Waits for the n argmax rows in pinned memory instead of for the stream (argmax_spin): each
// row's last argmax block writes its row, which reaches the host before the launch's completion
// does. The stream is polled on the way, so a fault is reported rather than waited for; a
// complete stream without the rows is an error too.
static sd_code await_argmax(sd_cuda_backend *b, int n, sd_status *st) {
    for (unsigned spin = 1; !rows_landed(b->argmax_host, n); spin++) {
        if (spin % 4096) continue;
        const cudaError_t e = cudaStreamQuery(b->stream);
        if (e == cudaErrorNotReady) continue;
        SD_CUDA_CHECK(st, e);
        if (!rows_landed(b->argmax_host, n))
            return sd_fail(st, SD_ERR_SYS, "cuda head: the stream completed without the %d argmax rows", n);
    }
    return SD_OK;
}

bool sd_cuda_head_launches(const float *logits, const sd_forward_opts *opts) {
    return logits || (opts && (opts->argmax || opts->probs || opts->sampled));
}

sd_code sd_cuda_head(sd_cuda_backend *b, const sd_model *m, sd_state *s, int T, float *logits, int last_only,
                     const sd_forward_opts *opts, bool advance, sd_status *st) {
    const sd_config *c = &m->cfg;
    const int V = c->vocab_size;
    const int first = last_only ? T - 1 : 0, n_out = T - first;
    int *argmax = opts ? opts->argmax : NULL, *sampled = opts ? opts->sampled : NULL;
    float *probs = opts ? opts->probs : NULL;
    const bool sampling = probs || sampled;
    const bool spin = b->argmax_spin && argmax && !logits && !sampling; // the argmaxes are the last results
    cudaStream_t q = b->stream;
    sd_scratch *x = &s->scratch;

    if (sampled) TRY(ensure_sample_buffers(b, s->max_T > T ? s->max_T : T, st));
    if (sd_cuda_head_launches(logits, opts)) { // the logits stay on the device unless asked for
        TRY(sd_cuda_head_logits(b, m, s, first, n_out, advance ? T : 0, st));
        if (logits)
            SD_CUDA_CHECK(st, cudaMemcpyAsync(logits, x->logits, sizeof(float) * (size_t)n_out * V, cudaMemcpyDeviceToHost, q));
        if (spin) // the rows' arrival is the drain (await_argmax)
            for (int r = 0; r < n_out; r++) b->argmax_host[r] = -1;
        if (argmax) TRY(sd_cuda_argmax(x->logits, n_out, V, b->argmax_host, x->argmax_ws, q, st));
        if (sampling) { // p rows stay on the device; n_out ints come back
            float *p = probs ? probs : x->logits;
            TRY(sd_cuda_softmax(x->logits, n_out, V, opts->temperature, p, q, st));
            if (sampled) {
                const sd_draw *d = &opts->draw;
                TRY(sd_cuda_sample_rows(p, n_out, V, d->seed, d->round, d->pos, d->purpose, b->sampled_host, q, st));
            }
        }
    }
    b->enqueued_ns = trace_now_ns();
    if (spin) TRY(await_argmax(b, n_out, st));
    else SD_CUDA_CHECK(st, cudaStreamSynchronize(q));
    if (argmax) memcpy(argmax, b->argmax_host, sizeof(int) * (size_t)n_out);
    if (sampled) memcpy(sampled, b->sampled_host, sizeof(int) * (size_t)n_out);
    return SD_OK;
}
