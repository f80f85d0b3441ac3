/* tests/config/test_config.c - the load sequence: defaults, then file, then
 * flags, then the key file; validation messages name the setting. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "config/config.h"
#include "engine/base/err.h"

static int load(struct config *c, char *msg, int argc, char **argv) {
    return config_load(c, argc, argv, msg, 256);
}

static const char *write_tmp(const char *text) {
    static char path[8][64];
    static int k;
    char *p = path[k++ % 8];
    snprintf(p, 64, "/tmp/llmserve_cfg_XXXXXX");
    int fd = mkstemp(p);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    close(fd);
    return p;
}

static void test_config_defaults_are_valid_with_a_model(void **state) {
    (void)state;
    struct config c;
    config_init_defaults(&c);
    char msg[256];
    assert_int_equal(config_validate(&c, msg, sizeof(msg)), ERR_INVAL);
    assert_non_null(strstr(msg, "--model"));
    c.model_path = strdup("m.gguf");
    assert_int_equal(config_validate(&c, msg, sizeof(msg)), 0);
    assert_string_equal(c.host, "127.0.0.1");
    assert_int_equal(c.block_size, 16);
    config_deinit(&c);
}

static void test_config_flags_override_file(void **state) {
    (void)state;
    const char *f = write_tmp("{\"port\": 9000, \"max_seqs\": 8, \"kv_memory\": \"64M\","
                              " \"model\": \"a.gguf\", \"api_keys\": [\"k1\"]}");
    char *argv[] = {"serve", "--config", (char *)f, "--port=9100", "--api-key", "k2", NULL};
    struct config c;
    char msg[256];
    assert_int_equal(load(&c, msg, 6, argv), 0);
    assert_int_equal(c.port, 9100);
    assert_int_equal(c.max_seqs, 8);
    assert_int_equal(c.kv_bytes, 64LL << 20);
    assert_string_equal(c.model_path, "a.gguf");
    assert_int_equal(c.n_api_keys, 2);
    assert_string_equal(c.api_keys[0], "k1");
    assert_string_equal(c.api_keys[1], "k2");
    assert_string_equal(c.config_file, f);
    config_deinit(&c);
    unlink(f);
}

static void test_config_reads_api_key_file(void **state) {
    (void)state;
    const char *f = write_tmp("# keys\n  alpha  \n\nbeta\r\n");
    char *argv[] = {"serve", "-m", "x.gguf", "--api-key-file", (char *)f, NULL};
    struct config c;
    char msg[256];
    assert_int_equal(load(&c, msg, 5, argv), 0);
    assert_int_equal(c.n_api_keys, 2);
    assert_string_equal(c.api_keys[0], "alpha");
    assert_string_equal(c.api_keys[1], "beta");
    config_deinit(&c);
    unlink(f);
}

static void test_config_missing_key_file_is_io_error(void **state) {
    (void)state;
    char *argv[] = {"serve", "-m", "x.gguf", "--api-key-file", "/nonexistent/keys", NULL};
    struct config c;
    char msg[256];
    assert_int_equal(load(&c, msg, 5, argv), ERR_IO);
    assert_non_null(strstr(msg, "--api-key-file"));
    config_deinit(&c);
}

static void test_config_cross_field_rules(void **state) {
    (void)state;
    char msg[256];
    struct config c;
    char *a1[] = {"serve", "-m", "x", "--block-size", "12", NULL};
    assert_int_equal(load(&c, msg, 5, a1), ERR_INVAL);
    assert_non_null(strstr(msg, "power of two"));
    config_deinit(&c);
    char *a2[] = {"serve", "-m", "x", "--max-seqs", "64", "--max-batch-tokens", "8", NULL};
    assert_int_equal(load(&c, msg, 7, a2), ERR_INVAL);
    assert_non_null(strstr(msg, "--max-batch-tokens"));
    config_deinit(&c);
    // Runtime adapter loads open a client's path: only inside --lora-dir.
    char *a3[] = {"serve", "-m", "x", "--allow-runtime-lora", NULL};
    assert_int_equal(load(&c, msg, 4, a3), ERR_INVAL);
    assert_non_null(strstr(msg, "--allow-runtime-lora"));
    assert_non_null(strstr(msg, "--lora-dir"));
    config_deinit(&c);
    char *a4[] = {"serve", "-m", "x", "--allow-runtime-lora", "--lora-dir", "/srv/loras", NULL};
    assert_int_equal(load(&c, msg, 6, a4), 0);
    config_deinit(&c);
    char *a5[] = {"serve", "-m", "x", "--lora-dir", "/srv/loras", NULL};  // harmless alone
    assert_int_equal(load(&c, msg, 5, a5), 0);
    config_deinit(&c);
    // TP x PP: both together are a job of tp * pp ranks, up to 1024 of them.
    char *a6[] = {"serve", "-m", "x", "--tp", "2", "--pp", "2", NULL};
    assert_int_equal(load(&c, msg, 7, a6), 0);
    assert_int_equal(c.tp, 2);
    assert_int_equal(c.pp, 2);
    config_deinit(&c);
    char *a7[] = {"serve", "-m", "x", "--tp", "64", "--pp", "32", NULL};  // 2048 ranks
    assert_int_equal(load(&c, msg, 7, a7), ERR_INVAL);
    assert_non_null(strstr(msg, "over 1024 ranks"));
    config_deinit(&c);
    // Sequence parallelism: alone, never with TP or PP.
    char *a8[] = {"serve", "-m", "x", "--sp", "2", NULL};
    assert_int_equal(load(&c, msg, 5, a8), 0);
    assert_int_equal(c.sp, 2);
    config_deinit(&c);
    char *a9[] = {"serve", "-m", "x", "--sp", "2", "--tp", "2", NULL};
    assert_int_equal(load(&c, msg, 7, a9), ERR_INVAL);
    assert_non_null(strstr(msg, "--sp 2 goes with neither --tp nor --pp"));
    config_deinit(&c);
    // The KV cache divided over the SP ranks: only with some.
    char *a9b[] = {"serve", "-m", "x", "--sp", "2", "--sp-divide-kv", NULL};
    assert_int_equal(load(&c, msg, 6, a9b), 0);
    assert_true(c.sp_divide_kv);
    config_deinit(&c);
    char *a9c[] = {"serve", "-m", "x", "--sp-divide-kv", NULL};
    assert_int_equal(load(&c, msg, 4, a9c), ERR_INVAL);
    assert_non_null(strstr(msg, "--sp-divide-kv divides the KV cache over the ranks of --sp N"));
    config_deinit(&c);
    char *a10[] = {"serve", "-m", "x", "--draft-model", "d.gguf", NULL};
    assert_int_equal(load(&c, msg, 5, a10), 0);
    assert_string_equal(c.draft_model_path, "d.gguf");
    config_deinit(&c);
    // A draft model runs on rank 0 beside any split (tests/integration/test_tp.c).
    char *a11[] = {"serve", "-m", "x", "--draft-model", "d.gguf", "--pp", "2", NULL};
    assert_int_equal(load(&c, msg, 7, a11), 0);
    assert_int_equal(c.pp, 2);
    config_deinit(&c);
}

static void test_config_help_sets_show_help(void **state) {
    (void)state;
    char *argv[] = {"serve", "--help", NULL};
    struct config c;
    char msg[256];
    assert_int_equal(load(&c, msg, 2, argv), 0);
    assert_true(c.show_help);
    config_deinit(&c);
}

static void test_config_help_lists_every_flag(void **state) {
    (void)state;
    char *text = NULL;
    size_t len = 0;
    FILE *fp = open_memstream(&text, &len);
    config_print_help(fp);
    fclose(fp);
    const char *flags[] = {"--host", "--port", "--model", "--model-name", "--threads",
                           "--kv-memory", "--block-size", "--max-seqs", "--max-batch-tokens",
                           "--max-queue", "--max-body", "--request-timeout", "--idle-timeout",
                           "--read-timeout", "--max-connections", "--shutdown-grace",
                           "--api-key", "--api-key-file", "--log-level", "--config", "--help"};
    for (size_t i = 0; i < sizeof(flags) / sizeof(flags[0]); i++) {
        assert_non_null(strstr(text, flags[i]));
    }
    assert_non_null(strstr(text, "127.0.0.1"));
    free(text);
}

static void test_config_parse_size(void **state) {
    (void)state;
    int64_t v = 0;
    assert_int_equal(config_parse_size("1024", &v), 0);
    assert_int_equal(v, 1024);
    assert_int_equal(config_parse_size("4k", &v), 0);
    assert_int_equal(v, 4096);
    assert_int_equal(config_parse_size("512MiB", &v), 0);
    assert_int_equal(v, 512LL << 20);
    assert_int_equal(config_parse_size("2G", &v), 0);
    assert_int_equal(v, 2LL << 30);
    assert_int_equal(config_parse_size("12X", &v), ERR_INVAL);
    assert_int_equal(config_parse_size("-1", &v), ERR_INVAL);
    assert_int_equal(config_parse_size("", &v), ERR_INVAL);
    assert_int_equal(config_parse_size("99999999999999999999G", &v), ERR_INVAL);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_config_defaults_are_valid_with_a_model),
        cmocka_unit_test(test_config_flags_override_file),
        cmocka_unit_test(test_config_reads_api_key_file),
        cmocka_unit_test(test_config_missing_key_file_is_io_error),
        cmocka_unit_test(test_config_cross_field_rules),
        cmocka_unit_test(test_config_help_sets_show_help),
        cmocka_unit_test(test_config_help_lists_every_flag),
        cmocka_unit_test(test_config_parse_size),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
