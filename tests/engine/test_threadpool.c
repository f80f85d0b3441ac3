/*
 * test_threadpool.c - the kernel pool: every item of a region runs exactly
 * once, on the thread and in the range the header promises, region after
 * region, whether the workers are spinning or asleep between them.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "engine/kernels/threadpool.h"

#define MAX_ITEMS   4096
#define MAX_THREADS 8

struct region {
    atomic_int hits[MAX_ITEMS];
    atomic_int calls[MAX_THREADS];  // fn calls per thread index
    int64_t begin[MAX_THREADS];     // the range each thread was given
    int64_t end[MAX_THREADS];
    atomic_int bad_nth;  // calls that saw another nth than the pool's
    int32_t nth;
};

static void mark(void *arg, int64_t begin, int64_t end, int32_t ith, int32_t nth) {
    struct region *r = arg;
    if (nth != r->nth) atomic_fetch_add(&r->bad_nth, 1);
    atomic_fetch_add(&r->calls[ith], 1);
    r->begin[ith] = begin;
    r->end[ith] = end;
    for (int64_t i = begin; i < end; i++) atomic_fetch_add(&r->hits[i], 1);
}

static void check_region(struct threadpool *pool, int64_t n_items, int64_t grain) {
    static struct region r;
    memset(&r, 0, sizeof(r));
    const int32_t nth = threadpool_n_threads(pool);
    // one thread runs everything itself when the region is a single grain
    const bool alone = nth == 1 || n_items <= (grain < 1 ? 1 : grain);
    r.nth = alone ? 1 : nth;
    threadpool_run(pool, n_items, grain, mark, &r);
    for (int64_t i = 0; i < n_items; i++) assert_int_equal(atomic_load(&r.hits[i]), 1);
    assert_int_equal(atomic_load(&r.bad_nth), 0);
    const int64_t g = grain < 1 ? 1 : grain;
    int64_t expect_begin = 0, lo = INT64_MAX, hi = 0;
    for (int32_t t = 0; t < r.nth; t++) {
        const int calls = atomic_load(&r.calls[t]);
        assert_true(calls <= 1);
        if (calls == 0) continue;  // a thread whose range came out empty
        // contiguous ranges in thread order, starting on a grain boundary
        assert_int_equal(r.begin[t], expect_begin);
        assert_int_equal(r.begin[t] % g, 0);
        expect_begin = r.end[t];
        const int64_t chunks = (r.end[t] - r.begin[t] + g - 1) / g;
        if (chunks < lo) lo = chunks;
        if (chunks > hi) hi = chunks;
    }
    assert_int_equal(expect_begin, n_items);
    if (!alone) assert_true(hi - lo <= 1);  // shares differ by at most one grain
}

static void test_every_item_once(void **state) {
    (void)state;
    for (int32_t nth = 1; nth <= 4; nth++) {
        struct threadpool *pool = threadpool_create(nth);
        assert_non_null(pool);
        assert_int_equal(threadpool_n_threads(pool), nth);
        const int64_t sizes[] = {1, 2, 3, 7, 64, 100, 1000, MAX_ITEMS};
        const int64_t grains[] = {0, 1, 3, 16, 5000};
        for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
            for (size_t j = 0; j < sizeof(grains) / sizeof(grains[0]); j++) {
                check_region(pool, sizes[i], grains[j]);
            }
        }
        threadpool_run(pool, 0, 1, mark, NULL);  // nothing to do: fn is never called
        threadpool_free(pool);
    }
}

/* Thousands of back-to-back regions (the workers spin between them), then
 * regions after pauses long enough for the workers to fall asleep. */
static void test_many_regions_spinning_and_asleep(void **state) {
    (void)state;
    struct threadpool *pool = threadpool_create(3);
    assert_non_null(pool);
    for (int i = 0; i < 5000; i++) check_region(pool, 1 + i % 97, 1 + i % 5);
    for (int i = 0; i < 5; i++) {
        const struct timespec nap = {0, 20 * 1000 * 1000};  // 20 ms: far past the spin
        nanosleep(&nap, NULL);
        check_region(pool, 333, 7);
    }
    threadpool_free(pool);
}

static void test_free_null(void **state) {
    (void)state;
    threadpool_free(NULL);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_item_once),
        cmocka_unit_test(test_many_regions_spinning_and_asleep),
        cmocka_unit_test(test_free_null),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
