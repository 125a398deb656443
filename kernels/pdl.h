// pdl.h — programmatic dependent launch (sm_90) for the layer walk's kernels. Each walk kernel
// lets its successor launch (griddepcontrol.launch_dependents) and waits for its predecessor's
// completion and memory (griddepcontrol.wait) before it reads anything a kernel of its forward
// wrote; before the wait it may read what no kernel writes (weights: Linear and MoE blocks
// bulk-copy theirs) and, in the layer walk, what earlier forwards left (settled: the walk starts
// on a drained stream — the cursor, the KDA slot n0 and conv rows, the MLA cache rows before
// pos0; kda.h, mla.h). So each launch overlaps the previous kernel's tail instead of following
// it, and no result can change: every read of this forward's outputs comes after the wait.
// bench_gpu_e2e times the modes against each other.
//
// When a kernel lets its successor start is a choice per kernel. Most do it at their first
// instruction, so the successor's weight copies stream during their whole run. The Linear, the
// KDA conv and the KDA scan do it after their wait (sd_pdl_wait_trigger), and the one-token route
// + select after its dots (moe.cu): with every kernel triggering at its start, stream launches
// ran chains of four or five launched-but-waiting grids (in-projection → conv → scan → out →
// o_proj → router), whose early blocks and copies slowed the kernel the chain waited on; a
// captured graph did not suffer it. Measured on the H200 (bench_gpu_e2e, kimi-linear-48b-a3b ctx
// 512, one run each, two or three rounds; stream-launched decode, then its graph replay):
//   every Linear launch after its wait      2.647/2.667 -> 2.594/2.577 ms, graph 2.459-2.469 -> 2.469-2.472
//     (the o_projs alone 2.591/2.606, the in-projections alone 2.633/2.635)
//   + the KDA conv and scan after theirs     2.586/2.603 -> 2.560/2.573, graph 2.455-2.476 -> 2.478-2.484
//   + the route + select after its dots,     2.539-2.568 -> 2.520-2.529, graph 2.483-2.506 -> 2.445-2.466
//     with the one-token up's carveout (moe.cu)
// and not kept: every kind of walk kernel after its wait 2.569/2.587 (graph 2.506-2.517); the KDA
// out kernel after its wait 2.604/2.608 (o_proj's weight copies lose the scan to overlap); the
// MLA absorb and split 2.578/2.584, the merge 2.582/2.589, the MoE down and the up's shared blocks
// 2.577/2.607, the norms and the argmax 2.586/2.595 (each against 2.560/2.573); the KDA and MLA
// kernels after their waits but the Linear at its start 2.710-2.721 (against 2.635-2.658). Nor
// memory flags in place of launch boundaries (2026-11-30, same bits, every GPU suite passed): the
// up launch's shared-expert blocks waiting for a flag the route's block 0 set after the norm
// (the route letting the up launch start after its wait) 2.603-2.625 against 2.615-2.627, and
// 2.595-2.613 against 2.559-2.564 with the Linear and the conv and scan after their waits; its
// routed blocks waiting for a selection flag instead of the route launch 2.657-2.669 against
// 2.635-2.663; the next in-projection waiting for a flag the down launch's last block set
// 2.743-2.763 (graph 2.611-2.627).
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
