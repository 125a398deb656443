// graph.c — capture and replay of one device forward (cuda_graph.h). The captured work is exactly
// sd_cuda_forward's launches between its token upload and its readback (walk.c sd_cuda_walk, then
// the head's rmsnorm, lm_head and argmax), reading tokens from and writing argmaxes to the
// graph's own pinned, device-mapped buffers, so a replay computes what sd_forward would, bit for bit.
#include "cuda_graph.h"
#include <string.h>
#include "check.h"         // SD_CUDA_CHECK
#include "cuda_internal.h" // sd_cuda_walk, sd_cuda_head_logits, sd_cuda_state_is_ours, sd_cuda_nonfinite_take
#include "cursor.h"        // sd_cuda_cursor_set

// The graph's body on b->stream (in capture mode).
static sd_code enqueue(sd_cuda_backend *b, const sd_model *m, sd_state *s, const sd_cuda_graph *g, sd_status *st) {
    SD_TRY(sd_cuda_walk(b, m, s, g->tokens_host, g->T, NULL, st));
    return sd_cuda_head_argmax(b, m, s, 0, g->T, g->argmax_host, st);
}

sd_code sd_cuda_graph_capture(const sd_model *m, sd_state *s, int T, sd_cuda_graph *g, sd_status *st) {
    memset(g, 0, sizeof *g);
    sd_cuda_backend *b = sd_cuda_backend_of(m);
    if (!b || !sd_cuda_state_is_ours(b, s))
        return sd_fail(st, SD_ERR_USAGE, "cuda graph: the model and the state must be on the same CUDA device");
    if (b->moe_arm == SD_CUDA_MOE_EAGER)
        return sd_fail(st, SD_ERR_USAGE, "cuda graph: the eager MoE arm syncs with the host and cannot be captured; "
                                         "use the device-table arm");
    if (T < 1 || T > s->max_T)
        return sd_fail(st, SD_ERR_USAGE, "cuda graph: T = %d outside 1..%d (the state's max_T)", T, s->max_T);
    *g = (sd_cuda_graph){.model = m, .state = s, .T = T};
    SD_CUDA_CHECK(st, cudaSetDevice(b->device));
    sd_code rc = SD_OK;
    if ((cudaMallocHost((void **)&g->tokens_host, sizeof(int) * (size_t)T) != cudaSuccess ||
                cudaMallocHost((void **)&g->argmax_host, sizeof(int) * (size_t)T) != cudaSuccess))
        rc = sd_fail(st, SD_ERR_SYS, "cuda graph: cannot allocate the token buffers: %s", cudaGetErrorString(cudaGetLastError()));
    // Zeroed tokens: a replay before any upload still reads valid ids.
    if (!rc) memset(g->tokens_host, 0, sizeof(int) * (size_t)T);
    cudaGraph_t graph = NULL;
    if (!rc) {
        cudaError_t e = cudaStreamBeginCapture(b->stream, cudaStreamCaptureModeThreadLocal);
        if (e != cudaSuccess) rc = sd_fail(st, SD_ERR_SYS, "cuda graph: begin capture: %s", cudaGetErrorString(e));
    }
    if (!rc) {
        // The launches keep the process's overlap mode (pdl.h): captured, it becomes the graph's
        // programmatic edges, so a replay overlaps each kernel's prologue (its weight copies)
        // with its predecessor's tail as a stream launch does.
        sd_comm_capture_begin(m->comm);
        sd_code body = enqueue(b, m, s, g, st);
        cudaError_t e = cudaStreamEndCapture(b->stream, &graph); // always end what began
        sd_status wst = {0};
        const sd_code win = sd_comm_capture_end(m->comm, &g->window, &wst);
        if (body) rc = body;
        else if (e != cudaSuccess) rc = sd_fail(st, SD_ERR_SYS, "cuda graph: end capture: %s", cudaGetErrorString(e));
        else if (win) rc = sd_fail(st, win, "%s", wst.msg);
    }
    if (!rc) {
        cudaGraphExec_t exec = NULL;
        cudaError_t e = cudaGraphInstantiate(&exec, graph, 0);
        if (e != cudaSuccess) rc = sd_fail(st, SD_ERR_SYS, "cuda graph: instantiate: %s", cudaGetErrorString(e));
        g->exec = exec;
    }
    if (graph) cudaGraphDestroy(graph);
    if (rc) {
        (void)cudaGetLastError();
        sd_cuda_graph_free(g);
    }
    return rc;
}

static sd_code launch(void *ctx, sd_status *st) {
    const sd_cuda_graph *g = ctx;
    SD_CUDA_CHECK(st, cudaGraphLaunch((cudaGraphExec_t)g->exec, sd_cuda_backend_of(g->model)->stream));
    return SD_OK;
}

sd_code sd_cuda_graph_forward(sd_cuda_graph *g, const int *tokens, int *argmax, sd_status *st) {
    if (!g->exec) return sd_fail(st, SD_ERR_USAGE, "cuda graph: not captured");
    sd_state *s = g->state;
    const int T = g->T;
    sd_code rc = sd_forward_check(g->model, s, tokens, T, st);
    if (rc) return rc;
    sd_cuda_backend *b = sd_cuda_backend_of(g->model);
    SD_CUDA_CHECK(st, cudaSetDevice(b->device));
    memcpy(g->tokens_host, tokens, sizeof(int) * (size_t)T); // the previous replay drained; the embedding reads them here
    SD_TRY(sd_comm_replay(g->model->comm, &g->window, launch, g, st));
    SD_CUDA_CHECK(st, cudaStreamSynchronize(b->stream)); // its argmax kernel wrote argmax_host
    SD_TRY(sd_comm_check(g->model->comm, st));
    if (sd_cuda_nonfinite_take(b, &g->model->cfg, st)) { // the graph advanced the device cursor: put it back
        sd_status ignored = {0};
        sd_cuda_cursor_set(s->cursor, s->len, s->pending, b->stream, &ignored);
        cudaStreamSynchronize(b->stream);
        return SD_ERR_NONFINITE;
    }
    memcpy(argmax, g->argmax_host, sizeof(int) * (size_t)T);
    sd_state_advance(s, T); // the graph advanced the device cursor
    return SD_OK;
}

void sd_cuda_graph_free(sd_cuda_graph *g) {
    if (g->exec) cudaGraphExecDestroy((cudaGraphExec_t)g->exec);
    cudaFreeHost(g->tokens_host);
    cudaFreeHost(g->argmax_host);
    sd_comm_window_free(&g->window);
    memset(g, 0, sizeof *g);
}
