/*
 * test_kv_type.c - the KV storage type names: the names llama.cpp's
 * --cache-type-k / --cache-type-v accept for the same layouts ("f32", "f16",
 * "q8_0"), their round trip through the parser, and every rejected input.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "engine/base/err.h"
#include "engine/format/kv_type.h"

static void test_kv_type_names_are_llama_cpp_cache_types(void **state) {
    (void)state;
    assert_string_equal(engine_kv_type_name(ENGINE_KV_TYPE_F32), "f32");
    assert_string_equal(engine_kv_type_name(ENGINE_KV_TYPE_F16), "f16");
    assert_string_equal(engine_kv_type_name(ENGINE_KV_TYPE_Q8_0), "q8_0");
    assert_string_equal(engine_kv_type_name(ENGINE_KV_TYPE_COUNT), "?");
    assert_string_equal(engine_kv_type_name((enum engine_kv_type)-1), "?");
}

static void test_kv_type_parse_round_trips_every_name(void **state) {
    (void)state;
    for (int i = 0; i < ENGINE_KV_TYPE_COUNT; i++) {
        enum engine_kv_type t = ENGINE_KV_TYPE_COUNT;
        assert_int_equal(engine_kv_type_parse(engine_kv_type_name((enum engine_kv_type)i), &t), 0);
        assert_int_equal(t, i);
    }
}

static void test_kv_type_parse_rejects_anything_else(void **state) {
    (void)state;
    const char *const bad[] = {"", "F16", "f16 ", "q8", "q4_0", "bf16", "?", "f1"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        enum engine_kv_type t = ENGINE_KV_TYPE_F16;
        assert_int_equal(engine_kv_type_parse(bad[i], &t), ERR_INVAL);
        assert_int_equal(t, ENGINE_KV_TYPE_F16);  // untouched on failure
    }
    enum engine_kv_type t = ENGINE_KV_TYPE_F16;
    assert_int_equal(engine_kv_type_parse(NULL, &t), ERR_INVAL);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_kv_type_names_are_llama_cpp_cache_types),
        cmocka_unit_test(test_kv_type_parse_round_trips_every_name),
        cmocka_unit_test(test_kv_type_parse_rejects_anything_else),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
