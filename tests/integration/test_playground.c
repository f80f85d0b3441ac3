/*
 * test_playground.c - the playground page at GET /.
 *
 * Over sockets, always: the page and its two files are served byte for byte
 * as server/web/ holds them (the source files are the oracle of the
 * embedding), with their Content-Type, a Content-Security-Policy that names
 * no other origin, Cache-Control: no-cache and an ETag that a conditional
 * GET turns into 304; GET / needs no API key while /v1/models still does.
 *
 * In a real browser, when Debian's chromium, node/npm and ../shared are
 * there (else skipped, saying which is missing): tests/integration/
 * playground.mjs drives headless Chromium through puppeteer-core (installed
 * into <build>/node_modules-puppeteer on first run, as the openai client
 * test does) against `llmserve serve` on stories260K with --api-key and an
 * adapter written by scripts/mklora. Its screenshots go to
 * <build>/tests/integration/playground/.
 */
#define _POSIX_C_SOURCE 200809L
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "tests/helpers/testutil.h"
#include "tests/integration/httptest.h"

static const char KEY[] = "pg-key";

struct web_case {
    const char *path;
    const char *file;  // under server/web/
    const char *type;
};

static const struct web_case web_cases[] = {
    {"/", "index.html", "text/html; charset=utf-8"},
    {"/playground.js", "playground.js", "text/javascript; charset=utf-8"},
    {"/playground.css", "playground.css", "text/css; charset=utf-8"},
};

static void test_playground_files_served_with_their_headers(void **state) {
    (void)state;
    struct httptest_server s;
    char args[64];
    snprintf(args, sizeof(args), "--api-key %s", KEY);
    httptest_start(&s, httptest_model("llama-f32"), args);
    for (size_t i = 0; i < sizeof(web_cases) / sizeof(web_cases[0]); i++) {
        const struct web_case *c = &web_cases[i];
        char src[4096];
        snprintf(src, sizeof(src), "%s/server/web/%s", testutil_source_dir(), c->file);
        size_t n_want = 0;
        char *want = testutil_read_file(src, &n_want);
        assert_non_null(want);

        struct httptest_resp r;
        assert_int_equal(httptest_request(s.port, "GET", c->path, NULL, NULL, &r), 200);
        assert_int_equal(r.body_len, n_want);
        assert_memory_equal(r.body, want, n_want);
        char v[1024];
        assert_true(httptest_header(&r, "Content-Type", v, sizeof(v)));
        assert_string_equal(v, c->type);
        assert_true(httptest_header(&r, "Cache-Control", v, sizeof(v)));
        assert_string_equal(v, "no-cache");
        assert_true(httptest_header(&r, "X-Content-Type-Options", v, sizeof(v)));
        assert_string_equal(v, "nosniff");
        // The policy: nothing by default, scripts, styles and requests from
        // this origin only, and no URL of anywhere else.
        assert_true(httptest_header(&r, "Content-Security-Policy", v, sizeof(v)));
        assert_non_null(strstr(v, "default-src 'none'"));
        assert_non_null(strstr(v, "script-src 'self'"));
        assert_non_null(strstr(v, "style-src 'self'"));
        assert_non_null(strstr(v, "connect-src 'self'"));
        assert_non_null(strstr(v, "frame-ancestors 'none'"));
        assert_null(strstr(v, "http"));
        assert_null(strstr(v, "unsafe"));
        char etag[128];
        assert_true(httptest_header(&r, "ETag", etag, sizeof(etag)));
        assert_true(etag[0] == '"' && etag[strlen(etag) - 1] == '"');
        httptest_resp_free(&r);

        // A conditional GET with the tag (among others, as browsers may send): 304, no body.
        char hdr[256];
        snprintf(hdr, sizeof(hdr), "If-None-Match: W/\"other\", %s\r\n", etag);
        assert_int_equal(httptest_request(s.port, "GET", c->path, hdr, NULL, &r), 304);
        assert_int_equal(r.body_len, 0);
        assert_true(httptest_header(&r, "ETag", v, sizeof(v)));
        assert_string_equal(v, etag);
        httptest_resp_free(&r);
        // Another tag: the file again.
        assert_int_equal(
            httptest_request(s.port, "GET", c->path, "If-None-Match: \"stale\"\r\n", NULL, &r),
            200);
        assert_int_equal(r.body_len, n_want);
        httptest_resp_free(&r);
        free(want);
    }
    // The page loads without the key; the API it calls does not.
    struct httptest_resp r;
    assert_int_equal(httptest_request(s.port, "GET", "/v1/models", NULL, NULL, &r), 401);
    httptest_resp_free(&r);
    assert_int_equal(httptest_request(s.port, "POST", "/", NULL, "{}", &r), 405);
    httptest_resp_free(&r);
    assert_int_equal(httptest_stop(&s, SIGTERM), 0);
}

static void test_playground_in_chromium(void **state) {
    (void)state;
    const char *shared = testutil_shared_dir();
    if (!shared) {
        print_message("skipped: ../shared is absent (stories260K.gguf)\n");
        skip();
    }
    if (!testutil_exists("/usr/bin/chromium")) {
        print_message("skipped: /usr/bin/chromium is not installed (scripts/setup installs it)\n");
        skip();
    }
    char mods[4096];
    snprintf(mods, sizeof(mods), "%s/node_modules-puppeteer", testutil_build_dir());
    // puppeteer-core 24 is the last line that runs on Node 20; -core never
    // downloads a browser.
    if (!httptest_npm_ensure(mods, "puppeteer-core", "puppeteer-core@24")) skip();
    char cmd[16384];
    char out[4096];
    snprintf(out, sizeof(out), "%s/tests/integration/playground", testutil_build_dir());
    snprintf(cmd, sizeof(cmd), "rm -rf %s && mkdir -p %s", out, out);
    assert_int_equal(testutil_system(cmd), 0);
    char model[4096];
    snprintf(model, sizeof(model), "%s/models/stories260K.gguf", shared);
    char lora[8192];
    snprintf(lora, sizeof(lora), "%s/lora.gguf", out);
    snprintf(cmd, sizeof(cmd),
             "/usr/bin/python3 %s/scripts/mklora --model %s --out %s --format gguf --seed 5",
             testutil_source_dir(), model, lora);
    assert_int_equal(testutil_system(cmd), 0);

    struct httptest_server s;
    char args[8400];
    snprintf(args, sizeof(args), "--api-key %s --lora tiny=%s", KEY, lora);
    httptest_start(&s, model, args);
    snprintf(cmd, sizeof(cmd),
             "PUPPETEER_MODULE_DIR=%s node %s/tests/integration/playground.mjs "
             "http://127.0.0.1:%d %s tiny %s",
             mods, testutil_source_dir(), s.port, KEY, out);
    int st = testutil_system(cmd);
    assert_int_equal(httptest_stop(&s, SIGTERM), 0);
    if (st != 0) {
        fail_msg("playground.mjs failed; screenshot and server log: %s, %s", out, s.log_path);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_playground_files_served_with_their_headers),
        cmocka_unit_test(test_playground_in_chromium),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
