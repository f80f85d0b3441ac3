/*
 * tests/scheduler/test_block_hash.c - prefix-cache keys: equal inputs give
 * equal keys; any change of parent, token, order, length or adapter changes
 * the key; no collisions over many near-identical blocks.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <cmocka.h>

#include "scheduler/block_hash.h"

static void test_block_hash_is_deterministic(void **state) {
    (void)state;
    int32_t t[16] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
    struct block_hash a = block_hash_compute(BLOCK_HASH_ROOT, t, 16, 0);
    struct block_hash b = block_hash_compute(BLOCK_HASH_ROOT, t, 16, 0);
    assert_true(block_hash_equal(a, b));
}

static void test_block_hash_depends_on_every_input(void **state) {
    (void)state;
    int32_t t[16] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
    struct block_hash base = block_hash_compute(BLOCK_HASH_ROOT, t, 16, 0);
    assert_false(block_hash_equal(base, block_hash_compute(base, t, 16, 0)));   // parent
    assert_false(block_hash_equal(base, block_hash_compute(BLOCK_HASH_ROOT, t, 16, 7)));  // adapter
    assert_false(block_hash_equal(base, block_hash_compute(BLOCK_HASH_ROOT, t, 15, 0)));  // length
    int32_t u[16];
    for (int i = 0; i < 16; i++) u[i] = t[i];
    u[3] = 5;
    u[4] = 4;  // swapped order
    assert_false(block_hash_equal(base, block_hash_compute(BLOCK_HASH_ROOT, u, 16, 0)));
}

/* 64k blocks differing in one token at one position: every key distinct in
 * both lanes (checked by sorting the lo lanes, and hi lanes separately). */
static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a;
    uint64_t y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

static void test_block_hash_no_collisions_over_near_identical_blocks(void **state) {
    (void)state;
    enum { N = 65536 };
    uint64_t *lo = malloc(N * sizeof(*lo));
    uint64_t *hi = malloc(N * sizeof(*hi));
    assert_non_null(lo);
    assert_non_null(hi);
    for (int i = 0; i < N; i++) {
        int32_t t[16] = {0};
        t[i % 16] = i / 16 + 1;
        struct block_hash h = block_hash_compute(BLOCK_HASH_ROOT, t, 16, 0);
        lo[i] = h.lo;
        hi[i] = h.hi;
    }
    qsort(lo, N, sizeof(*lo), cmp_u64);
    qsort(hi, N, sizeof(*hi), cmp_u64);
    for (int i = 1; i < N; i++) {
        assert_true(lo[i] != lo[i - 1]);
        assert_true(hi[i] != hi[i - 1]);
    }
    free(lo);
    free(hi);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_block_hash_is_deterministic),
        cmocka_unit_test(test_block_hash_depends_on_every_input),
        cmocka_unit_test(test_block_hash_no_collisions_over_near_identical_blocks),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
