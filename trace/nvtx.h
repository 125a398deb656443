// nvtx.h — NVTX ranges (nsys and ncu show the same structure as the trace): phases, layers and
// buckets push a named range and pop it. Header-only NVTX3 from the CUDA toolkit when the build
// has CUDA; nothing at all otherwise. With no profiler attached a range costs a few ns.
#pragma once
#if defined(SPECDEC_HAVE_NVTX) && SPECDEC_HAVE_NVTX
#include <nvtx3/nvToolsExt.h>
#define TRACE_RANGE_PUSH(name) nvtxRangePushA(name)
#define TRACE_RANGE_POP() nvtxRangePop()
#else
#define TRACE_RANGE_PUSH(name) ((void)(name))
#define TRACE_RANGE_POP() ((void)0)
#endif
