// moe_route.h — the MoE router's selection on the GPU (MODEL.md "MoE"; the CPU op:
// engine/cpu/moe.c sd_moe_route) and the grouping of the forward's T·K (token, slot) entries by
// expert that the expert launches run over (moe_experts.h). What the walk calls
// (engine/cuda/moe_block.c):
//   T = 1 (and no expert groups):  sd_cuda_moe_route_select — router Linear + selection, one launch;
//   otherwise:                     the router Linear (linear.h, the norm fused), then sd_cuda_moe_select;
//   the eager arm:                 either, then sd_cuda_moe_groups_host on the host-read sel.
// The grouping: experts ascending, each expert's entries in (token, slot) order — the CPU's
// grouping; entry p of the grouping owns row p of the activation scratch h.
#pragma once
#include <cuda_runtime_api.h> // cudaStream_t
#include <stdbool.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif
#include "linear.h" // sd_lin_norm
#include "status.h" // sd_code, sd_status

// The grouping's int layout for T tokens (Gc = min(T·K, E) group slots):
//   [0] n_groups | [1, 1+Gc) expert of group g | [1+Gc, 2+2Gc) first entry of group g (g <= n_groups,
//   the last one = T·K) | [2+2Gc, +T·K) entry p's t·K+j | [.., +T·K) entry p's expert.
size_t sd_cuda_moe_groups_ints(int T, int K, int E);
// The grouping of host sel (T, K) into groups (host memory, sd_cuda_moe_groups_ints(T, K, E) ints).
void sd_cuda_moe_groups_host(const int *sel, int T, int K, int E, int *groups);

// Routing as the CPU's sd_moe_route from router logits (T, E) already computed by the router
// Linear (F32 router, linear.cuh's fixed-order dot): s = sigmoid(logit), s' = s + bias, grouped
// top-k with the CPU's tie rules (lower index wins), weights renormalised and scaled. sel, w
// (T, K) and the grouping into groups (device memory). ready: the (E + 2) readiness counters of
// the expert launches after it (moe_experts.h), zeroed before it lets its successor start — or NULL.
sd_code sd_cuda_moe_select(const float *logits, const float *bias, int T, int E, int K, int G, int topk_group,
                           bool renormalize, float scaling, int *sel, float *w, int *groups, int *ready,
                           cudaStream_t stream, sd_status *st);

// The router Linear (F32 router, the norm fused when `norm` is given: norm->x == x, block 0 writes
// norm->out; else x as is) and sd_cuda_moe_select in ONE launch for one token: the same dots and
// the same selection code, hence the same logits, sel, w and grouping. Block 0 zeroes `ready` after
// its wait; every block lets the successor start once its logits (and block 0's normed row) are
// written and fenced — so the up launch's shared-expert blocks, which read only the normed row,
// run during the selection; its routed blocks wait for this launch. The last router block to
// finish (*ticket: a zeroed counter, returned to zero) selects. Shapes:
// sd_cuda_moe_route_select_fits.
bool sd_cuda_moe_route_select_fits(int T, int E, int D, int G);
sd_code sd_cuda_moe_route_select(const float *router, const float *bias, const float *x, const sd_lin_norm *norm, int T,
                                 int E, int D, int K, int G, bool renormalize, float scaling, float *logits, int *sel,
                                 float *w, int *groups, int *ticket, int *ready, cudaStream_t stream, sd_status *st);

#ifdef __cplusplus
}
#endif
