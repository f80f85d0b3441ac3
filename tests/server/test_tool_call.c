/*
 * test_tool_call.c - the tool-call grammar and parser.
 *
 * Oracles from outside the code under test:
 *   - the text each chat template renders for an assistant turn's
 *     tool_calls (engine/text/chat.c's renderers, themselves checked against
 *     the real templates under jinja2 in tests/engine/test_chat.c) must be a
 *     sentence of the grammar, and must parse back into the calls' names and
 *     arguments;
 *   - seeded random sentences drawn byte by byte from the grammar must parse
 *     into calls whose arguments scripts/validate-json (Python's json module
 *     and the jsonschema package) accepts under the tool's schema, for 100%
 *     of them;
 *   - hand-written texts for content before a call, a trigger still
 *     arriving, a cut call and text that is not the syntax.
 */
#define _POSIX_C_SOURCE 200809L
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "engine/base/buf.h"
#include "engine/base/err.h"
#include "engine/engine.h"
#include "server/json_schema.h"
#include "server/tool_call.h"
#include "tests/helpers/testutil.h"

static const char weather_schema[] =
    "{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\",\"maxLength\":8},"
    "\"days\":{\"type\":\"integer\"},\"unit\":{\"enum\":[\"c\",\"f\"]}},"
    "\"required\":[\"city\"],\"additionalProperties\":false}";

struct tools {
    struct tool_call_tool t[2];
    struct buf rules[2];
};

/* get_weather (weather_schema) and ping (no parameters: any object). */
static void make_tools(struct tools *ts) {
    memset(ts, 0, sizeof(*ts));
    json_t *schema = json_loads(weather_schema, 0, NULL);
    assert_non_null(schema);
    char msg[200];
    assert_int_equal(json_schema_to_gbnf_rule(schema, "t0", &ts->rules[0], msg, sizeof(msg)), 0);
    json_decref(schema);
    buf_append_str(&ts->rules[1], "t1 ::= object\n");
    ts->t[0] = (struct tool_call_tool){.name = "get_weather", .rules = ts->rules[0].data,
                                       .rule = "t0"};
    ts->t[1] = (struct tool_call_tool){.name = "ping", .rules = ts->rules[1].data, .rule = "t1"};
}

static void free_tools(struct tools *ts) {
    buf_free(&ts->rules[0]);
    buf_free(&ts->rules[1]);
}

static struct gbnf *compile(const struct chat_tool_syntax *syn, const struct tools *ts,
                            int32_t n_tools, bool parallel) {
    struct buf g = {0};
    tool_call_grammar(syn, ts->t, n_tools, parallel, &g);
    struct gbnf *out = NULL;
    char msg[256];
    int err = gbnf_compile(g.data, g.len, &out, msg, sizeof(msg));
    if (err) print_message("grammar: %s\n%s\n", msg, g.data);
    assert_int_equal(err, 0);
    buf_free(&g);
    return out;
}

static const enum chat_family tool_families[] = {
    CHAT_FAMILY_CHATML, CHAT_FAMILY_QWEN2_5, CHAT_FAMILY_LLAMA3_1, CHAT_FAMILY_MISTRAL_TEKKEN};

static void remove_all(struct buf *b, const char *what) {
    size_t n = strlen(what);
    for (char *p = strstr(b->data, what); p; p = strstr(p, what)) {
        memmove(p, p + n, b->len - (size_t)(p - b->data) - n + 1);
        b->len -= n;
    }
}

/* What the template writes for the calls of an assistant turn: the rendered
 * conversation with the turn, less the one without it (generation prompt
 * on), less the end of the turn. Mistral's history carries ids the model
 * does not write: they are cut out. */
static void rendered_calls(enum chat_family f, const struct chat_tool_call *calls, int32_t n,
                           struct buf *out) {
    struct chat_message msgs[2] = {
        {.role = "user", .content = "u"},
        {.role = "assistant", .content = "", .tool_calls = calls, .n_tool_calls = n},
    };
    struct chat_render_params p = chat_render_default_params();
    p.bos_text = "<s>";
    p.eos_text = "</s>";
    struct buf open = {0}, done = {0};
    char msg[256];
    assert_int_equal(chat_render(f, msgs, 1, &p, &open, NULL, msg, sizeof(msg)), 0);
    p.add_generation_prompt = false;
    assert_int_equal(chat_render(f, msgs, 2, &p, &done, NULL, msg, sizeof(msg)), 0);
    assert_true(done.len > open.len);
    assert_memory_equal(done.data, open.data, open.len);
    buf_append(out, done.data + open.len, done.len - open.len);
    static const char *const ends[] = {"<|im_end|>\n", "<|eot_id|>", "</s>"};
    for (size_t i = 0; i < 3; i++) {
        size_t k = strlen(ends[i]);
        if (out->len >= k && memcmp(out->data + out->len - k, ends[i], k) == 0) {
            out->len -= k;
            out->data[out->len] = '\0';
            break;
        }
    }
    remove_all(out, ", \"id\": \"abcdefghi\"");
    remove_all(out, ", \"id\": \"bcdefghij\"");
    buf_free(&open);
    buf_free(&done);
}

static void test_tool_call_grammar_accepts_what_templates_render(void **state) {
    (void)state;
    static const struct chat_tool_call calls[] = {
        {.id = "abcdefghi", .name = "get_weather",
         .arguments = "{\"city\": \"Caf\xc3\xa9\", \"days\": 3}"},
        {.id = "bcdefghij", .name = "ping", .arguments = "{\"x\": [1, {\"y\": null}]}"},
    };
    struct tools ts;
    make_tools(&ts);
    for (size_t fi = 0; fi < sizeof(tool_families) / sizeof(tool_families[0]); fi++) {
        enum chat_family f = tool_families[fi];
        struct chat_tool_syntax syn;
        assert_int_equal(chat_tool_syntax(f, &syn), 0);
        int32_t n = syn.parallel ? 2 : 1;
        struct buf text = {0};
        rendered_calls(f, calls, n, &text);
        struct gbnf *g = compile(&syn, &ts, 2, true);
        struct grammar *gm = grammar_create(g);
        enum grammar_step st = grammar_accept_bytes(gm, text.data, text.len);
        if (st == GRAMMAR_STEP_REJECT) print_message("%s rejects: %s\n", chat_family_name(f), text.data);
        assert_int_not_equal(st, GRAMMAR_STEP_REJECT);
        assert_true(grammar_is_accepting(gm));
        grammar_free(gm);
        // Llama 3.1: the same call after its <|python_tag|> marker (the grammar starts
        // there when the model writes it: openai.c's trigger alternatives); content 0
        if (syn.trigger_prefix[0]) {
            struct buf tagged = {0};
            buf_append_str(&tagged, syn.trigger_prefix);
            buf_append(&tagged, text.data, text.len);
            gm = grammar_create(g);
            assert_int_not_equal(grammar_accept_bytes(gm, tagged.data, tagged.len),
                                 GRAMMAR_STEP_REJECT);
            assert_true(grammar_is_accepting(gm));
            grammar_free(gm);
            struct tool_call_parse tp;
            tool_call_parse(&syn, tagged.data, tagged.len, true, &tp);
            assert_true(tp.is_complete);
            assert_int_equal(tp.content_len, 0);
            buf_free(&tagged);
        }
        gbnf_release(g);
        // and the parser reads the calls back, from every prefix monotonically
        struct tool_call_parse tp, prev = {0};
        for (size_t len = 0; len <= text.len; len++) {
            tool_call_parse(&syn, text.data, len, len == text.len, &tp);
            assert_false(tp.is_failed);
            assert_int_equal(tp.content_len, 0);
            assert_true(tp.n_calls >= prev.n_calls);
            for (int32_t k = 0; k < prev.n_calls; k++) {
                if (prev.calls[k].has_name) assert_int_equal(tp.calls[k].name_len, prev.calls[k].name_len);
                assert_true(tp.calls[k].args_len >= prev.calls[k].args_len);
            }
            prev = tp;
        }
        assert_true(tp.is_complete);
        assert_int_equal(tp.n_calls, n);
        for (int32_t k = 0; k < n; k++) {
            assert_true(tp.calls[k].is_complete);
            assert_int_equal(tp.calls[k].name_len, strlen(calls[k].name));
            assert_memory_equal(text.data + tp.calls[k].name_off, calls[k].name,
                                tp.calls[k].name_len);
            assert_int_equal(tp.calls[k].args_len, strlen(calls[k].arguments));
            assert_memory_equal(text.data + tp.calls[k].args_off, calls[k].arguments,
                                tp.calls[k].args_len);
        }
        buf_free(&text);
    }
    free_tools(&ts);
}

static uint64_t rng_next(uint64_t *s) {
    uint64_t x = *s += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* A random sentence of g: random allowed bytes, ending (when it may) with
 * probability 1/4 per step, or when nothing may follow. */
static void draw(struct gbnf *g, uint64_t *rng, struct buf *out) {
    struct grammar *gm = grammar_create(g);
    for (int steps = 0; steps < 4000; steps++) {
        if (grammar_is_accepting(gm) && rng_next(rng) % 4 == 0) break;
        uint8_t allowed[256];
        int n = 0;
        for (int b = 0; b < 256; b++) {
            if (grammar_allows_byte(gm, (uint8_t)b)) allowed[n++] = (uint8_t)b;
        }
        if (n == 0) break;
        uint8_t b = allowed[rng_next(rng) % (uint64_t)n];
        assert_int_not_equal(grammar_accept_bytes(gm, &b, 1), GRAMMAR_STEP_REJECT);
        buf_append_char(out, (char)b);
    }
    assert_true(grammar_is_accepting(gm));
    grammar_free(gm);
}

static void test_tool_call_random_sentences_parse_and_validate(void **state) {
    (void)state;
    struct tools ts;
    make_tools(&ts);
    char cases_path[4096], out_path[4096];
    snprintf(cases_path, sizeof(cases_path), "%s/tool-call-cases-%d.jsonl", testutil_build_dir(),
             (int)getpid());
    snprintf(out_path, sizeof(out_path), "%s/tool-call-cases-%d.out", testutil_build_dir(),
             (int)getpid());
    FILE *fp = fopen(cases_path, "w");
    assert_non_null(fp);
    json_t *schema = json_loads(weather_schema, 0, NULL);
    json_t *any = json_loads("{\"type\":\"object\"}", 0, NULL);
    int n_cases = 0;
    uint64_t rng = 17;
    for (size_t fi = 0; fi < sizeof(tool_families) / sizeof(tool_families[0]); fi++) {
        struct chat_tool_syntax syn;
        assert_int_equal(chat_tool_syntax(tool_families[fi], &syn), 0);
        struct gbnf *g = compile(&syn, &ts, 2, true);
        for (int i = 0; i < 25; i++) {
            struct buf text = {0};
            draw(g, &rng, &text);
            struct tool_call_parse tp;
            tool_call_parse(&syn, text.data, text.len, true, &tp);
            if (!tp.is_complete) print_message("not parsed: %s\n", text.data);
            assert_true(tp.is_complete);
            assert_true(tp.n_calls >= 1 && tp.n_calls <= (syn.parallel ? TOOL_CALL_MAX_CALLS : 1));
            for (int32_t k = 0; k < tp.n_calls; k++) {
                bool weather = tp.calls[k].name_len == 11 &&
                               memcmp(text.data + tp.calls[k].name_off, "get_weather", 11) == 0;
                bool ping = tp.calls[k].name_len == 4 &&
                            memcmp(text.data + tp.calls[k].name_off, "ping", 4) == 0;
                assert_true(weather || ping);
                json_t *c = json_object();
                json_object_set(c, "schema", weather ? schema : any);
                json_object_set_new(c, "text", json_stringn(text.data + tp.calls[k].args_off,
                                                            tp.calls[k].args_len));
                char *line = json_dumps(c, JSON_COMPACT);
                fprintf(fp, "%s\n", line);
                free(line);
                json_decref(c);
                n_cases++;
            }
            buf_free(&text);
        }
        gbnf_release(g);
    }
    fclose(fp);
    json_decref(schema);
    json_decref(any);
    char cmd[16384];
    snprintf(cmd, sizeof(cmd), "%s/scripts/validate-json < %s > %s", testutil_source_dir(),
             cases_path, out_path);
    assert_int_equal(testutil_system(cmd), 0);
    size_t len = 0;
    char *verdicts = testutil_read_file(out_path, &len);
    assert_non_null(verdicts);
    int n_ok = 0;
    for (char *line = strtok(verdicts, "\n"); line; line = strtok(NULL, "\n")) {
        if (strcmp(line, "ok") == 0) n_ok++;
        else print_message("%s\n", line);
    }
    assert_true(n_cases >= 100);
    assert_int_equal(n_ok, n_cases);
    free(verdicts);
    remove(cases_path);
    remove(out_path);
    free_tools(&ts);
}

static void test_tool_call_parse_hand_cases(void **state) {
    (void)state;
    struct chat_tool_syntax hermes;
    assert_int_equal(chat_tool_syntax(CHAT_FAMILY_QWEN2_5, &hermes), 0);
    struct tool_call_parse tp;
    // content, then a call
    const char *t1 = "Let me check.\n<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": \"}\"}}\n"
                     "</tool_call>";
    tool_call_parse(&hermes, t1, strlen(t1), true, &tp);
    assert_true(tp.is_complete);
    assert_int_equal(tp.content_len, strlen("Let me check.\n"));
    assert_int_equal(tp.n_calls, 1);
    assert_int_equal(tp.calls[0].args_len, strlen("{\"a\": \"}\"}"));
    // a trigger still arriving is held back, and released when the text ends
    tool_call_parse(&hermes, "Hi <tool_ca", 11, false, &tp);
    assert_int_equal(tp.content_len, 3);
    assert_false(tp.has_trigger);
    tool_call_parse(&hermes, "Hi <tool_ca", 11, true, &tp);
    assert_int_equal(tp.content_len, 11);
    // a call cut inside its arguments: begun, not complete
    const char *t2 = "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": [1, ";
    tool_call_parse(&hermes, t2, strlen(t2), true, &tp);
    assert_false(tp.is_complete);
    assert_false(tp.is_failed);
    assert_int_equal(tp.n_calls, 1);
    assert_true(tp.calls[0].has_name);
    assert_false(tp.calls[0].is_complete);
    // not the syntax after the trigger: all content
    const char *t3 = "Use <tool_call> tags, like this.";
    tool_call_parse(&hermes, t3, strlen(t3), true, &tp);
    assert_true(tp.is_failed);
    assert_int_equal(tp.n_calls, 0);
    assert_int_equal(tp.content_len, strlen(t3));
    // a name that is not a function name
    const char *t4 = "<tool_call>\n{\"name\": \"a b\", \"arguments\": {}}\n</tool_call>";
    tool_call_parse(&hermes, t4, strlen(t4), true, &tp);
    assert_true(tp.is_failed);
    // Mistral: the list's close ends the calls; Llama 3.1: "parameters"
    struct chat_tool_syntax mistral, llama;
    assert_int_equal(chat_tool_syntax(CHAT_FAMILY_MISTRAL_TEKKEN, &mistral), 0);
    assert_int_equal(chat_tool_syntax(CHAT_FAMILY_LLAMA3_1, &llama), 0);
    const char *t5 = "[TOOL_CALLS][{\"name\": \"f\", \"arguments\": {}}, {\"name\": \"g\", "
                     "\"arguments\": {\"k\": 1}}]";
    tool_call_parse(&mistral, t5, strlen(t5) - 1, false, &tp);
    assert_false(tp.is_complete);
    assert_int_equal(tp.n_calls, 2);
    tool_call_parse(&mistral, t5, strlen(t5), true, &tp);
    assert_true(tp.is_complete);
    const char *t6 = "{\"name\": \"f\", \"parameters\": {\"k\": true}}";
    tool_call_parse(&llama, t6, strlen(t6), true, &tp);
    assert_true(tp.is_complete);
    assert_int_equal(tp.n_calls, 1);
    // Llama 3.1: <|python_tag|> (Meta's prompt format: it starts a tool call) right
    // before the call is not content; elsewhere it is text like any other.
    const char *t7 = "Sure.<|python_tag|>{\"name\": \"f\", \"parameters\": {\"k\": 1}}";
    tool_call_parse(&llama, t7, strlen(t7), true, &tp);
    assert_true(tp.is_complete);
    assert_int_equal(tp.content_len, 5);
    assert_int_equal(tp.n_calls, 1);
    assert_int_equal(tp.calls[0].name_len, 1);
    assert_int_equal(tp.calls[0].args_len, strlen("{\"k\": 1}"));
    const char *t8 = "<|python_tag|>{\"name\": \"f\", \"parameters\": {}}";
    tool_call_parse(&llama, t8, strlen(t8), true, &tp);
    assert_true(tp.is_complete);
    assert_int_equal(tp.content_len, 0);
    const char *t9 = "a<|python_tag|>b{\"name\": \"f\", \"parameters\": {}}";
    tool_call_parse(&llama, t9, strlen(t9), true, &tp);
    assert_int_equal(tp.content_len, strlen("a<|python_tag|>b"));
    // while streaming, the marker (whole or begun) is held back, as a trigger is, and a
    // text that ends there gives it back
    tool_call_parse(&llama, "Sure.<|python_tag|>", 19, false, &tp);
    assert_int_equal(tp.content_len, 5);
    tool_call_parse(&llama, "Sure.<|python_t", 15, false, &tp);
    assert_int_equal(tp.content_len, 5);
    tool_call_parse(&llama, "Sure.<|python_tag|>{\"na", 23, false, &tp);
    assert_int_equal(tp.content_len, 5);
    tool_call_parse(&llama, "Sure.<|python_tag|>", 19, true, &tp);
    assert_int_equal(tp.content_len, 19);
    // prefix-stable over every prefix of t7: content only grows, to 5, calls begin once
    size_t last = 0;
    for (size_t n = 0; n <= strlen(t7); n++) {
        tool_call_parse(&llama, t7, n, false, &tp);
        assert_false(tp.is_failed);
        assert_true(tp.content_len >= last && tp.content_len <= 5);
        last = tp.content_len;
    }
    assert_int_equal(last, 5);
    // Hermes has no marker: the same text is content
    tool_call_parse(&hermes, "Sure.<|python_tag|>", 19, false, &tp);
    assert_int_equal(tp.content_len, 19);
    // ids
    char id[32];
    tool_call_make_id(&hermes, id, sizeof(id));
    assert_int_equal(strncmp(id, "call_", 5), 0);
    assert_int_equal(strlen(id), 5 + 24);
    tool_call_make_id(&mistral, id, sizeof(id));
    assert_int_equal(strlen(id), 9);
    for (int i = 0; i < 9; i++) assert_true(strchr("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789", id[i]));
    assert_true(tool_call_name_valid("get_weather-2"));
    assert_false(tool_call_name_valid(""));
    assert_false(tool_call_name_valid("a.b"));
}

/* A named choice: only that tool; one call when not parallel. */
static void test_tool_call_grammar_named_and_single(void **state) {
    (void)state;
    struct tools ts;
    make_tools(&ts);
    struct chat_tool_syntax syn;
    assert_int_equal(chat_tool_syntax(CHAT_FAMILY_QWEN2_5, &syn), 0);
    struct gbnf *g = compile(&syn, &ts, 1, false);
    const char *ok = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"x\"}}\n"
                     "</tool_call>";
    const char *other = "<tool_call>\n{\"name\": \"ping\"";
    struct grammar *gm = grammar_create(g);
    assert_int_equal(grammar_accept_bytes(gm, ok, strlen(ok)), GRAMMAR_STEP_DONE);
    grammar_free(gm);
    gm = grammar_create(g);
    assert_int_equal(grammar_accept_bytes(gm, other, strlen(other)), GRAMMAR_STEP_REJECT);
    grammar_free(gm);
    gbnf_release(g);
    free_tools(&ts);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tool_call_grammar_accepts_what_templates_render),
        cmocka_unit_test(test_tool_call_random_sentences_parse_and_validate),
        cmocka_unit_test(test_tool_call_parse_hand_cases),
        cmocka_unit_test(test_tool_call_grammar_named_and_single),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
