/*
 * buf.h - a growable byte buffer for text and wire output. Always kept
 * NUL-terminated (data[len] == 0) so it can be handed to C string functions.
 * Growth uses xrealloc (aborts on OOM): use it for bookkeeping-sized text.
 */
#ifndef LLMSERVE_BUF_H
#define LLMSERVE_BUF_H

#include <stddef.h>

struct buf {
    char *data;  // owned; NULL until the first append
    size_t len;  // bytes used, excluding the NUL
    size_t cap;  // bytes allocated
};

/* A zeroed struct buf is an empty buffer; buf_free returns it to that state. */
void buf_free(struct buf *b);
void buf_reset(struct buf *b);  // len = 0, keeps the memory
void buf_reserve(struct buf *b, size_t extra);
void buf_append(struct buf *b, const void *p, size_t n);
void buf_append_str(struct buf *b, const char *s);
void buf_append_char(struct buf *b, char ch);
void buf_printf(struct buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Hands the data to the caller (free() it) and empties b. Never NULL. */
char *buf_take(struct buf *b);

#endif
