/*
 * test_err.c - err_name / err_str for every ERR_* code, 0 and unknown codes.
 *
 * The expectations are written out here rather than generated from ERR_MAP,
 * so a changed name, value or message shows up as a failure.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <limits.h>
#include <string.h>

#include "engine/base/err.h"

static const struct {
    int code;
    int value;
    const char *name;
    const char *msg;
} want[] = {
    {ERR_NOMEM, -1, "ERR_NOMEM", "out of memory"},
    {ERR_IO, -2, "ERR_IO", "i/o error"},
    {ERR_FORMAT, -3, "ERR_FORMAT", "malformed file"},
    {ERR_INVAL, -4, "ERR_INVAL", "invalid argument"},
    {ERR_UNSUPPORTED, -5, "ERR_UNSUPPORTED", "not supported"},
    {ERR_NOTFOUND, -6, "ERR_NOTFOUND", "not found"},
    {ERR_FULL, -7, "ERR_FULL", "capacity exhausted"},
    {ERR_TOOLONG, -8, "ERR_TOOLONG", "longer than the context allows"},
    {ERR_CANCELED, -9, "ERR_CANCELED", "canceled"},
    {ERR_SHUTDOWN, -10, "ERR_SHUTDOWN", "shutting down"},
    {ERR_PERM, -11, "ERR_PERM", "not permitted"},
};
#define N_WANT (sizeof(want) / sizeof(want[0]))

static void test_err_every_code_has_its_name_and_message(void **state) {
    (void)state;
    for (size_t i = 0; i < N_WANT; i++) {
        assert_int_equal(want[i].code, want[i].value);
        assert_string_equal(err_name(want[i].code), want[i].name);
        assert_string_equal(err_str(want[i].code), want[i].msg);
    }
}

static void test_err_map_has_exactly_the_listed_codes(void **state) {
    (void)state;
    // A code added to ERR_MAP must be added to the table above too.
    size_t n = 0;
#define COUNT_(name, value, msg) n++;
    ERR_MAP(COUNT_)
#undef COUNT_
    assert_int_equal(n, N_WANT);
    for (size_t i = 0; i < N_WANT; i++) {
        assert_true(want[i].code < 0);
        for (size_t j = 0; j < i; j++) assert_int_not_equal(want[i].code, want[j].code);
    }
}

static void test_err_success_and_unknown_codes(void **state) {
    (void)state;
    assert_string_equal(err_name(0), "OK");
    assert_string_equal(err_str(0), "success");
    const int unknown[] = {1, 3, -12, -100, INT_MIN, INT_MAX};
    for (size_t i = 0; i < sizeof(unknown) / sizeof(unknown[0]); i++) {
        assert_string_equal(err_name(unknown[i]), "ERR_UNKNOWN");
        assert_string_equal(err_str(unknown[i]), "unknown error");
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_err_every_code_has_its_name_and_message),
        cmocka_unit_test(test_err_map_has_exactly_the_listed_codes),
        cmocka_unit_test(test_err_success_and_unknown_codes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
