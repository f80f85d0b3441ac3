/* tests/server/test_auth.c - API key checks: exact match only, scheme rules. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "server/auth.h"

static void test_auth_accepts_only_exact_keys(void **state) {
    (void)state;
    const char *keys[] = {"sk-alpha", "sk-beta"};
    struct auth *a = auth_create(keys, 2);
    assert_false(auth_is_open(a));
    assert_true(auth_check(a, "Bearer sk-alpha"));
    assert_true(auth_check(a, "bearer sk-beta"));
    assert_false(auth_check(a, NULL));
    assert_false(auth_check(a, "Bearer "));
    assert_false(auth_check(a, "Bearer sk-alph"));
    assert_false(auth_check(a, "Bearer sk-alphaa"));
    assert_false(auth_check(a, "Basic sk-alpha"));
    assert_false(auth_check(a, "sk-alpha"));
    auth_destroy(a);
}

static void test_auth_open_without_keys(void **state) {
    (void)state;
    struct auth *a = auth_create(NULL, 0);
    assert_true(auth_is_open(a));
    assert_true(auth_check(a, NULL));
    auth_destroy(a);
    auth_destroy(NULL);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_auth_accepts_only_exact_keys),
        cmocka_unit_test(test_auth_open_without_keys),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
