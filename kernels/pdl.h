// pdl.h — programmatic dependent launch (sm_90) for the layer walk's kernels. Each walk kernel
// lets its successor launch as soon as all of its own blocks are running (griddepcontrol
// .launch_dependents) and waits for its predecessor's completion and memory (griddepcontrol
// .wait) before it reads anything a kernel of its forward wrote; before the wait it may read
// what no kernel writes (weights: Linear and MoE blocks bulk-copy theirs) and, in the layer walk,
// what earlier forwards left (settled: the walk starts on a drained stream — the cursor, the KDA
// slot n0 and conv rows, the MLA cache rows before pos0; kda.h, mla.h). So each launch overlaps
// the previous kernel's tail instead of following it, and no result can change: every read of
// this forward's outputs comes after the wait. bench_gpu_e2e times the modes against each other.
#pragma once

#ifdef __cplusplus
extern "C" {
#endif

// How the walk's kernels launch (the bits are the same either way):
//   SD_PDL_OFF      plain stream order: a kernel launches when its predecessor has ended;
//   SD_PDL_OVERLAP  with the programmatic-serialization attribute (the default).
// Measured on the H200 (bench_gpu_e2e, kimi-linear-48b-a3b ctx 512): at first (stream launches)
// decode 3.88 ms with the overlap against 4.05 without, and a captured graph 3.74 against 3.65,
// so graphs were captured without it; once the kernels copied their weights before their wait
// (Linear BULK, the MoE down), a graph with it is the faster: 2.967 -> 2.751 ms (stream launches
// 2.90), so sd_cuda_graph_capture now captures in the current mode. Bulk-prefetching each Linear
// block's weight rows into L2 before
// its wait (at T = 1 too) was slower in both (3.92 / 3.82). So was handing a launch the
// NEXT launch's weights for its last blocks to bulk-prefetch into L2 as they finish (in-proj ->
// o_proj, o_proj -> router, up -> the selected downs, down -> the next in-proj): 2.999 ms off,
// 3.03-3.15 per hint, 3.23 all; the later launches got no faster from L2. Nor a launch's
// first-wave blocks bulk-prefetching the rows of the block that takes their place a wave later
// (2026-11-30, multi-wave launches only; same bits, every GPU suite passed): decode 2.674-2.706
// -> 2.784-2.787 ms for the Linear kernels, 2.700-2.734 for the MoE down, 2.811-2.831 for the
// MoE up, 2.925-2.935 all three.
typedef enum { SD_PDL_OFF = 0, SD_PDL_OVERLAP = 1 } sd_pdl_mode;
void sd_cuda_pdl(sd_pdl_mode mode);
sd_pdl_mode sd_cuda_pdl_mode(void);
int sd_cuda_pdl_on(void); // mode != SD_PDL_OFF

#ifdef __cplusplus
}
#endif
