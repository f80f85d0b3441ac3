/*
 * log.h - leveled logging to stderr, one write(2) per line so threads never
 * interleave. The level and the sink are the only mutable globals allowed
 * (STYLE 2.2): set them once at start-up, before any thread starts.
 *
 * Each .c file defines LOG_TAG before including this header:
 *     #define LOG_TAG "gguf"
 * The macros test the level before formatting anything.
 * Never log prompt or output text above DEBUG, never log API keys.
 */
#ifndef LLMSERVE_LOG_H
#define LLMSERVE_LOG_H

#include <stdbool.h>

enum log_level {
    LOG_LEVEL_ERROR = 0,
    LOG_LEVEL_WARN  = 1,
    LOG_LEVEL_INFO  = 2,
    LOG_LEVEL_DEBUG = 3,
};

/* The current level: messages above it are dropped. Default INFO. */
extern enum log_level log_level_current;

/* Sets the level. [before start] */
void log_set_level(enum log_level level);

/* Parses "error", "warn", "info", "debug" into *out. Returns 0 or ERR_INVAL. */
int log_level_parse(const char *name, enum log_level *out);

/* Redirects output to fd (default 2). [before start] */
void log_set_fd(int fd);

/* The fd lines go to. [any thread] */
int log_get_fd(void);

/* A progress bar (engine/base/progress.h) on a terminal says it has drawn an
 * unfinished line on the log fd (true) or ended it (false). While one is
 * drawn, log_write() starts its line with "\r\033[K", erasing the bar, and
 * clears the flag; the bar is drawn again below the line. [any thread] */
void log_bar_set_drawn(bool is_drawn);
bool log_bar_is_drawn(void);

/* Formats one line "<UTC time> LEVEL tag: message\n" and writes it with one
 * write(2). Lines longer than 2 KiB are truncated. [any thread] */
void log_write(enum log_level level, const char *tag, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#ifndef LOG_TAG
#define LOG_TAG "llmserve"
#endif

#define LOG_AT_(lvl, ...)                                     \
    do {                                                      \
        if ((lvl) <= log_level_current)                       \
            log_write((lvl), LOG_TAG, __VA_ARGS__);           \
    } while (0)

#define LOG_ERROR(...) LOG_AT_(LOG_LEVEL_ERROR, __VA_ARGS__)
#define LOG_WARN(...)  LOG_AT_(LOG_LEVEL_WARN, __VA_ARGS__)
#define LOG_INFO(...)  LOG_AT_(LOG_LEVEL_INFO, __VA_ARGS__)
#define LOG_DEBUG(...) LOG_AT_(LOG_LEVEL_DEBUG, __VA_ARGS__)

#endif
