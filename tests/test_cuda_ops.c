// test_cuda_ops.c — every launcher of kernels/*.h against the CPU reference, as ONE table of cases
// run by one loop (ggml's test-backend-ops habit). A case names the launchers it checks (.op:
// test_op_coverage fails when an exported launcher has no case, or a case names one that no
// header declares), its shape, its weights' dtype and its tolerance against the CPU — an NMSE
// bound (NaN/Inf fails) or TOL_BITWISE. Its run function (tests/cuda_ops/<family>.c, one file per
// family of kernels/*.h; cuda_ops/op_cases.h declares them) draws fresh random inputs, computes the
// CPU reference (an engine CPU op, or a plain-C twin of MODEL.md where the engine's op is not
// separable), runs the launchers on guarded device buffers (sentinels either side, checked when
// each buffer is released), compares, and checks the exactness laws bit for bit: a token alone ≡
// inside a T-token call (verify ≡ decode), one launch ≡ the launches it fuses, both MoE arms
// equal. The prefill's kernels, never bitwise the token path, check their own laws bit for bit
// instead: two pieces ≡ one call, in place ≡ out of place, a call repeated ≡ itself. Without a
// device (or without the CUDA build) every test reports itself skipped — never passed.
#include <stdio.h>
#include "common.h"

#if !SPECDEC_HAVE_CUDA
Test(cuda, suite) { cr_skip_test("CUDA backend not built (no toolkit or -DSPECDEC_CUDA=OFF): GPU suite skipped"); }
#else
#include "cuda_ops/op_cases.h" // the run functions, TOL_BF16, TOL_MMA, TOL_CHUNK
#include <cuda_runtime_api.h>
#include "gemm.h" // SD_GEMM_WT, SD_GEMM_WN (the GEMM cases' shapes)

uint64_t case_seed; // cuda_harness.h: the running case's (every input of a case is drawn from it)
char LABEL[256];    // cuda_harness.h: the running case, at the head of every message

// ---------------------------------------------------------------------------- a device rank's ops
#include "sampling.h"   // sd_cuda_argmax, SD_ARGMAX_WS_INTS (the tp cases)
#include "synth_fill.h" // sd_cuda_synth_fill_slice
#include "cuda_tp_cases.h" // run_tp_reduce, run_tp_argmax, run_tp_lay_rows, run_synth_fill_slice

// ---------------------------------------------------------------------------- the table
// Tolerances: the TOL_* of cuda_harness.h and cuda_ops/op_cases.h (their reasons stand there); a
// case's other comparisons name theirs.
static const op_case CASES[] = {
    // A device rank's all-reduce sum and head (engine/parallel/'s twins, bitwise).
    {.op = "sd_cuda_tp_reduce", .note = "one rank", .run = run_tp_reduce, .shape = {1, 1, 2304, 1}, .tol = TOL_BITWISE},
    {.op = "sd_cuda_tp_reduce", .run = run_tp_reduce, .shape = {1, 9, 64, 0}, .tol = TOL_BITWISE},
    {.op = "sd_cuda_tp_reduce", .run = run_tp_reduce, .shape = {2, 5, 100, 1}, .tol = TOL_BITWISE},
    {.op = "sd_cuda_tp_reduce", .run = run_tp_reduce, .shape = {3, 9, 2304, 1}, .tol = TOL_BITWISE},
    {.op = "sd_cuda_tp_reduce", .run = run_tp_reduce, .shape = {4, 2, 37, 0}, .tol = TOL_BITWISE},
    {.op = "sd_cuda_tp_reduce", .run = run_tp_reduce, .shape = {5, 64, 24, 0}, .tol = TOL_BITWISE},
    {.op = "sd_cuda_tp_reduce", .run = run_tp_reduce, .shape = {6, 3, 513, 1}, .tol = TOL_BITWISE},
    {.op = "sd_cuda_tp_reduce", .run = run_tp_reduce, .shape = {7, 1, 2304, 1}, .tol = TOL_BITWISE},
    {.op = "sd_cuda_tp_reduce", .run = run_tp_reduce, .shape = {8, 9, 2304, 1}, .tol = TOL_BITWISE},
    {.op = "sd_cuda_tp_argmax_pairs, sd_cuda_tp_argmax_combine", .note = "one rank", .run = run_tp_argmax, .shape = {1, 5, 5000}, .tol = TOL_BITWISE},
    {.op = "sd_cuda_tp_argmax_pairs, sd_cuda_tp_argmax_combine", .run = run_tp_argmax, .shape = {2, 5, 67}, .tol = TOL_BITWISE},
    {.op = "sd_cuda_tp_argmax_pairs, sd_cuda_tp_argmax_combine", .run = run_tp_argmax, .shape = {3, 10, 67}, .tol = TOL_BITWISE},
    {.op = "sd_cuda_tp_argmax_pairs, sd_cuda_tp_argmax_combine", .note = "vocabulary rows", .run = run_tp_argmax, .shape = {4, 5, 163840}, .tol = TOL_BITWISE},
    {.op = "sd_cuda_tp_argmax_pairs, sd_cuda_tp_argmax_combine", .run = run_tp_argmax, .shape = {8, 9, 67}, .tol = TOL_BITWISE},
    {.op = "sd_cuda_tp_argmax_pairs, sd_cuda_tp_argmax_combine", .note = "ranks holding no row", .run = run_tp_argmax, .shape = {8, 5, 5}, .tol = TOL_BITWISE},
    {.op = "sd_cuda_tp_lay_rows", .note = "one rank", .run = run_tp_lay_rows, .shape = {1, 3, 67}, .tol = TOL_BITWISE},
    {.op = "sd_cuda_tp_lay_rows", .run = run_tp_lay_rows, .shape = {3, 9, 67}, .tol = TOL_BITWISE},
    {.op = "sd_cuda_tp_lay_rows", .note = "vocabulary rows", .run = run_tp_lay_rows, .shape = {8, 2, 163840}, .tol = TOL_BITWISE},
    {.op = "sd_cuda_tp_lay_rows", .note = "ranks holding no row", .run = run_tp_lay_rows, .shape = {8, 4, 5}, .tol = TOL_BITWISE},
    // A rank's shard synthesised where it lives: the whole tensor's bytes at its elements.
    {.op = "sd_cuda_synth_fill_slice", .note = "rows", .run = run_synth_fill_slice, .shape = {1, 0, 3, 1}, .tol = TOL_BITWISE},
    {.op = "sd_cuda_synth_fill_slice", .note = "columns", .run = run_synth_fill_slice, .shape = {1, 1, 3, 2}, .tol = TOL_BITWISE},
    {.op = "sd_cuda_synth_fill_slice", .note = "columns", .run = run_synth_fill_slice, .shape = {0, 1, 4, 3}, .tol = TOL_BITWISE},
    {.op = "sd_cuda_synth_fill_slice", .note = "a vector span", .run = run_synth_fill_slice, .shape = {0, 2, 3, 1}, .tol = TOL_BITWISE},
    {.op = "sd_cuda_synth_fill_slice", .note = "rows", .run = run_synth_fill_slice, .shape = {1, 0, 8, 7}, .tol = TOL_BITWISE},
    {.op = "sd_cuda_synth_fill_slice", .note = "the whole tensor", .run = run_synth_fill_slice, .shape = {0, 0, 1, 0}, .tol = TOL_BITWISE},
    // Linear (TOL_DOT); a token alone ≡ inside the call, bitwise.
    {.op = "sd_cuda_linear", .run = run_linear, .shape = {64, 32, 1}, .dt = SD_DT_F32, .tol = TOL_DOT},
    {.op = "sd_cuda_linear", .run = run_linear, .shape = {37, 40, 5}, .dt = SD_DT_BF16, .tol = TOL_DOT},
    {.op = "sd_cuda_linear", .run = run_linear, .shape = {300, 2304, 8}, .dt = SD_DT_BF16, .tol = TOL_DOT},
    {.op = "sd_cuda_linear", .note = "two tiles of 32 tokens", .run = run_linear, .shape = {129, 515, 33}, .dt = SD_DT_F32, .tol = TOL_DOT},
    {.op = "sd_cuda_linear", .run = run_linear, .shape = {16, 7, 3}, .dt = SD_DT_F32, .tol = TOL_DOT},
    {.op = "sd_cuda_linear", .run = run_linear, .shape = {33, 36, 17}, .dt = SD_DT_BF16, .tol = TOL_DOT},
    {.op = "sd_cuda_linear", .run = run_linear, .shape = {8, 1024, 32}, .dt = SD_DT_BF16, .tol = TOL_DOT},
    {.op = "sd_cuda_linear", .run = run_linear, .shape = {1000, 64, 2}, .dt = SD_DT_F32, .tol = TOL_DOT},
    {.op = "sd_cuda_linear", .note = "four rows a warp (a verify launch that fills the device), a 3-row tail", .run = run_linear, .shape = {9219, 2304, 9}, .dt = SD_DT_BF16, .tol = TOL_DOT},
    {.op = "sd_cuda_linear", .note = "four rows a warp asked of an F32 matrix: pairs", .run = run_linear, .shape = {9218, 64, 5}, .dt = SD_DT_F32, .tol = TOL_DOT},
    {.op = "sd_cuda_linear", .note = "rows too wide for a BULK block", .run = run_linear, .shape = {37, 9216, 3}, .dt = SD_DT_BF16, .tol = TOL_DOT},
    {.op = "sd_cuda_linear", .note = "rows too wide for a BULK block", .run = run_linear, .shape = {21, 12288, 2}, .dt = SD_DT_BF16, .tol = TOL_DOT},
    {.op = "sd_cuda_linear", .note = "rows too wide for a BULK block", .run = run_linear, .shape = {19, 6144, 2}, .dt = SD_DT_F32, .tol = TOL_DOT},
    // STORE, ADD and SWIGLU jobs in one launch (TOL_DOT); each STORE job ≡ its Linear alone, bitwise.
    {.op = "sd_cuda_linear_multi", .note = "BULK", .run = run_linear_multi, .shape = {1, 256, 300, 64, 200, 0, 0}, .dt = SD_DT_BF16, .tol = TOL_DOT},
    {.op = "sd_cuda_linear_multi", .note = "9 jobs: two launches", .run = run_linear_multi, .shape = {2, 512, 37, 129, 96, 6, 0}, .dt = SD_DT_F32, .tol = TOL_DOT},
    {.op = "sd_cuda_linear_multi", .note = "two tokens, unaligned strided ADD", .run = run_linear_multi, .shape = {2, 64, 33, 17, 24, 3, 1}, .dt = SD_DT_F32, .tol = TOL_DOT},
    {.op = "sd_cuda_linear_multi", .note = "unaligned strided ADD", .run = run_linear_multi, .shape = {5, 96, 70, 50, 40, 2, 1}, .dt = SD_DT_BF16, .tol = TOL_DOT},
    {.op = "sd_cuda_linear_multi", .note = "two tiles of 32 tokens", .run = run_linear_multi, .shape = {33, 200, 64, 48, 80, 0, 1}, .dt = SD_DT_F32, .tol = TOL_DOT},
    {.op = "sd_cuda_linear_multi", .note = "40 tokens", .run = run_linear_multi, .shape = {40, 2304, 64, 40, 128, 1, 0}, .dt = SD_DT_BF16, .tol = TOL_DOT},
    {.op = "sd_cuda_linear_multi", .note = "rows too wide for BULK", .run = run_linear_multi, .shape = {1, 9216, 21, 16, 8, 0, 0}, .dt = SD_DT_BF16, .tol = TOL_DOT},
    // The norm fused into the Linears: bitwise against sd_cuda_rmsnorm then sd_cuda_linear_multi (the
    // contract); against the CPU within TOL_ELEM (the normed rows) and TOL_DOT (the jobs).
    {.op = "sd_cuda_linear_multi_norm", .note = "fused", .run = run_linear_multi_norm, .shape = {1, 2304, 300, 96, 64}, .dt = SD_DT_BF16, .tol = TOL_BITWISE},
    {.op = "sd_cuda_linear_multi_norm", .note = "fused, 32 KB of normed rows", .run = run_linear_multi_norm, .shape = {2, 4096, 64, 40, 33}, .dt = SD_DT_BF16, .tol = TOL_BITWISE},
    {.op = "sd_cuda_linear_multi_norm", .note = "fused, a row past the register norm", .run = run_linear_multi_norm, .shape = {1, 5000, 40, 16, 21}, .dt = SD_DT_F32, .tol = TOL_BITWISE},
    {.op = "sd_cuda_linear_multi_norm", .note = "fused, narrow", .run = run_linear_multi_norm, .shape = {2, 36, 64, 32, 20}, .dt = SD_DT_F32, .tol = TOL_BITWISE},
    {.op = "sd_cuda_linear_multi_norm", .note = "three tokens: two launches", .run = run_linear_multi_norm, .shape = {3, 512, 100, 64, 37}, .dt = SD_DT_BF16, .tol = TOL_BITWISE},
    {.op = "sd_cuda_linear_multi_norm", .note = "n % 4 != 0: two launches", .run = run_linear_multi_norm, .shape = {1, 37, 20, 16, 9}, .dt = SD_DT_F32, .tol = TOL_BITWISE},
    // RMSNorm (TOL_ELEM).
    {.op = "sd_cuda_rmsnorm", .run = run_rmsnorm, .shape = {5, 2304, 0}, .tol = TOL_ELEM},
    {.op = "sd_cuda_rmsnorm", .run = run_rmsnorm, .shape = {3, 37, 0}, .tol = TOL_ELEM},
    {.op = "sd_cuda_rmsnorm", .run = run_rmsnorm, .shape = {1, 8, 0}, .tol = TOL_ELEM},
    {.op = "sd_cuda_rmsnorm", .note = "in place", .run = run_rmsnorm, .shape = {9, 512, 1}, .tol = TOL_ELEM},
    {.op = "sd_cuda_rmsnorm", .note = "past the register path", .run = run_rmsnorm, .shape = {2, 5000, 0}, .tol = TOL_ELEM},
    {.op = "sd_cuda_rmsnorm", .note = "in place", .run = run_rmsnorm, .shape = {4, 4096, 1}, .tol = TOL_ELEM},
    // The norm that checks the residual stream it reads: sd_cuda_rmsnorm's bits, the flag exact.
    {.op = "sd_cuda_rmsnorm_flagged", .run = run_rmsnorm_flagged, .shape = {5, 2304}, .tol = TOL_BITWISE},
    {.op = "sd_cuda_rmsnorm_flagged", .note = "past the register path", .run = run_rmsnorm_flagged, .shape = {3, 7000}, .tol = TOL_BITWISE},
    // Embedding rows widened exactly: bitwise.
    {.op = "sd_cuda_embed", .run = run_embed, .shape = {50, 72, 6, 0}, .dt = SD_DT_BF16, .tol = TOL_BITWISE},
    {.op = "sd_cuda_embed", .run = run_embed, .shape = {50, 72, 6, 0}, .dt = SD_DT_F32, .tol = TOL_BITWISE},
    {.op = "sd_cuda_embed", .note = "ids in pinned memory", .run = run_embed, .shape = {1000, 2304, 5, 1}, .dt = SD_DT_BF16, .tol = TOL_BITWISE},
    {.op = "sd_cuda_embed", .note = "ids in pinned memory", .run = run_embed, .shape = {300, 64, 1, 1}, .dt = SD_DT_F32, .tol = TOL_BITWISE},
    // The cursor's integers: exact.
    {.op = "sd_cuda_cursor_set, sd_cuda_cursor_advance, sd_cuda_cursor_commit", .run = run_cursor, .tol = TOL_BITWISE},
    // The non-finite flag: the smallest site that saw a NaN or an Inf, exactly; one row and many blocks.
    {.op = "sd_cuda_finite_reset, sd_cuda_finite_check", .run = run_finite, .shape = {1, 32}, .tol = TOL_BITWISE},
    {.op = "sd_cuda_finite_check", .note = "grid-stride past one wave", .run = run_finite, .shape = {17, 7168}, .tol = TOL_BITWISE},
    // KDA conv: qc, kc, vc TOL_ELEM; the gates TOL_DOT; the ring and one token at a time bitwise.
    // W = 9 passes the kernel's register window (CONV_WMAX 8); pos0 = 2 with W = 9 reaches before 0.
    {.op = "sd_cuda_kda_conv", .run = run_kda_conv, .shape = {2, 16, 4, 1, 0, 0, 0, 0}, .dt = SD_DT_F32, .tol = TOL_ELEM},
    {.op = "sd_cuda_kda_conv", .run = run_kda_conv, .shape = {3, 64, 4, 3, 0, 1, 0, 0}, .dt = SD_DT_BF16, .tol = TOL_ELEM},
    {.op = "sd_cuda_kda_conv", .run = run_kda_conv, .shape = {2, 128, 4, 3, 13, 0, 1, 2}, .dt = SD_DT_BF16, .tol = TOL_ELEM},
    {.op = "sd_cuda_kda_conv", .run = run_kda_conv, .shape = {2, 64, 9, 3, 2, 1, 1, 0}, .dt = SD_DT_F32, .tol = TOL_ELEM},
    {.op = "sd_cuda_kda_conv", .run = run_kda_conv, .shape = {1, 128, 9, 1, 40, 0, 0, 3}, .dt = SD_DT_BF16, .tol = TOL_ELEM},
    {.op = "sd_cuda_kda_conv", .run = run_kda_conv, .shape = {4, 16, 9, 3, 11, 1, 0, 1}, .dt = SD_DT_BF16, .tol = TOL_ELEM},
    {.op = "sd_cuda_kda_conv", .run = run_kda_conv, .shape = {2, 64, 4, 1, 5, 1, 1, 0}, .dt = SD_DT_F32, .tol = TOL_ELEM},
    {.op = "sd_cuda_kda_conv", .run = run_kda_conv, .shape = {2, 40, 4, 3, 6, 0, 0, 0}, .dt = SD_DT_BF16, .tol = TOL_ELEM},
    {.op = "sd_cuda_kda_conv", .run = run_kda_conv, .shape = {3, 128, 4, 3, 1, 0, 1, 0}, .dt = SD_DT_F32, .tol = TOL_ELEM},
    // KDA scan (TOL_SEQ): d 8, 16 (a thread a column), 32..128 (the tiled scan; T = 17 takes two
    // chunks), 40 (any d); raw and final gates; slots n0 = 0, 7, 300.
    {.op = "sd_cuda_kda_scan", .run = run_kda_scan, .shape = {3, 16, 1, 7, 1, 0, 0, 0}, .tol = TOL_SEQ},
    {.op = "sd_cuda_kda_scan", .run = run_kda_scan, .shape = {3, 16, 5, 0, 0, 1, 0, 0}, .tol = TOL_SEQ},
    {.op = "sd_cuda_kda_scan", .run = run_kda_scan, .shape = {3, 16, 17, 300, 1, 0, 1, 0}, .tol = TOL_SEQ},
    {.op = "sd_cuda_kda_scan", .run = run_kda_scan, .shape = {3, 32, 1, 0, 0, 1, 1, 0}, .tol = TOL_SEQ},
    {.op = "sd_cuda_kda_scan", .run = run_kda_scan, .shape = {3, 32, 5, 7, 1, 0, 0, 2}, .tol = TOL_SEQ},
    {.op = "sd_cuda_kda_scan", .run = run_kda_scan, .shape = {3, 32, 17, 7, 1, 1, 0, 0}, .tol = TOL_SEQ},
    {.op = "sd_cuda_kda_scan", .run = run_kda_scan, .shape = {3, 64, 1, 300, 1, 1, 0, 0}, .tol = TOL_SEQ},
    {.op = "sd_cuda_kda_scan", .run = run_kda_scan, .shape = {3, 64, 5, 7, 0, 0, 1, 0}, .tol = TOL_SEQ},
    {.op = "sd_cuda_kda_scan", .run = run_kda_scan, .shape = {3, 64, 17, 0, 1, 0, 0, 1}, .tol = TOL_SEQ},
    {.op = "sd_cuda_kda_scan", .run = run_kda_scan, .shape = {2, 96, 1, 7, 0, 0, 0, 0}, .tol = TOL_SEQ},
    {.op = "sd_cuda_kda_scan", .run = run_kda_scan, .shape = {2, 96, 5, 0, 1, 1, 1, 0}, .tol = TOL_SEQ},
    {.op = "sd_cuda_kda_scan", .run = run_kda_scan, .shape = {2, 96, 17, 7, 1, 0, 0, 0}, .tol = TOL_SEQ},
    {.op = "sd_cuda_kda_scan", .run = run_kda_scan, .shape = {2, 128, 1, 7, 1, 0, 1, 0}, .tol = TOL_SEQ},
    {.op = "sd_cuda_kda_scan", .run = run_kda_scan, .shape = {2, 128, 5, 300, 1, 1, 0, 0}, .tol = TOL_SEQ},
    {.op = "sd_cuda_kda_scan", .run = run_kda_scan, .shape = {2, 128, 17, 7, 0, 1, 1, 0}, .tol = TOL_SEQ},
    {.op = "sd_cuda_kda_scan", .run = run_kda_scan, .shape = {3, 40, 1, 0, 1, 1, 0, 0}, .tol = TOL_SEQ},
    {.op = "sd_cuda_kda_scan", .run = run_kda_scan, .shape = {3, 40, 5, 7, 1, 0, 1, 0}, .tol = TOL_SEQ},
    {.op = "sd_cuda_kda_scan", .run = run_kda_scan, .shape = {3, 40, 17, 7, 0, 0, 0, 2}, .tol = TOL_SEQ},
    {.op = "sd_cuda_kda_scan", .run = run_kda_scan, .shape = {4, 8, 5, 3, 1, 0, 0, 0}, .tol = TOL_SEQ},
    // KDA output norm and gate (TOL_ELEM).
    {.op = "sd_cuda_kda_out", .run = run_kda_out, .shape = {1, 3, 16}, .tol = TOL_ELEM},
    {.op = "sd_cuda_kda_out", .run = run_kda_out, .shape = {5, 2, 128}, .tol = TOL_ELEM},
    {.op = "sd_cuda_kda_out", .run = run_kda_out, .shape = {3, 4, 40}, .tol = TOL_ELEM},
    {.op = "sd_cuda_kda_out", .run = run_kda_out, .shape = {17, 2, 64}, .tol = TOL_ELEM},
    // MLA (mo TOL_SEQ; the cache rows TOL_ELEM or bitwise; one token at a time bitwise). pos0 = 700:
    // up to 23 chunks of 32 rows a token; Hm not a multiple of the split's 4 heads a block; R = 512,
    // dr = 64 the compiled Kimi split; dn = 160 past the absorb's preloaded groups; dr = 6 unvectorised.
    {.op = "sd_cuda_mla_attend", .run = run_mla, .shape = {5, 24, 16, 20, 64, 3, 0, 1}, .dt = SD_DT_BF16, .tol = TOL_SEQ},
    {.op = "sd_cuda_mla_attend", .run = run_mla, .shape = {5, 24, 16, 20, 64, 3, 700, 7}, .dt = SD_DT_F32, .tol = TOL_SEQ},
    {.op = "sd_cuda_mla_attend", .run = run_mla, .shape = {3, 16, 6, 16, 40, 1, 700, 0}, .dt = SD_DT_F32, .tol = TOL_SEQ},
    {.op = "sd_cuda_mla_attend", .run = run_mla, .shape = {3, 16, 6, 16, 40, 3, 0, 6}, .dt = SD_DT_BF16, .tol = TOL_SEQ},
    {.op = "sd_cuda_mla_attend", .note = "Kimi's shapes", .run = run_mla, .shape = {4, 128, 64, 128, 512, 3, 700, 3}, .dt = SD_DT_BF16, .tol = TOL_SEQ},
    {.op = "sd_cuda_mla_attend", .note = "Kimi's shapes", .run = run_mla, .shape = {4, 128, 64, 128, 512, 1, 0, 0}, .dt = SD_DT_F32, .tol = TOL_SEQ},
    {.op = "sd_cuda_mla_attend", .run = run_mla, .shape = {8, 64, 32, 64, 128, 3, 37, 5}, .dt = SD_DT_BF16, .tol = TOL_SEQ},
    {.op = "sd_cuda_mla_attend", .run = run_mla, .shape = {2, 160, 8, 24, 96, 3, 50, 1}, .dt = SD_DT_F32, .tol = TOL_SEQ},
    // MoE selection: sel and the grouping bitwise, the weights TOL_ELEM (one device expf in the
    // sigmoid, the sum in another order).
    {.op = "sd_cuda_moe_select", .run = run_moe_select, .shape = {256, 8, 1, 1, 1, 0}, .tol = TOL_ELEM},
    {.op = "sd_cuda_moe_select", .run = run_moe_select, .shape = {256, 8, 1, 1, 4, 0}, .tol = TOL_ELEM},
    {.op = "sd_cuda_moe_select", .note = "ties", .run = run_moe_select, .shape = {256, 8, 1, 1, 2, 1}, .tol = TOL_ELEM},
    {.op = "sd_cuda_moe_select", .run = run_moe_select, .shape = {64, 6, 1, 1, 3, 0}, .tol = TOL_ELEM},
    {.op = "sd_cuda_moe_select", .note = "ties", .run = run_moe_select, .shape = {64, 6, 1, 1, 3, 1}, .tol = TOL_ELEM},
    {.op = "sd_cuda_moe_select", .run = run_moe_select, .shape = {48, 4, 1, 1, 5, 0}, .tol = TOL_ELEM},
    {.op = "sd_cuda_moe_select", .run = run_moe_select, .shape = {16, 2, 1, 1, 9, 0}, .tol = TOL_ELEM},
    {.op = "sd_cuda_moe_select", .note = "ties", .run = run_moe_select, .shape = {16, 2, 1, 1, 9, 1}, .tol = TOL_ELEM},
    {.op = "sd_cuda_moe_select", .note = "expert groups", .run = run_moe_select, .shape = {64, 6, 8, 3, 9, 0}, .tol = TOL_ELEM},
    // The one-token route + select: bitwise against the router Linear and sd_cuda_moe_select.
    {.op = "sd_cuda_moe_route_select", .run = run_moe_route_select, .shape = {256, 8, 2304, 1}, .tol = TOL_BITWISE},
    {.op = "sd_cuda_moe_route_select", .run = run_moe_route_select, .shape = {256, 8, 512, 0}, .tol = TOL_BITWISE},
    {.op = "sd_cuda_moe_route_select", .run = run_moe_route_select, .shape = {16, 2, 512, 1}, .tol = TOL_BITWISE},
    {.op = "sd_cuda_moe_route_select", .run = run_moe_route_select, .shape = {20, 3, 64, 0}, .tol = TOL_BITWISE},
    {.op = "sd_cuda_moe_route_select", .run = run_moe_route_select, .shape = {64, 6, 36, 1}, .tol = TOL_BITWISE},
    // Routed and shared experts with the combine: vs the twin TOL_DOT (three dots and a silu an
    // output); the two arms bitwise equal.
    {.op = "sd_cuda_moe_up, sd_cuda_moe_down", .run = run_moe_experts, .shape = {8, 2, 64, 32, 1, 1, 0}, .dt = SD_DT_F32, .tol = TOL_DOT},
    {.op = "sd_cuda_moe_up, sd_cuda_moe_down", .run = run_moe_experts, .shape = {8, 2, 64, 32, 1, 2, 1}, .dt = SD_DT_BF16, .tol = TOL_DOT},
    {.op = "sd_cuda_moe_up, sd_cuda_moe_down", .note = "shared expert two wide", .run = run_moe_experts, .shape = {16, 4, 256, 96, 2, 5, 1}, .dt = SD_DT_BF16, .tol = TOL_DOT},
    {.op = "sd_cuda_moe_up, sd_cuda_moe_down", .note = "no shared expert", .run = run_moe_experts, .shape = {16, 4, 256, 96, 0, 9, 0}, .dt = SD_DT_F32, .tol = TOL_DOT},
    {.op = "sd_cuda_moe_up, sd_cuda_moe_down", .note = "Kimi's widths", .run = run_moe_experts, .shape = {32, 8, 2304, 128, 1, 1, 1}, .dt = SD_DT_BF16, .tol = TOL_DOT},
    {.op = "sd_cuda_moe_up, sd_cuda_moe_down", .note = "Kimi's widths", .run = run_moe_experts, .shape = {32, 8, 2304, 128, 1, 2, 0}, .dt = SD_DT_BF16, .tol = TOL_DOT},
    {.op = "sd_cuda_moe_up, sd_cuda_moe_down", .note = "D not a multiple of 16", .run = run_moe_experts, .shape = {4, 2, 100, 40, 1, 3, 0}, .dt = SD_DT_F32, .tol = TOL_DOT},
    {.op = "sd_cuda_moe_up, sd_cuda_moe_down", .note = "no shared expert, counted", .run = run_moe_experts, .shape = {64, 6, 512, 64, 0, 2, 1}, .dt = SD_DT_BF16, .tol = TOL_DOT},
    {.op = "sd_cuda_moe_up, sd_cuda_moe_down", .note = "a rank's experts, counted", .run = run_moe_experts, .shape = {32, 8, 256, 64, 1, 1, 1, 1}, .dt = SD_DT_BF16, .tol = TOL_DOT},
    {.op = "sd_cuda_moe_up, sd_cuda_moe_down", .note = "a rank's experts", .run = run_moe_experts, .shape = {16, 4, 128, 40, 1, 5, 0, 1}, .dt = SD_DT_F32, .tol = TOL_DOT},
    {.op = "sd_cuda_moe_up, sd_cuda_moe_down", .note = "a rank's experts, no shared expert", .run = run_moe_experts, .shape = {64, 6, 512, 64, 0, 2, 1, 1}, .dt = SD_DT_BF16, .tol = TOL_DOT},
    // Argmax (bitwise).
    {.op = "sd_cuda_argmax", .run = run_argmax, .shape = {4, 5000, 0, 0}, .tol = TOL_BITWISE},
    {.op = "sd_cuda_argmax", .note = "odd rows, out pinned", .run = run_argmax, .shape = {4, 5001, 0, 1}, .tol = TOL_BITWISE},
    {.op = "sd_cuda_argmax", .note = "vocabulary rows", .run = run_argmax, .shape = {2, 163840, 1, 0}, .tol = TOL_BITWISE},
    {.op = "sd_cuda_argmax", .note = "vocabulary rows, odd, out pinned", .run = run_argmax, .shape = {2, 163841, 1, 1}, .tol = TOL_BITWISE},
    // Softmax: the CPU's operation order, expf within 2 ulp (TOL_ELEM).
    {.op = "sd_cuda_softmax", .run = run_softmax, .shape = {5, 5000, 0}, .tol = TOL_ELEM},
    {.op = "sd_cuda_softmax", .note = "in place, vocabulary rows", .run = run_softmax, .shape = {5, 163841, 1}, .tol = TOL_ELEM},
    {.op = "sd_cuda_softmax", .run = run_softmax, .shape = {6, 64, 0}, .tol = TOL_ELEM},
    // Sampling: the CPU's loop and draw, bitwise.
    {.op = "sd_cuda_sample_rows", .run = run_sample_rows, .shape = {4, 5000, 0}, .tol = TOL_BITWISE},
    {.op = "sd_cuda_sample_rows", .note = "out pinned", .run = run_sample_rows, .shape = {3, 163840, 1}, .tol = TOL_BITWISE},
    {.op = "sd_cuda_sample_rows", .run = run_sample_rows, .shape = {1, 7, 0}, .tol = TOL_BITWISE},
    // Acceptance: (n, bonus) bitwise (test_cuda_accept sweeps the variants).
    {.op = "sd_cuda_accept", .note = "greedy", .run = run_accept, .shape = {1, 3, 1, 40, 0}, .tol = TOL_BITWISE},
    {.op = "sd_cuda_accept", .note = "greedy", .run = run_accept, .shape = {16, 5, 1, 40, 0}, .tol = TOL_BITWISE},
    {.op = "sd_cuda_accept", .note = "sampled", .run = run_accept, .shape = {5, 64, 0, 20, 0}, .tol = TOL_BITWISE},
    {.op = "sd_cuda_accept", .note = "sampled", .run = run_accept, .shape = {16, 1025, 0, 8, 0}, .tol = TOL_BITWISE},
    {.op = "sd_cuda_accept", .note = "sampled, q = p", .run = run_accept, .shape = {3, 8192, 0, 6, 1}, .tol = TOL_BITWISE},
    {.op = "sd_cuda_accept", .note = "sampled, one entry", .run = run_accept, .shape = {1, 1, 0, 4, 0}, .tol = TOL_BITWISE},
    // A round's bookkeeping: exact integers.
    {.op = "sd_cuda_round_publish", .run = run_round_publish, .shape = {3, 1, 1}, .tol = TOL_BITWISE},
    {.op = "sd_cuda_round_publish", .run = run_round_publish, .shape = {16, 1, 0}, .tol = TOL_BITWISE},
    {.op = "sd_cuda_round_publish", .note = "a decode step", .run = run_round_publish, .shape = {0, 1, 1}, .tol = TOL_BITWISE},
    {.op = "sd_cuda_round_publish", .note = "no round counter", .run = run_round_publish, .shape = {1, 0, 0}, .tol = TOL_BITWISE},
    // Weight synthesis: the host generator's bytes.
    {.op = "sd_cuda_synth_fill", .run = run_synth_fill, .shape = {1, 0}, .tol = TOL_BITWISE},
    {.op = "sd_cuda_synth_fill", .run = run_synth_fill, .shape = {1, 1}, .tol = TOL_BITWISE},
    {.op = "sd_cuda_synth_fill", .run = run_synth_fill, .shape = {0, 0}, .tol = TOL_BITWISE},
    {.op = "sd_cuda_synth_fill", .note = "shorter than a Philox block", .run = run_synth_fill, .shape = {0, 1}, .tol = TOL_BITWISE},
    // ---- the prefill (kernels/gemm.h, kda_prefill.h, mla_prefill.h, moe_prefill.h): TOL_BF16,
    // TOL_MMA and TOL_CHUNK stand in cuda_ops/op_cases.h with their reasons.
    // bf16 conversion: bitwise (a NaN as a NaN).
    {.op = "sd_cuda_to_bf16", .note = "edge values", .run = run_to_bf16, .shape = {37, 1}, .tol = TOL_BITWISE},
    {.op = "sd_cuda_to_bf16", .note = "one value", .run = run_to_bf16, .shape = {1, 0}, .tol = TOL_BITWISE},
    {.op = "sd_cuda_to_bf16", .note = "none: nothing written", .run = run_to_bf16, .shape = {0, 0}, .tol = TOL_BITWISE},
    {.op = "sd_cuda_to_bf16", .note = "past one grid", .run = run_to_bf16, .shape = {600001, 1}, .tol = TOL_BITWISE},
    // The GEMM, both weight dtypes a case; the Linear form (one problem, W stored [N, K]) through
    // sd_gemm_linear and sd_gemm_linear_bf16 too. .tol is the bf16 weight's against the f32
    // activations (TOL_BF16); the rest name theirs (run_gemm).
    {.op = "sd_gemm_create, sd_gemm_run, sd_gemm_linear, sd_gemm_linear_bf16, sd_cuda_to_bf16", .note = "GEMM: one row", .run = run_gemm, .shape = {1, 64, 32, 1, SD_GEMM_WT, 0, 0, 0}, .tol = TOL_BF16},
    {.op = "sd_gemm_create, sd_gemm_run, sd_gemm_linear, sd_gemm_linear_bf16, sd_cuda_to_bf16", .note = "GEMM: K = 8", .run = run_gemm, .shape = {37, 16, 8, 1, SD_GEMM_WT, 0, 0, 0}, .tol = TOL_BF16},
    {.op = "sd_gemm_create, sd_gemm_run, sd_gemm_linear, sd_gemm_linear_bf16, sd_cuda_to_bf16", .note = "GEMM: 8 columns, accumulate", .run = run_gemm, .shape = {7, 8, 32, 1, SD_GEMM_WT, 0, 0, 1}, .tol = TOL_BF16},
    {.op = "sd_gemm_create, sd_gemm_run, sd_gemm_linear, sd_gemm_linear_bf16, sd_cuda_to_bf16", .note = "GEMM: Y rows padded", .run = run_gemm, .shape = {300, 512, 512, 1, SD_GEMM_WT, 0, 4, 0}, .tol = TOL_BF16},
    {.op = "sd_gemm_create, sd_gemm_run, sd_gemm_linear, sd_gemm_linear_bf16, sd_cuda_to_bf16", .note = "GEMM: X rows padded, accumulate", .run = run_gemm, .shape = {129, 1536, 512, 1, SD_GEMM_WT, 4, 0, 1}, .tol = TOL_BF16},
    {.op = "sd_gemm_create, sd_gemm_run, sd_gemm_linear, sd_gemm_linear_bf16, sd_cuda_to_bf16", .note = "GEMM: Kimi's expert gate|up", .run = run_gemm, .shape = {17, 2048, 2304, 1, SD_GEMM_WT, 0, 0, 0}, .tol = TOL_BF16},
    {.op = "sd_gemm_create, sd_gemm_run, sd_gemm_linear, sd_gemm_linear_bf16, sd_cuda_to_bf16", .note = "GEMM: Kimi's router", .run = run_gemm, .shape = {40, 256, 2304, 1, SD_GEMM_WT, 0, 0, 0}, .tol = TOL_BF16},
    {.op = "sd_gemm_create, sd_gemm_run, sd_cuda_to_bf16", .note = "GEMM: X·W, one problem", .run = run_gemm, .shape = {8, 8, 40, 1, SD_GEMM_WN, 0, 0, 0}, .tol = TOL_BF16},
    {.op = "sd_gemm_create, sd_gemm_run, sd_cuda_to_bf16", .note = "GEMM: batched X·W (the MLA absorption)", .run = run_gemm, .shape = {50, 128, 64, 4, SD_GEMM_WN, 32, 0, 0}, .tol = TOL_BF16},
    {.op = "sd_gemm_create, sd_gemm_run, sd_cuda_to_bf16", .note = "GEMM: batched X·Wt (the MLA value projection)", .run = run_gemm, .shape = {50, 64, 128, 4, SD_GEMM_WT, 0, 0, 0}, .tol = TOL_BF16},
    {.op = "sd_gemm_create, sd_gemm_run, sd_cuda_to_bf16", .note = "GEMM: Kimi's absorption", .run = run_gemm, .shape = {20, 512, 128, 32, SD_GEMM_WN, 64, 0, 0}, .tol = TOL_BF16},
    {.op = "sd_gemm_create, sd_gemm_run, sd_cuda_to_bf16", .note = "GEMM: Kimi's value projection", .run = run_gemm, .shape = {20, 128, 512, 32, SD_GEMM_WT, 0, 0, 0}, .tol = TOL_BF16},
    {.op = "sd_gemm_create, sd_gemm_run, sd_cuda_to_bf16", .note = "GEMM: K = 20 (staged rows of 24), gaps, accumulate", .run = run_gemm, .shape = {9, 16, 20, 3, SD_GEMM_WN, 4, 4, 1}, .tol = TOL_BF16},
    {.op = "sd_gemm_create, sd_gemm_run, sd_cuda_to_bf16", .note = "GEMM: batched X·Wt, gaps", .run = run_gemm, .shape = {64, 40, 24, 2, SD_GEMM_WT, 8, 8, 0}, .tol = TOL_BF16},
    // KDA conv + gates, then the ring rows (TOL_ELEM; the ring, β's padding and pieces bitwise).
    {.op = "sd_cuda_kda_prefill_conv, sd_cuda_kda_prefill_ring", .note = "one token at 0, a ring of W - 1 rows", .run = run_kda_prefill_conv, .shape = {2, 16, 4, 1, 0, 3, 0, 0}, .tol = TOL_ELEM},
    {.op = "sd_cuda_kda_prefill_conv, sd_cuda_kda_prefill_ring", .note = "T < W - 1, pieces of 1", .run = run_kda_prefill_conv, .shape = {2, 16, 4, 2, 5, 4, 1, 2}, .tol = TOL_ELEM},
    {.op = "sd_cuda_kda_prefill_conv, sd_cuda_kda_prefill_ring", .note = "pieces of 33 and 37", .run = run_kda_prefill_conv, .shape = {3, 64, 4, 70, 13, 11, 33, 1}, .tol = TOL_ELEM},
    {.op = "sd_cuda_kda_prefill_conv, sd_cuda_kda_prefill_ring", .note = "Kimi's shapes", .run = run_kda_prefill_conv, .shape = {32, 128, 4, 100, 37, 11, 64, 0}, .tol = TOL_ELEM},
    {.op = "sd_cuda_kda_prefill_conv, sd_cuda_kda_prefill_ring", .note = "d past 128 threads, W = 6 before 0, a piece < W - 1", .run = run_kda_prefill_conv, .shape = {2, 200, 6, 9, 3, 8, 4, 0}, .tol = TOL_ELEM},
    {.op = "sd_cuda_kda_prefill_conv, sd_cuda_kda_prefill_ring", .note = "W = 1: no history, no ring rows", .run = run_kda_prefill_conv, .shape = {4, 32, 1, 5, 9, 1, 2, 0}, .tol = TOL_ELEM},
    {.op = "sd_cuda_kda_prefill_conv, sd_cuda_kda_prefill_ring", .note = "the ring wraps", .run = run_kda_prefill_conv, .shape = {1, 8, 4, 3, 1000, 5, 1, 3}, .tol = TOL_ELEM},
    // The chunked recurrence (TOL_CHUNK): d 8 .. 128, T about the 64-token chunk; in place bitwise.
    {.op = "sd_cuda_kda_chunk", .note = "one token", .run = run_kda_chunk, .shape = {2, 8, 1, 0, 0}, .tol = TOL_CHUNK},
    {.op = "sd_cuda_kda_chunk", .note = "one short chunk, weak decay", .run = run_kda_chunk, .shape = {2, 8, 63, 0, 1}, .tol = TOL_CHUNK},
    {.op = "sd_cuda_kda_chunk", .note = "one whole chunk, y rows padded", .run = run_kda_chunk, .shape = {3, 16, 64, 4, 0}, .tol = TOL_CHUNK},
    {.op = "sd_cuda_kda_chunk", .note = "a chunk and a token", .run = run_kda_chunk, .shape = {4, 32, 65, 0, 0}, .tol = TOL_CHUNK},
    {.op = "sd_cuda_kda_chunk", .note = "one token, beta rows padded", .run = run_kda_chunk, .shape = {5, 32, 1, 0, 0}, .tol = TOL_CHUNK},
    {.op = "sd_cuda_kda_chunk", .note = "three chunks, weak decay", .run = run_kda_chunk, .shape = {2, 64, 130, 0, 1}, .tol = TOL_CHUNK},
    {.op = "sd_cuda_kda_chunk", .note = "five chunks, weak decay", .run = run_kda_chunk, .shape = {3, 64, 257, 0, 1}, .tol = TOL_CHUNK},
    {.op = "sd_cuda_kda_chunk", .note = "y rows padded, weak decay", .run = run_kda_chunk, .shape = {1, 16, 129, 8, 1}, .tol = TOL_CHUNK},
    {.op = "sd_cuda_kda_chunk", .run = run_kda_chunk, .shape = {4, 128, 200, 0, 0}, .tol = TOL_CHUNK},
    {.op = "sd_cuda_kda_chunk", .note = "Kimi's heads", .run = run_kda_chunk, .shape = {32, 128, 130, 0, 0}, .tol = TOL_CHUNK},
    // The gated output norm: f32 TOL_ELEM; bf16 the f32 rounded, bitwise, and TOL_BF16 vs the CPU.
    {.op = "sd_cuda_kda_prefill_out", .run = run_kda_prefill_out, .shape = {1, 3, 16}, .tol = TOL_ELEM},
    {.op = "sd_cuda_kda_prefill_out", .run = run_kda_prefill_out, .shape = {5, 2, 128}, .tol = TOL_ELEM},
    {.op = "sd_cuda_kda_prefill_out", .run = run_kda_prefill_out, .shape = {3, 4, 40}, .tol = TOL_ELEM},
    {.op = "sd_cuda_kda_prefill_out", .note = "Kimi's heads", .run = run_kda_prefill_out, .shape = {70, 32, 128}, .tol = TOL_ELEM},
    {.op = "sd_cuda_kda_prefill_out", .note = "d past 128 threads", .run = run_kda_prefill_out, .shape = {2, 1, 200}, .tol = TOL_ELEM},
    // The MLA cache write (TOL_ELEM; the rows it must not touch bitwise).
    {.op = "sd_cuda_mla_prefill_cache", .note = "RoPE", .run = run_mla_prefill_cache, .shape = {3, 5, 24, 16, 64, 0, 1, 0}, .tol = TOL_ELEM},
    {.op = "sd_cuda_mla_prefill_cache", .note = "RoPE at 700, the prefill's shared rows", .run = run_mla_prefill_cache, .shape = {3, 5, 24, 16, 64, 700, 1, 1}, .tol = TOL_ELEM},
    {.op = "sd_cuda_mla_prefill_cache", .note = "one token", .run = run_mla_prefill_cache, .shape = {1, 3, 16, 6, 40, 9, 1, 1}, .tol = TOL_ELEM},
    {.op = "sd_cuda_mla_prefill_cache", .note = "no RoPE", .run = run_mla_prefill_cache, .shape = {3, 2, 16, 4, 40, 2, 0, 0}, .tol = TOL_ELEM},
    {.op = "sd_cuda_mla_prefill_cache", .note = "Kimi's shapes (no RoPE)", .run = run_mla_prefill_cache, .shape = {5, 32, 128, 64, 512, 100, 0, 1}, .tol = TOL_ELEM},
    {.op = "sd_cuda_mla_prefill_cache", .note = "RoPE at R = 512, dr = 64", .run = run_mla_prefill_cache, .shape = {4, 8, 64, 64, 512, 37, 1, 0}, .tol = TOL_ELEM},
    {.op = "sd_cuda_mla_prefill_cache", .note = "R past the register norm", .run = run_mla_prefill_cache, .shape = {2, 4, 16, 8, 5000, 3, 1, 0}, .tol = TOL_ELEM},
    {.op = "sd_cuda_mla_prefill_cache", .note = "odd dr with RoPE: the unpaired entry copied", .run = run_mla_prefill_cache, .shape = {2, 2, 16, 5, 40, 3, 1, 1}, .tol = TOL_ELEM},
    // Packing to bf16: bitwise. shape: T, Hm, dn, dr, dv, j0, n, mqpad.
    {.op = "sd_cuda_mla_pack_queries, sd_cuda_mla_pack_kv", .note = "one row each, width 16", .run = run_mla_pack, .shape = {1, 1, 8, 4, 8, 0, 1, 0}, .tol = TOL_BITWISE},
    {.op = "sd_cuda_mla_pack_queries, sd_cuda_mla_pack_kv", .note = "a block of rows after j0", .run = run_mla_pack, .shape = {3, 5, 24, 6, 24, 7, 9, 3}, .tol = TOL_BITWISE},
    {.op = "sd_cuda_mla_pack_queries, sd_cuda_mla_pack_kv", .note = "Kimi's shapes, the prefill's query rows", .run = run_mla_pack, .shape = {40, 32, 128, 64, 128, 100, 40, 576}, .tol = TOL_BITWISE},
    {.op = "sd_cuda_mla_pack_queries, sd_cuda_mla_pack_kv", .note = "dr = 0", .run = run_mla_pack, .shape = {2, 3, 16, 0, 16, 5, 2, 0}, .tol = TOL_BITWISE},
    {.op = "sd_cuda_mla_pack_queries, sd_cuda_mla_pack_kv", .note = "rows past one grid", .run = run_mla_pack, .shape = {8, 2, 128, 64, 128, 2000, 3000, 0}, .tol = TOL_BITWISE},
    {.op = "sd_cuda_mla_pack_queries, sd_cuda_mla_pack_kv", .note = "dn + dr = 17, dv = 9", .run = run_mla_pack, .shape = {2, 2, 13, 4, 9, 1, 2, 1}, .tol = TOL_BITWISE},
    // Flash attention of each head (TOL_BF16); every value width, 1 .. 16 key tiles, a partial query
    // block, both buffer counts. shape: T, Hm, dn, dr, dv, pos0.
    {.op = "sd_cuda_mla_flash", .note = "one token, one key", .run = run_mla_flash, .shape = {1, 2, 8, 4, 8, 0}, .tol = TOL_BF16},
    {.op = "sd_cuda_mla_flash", .note = "dv = 12: a value width past dv", .run = run_mla_flash, .shape = {37, 2, 12, 4, 12, 5}, .tol = TOL_BF16},
    {.op = "sd_cuda_mla_flash", .note = "a partial query block", .run = run_mla_flash, .shape = {70, 4, 64, 32, 64, 50}, .tol = TOL_BF16},
    {.op = "sd_cuda_mla_flash", .note = "Kimi's shapes", .run = run_mla_flash, .shape = {40, 32, 128, 64, 128, 100}, .tol = TOL_BF16},
    {.op = "sd_cuda_mla_flash", .note = "dr = 0, three key tiles", .run = run_mla_flash, .shape = {130, 4, 64, 0, 32, 0}, .tol = TOL_BF16},
    {.op = "sd_cuda_mla_flash", .note = "six key tiles, dv = 16", .run = run_mla_flash, .shape = {5, 3, 24, 8, 16, 300}, .tol = TOL_BF16},
    {.op = "sd_cuda_mla_flash", .note = "the tiny models' heads", .run = run_mla_flash, .shape = {9, 3, 8, 4, 8, 20}, .tol = TOL_BF16},
    {.op = "sd_cuda_mla_flash", .note = "dv = 256, the most accumulators", .run = run_mla_flash, .shape = {66, 2, 128, 64, 256, 7}, .tol = TOL_BF16},
    {.op = "sd_cuda_mla_flash", .note = "head width 512: one key buffer", .run = run_mla_flash, .shape = {20, 2, 448, 64, 128, 10}, .tol = TOL_BF16},
    {.op = "sd_cuda_mla_flash", .note = "1017 keys", .run = run_mla_flash, .shape = {17, 5, 128, 64, 128, 1000}, .tol = TOL_BF16},
    // MoE routing: sel bitwise, w TOL_ELEM.
    {.op = "sd_cuda_moe_prefill_select", .note = "Kimi's routing, one token", .run = run_moe_prefill_select, .shape = {256, 8, 1, 1, 1, 0, 0}, .tol = TOL_ELEM},
    {.op = "sd_cuda_moe_prefill_select", .note = "Kimi's routing", .run = run_moe_prefill_select, .shape = {256, 8, 1, 1, 300, 0, 0}, .tol = TOL_ELEM},
    {.op = "sd_cuda_moe_prefill_select", .note = "ties", .run = run_moe_prefill_select, .shape = {256, 8, 1, 1, 9, 1, 0}, .tol = TOL_ELEM},
    {.op = "sd_cuda_moe_prefill_select", .note = "ties", .run = run_moe_prefill_select, .shape = {16, 2, 1, 1, 9, 1, 0}, .tol = TOL_ELEM},
    {.op = "sd_cuda_moe_prefill_select", .note = "expert groups", .run = run_moe_prefill_select, .shape = {64, 6, 8, 3, 50, 0, 0}, .tol = TOL_ELEM},
    {.op = "sd_cuda_moe_prefill_select", .note = "expert groups, not renormalised", .run = run_moe_prefill_select, .shape = {64, 6, 8, 3, 13, 0, 1}, .tol = TOL_ELEM},
    {.op = "sd_cuda_moe_prefill_select", .note = "32 groups of 3", .run = run_moe_prefill_select, .shape = {96, 4, 32, 4, 9, 0, 0}, .tol = TOL_ELEM},
    {.op = "sd_cuda_moe_prefill_select", .note = "E < 32, T not a multiple of 8", .run = run_moe_prefill_select, .shape = {20, 3, 1, 1, 11, 0, 0}, .tol = TOL_ELEM},
    {.op = "sd_cuda_moe_prefill_select", .note = "K = 32", .run = run_moe_prefill_select, .shape = {64, 32, 1, 1, 5, 0, 0}, .tol = TOL_ELEM},
    {.op = "sd_cuda_moe_prefill_select", .note = "E = 512, not renormalised", .run = run_moe_prefill_select, .shape = {512, 8, 1, 1, 17, 0, 1}, .tol = TOL_ELEM},
    // The grouping's counts and rows: bitwise.
    {.op = "sd_cuda_moe_prefill_count, sd_cuda_moe_prefill_scatter", .note = "one token", .run = run_moe_prefill_group, .shape = {256, 8, 1}, .tol = TOL_BITWISE},
    {.op = "sd_cuda_moe_prefill_count, sd_cuda_moe_prefill_scatter", .run = run_moe_prefill_group, .shape = {256, 8, 37}, .tol = TOL_BITWISE},
    {.op = "sd_cuda_moe_prefill_count, sd_cuda_moe_prefill_scatter", .note = "2400 entries", .run = run_moe_prefill_group, .shape = {256, 8, 300}, .tol = TOL_BITWISE},
    {.op = "sd_cuda_moe_prefill_count, sd_cuda_moe_prefill_scatter", .note = "8008 entries: segments of 512, the last partial", .run = run_moe_prefill_group, .shape = {256, 8, 1001}, .tol = TOL_BITWISE},
    {.op = "sd_cuda_moe_prefill_count, sd_cuda_moe_prefill_scatter", .note = "E not a multiple of 8", .run = run_moe_prefill_group, .shape = {20, 3, 11}, .tol = TOL_BITWISE},
    {.op = "sd_cuda_moe_prefill_count, sd_cuda_moe_prefill_scatter", .note = "every expert every token", .run = run_moe_prefill_group, .shape = {5, 5, 7}, .tol = TOL_BITWISE},
    {.op = "sd_cuda_moe_prefill_count, sd_cuda_moe_prefill_scatter", .run = run_moe_prefill_group, .shape = {64, 6, 100}, .tol = TOL_BITWISE},
    // Gathered rows: bitwise.
    {.op = "sd_cuda_gather_rows", .note = "one row", .run = run_gather_rows, .shape = {1, 8, 0, 1}, .tol = TOL_BITWISE},
    {.op = "sd_cuda_gather_rows", .note = "Kimi's: 37 tokens x 8", .run = run_gather_rows, .shape = {296, 2304, 0, 37}, .tol = TOL_BITWISE},
    {.op = "sd_cuda_gather_rows", .note = "odd D, x rows padded", .run = run_gather_rows, .shape = {50, 101, 3, 20}, .tol = TOL_BITWISE},
    {.op = "sd_cuda_gather_rows", .note = "rows past 256 threads", .run = run_gather_rows, .shape = {7, 1000, 24, 3}, .tol = TOL_BITWISE},
    {.op = "sd_cuda_gather_rows", .run = run_gather_rows, .shape = {2400, 64, 0, 300}, .tol = TOL_BITWISE},
    // SwiGLU rows (f32 or bf16 h; shape n, I, h_bf16): f32 TOL_ELEM; bf16 the f32 rounded, bitwise,
    // and TOL_BF16 vs the CPU.
    {.op = "sd_cuda_swiglu_rows", .note = "one row", .run = run_swiglu_rows, .shape = {1, 16}, .tol = TOL_ELEM},
    {.op = "sd_cuda_swiglu_rows", .note = "Kimi's experts", .run = run_swiglu_rows, .shape = {296, 1024}, .tol = TOL_ELEM},
    {.op = "sd_cuda_swiglu_rows", .note = "Kimi's dense FFN", .run = run_swiglu_rows, .shape = {33, 9216}, .tol = TOL_ELEM},
    {.op = "sd_cuda_swiglu_rows", .note = "odd I", .run = run_swiglu_rows, .shape = {5, 37}, .tol = TOL_ELEM},
    {.op = "sd_cuda_swiglu_rows", .note = "past one grid", .run = run_swiglu_rows, .shape = {3000, 768}, .tol = TOL_ELEM},
    {.op = "sd_cuda_swiglu_rows", .note = "bf16 h: Kimi's experts", .run = run_swiglu_rows, .shape = {296, 1024, 1}, .tol = TOL_ELEM},
    {.op = "sd_cuda_swiglu_rows", .note = "bf16 h: odd I", .run = run_swiglu_rows, .shape = {5, 37, 1}, .tol = TOL_ELEM},
    {.op = "sd_cuda_swiglu_rows", .note = "bf16 h: past one grid", .run = run_swiglu_rows, .shape = {3000, 768, 1}, .tol = TOL_ELEM},
    // The weighted combine (f32 or bf16 y; shape T, K, D, shared, y_bf16): the CPU's order, bitwise.
    {.op = "sd_cuda_moe_prefill_combine", .note = "Kimi's, one token", .run = run_moe_prefill_combine, .shape = {1, 8, 2304, 1}, .tol = TOL_BITWISE},
    {.op = "sd_cuda_moe_prefill_combine", .note = "Kimi's", .run = run_moe_prefill_combine, .shape = {37, 8, 2304, 1}, .tol = TOL_BITWISE},
    {.op = "sd_cuda_moe_prefill_combine", .note = "no shared expert", .run = run_moe_prefill_combine, .shape = {5, 2, 100, 0}, .tol = TOL_BITWISE},
    {.op = "sd_cuda_moe_prefill_combine", .run = run_moe_prefill_combine, .shape = {300, 6, 64, 1}, .tol = TOL_BITWISE},
    {.op = "sd_cuda_moe_prefill_combine", .note = "K = 1, rows past 256 threads", .run = run_moe_prefill_combine, .shape = {3, 1, 1000, 0}, .tol = TOL_BITWISE},
    {.op = "sd_cuda_moe_prefill_combine", .note = "bf16 y: Kimi's", .run = run_moe_prefill_combine, .shape = {37, 8, 2304, 1, 1}, .tol = TOL_BITWISE},
    {.op = "sd_cuda_moe_prefill_combine", .note = "bf16 y: no shared expert", .run = run_moe_prefill_combine, .shape = {5, 2, 100, 0, 1}, .tol = TOL_BITWISE},
    {.op = "sd_cuda_moe_prefill_combine", .note = "bf16 y: K = 1, odd D", .run = run_moe_prefill_combine, .shape = {3, 1, 1001, 0, 1}, .tol = TOL_BITWISE},
    // The grouped expert GEMMs (cuBLAS): both GEMMs of a plan vs float64 of the same bf16 values,
    // each bf16 output within one rounding of its fp32 sum, then the NMSE (TOL_BF16: one rounding
    // of the output, < 2^-16, above the fp32 sums' TOL_MMA). shape: E, n, Ie, D, stacked, skew.
    {.op = "sd_cuda_moe_grouped_create, sd_cuda_moe_grouped_plan, sd_cuda_moe_grouped_gemm", .note = "tiny's experts, gate and up apart", .run = run_moe_grouped, .shape = {8, 400, 16, 32, 0, 0}, .tol = TOL_BF16},
    {.op = "sd_cuda_moe_grouped_create, sd_cuda_moe_grouped_plan, sd_cuda_moe_grouped_gemm", .note = "tiny's experts, stacked", .run = run_moe_grouped, .shape = {8, 400, 16, 32, 1, 0}, .tol = TOL_BF16},
    {.op = "sd_cuda_moe_grouped_create, sd_cuda_moe_grouped_plan, sd_cuda_moe_grouped_gemm", .note = "toy's, an expert of many rows, empty experts", .run = run_moe_grouped, .shape = {16, 2000, 256, 512, 1, 1}, .tol = TOL_BF16},
    {.op = "sd_cuda_moe_grouped_create, sd_cuda_moe_grouped_plan, sd_cuda_moe_grouped_gemm", .note = "toy's, skewed, apart", .run = run_moe_grouped, .shape = {16, 2000, 256, 512, 0, 1}, .tol = TOL_BF16},
    {.op = "sd_cuda_moe_grouped_create, sd_cuda_moe_grouped_plan, sd_cuda_moe_grouped_gemm", .note = "Kimi's widths, 16 experts", .run = run_moe_grouped, .shape = {16, 296, 1024, 2304, 1, 0}, .tol = TOL_BF16},
    {.op = "sd_cuda_moe_grouped_create, sd_cuda_moe_grouped_plan, sd_cuda_moe_grouped_gemm", .note = "Ie = 40, D = 72 (not multiples of 16)", .run = run_moe_grouped, .shape = {4, 150, 40, 72, 0, 1}, .tol = TOL_BF16},
};

Test(cuda_ops, table, .timeout = 600) {
    NEED_GPU();
    const size_t n_cases = sizeof CASES / sizeof *CASES;
    for (size_t i = 0; i < n_cases; i++) {
        const op_case *c = &CASES[i];
        int ns = 8;
        while (ns > 0 && c->shape[ns - 1] == 0) ns--;
        char shape[96] = "";
        for (int k = 0, at = 0; k < ns && at < (int)sizeof shape; k++)
            at += snprintf(shape + at, sizeof shape - (size_t)at, "%s%d", k ? "," : "", c->shape[k]);
        snprintf(LABEL, sizeof LABEL, "case %zu/%zu %s [%s] %s%s%s", i + 1, n_cases, c->op, shape, sd_dtype_name(c->dt),
                 c->note ? ", " : "", c->note ? c->note : "");
        case_seed = 0x5eed0000ull + 1000003ull * (i + 1);
        c->run(c);
        CU(cudaDeviceSynchronize());
        CU(cudaGetLastError());
        cr_log_info("%s: ok (%s)", LABEL, c->tol == TOL_BITWISE ? "bitwise" : fmt("NMSE <= %.0e", c->tol));
    }
}

#endif
