#include "status.h"
#include <stdio.h>

sd_code sd_fail(sd_status *st, sd_code code, const char *fmt, ...) {
    if (st) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(st->msg, sizeof st->msg, fmt, ap);
        va_end(ap);
        st->code = code;
    }
    return code;
}
