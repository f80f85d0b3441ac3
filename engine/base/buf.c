/*
 * buf.c - growable byte buffer.
 */
#include "engine/base/buf.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/base/alloc.h"

void buf_free(struct buf *b) {
    free(b->data);
    b->data = NULL;
    b->len = b->cap = 0;
}

void buf_reset(struct buf *b) {
    b->len = 0;
    if (b->data) b->data[0] = '\0';
}

void buf_reserve(struct buf *b, size_t extra) {
    ASSERT(extra < SIZE_MAX / 2 - b->len);
    size_t need = b->len + extra + 1;
    if (need <= b->cap) return;
    size_t cap = b->cap ? b->cap : 64;
    while (cap < need) cap *= 2;
    b->data = xrealloc(b->data, cap);
    b->cap = cap;
}

void buf_append(struct buf *b, const void *p, size_t n) {
    buf_reserve(b, n);
    if (n) memcpy(b->data + b->len, p, n);
    b->len += n;
    b->data[b->len] = '\0';
}

void buf_append_str(struct buf *b, const char *s) { buf_append(b, s, strlen(s)); }

void buf_append_char(struct buf *b, char ch) { buf_append(b, &ch, 1); }

void buf_printf(struct buf *b, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    va_list ap2;
    va_copy(ap2, ap);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0) {
        va_end(ap2);
        return;
    }
    buf_reserve(b, (size_t)n);
    vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap2);
    va_end(ap2);
    b->len += (size_t)n;
}

char *buf_take(struct buf *b) {
    char *p = b->data;
    if (!p) p = xcalloc(1, 1);
    b->data = NULL;
    b->len = b->cap = 0;
    return p;
}
