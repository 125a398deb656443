// cuda_prefill.h — a long prompt on one CUDA device at GEMM speed (docs/PREFILL.md): the backend's
// prefill entry (engine/backend.h) that model.c's sd_prefill calls for prompts of more than
// SD_PREFILL_TOKEN_PATH_MAX tokens. The prompt runs in pieces of up to `chunk` tokens (default
// SD_CUDA_PREFILL_CHUNK), each piece one pass through the layers: projections and experts through
// cuBLASLt (kernels/gemm.h, BF16 operands and FP32 accumulation), KDA in its chunked form
// (kernels/kda_prefill.h), MLA as a causal flash attention over the latent cache
// (kernels/mla_prefill.h), the MoE over the entries grouped by expert (kernels/moe_prefill.h).
// Each piece is committed; the state then holds what the token path leaves — the KDA state slot
// and conv rows, the MLA cache rows — within MODEL.md's GPU tolerance, never bit for bit.
#pragma once
#include <stddef.h>
#include "cuda_backend.h" // sd_model, sd_state, sd_status

#define SD_CUDA_PREFILL_CHUNK 4096

// sd_backend.prefill of the CUDA backend: n tokens fed at s's next position, committed; logits
// (host memory) of the last position (V floats) or, with all_rows, of every position (n × V); may
// be NULL. Needs nothing pending. Errors before any work (the state unchanged): a usage error, a
// token outside the vocabulary, the context full. A failure during the work resets the state to
// the empty sequence (its live slot and conv rows may be half-written) and says so. opts->on_route
// (may be NULL) sees every MoE layer's selection of every piece, read back after the layer.
sd_code sd_cuda_prefill(const sd_model *m, sd_state *s, const int *tokens, int n, float *logits, bool all_rows,
                        const sd_prefill_opts *opts, sd_status *st);

// The piece size of m's later prefills (1 .. 65536): the scratch is made again at the next one.
sd_code sd_cuda_prefill_set_chunk(const sd_model *m, int chunk, sd_status *st);
// Device bytes the prefill scratch of m holds now (0 before its first prefill).
size_t sd_cuda_prefill_scratch_bytes(const sd_model *m);

// Frees b's prefill scratch (upload.c's backend release).
void sd_cuda_prefill_release(sd_cuda_backend *b);
