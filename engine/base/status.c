#include "status.h"
#include <stdio.h>
#include <string.h>

const char *sd_escape(const char *value, char *out, size_t cap);

sd_code sd_fail(sd_status *st, sd_code code, const char *fmt, ...) {
    if (st) {
        va_list ap;
        va_start(ap, fmt);
        char raw[sizeof st->msg];
        vsnprintf(raw, sizeof raw, fmt, ap);
        va_end(ap);
        sd_escape(raw, st->msg, sizeof st->msg); // one line whatever a path or value holds
        st->code = code;
    }
    return code;
}

const char *sd_escape(const char *value, char *out, size_t cap) {
    static const char hex[] = "0123456789abcdef";
    size_t o = 0;
    if (!cap) return out;
    if (!value) value = "(null)";
    for (const unsigned char *p = (const unsigned char *)value; *p; p++) {
        char esc[5] = {0};
        if (*p == '\n') strcpy(esc, "\\n");
        else if (*p == '\t') strcpy(esc, "\\t");
        else if (*p == '\r') strcpy(esc, "\\r");
        else if (*p < 0x20 || *p == 0x7f) esc[0] = '\\', esc[1] = 'x', esc[2] = hex[*p >> 4], esc[3] = hex[*p & 15];
        else esc[0] = (char)*p;
        size_t n = strlen(esc);
        if (o + n + 4 > cap) { // room for "..." and the NUL
            if (o + 4 <= cap) memcpy(out + o, "...", 3), o += 3;
            break;
        }
        memcpy(out + o, esc, n);
        o += n;
    }
    out[o < cap ? o : cap - 1] = '\0';
    return out;
}
