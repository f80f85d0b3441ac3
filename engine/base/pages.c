/*
 * pages.c - anonymous mappings and the transparent huge pages hint.
 */
#include "engine/base/pages.h"

#include <errno.h>
#include <stdint.h>
#include <sys/mman.h>

#define PAGES_HUGE ((size_t)2 << 20)

/* The mapping's length for n bytes: whole huge pages, at least one. */
static size_t map_bytes(size_t n) {
    return n == 0 ? PAGES_HUGE : (n + PAGES_HUGE - 1) / PAGES_HUGE * PAGES_HUGE;
}

void *pages_reserve(size_t n, bool huge) {
    if (n > SIZE_MAX - PAGES_HUGE) {
        errno = ENOMEM;  // as mmap would say: callers log strerror(errno)
        return NULL;
    }
    const size_t len = map_bytes(n);
    void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return NULL;
    if (huge) pages_advise_huge(p, len);
    return p;
}

void pages_release(void *p, size_t n) {
    if (p) munmap(p, map_bytes(n));
}

void pages_advise_huge(void *p, size_t n) {
#ifdef MADV_HUGEPAGE
    const uintptr_t lo = ((uintptr_t)p + PAGES_HUGE - 1) & ~(uintptr_t)(PAGES_HUGE - 1);
    const uintptr_t hi = ((uintptr_t)p + n) & ~(uintptr_t)(PAGES_HUGE - 1);
    if (hi > lo) madvise((void *)lo, hi - lo, MADV_HUGEPAGE);
#else
    (void)p;
    (void)n;
#endif
}
