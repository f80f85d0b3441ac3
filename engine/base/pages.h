/*
 * pages.h - large private anonymous memory by the page: reserved at once as
 * address space, committed (and zeroed) where it is first written, and, when
 * asked, in 2 MiB pages. Debian's kernel has transparent huge pages in
 * "madvise" mode, so without the ask every 4 KiB page of a model's bytes, its
 * panels or its KV pool is a fault of its own, several microseconds each in
 * a VM (docs/benchmarks.md: a fresh 32-stream run of the 110M model 15%
 * faster with its KV pool in 2 MiB pages; the 1.1B Q4_0 model loaded in
 * 1.1-1.5 s instead of 4.1-5.0). Any thread.
 */
#ifndef LLMSERVE_PAGES_H
#define LLMSERVE_PAGES_H

#include <stdbool.h>
#include <stddef.h>

/* n bytes (n may be 0), zero, writable; huge: ask for 2 MiB pages over all of
 * them. The mapping is whole 2 MiB pages long, which Linux places on a 2 MiB
 * boundary. NULL (errno ENOMEM, or mmap's) when the address space is not
 * there. Owned: pages_release() with the same n. */
void *pages_reserve(size_t n, bool huge);

/* Gives back what pages_reserve(n, ...) returned; NULL-safe. */
void pages_release(void *p, size_t n);

/* Asks for 2 MiB pages over the whole 2 MiB pages inside [p, p + n), and
 * nowhere else, so the memory committed around it does not grow: for a range
 * about to be filled. A hint; it commits nothing. */
void pages_advise_huge(void *p, size_t n);

#endif
