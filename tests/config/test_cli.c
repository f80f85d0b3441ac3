/* tests/config/test_cli.c - flags over a struct config: both value forms,
 * short flags, and a clear message for every kind of bad argument. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "config/cli.h"
#include "config/config.h"
#include "engine/base/err.h"

static int parse(struct config *c, char *msg, int argc, char **argv) {
    config_init_defaults(c);
    return cli_parse(c, argc, argv, msg, 256);
}

static void test_cli_long_short_and_inline_values(void **state) {
    (void)state;
    char *argv[] = {"serve", "-m", "m.gguf", "--port", "1234", "--host=0.0.0.0", "-t", "2",
                    "--max-body=64K", "--log-level", "debug", NULL};
    struct config c;
    char msg[256];
    assert_int_equal(parse(&c, msg, 11, argv), 0);
    assert_string_equal(c.model_path, "m.gguf");
    assert_int_equal(c.port, 1234);
    assert_string_equal(c.host, "0.0.0.0");
    assert_int_equal(c.n_threads, 2);
    assert_int_equal(c.max_body_bytes, 65536);
    assert_int_equal(c.log_level, LOG_LEVEL_DEBUG);
    config_deinit(&c);
}

static void test_cli_rejects_bad_arguments_naming_them(void **state) {
    (void)state;
    struct {
        int argc;
        char *argv[4];
        const char *needle;
    } cases[] = {
        {2, {"serve", "--bogus"}, "--bogus"},
        {2, {"serve", "--port"}, "needs a value"},
        {3, {"serve", "--port", "http"}, "not an integer"},
        {3, {"serve", "--port", "70000"}, "out of range"},
        {3, {"serve", "--kv-memory", "lots"}, "not a size"},
        {3, {"serve", "--log-level", "loud"}, "debug"},
        {3, {"serve", "--kv-type", "q4_0"}, "'q4_0' is not one of f32|f16|q8_0"},
        {3, {"serve", "--kv-type", "f3"}, "not one of"},
        {2, {"serve", "stray"}, "stray"},
        {3, {"serve", "--api-key", "has space"}, "printable"},
        {2, {"serve", "-x"}, "-x"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        struct config c;
        char msg[256];
        assert_int_equal(parse(&c, msg, cases[i].argc, cases[i].argv), ERR_INVAL);
        if (!strstr(msg, cases[i].needle)) fail_msg("case %zu: '%s'", i, msg);
        config_deinit(&c);
    }
}

static void test_cli_finds_config_before_other_flags(void **state) {
    (void)state;
    // "--config" as the value of another flag is not the --config flag.
    char *argv[] = {"serve", "--model-name", "--config", "--config=f.json", NULL};
    const char *path = NULL;
    char msg[256];
    assert_int_equal(cli_find_config(4, argv, &path, msg, sizeof(msg)), 0);
    assert_string_equal(path, "f.json");
    char *none[] = {"serve", "-m", "x", NULL};
    assert_int_equal(cli_find_config(3, none, &path, msg, sizeof(msg)), 0);
    assert_null(path);
}

static void test_cli_repeated_api_keys_add_up(void **state) {
    (void)state;
    char *argv[] = {"serve", "--api-key", "a", "--api-key=b", NULL};
    struct config c;
    char msg[256];
    assert_int_equal(parse(&c, msg, 4, argv), 0);
    assert_int_equal(c.n_api_keys, 2);
    config_deinit(&c);
}

static void test_cli_lora_flags(void **state) {
    (void)state;
    char *argv[] = {"serve", "--lora", "sql=/a/sql", "--allow-runtime-lora", "--lora=chat=/b/c=d",
                    "--max-loras", "3", NULL};
    struct config c;
    char msg[256];
    assert_int_equal(parse(&c, msg, 7, argv), 0);
    assert_int_equal(c.n_loras, 2);
    assert_string_equal(c.lora_names[0], "sql");
    assert_string_equal(c.lora_paths[0], "/a/sql");
    assert_string_equal(c.lora_names[1], "chat");
    assert_string_equal(c.lora_paths[1], "/b/c=d");  // the first '=' splits
    assert_int_equal(c.max_loras, 3);
    assert_true(c.allow_runtime_lora);
    config_deinit(&c);
    // A bool flag alone does not swallow the next argument.
    const char *file = NULL;
    char *argv2[] = {"serve", "--allow-runtime-lora", "--config", "x.json", NULL};
    assert_int_equal(cli_find_config(4, argv2, &file, msg, sizeof(msg)), 0);
    assert_string_equal(file, "x.json");
    char *argv3[] = {"serve", "--allow-runtime-lora=false", NULL};
    assert_int_equal(parse(&c, msg, 2, argv3), 0);
    assert_false(c.allow_runtime_lora);
    assert_int_equal(c.max_loras, 8);  // the default
    config_deinit(&c);
    struct {
        char *argv[3];
        const char *needle;
    } bad[] = {
        {{"serve", "--lora", "noequals"}, "NAME=PATH"},
        {{"serve", "--lora", "=path"}, "NAME=PATH"},
        {{"serve", "--lora", "name="}, "NAME=PATH"},
        {{"serve", "--allow-runtime-lora=maybe"}, "true or false"},
        {{"serve", "--max-loras", "1000"}, "out of range"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        int argc = bad[i].argv[2] ? 3 : 2;
        assert_int_equal(parse(&c, msg, argc, bad[i].argv), ERR_INVAL);
        if (!strstr(msg, bad[i].needle)) fail_msg("case %zu: '%s'", i, msg);
        config_deinit(&c);
    }
    char *dup[] = {"serve", "--lora", "a=/x", "--lora", "a=/y", NULL};
    assert_int_equal(parse(&c, msg, 5, dup), ERR_INVAL);
    assert_non_null(strstr(msg, "twice"));
    config_deinit(&c);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cli_long_short_and_inline_values),
        cmocka_unit_test(test_cli_rejects_bad_arguments_naming_them),
        cmocka_unit_test(test_cli_finds_config_before_other_flags),
        cmocka_unit_test(test_cli_repeated_api_keys_add_up),
        cmocka_unit_test(test_cli_lora_flags),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
