/*
 * test_tools.c - tool calling through HTTP in each template family with
 * tools: Hermes (the ChatML fallback of a model without a template),
 * --chat-template llama3.1 and mistral-v3-tekken. A required call must come
 * back as OpenAI shapes it (message.tool_calls with an id, type "function",
 * the name and arguments that parse as JSON and, judged by
 * scripts/validate-json, satisfy the tool's schema; finish_reason
 * "tool_calls"), and a history holding that call and its result must be
 * accepted in the next turn. "auto" with no call is plain content, and what
 * the templates refuse (tools for llama2, Mistral ids that are not 9
 * characters) are 400s naming the field.
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
#include <unistd.h>
#include <cmocka.h>

#include <jansson.h>

#include "tests/helpers/testutil.h"
#include "tests/integration/httptest.h"

#define SCHEMA                                                                          \
    "{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\",\"maxLength\":8}," \
    "\"days\":{\"type\":\"integer\"}},\"required\":[\"city\",\"days\"],"                 \
    "\"additionalProperties\":false}"
#define TOOLS                                                                        \
    "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\","      \
    "\"description\":\"Weather\",\"parameters\":" SCHEMA "}},{\"type\":\"function\"," \
    "\"function\":{\"name\":\"ping\"}}]"
#define ASK "\"messages\":[{\"role\":\"user\",\"content\":\"Weather in Paris?\"}]"

/* POSTs body to the chat route; returns the status and the parsed reply. */
static int chat(int port, const char *body, json_t **out) {
    struct httptest_resp resp;
    int st = httptest_request(port, "POST", "/v1/chat/completions", NULL, body, &resp);
    *out = json_loads(resp.body ? resp.body : "", 0, NULL);
    if (!*out) fail_msg("not JSON (%d): %s", st, resp.body);
    httptest_resp_free(&resp);
    return st;
}

/* Checks arguments against SCHEMA with scripts/validate-json. */
static void validate_args(const char *args) {
    char path[] = "/tmp/llmserve-tools-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    FILE *f = fdopen(fd, "w");
    json_t *line = json_pack("{s:o, s:s}", "schema", json_loads(SCHEMA, 0, NULL), "text", args);
    char *t = json_dumps(line, JSON_COMPACT);
    fprintf(f, "%s\n", t);
    free(t);
    json_decref(line);
    fclose(f);
    char cmd[1024];
    snprintf(cmd, sizeof(cmd), "/usr/bin/python3 %s/scripts/validate-json < %s",
             testutil_source_dir(), path);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    char verdict[2048] = "";
    if (!fgets(verdict, sizeof(verdict), p)) verdict[0] = '\0';
    assert_int_equal(pclose(p), 0);
    unlink(path);
    if (strncmp(verdict, "ok", 2) != 0) fail_msg("arguments '%s': %s", args, verdict);
}

/* A required call of get_weather in the family the server renders; then the
 * call and a result in the history of the next request. */
static void check_family(const char *template_flag, bool short_ids) {
    struct httptest_server s;
    httptest_start(&s, httptest_model("llama-f32"), template_flag);
    for (int seed = 1; seed <= 3; seed++) {
        char body[8192];
        snprintf(body, sizeof(body),
                 "{" ASK "," TOOLS ",\"tool_choice\":{\"type\":\"function\",\"function\":"
                 "{\"name\":\"get_weather\"}},\"temperature\":1,\"seed\":%d,\"max_tokens\":300}",
                 seed);
        json_t *r = NULL;
        assert_int_equal(chat(s.port, body, &r), 200);
        json_t *c = json_array_get(json_object_get(r, "choices"), 0);
        json_t *msg = json_object_get(c, "message");
        assert_string_equal(json_string_value(json_object_get(c, "finish_reason")), "tool_calls");
        assert_true(json_is_null(json_object_get(msg, "content")));
        json_t *calls = json_object_get(msg, "tool_calls");
        assert_int_equal(json_array_size(calls), 1);
        json_t *call = json_array_get(calls, 0);
        const char *id = json_string_value(json_object_get(call, "id"));
        assert_non_null(id);
        if (short_ids) {
            assert_int_equal(strlen(id), 9);
        } else {
            assert_int_equal(strncmp(id, "call_", 5), 0);
        }
        assert_string_equal(json_string_value(json_object_get(call, "type")), "function");
        json_t *fn = json_object_get(call, "function");
        assert_string_equal(json_string_value(json_object_get(fn, "name")), "get_weather");
        const char *args = json_string_value(json_object_get(fn, "arguments"));
        assert_non_null(args);
        validate_args(args);
        // the next turn: the call and its result in the history
        json_t *next = json_pack("{s:[{s:s,s:s},{s:s,s:n,s:[O]},{s:s,s:s,s:s}],s:i}", "messages",
                                 "role", "user", "content", "Weather in Paris?", "role",
                                 "assistant", "content", "tool_calls", call, "role", "tool",
                                 "tool_call_id", id, "content", "{\"temp\": 21}", "max_tokens", 4);
        json_t *tools = json_loads("[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\","
                                   "\"parameters\":" SCHEMA "}}]", 0, NULL);
        json_object_set_new(next, "tools", tools);
        char *nb = json_dumps(next, JSON_COMPACT);
        json_t *r2 = NULL;
        int st = chat(s.port, nb, &r2);
        if (st != 200) fail_msg("%s: %s", nb, json_dumps(r2, 0));
        json_decref(r2);
        free(nb);
        json_decref(next);
        json_decref(r);
    }
    httptest_stop(&s, SIGTERM);
}

static void test_tools_hermes(void **state) {
    (void)state;
    check_family(NULL, false);
}

static void test_tools_llama3_1(void **state) {
    (void)state;
    check_family("--chat-template llama3.1", false);
}

static void test_tools_mistral(void **state) {
    (void)state;
    check_family("--chat-template mistral-v3-tekken", true);
    // its template's own rule: call ids of 9 characters
    struct httptest_server s;
    httptest_start(&s, httptest_model("llama-f32"), "--chat-template mistral-v3-tekken");
    json_t *r = NULL;
    const char *body =
        "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"},{\"role\":\"assistant\",\"tool_calls\":"
        "[{\"id\":\"call_1\",\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":"
        "\"{}\"}}]},{\"role\":\"tool\",\"tool_call_id\":\"call_1\",\"content\":\"ok\"}]}";
    assert_int_equal(chat(s.port, body, &r), 400);
    json_t *err = json_object_get(r, "error");
    assert_string_equal(json_string_value(json_object_get(err, "param")), "messages");
    assert_non_null(strstr(json_string_value(json_object_get(err, "message")), "9 alphanumeric"));
    json_decref(r);
    httptest_stop(&s, SIGTERM);
}

/* auto with a model that writes no call: content and its own finish. */
static void test_tools_auto_without_a_call_is_text(void **state) {
    (void)state;
    struct httptest_server s;
    httptest_start(&s, httptest_model("llama-f32"), NULL);
    json_t *r = NULL;
    assert_int_equal(chat(s.port, "{" ASK "," TOOLS ",\"max_tokens\":12,\"seed\":5}", &r), 200);
    json_t *c = json_array_get(json_object_get(r, "choices"), 0);
    json_t *msg = json_object_get(c, "message");
    assert_true(json_is_string(json_object_get(msg, "content")));
    assert_null(json_object_get(msg, "tool_calls"));
    assert_string_equal(json_string_value(json_object_get(c, "finish_reason")), "length");
    json_decref(r);
    // tools for a template without them, and a named tool that is not there
    httptest_stop(&s, SIGTERM);
    httptest_start(&s, httptest_model("llama-f32"), "--chat-template llama2");
    assert_int_equal(chat(s.port, "{" ASK "," TOOLS "}", &r), 400);
    assert_string_equal(
        json_string_value(json_object_get(json_object_get(r, "error"), "param")), "tools");
    json_decref(r);
    assert_int_equal(chat(s.port, "{" ASK "," TOOLS ",\"tool_choice\":{\"type\":\"function\","
                                  "\"function\":{\"name\":\"nope\"}}}", &r), 400);
    assert_string_equal(
        json_string_value(json_object_get(json_object_get(r, "error"), "param")), "tool_choice");
    json_decref(r);
    assert_int_equal(httptest_stop(&s, SIGTERM), 0);
}

int main(void) {
    if (system("/usr/bin/python3 -c 'import jsonschema' 2>/dev/null") != 0) {
        printf("skipped: python3-jsonschema is missing (scripts/setup installs it)\n");
        return 77;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tools_hermes),
        cmocka_unit_test(test_tools_llama3_1),
        cmocka_unit_test(test_tools_mistral),
        cmocka_unit_test(test_tools_auto_without_a_call_is_text),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
