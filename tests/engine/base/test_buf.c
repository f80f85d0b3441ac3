/*
 * test_buf.c - the growable buffer: appends (binary and text), printf,
 * growth, reset, take and free; data[len] stays 0 throughout.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "engine/base/buf.h"

static void test_buf_zeroed_is_empty_and_free_is_idempotent(void **state) {
    (void)state;
    struct buf b = {0};
    assert_null(b.data);
    assert_int_equal(b.len, 0);
    buf_reset(&b);  // no memory yet: still fine
    buf_free(&b);
    buf_free(&b);
    assert_null(b.data);
    assert_int_equal(b.cap, 0);
}

static void test_buf_appends_binary_and_text(void **state) {
    (void)state;
    struct buf b = {0};
    buf_append(&b, "ab\0cd", 5);  // an embedded NUL is data
    assert_int_equal(b.len, 5);
    assert_memory_equal(b.data, "ab\0cd", 5);
    assert_int_equal(b.data[5], 0);
    buf_append_str(&b, "xyz");
    buf_append_char(&b, '!');
    buf_append(&b, NULL, 0);
    buf_append_str(&b, "");
    assert_int_equal(b.len, 9);
    assert_memory_equal(b.data, "ab\0cdxyz!", 10);
    assert_true(b.cap > b.len);
    buf_free(&b);
}

static void test_buf_grows_across_many_appends(void **state) {
    (void)state;
    struct buf b = {0};
    for (int i = 0; i < 10000; i++) buf_append_char(&b, (char)('a' + i % 26));
    assert_int_equal(b.len, 10000);
    assert_int_equal(b.data[10000], 0);
    for (int i = 0; i < 10000; i++) assert_int_equal(b.data[i], 'a' + i % 26);
    char big[5000];
    memset(big, 'q', sizeof(big));
    buf_append(&b, big, sizeof(big));
    assert_int_equal(b.len, 15000);
    assert_int_equal(b.data[14999], 'q');
    assert_int_equal(b.data[15000], 0);
    buf_free(&b);
}

static void test_buf_printf_formats_and_appends(void **state) {
    (void)state;
    struct buf b = {0};
    buf_append_str(&b, "x=");
    buf_printf(&b, "%d %s %05.2f %llu", -42, "str", 3.14159, 18446744073709551615ull);
    assert_string_equal(b.data, "x=-42 str 03.14 18446744073709551615");
    assert_int_equal(b.len, strlen(b.data));
    buf_printf(&b, "%s", "");
    assert_int_equal(b.len, strlen("x=-42 str 03.14 18446744073709551615"));
    // Longer than the first allocation: vsnprintf's size pass must be used.
    char word[301];
    memset(word, 'w', 300);
    word[300] = 0;
    buf_reset(&b);
    buf_printf(&b, "[%s|%s]", word, word);
    assert_int_equal(b.len, 603);
    assert_int_equal(b.data[0], '[');
    assert_int_equal(b.data[301], '|');
    assert_int_equal(b.data[602], ']');
    assert_int_equal(b.data[603], 0);
    buf_free(&b);
}

static void test_buf_reset_keeps_memory(void **state) {
    (void)state;
    struct buf b = {0};
    buf_append_str(&b, "hello");
    size_t cap = b.cap;
    char *data = b.data;
    buf_reset(&b);
    assert_int_equal(b.len, 0);
    assert_string_equal(b.data, "");
    assert_int_equal(b.cap, cap);
    assert_ptr_equal(b.data, data);
    buf_append_str(&b, "hi");
    assert_string_equal(b.data, "hi");
    buf_free(&b);
}

static void test_buf_reserve_makes_room(void **state) {
    (void)state;
    struct buf b = {0};
    buf_reserve(&b, 1000);
    assert_true(b.cap >= 1001);
    char *data = b.data;
    for (int i = 0; i < 1000; i++) buf_append_char(&b, 'z');
    assert_ptr_equal(b.data, data);  // no reallocation within the reservation
    buf_free(&b);
}

static void test_buf_take_hands_over_and_empties(void **state) {
    (void)state;
    struct buf b = {0};
    buf_append_str(&b, "payload");
    char *p = buf_take(&b);
    assert_string_equal(p, "payload");
    assert_null(b.data);
    assert_int_equal(b.len, 0);
    assert_int_equal(b.cap, 0);
    free(p);
    // Taking an empty buffer still gives a string the caller frees.
    char *e = buf_take(&b);
    assert_non_null(e);
    assert_string_equal(e, "");
    free(e);
    buf_append_str(&b, "again");  // usable after take
    assert_string_equal(b.data, "again");
    buf_free(&b);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_buf_zeroed_is_empty_and_free_is_idempotent),
        cmocka_unit_test(test_buf_appends_binary_and_text),
        cmocka_unit_test(test_buf_grows_across_many_appends),
        cmocka_unit_test(test_buf_printf_formats_and_appends),
        cmocka_unit_test(test_buf_reset_keeps_memory),
        cmocka_unit_test(test_buf_reserve_makes_room),
        cmocka_unit_test(test_buf_take_hands_over_and_empties),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
