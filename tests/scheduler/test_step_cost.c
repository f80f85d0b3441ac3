/*
 * tests/scheduler/test_step_cost.c - the online fit of step time against
 * tokens (scheduler/step_cost.h) on times made by hand from a known line
 * time = a + b * tokens, so the fixed cost a / b is known beforehand.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "scheduler/step_cost.h"

static int64_t line(int64_t a, int64_t b, int32_t n) {
    return a + b * n;
}

/* Steps of 10, 20, 30 and 40 tokens on 6 ms + 2 ms per token: a / b = 3. */
static void test_step_cost_recovers_the_line(void **state) {
    (void)state;
    struct step_cost c;
    step_cost_init(&c);
    assert_int_equal(c.fixed, 0);
    for (int i = 0; i < 200; i++) {
        int32_t n = 10 * (1 + i % 4);
        step_cost_observe(&c, n, line(6000000, 2000000, n));
    }
    assert_int_equal(c.fixed, 3);
    // A weight-bound model: 40 ms a step + 1 ms per token: 40 tokens ride free.
    step_cost_init(&c);
    for (int i = 0; i < 200; i++) {
        int32_t n = i % 2 ? 1 : 33;
        step_cost_observe(&c, n, line(40000000, 1000000, n));
    }
    assert_int_equal(c.fixed, 40);
}

/* Steps all of one size cannot separate a from b: nothing is believed. */
static void test_step_cost_equal_steps_keep_the_last_fit(void **state) {
    (void)state;
    struct step_cost c;
    step_cost_init(&c);
    for (int i = 0; i < 100; i++) step_cost_observe(&c, 32, 64000000);
    assert_int_equal(c.fixed, 0);
    for (int i = 0; i < 100; i++) {
        int32_t n = i % 2 ? 8 : 40;
        step_cost_observe(&c, n, line(10000000, 1000000, n));
    }
    assert_int_equal(c.fixed, 10);
    // Then only decodes of 32: the spread of the recent sizes decays, the
    // last fit stays (the same line, so no other answer would be right).
    for (int i = 0; i < 2000; i++) step_cost_observe(&c, 32, line(10000000, 1000000, 32));
    assert_int_equal(c.fixed, 10);
}

/* Times that fall as steps grow (noise) give no fit; a huge intercept is
 * capped; bad arguments are ignored. */
static void test_step_cost_implausible_fits(void **state) {
    (void)state;
    struct step_cost c;
    step_cost_init(&c);
    for (int i = 0; i < 100; i++) {
        int32_t n = i % 2 ? 8 : 40;
        step_cost_observe(&c, n, 100000000 - 1000000 * n);
    }
    assert_int_equal(c.fixed, 0);
    step_cost_init(&c);
    for (int i = 0; i < 100; i++) {
        int32_t n = i % 2 ? 8 : 40;
        step_cost_observe(&c, n, line(1000000000, 1, n));
    }
    assert_int_equal(c.fixed, STEP_COST_MAX_FIXED);
    const int64_t before = c.n_steps;
    step_cost_observe(&c, 0, 1000);
    step_cost_observe(&c, 5, -1);
    assert_int_equal(c.n_steps, before);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_step_cost_recovers_the_line),
        cmocka_unit_test(test_step_cost_equal_steps_keep_the_last_fit),
        cmocka_unit_test(test_step_cost_implausible_fits),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
