// round.cu — sd_cuda_round_publish (round.h): one thread, after every kernel of the round.
#include "round.h"
#include "common.cuh" // SD_NVTX, sd_launch, SD_CUDA_CHECK

static __global__ void publish_kernel(const int *out, int *seq, int k, int *pub, uint32_t *round) {
    sd_pdl_enter();
    const int n = out[0], bonus = out[1];
    for (int i = 0; i < k; i++) pub[2 + i] = seq[1 + i];
    pub[0] = n;
    pub[1] = bonus;
    seq[0] = bonus;
    if (round) *round += 1;
    __threadfence_system(); // the pinned rows reach the host before the launch's completion does
}

extern "C" sd_code sd_cuda_round_publish(const int *out, int *seq, int k, int *pub, uint32_t *round, cudaStream_t stream,
                                         sd_status *st) {
    SD_NVTX("sd_cuda_round_publish");
    if (k < 0) return sd_fail(st, SD_ERR_USAGE, "cuda round publish: k = %d", k);
    SD_CUDA_CHECK(st, sd_launch(publish_kernel, 1, 1, 0, stream, out, seq, k, pub, round));
    return SD_OK;
}
