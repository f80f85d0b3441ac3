/* tests/server/test_openai.c - request parsing against the OpenAI API
 * reference (field names, types, defaults), hostile bodies, and response
 * shapes. */
#define _POSIX_C_SOURCE 200809L
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include <jansson.h>

#include "engine/base/err.h"
#include "server/openai.h"

static int parse(enum openai_route route, const char *body, struct openai_request *r,
                 struct openai_error *e) {
    return openai_parse(route, body, strlen(body), 300, r, e);
}

static void test_openai_parses_completion_fields(void **state) {
    (void)state;
    struct openai_request r;
    struct openai_error e;
    assert_int_equal(parse(OPENAI_ROUTE_COMPLETIONS,
                           "{\"model\":\"m\",\"prompt\":\"hi\",\"max_tokens\":5,\"temperature\":0,"
                           "\"top_p\":0.5,\"top_k\":4,\"min_p\":0.1,\"n\":2,\"stop\":[\"a\",\"b\"],"
                           "\"seed\":7,\"presence_penalty\":0.5,\"frequency_penalty\":0.25,"
                           "\"repetition_penalty\":1.1,\"logit_bias\":{\"5\":-100},\"logprobs\":2,"
                           "\"echo\":true,\"stream\":true,\"stream_options\":{\"include_usage\":true},"
                           "\"user\":\"u\",\"ignore_eos\":true,\"min_tokens\":1,"
                           "\"stop_token_ids\":[3],\"include_stop_str_in_output\":true,"
                           "\"skip_special_tokens\":false,\"future_field\":{}}",
                           &r, &e),
                     0);
    assert_string_equal(r.model, "m");
    assert_int_equal(r.n_prompts, 1);
    assert_string_equal(r.prompts[0].text, "hi");
    assert_int_equal(r.max_tokens, 5);
    assert_true(r.sampling.temperature == 0.0f);
    assert_int_equal(r.sampling.top_k, 4);
    assert_int_equal(r.n, 2);
    assert_int_equal(r.n_stop, 2);
    assert_true(r.sampling.has_seed);
    assert_int_equal(r.sampling.seed, 7);
    assert_int_equal(r.sampling.n_logit_bias, 1);
    assert_int_equal(r.sampling.logit_bias[0].token, 5);
    assert_int_equal(r.n_logprobs, 2);
    assert_true(r.echo && r.stream && r.include_usage && r.ignore_eos && r.include_stop_str);
    assert_false(r.skip_special);
    assert_int_equal(r.n_stop_token_ids, 1);
    openai_request_deinit(&r);
}

static void test_openai_prompt_forms(void **state) {
    (void)state;
    struct openai_request r;
    struct openai_error e;
    assert_int_equal(parse(OPENAI_ROUTE_COMPLETIONS, "{\"prompt\":[1,2,3]}", &r, &e), 0);
    assert_int_equal(r.n_prompts, 1);
    assert_int_equal(r.prompts[0].n_ids, 3);
    openai_request_deinit(&r);
    assert_int_equal(parse(OPENAI_ROUTE_COMPLETIONS, "{\"prompt\":[\"a\",\"b\"]}", &r, &e), 0);
    assert_int_equal(r.n_prompts, 2);
    openai_request_deinit(&r);
    assert_int_equal(parse(OPENAI_ROUTE_COMPLETIONS, "{\"prompt\":[[1],[2,3]]}", &r, &e), 0);
    assert_int_equal(r.prompts[1].n_ids, 2);
    openai_request_deinit(&r);
}

static void test_openai_rejects_hostile_bodies(void **state) {
    (void)state;
    struct {
        enum openai_route route;
        const char *body;
        const char *param;
    } cases[] = {
        {OPENAI_ROUTE_COMPLETIONS, "{", NULL},
        {OPENAI_ROUTE_COMPLETIONS, "[]", NULL},
        {OPENAI_ROUTE_COMPLETIONS, "{}", "prompt"},
        {OPENAI_ROUTE_COMPLETIONS, "{\"prompt\":5}", "prompt"},
        {OPENAI_ROUTE_COMPLETIONS, "{\"prompt\":[]}", "prompt"},
        {OPENAI_ROUTE_COMPLETIONS, "{\"prompt\":[1,\"a\"]}", "prompt"},
        {OPENAI_ROUTE_COMPLETIONS, "{\"prompt\":[300]}", "prompt"},
        {OPENAI_ROUTE_COMPLETIONS, "{\"prompt\":\"a\",\"max_tokens\":\"5\"}", "max_tokens"},
        {OPENAI_ROUTE_COMPLETIONS, "{\"prompt\":\"a\",\"max_tokens\":0}", "max_tokens"},
        {OPENAI_ROUTE_COMPLETIONS, "{\"prompt\":\"a\",\"n\":100}", "n"},
        {OPENAI_ROUTE_COMPLETIONS, "{\"prompt\":\"a\",\"temperature\":\"x\"}", "temperature"},
        {OPENAI_ROUTE_COMPLETIONS, "{\"prompt\":\"a\",\"stream\":1}", "stream"},
        {OPENAI_ROUTE_COMPLETIONS, "{\"prompt\":\"a\",\"stop\":5}", "stop"},
        {OPENAI_ROUTE_COMPLETIONS, "{\"prompt\":\"a\",\"logit_bias\":{\"x\":1}}", "logit_bias"},
        {OPENAI_ROUTE_COMPLETIONS, "{\"prompt\":\"a\",\"logprobs\":50}", "logprobs"},
        {OPENAI_ROUTE_COMPLETIONS, "{\"prompt\":\"a\\u0000b\"}", NULL},  // jansson refuses NUL
        {OPENAI_ROUTE_CHAT, "{\"messages\":[]}", "messages"},
        {OPENAI_ROUTE_CHAT, "{\"messages\":[{\"content\":\"x\"}]}", "messages"},
        {OPENAI_ROUTE_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":3}]}", "messages"},
        {OPENAI_ROUTE_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
                            "\"top_logprobs\":3}", "top_logprobs"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        struct openai_request r;
        struct openai_error e;
        if (parse(cases[i].route, cases[i].body, &r, &e) != ERR_INVAL) fail_msg("case %zu", i);
        if (cases[i].param && (!e.param || strcmp(e.param, cases[i].param) != 0)) {
            fail_msg("case %zu: param %s, message %s", i, e.param ? e.param : "(null)",
                     e.message);
        }
        assert_true(strlen(e.message) > 0);
    }
}

static void test_openai_chat_messages_and_parts(void **state) {
    (void)state;
    struct openai_request r;
    struct openai_error e;
    assert_int_equal(parse(OPENAI_ROUTE_CHAT,
                           "{\"messages\":[{\"role\":\"system\",\"content\":\"s\"},"
                           "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"a\"},"
                           "{\"type\":\"text\",\"text\":\"b\"}]}],\"logprobs\":true,"
                           "\"top_logprobs\":2,\"max_completion_tokens\":9}",
                           &r, &e),
                     0);
    assert_int_equal(r.n_messages, 2);
    assert_string_equal(r.messages[1].content, "ab");
    assert_int_equal(r.n_logprobs, 2);
    assert_int_equal(r.max_tokens, 9);
    openai_request_deinit(&r);
}

/* tools, tool_choice and tool messages: parsed as OpenAI documents them,
 * the client errors 400s that name the field. */
#define MSG "\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]"
#define TOOL(name) "{\"type\":\"function\",\"function\":{\"name\":\"" name "\"," \
    "\"description\":\"d\",\"parameters\":{\"type\":\"object\",\"properties\":" \
    "{\"a\":{\"type\":\"integer\"}},\"required\":[\"a\"]}}}"
static void test_openai_tools(void **state) {
    (void)state;
    struct openai_request r;
    struct openai_error e;
    assert_int_equal(parse(OPENAI_ROUTE_CHAT, "{" MSG ",\"tools\":[" TOOL("f") "," TOOL("g") "]}",
                           &r, &e), 0);
    assert_int_equal(r.n_tools, 2);
    assert_int_equal(r.tool_choice, OPENAI_TOOL_CHOICE_AUTO);  // OpenAI: auto when tools are given
    assert_true(r.parallel_tool_calls);
    assert_string_equal(r.tools[1].name, "g");
    // what the templates print: json.dumps' separators, the members in order
    assert_string_equal(r.tools[0].json,
                        "{\"type\": \"function\", \"function\": {\"name\": \"f\", "
                        "\"description\": \"d\", \"parameters\": {\"type\": \"object\", "
                        "\"properties\": {\"a\": {\"type\": \"integer\"}}, "
                        "\"required\": [\"a\"]}}}");
    assert_int_equal(r.tools[0].n_members, 3);
    assert_true(r.tools[0].members[1].is_string);
    assert_false(r.tools[0].members[2].is_string);
    openai_request_deinit(&r);
    assert_int_equal(parse(OPENAI_ROUTE_CHAT, "{" MSG ",\"tools\":[" TOOL("f") "," TOOL("g") "],"
                           "\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":"
                           "\"g\"}},\"parallel_tool_calls\":false}", &r, &e), 0);
    assert_int_equal(r.tool_choice, OPENAI_TOOL_CHOICE_NAMED);
    assert_int_equal(r.tool_named, 1);
    assert_false(r.parallel_tool_calls);
    openai_request_deinit(&r);
    assert_int_equal(parse(OPENAI_ROUTE_CHAT, "{" MSG ",\"tools\":[" TOOL("f") "],"
                           "\"tool_choice\":\"none\"}", &r, &e), 0);
    assert_int_equal(r.tool_choice, OPENAI_TOOL_CHOICE_NONE);
    openai_request_deinit(&r);
    // a history with a call and its result: arguments reach the template as
    // the parsed object, re-serialised as tojson writes it
    assert_int_equal(parse(OPENAI_ROUTE_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":"
                           "\"x\"},{\"role\":\"assistant\",\"content\":null,\"tool_calls\":"
                           "[{\"id\":\"call_1\",\"type\":\"function\",\"function\":{\"name\":"
                           "\"f\",\"arguments\":\"{\\\"a\\\":1,\\\"b\\\":[true]}\"}}]},"
                           "{\"role\":\"tool\",\"tool_call_id\":\"call_1\",\"content\":\"ok\"}]}",
                           &r, &e), 0);
    assert_int_equal(r.messages[1].n_tool_calls, 1);
    assert_string_equal(r.messages[1].content, "");
    assert_string_equal(r.messages[1].tool_calls[0].name, "f");
    assert_string_equal(r.messages[1].tool_calls[0].arguments, "{\"a\": 1, \"b\": [true]}");
    assert_string_equal(r.messages[2].tool_call_id, "call_1");
    openai_request_deinit(&r);

    struct {
        const char *body;
        const char *param;
    } bad[] = {
        {"{" MSG ",\"tools\":{}}", "tools"},
        {"{" MSG ",\"tools\":[{\"type\":\"code\"}]}", "tools"},
        {"{" MSG ",\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"a b\"}}]}", "tools"},
        {"{" MSG ",\"tools\":[" TOOL("f") "," TOOL("f") "]}", "tools"},
        {"{" MSG ",\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\","
         "\"parameters\":{\"type\":\"integer\",\"minimum\":1}}}]}", "tools"},
        {"{" MSG ",\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\","
         "\"parameters\":5}}]}", "tools"},
        {"{" MSG ",\"tool_choice\":\"required\"}", "tool_choice"},
        {"{" MSG ",\"tools\":[" TOOL("f") "],\"tool_choice\":\"always\"}", "tool_choice"},
        {"{" MSG ",\"tools\":[" TOOL("f") "],\"tool_choice\":{\"type\":\"function\","
         "\"function\":{\"name\":\"h\"}}}", "tool_choice"},
        {"{" MSG ",\"tools\":[" TOOL("f") "],\"tool_choice\":{\"type\":\"function\"}}",
         "tool_choice"},
        {"{" MSG ",\"tools\":[" TOOL("f") "],\"parallel_tool_calls\":\"yes\"}",
         "parallel_tool_calls"},
        {"{" MSG ",\"tools\":[" TOOL("f") "],\"tool_choice\":\"required\","
         "\"response_format\":{\"type\":\"json_object\"}}", "tool_choice"},
        {"{\"messages\":[{\"role\":\"tool\",\"content\":\"x\"}]}", "messages"},
        {"{\"messages\":[{\"role\":\"assistant\",\"tool_calls\":[{\"id\":\"1\","
         "\"function\":{\"name\":\"f\",\"arguments\":\"{nope\"}}]}]}", "messages"},
        {"{\"messages\":[{\"role\":\"assistant\",\"tool_calls\":[{\"id\":\"1\","
         "\"function\":{\"name\":\"f\",\"arguments\":{}}}]}]}", "messages"},
        {"{\"messages\":[{\"role\":\"assistant\",\"tool_calls\":5}]}", "messages"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        if (parse(OPENAI_ROUTE_CHAT, bad[i].body, &r, &e) != ERR_INVAL) fail_msg("case %zu", i);
        if (!e.param || strcmp(e.param, bad[i].param) != 0)
            fail_msg("case %zu: param %s, message %s", i, e.param ? e.param : "(null)", e.message);
        assert_true(strlen(e.message) > 0);
    }
}

/* Python's json.dumps(v, ensure_ascii=False[, indent=4]) of a JSON text,
 * the oracle of what templates print (HF's tojson filter is json.dumps). */
static char *python_dumps(const char *json_text, bool indent) {
    char path[] = "/tmp/llmserve-tojson-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, json_text, strlen(json_text)), (ssize_t)strlen(json_text));
    close(fd);
    char cmd[1024];
    snprintf(cmd, sizeof(cmd),
             "/usr/bin/python3 -c 'import json,sys; sys.stdout.write(json.dumps(json.load("
             "open(sys.argv[1])), ensure_ascii=False%s))' %s",
             indent ? ", indent=4" : "", path);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    char *out = calloc(1, 65536);
    size_t n = fread(out, 1, 65535, p);
    out[n] = '\0';
    assert_int_equal(pclose(p), 0);
    unlink(path);
    return out;
}

/* Tools and arguments reach the templates as Python's json.dumps writes
 * them: numbers in repr's shortest form, strings with its escapes. */
static void test_openai_tools_serialised_as_python_does(void **state) {
    (void)state;
    const char *tool =
        "{\"type\":\"function\",\"function\":{\"name\":\"f\",\"description\":\"caf\xc3\xa9 "
        "\\u001f/\\u2028 \\\"q\\\"\\n\",\"parameters\":{\"type\":\"object\",\"properties\":"
        "{\"a\":{\"type\":\"number\",\"examples\":[0.1,1e100,1e-5,0.0001,1e15,1e16,-0.0,"
        "123.456,2.5e-7,3,-17,1.5,0.30000000000000004,12345678901234567890.0]},"
        "\"b\":{\"type\":\"array\",\"items\":{}},\"c\":{\"type\":\"object\",\"properties\":{}}},"
        "\"required\":[]}}}";
    char body[4096];
    snprintf(body, sizeof(body), "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"},"
             "{\"role\":\"assistant\",\"tool_calls\":[{\"id\":\"1\",\"type\":\"function\","
             "\"function\":{\"name\":\"f\",\"arguments\":\"{\\\"a\\\": [0.1, 1e100, {}], "
             "\\\"s\\\": \\\"\\\\u00e9\\\"}\"}}]}],\"tools\":[%s]}", tool);
    struct openai_request r;
    struct openai_error e;
    if (parse(OPENAI_ROUTE_CHAT, body, &r, &e) != 0) fail_msg("%s", e.message);
    char *want = python_dumps(tool, false);
    assert_string_equal(r.tools[0].json, want);
    free(want);
    want = python_dumps(tool, true);
    assert_string_equal(r.tools[0].json_indent4, want);
    free(want);
    want = python_dumps("{\"a\": [0.1, 1e100, {}], \"s\": \"\\u00e9\"}", false);
    assert_string_equal(r.messages[1].tool_calls[0].arguments, want);
    free(want);
    openai_request_deinit(&r);
}

/* Reply JSON with calls: content null, tool_calls as OpenAI shapes them; a
 * chunk's delta carries index, and id/type/name only in a call's first. */
static void test_openai_tool_call_shapes(void **state) {
    (void)state;
    struct openai_meta meta = {.id = "chatcmpl-1", .created = 1, .model = "m"};
    struct openai_tool_call tc = {.index = 0, .id = "call_x", .name = "f", .name_len = 1,
                                  .arguments = "{\"a\": 1}", .arguments_len = 8};
    struct openai_choice c = {.index = 0, .finish_reason = "tool_calls", .tool_calls = &tc,
                              .n_tool_calls = 1};
    char *s = openai_chat_json(&meta, &c, 1, NULL, false);
    json_t *root = json_loads(s, 0, NULL);
    json_t *msg = json_object_get(json_array_get(json_object_get(root, "choices"), 0), "message");
    assert_true(json_is_null(json_object_get(msg, "content")));
    json_t *call = json_array_get(json_object_get(msg, "tool_calls"), 0);
    assert_string_equal(json_string_value(json_object_get(call, "id")), "call_x");
    assert_string_equal(json_string_value(json_object_get(call, "type")), "function");
    assert_null(json_object_get(call, "index"));
    json_t *fn = json_object_get(call, "function");
    assert_string_equal(json_string_value(json_object_get(fn, "name")), "f");
    assert_string_equal(json_string_value(json_object_get(fn, "arguments")), "{\"a\": 1}");
    json_decref(root);
    free(s);
    struct openai_tool_call frag = {.index = 2, .arguments = "1}", .arguments_len = 2};
    struct openai_choice d = {.index = 0, .tool_calls = &frag, .n_tool_calls = 1};
    s = openai_chat_json(&meta, &d, 1, NULL, true);
    root = json_loads(s, 0, NULL);
    json_t *delta = json_object_get(json_array_get(json_object_get(root, "choices"), 0), "delta");
    assert_null(json_object_get(delta, "content"));
    call = json_array_get(json_object_get(delta, "tool_calls"), 0);
    assert_int_equal(json_integer_value(json_object_get(call, "index")), 2);
    assert_null(json_object_get(call, "id"));
    assert_null(json_object_get(json_object_get(call, "function"), "name"));
    assert_string_equal(json_string_value(json_object_get(json_object_get(call, "function"),
                                                          "arguments")), "1}");
    json_decref(root);
    free(s);
}

static void test_openai_response_shapes(void **state) {
    (void)state;
    struct openai_meta meta = {.id = "cmpl-1", .created = 5, .model = "m"};
    struct openai_choice c = {.index = 0, .text = "hi", .text_len = 2, .finish_reason = "stop"};
    struct openai_usage u = {.prompt_tokens = 3, .completion_tokens = 2};
    char *s = openai_completion_json(&meta, &c, 1, &u, false);
    assert_string_equal(s, "{\"id\":\"cmpl-1\",\"object\":\"text_completion\",\"created\":5,"
                           "\"model\":\"m\",\"choices\":[{\"index\":0,\"text\":\"hi\","
                           "\"logprobs\":null,\"finish_reason\":\"stop\"}],\"usage\":"
                           "{\"prompt_tokens\":3,\"completion_tokens\":2,\"total_tokens\":5,"
                           "\"prompt_tokens_details\":{\"cached_tokens\":0}}}");
    free(s);
    struct openai_choice role = {.index = 0, .role = true};
    s = openai_chat_json(&meta, &role, 1, NULL, true);
    assert_non_null(strstr(s, "\"object\":\"chat.completion.chunk\""));
    assert_non_null(strstr(s, "\"delta\":{\"role\":\"assistant\",\"content\":\"\"}"));
    free(s);
    s = openai_error_json("bad", "invalid_request_error", "n", NULL);
    assert_string_equal(s, "{\"error\":{\"message\":\"bad\",\"type\":\"invalid_request_error\","
                           "\"param\":\"n\",\"code\":null}}");
    free(s);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_openai_parses_completion_fields),
        cmocka_unit_test(test_openai_prompt_forms),
        cmocka_unit_test(test_openai_rejects_hostile_bodies),
        cmocka_unit_test(test_openai_chat_messages_and_parts),
        cmocka_unit_test(test_openai_tools),
        cmocka_unit_test(test_openai_tool_call_shapes),
        cmocka_unit_test(test_openai_tools_serialised_as_python_does),
        cmocka_unit_test(test_openai_response_shapes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
