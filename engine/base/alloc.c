/*
 * alloc.c - abort-on-failure allocation for bookkeeping, and the assert sink.
 */
#define LOG_TAG "alloc"
#include "engine/base/alloc.h"

#include <stdlib.h>
#include <string.h>

#include "engine/base/log.h"

static noreturn void alloc_oom(size_t n) {
    LOG_ERROR("out of memory allocating %zu bytes", n);
    abort();
}

void *xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) alloc_oom(n);
    return p;
}

void *xcalloc(size_t count, size_t size) {
    void *p = calloc(count ? count : 1, size ? size : 1);
    if (!p) alloc_oom(count * size);
    return p;
}

void *xrealloc(void *p, size_t n) {
    void *q = realloc(p, n ? n : 1);
    if (!q) alloc_oom(n);
    return q;
}

char *xstrdup(const char *s) {
    size_t n = strlen(s) + 1;
    char *p = xmalloc(n);
    memcpy(p, s, n);
    return p;
}

noreturn void alloc_assert_fail(const char *file, int line, const char *expr) {
    log_write(LOG_LEVEL_ERROR, "assert", "%s:%d: ASSERT(%s) failed", file, line, expr);
    abort();
}
