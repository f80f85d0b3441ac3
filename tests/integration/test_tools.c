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
#define AFTER_TEXT_BIAS "4"  // test_tools_auto_trigger_after_text
#define ASK "\"messages\":[{\"role\":\"user\",\"content\":\"Weather in Paris?\"}]"

/* POSTs body to the chat route; returns the status and the parsed reply. The
 * synthetic vocabulary is mostly byte tokens, so a sampled reply can hold
 * U+0000, escaped as \u0000: valid JSON (RFC 8259 section 7), and what Python's
 * json and JSON.parse take, but refused by jansson unless JSON_ALLOW_NUL (one
 * CI run failed here as "not JSON" on a 4-token second turn of "\u0000\ufffd\u0007 m"). */
static int chat(int port, const char *body, json_t **out) {
    struct httptest_resp resp;
    int st = httptest_request(port, "POST", "/v1/chat/completions", NULL, body, &resp);
    *out = json_loads(resp.body ? resp.body : "", JSON_ALLOW_NUL, NULL);
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

/* ---- auto: the model's own trigger ------------------------------------------------- */

#define TOOLS_WEATHER                                                                 \
    "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\","       \
    "\"parameters\":" SCHEMA "}}]"

/* What a chat reply says, plain or accumulated from its stream's deltas. */
struct reply {
    char content[4096];  // "" when null or absent
    bool has_content;    // plain: content was a string (not null)
    int n_calls;
    char id[64];
    char name[64];
    char args[4096];
    char finish[32];
};

static void append(char *dst, size_t cap, const char *s) {
    size_t n = strlen(dst);
    snprintf(dst + n, cap - n, "%s", s ? s : "");
}

static void plain_reply(int port, const char *body, struct reply *out) {
    memset(out, 0, sizeof(*out));
    json_t *r = NULL;
    int st = chat(port, body, &r);
    if (st != 200) fail_msg("%d: %s", st, json_dumps(r, 0));
    json_t *c = json_array_get(json_object_get(r, "choices"), 0);
    json_t *msg = json_object_get(c, "message");
    const char *content = json_string_value(json_object_get(msg, "content"));
    out->has_content = content != NULL;
    append(out->content, sizeof(out->content), content);
    json_t *calls = json_object_get(msg, "tool_calls");
    out->n_calls = (int)json_array_size(calls);
    if (out->n_calls > 0) {
        json_t *call = json_array_get(calls, 0);
        json_t *fn = json_object_get(call, "function");
        append(out->id, sizeof(out->id), json_string_value(json_object_get(call, "id")));
        append(out->name, sizeof(out->name), json_string_value(json_object_get(fn, "name")));
        append(out->args, sizeof(out->args), json_string_value(json_object_get(fn, "arguments")));
    }
    append(out->finish, sizeof(out->finish),
           json_string_value(json_object_get(c, "finish_reason")));
    json_decref(r);
}

/* The same request streamed ("stream": true appended to body's members), its
 * deltas accumulated the way the OpenAI API defines them: content fragments,
 * and per call a first delta with index, id, type "function", the name and
 * arguments "", then argument fragments only. */
static void stream_reply(int port, const char *body, struct reply *out) {
    memset(out, 0, sizeof(*out));
    char sbody[8192];
    snprintf(sbody, sizeof(sbody), "%.*s,\"stream\":true}", (int)(strlen(body) - 1), body);
    struct httptest_resp resp;
    assert_int_equal(
        httptest_request(port, "POST", "/v1/chat/completions", NULL, sbody, &resp), 200);
    int n = 0;
    char **ev = httptest_sse_events(resp.body, &n);
    assert_true(n > 1);
    assert_string_equal(ev[n - 1], "[DONE]");
    for (int i = 0; i < n - 1; i++) {
        json_t *e = json_loads(ev[i], JSON_ALLOW_NUL, NULL);
        if (!e) fail_msg("event %d is not JSON: %s", i, ev[i]);
        json_t *c = json_array_get(json_object_get(e, "choices"), 0);
        json_t *d = json_object_get(c, "delta");
        append(out->content, sizeof(out->content),
               json_string_value(json_object_get(d, "content")));
        json_t *calls = json_object_get(d, "tool_calls");
        for (size_t k = 0; k < json_array_size(calls); k++) {
            json_t *tc = json_array_get(calls, k);
            json_t *fn = json_object_get(tc, "function");
            assert_true(json_integer_value(json_object_get(tc, "index")) == out->n_calls - 1 ||
                        json_object_get(tc, "id"));
            if (json_object_get(tc, "id")) {  // a new call: its first delta
                out->n_calls++;
                assert_int_equal(json_integer_value(json_object_get(tc, "index")),
                                 out->n_calls - 1);
                assert_string_equal(json_string_value(json_object_get(tc, "type")), "function");
                assert_string_equal(json_string_value(json_object_get(fn, "arguments")), "");
                if (out->n_calls == 1) {
                    append(out->id, sizeof(out->id), json_string_value(json_object_get(tc, "id")));
                    append(out->name, sizeof(out->name),
                           json_string_value(json_object_get(fn, "name")));
                }
            } else {
                assert_null(json_object_get(fn, "name"));
                if (out->n_calls == 1) {
                    append(out->args, sizeof(out->args),
                           json_string_value(json_object_get(fn, "arguments")));
                }
            }
        }
        const char *fin = json_string_value(json_object_get(c, "finish_reason"));
        if (fin) append(out->finish, sizeof(out->finish), fin);
        json_decref(e);
    }
    httptest_events_free(ev, n);
    httptest_resp_free(&resp);
}

/* The plain reply and the stream of the same seed say the same (the ids are
 * drawn per request). */
static void assert_same_reply(const struct reply *a, const struct reply *b) {
    assert_string_equal(a->content, b->content);
    assert_int_equal(a->n_calls, b->n_calls);
    assert_string_equal(a->name, b->name);
    assert_string_equal(a->args, b->args);
    assert_string_equal(a->finish, b->finish);
}

/* tool_choice auto on llama-tools-f32, whose vocabulary has the markers as
 * control tokens (tests/models: <tool_call> 297, [TOOL_CALLS] 299): a
 * logit_bias of +100 on the family's trigger makes the model write it
 * first, as a model that decides to call would; the server must see its own
 * syntax start, constrain what follows to a call of the tool, and answer
 * with message.tool_calls, content null and finish_reason "tool_calls", the
 * arguments valid for the schema (scripts/validate-json); the stream of the
 * same seed must build the same call from OpenAI-shaped deltas. One call:
 * parallel_tool_calls false (with it, the bias would open call after call). */
static void check_auto_trigger(const char *template_flag, int trigger_id) {
    struct httptest_server s;
    httptest_start(&s, httptest_model("llama-tools-f32"), template_flag);
    for (int seed = 1; seed <= 6; seed++) {
        char body[8192];
        snprintf(body, sizeof(body),
                 "{" ASK "," TOOLS_WEATHER ",\"tool_choice\":\"auto\",\"parallel_tool_calls\":"
                 "false,\"logit_bias\":{\"%d\":100},\"temperature\":1,\"seed\":%d,"
                 "\"max_tokens\":300}",
                 trigger_id, seed);
        struct reply plain, streamed;
        plain_reply(s.port, body, &plain);
        print_message("seed %d: %s(%s) %s\n", seed, plain.name, plain.args, plain.finish);
        assert_string_equal(plain.finish, "tool_calls");
        assert_false(plain.has_content);  // the trigger came first: no text before it
        assert_int_equal(plain.n_calls, 1);
        assert_string_equal(plain.name, "get_weather");
        validate_args(plain.args);
        stream_reply(s.port, body, &streamed);
        assert_same_reply(&plain, &streamed);
    }
    assert_int_equal(httptest_stop(&s, SIGTERM), 0);
}

static void test_tools_auto_hermes_trigger(void **state) {
    (void)state;
    check_auto_trigger(NULL, 297);  // <tool_call>
}

static void test_tools_auto_mistral_trigger(void **state) {
    (void)state;
    check_auto_trigger("--chat-template mistral-v3-tekken", 299);  // [TOOL_CALLS]
}

/* A smaller bias on <tool_call>: the model writes text first on some seeds and
 * then the trigger, on others it never calls. Whatever it does, the plain
 * reply and the stream agree, text written before the trigger is the content,
 * and a call that starts is valid when it ends, or cut short by max_tokens
 * (finish "length", its arguments so far: both forms say so alike). At least one of the 12 seeds
 * must have called after some text (the case this test is for). */
static void test_tools_auto_trigger_after_text(void **state) {
    (void)state;
    struct httptest_server s;
    httptest_start(&s, httptest_model("llama-tools-f32"), NULL);
    // 300 tokens: room for every call to end; 60: calls cut short, some before their name.
    const int max_tokens[2] = {300, 60};
    for (int m = 0; m < 2; m++) {
        int n_text_then_call = 0;
        for (int seed = 1; seed <= 12; seed++) {
            char body[8192];
            snprintf(body, sizeof(body),
                     "{" ASK "," TOOLS_WEATHER ",\"tool_choice\":\"auto\",\"parallel_tool_calls\":"
                     "false,\"logit_bias\":{\"297\":" AFTER_TEXT_BIAS "},\"temperature\":1,"
                     "\"seed\":%d,\"max_tokens\":%d}",
                     seed, max_tokens[m]);
            struct reply plain, streamed;
            plain_reply(s.port, body, &plain);
            stream_reply(s.port, body, &streamed);
            assert_same_reply(&plain, &streamed);
            print_message("max_tokens %d, seed %d: %zu bytes of text, %d call(s), %s\n",
                          max_tokens[m], seed, strlen(plain.content), plain.n_calls,
                          plain.finish);
            // The syntax is never content, whole or cut short.
            assert_null(strstr(plain.content, "<tool_call>"));
            assert_null(strstr(plain.content, "{\"name\""));
            if (plain.n_calls > 0) {
                assert_string_equal(plain.name, "get_weather");
                if (strcmp(plain.finish, "length") != 0) {  // else cut short: partial arguments
                    assert_string_equal(plain.finish, "tool_calls");
                    validate_args(plain.args);
                }
                if (plain.content[0] && m == 0) n_text_then_call++;
            } else {
                assert_string_equal(plain.finish, "length");
            }
        }
        if (m == 0) {
            print_message("%d of 12 seeds wrote text and then a whole call\n", n_text_then_call);
            assert_true(n_text_then_call >= 1);
        }
    }
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
        cmocka_unit_test(test_tools_auto_hermes_trigger),
        cmocka_unit_test(test_tools_auto_mistral_trigger),
        cmocka_unit_test(test_tools_auto_trigger_after_text),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
