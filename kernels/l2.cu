// l2.cu — the process-wide L2 policy of l2.h.
#include "l2.h"

static bool g_evict_first = true;

extern "C" bool sd_cuda_weights_evict_first(bool on) {
    const bool was = g_evict_first;
    g_evict_first = on;
    return was;
}
extern "C" bool sd_cuda_weights_evict_first_on(void) { return g_evict_first; }
