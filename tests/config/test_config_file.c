/* tests/config/test_config_file.c - the JSON config file: every kind of
 * value, and hostile files (syntax errors, wrong types, unknown keys). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "config/config.h"
#include "config/config_file.h"
#include "engine/base/err.h"

static int parse(struct config *c, char *msg, const char *text) {
    config_init_defaults(c);
    return config_file_parse(c, text, strlen(text), "t.json", msg, 256);
}

static void test_config_file_applies_every_kind(void **state) {
    (void)state;
    struct config c;
    char msg[256];
    assert_int_equal(parse(&c, msg,
                           "{\"host\": \"0.0.0.0\", \"port\": 81, \"max_body\": 2048,"
                           " \"kv_memory\": \"1G\", \"log_level\": \"warn\","
                           " \"api_keys\": [\"a\", \"b\"], \"request_timeout\": \"30\","
                           " \"kv_type\": \"q8_0\"}"),
                     0);
    assert_string_equal(c.host, "0.0.0.0");
    assert_int_equal(c.port, 81);
    assert_int_equal(c.max_body_bytes, 2048);
    assert_int_equal(c.kv_bytes, 1LL << 30);
    assert_int_equal(c.log_level, LOG_LEVEL_WARN);
    assert_int_equal(c.n_api_keys, 2);
    assert_int_equal(c.request_timeout_s, 30);
    assert_string_equal(c.kv_type, "q8_0");
    config_deinit(&c);
}

static void test_config_file_rejects_hostile_files(void **state) {
    (void)state;
    struct {
        const char *text;
        const char *needle;
    } cases[] = {
        {"{\"port\": 80", "t.json:1:"},
        {"[1, 2]", "JSON object"},
        {"{\"prot\": 80}", "\"prot\""},
        {"{\"port\": \"eighty\"}", "not an integer"},
        {"{\"port\": 1.5}", "integer"},
        {"{\"host\": 7}", "string"},
        {"{\"kv_type\": \"int8\"}", "not one of f32|f16|q8_0"},
        {"{\"kv_type\": 8}", "string"},
        {"{\"api_keys\": \"k\"}", "array"},
        {"{\"api_keys\": [1]}", "string"},
        {"{\"port\": 1, \"port\": 2}", "t.json"},
        {"", "t.json"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        struct config c;
        char msg[256];
        assert_int_equal(parse(&c, msg, cases[i].text), ERR_INVAL);
        if (!strstr(msg, cases[i].needle)) fail_msg("case %zu: '%s'", i, msg);
        config_deinit(&c);
    }
}

static void test_config_file_missing_file_is_io(void **state) {
    (void)state;
    struct config c;
    config_init_defaults(&c);
    char msg[256];
    assert_int_equal(config_file_load(&c, "/nonexistent/llmserve.json", msg, sizeof(msg)),
                     ERR_IO);
    assert_non_null(strstr(msg, "/nonexistent/llmserve.json"));
    config_deinit(&c);
}

static void test_config_file_lora_object_array_and_bool(void **state) {
    (void)state;
    struct config c;
    char msg[256];
    assert_int_equal(parse(&c, msg,
                           "{\"lora\": {\"sql\": \"/a/sql\", \"chat\": \"/b\"},"
                           " \"max_loras\": 2, \"allow_runtime_lora\": true}"),
                     0);
    assert_int_equal(c.n_loras, 2);
    assert_string_equal(c.lora_names[1], "chat");
    assert_string_equal(c.lora_paths[1], "/b");
    assert_int_equal(c.max_loras, 2);
    assert_true(c.allow_runtime_lora);
    config_deinit(&c);
    assert_int_equal(parse(&c, msg, "{\"lora\": [\"x=/p\"], \"allow_runtime_lora\": false}"), 0);
    assert_int_equal(c.n_loras, 1);
    assert_string_equal(c.lora_paths[0], "/p");
    assert_false(c.allow_runtime_lora);
    config_deinit(&c);
    const char *bad[] = {"{\"lora\": {\"x\": 5}}", "{\"lora\": [\"nopath\"]}",
                         "{\"allow_runtime_lora\": \"perhaps\"}", "{\"lora\": [3]}"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        assert_int_equal(parse(&c, msg, bad[i]), ERR_INVAL);
        assert_non_null(strstr(msg, "lora"));
        config_deinit(&c);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_config_file_applies_every_kind),
        cmocka_unit_test(test_config_file_rejects_hostile_files),
        cmocka_unit_test(test_config_file_missing_file_is_io),
        cmocka_unit_test(test_config_file_lora_object_array_and_bool),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
