/*
 * test_structured.c - structured output through HTTP: response_format
 * json_schema and json_object, and the `grammar` extension, on
 * /v1/completions and /v1/chat/completions, streamed and not, sampled at
 * temperature 1 with seeds. The oracle is outside our code: each reply is
 * read with jansson and its text judged by scripts/validate-json (Python's
 * json module and the jsonschema package), which must accept 100% of them;
 * a grammar that completes must end with finish_reason "stop" (OpenAI's
 * published meaning: a natural stop). Bad schemas and grammars are 400s in
 * OpenAI's error shape that name the problem, and the server stays up.
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

static struct httptest_server srv;

static int group_setup(void **state) {
    (void)state;
    httptest_start(&srv, httptest_model("llama-f32"), NULL);
    return 0;
}

static int group_teardown(void **state) {
    (void)state;
    httptest_stop(&srv, SIGTERM);
    return 0;
}

/* Bounded in every dimension, so a sampled document always ends well within
 * max_tokens: two booleans, a small integer range, an enum, short strings. */
static const char schema[] =
    "{\"type\":\"object\",\"properties\":{"
    "\"name\":{\"type\":\"string\",\"maxLength\":6},"
    "\"ok\":{\"type\":\"boolean\"},"
    "\"color\":{\"enum\":[\"red\",\"green\",\"blue\"]},"
    "\"n\":{\"type\":\"integer\"},"
    "\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"boolean\"},\"maxItems\":2}},"
    "\"required\":[\"name\",\"ok\",\"color\"],\"additionalProperties\":false}";

/* What one reply carried: its text and last finish_reason. */
struct reply {
    char text[8192];
    char finish[32];
};

static void append(struct reply *r, const char *s) {
    size_t n = strlen(r->text);
    snprintf(r->text + n, sizeof(r->text) - n, "%s", s);
}

/* choices[0]'s text (completions) or message.content / delta.content (chat). */
static void take_choice(json_t *root, bool chat, bool chunk, struct reply *r) {
    json_t *c = json_array_get(json_object_get(root, "choices"), 0);
    if (!c) return;
    json_t *t = !chat ? json_object_get(c, "text")
                      : json_object_get(json_object_get(c, chunk ? "delta" : "message"), "content");
    if (json_is_string(t)) append(r, json_string_value(t));
    json_t *f = json_object_get(c, "finish_reason");
    if (json_is_string(f)) snprintf(r->finish, sizeof(r->finish), "%s", json_string_value(f));
}

static void ask(const char *path, const char *body, bool stream, struct reply *out) {
    memset(out, 0, sizeof(*out));
    struct httptest_resp resp;
    int st = httptest_request(srv.port, "POST", path, NULL, body, &resp);
    if (st != 200) fail_msg("POST %s %s: %d %s", path, body, st, resp.body);
    bool chat = strstr(path, "chat") != NULL;
    if (!stream) {
        json_t *root = json_loads(resp.body, JSON_ALLOW_NUL, NULL);
        assert_non_null(root);
        take_choice(root, chat, false, out);
        json_decref(root);
    } else {
        int n = 0;
        char **ev = httptest_sse_events(resp.body, &n);
        assert_true(n >= 2);
        assert_string_equal(ev[n - 1], "[DONE]");
        for (int i = 0; i < n - 1; i++) {
            json_t *root = json_loads(ev[i], JSON_ALLOW_NUL, NULL);
            assert_non_null(root);
            take_choice(root, chat, true, out);
            json_decref(root);
        }
        httptest_events_free(ev, n);
    }
    httptest_resp_free(&resp);
}

/* Every text with its schema (JSON text or "null") goes to validate-json;
 * every verdict must be "ok". */
static void validate_all(struct reply *r, int n, const char *schema_text) {
    char path[] = "/tmp/llmserve-structured-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    FILE *f = fdopen(fd, "w");
    json_t *s = json_loads(schema_text, JSON_DECODE_ANY, NULL);
    assert_non_null(s);
    for (int i = 0; i < n; i++) {
        json_t *line = json_pack("{s:O, s:s}", "schema", s, "text", r[i].text);
        char *t = json_dumps(line, JSON_COMPACT);
        fprintf(f, "%s\n", t);
        free(t);
        json_decref(line);
    }
    json_decref(s);
    fclose(f);
    char cmd[1024];
    snprintf(cmd, sizeof(cmd), "/usr/bin/python3 %s/scripts/validate-json < %s",
             testutil_source_dir(), path);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    char line[2048];
    int k = 0;
    while (fgets(line, sizeof(line), p)) {
        if (strncmp(line, "ok", 2) != 0) fail_msg("reply %d '%s': %s", k, r[k].text, line);
        k++;
    }
    assert_int_equal(pclose(p), 0);
    unlink(path);
    assert_int_equal(k, n);
}

static bool have_validator(void) {
    return system("/usr/bin/python3 -c 'import jsonschema' 2>/dev/null") == 0;
}

enum { N_SEEDS = 6 };

static void run_schema(const char *path, bool stream) {
    if (!have_validator()) {
        skip();  // needs Debian's python3-jsonschema (scripts/setup installs it)
        return;
    }
    struct reply r[N_SEEDS];
    bool chat = strstr(path, "chat") != NULL;
    for (int i = 0; i < N_SEEDS; i++) {
        char body[4096];
        snprintf(body, sizeof(body),
                 "{%s, \"max_tokens\": 600, \"temperature\": 1, \"seed\": %d, \"stream\": %s, "
                 "\"response_format\": {\"type\": \"json_schema\", \"json_schema\": "
                 "{\"name\": \"thing\", \"strict\": true, \"schema\": %s}}}",
                 chat ? "\"messages\": [{\"role\": \"user\", \"content\": \"Describe a thing\"}]"
                      : "\"prompt\": \"A thing:\"",
                 100 + i, stream ? "true" : "false", schema);
        ask(path, body, stream, &r[i]);
        if (strcmp(r[i].finish, "stop") != 0)
            fail_msg("seed %d: finish_reason %s, text %s", 100 + i, r[i].finish, r[i].text);
    }
    validate_all(r, N_SEEDS, schema);
}

static void test_structured_completions_json_schema(void **state) {
    (void)state;
    run_schema("/v1/completions", false);
}

static void test_structured_completions_json_schema_stream(void **state) {
    (void)state;
    run_schema("/v1/completions", true);
}

static void test_structured_chat_json_schema(void **state) {
    (void)state;
    run_schema("/v1/chat/completions", false);
}

static void test_structured_chat_json_schema_stream(void **state) {
    (void)state;
    run_schema("/v1/chat/completions", true);
}

/* json_object: any JSON object that parses; one that ends says "stop", one
 * cut by max_tokens says "length" and is a prefix of an object. */
static void test_structured_chat_json_object(void **state) {
    (void)state;
    if (!have_validator()) {
        skip();
        return;
    }
    struct reply r[N_SEEDS];
    int n_stopped = 0;
    for (int i = 0; i < N_SEEDS; i++) {
        char body[1024];
        snprintf(body, sizeof(body),
                 "{\"messages\": [{\"role\": \"user\", \"content\": \"JSON please\"}], "
                 "\"max_tokens\": 300, \"temperature\": 1, \"seed\": %d, \"stream\": %s, "
                 "\"response_format\": {\"type\": \"json_object\"}}",
                 200 + i, i % 2 ? "true" : "false");
        struct reply one;
        ask("/v1/chat/completions", body, i % 2, &one);
        assert_true(one.text[0] == '{');
        if (strcmp(one.finish, "stop") == 0)
            r[n_stopped++] = one;
        else
            assert_string_equal(one.finish, "length");
    }
    validate_all(r, n_stopped, "{\"type\": \"object\"}");
}

/* The GBNF extension: the text is one of the grammar's sentences, in full. */
static void test_structured_grammar_field(void **state) {
    (void)state;
    for (int i = 0; i < 4; i++) {
        char body[1024];
        snprintf(body, sizeof(body),
                 "{\"prompt\": \"Answer:\", \"max_tokens\": 50, \"temperature\": 1, \"seed\": %d, "
                 "\"stream\": %s, \"grammar\": \"root ::= (\\\"yes\\\" | \\\"no\\\") \\\", \\\" "
                 "[0-9]{2}\"}",
                 i, i % 2 ? "true" : "false");
        struct reply r;
        ask("/v1/completions", body, i % 2, &r);
        // the language, by hand: "yes, " or "no, " then two digits
        bool yes = strncmp(r.text, "yes, ", 5) == 0, no = strncmp(r.text, "no, ", 4) == 0;
        const char *d = r.text + (yes ? 5 : 4);
        if (!(yes || no) || strlen(d) != 2 || d[0] < '0' || d[0] > '9' || d[1] < '0' || d[1] > '9')
            fail_msg("seed %d: '%s' is not in the grammar's language", i, r.text);
        assert_string_equal(r.finish, "stop");
    }
    // A repetition of a group that can match nothing (was a 400 "left
    // recursion"): the text is (ab)* then "." when it stopped, a prefix of
    // such a sentence when it ran out of tokens.
    for (int i = 0; i < 4; i++) {
        char body[1024];
        snprintf(body, sizeof(body),
                 "{\"prompt\": \"Answer:\", \"max_tokens\": 40, \"temperature\": 1, \"seed\": %d, "
                 "\"stream\": %s, \"grammar\": \"root ::= (\\\"\\\" | \\\"ab\\\")* \\\".\\\"\"}",
                 i, i % 2 ? "true" : "false");
        struct reply r;
        ask("/v1/completions", body, i % 2, &r);
        size_t n = strlen(r.text);
        size_t k = 0;
        while (k + 1 < n && r.text[k] == 'a' && r.text[k + 1] == 'b') k += 2;
        bool is_stop = strcmp(r.finish, "stop") == 0;
        bool ok = is_stop ? (k + 1 == n && r.text[k] == '.')
                          : (k == n || (k + 1 == n && (r.text[k] == 'a' || r.text[k] == '.')));
        if (!ok) fail_msg("seed %d: '%s' (%s) is not in the grammar's language", i, r.text, r.finish);
    }
}

static void expect_400(const char *path, const char *body, const char *needle) {
    struct httptest_resp r;
    int st = httptest_request(srv.port, "POST", path, NULL, body, &r);
    if (st != 400) fail_msg("%s: status %d, want 400: %s", body, st, r.body);
    if (!httptest_is_openai_error(r.body)) fail_msg("not an OpenAI error: %s", r.body);
    if (!strstr(r.body, needle)) fail_msg("%s: '%s' lacks '%s'", body, r.body, needle);
    httptest_resp_free(&r);
    struct httptest_resp h;
    assert_int_equal(httptest_request(srv.port, "GET", "/health", NULL, NULL, &h), 200);
    httptest_resp_free(&h);
}

static void test_structured_bad_requests(void **state) {
    (void)state;
    const char *c = "/v1/completions";
    expect_400(c,
               "{\"prompt\": \"x\", \"response_format\": {\"type\": \"json_schema\", "
               "\"json_schema\": {\"name\": \"a\", \"schema\": {\"type\": \"integer\", "
               "\"minimum\": 3}}}}",
               "minimum");
    expect_400(c,
               "{\"prompt\": \"x\", \"response_format\": {\"type\": \"json_schema\", "
               "\"json_schema\": {\"name\": \"a\", \"schema\": {\"$ref\": \"#/$defs/b\"}}}}",
               "unresolvable $ref");
    expect_400(c, "{\"prompt\": \"x\", \"response_format\": {\"type\": \"yaml\"}}", "yaml");
    expect_400(c, "{\"prompt\": \"x\", \"response_format\": {\"type\": \"json_schema\"}}",
               "json_schema");
    expect_400(c, "{\"prompt\": \"x\", \"grammar\": \"root ::= valu\"}", "unknown rule 'valu'");
    expect_400(c, "{\"prompt\": \"x\", \"grammar\": \"root ::= root \\\"a\\\" | \\\"b\\\"\"}",
               "left recursion");
    expect_400(c, "{\"prompt\": \"x\", \"grammar\": \"root ::= \\\"a\\\"{99999}\"}", "repetition");
    expect_400(c, "{\"prompt\": \"x\", \"grammar\": \"root ::= (((\\\"a\\\"\"}", "unbalanced");
    expect_400(c, "{\"prompt\": \"x\", \"grammar\": 5}", "grammar");
    expect_400(c,
               "{\"prompt\": \"x\", \"grammar\": \"root ::= \\\"a\\\"\", "
               "\"response_format\": {\"type\": \"json_object\"}}",
               "both");
    expect_400("/v1/chat/completions",
               "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"response_format\": "
               "{\"type\": \"json_schema\", \"json_schema\": {\"name\": \"a\", \"schema\": "
               "{\"type\": \"string\", \"format\": \"email\"}}}}",
               "email");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_structured_completions_json_schema),
        cmocka_unit_test(test_structured_completions_json_schema_stream),
        cmocka_unit_test(test_structured_chat_json_schema),
        cmocka_unit_test(test_structured_chat_json_schema_stream),
        cmocka_unit_test(test_structured_chat_json_object),
        cmocka_unit_test(test_structured_grammar_field),
        cmocka_unit_test(test_structured_bad_requests),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
