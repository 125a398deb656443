// cursor.h — positions in device memory. A device state keeps {len, pending} in its own memory
// (sd_state.cursor, engine/state.h); kernels read the position a launch starts at from there
// instead of from a launch argument, so a captured CUDA graph replays at whatever position the
// state holds, and the forward advances the cursor on the stream (sd_cuda_cursor_advance).
#pragma once
#include <cuda_runtime_api.h> // cudaStream_t

#ifdef __cplusplus
extern "C" {
#endif
#include "status.h" // sd_code, sd_status

// Where a launch's first position comes from: cursor[0] + cursor[1] (a state's {len, pending},
// device memory) plus offset. cursor NULL: the position is offset (op tests and labs).
typedef struct {
    const int *cursor;
    int offset;
} sd_dev_pos;

static inline sd_dev_pos sd_pos_fixed(int pos) {
    sd_dev_pos p = {0, pos};
    return p;
}
static inline sd_dev_pos sd_pos_cursor(const int *cursor) {
    sd_dev_pos p = {cursor, 0};
    return p;
}

// cursor = {len, pending}, ordered on the stream (host values: the eager path's commit).
sd_code sd_cuda_cursor_set(int *cursor, int len, int pending, cudaStream_t stream, sd_status *st);
// pending += T: the last launch of a forward of T tokens.
sd_code sd_cuda_cursor_advance(int *cursor, int T, cudaStream_t stream, sd_status *st);
// len += *n + plus (n in device memory: the accept kernel's count, kernels/acceptance.h, with
// plus = 1 for the bonus position), pending = 0 — a commit that needs no host round trip, as a
// captured round will. The host's len/pending follow when it reads the count back.
sd_code sd_cuda_cursor_commit(int *cursor, const int *n, int plus, cudaStream_t stream, sd_status *st);

#ifdef __cplusplus
}

// The position a launch starts at (every thread may call it; two cached loads).
__device__ __forceinline__ int sd_pos_read(sd_dev_pos p) {
    return (p.cursor ? __ldg(p.cursor) + __ldg(p.cursor + 1) : 0) + p.offset;
}
#endif
