// cuda_backend.h — the CUDA backend of engine/backend.h: one device, one stream per uploaded
// model. A device model is an sd_model whose weights are the host model's arena copied into ONE
// device allocation, every tensor pointer rebased (device = base + (host - host_base)); its
// states are sd_state_init_on(..., model.backend->mem, ...): the same layout in device memory.
// sd_forward on a device model runs walk.c and ends in head.c: logits, argmaxes and draws come
// back to host memory, softmax rows (sd_forward_opts.probs) stay in device memory. Sampled
// rounds accept on the device too (accept_device.c: sd_backend.accept), reading back two ints.
#pragma once
#include <cuda_runtime_api.h> // cudaStream_t
#include <stddef.h>
#include <stdint.h>
#include "backend.h" // sd_backend, sd_model, sd_state
#include "moe_experts.h" // sd_cuda_expert

// How MoE experts run. Both arms produce the same bits (tests/test_cuda_ops.c checks it).
typedef enum {
    SD_CUDA_MOE_DEVICE_TABLE = 0, // kernels read the router's sel from device memory: no host sync
    SD_CUDA_MOE_EAGER = 1,        // the host reads sel back and launches each selected expert
} sd_cuda_moe_arm;

typedef struct sd_cuda_backend {
    sd_backend base;          // first member: a device model's backend pointer is this struct
    sd_allocator mem;         // state arenas: cudaMalloc / cudaFree / memset on `stream`
    int device;               // CUDA ordinal
    char device_name[256];    // for receipts
    cudaStream_t stream;      // every kernel of this model: its own, or another model's (share_stream)
    cudaStream_t own_stream;  // the stream created with the model, destroyed with it
    sd_cuda_moe_arm moe_arm;  // settable at any time between forwards (default: device table)
    // Owned device memory.
    void *arena;              // the weights (arena_bytes, the host arena's layout)
    size_t arena_bytes;
    sd_cuda_expert *experts;  // per MoE layer i, E entries at (i - first_k_dense_replace)·E
    int *accept_ints;         // (SD_CUDA_ACCEPT_INTS) the accept op's drafts, top and (n, bonus)
    int *nonfinite;           // (1) the forward's non-finite flag (kernels/finite.h): the first site, or INT_MAX
    // Pinned host memory. Under unified addressing (every 64-bit process) cudaMallocHost memory
    // is device-mapped at the same address, so the kernels read a forward's tokens and write
    // its argmaxes and draws there directly: no copy operations at either end of a step.
    int *tokens_host;            // (tokens_cap) a forward's tokens, read by the embedding
    bool tokens_idle;            // no launched kernel reads tokens_host: the last forward that
                                 //   wrote them ended drained; false after a failed one
    int *argmax_host;            // (tokens_cap) each output row's argmax (sd_forward_opts.argmax)
    size_t tokens_cap;
    int *sampled_host;           // (sample_cap) each output row's draw (sd_forward_opts.sampled)
    size_t sample_cap;
    int *sel_host;               // (route_cap)
    int *accept_ints_host;       // (SD_CUDA_ACCEPT_INTS)
    int *nonfinite_host;         // (1) the flag copied back at the end of each forward's launches
    float *w_host;               // (route_cap)
    size_t route_cap;
    float *router_host;          // (router_cap) the route tap's router logits (T, E), then the bias (E)
    size_t router_cap;
    int *groups_host;            // (groups_cap) the eager MoE arm's grouping, uploaded each layer
    size_t groups_cap;
    struct sd_prefill_scratch *prefill; // the prefill's scratch (cuda_prefill.h), made at the first prefill
} sd_cuda_backend;

// Devices visible to this process; 0 when there is no GPU or no driver (never aborts).
int sd_cuda_device_count(void);
// The device's marketing name (e.g. "NVIDIA H200") into buf.
sd_code sd_cuda_device_name(int device, char *buf, size_t len, sd_status *st);

// Upload a host (CPU) model to device `device` (sd_cuda_model_upload: the current device).
// dev is a new model (cfg and sha256 strings copied); sd_model_free(dev) releases everything.
sd_code sd_cuda_model_upload_on(const sd_model *host, int device, sd_model *dev, sd_status *st);
sd_code sd_cuda_model_upload(const sd_model *host, sd_model *dev, sd_status *st);

// The backend of a device model; NULL when m is not a CUDA model.
sd_cuda_backend *sd_cuda_backend_of(const sd_model *m);

// Puts b's work on owner's stream (the same device), after draining its own: a draft and its
// target then order on one stream, so a round of both can be one graph capture (cuda_door.h).
sd_code sd_cuda_backend_share_stream(sd_cuda_backend *b, const sd_cuda_backend *owner, sd_status *st);

// A state for a device model (sd_state_init_on with the model's allocator).
sd_code sd_cuda_state_init(sd_state *s, const sd_model *dev, int capacity, int max_T, sd_status *st);
