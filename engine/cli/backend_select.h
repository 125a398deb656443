// backend_select.h — the CLI's choice of backend: parse --backend, move a loaded host model onto
// it, and describe it for receipts and JSON. With door_select.c and tp_select.c, the CLI files
// that know the CUDA backend exists.
#pragma once
#include <stdbool.h>
#include <stdio.h> // FILE
#include "model.h" // sd_model
#include "synth.h" // sd_synth_opts

typedef enum { SD_CLI_BACKEND_AUTO = 0, SD_CLI_BACKEND_CPU, SD_CLI_BACKEND_CUDA } sd_cli_backend;

// "cpu" / "cuda" / NULL (auto). Usage error on anything else.
sd_code sd_cli_backend_parse(const char *opt, sd_cli_backend *out, sd_status *st);
// Resolve auto (the GPU when this build has CUDA and a device is visible, else the CPU) and refuse
// cuda when this build or machine cannot serve it — never a silent fallback. Choosing cuda checks
// that every visible device has a compute capability this build runs (gpu_arch.h).
sd_code sd_cli_backend_resolve(sd_cli_backend *b, sd_status *st);
// Put a loaded host model on the backend: *use = host for the CPU; for CUDA the copy is made
// in *dev, the host model freed, and *use = dev. (Models are never copied by value: their
// tensor tables point into them.)
sd_code sd_cli_to_backend(sd_cli_backend b, sd_model *host, sd_model *dev, sd_model **use, sd_status *st);
// The same, onto CUDA device `ordinal` (the CPU: *use = host), the host model kept: for a command
// that runs one model on every device in turn.
sd_code sd_cli_to_device(sd_cli_backend b, const sd_model *host, int ordinal, sd_model *dev, sd_model **use,
                         sd_status *st);
// sd_synth_model(cfg, o) on the backend: on the host for the CPU, made in device memory on CUDA
// device `ordinal` (no host copy: a model as large as the device fits).
sd_code sd_cli_synth_on(sd_cli_backend b, const sd_config *cfg, const sd_synth_opts *o, int ordinal, sd_model *out,
                        sd_status *st);
// The first `rows` rows of the state's logits scratch (the last forward's), copied to the host.
sd_code sd_cli_read_logits(const sd_model *m, const sd_state *s, int rows, float *out, sd_status *st);
// `specdec --version`'s backend lines: the CPU, then the CUDA runtime and architectures, NCCL and
// cuBLASLt versions and the visible devices, or "not built".
void sd_cli_backends_describe(FILE *out);
// "cpu" / "cuda", and the device's name ("NVIDIA H200", or the CPU's model name).
const char *sd_cli_backend_name(sd_cli_backend b);
void sd_cli_device_name(const sd_model *m, char *buf, size_t len);
