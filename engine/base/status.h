// status.h — how library code reports failure: a code plus one line of text.
// Library functions return an sd_code and fill an sd_status; only the CLI decides to exit.
#pragma once
#include <stdarg.h>
#include <stddef.h>

typedef enum {
    SD_OK = 0,
    SD_ERR_DATA = 1,        // bad input data: a file, key or value at fault (CLI exit 1)
    SD_ERR_USAGE = 2,       // bad arguments (CLI exit 2)
    SD_ERR_SYS = 3,         // the OS refused: open, mmap, write, rename, alloc (CLI exit 1)
    SD_ERR_UNSUPPORTED = 4, // valid request this build or machine cannot serve (CLI exit 1)
    SD_ERR_FULL = 5,        // a sequence's context capacity is exhausted (CLI exit 1)
    SD_ERR_NONFINITE = 6,   // a forward's activations held a NaN or an Inf (CLI exit 1; model.h)
} sd_code;

typedef struct {
    sd_code code;
    char msg[512]; // one line, no trailing newline; names the file, key or value at fault
} sd_status;

// Record a failure (printf-style message, its control characters escaped as sd_escape does, so
// the message is one line whatever a path or value holds) and return its code, so callers can write
// `return sd_fail(st, SD_ERR_DATA, "%s: key '%s': ...", path, key);`. st may be NULL.
sd_code sd_fail(sd_status *st, sd_code code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

// Return the code of `call` from the enclosing function when it fails (its message is already in
// the status): the one early-return helper of library code.
#define SD_TRY(call)                      \
    do {                                  \
        sd_code sd_try_rc_ = (call);      \
        if (sd_try_rc_) return sd_try_rc_; \
    } while (0)

// `value` with every control character (and DEL) written as \n, \t, \r or \xHH, cut to fit
// `cap` bytes (ending "..." when cut): what an error message echoes of a user's value, so the
// message stays one line. Returns out.
const char *sd_escape(const char *value, char *out, size_t cap);
