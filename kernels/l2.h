// l2.h — how the kernels' weight streams use L2 (common.cuh: sd_l2_weights, sd_ldg_pol,
// sd_cp_async16_pol; linear.cuh: sd_bulk_copy_pol). A decode step reads every weight byte once
// and the next step reads it again ~6 GB of traffic later, so no weight survives in L2 from one
// step to the next; what does is the step's own working set — the KDA states and MLA cache rows
// written one step and read the next, the activations, the routing. Streamed at evict_first, the
// weights give way to that working set instead of pushing it out. The same bits either way.
// Measured on the H200 (bench_gpu_e2e kimi-linear-48b-a3b, ctx 512, 2026-12-02): the Linear and
// MoE expert streams alone (three alternating pairs) decode 2.487 -> 2.459 ms, a graph replay
// 2.422 -> 2.402; every weight stream below (five pairs) 2.505 -> 2.465, graph 2.415 -> 2.393.
// Measured and not kept (same run): each mixer's o_proj launch also asking L2 to fetch and keep
// (prefetch.global.L2::evict_last, a 128-byte line a thread) the last 12, 24 or 40 MB of the next
// layer's in-projection, to fill the latency-bound scan with its bytes: decode +22, +64 and
// +124 µs (the first 24 MB: +49) — the kept lines crowd out the working set that evict_first
// protects, and the prefetches queue ahead of the scan's own loads. Nor (2026-12-02, three
// alternating runs of two builds) did the register-path weight loads skip L1
// (ld.global.nc.L1::no_allocate): decode 2.447-2.456 -> 2.475-2.478 ms, a graph replay
// 2.385-2.388 -> 2.395-2.398.
#pragma once
#include <stdbool.h>

#ifdef __cplusplus
extern "C" {
#endif

// Weights streamed at L2 evict_first (on, the default) or with no hint (off): the Linear launches,
// the MoE experts and router, the MLA absorb and merge, the KDA gates' low-rank halves. Returns
// the previous setting. Process-wide (kernels read it at launch), for bench_gpu_e2e's A/B.
bool sd_cuda_weights_evict_first(bool on);
bool sd_cuda_weights_evict_first_on(void);

#ifdef __cplusplus
}
#endif
