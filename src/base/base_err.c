/* Errors and the logger. */
#include "base/base.h"

#include <stdio.h>
#include <string.h>

int base_fail(base_err *err, const char *fmt, ...) {
    if (!err) return -1;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    va_end(ap);
    return -1;
}

int base_fail_wrap(base_err *err, const char *fmt, ...) {
    if (!err) return -1;
    char prefix[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    if (n < 0) return -1;
    size_t plen = strlen(prefix) + 2; /* ": " */
    size_t old = strnlen(err->msg, sizeof err->msg - 1);
    if (plen + old >= sizeof err->msg) old = sizeof err->msg - 1 - plen;
    memmove(err->msg + plen, err->msg, old);
    memcpy(err->msg, prefix, plen - 2);
    memcpy(err->msg + plen - 2, ": ", 2);
    err->msg[plen + old] = 0;
    return -1;
}

static base_log_level g_log_level = BASE_LOG_WARN;

void base_log_set_level(base_log_level level) {
    g_log_level = level;
}

void base_log(base_log_level level, const char *fmt, ...) {
    if (level > g_log_level) return;
    static const char *names[] = {"error", "warning", "info", "debug"};
    fprintf(stderr, "mlxcel: %s: ", names[level]);
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
}
