/*
 * log.c - the line formatter and the single write(2) per line.
 */
#include "engine/base/log.h"

#include <errno.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "engine/base/err.h"

enum log_level log_level_current = LOG_LEVEL_INFO;
static int log_fd = 2;
static atomic_bool log_bar_drawn;  // a progress bar is on the log fd's last line

void log_bar_set_drawn(bool is_drawn) { atomic_store(&log_bar_drawn, is_drawn); }

bool log_bar_is_drawn(void) { return atomic_load(&log_bar_drawn); }

int log_get_fd(void) { return log_fd; }

void log_set_level(enum log_level level) { log_level_current = level; }

void log_set_fd(int fd) { log_fd = fd; }

int log_level_parse(const char *name, enum log_level *out) {
    static const char *const names[] = {"error", "warn", "info", "debug"};
    for (int i = 0; i < 4; i++) {
        if (strcmp(name, names[i]) == 0) {
            *out = (enum log_level)i;
            return 0;
        }
    }
    return ERR_INVAL;
}

void log_write(enum log_level level, const char *tag, const char *fmt, ...) {
    static const char *const level_names[] = {"ERROR", "WARN ", "INFO ", "DEBUG"};
    char line[2048];
    size_t len = 0;
    if (atomic_exchange(&log_bar_drawn, false)) {
        memcpy(line, "\r\033[K", 4);  // erase the progress bar this line replaces
        len = 4;
    }
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    gmtime_r(&ts.tv_sec, &tm);
    int n = snprintf(line + len, sizeof(line) - len, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ %s %s: ",
                     tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min,
                     tm.tm_sec, (int)(ts.tv_nsec / 1000000), level_names[level], tag);
    if (n < 0) return;
    len = len + (size_t)n < sizeof(line) ? len + (size_t)n : sizeof(line) - 1;
    va_list ap;
    va_start(ap, fmt);
    int m = vsnprintf(line + len, sizeof(line) - len, fmt, ap);
    va_end(ap);
    if (m > 0) len += (size_t)m;
    if (len > sizeof(line) - 2) len = sizeof(line) - 2;
    line[len++] = '\n';
    ssize_t w;
    do {
        w = write(log_fd, line, len);
    } while (w < 0 && errno == EINTR);
}
