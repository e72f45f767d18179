/* Status codes, thread-local error messages and logging. */
#include "zoff/core.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static _Thread_local char g_msg[2048];
static zoff_log_level g_level = ZOFF_LOG_INFO;

const char *zoff_status_name(zoff_status s) {
    switch (s) {
    case ZOFF_OK: return "ZOFF_OK";
    case ZOFF_ERR_INVALID: return "ZOFF_ERR_INVALID";
    case ZOFF_ERR_CONFIG: return "ZOFF_ERR_CONFIG";
    case ZOFF_ERR_IO: return "ZOFF_ERR_IO";
    case ZOFF_ERR_FORMAT: return "ZOFF_ERR_FORMAT";
    case ZOFF_ERR_NOMEM: return "ZOFF_ERR_NOMEM";
    case ZOFF_ERR_DEVICE_OOM: return "ZOFF_ERR_DEVICE_OOM";
    case ZOFF_ERR_DEVICE: return "ZOFF_ERR_DEVICE";
    case ZOFF_ERR_UNSUPPORTED: return "ZOFF_ERR_UNSUPPORTED";
    case ZOFF_ERR_INTERNAL: return "ZOFF_ERR_INTERNAL";
    }
    return "ZOFF_ERR_UNKNOWN";
}

zoff_status zoff_error(zoff_status code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_msg, sizeof g_msg, fmt, ap);
    va_end(ap);
    return code;
}

zoff_status zoff_error_context(zoff_status code, const char *fmt, ...) {
    char prefix[1024], old[sizeof g_msg];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    memcpy(old, g_msg, sizeof old);
    size_t n = strlen(prefix);
    if (n > sizeof g_msg - 3) n = sizeof g_msg - 3;
    memcpy(g_msg, prefix, n);
    memcpy(g_msg + n, ": ", 2);
    size_t room = sizeof g_msg - n - 3, m = strlen(old);
    if (m > room) m = room;
    memcpy(g_msg + n + 2, old, m);
    g_msg[n + 2 + m] = '\0';
    return code;
}

zoff_status zoff_status_of_path_errno(int err) {
    switch (err) {
    case ENOENT:
    case ENOTDIR:
    case ENAMETOOLONG:
    case ELOOP:
    case EACCES:
    case EPERM:
    case EROFS: return ZOFF_ERR_INVALID;
    default: return ZOFF_ERR_IO;
    }
}

const char *zoff_last_error(void) { return g_msg; }
void zoff_clear_error(void) { g_msg[0] = '\0'; }

void zoff_log_set_level(zoff_log_level level) { g_level = level; }
zoff_log_level zoff_log_get_level(void) { return g_level; }

void zoff_log(zoff_log_level level, const char *fmt, ...) {
    static const char *names[] = {"debug", "info", "warning", "error"};
    if (level < g_level) return;
    char buf[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    fprintf(stderr, "zoff: %s%s%s\n", level == ZOFF_LOG_INFO ? "" : names[level],
            level == ZOFF_LOG_INFO ? "" : ": ", buf);
}
