/*
 * test_fault.c - LLMSERVE_FAULT (engine/base/fault.h): the Nth call at a
 * named site fails, once; other sites and bad entries never fail. The
 * expected sequences are written out by hand from the variable's value.
 * The variable is read once per process, so one test sets it before the
 * first call and checks every site.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <cmocka.h>

#include "engine/base/fault.h"
#include "engine/base/log.h"

static void test_fault_fails_the_nth_call_once(void **state) {
    (void)state;
    // kv:3, parse:1 and tools:2 are taken; "adapter:0" (N < 1), "bogus:2"
    // (no such site) and "parse" (no N) are ignored with a warning.
    assert_int_equal(
        setenv("LLMSERVE_FAULT", "kv:3,adapter:0,bogus:2,parse:1,parse,tools:2", 1), 0);
    const bool kv_want[] = {false, false, true, false, false, false};
    for (size_t i = 0; i < sizeof(kv_want) / sizeof(kv_want[0]); i++) {
        assert_int_equal(fault_hit(FAULT_SITE_KV), kv_want[i]);
    }
    // parse:1 then "parse" (ignored): only the first call fails. fault_calloc
    // counts like fault_hit and returns NULL for the failing call.
    void *p = fault_calloc(FAULT_SITE_PARSE, 4, 8);
    assert_null(p);
    for (int i = 0; i < 5; i++) {
        p = fault_calloc(FAULT_SITE_PARSE, 4, 8);
        assert_non_null(p);
        free(p);
    }
    for (int i = 0; i < 10; i++) {
        p = fault_malloc(FAULT_SITE_ADAPTER, 16);
        assert_non_null(p);
        free(p);
    }
    // tools:2, counted apart from parse: the second call only.
    const bool tools_want[] = {false, true, false, false};
    for (size_t i = 0; i < sizeof(tools_want) / sizeof(tools_want[0]); i++) {
        assert_int_equal(fault_hit(FAULT_SITE_TOOLS), tools_want[i]);
    }
}

int main(void) {
    log_set_level(LOG_LEVEL_ERROR);  // the warnings about the ignored entries
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fault_fails_the_nth_call_once),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
