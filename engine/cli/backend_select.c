// backend_select.c — see backend_select.h.
#include "backend_select.h"
#include <stdio.h>
#include <string.h>
#include "backend.h"
#include "host_cpu.h" // sd_cli_cpu_model
#ifdef SPECDEC_HAVE_CUDA
#include <cuda_runtime_api.h> // cudaMemcpy
#include "cuda_backend.h"     // sd_cuda_device_count, sd_cuda_model_upload, sd_cuda_backend_of
#include "cuda_synth.h"       // sd_cuda_model_synth
#include "gpu_arch.h"         // sd_cuda_check_devices, sd_cuda_describe
#endif

sd_code sd_cli_backend_parse(const char *opt, sd_cli_backend *out, sd_status *st) {
    if (!opt) *out = SD_CLI_BACKEND_AUTO;
    else if (!strcmp(opt, "cpu")) *out = SD_CLI_BACKEND_CPU;
    else if (!strcmp(opt, "cuda")) *out = SD_CLI_BACKEND_CUDA;
    else return sd_fail(st, SD_ERR_USAGE, "--backend must be cpu or cuda, got '%s'", opt);
    return SD_OK;
}

static int gpus(void) {
#ifdef SPECDEC_HAVE_CUDA
    return sd_cuda_device_count();
#else
    return 0;
#endif
}

sd_code sd_cli_backend_resolve(sd_cli_backend *b, sd_status *st) {
#ifndef SPECDEC_HAVE_CUDA
    if (*b == SD_CLI_BACKEND_CUDA)
        return sd_fail(st, SD_ERR_UNSUPPORTED, "--backend cuda: not available in this build (no CUDA toolkit at build time)");
#endif
    if (*b == SD_CLI_BACKEND_CUDA && gpus() == 0)
        return sd_fail(st, SD_ERR_UNSUPPORTED, "--backend cuda: not available on this machine (no CUDA device visible)");
    if (*b == SD_CLI_BACKEND_AUTO) *b = gpus() > 0 ? SD_CLI_BACKEND_CUDA : SD_CLI_BACKEND_CPU;
#ifdef SPECDEC_HAVE_CUDA
    if (*b == SD_CLI_BACKEND_CUDA) return sd_cuda_check_devices(st);
#endif
    return SD_OK;
}

void sd_cli_backends_describe(FILE *out) {
    char cpu[256];
    sd_cli_cpu_model(cpu, sizeof cpu);
    fprintf(out, "backends:\n  cpu       the reference (%s, %d threads by default)\n", cpu, sd_cli_threads(0));
#ifdef SPECDEC_HAVE_CUDA
    sd_cuda_describe(out);
#else
    fprintf(out, "  cuda      CUDA not built (configured without a CUDA toolkit, or with SPECDEC_CUDA=OFF)\n"
                 "  nccl      not built\n"
                 "  cublasLt  not built\n"
                 "devices:\n  CUDA not built: the CPU only\n");
#endif
}

sd_code sd_cli_to_backend(sd_cli_backend b, sd_model *host, sd_model *dev, sd_model **use, sd_status *st) {
    *use = host;
    if (b != SD_CLI_BACKEND_CUDA) return SD_OK;
#ifdef SPECDEC_HAVE_CUDA
    sd_code rc = sd_cuda_model_upload(host, dev, st);
    sd_model_free(host);
    if (!rc) *use = dev;
    return rc;
#else
    (void)dev;
    return sd_fail(st, SD_ERR_UNSUPPORTED, "--backend cuda: not available in this build");
#endif
}

sd_code sd_cli_to_device(sd_cli_backend b, const sd_model *host, int ordinal, sd_model *dev, sd_model **use,
                         sd_status *st) {
    *use = (sd_model *)host;
    if (b != SD_CLI_BACKEND_CUDA) return SD_OK;
#ifdef SPECDEC_HAVE_CUDA
    SD_TRY(sd_cuda_model_upload_on(host, ordinal, dev, st));
    *use = dev;
    return SD_OK;
#else
    (void)ordinal, (void)dev;
    return sd_fail(st, SD_ERR_UNSUPPORTED, "--backend cuda: not available in this build");
#endif
}

sd_code sd_cli_synth_on(sd_cli_backend b, const sd_config *cfg, const sd_synth_opts *o, int ordinal, sd_model *out,
                        sd_status *st) {
    if (b != SD_CLI_BACKEND_CUDA) return sd_synth_model(out, cfg, o, st);
#ifdef SPECDEC_HAVE_CUDA
    return sd_cuda_model_synth(cfg, o, ordinal, out, st);
#else
    (void)ordinal;
    return sd_fail(st, SD_ERR_UNSUPPORTED, "--backend cuda: not available in this build");
#endif
}

sd_code sd_cli_read_logits(const sd_model *m, const sd_state *s, int rows, float *out, sd_status *st) {
    const size_t bytes = sizeof(float) * (size_t)rows * (size_t)m->cfg.vocab_size;
    if (rows > s->max_T) return sd_fail(st, SD_ERR_USAGE, "logits: %d rows > the state's %d", rows, s->max_T);
#ifdef SPECDEC_HAVE_CUDA
    const sd_cuda_backend *cb = sd_cuda_backend_of(m);
    if (cb) {
        sd_model_sync((sd_model *)m); // the sync reads the model only; its signature is the trace's hook
        const cudaError_t e = cudaMemcpy(out, s->scratch.logits, bytes, cudaMemcpyDeviceToHost);
        if (e != cudaSuccess) return sd_fail(st, SD_ERR_SYS, "logits: read back from device %d: %s", cb->device, cudaGetErrorString(e));
        return SD_OK;
    }
#endif
    memcpy(out, s->scratch.logits, bytes);
    return SD_OK;
}

const char *sd_cli_backend_name(sd_cli_backend b) { return b == SD_CLI_BACKEND_CUDA ? "cuda" : "cpu"; }

void sd_cli_device_name(const sd_model *m, char *buf, size_t len) {
#ifdef SPECDEC_HAVE_CUDA
    const sd_cuda_backend *cb = sd_cuda_backend_of(m);
    if (cb) {
        snprintf(buf, len, "%s", cb->device_name);
        return;
    }
#endif
    (void)m;
    sd_cli_cpu_model(buf, len);
}
