/*
 * alloc.h - small bookkeeping allocations that abort with a message when the
 * system is out of memory (Redis's zmalloc). Anything sized by the model, the
 * config or a client uses plain malloc and returns ERR_NOMEM instead.
 * Also ASSERT / DASSERT / UNREACHABLE (STYLE 2.6).
 */
#ifndef LLMSERVE_ALLOC_H
#define LLMSERVE_ALLOC_H

#include <assert.h>
#include <stddef.h>
#include <stdnoreturn.h>

/* Each returns memory owned by the caller (free with free()), never NULL. */
void *xmalloc(size_t n);
void *xcalloc(size_t count, size_t size);
void *xrealloc(void *p, size_t n);
char *xstrdup(const char *s);

/* Logs "file:line: ASSERT(expr) failed" and aborts. */
noreturn void alloc_assert_fail(const char *file, int line, const char *expr);

/* Always on, release builds included: broken promises between our modules. */
#define ASSERT(cond) ((cond) ? (void)0 : alloc_assert_fail(__FILE__, __LINE__, #cond))
/* Hot paths only; compiled out with NDEBUG (b_ndebug=if-release). */
#define DASSERT(cond) assert(cond)
#define UNREACHABLE() alloc_assert_fail(__FILE__, __LINE__, "unreachable")

#endif
