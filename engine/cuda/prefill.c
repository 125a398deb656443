// prefill.c — the CUDA backend's prefill (cuda_prefill.h): the scratch of a device model's
// prefill, the pieces of a prompt through the layers (prefill_layers.c), the head's rows, and
// the commit of each piece. Nothing here is captured in a graph, so positions are launch
// arguments, and the host reads the expert counts back once per MoE layer (the expert GEMMs'
// sizes are host arguments).
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "check.h"          // SD_CUDA_CHECK
#include "cuda_internal.h"  // sd_cuda_state_is_ours
#include "kda_prefill.h"    // sd_cuda_kda_chunk_work_floats
#include "mla_prefill.h"    // sd_mla_head_width, sd_mla_value_width
#include "prefill_internal.h"
#include "route.h"          // sd_route_margin
#include "rows.h"           // sd_cuda_embed, sd_cuda_rmsnorm

#define TRY(call)                    \
    do {                             \
        sd_code try_rc_ = (call);    \
        if (try_rc_) return try_rc_; \
    } while (0)

// ---------------------------------------------------------------------------- scratch
// Bump allocator over the arena: the first pass (base NULL) only measures.
typedef struct { char *base; size_t used; } bump;
static void *take(bump *b, size_t bytes) {
    void *p = b->base ? b->base + b->used : NULL;
    b->used += (bytes + 255) & ~(size_t)255;
    return p;
}
#define TF(b, n) ((float *)take((b), sizeof(float) * (size_t)(n)))
#define TI(b, n) ((int *)take((b), sizeof(int) * (size_t)(n)))
#define TV(b, n) take((b), sizeof(float) * (size_t)(n)) // a GEMM input: f32 or bf16 elements

static size_t max_z(size_t a, size_t b) { return a > b ? a : b; }

static void layout(sd_prefill_scratch *p, const sd_config *c, bump *b) {
    const size_t C = (size_t)p->chunk, D = c->hidden_size, V = c->vocab_size, H = c->kda_num_heads, d = c->kda_head_dim;
    const size_t P = H * d, Hm = c->num_attention_heads, dn = c->qk_nope_head_dim;
    const size_t dr = c->qk_rope_head_dim, dv = c->v_head_dim, E = c->num_experts, K = c->num_experts_per_token;
    const size_t Ie = c->moe_intermediate_size, S = c->num_shared_experts, I = c->intermediate_size, CK = C * K;
    p->x = TF(b, C * D);
    p->a = TF(b, C * D);
    p->a16 = take(b, sizeof(uint16_t) * C * D);
    p->tokens = TI(b, C);
    p->head = TF(b, (size_t)SD_PREFILL_HEAD_ROWS * V);
    const size_t region = b->used;
    size_t end = region;

    bump k = {b->base, region}; // KDA
    sd_prefill_kda *x = &p->kda;
    x->qkv = TF(&k, 3 * C * P); x->qkvc = TF(&k, 3 * C * P);
    x->fa = TF(&k, C * d); x->ga = TF(&k, C * d);
    x->gate = TF(&k, C * P); x->gb = TF(&k, C * P); x->y = TF(&k, C * P); x->beta = TF(&k, C * ((H + 3) / 4 * 4));
    x->work = TF(&k, sd_cuda_kda_chunk_work_floats((int)C, (int)H, (int)d));
    x->act = TV(&k, C * P);
    end = max_z(end, k.used);

    bump a = {b->base, region}; // MLA
    sd_prefill_mla *y = &p->mla;
    y->qm = TF(&a, C * (size_t)sd_prefill_mla_ld(c));
    y->kvb = TF(&a, C * Hm * (dn + dv)); y->mo = TF(&a, C * Hm * dv);
    y->qpack = take(&a, sizeof(uint16_t) * C * Hm * (size_t)sd_mla_head_width((int)dn, (int)dr));
    end = max_z(end, a.used);

    bump m = {b->base, region}; // MoE
    sd_prefill_moe *z = &p->moe;
    z->router = TF(&m, C * E); z->sel = TI(&m, CK); z->w = TF(&m, CK);
    z->counts = TI(&m, E); z->offsets = TI(&m, E); z->row_tok = TI(&m, CK); z->inv = TI(&m, CK);
    z->xg = TV(&m, CK * D); z->h1 = TV(&m, CK * 2 * Ie); z->hb = TV(&m, CK * Ie); z->yexp = TV(&m, CK * D);
    z->h1s = TF(&m, C * 2 * S * Ie); z->hbs = TV(&m, C * S * Ie); z->shared = TF(&m, C * D);
    end = max_z(end, m.used);

    bump f = {b->base, region}; // dense FFN
    p->dense.h1 = TF(&f, C * 2 * I);
    p->dense.hb = TV(&f, C * I);
    end = max_z(end, f.used);
    b->used = end;
}

// The widest f32 activations a GEMM stages to bf16, per token: the normed input and head rows (D),
// the gates' low-rank halves (d), the MLA's [q | kv_a] rows, latents (R) and head outputs.
static size_t stage_elems(const sd_config *c, int chunk) {
    size_t w = max_z((size_t)c->hidden_size, (size_t)c->kda_head_dim);
    w = max_z(w, (size_t)sd_prefill_mla_ld(c));
    w = max_z(w, (size_t)c->kv_lora_rank);
    w = max_z(w, (size_t)c->num_attention_heads * c->v_head_dim);
    return (size_t)chunk * ((w + 7) / 8 * 8); // each staged row rounded up to 8 elements
}

void sd_prefill_free(sd_prefill_scratch *p) {
    if (!p) return;
    sd_gemm_free(p->gemm);
    sd_moe_grouped_free(p->grouped);
    free(p->experts_host);
    cudaFree(p->arena);
    cudaFree(p->kpack);
    cudaFree(p->vpack);
    cudaFreeHost(p->counts_host);
    const int chunk = p->chunk;
    memset(p, 0, sizeof *p);
    p->chunk = chunk;
}

void sd_cuda_prefill_release(sd_cuda_backend *b) {
    if (!b->prefill) return;
    sd_prefill_free(b->prefill);
    free(b->prefill);
    b->prefill = NULL;
}

// The routed experts' grouped GEMMs and the host copy of the device's expert table they take
// their pointers from, when the model has routed experts.
static sd_code make_grouped(const sd_cuda_backend *b, sd_prefill_scratch *p, const sd_config *c, sd_status *st) {
    const int E = c->num_experts, n_moe = c->num_hidden_layers - c->first_k_dense_replace;
    if (E < 1 || n_moe < 1) return SD_OK;
    if (!b->experts) return sd_fail(st, SD_ERR_USAGE, "cuda prefill: %d MoE layers but no device expert table", n_moe);
    const size_t n = (size_t)n_moe * E;
    p->experts_host = malloc(n * sizeof *p->experts_host);
    if (!p->experts_host) return sd_fail(st, SD_ERR_SYS, "cuda prefill: out of memory for the %zu-entry expert table", n);
    SD_CUDA_CHECK(st, cudaMemcpy(p->experts_host, b->experts, n * sizeof *p->experts_host, cudaMemcpyDeviceToHost));
    return sd_cuda_moe_grouped_create(&p->grouped, E, st);
}

// b->prefill with its scratch for m's config, made on the first prefill (and after a new chunk).
static sd_code ensure_scratch(sd_cuda_backend *b, const sd_model *m, sd_prefill_scratch **out, sd_status *st) {
    if (!b->prefill) {
        b->prefill = calloc(1, sizeof *b->prefill);
        if (!b->prefill) return sd_fail(st, SD_ERR_SYS, "cuda prefill: out of memory");
        b->prefill->chunk = SD_CUDA_PREFILL_CHUNK;
    }
    sd_prefill_scratch *p = b->prefill;
    *out = p;
    if (p->arena) return SD_OK;
    const sd_config *c = &m->cfg;
    bump measure = {0};
    layout(p, c, &measure);
    sd_code rc = SD_OK;
    if (cudaMalloc(&p->arena, measure.used) != cudaSuccess) {
        (void)cudaGetLastError();
        p->arena = NULL;
        rc = sd_fail(st, SD_ERR_SYS, "cuda prefill: cannot allocate %zu bytes of scratch for pieces of %d tokens", measure.used,
                     p->chunk);
    }
    if (!rc) {
        p->arena_bytes = measure.used;
        bump real = {.base = p->arena};
        layout(p, c, &real);
        rc = sd_gemm_create(&p->gemm, stage_elems(c, p->chunk), st);
    }
    if (!rc) rc = make_grouped(b, p, c, st);
    if (!rc && cudaMallocHost((void **)&p->counts_host, 2 * sizeof(int) * (size_t)(c->num_experts > 0 ? c->num_experts : 1)) !=
                   cudaSuccess)
        rc = sd_fail(st, SD_ERR_SYS, "cuda prefill: cannot allocate the pinned expert counts");
    if (rc) sd_prefill_free(p);
    return rc;
}

sd_code sd_prefill_scratch_of(const sd_model *m, sd_prefill_scratch **p, sd_status *st) {
    sd_cuda_backend *b = sd_cuda_backend_of(m);
    if (!b) return sd_fail(st, SD_ERR_USAGE, "cuda prefill: not a CUDA model");
    SD_CUDA_CHECK(st, cudaSetDevice(b->device));
    return ensure_scratch(b, m, p, st);
}

sd_code sd_cuda_prefill_set_chunk(const sd_model *m, int chunk, sd_status *st) {
    sd_cuda_backend *b = sd_cuda_backend_of(m);
    if (!b) return sd_fail(st, SD_ERR_USAGE, "cuda prefill: not a CUDA model");
    if (chunk < 1 || chunk > 65536) return sd_fail(st, SD_ERR_USAGE, "cuda prefill: piece of %d tokens (1 .. 65536)", chunk);
    if (!b->prefill && !(b->prefill = calloc(1, sizeof *b->prefill))) return sd_fail(st, SD_ERR_SYS, "cuda prefill: out of memory");
    SD_CUDA_CHECK(st, cudaStreamSynchronize(b->stream)); // nothing may still use the old scratch
    sd_prefill_free(b->prefill);
    b->prefill->chunk = chunk;
    return SD_OK;
}

size_t sd_cuda_prefill_scratch_bytes(const sd_model *m) {
    const sd_cuda_backend *b = sd_cuda_backend_of(m);
    if (!b || !b->prefill || !b->prefill->arena) return 0;
    const sd_prefill_scratch *p = b->prefill;
    const sd_config *c = &m->cfg;
    return p->arena_bytes + stage_elems(c, p->chunk) * sizeof(uint16_t) +
           (size_t)p->kv_rows * c->num_attention_heads *
               (sd_mla_head_width(c->qk_nope_head_dim, c->qk_rope_head_dim) + sd_mla_value_width(c->v_head_dim)) *
               sizeof(uint16_t);
}

// ---------------------------------------------------------------------------- a piece
// The route tap on MoE layer i's selection of the piece's C tokens (at positions p0 ..): sel, w
// and the router logits read back (a diagnostic sync, only when a tap is set), the margin from them.
static sd_code tap_routes(sd_cuda_backend *b, const sd_prefill_scratch *p, const sd_model *m, int i, int C, int p0,
                          const sd_prefill_opts *opts, sd_status *st) {
    const sd_config *c = &m->cfg;
    const int E = c->num_experts, K = c->num_experts_per_token;
    int *sel = malloc(sizeof(int) * (size_t)C * K);
    float *w = malloc(sizeof(float) * (size_t)C * K), *router = malloc(sizeof(float) * ((size_t)C + 1) * E);
    sd_code rc = sel && w && router ? SD_OK : sd_fail(st, SD_ERR_SYS, "cuda prefill: out of memory (route tap)");
    float *bias = router + (size_t)C * E;
    cudaStream_t q = b->stream;
    cudaError_t e = cudaSuccess;
    if (!rc) e = cudaMemcpyAsync(sel, p->moe.sel, sizeof(int) * (size_t)C * K, cudaMemcpyDeviceToHost, q);
    if (!rc && !e) e = cudaMemcpyAsync(w, p->moe.w, sizeof(float) * (size_t)C * K, cudaMemcpyDeviceToHost, q);
    if (!rc && !e) e = cudaMemcpyAsync(router, p->moe.router, sizeof(float) * (size_t)C * E, cudaMemcpyDeviceToHost, q);
    if (!rc && !e) e = cudaMemcpyAsync(bias, m->w.layers[i].moe.bias, sizeof(float) * (size_t)E, cudaMemcpyDeviceToHost, q);
    if (!rc && !e) e = cudaStreamSynchronize(q);
    if (e) rc = sd_fail(st, SD_ERR_SYS, "cuda prefill: route readback: %s", cudaGetErrorString(e));
    for (int t = 0; !rc && t < C; t++)
        opts->on_route(opts->route_ctx, i, p0 + t, sel + (size_t)t * K, w + (size_t)t * K, K,
                       sd_route_margin(router + (size_t)t * E, bias, c));
    free(sel);
    free(w);
    free(router);
    return rc;
}

// C tokens at positions s->len .. s->len+C-1 through every layer (model.c's layer walk).
static sd_code run_piece(sd_cuda_backend *b, sd_prefill_scratch *p, const sd_model *m, sd_state *s, const int *tokens, int C,
                         const sd_prefill_opts *opts, sd_status *st) {
    const sd_config *c = &m->cfg;
    const int D = c->hidden_size;
    cudaStream_t q = b->stream;
    SD_CUDA_CHECK(st, cudaMemcpyAsync(p->tokens, tokens, sizeof(int) * (size_t)C, cudaMemcpyHostToDevice, q));
    TRY(sd_cuda_embed(&m->w.embed, p->tokens, C, p->x, q, st));
    for (int i = 0; i < c->num_hidden_layers; i++) {
        const sd_layer_weights *ly = &m->w.layers[i];
        TRY(sd_cuda_rmsnorm(p->x, ly->input_norm, C, D, c->rms_norm_eps, p->a, q, st));
        TRY(sd_cuda_to_bf16(p->a, (size_t)C * D, p->a16, q, st));
        if (ly->mixer == SD_MIXER_KDA) TRY(sd_prefill_kda_mixer(b, p, m, s, i, C, st));
        else TRY(sd_prefill_mla_mixer(b, p, m, s, i, C, st));
        TRY(sd_cuda_rmsnorm(p->x, ly->post_norm, C, D, c->rms_norm_eps, p->a, q, st));
        TRY(sd_cuda_to_bf16(p->a, (size_t)C * D, p->a16, q, st));
        if (ly->is_moe) {
            TRY(sd_prefill_moe_ffn(b, p, m, i, C, st));
            if (opts && opts->on_route) TRY(tap_routes(b, p, m, i, C, s->len, opts, st));
        } else {
            TRY(sd_prefill_dense_ffn(b, p, m, i, C, st));
        }
    }
    return SD_OK;
}

// Logits of piece rows first .. first+n-1 into host memory out (n × V), in blocks of head rows.
static sd_code head_rows(sd_cuda_backend *b, sd_prefill_scratch *p, const sd_model *m, int first, int n, float *out,
                         sd_status *st) {
    const sd_config *c = &m->cfg;
    const int D = c->hidden_size, V = c->vocab_size;
    cudaStream_t q = b->stream;
    for (int r = 0; r < n; r += SD_PREFILL_HEAD_ROWS) {
        const int rows = n - r < SD_PREFILL_HEAD_ROWS ? n - r : SD_PREFILL_HEAD_ROWS;
        TRY(sd_cuda_rmsnorm(p->x + (size_t)(first + r) * D, m->w.final_norm, rows, D, c->rms_norm_eps, p->a, q, st));
        TRY(sd_cuda_to_bf16(p->a, (size_t)rows * D, p->a16, q, st));
        TRY(sd_prefill_lin_a(p, b, &m->w.lm_head, rows, p->head, V, 0.0f, st));
        SD_CUDA_CHECK(st, cudaMemcpyAsync(out + (size_t)r * V, p->head, sizeof(float) * (size_t)rows * V,
                                          cudaMemcpyDeviceToHost, q));
        SD_CUDA_CHECK(st, cudaStreamSynchronize(q)); // the next block reuses p->head
    }
    return SD_OK;
}

static sd_code check_request(sd_cuda_backend *b, const sd_model *m, const sd_state *s, const int *tokens, int n,
                             sd_status *st) {
    if (!b) return sd_fail(st, SD_ERR_USAGE, "cuda prefill: not a CUDA model");
    if (!sd_cuda_state_is_ours(b, s))
        return sd_fail(st, SD_ERR_USAGE, "cuda prefill: the state is not in device %d memory (make it with sd_cuda_state_init)",
                       b->device);
    if (n < 1) return sd_fail(st, SD_ERR_USAGE, "prefill: %d tokens", n);
    if (s->pending) return sd_fail(st, SD_ERR_USAGE, "prefill: %d positions are pending; commit them first", s->pending);
    if ((long)s->len + n > s->capacity)
        return sd_fail(st, SD_ERR_FULL, "context full: %d positions + %d new > capacity %d", s->len, n, s->capacity);
    const int V = m->cfg.vocab_size;
    for (int t = 0; t < n; t++)
        if (tokens[t] < 0 || tokens[t] >= V)
            return sd_fail(st, SD_ERR_DATA, "prefill: token %d at position %d is outside the vocabulary 0..%d", tokens[t],
                           s->len + t, V - 1);
    return SD_OK;
}

sd_code sd_cuda_prefill(const sd_model *m, sd_state *s, const int *tokens, int n, float *logits, bool all_rows,
                        const sd_prefill_opts *opts, sd_status *st) {
    sd_cuda_backend *b = sd_cuda_backend_of(m);
    TRY(check_request(b, m, s, tokens, n, st));
    SD_CUDA_CHECK(st, cudaSetDevice(b->device));
    sd_prefill_scratch *p = NULL;
    TRY(ensure_scratch(b, m, &p, st));
    const int V = m->cfg.vocab_size;
    sd_code rc = SD_OK;
    for (int done = 0; !rc && done < n;) {
        const int C = n - done < p->chunk ? n - done : p->chunk;
        const bool last = done + C == n;
        rc = run_piece(b, p, m, s, tokens + done, C, opts, st);
        if (!rc && logits && all_rows) rc = head_rows(b, p, m, 0, C, logits + (size_t)done * V, st);
        if (!rc && logits && !all_rows && last) rc = head_rows(b, p, m, C - 1, 1, logits, st);
        if (!rc) {
            sd_state_advance(s, C);
            rc = sd_state_commit(s, C, st);
        }
        done += C;
    }
    if (!rc && cudaStreamSynchronize(b->stream) != cudaSuccess)
        rc = sd_fail(st, SD_ERR_SYS, "cuda prefill: %s", cudaGetErrorString(cudaGetLastError()));
    if (rc) { // the live slot and conv rows may be half-written: no partial state survives
        char msg[sizeof st->msg];
        snprintf(msg, sizeof msg, "%s", st ? st->msg : "");
        cudaStreamSynchronize(b->stream);
        sd_state_reset(s);
        return sd_fail(st, rc, "%s (prefill failed: the state was reset to the empty sequence)", msg);
    }
    return SD_OK;
}
