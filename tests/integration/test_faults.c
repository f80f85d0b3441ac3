/*
 * test_faults.c - faults around a running server: its model file truncated
 * and rewritten while it serves, SIGKILL under load followed by a
 * restart on the same port, a --request-timeout, and allocation failures
 * injected at the KV block table, adapter loading, request parsing and tool
 * calling's arrays (engine/base/fault.h). The oracle for "still correct" is stories260K's
 * known greedy text (../shared/models/README.md), or without ../shared the
 * synthetic model's answer before the fault.
 */
#define _POSIX_C_SOURCE 200809L
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cmocka.h>

#include "tests/helpers/testutil.h"
#include "tests/integration/httptest.h"

/* ../shared/models/README.md, B: the 30 greedy tokens after "Once upon a time". */
static const char GREEDY_30[] =
    ", there was a little girl named Lily. She loved to play outside in the park. One day,";
static const char REQUEST[] =
    "{\"prompt\":\"Once upon a time\",\"max_tokens\":30,\"temperature\":0}";

/* The model the tests serve, and the text REQUEST must get from it (NULL:
 * not known in advance; the first answer is the reference). */
static const char *model_source(const char **want) {
    const char *shared = testutil_shared_dir();
    const char *stories = shared ? testutil_path(shared, "models/stories260K.gguf") : NULL;
    if (stories && testutil_exists(stories)) {
        *want = GREEDY_30;
        return stories;
    }
    print_message("note: ../shared is absent; the synthetic model's first answer is the oracle\n");
    *want = NULL;
    return httptest_model("llama-f32");
}

/* REQUEST's text from the server on port (a malloc'd string), asserting 200. */
static char *greedy_text(int port) {
    struct httptest_resp r;
    int st = httptest_request(port, "POST", "/v1/completions", NULL, REQUEST, &r);
    if (st != 200) fail_msg("completion answered %d: %s", st, r.body ? r.body : "");
    char *text = httptest_json_str(r.body, "text");
    assert_non_null(text);
    httptest_resp_free(&r);
    return text;
}

static void copy_file(const char *from, const char *to) {
    size_t n = 0;
    char *data = testutil_read_file(from, &n);
    assert_non_null(data);
    FILE *fp = fopen(to, "wb");
    assert_non_null(fp);
    assert_int_equal(fwrite(data, 1, n, fp), n);
    assert_int_equal(fclose(fp), 0);
    free(data);
}

/* The model file is truncated to nothing, then rewritten with other bytes,
 * while the server runs: it goes on answering exactly as before (it read the
 * file once; with the file mapped, the next forward pass died of SIGBUS). */
static void test_model_truncated_while_serving(void **state) {
    (void)state;
    const char *want = NULL;
    const char *src = model_source(&want);
    char path[4096];
    snprintf(path, sizeof(path), "%s/tests/integration/faults-model-%d.gguf",
             testutil_build_dir(), (int)getpid());
    copy_file(src, path);
    struct httptest_server s;
    httptest_start(&s, path, NULL);
    char *before = greedy_text(s.port);
    if (want) assert_string_equal(before, want);
    assert_int_equal(truncate(path, 0), 0);
    char *after = greedy_text(s.port);
    assert_string_equal(after, before);
    free(after);
    FILE *fp = fopen(path, "wb");  // rewritten in place with garbage
    assert_non_null(fp);
    for (int i = 0; i < 4096; i++) fputc(i * 31, fp);
    assert_int_equal(fclose(fp), 0);
    after = greedy_text(s.port);
    assert_string_equal(after, before);
    free(after);
    free(before);
    assert_int_equal(httptest_stop(&s, SIGTERM), 0);
    unlink(path);
}

/* SIGKILL while streams run (no drain, no cleanup), then a restart on the
 * same port: it binds again at once and answers correctly. */
static void test_sigkill_then_restart(void **state) {
    (void)state;
    const char *want = NULL;
    const char *model = model_source(&want);
    struct httptest_server s;
    httptest_start(&s, model, NULL);
    char *before = greedy_text(s.port);
    if (want) assert_string_equal(before, want);
    const char *body = "{\"prompt\":\"Once\",\"max_tokens\":400,\"ignore_eos\":true,"
                       "\"stream\":true}";
    enum { N = 8 };
    int fds[N];
    for (int i = 0; i < N; i++) {
        fds[i] = httptest_send(s.port, "POST", "/v1/completions", NULL, body);
        assert_true(fds[i] >= 0);
    }
    assert_true(httptest_recv_until(fds[N - 1], "data: ", 1 << 20));  // streaming
    int port = s.port;
    assert_int_equal(kill(s.pid, SIGKILL), 0);
    int st = 0;
    assert_int_equal(waitpid(s.pid, &st, 0), s.pid);
    assert_true(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
    s.pid = 0;
    for (int i = 0; i < N; i++) close(fds[i]);
    struct httptest_server s2;
    httptest_start_port(&s2, model, port, NULL);
    assert_int_equal(s2.port, port);
    char *after = greedy_text(s2.port);
    assert_string_equal(after, before);
    free(after);
    free(before);
    assert_int_equal(httptest_stop(&s2, SIGTERM), 0);
}

/* --request-timeout: a stream that runs longer ends with an OpenAI error
 * event (code request_timeout); a plain request queued behind
 * it (--max-seqs 32, all taken) gets 504 with an OpenAI error; the server then answers
 * at once. 4 prompts x n = 8 x 2000 tokens (32 sequences) take seconds
 * even on a quiet machine, against the limit of 1 s; one prompt x 8 took
 * under 1 s there, and the stream ended before its deadline. */
static void test_request_timeout(void **state) {
    (void)state;
    struct httptest_server s;
    httptest_start(&s, httptest_model("llama256-f32"), "--request-timeout 1 --max-seqs 32");
    const char *body = "{\"prompt\":[\"x\",\"y\",\"z\",\"w\"],\"max_tokens\":2000,\"n\":8,"
                       "\"ignore_eos\":true%s}";
    char stream_body[256];
    snprintf(stream_body, sizeof(stream_body), body, ",\"stream\":true");
    char plain_body[256];
    snprintf(plain_body, sizeof(plain_body), body, "");
    int fd_stream = httptest_send(s.port, "POST", "/v1/completions", NULL, stream_body);
    assert_true(fd_stream >= 0);
    // The stream as it comes, kept whole: on a loaded machine its first chunk
    // and its error event can arrive in one read.
    size_t cap = 1 << 16;
    size_t len = 0;
    char *rest = malloc(cap);
    assert_non_null(rest);
    rest[0] = 0;
    while (!strstr(rest, "data: ")) {  // running
        ssize_t n = recv(fd_stream, rest + len, cap - len - 1, 0);
        assert_true(n > 0 && len + (size_t)n < cap - 1);
        len += (size_t)n;
        rest[len] = 0;
    }
    int fd_plain = httptest_send(s.port, "POST", "/v1/completions", NULL, plain_body);
    assert_true(fd_plain >= 0);
    struct httptest_resp r;
    assert_int_equal(httptest_recv(fd_plain, &r), 504);
    assert_true(httptest_is_openai_error(r.body));
    char *code = httptest_json_str(r.body, "code");
    assert_string_equal(code, "request_timeout");
    free(code);
    httptest_resp_free(&r);
    // The rest of the stream, to its end.
    for (ssize_t n; (n = recv(fd_stream, rest + len, cap - len - 1, 0)) > 0;) {
        len += (size_t)n;
        if (cap - len < 4096) {
            cap *= 2;
            rest = realloc(rest, cap);
            assert_non_null(rest);
        }
    }
    rest[len] = 0;
    close(fd_stream);
    // The error event, then (as vLLM does) the choices' ends and [DONE].
    const char *err_event = strstr(rest, "data: {\"error\":");
    if (!err_event) {
        fail_msg("no error event in the stream's %zu bytes; it ends: %s", len,
                 rest + (len > 600 ? len - 600 : 0));
    }
    assert_non_null(strstr(err_event, "\"code\":\"request_timeout\""));
    const char *done = strstr(rest, "data: [DONE]");
    assert_true(!done || done > err_event);
    free(rest);
    assert_int_equal(httptest_request(s.port, "POST", "/v1/completions", NULL,
                                      "{\"prompt\":\"x\",\"max_tokens\":2}", &r),
                     200);
    httptest_resp_free(&r);
    assert_int_equal(httptest_stop(&s, SIGTERM), 0);
}

/* POST path with body on port; asserts the status, and for an error the
 * OpenAI shape with type server_error (a 500 is the server's fault, not the
 * request's). */
static void expect(int port, const char *path, const char *body, int want) {
    struct httptest_resp r;
    int st = httptest_request(port, "POST", path, NULL, body, &r);
    if (st != want) fail_msg("%s answered %d, want %d: %s", path, st, want, r.body ? r.body : "");
    if (want >= 400) {
        assert_true(httptest_is_openai_error(r.body));
        char *type = httptest_json_str(r.body, "type");
        assert_non_null(type);
        assert_string_equal(type, "server_error");
        free(type);
    }
    httptest_resp_free(&r);
}

/* LLMSERVE_FAULT (engine/base/fault.h) makes the 3rd request's parse and
 * the 5th sequence's block table fail. Each plain completion parses one
 * array (its prompts) and, once parsed, makes one sequence, so by hand:
 * requests 1, 2 parse 1, 2 and make sequences 1, 2; request 3 fails to
 * parse (500) and makes none; 4 and 5 make sequences 3 and 4; request 6
 * fails at sequence 5 (500); request 7 is served. Every request that is
 * served gets the greedy text. */
static void test_allocation_failures_fail_one_request(void **state) {
    (void)state;
    const char *want = NULL;
    const char *src = model_source(&want);
    setenv("LLMSERVE_FAULT", "parse:3,kv:5", 1);
    struct httptest_server s;
    httptest_start(&s, src, NULL);
    unsetenv("LLMSERVE_FAULT");
    char *ref = greedy_text(s.port);  // request 1
    if (want) assert_string_equal(ref, want);
    for (int i = 2; i <= 7; i++) {
        if (i == 3 || i == 6) {
            expect(s.port, "/v1/completions", REQUEST, 500);
            continue;
        }
        char *text = greedy_text(s.port);
        assert_string_equal(text, ref);
        free(text);
    }
    free(ref);
    assert_int_equal(httptest_stop(&s, SIGTERM), 0);
}

/* The first runtime adapter load fails on its first A matrix (500); the
 * same load again succeeds, and the adapter then answers exactly as it does
 * on a server that loaded it at start-up without any fault. */
static void test_adapter_allocation_failure(void **state) {
    (void)state;
    char adapter[4096];
    snprintf(adapter, sizeof(adapter), "%s/tests/models/llama-gguf-f16.gguf",
             testutil_build_dir());
    char body[4200];
    snprintf(body, sizeof(body), "{\"lora_name\":\"a\",\"lora_path\":\"%s\"}", adapter);
    static const char req_a[] =
        "{\"model\":\"a\",\"prompt\":\"Once upon a time\",\"max_tokens\":12,\"temperature\":0}";

    setenv("LLMSERVE_FAULT", "adapter:1", 1);
    struct httptest_server s;
    char args[4200];
    snprintf(args, sizeof(args), "--allow-runtime-lora --lora-dir %s/tests/models",
             testutil_build_dir());
    httptest_start(&s, httptest_model("llama-f32"), args);
    unsetenv("LLMSERVE_FAULT");
    expect(s.port, "/v1/load_lora_adapter", body, 500);
    expect(s.port, "/v1/load_lora_adapter", body, 200);
    struct httptest_resp r;
    assert_int_equal(httptest_request(s.port, "POST", "/v1/completions", NULL, req_a, &r), 200);
    char *got = httptest_json_str(r.body, "text");
    assert_non_null(got);
    httptest_resp_free(&r);
    assert_int_equal(httptest_stop(&s, SIGTERM), 0);

    snprintf(args, sizeof(args), "--lora a=%s", adapter);
    httptest_start(&s, httptest_model("llama-f32"), args);
    assert_int_equal(httptest_request(s.port, "POST", "/v1/completions", NULL, req_a, &r), 200);
    char *ref = httptest_json_str(r.body, "text");
    assert_non_null(ref);
    httptest_resp_free(&r);
    assert_int_equal(httptest_stop(&s, SIGTERM), 0);
    assert_string_equal(got, ref);
    free(got);
    free(ref);
}

/* A chat request whose only tool, ping, takes no arguments (the schema
 * allows only {}), with a call required: by hand, its reply is one call of
 * ping with arguments {} whatever the model is. */
static const char TOOL_REQUEST[] =
    "{\"messages\":[{\"role\":\"user\",\"content\":\"Ping?\"}],"
    "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"ping\","
    "\"parameters\":{\"type\":\"object\",\"properties\":{},"
    "\"additionalProperties\":false}}}],"
    "\"tool_choice\":\"required\",\"parallel_tool_calls\":false,"
    "\"max_tokens\":200,\"temperature\":0}";

/* TOOL_REQUEST on port answers 200 with that one call. */
static void expect_tool_call(int port) {
    struct httptest_resp r;
    int st = httptest_request(port, "POST", "/v1/chat/completions", NULL, TOOL_REQUEST, &r);
    if (st != 200) fail_msg("tool request answered %d: %s", st, r.body ? r.body : "");
    char *finish = httptest_json_str(r.body, "finish_reason");
    char *name = httptest_json_str(r.body, "name");
    char *args = httptest_json_str(r.body, "arguments");
    if (!finish || !name || !args) fail_msg("not a tool call: %s", r.body);
    assert_string_equal(finish, "tool_calls");
    assert_string_equal(name, "ping");
    char *o = args;  // the JSON text {} with any white space the grammar allows
    for (const char *c = args; *c; c++) {
        if (*c != ' ' && *c != '\n' && *c != '\t' && *c != '\r') *o++ = *c;
    }
    *o = '\0';
    assert_string_equal(args, "{}");
    free(finish);
    free(name);
    free(args);
    httptest_resp_free(&r);
}

/* tools:N (engine/base/fault.h). Counted by hand from server/openai.c and
 * server/routes.c, TOOL_REQUEST (one tool with two members, no tool_calls
 * in its messages) allocates 6 arrays at the site: tools, ping's members,
 * the templates' view of the tools, the grammar's list, and the reply's
 * calls and ids. So allocations 1-6 are the first tool request's and 7-12
 * the second's; the failing one is a 500 for its request only, and a plain
 * completion (no tools: nothing at the site) before them and a third tool
 * request after are served. */
static void test_tools_allocation_failures(void **state) {
    (void)state;
    const int at[] = {1, 2, 3, 4, 5, 6, 7, 12};
    for (size_t k = 0; k < sizeof(at) / sizeof(at[0]); k++) {
        char spec[32];
        snprintf(spec, sizeof(spec), "tools:%d", at[k]);
        setenv("LLMSERVE_FAULT", spec, 1);
        struct httptest_server s;
        httptest_start(&s, httptest_model("llama-f32"), NULL);
        unsetenv("LLMSERVE_FAULT");
        expect(s.port, "/v1/completions", REQUEST, 200);
        for (int i = 1; i <= 3; i++) {
            bool fails = (i == 1 && at[k] <= 6) || (i == 2 && at[k] >= 7 && at[k] <= 12);
            if (fails) {
                expect(s.port, "/v1/chat/completions", TOOL_REQUEST, 500);
            } else {
                expect_tool_call(s.port);
            }
        }
        assert_int_equal(httptest_stop(&s, SIGTERM), 0);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_model_truncated_while_serving),
        cmocka_unit_test(test_sigkill_then_restart),
        cmocka_unit_test(test_request_timeout),
        cmocka_unit_test(test_allocation_failures_fail_one_request),
        cmocka_unit_test(test_adapter_allocation_failure),
        cmocka_unit_test(test_tools_allocation_failures),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
