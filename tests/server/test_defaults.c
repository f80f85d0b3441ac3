/*
 * tests/server/test_defaults.c - `llmserve batch` and `llmserve serve` run
 * the scheduler with the same defaults. serve's come from config/ (what
 * README.md's flag table documents: max_seqs 64, max_batch_tokens 2048,
 * prefill_chunk 256, step_ratio 125, max_queue 1024, kv_memory 256M, block_size 16,
 * max_loras 8); batch starts from scheduler_default_params().
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "config/config.h"
#include "scheduler/scheduler.h"

static void test_defaults_match_readme_and_each_other(void **state) {
    (void)state;
    struct config c;
    config_init_defaults(&c);
    const struct scheduler_params p = scheduler_default_params();
    // README.md's documented values
    assert_int_equal(c.max_seqs, 64);
    assert_int_equal(c.max_batch_tokens, 2048);
    assert_int_equal(c.prefill_chunk, 256);
    assert_int_equal(c.step_ratio, 125);
    assert_int_equal(c.max_queue, 1024);
    assert_int_equal(c.kv_bytes, 256LL << 20);
    assert_int_equal(c.block_size, 16);
    assert_int_equal(c.max_loras, 8);
    // the scheduler's own defaults, which batch and the tests start from
    assert_int_equal(p.max_seqs, c.max_seqs);
    assert_int_equal(p.max_batch_tokens, c.max_batch_tokens);
    assert_int_equal(p.prefill_chunk, c.prefill_chunk);
    assert_int_equal(p.step_ratio, c.step_ratio);
    assert_int_equal(p.max_queue, c.max_queue);
    assert_int_equal((int64_t)p.kv_memory_mib << 20, c.kv_bytes);
    assert_int_equal(p.block_size, c.block_size);
    assert_int_equal(p.max_loras, c.max_loras);
    config_deinit(&c);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults_match_readme_and_each_other),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
