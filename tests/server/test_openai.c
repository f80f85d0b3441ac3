/* tests/server/test_openai.c - request parsing against the OpenAI API
 * reference (field names, types, defaults), hostile bodies, and response
 * shapes. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

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
        cmocka_unit_test(test_openai_response_shapes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
