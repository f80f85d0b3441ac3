/*
 * test_openai_client.c - the official `openai` npm client (openai@6: Node 20,
 * MACHINE.md) against the real server: completions and chat, plain and
 * streaming (tests/integration/openai_client.mjs), and tool calling and
 * structured output at temperature 1 over 50 seeds each, judged by the
 * client's own parsing and by scripts/validate-json
 * (tests/integration/openai_tools.mjs). The package is installed
 * into <build>/node_modules-openai on first run; the test skips, saying so,
 * only when npm or node is missing or the registry cannot be reached.
 */
#define _POSIX_C_SOURCE 200809L
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <cmocka.h>

#include "tests/helpers/testutil.h"
#include "tests/integration/httptest.h"

static void test_openai_npm_client(void **state) {
    (void)state;
    char dir[4096];
    snprintf(dir, sizeof(dir), "%s/node_modules-openai", testutil_build_dir());
    if (!httptest_npm_ensure(dir, "openai", "openai@6")) skip();
    char cmd[16384];
    struct httptest_server s;
    httptest_start(&s, httptest_model("llama-f32"), "--api-key test-key");
    snprintf(cmd, sizeof(cmd),
             "OPENAI_MODULE_DIR=%s node %s/tests/integration/openai_client.mjs "
             "http://127.0.0.1:%d/v1 llama-f32",
             dir, testutil_source_dir(), s.port);
    int st = testutil_system(cmd);
    assert_int_equal(httptest_stop(&s, SIGTERM), 0);
    assert_int_equal(st, 0);
}

static void test_openai_npm_client_tools(void **state) {
    (void)state;
    char dir[4096];
    snprintf(dir, sizeof(dir), "%s/node_modules-openai", testutil_build_dir());
    if (!httptest_npm_ensure(dir, "openai", "openai@6")) skip();
    char cmd[16384];
    struct httptest_server s;
    httptest_start(&s, httptest_model("llama-f32"), "--api-key test-key");
    snprintf(cmd, sizeof(cmd),
             "OPENAI_MODULE_DIR=%s node %s/tests/integration/openai_tools.mjs "
             "http://127.0.0.1:%d/v1 llama-f32 %s/scripts/validate-json 50",
             dir, testutil_source_dir(), s.port, testutil_source_dir());
    int st = testutil_system(cmd);
    assert_int_equal(httptest_stop(&s, SIGTERM), 0);
    assert_int_equal(st, 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_openai_npm_client),
        cmocka_unit_test(test_openai_npm_client_tools),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
