/*
 * test_status.c - the ERR_* -> HTTP status table against STYLE.md 2.5's
 * list, and the error "type" strings against OpenAI's published error shapes
 * (invalid_request_error for 4xx, authentication_error 401, permission_error
 * 403, rate_limit_error 429, server_error for 5xx).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "engine/base/err.h"
#include "server/status.h"

static void test_status_for_err_follows_the_style_table(void **state) {
    (void)state;
    assert_int_equal(status_for_err(0), 200);
    assert_int_equal(status_for_err(ERR_INVAL), 400);
    assert_int_equal(status_for_err(ERR_TOOLONG), 400);
    assert_int_equal(status_for_err(ERR_NOTFOUND), 404);
    assert_int_equal(status_for_err(ERR_PERM), 403);
    assert_int_equal(status_for_err(ERR_FULL), 429);
    assert_int_equal(status_for_err(ERR_SHUTDOWN), 503);
    const int other[] = {ERR_NOMEM, ERR_IO, ERR_FORMAT, ERR_UNSUPPORTED, ERR_CANCELED, -12345};
    for (size_t i = 0; i < sizeof(other) / sizeof(other[0]); i++) {
        assert_int_equal(status_for_err(other[i]), 500);
    }
}

static void test_status_error_type_is_openai_s(void **state) {
    (void)state;
    assert_string_equal(status_error_type(400), "invalid_request_error");
    assert_string_equal(status_error_type(404), "invalid_request_error");
    assert_string_equal(status_error_type(413), "invalid_request_error");
    assert_string_equal(status_error_type(401), "authentication_error");
    assert_string_equal(status_error_type(403), "permission_error");
    assert_string_equal(status_error_type(429), "rate_limit_error");
    assert_string_equal(status_error_type(500), "server_error");
    assert_string_equal(status_error_type(503), "service_unavailable");
    assert_string_equal(status_error_type(504), "timeout");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_status_for_err_follows_the_style_table),
        cmocka_unit_test(test_status_error_type_is_openai_s),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
