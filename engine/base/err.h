/*
 * err.h - the one error vocabulary of llmserve.
 *
 * Fallible functions return int: 0 on success, a negative ERR_* code on
 * failure (the libuv manner). The X-macro below yields the enum, the names and
 * the messages from one list, so they cannot drift apart.
 */
#ifndef LLMSERVE_ERR_H
#define LLMSERVE_ERR_H

#define ERR_MAP(X)                                              \
    X(NOMEM,        -1, "out of memory")                        \
    X(IO,           -2, "i/o error")                            \
    X(FORMAT,       -3, "malformed file")                       \
    X(INVAL,        -4, "invalid argument")                     \
    X(UNSUPPORTED,  -5, "not supported")                        \
    X(NOTFOUND,     -6, "not found")                            \
    X(FULL,         -7, "capacity exhausted")                   \
    X(TOOLONG,      -8, "longer than the context allows")       \
    X(CANCELED,     -9, "canceled")                             \
    X(SHUTDOWN,    -10, "shutting down")                       \
    X(PERM,        -11, "not permitted")

enum err_code {
#define ERR_ENUM_(name, value, msg) ERR_##name = (value),
    ERR_MAP(ERR_ENUM_)
#undef ERR_ENUM_
};

/* "ERR_FORMAT" for ERR_FORMAT; "ERR_UNKNOWN" for anything not in ERR_MAP.
 * The result is a static string. [any thread] */
const char *err_name(int code);

/* "malformed file" for ERR_FORMAT, "success" for 0, "unknown error" otherwise.
 * The result is a static string. [any thread] */
const char *err_str(int code);

#endif
