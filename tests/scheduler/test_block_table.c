/*
 * tests/scheduler/test_block_table.c - reserve OK / LATER / NEVER, release
 * order, sliding-window trim, copy-on-write of a shared block.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "scheduler/block_alloc.h"
#include "scheduler/block_table.h"

static void test_block_table_reserve_ok_later_never(void **state) {
    (void)state;
    struct block_alloc *a;
    assert_int_equal(block_alloc_create(5, 4, &a), 0);  // 4 usable blocks of 4 tokens
    struct block_table t1, t2;
    block_table_init(&t1, 16);
    block_table_init(&t2, 16);
    assert_int_equal(block_table_blocks_for(0, 4), 0);
    assert_int_equal(block_table_blocks_for(4, 4), 1);
    assert_int_equal(block_table_blocks_for(5, 4), 2);
    assert_int_equal(block_table_reserve(&t1, a, 9), BLOCK_RESERVE_OK);  // 3 blocks
    assert_int_equal(t1.n_blocks, 3);
    assert_int_equal(block_table_reserve(&t1, a, 12), BLOCK_RESERVE_OK);  // no new block
    assert_int_equal(t1.n_blocks, 3);
    assert_int_equal(block_table_reserve(&t2, a, 8), BLOCK_RESERVE_LATER);  // 1 free, 2 needed
    assert_int_equal(t2.n_blocks, 0);
    assert_int_equal(block_table_reserve(&t2, a, 17), BLOCK_RESERVE_NEVER);  // 5 > pool
    assert_int_equal(block_alloc_n_free(a), 1);
    block_table_release(&t1, a);
    assert_int_equal(t1.n_blocks, 0);
    assert_int_equal(block_table_reserve(&t2, a, 8), BLOCK_RESERVE_OK);
    assert_true(block_alloc_check(a));
    block_table_release(&t2, a);
    block_table_deinit(&t1);
    block_table_deinit(&t2);
    assert_int_equal(block_alloc_n_free(a), 4);
    block_alloc_destroy(a);
}

static void test_block_table_trim_releases_blocks_outside_window(void **state) {
    (void)state;
    struct block_alloc *a;
    assert_int_equal(block_alloc_create(9, 4, &a), 0);
    struct block_table t;
    block_table_init(&t, 8);
    assert_int_equal(block_table_reserve(&t, a, 20), BLOCK_RESERVE_OK);  // 5 blocks
    assert_int_equal(block_table_trim(&t, a, 7), 1);   // block 0 holds 0..3 < 7
    assert_int_equal(t.ids[0], 0);
    assert_true(t.ids[1] != 0);
    assert_int_equal(block_table_trim(&t, a, 7), 0);   // idempotent
    assert_int_equal(block_table_trim(&t, a, 12), 2);  // blocks 1, 2
    assert_int_equal(t.n_live, 2);
    assert_int_equal(block_alloc_n_used(a), 2);
    // A trimmed table needs only its live blocks: 2 live + 4 new fits 8.
    assert_int_equal(block_table_reserve(&t, a, 36), BLOCK_RESERVE_NEVER);  // cap 8 < 9
    assert_int_equal(block_table_reserve(&t, a, 32), BLOCK_RESERVE_OK);
    assert_int_equal(t.n_live, 5);
    assert_true(block_alloc_check(a));
    block_table_release(&t, a);
    block_table_deinit(&t);
    assert_int_equal(block_alloc_n_used(a), 0);
    block_alloc_destroy(a);
}

static void test_block_table_copy_on_write_of_shared_block(void **state) {
    (void)state;
    struct block_alloc *a;
    assert_int_equal(block_alloc_create(5, 4, &a), 0);
    struct block_table t1, t2;
    block_table_init(&t1, 4);
    block_table_init(&t2, 4);
    assert_int_equal(block_table_reserve(&t1, a, 6), BLOCK_RESERVE_OK);  // 2 blocks
    // t2 shares both blocks (a fork).
    block_table_append(&t2, a, t1.ids[0]);
    block_table_append(&t2, a, t1.ids[1]);
    int32_t shared = t1.ids[1];
    assert_int_equal(block_alloc_n_refs(a, shared), 2);
    // t2 writes position 6: its block is shared -> fresh block, redo from 4.
    assert_int_equal(block_table_copy_on_write(&t2, a, 6), 4);
    assert_true(t2.ids[1] != shared);
    assert_int_equal(block_alloc_n_refs(a, shared), 1);
    assert_int_equal(block_alloc_n_refs(a, t2.ids[1]), 1);
    // Not shared any more: nothing to do.
    assert_int_equal(block_table_copy_on_write(&t1, a, 6), 6);
    assert_int_equal(block_table_copy_on_write(&t1, a, 9), 9);  // past the table
    // Pool exhausted: -1 and nothing changes.
    assert_int_equal(block_table_reserve(&t1, a, 12), BLOCK_RESERVE_OK);
    block_table_append(&t2, a, t1.ids[2]);
    assert_int_equal(block_alloc_n_free(a), 0);
    assert_int_equal(block_table_copy_on_write(&t2, a, 9), -1);
    assert_true(block_alloc_check(a));
    block_table_release(&t1, a);
    block_table_release(&t2, a);
    block_table_deinit(&t1);
    block_table_deinit(&t2);
    assert_int_equal(block_alloc_n_free(a), 4);
    block_alloc_destroy(a);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_block_table_reserve_ok_later_never),
        cmocka_unit_test(test_block_table_trim_releases_blocks_outside_window),
        cmocka_unit_test(test_block_table_copy_on_write_of_shared_block),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
