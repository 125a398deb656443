// pdl.cu — the process-wide launch mode of pdl.h.
#include "pdl.h"

static sd_pdl_mode g_pdl = SD_PDL_OVERLAP;

extern "C" void sd_cuda_pdl(sd_pdl_mode mode) { g_pdl = mode; }
extern "C" sd_pdl_mode sd_cuda_pdl_mode(void) { return g_pdl; }
extern "C" int sd_cuda_pdl_on(void) { return g_pdl != SD_PDL_OFF; }
