/*
 * test_text.c - the exact text every client gets, checked against oracles
 * from outside llmserve:
 *   - ../shared/models/README.md: the greedy ids of stories260K (from
 *     llama2.c's run.c and llama.cpp, which agree) and the pieces of those
 *     ids, written out by hand there. A prompt that is a prefix of the greedy
 *     sequence continues with the rest of it, so its continuation's text is
 *     the concatenation of the following pieces: the first one's leading
 *     space included (decode prompt + completion, strip the prompt's text).
 *   - llama.cpp's server: "The cat" continues " and a boy were playing"
 *     (issue 14).
 *   - Hugging Face's llama-2 chat template: an assistant reply is written
 *     after "[/INST]" as ' ' + content, so that one space is the template's.
 *   - llama.cpp's upstream tokenizer vectors (.inp/.out) for the CLI tools
 *     on vocab-only files.
 *   - the OpenAI API's published shapes (text_offset, the "model" field).
 * Every path is checked: generate, batch, completions plain and streamed,
 * echo, logprobs, stop strings, chat.
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
#include <sys/wait.h>
#include <cmocka.h>
#include <jansson.h>

#include "tests/helpers/testutil.h"
#include "tests/integration/httptest.h"

/* README section A: the greedy ids after [BOS], and section B's pieces of
 * them (ids 403 .. 432 there; the table below is those pieces by position). */
static const int32_t k_greedy[] = {1,   403, 407, 261, 378, 432, 383, 286, 261, 376, 298, 315,
                                   421, 395, 317, 426, 338, 401, 396, 267, 337, 410, 408, 419,
                                   292, 411, 322, 265, 282, 295, 433, 426, 385, 328, 432};
static const char *const k_pieces[] = {
    "",      " Once", " upon", " a",   " time", ",",   " there", " was", " a",
    " little", " g",  "ir",    "l",    " named", " Lily", ".",   " She",  " lo",
    "ved",   " to",   " play", " ",    "out",   "s",     "id",  "e",      " in",
    " the",  " p",    "ar",    "k",    ".",     " One",  " day", ","};
#define N_GREEDY ((int32_t)(sizeof(k_greedy) / sizeof(k_greedy[0])))

/* Prompts that are prefixes of the greedy sequence: k ids (BOS included). */
struct text_case {
    const char *prompt;
    int32_t n_prompt_ids;
    int32_t n_gen;
};

static const struct text_case k_cases[] = {
    {"Once upon a time, there", 7, 8},                                 // " was a little girl ..."
    {"Once upon a time, there was a little", 10, 11},                  // " girl named Lily. ..."
    {"Once upon a time, there was a little girl named Lily. She", 17, 15},  // " loved to ..."
    {"Once upon a time", 5, 6},                                        // ", there was ..."
};

/* The oracle: the pieces of the n_gen ids after the prompt, joined. */
static char *expected_text(const struct text_case *c) {
    static char out[1024];
    out[0] = '\0';
    assert_true(c->n_prompt_ids + c->n_gen <= N_GREEDY);
    for (int32_t i = c->n_prompt_ids; i < c->n_prompt_ids + c->n_gen; i++)
        strcat(out, k_pieces[i]);
    return out;
}

static const char *shared_or_skip(void) {
    const char *shared = testutil_shared_dir();
    if (!shared) {
        print_message("skipped: ../shared is absent (stories260K.gguf, vocab files)\n");
        skip();
    }
    return shared;
}

static const char *model_path(void) {
    return testutil_path(shared_or_skip(), "models/stories260K.gguf");
}

static const char *bin(void) {
    const char *b = getenv("LLMSERVE_BIN");
    assert_non_null(b);
    return b;
}

/* Runs cmd, returns its stdout (malloc'd); asserts exit status 0. */
static char *run(const char *cmd) {
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    size_t cap = 1 << 16, n = 0;
    char *out = malloc(cap);
    assert_non_null(out);
    size_t got;
    while ((got = fread(out + n, 1, cap - 1 - n, p)) > 0) n += got;
    out[n] = '\0';
    int st = pclose(p);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) fail_msg("'%s' failed: %s", cmd, out);
    return out;
}

/* A temporary file holding len bytes; its path in a static buffer. */
static const char *temp_file(const char *data, size_t len) {
    static char path[4096];
    snprintf(path, sizeof(path), "%s/text-test-%d.tmp", testutil_build_dir(), (int)getpid());
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(data, 1, len, f), len);
    fclose(f);
    return path;
}

/* ---- the server ---------------------------------------------------------- */

static struct httptest_server srv;

static int group_setup(void **state) {
    (void)state;
    if (!testutil_shared_dir()) return 0;
    httptest_start(&srv, model_path(), NULL);
    return 0;
}

static int group_teardown(void **state) {
    (void)state;
    if (srv.pid > 0) httptest_stop(&srv, SIGTERM);
    return 0;
}

/* POSTs body to path on the server at port; the reply, which must be a 200. */
static json_t *post_json_to(int port, const char *path, const char *body) {
    struct httptest_resp r;
    int st = httptest_request(port, "POST", path, NULL, body, &r);
    if (st != 200) fail_msg("POST %s %s: %d %s", path, body, st, r.body);
    json_error_t je;
    json_t *o = json_loads(r.body, JSON_ALLOW_NUL, &je);
    if (!o) fail_msg("not JSON: %s", r.body);
    httptest_resp_free(&r);
    return o;
}

static json_t *post_json(const char *path, const char *body) {
    return post_json_to(srv.port, path, body);
}

static const char *choice_str(json_t *o, const char *key) {
    json_t *c = json_array_get(json_object_get(o, "choices"), 0);
    const char *s = json_string_value(json_object_get(c, key));
    assert_non_null(s);
    return s;
}

/* A streamed request's text from the server at port: every chunk's
 * choices[0].text (or, for chat, delta.content) joined, in order. Malloc'd. */
/* The draft counters of the server at port (/metrics): accepted, and drafted
 * into *drafted; the whole page into *m, for more (httptest_resp_free). */
static double draft_counts(int port, double *drafted, struct httptest_resp *m) {
    assert_int_equal(httptest_request(port, "GET", "/metrics", NULL, NULL, m), 200);
    *drafted = httptest_metric(m->body, "llmserve_draft_tokens_total");
    return httptest_metric(m->body, "llmserve_draft_accepted_tokens_total");
}

static char *post_stream_to(int port, const char *path, const char *body, bool chat) {
    struct httptest_resp r;
    int st = httptest_request(port, "POST", path, NULL, body, &r);
    if (st != 200) fail_msg("POST %s %s: %d %s", path, body, st, r.body);
    int n = 0;
    char **ev = httptest_sse_events(r.body, &n);
    assert_true(n >= 2);
    assert_string_equal(ev[n - 1], "[DONE]");
    char *text = calloc(1, 1 << 16);
    assert_non_null(text);
    for (int i = 0; i < n - 1; i++) {
        json_t *o = json_loads(ev[i], JSON_ALLOW_NUL, NULL);
        if (!o) fail_msg("not JSON: %s", ev[i]);
        json_t *c = json_array_get(json_object_get(o, "choices"), 0);
        json_t *t = chat ? json_object_get(json_object_get(c, "delta"), "content")
                         : json_object_get(c, "text");
        if (json_is_string(t)) strcat(text, json_string_value(t));
        json_decref(o);
    }
    httptest_events_free(ev, n);
    httptest_resp_free(&r);
    return text;
}

static char *post_stream(const char *path, const char *body, bool chat) {
    return post_stream_to(srv.port, path, body, chat);
}

/* JSON-quotes s into out (only what the prompts here need: ASCII, no quotes). */
static const char *quoted(const char *s) {
    static char out[2][1024];
    static int k;
    k ^= 1;
    snprintf(out[k], sizeof(out[k]), "\"%s\"", s);
    return out[k];
}

/* ---- every path gives the oracle's text ---------------------------------- */

/* The prompt texts tokenize to the README's ids (else the oracle would not
 * apply): checked through the CLI. */
static void test_text_prompts_are_greedy_prefixes(void **state) {
    (void)state;
    for (size_t k = 0; k < sizeof(k_cases) / sizeof(k_cases[0]); k++) {
        const struct text_case *c = &k_cases[k];
        char want[512] = "", cmd[8192];
        for (int32_t i = 0; i < c->n_prompt_ids; i++)
            snprintf(want + strlen(want), sizeof(want) - strlen(want), i ? " %d" : "%d",
                     (int)k_greedy[i]);
        strcat(want, "\n");
        const char *in = temp_file(c->prompt, strlen(c->prompt));
        snprintf(cmd, sizeof(cmd), "%s tokenize -m %s < %s", bin(), model_path(), in);
        char *got = run(cmd);
        assert_string_equal(got, want);
        free(got);
    }
}

static void test_text_generate(void **state) {
    (void)state;
    for (size_t k = 0; k < sizeof(k_cases) / sizeof(k_cases[0]); k++) {
        const struct text_case *c = &k_cases[k];
        char cmd[8192];
        snprintf(cmd, sizeof(cmd), "%s generate -m %s -p '%s' -n %d --temp 0 2>/dev/null", bin(),
                 model_path(), c->prompt, (int)c->n_gen);
        char *got = run(cmd);
        // generate ends its output with a newline of its own.
        char want[1100];
        snprintf(want, sizeof(want), "%s\n", expected_text(c));
        assert_string_equal(got, want);
        free(got);
    }
}

static void test_text_batch(void **state) {
    (void)state;
    char lines[8192] = "";
    size_t n_cases = sizeof(k_cases) / sizeof(k_cases[0]);
    for (size_t k = 0; k < n_cases; k++) {
        snprintf(lines + strlen(lines), sizeof(lines) - strlen(lines),
                 "{\"prompt\": %s, \"max_tokens\": %d, \"temperature\": 0}\n",
                 quoted(k_cases[k].prompt), (int)k_cases[k].n_gen);
    }
    char cmd[8192];
    snprintf(cmd, sizeof(cmd), "%s batch -m %s --prompts %s 2>/dev/null", bin(), model_path(),
             temp_file(lines, strlen(lines)));
    char *out = run(cmd);
    char *line = out;
    for (size_t k = 0; k < n_cases; k++) {
        char *eol = strchr(line, '\n');
        assert_non_null(eol);
        *eol = '\0';
        json_t *o = json_loads(line, JSON_ALLOW_NUL, NULL);
        assert_non_null(o);
        assert_string_equal(json_string_value(json_object_get(o, "text")),
                            expected_text(&k_cases[k]));
        json_decref(o);
        line = eol + 1;
    }
    free(out);
}

static void test_text_completions_plain_and_streamed(void **state) {
    (void)state;
    shared_or_skip();
    for (size_t k = 0; k < sizeof(k_cases) / sizeof(k_cases[0]); k++) {
        const struct text_case *c = &k_cases[k];
        char body[2048];
        snprintf(body, sizeof(body), "{\"prompt\": %s, \"max_tokens\": %d, \"temperature\": 0}",
                 quoted(c->prompt), (int)c->n_gen);
        json_t *o = post_json("/v1/completions", body);
        assert_string_equal(choice_str(o, "text"), expected_text(c));
        json_decref(o);
        snprintf(body, sizeof(body),
                 "{\"prompt\": %s, \"max_tokens\": %d, \"temperature\": 0, \"stream\": true}",
                 quoted(c->prompt), (int)c->n_gen);
        char *text = post_stream("/v1/completions", body, false);
        assert_string_equal(text, expected_text(c));
        free(text);
        // The same prompt as ids (BOS included) gives the same text.
        char ids[512] = "[";
        for (int32_t i = 0; i < c->n_prompt_ids; i++)
            snprintf(ids + strlen(ids), sizeof(ids) - strlen(ids), i ? ",%d" : "%d",
                     (int)k_greedy[i]);
        strcat(ids, "]");
        snprintf(body, sizeof(body), "{\"prompt\": %s, \"max_tokens\": %d, \"temperature\": 0}",
                 ids, (int)c->n_gen);
        o = post_json("/v1/completions", body);
        assert_string_equal(choice_str(o, "text"), expected_text(c));
        json_decref(o);
    }
}

/* A server drafting with a draft model (--draft-model: stories260K for
 * itself) gives the same text, plain and streamed; drafting for itself at
 * temperature 0, every draft is accepted (/metrics). Both pools fit in
 * --kv-memory 1M together. Hand-derived: a block of stories260K's f16 KV is
 * 16 tokens x 5 layers x (K, V) x 4 KV heads x 8 dims x 2 bytes = 10 KiB, so
 * 1 MiB holds 102 blocks; the draft pool would want 4 streams of the
 * context (4 x 2048 / 16 = 512 blocks) and gets half the budget, 51. */
static void test_text_draft_model_changes_no_text(void **state) {
    (void)state;
    shared_or_skip();
    struct httptest_server s2;
    char flags[4096];
    snprintf(flags, sizeof(flags), "--draft-model %s --draft-n 4 --kv-memory 1M", model_path());
    httptest_start(&s2, model_path(), flags);
    for (size_t k = 0; k < sizeof(k_cases) / sizeof(k_cases[0]); k++) {
        const struct text_case *c = &k_cases[k];
        for (int stream = 0; stream < 2; stream++) {
            char body[2048];
            snprintf(body, sizeof(body),
                     "{\"prompt\": %s, \"max_tokens\": %d, \"temperature\": 0, \"stream\": %s}",
                     quoted(c->prompt), (int)c->n_gen, stream ? "true" : "false");
            if (stream) {
                char *text = post_stream_to(s2.port, "/v1/completions", body, false);
                assert_string_equal(text, expected_text(c));
                free(text);
                continue;
            }
            struct httptest_resp r;
            assert_int_equal(httptest_request(s2.port, "POST", "/v1/completions", NULL, body, &r),
                             200);
            json_t *o = json_loads(r.body, JSON_ALLOW_NUL, NULL);
            assert_non_null(o);
            assert_string_equal(choice_str(o, "text"), expected_text(c));
            json_decref(o);
            httptest_resp_free(&r);
        }
    }
    struct httptest_resp m;
    double drafted = 0.0;
    double accepted = draft_counts(s2.port, &drafted, &m);
    print_message("draft model: %.0f of %.0f draft tokens accepted\n", accepted, drafted);
    assert_true(drafted > 0);
    assert_true(accepted == drafted);
    double kv_total = httptest_metric(m.body, "llmserve_kv_blocks_total");
    double draft_total = httptest_metric(m.body, "llmserve_draft_kv_blocks_total");
    print_message("--kv-memory 1M: %.0f blocks for the model, %.0f for the draft\n", kv_total,
                  draft_total);
    assert_true(draft_total == 51);
    assert_true(kv_total + draft_total <= 102);
    assert_true(httptest_metric(m.body, "llmserve_draft_kv_blocks_used") == 0);
    httptest_resp_free(&m);
    httptest_stop(&s2, SIGTERM);
}

/* Constrained requests (a JSON object, response_format) on a server
 * drafting with stories260K for itself: a draft token must be one the
 * grammar allows after the draft's earlier tokens, so every draft is kept,
 * greedy (the masked argmax is the model's own greedy choice) and sampled
 * without a seed (q is then the model's p, mask and all: min(1, p/q) = 1).
 * Drafted without the grammar, the draft model's first choice is ordinary
 * story text, which a JSON object refuses, and the drafts were rejected.
 * The greedy text is the one of the server without drafts; so is that of
 * prompt lookup (--draft-n alone), whose drafts are cut before the first
 * token the grammar refuses (each tried on the grammar, then rewound). */
static void test_text_draft_model_under_a_grammar(void **state) {
    (void)state;
    shared_or_skip();
    struct httptest_server s2;
    char flags[4096];
    snprintf(flags, sizeof(flags), "--draft-model %s --draft-n 4", model_path());
    httptest_start(&s2, model_path(), flags);
    for (int i = 0; i < 4; i++) {
        char body[512];
        snprintf(body, sizeof(body),
                 "{\"prompt\": \"Once upon a time\", \"max_tokens\": 48, %s"
                 "\"response_format\": {\"type\": \"json_object\"}}",
                 i == 0 ? "\"temperature\": 0, " : "");
        json_t *o = post_json_to(s2.port, "/v1/completions", body);
        const char *text = choice_str(o, "text");
        assert_true(text[0] == '{');  // the grammar's first byte
        if (i == 0) {
            json_t *plain = post_json("/v1/completions", body);
            assert_string_equal(text, choice_str(plain, "text"));
            json_decref(plain);
        }
        json_decref(o);
    }
    struct httptest_resp m;
    double drafted = 0.0;
    double accepted = draft_counts(s2.port, &drafted, &m);
    print_message("under a grammar: %.0f of %.0f draft tokens accepted\n", accepted, drafted);
    assert_true(drafted > 0);
    assert_true(accepted == drafted);
    httptest_resp_free(&m);
    httptest_stop(&s2, SIGTERM);

    httptest_start(&s2, model_path(), "--draft-n 4");
    const char *body = "{\"prompt\": \"{\\\"name\\\": \\\"Lily\\\", \\\"friend\\\": \\\"Tom\\\", "
                       "\\\"name\\\": \\\"Lily\\\", \\\"friend\\\": \\\"Tom\\\"}\", "
                       "\"max_tokens\": 64, \"temperature\": 0, "
                       "\"response_format\": {\"type\": \"json_object\"}}";
    json_t *plain = post_json("/v1/completions", body);
    for (int i = 0; i < 2; i++) {  // the second with its prompt's blocks cached
        json_t *o = post_json_to(s2.port, "/v1/completions", body);
        assert_string_equal(choice_str(o, "text"), choice_str(plain, "text"));
        json_decref(o);
    }
    json_decref(plain);
    accepted = draft_counts(s2.port, &drafted, &m);
    print_message("prompt lookup under a grammar: %.0f of %.0f accepted\n", accepted, drafted);
    assert_true(drafted > 0);
    httptest_resp_free(&m);
    httptest_stop(&s2, SIGTERM);
}

/* llama.cpp's server on the same file (issue 14). */
static void test_text_the_cat_keeps_its_space(void **state) {
    (void)state;
    shared_or_skip();
    json_t *o = post_json("/v1/completions",
                          "{\"prompt\": \"The cat\", \"max_tokens\": 12, \"temperature\": 0}");
    const char *want = " and a boy were playing";
    assert_memory_equal(choice_str(o, "text"), want, strlen(want));
    json_decref(o);
}

/* A prompt of BOS alone: the text begins there, so its first piece loses the
 * SPM prefix space, as README section A's text shows ("Once upon a time"). */
static void test_text_bos_only_prompt_starts_the_text(void **state) {
    (void)state;
    shared_or_skip();
    json_t *o = post_json("/v1/completions", "{\"prompt\": [1], \"max_tokens\": 7, "
                                             "\"temperature\": 0, \"logprobs\": 0}");
    assert_string_equal(choice_str(o, "text"), "Once upon a time, there was");
    // The token strings agree with the text: the first has no space either.
    json_t *lp = json_object_get(json_array_get(json_object_get(o, "choices"), 0), "logprobs");
    assert_string_equal(json_string_value(json_array_get(json_object_get(lp, "tokens"), 0)),
                        "Once");
    json_decref(o);
    char *text = post_stream("/v1/completions", "{\"prompt\": [1], \"max_tokens\": 7, "
                                                "\"temperature\": 0, \"stream\": true}", false);
    assert_string_equal(text, "Once upon a time, there was");
    free(text);
}

/* echo: prompt text then completion, joined as decode(prompt + completion);
 * logprobs: OpenAI's tokens/text_offset index that text. */
static void test_text_echo_and_logprobs(void **state) {
    (void)state;
    shared_or_skip();
    const struct text_case *c = &k_cases[0];
    const char *bodies[] = {
        "{\"prompt\": \"Once upon a time, there\", \"max_tokens\": 8, \"temperature\": 0, "
        "\"echo\": true, \"logprobs\": 1}",
        // ids: the echo is the prompt's decoded text (BOS is a control token).
        "{\"prompt\": [1,403,407,261,378,432,383], \"max_tokens\": 8, \"temperature\": 0, "
        "\"echo\": true, \"logprobs\": 1}",
    };
    for (size_t b = 0; b < 2; b++) {
        json_t *o = post_json("/v1/completions", bodies[b]);
        char want[2048];
        snprintf(want, sizeof(want), "%s%s", c->prompt, expected_text(c));
        const char *text = choice_str(o, "text");
        assert_string_equal(text, want);
        json_t *lp = json_object_get(json_array_get(json_object_get(o, "choices"), 0), "logprobs");
        json_t *tokens = json_object_get(lp, "tokens");
        json_t *offsets = json_object_get(lp, "text_offset");
        assert_int_equal(json_array_size(tokens), c->n_gen);
        assert_int_equal(json_array_size(offsets), c->n_gen);
        for (int32_t i = 0; i < c->n_gen; i++) {
            const char *tk = json_string_value(json_array_get(tokens, (size_t)i));
            assert_string_equal(tk, k_pieces[c->n_prompt_ids + i]);
            size_t off = (size_t)json_integer_value(json_array_get(offsets, (size_t)i));
            if (i == 0) assert_int_equal(off, strlen(c->prompt));
            assert_memory_equal(text + off, tk, strlen(tk));
        }
        json_decref(o);
    }
}

/* Stop strings cut the oracle's text before their first occurrence, spaces
 * included (a stop that ends on a space, one that begins with one). */
static void test_text_stop_strings_on_spaces(void **state) {
    (void)state;
    shared_or_skip();
    const struct text_case *c = &k_cases[0];  // " was a little girl named Lily"
    const char *stops[] = {" a", "was ", " little", "a l", " "};
    for (size_t k = 0; k < sizeof(stops) / sizeof(stops[0]); k++) {
        const char *full = expected_text(c);
        const char *at = strstr(full, stops[k]);
        assert_non_null(at);
        char want[1024];
        snprintf(want, sizeof(want), "%.*s", (int)(at - full), full);
        char body[2048];
        snprintf(body, sizeof(body),
                 "{\"prompt\": %s, \"max_tokens\": %d, \"temperature\": 0, \"stop\": [%s]%s}",
                 quoted(c->prompt), (int)c->n_gen, quoted(stops[k]), "");
        json_t *o = post_json("/v1/completions", body);
        assert_string_equal(choice_str(o, "text"), want);
        assert_string_equal(choice_str(o, "finish_reason"), "stop");
        json_decref(o);
        snprintf(body, sizeof(body),
                 "{\"prompt\": %s, \"max_tokens\": %d, \"temperature\": 0, \"stop\": [%s], "
                 "\"stream\": true}",
                 quoted(c->prompt), (int)c->n_gen, quoted(stops[k]));
        char *text = post_stream("/v1/completions", body, false);
        assert_string_equal(text, want);
        free(text);
        char cmd[8192];
        snprintf(cmd, sizeof(cmd), "%s generate -m %s -p '%s' -n %d --temp 0 --stop '%s' "
                 "2>/dev/null", bin(), model_path(), c->prompt, (int)c->n_gen, stops[k]);
        char *got = run(cmd);
        char want_nl[1100];
        snprintf(want_nl, sizeof(want_nl), "%s\n", want);
        assert_string_equal(got, want_nl);
        free(got);
    }
}

/* The served id is the file's name without .gguf, in /v1/models and in every
 * response's "model". */
static void test_text_model_id_is_the_file_name(void **state) {
    (void)state;
    shared_or_skip();
    struct httptest_resp r;
    assert_int_equal(httptest_request(srv.port, "GET", "/v1/models", NULL, NULL, &r), 200);
    json_t *o = json_loads(r.body, JSON_ALLOW_NUL, NULL);
    assert_non_null(o);
    json_t *m = json_array_get(json_object_get(o, "data"), 0);
    assert_string_equal(json_string_value(json_object_get(m, "id")), "stories260K");
    json_decref(o);
    httptest_resp_free(&r);
    o = post_json("/v1/completions", "{\"model\": \"stories260K\", \"prompt\": \"The\", "
                                     "\"max_tokens\": 2}");
    assert_string_equal(json_string_value(json_object_get(o, "model")), "stories260K");
    json_decref(o);
}

/* ChatML (stories260K has no template: the fallback) puts nothing between
 * "<|im_start|>assistant\n" and the reply, so the reply is exactly the text
 * that continues the rendered prompt, as /v1/completions gives it. */
static void test_text_chat_chatml_reply_is_the_continuation(void **state) {
    (void)state;
    shared_or_skip();
    const char *rendered = "<|im_start|>user\\nThe dog<|im_end|>\\n<|im_start|>assistant\\n";
    char body[2048];
    snprintf(body, sizeof(body),
             "{\"prompt\": \"%s\", \"max_tokens\": 10, \"temperature\": 0}", rendered);
    json_t *o = post_json("/v1/completions", body);
    char want[1024];
    snprintf(want, sizeof(want), "%s", choice_str(o, "text"));
    json_decref(o);
    const char *chat = "{\"messages\": [{\"role\": \"user\", \"content\": \"The dog\"}], "
                       "\"max_tokens\": 10, \"temperature\": 0%s}";
    snprintf(body, sizeof(body), chat, "");
    o = post_json("/v1/chat/completions", body);
    json_t *msg = json_object_get(json_array_get(json_object_get(o, "choices"), 0), "message");
    assert_string_equal(json_string_value(json_object_get(msg, "content")), want);
    json_decref(o);
    snprintf(body, sizeof(body), chat, ", \"stream\": true");
    char *text = post_stream("/v1/chat/completions", body, true);
    assert_string_equal(text, want);
    free(text);
}

/* llama2: HF's template writes a reply as "[/INST]" + ' ' + content.strip(),
 * so the model's first space is the template's, not the reply's. */
static void test_text_chat_llama2_drops_the_template_space(void **state) {
    (void)state;
    shared_or_skip();
    struct httptest_server s2;
    httptest_start(&s2, model_path(), "--chat-template llama2 --model-name tiny-story");
    struct httptest_resp r;
    // The rendered prompt is "<s>[INST] The dog [/INST]"; completions adds the BOS.
    int st = httptest_request(s2.port, "POST", "/v1/completions", NULL,
                              "{\"prompt\": \"[INST] The dog [/INST]\", \"max_tokens\": 10, "
                              "\"temperature\": 0}", &r);
    assert_int_equal(st, 200);
    json_t *o = json_loads(r.body, JSON_ALLOW_NUL, NULL);
    assert_non_null(o);
    assert_string_equal(json_string_value(json_object_get(o, "model")), "tiny-story");
    const char *cont = choice_str(o, "text");
    assert_true(cont[0] == ' ');  // this model does answer with a space first
    char want[1024];
    snprintf(want, sizeof(want), "%s", cont + 1);
    json_decref(o);
    httptest_resp_free(&r);
    const char *chat = "{\"messages\": [{\"role\": \"user\", \"content\": \"The dog\"}], "
                       "\"max_tokens\": 10, \"temperature\": 0%s}";
    char body[1024];
    snprintf(body, sizeof(body), chat, "");
    assert_int_equal(httptest_request(s2.port, "POST", "/v1/chat/completions", NULL, body, &r),
                     200);
    o = json_loads(r.body, JSON_ALLOW_NUL, NULL);
    assert_non_null(o);
    json_t *msg = json_object_get(json_array_get(json_object_get(o, "choices"), 0), "message");
    assert_string_equal(json_string_value(json_object_get(msg, "content")), want);
    json_decref(o);
    httptest_resp_free(&r);
    // Streamed, the same text.
    snprintf(body, sizeof(body), chat, ", \"stream\": true");
    assert_int_equal(httptest_request(s2.port, "POST", "/v1/chat/completions", NULL, body, &r),
                     200);
    int n = 0;
    char **ev = httptest_sse_events(r.body, &n);
    char got[1024] = "";
    for (int i = 0; i < n - 1; i++) {
        json_t *e = json_loads(ev[i], JSON_ALLOW_NUL, NULL);
        assert_non_null(e);
        json_t *c = json_object_get(json_object_get(json_array_get(json_object_get(e, "choices"),
                                                                   0), "delta"), "content");
        if (json_is_string(c)) strcat(got, json_string_value(c));
        json_decref(e);
    }
    assert_string_equal(got, want);
    httptest_events_free(ev, n);
    httptest_resp_free(&r);
    httptest_stop(&s2, SIGTERM);
}

/* ---- the CLI on vocab-only files ------------------------------------------ */

static void check_vocab_cli(const char *vocab) {
    const char *shared = shared_or_skip();
    char name[256];
    snprintf(name, sizeof(name), "models/vocab/%s", vocab);
    char gguf[4096];
    snprintf(gguf, sizeof(gguf), "%s", testutil_path(shared, name));
    snprintf(name, sizeof(name), "models/vocab/%s.inp", vocab);
    size_t inp_len = 0;
    char *inp = testutil_read_file(testutil_path(shared, name), &inp_len);
    snprintf(name, sizeof(name), "models/vocab/%s.out", vocab);
    char *outs = testutil_read_file(testutil_path(shared, name), NULL);
    assert_non_null(inp);
    assert_non_null(outs);
    static const char sep[] = "\n__ggml_vocab_test__\n";
    char *at = inp, *line = outs;
    int n = 0;
    for (char *hit; (hit = strstr(at, sep)) != NULL; at = hit + strlen(sep), n++) {
        char *eol = strchr(line, '\n');
        assert_non_null(eol);
        *eol = '\0';
        // llama.cpp's vectors: no BOS/EOS added, special text not parsed.
        char cmd[16384];
        snprintf(cmd, sizeof(cmd), "%s tokenize -m %s --no-special < %s", bin(), gguf,
                 temp_file(at, (size_t)(hit - at)));
        char *got = run(cmd);
        const char *want = line[0] == ' ' ? line + 1 : line;  // .out lines start with a space
        char want_nl[8192];
        snprintf(want_nl, sizeof(want_nl), "%s\n", want);
        if (strcmp(got, want_nl) != 0)
            fail_msg("%s: vector %d: got '%s', want '%s'", vocab, n, got, want);
        free(got);
        // detokenize gives the text back (the vectors round-trip).
        snprintf(cmd, sizeof(cmd), "%s detokenize -m %s < %s", bin(), gguf,
                 temp_file(want, strlen(want)));
        got = run(cmd);
        size_t len = (size_t)(hit - at);
        assert_int_equal(strlen(got), len + 1);  // plus detokenize's newline
        assert_memory_equal(got, at, len);
        free(got);
        line = eol + 1;
    }
    assert_true(n > 10);
    print_message("%s: %d vectors through the CLI\n", vocab, n);
    free(inp);
    free(outs);
}

static void test_text_cli_vocab_llama_spm(void **state) {
    (void)state;
    check_vocab_cli("ggml-vocab-llama-spm.gguf");
}

static void test_text_cli_vocab_phi3(void **state) {
    (void)state;
    check_vocab_cli("ggml-vocab-phi-3.gguf");
}

static void test_text_cli_vocab_gpt2(void **state) {
    (void)state;
    check_vocab_cli("ggml-vocab-gpt-2.gguf");
}

static void test_text_cli_vocab_deepseek_coder(void **state) {
    (void)state;
    check_vocab_cli("ggml-vocab-deepseek-coder.gguf");
}

int main(void) {
    const struct CMUnitTest cli[] = {
        cmocka_unit_test(test_text_prompts_are_greedy_prefixes),
        cmocka_unit_test(test_text_generate),
        cmocka_unit_test(test_text_batch),
        cmocka_unit_test(test_text_cli_vocab_llama_spm),
        cmocka_unit_test(test_text_cli_vocab_phi3),
        cmocka_unit_test(test_text_cli_vocab_gpt2),
        cmocka_unit_test(test_text_cli_vocab_deepseek_coder),
    };
    const struct CMUnitTest http[] = {
        cmocka_unit_test(test_text_completions_plain_and_streamed),
        cmocka_unit_test(test_text_draft_model_changes_no_text),
        cmocka_unit_test(test_text_draft_model_under_a_grammar),
        cmocka_unit_test(test_text_the_cat_keeps_its_space),
        cmocka_unit_test(test_text_bos_only_prompt_starts_the_text),
        cmocka_unit_test(test_text_echo_and_logprobs),
        cmocka_unit_test(test_text_stop_strings_on_spaces),
        cmocka_unit_test(test_text_model_id_is_the_file_name),
        cmocka_unit_test(test_text_chat_chatml_reply_is_the_continuation),
        cmocka_unit_test(test_text_chat_llama2_drops_the_template_space),
    };
    int failed = cmocka_run_group_tests_name("text_cli", cli, NULL, NULL);
    failed += cmocka_run_group_tests_name("text_http", http, group_setup, group_teardown);
    return failed;
}
