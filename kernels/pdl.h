// pdl.h — programmatic dependent launch (sm_90) for the layer walk's kernels. Each walk kernel
// lets its successor launch (griddepcontrol.launch_dependents) and waits for its predecessor's
// completion and memory (griddepcontrol.wait) before it reads anything a kernel of its forward
// wrote; before the wait it may read what no kernel writes (weights: Linear and MoE blocks
// bulk-copy theirs) and, in the layer walk, what earlier forwards left (settled: the walk starts
// on a settled stream — the cursor, the KDA slot n0 and conv rows, the MLA cache rows before
// pos0; kda.h, mla.h). So each launch overlaps the previous kernel's tail instead of following
// it, and no result can change: every read of this forward's outputs comes after the wait.
//
// When a kernel lets its successor start is a choice per kernel. Most do it at their first
// instruction, so the successor's weight copies stream during their whole run. The Linear, the
// KDA conv and the KDA scan do it after their wait (sd_pdl_wait_trigger), and the one-token route
// + select after its dots (moe_route.cu): with every kernel triggering at its start, stream
// launches run chains of four or five launched-but-waiting grids (in-projection → conv → scan →
// out → o_proj → router) whose early blocks and copies slow the kernel the chain waits on. Launch
// boundaries stay boundaries: memory flags in their place and L2 prefetch hints across them were
// slower (docs/EXPERIMENTS.md#pdl-trigger-after-wait, #pdl-memory-flags, #pdl-next-launch-hints).
#pragma once

#ifdef __cplusplus
extern "C" {
#endif

// How the walk's kernels launch (the bits are the same either way):
//   SD_PDL_OFF      plain stream order: a kernel launches when its predecessor has ended — a
//                   diagnostic, to see what the overlap buys (bench_gpu_e2e's "overlap off" row);
//   SD_PDL_OVERLAP  with the programmatic-serialization attribute (the default). A captured graph
//                   keeps the mode as programmatic edges.
typedef enum { SD_PDL_OFF = 0, SD_PDL_OVERLAP = 1 } sd_pdl_mode;
void sd_cuda_pdl(sd_pdl_mode mode);
sd_pdl_mode sd_cuda_pdl_mode(void);
int sd_cuda_pdl_on(void); // mode != SD_PDL_OFF

#ifdef __cplusplus
}
#endif
