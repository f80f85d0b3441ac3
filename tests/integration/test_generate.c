/*
 * test_generate.c - `llmserve generate` as a user runs it: the real binary,
 * its stdout contract (generated ids on one line) and its errors.
 */
#include <setjmp.h>
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

/* Runs cmd, captures stdout into out (size n); returns the exit status. */
static int run(const char *cmd, char *out, size_t n) {
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    size_t got = fread(out, 1, n - 1, p);
    out[got] = '\0';
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* ../shared, or skip the test (a fresh clone has none). */
static const char *shared_or_skip(void) {
    const char *shared = testutil_shared_dir();
    if (!shared) {
        print_message("skipped: ../shared is absent (stories260K.gguf)\n");
        skip();
    }
    return shared;
}

static const char *bin(void) {
    const char *b = getenv("LLMSERVE_BIN");
    assert_non_null(b);
    return b;
}

/* ../shared/models/README.md, section A: greedy continuation of [BOS]. */
static void test_generate_stories260k_prints_reference_ids(void **state) {
    (void)state;
    const char *shared = shared_or_skip();
    char cmd[8192], out[4096];
    snprintf(cmd, sizeof(cmd), "%s generate -m %s/models/stories260K.gguf --prompt-ids 1 -n 31",
             bin(), shared);
    assert_int_equal(run(cmd, out, sizeof(out)), 0);
    assert_string_equal(out,
                        "403 407 261 378 432 383 286 261 376 298 315 421 395 317 426 338 401 396 "
                        "267 337 410 408 419 292 411 322 265 282 295 433 426\n");
}

/* Section B: the prompt "Once upon a time" is 1 403 407 261 378. */
static void test_generate_stories260k_continues_prompt_ids(void **state) {
    (void)state;
    const char *shared = shared_or_skip();
    char cmd[8192], out[4096];
    snprintf(cmd, sizeof(cmd),
             "%s generate -m %s/models/stories260K.gguf --prompt-ids 1,403,407,261,378 -n 30",
             bin(), shared);
    assert_int_equal(run(cmd, out, sizeof(out)), 0);
    assert_string_equal(out,
                        "432 383 286 261 376 298 315 421 395 317 426 338 401 396 267 337 410 408 "
                        "419 292 411 322 265 282 295 433 426 385 328 432\n");
}

static void test_generate_rejects_bad_input(void **state) {
    (void)state;
    char cmd[8192], out[4096];
    snprintf(cmd, sizeof(cmd), "%s generate -m /nonexistent.gguf --prompt-ids 1 2>/dev/null",
             bin());
    assert_int_equal(run(cmd, out, sizeof(out)), 1);
    assert_string_equal(out, "");

    // A file that is not GGUF.
    snprintf(cmd, sizeof(cmd), "%s generate -m %s/meson.build --prompt-ids 1 2>/dev/null", bin(),
             testutil_source_dir());
    assert_int_equal(run(cmd, out, sizeof(out)), 1);

    char model[4096];
    snprintf(model, sizeof(model), "%s/tests/models/llama-f32.gguf", testutil_build_dir());
    const char *bad_ids[] = {"x", "1,,2", "-1", "300", "1,2,", ""};
    for (size_t i = 0; i < sizeof(bad_ids) / sizeof(bad_ids[0]); i++) {
        snprintf(cmd, sizeof(cmd), "%s generate -m %s --prompt-ids '%s' 2>/dev/null", bin(),
                 model, bad_ids[i]);
        assert_int_equal(run(cmd, out, sizeof(out)), 2);
    }
    snprintf(cmd, sizeof(cmd), "%s generate -m %s --prompt-ids 1 -n abc 2>/dev/null", bin(),
             model);
    assert_int_equal(run(cmd, out, sizeof(out)), 2);
}

static void test_generate_synthetic_model_prints_n_ids(void **state) {
    (void)state;
    char cmd[8192], out[4096];
    snprintf(cmd, sizeof(cmd),
             "%s generate -m %s/tests/models/llama-f32.gguf --prompt-ids 5,6,7 -n 12 --ignore-eos",
             bin(), testutil_build_dir());
    assert_int_equal(run(cmd, out, sizeof(out)), 0);
    int count = 0;
    for (char *p = strtok(out, " \n"); p; p = strtok(NULL, " \n")) {
        long v = strtol(p, NULL, 10);
        assert_true(v >= 0 && v < 300);
        count++;
    }
    assert_int_equal(count, 12);
}

/* `generate --lora`: the greedy ids of the adapter merged into the weights
 * by the numpy reference (scripts/reference --lora ... --greedy), for a PEFT
 * adapter (llama: q/k rows permuted) and a bottleneck adapter chosen among
 * several with --lora-name; an adapter that does not load is an error. */
static void test_generate_lora_matches_reference_greedy(void **state) {
    (void)state;
    const char *models = testutil_path(testutil_build_dir(), "tests/models");
    const char *names[2] = {"llama-peft", "llama-bn"};
    for (int k = 0; k < 2; k++) {
        char cmd[16384], want[4096], got[4096];
        snprintf(cmd, sizeof(cmd),
                 "/usr/bin/python3 %s/scripts/reference --model %s/llama-f32.gguf --tokens "
                 "1,5,6,7,8 --lora %s/%s --greedy 16",
                 testutil_source_dir(), models, models, names[k]);
        assert_int_equal(run(cmd, want, sizeof(want)), 0);
        snprintf(cmd, sizeof(cmd),
                 "%s generate -m %s/llama-f32.gguf --prompt-ids 1,5,6,7,8 -n 16 --ignore-eos "
                 "--lora x=%s/llama-gguf-f16.gguf --lora y=%s/%s --lora-name y 2>/dev/null",
                 bin(), models, models, models, names[k]);
        assert_int_equal(run(cmd, got, sizeof(got)), 0);
        // stdout is the ids on one line; the reference prints them the same way
        if (strcmp(got, want) != 0) fail_msg("%s: got '%s', want '%s'", names[k], got, want);
    }
    char cmd[16384], out[4096];
    snprintf(cmd, sizeof(cmd),
             "%s generate -m %s/llama-f32.gguf --prompt-ids 1,5 -n 2 --lora x=/nonexistent "
             "2>&1", bin(), models);
    assert_true(run(cmd, out, sizeof(out)) != 0);
    assert_non_null(strstr(out, "/nonexistent"));
    snprintf(cmd, sizeof(cmd),
             "%s generate -m %s/llama-f32.gguf --prompt-ids 1,5 -n 2 --lora x=%s/llama-bn "
             "--lora y=%s/llama-peft 2>&1", bin(), models, models, models);
    assert_int_equal(run(cmd, out, sizeof(out)), 2);  // several: --lora-name needed
    assert_non_null(strstr(out, "--lora-name"));
}

/* Section B again, through the tokenizer: the continuation text of the prompt. */
static void test_generate_stories260k_text_prompt(void **state) {
    (void)state;
    const char *shared = shared_or_skip();
    char cmd[8192], out[4096];
    snprintf(cmd, sizeof(cmd),
             "%s generate -m %s/models/stories260K.gguf -p 'Once upon a time' -n 30 --temp 0",
             bin(), shared);
    assert_int_equal(run(cmd, out, sizeof(out)), 0);
    assert_string_equal(out, ", there was a little girl named Lily. She loved to play outside in "
                             "the park. One day,\n");

    // A stop string ends the text before it, across token boundaries ("pa" "rk").
    snprintf(cmd, sizeof(cmd),
             "%s generate -m %s/models/stories260K.gguf -p 'Once upon a time' -n 30 --temp 0 "
             "--stop 'the park'",
             bin(), shared);
    assert_int_equal(run(cmd, out, sizeof(out)), 0);
    assert_string_equal(out, ", there was a little girl named Lily. She loved to play outside in "
                             "\n");

    // The first generated token keeps its leading space (" upon").
    snprintf(cmd, sizeof(cmd),
             "%s generate -m %s/models/stories260K.gguf -p 'Once' -n 3 --temp 0", bin(), shared);
    assert_int_equal(run(cmd, out, sizeof(out)), 0);
    assert_string_equal(out, " upon a time\n");
}

static void test_generate_seed_reproducible(void **state) {
    (void)state;
    const char *shared = shared_or_skip();
    char cmd[8192], a[4096], b[4096], c[4096];
    const char *fmt = "%s generate -m %s/models/stories260K.gguf -p 'Once upon a time' -n 40 "
                      "--temp 1.0 --top-k 0 --top-p 1 --min-p 0 --seed %d";
    snprintf(cmd, sizeof(cmd), fmt, bin(), shared, 11);
    assert_int_equal(run(cmd, a, sizeof(a)), 0);
    snprintf(cmd, sizeof(cmd), fmt, bin(), shared, 11);
    assert_int_equal(run(cmd, b, sizeof(b)), 0);
    assert_string_equal(a, b);
    snprintf(cmd, sizeof(cmd), fmt, bin(), shared, 12);
    assert_int_equal(run(cmd, c, sizeof(c)), 0);
    assert_string_not_equal(a, c);
}

static void test_tokenize_detokenize_round_trip(void **state) {
    (void)state;
    const char *shared = shared_or_skip();
    char cmd[8192], out[4096];
    snprintf(cmd, sizeof(cmd),
             "printf 'Once upon a time' | %s tokenize -m %s/models/stories260K.gguf", bin(),
             shared);
    assert_int_equal(run(cmd, out, sizeof(out)), 0);
    assert_string_equal(out, "1 403 407 261 378\n");
    snprintf(cmd, sizeof(cmd),
             "printf 'Once upon a time' | %s tokenize -m %s/models/stories260K.gguf --no-special",
             bin(), shared);
    assert_int_equal(run(cmd, out, sizeof(out)), 0);
    assert_string_equal(out, "403 407 261 378\n");
    snprintf(cmd, sizeof(cmd),
             "echo 1 403 407 261 378 | %s detokenize -m %s/models/stories260K.gguf --skip-special",
             bin(), shared);
    assert_int_equal(run(cmd, out, sizeof(out)), 0);
    assert_string_equal(out, "Once upon a time\n");
}

static void test_generate_rejects_bad_text(void **state) {
    (void)state;
    char cmd[8192], out[4096];
    char model[4096];
    snprintf(model, sizeof(model), "%s/tests/models/llama-f32.gguf", testutil_build_dir());
    // Invalid UTF-8 (a lone continuation byte) in the prompt and on stdin.
    snprintf(cmd, sizeof(cmd), "%s generate -m %s -p \"$(printf 'a\\200b')\" 2>/dev/null", bin(),
             model);
    assert_int_equal(run(cmd, out, sizeof(out)), 2);
    snprintf(cmd, sizeof(cmd), "printf 'a\\377' | %s tokenize -m %s 2>/dev/null", bin(), model);
    assert_int_equal(run(cmd, out, sizeof(out)), 1);
    snprintf(cmd, sizeof(cmd), "printf 'a\\000b' | %s tokenize -m %s 2>/dev/null", bin(), model);
    assert_int_equal(run(cmd, out, sizeof(out)), 1);
    snprintf(cmd, sizeof(cmd), "echo 1 x | %s detokenize -m %s 2>/dev/null", bin(), model);
    assert_int_equal(run(cmd, out, sizeof(out)), 1);
    // Out-of-range sampling parameters.
    snprintf(cmd, sizeof(cmd), "%s generate -m %s -p hi --top-p 0 2>/dev/null", bin(), model);
    assert_int_equal(run(cmd, out, sizeof(out)), 2);
    snprintf(cmd, sizeof(cmd), "%s generate -m %s -p hi --temp -1 2>/dev/null", bin(), model);
    assert_int_equal(run(cmd, out, sizeof(out)), 2);
    // An empty prompt still has BOS to condition on.
    snprintf(cmd, sizeof(cmd), "%s generate -m %s -p '' -n 3 --temp 0 2>/dev/null", bin(), model);
    assert_int_equal(run(cmd, out, sizeof(out)), 0);
}

/* Counts the whitespace-separated ids of out. */
static int count_ids(char *out) {
    int n = 0;
    for (char *p = strtok(out, " \n"); p; p = strtok(NULL, " \n")) n++;
    return n;
}

/* --ctx: a prompt + -n beyond it is an error (serve's rule for an explicit
 * max_tokens); the default -n is cut to the room left (serve's rule for an
 * absent one). */
static void test_generate_ctx_limit(void **state) {
    (void)state;
    char cmd[8192], out[4096];
    const char *m = testutil_path(testutil_build_dir(), "tests/models/llama-f32.gguf");
    snprintf(cmd, sizeof(cmd), "%s generate -m %s --prompt-ids 5,6,7 -n 12 --ignore-eos --ctx 10 "
             "2>/dev/null", bin(), m);
    assert_int_equal(run(cmd, out, sizeof(out)), 2);
    assert_string_equal(out, "");
    snprintf(cmd, sizeof(cmd), "%s generate -m %s --prompt-ids 5,6,7 -n 12 --ignore-eos --ctx 15",
             bin(), m);
    assert_int_equal(run(cmd, out, sizeof(out)), 0);
    assert_int_equal(count_ids(out), 12);
    snprintf(cmd, sizeof(cmd), "%s generate -m %s --prompt-ids 5,6,7 --ignore-eos -c 10", bin(), m);
    assert_int_equal(run(cmd, out, sizeof(out)), 0);
    assert_int_equal(count_ids(out), 7);
    snprintf(cmd, sizeof(cmd), "%s generate -m %s --prompt-ids 5,6,7 --ctx 3 2>/dev/null", bin(), m);
    assert_int_equal(run(cmd, out, sizeof(out)), 2);
    snprintf(cmd, sizeof(cmd), "%s generate -m %s --prompt-ids 5 --ctx 0 2>/dev/null", bin(), m);
    assert_int_equal(run(cmd, out, sizeof(out)), 2);
}

/* Every KV type gives the README's greedy ids for stories260K (f16 and q8_0
 * round K/V, but not enough to flip an argmax of this model in 31 tokens);
 * an unknown type is a usage error. */
static void test_generate_kv_types(void **state) {
    (void)state;
    char cmd[8192], out[4096];
    const char *m = testutil_path(testutil_build_dir(), "tests/models/llama-f32.gguf");
    snprintf(cmd, sizeof(cmd), "%s generate -m %s --prompt-ids 5 --kv-type q4_0 2>/dev/null", bin(),
             m);
    assert_int_equal(run(cmd, out, sizeof(out)), 2);
    const char *types[] = {"f32", "f16", "q8_0"};
    for (int i = 0; i < 3; i++) {
        snprintf(cmd, sizeof(cmd), "%s generate -m %s --prompt-ids 5,6,7 -n 9 --ignore-eos "
                 "--kv-type %s", bin(), m, types[i]);
        assert_int_equal(run(cmd, out, sizeof(out)), 0);
        assert_int_equal(count_ids(out), 9);
    }
    const char *shared = shared_or_skip();
    for (int i = 0; i < 3; i++) {
        snprintf(cmd, sizeof(cmd), "%s generate -m %s/models/stories260K.gguf --prompt-ids 1 "
                 "-n 31 --kv-type %s", bin(), shared, types[i]);
        assert_int_equal(run(cmd, out, sizeof(out)), 0);
        assert_string_equal(out,
                            "403 407 261 378 432 383 286 261 376 298 315 421 395 317 426 338 401 "
                            "396 267 337 410 408 419 292 411 322 265 282 295 433 426\n");
    }
}

/* batch --ctx: a line beyond the context gets an error line naming the
 * sizes, the others run; --kv-type is checked. */
/* batch lines take a grammar as the routes do (`grammar`, `response_format`):
 * each text is a sentence of its grammar (hand-derived: "yes!" or "no!",
 * ending with finish "stop"; a JSON object starts with '{'), and a bad
 * grammar is that line's error, naming what is wrong, the others served. */
static void test_batch_grammar(void **state) {
    (void)state;
    char path[4096], cmd[8192], out[16384];
    snprintf(path, sizeof(path), "%s/test_batch_grammar.jsonl", testutil_build_dir());
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    for (int seed = 1; seed <= 4; seed++)
        fprintf(f, "{\"prompt\":[5,6,7],\"grammar\":\"root ::= (\\\"yes\\\" | \\\"no\\\") "
                   "\\\"!\\\"\",\"seed\":%d}\n", seed);
    fputs("{\"prompt\":[5,6,7],\"grammar\":\"root ::= valu\"}\n"
          "{\"prompt\":[5,6,7],\"max_tokens\":12,\"temperature\":0,"
          "\"response_format\":{\"type\":\"json_object\"}}\n", f);
    fclose(f);
    const char *m = testutil_path(testutil_build_dir(), "tests/models/llama-f32.gguf");
    snprintf(cmd, sizeof(cmd), "%s batch -m %s --prompts %s -t 1 2>/dev/null", bin(), m, path);
    assert_int_equal(run(cmd, out, sizeof(out)), 0);
    int n_lines = 0;
    for (char *line = strtok(out, "\n"); line; line = strtok(NULL, "\n"), n_lines++) {
        json_t *j = json_loads(line, JSON_ALLOW_NUL, NULL);
        assert_non_null(j);
        const int idx = (int)json_integer_value(json_object_get(j, "index"));
        const char *text = json_string_value(json_object_get(j, "text"));
        const char *finish = json_string_value(json_object_get(j, "finish_reason"));
        if (idx < 4) {
            assert_non_null(text);
            if (strcmp(text, "yes!") != 0 && strcmp(text, "no!") != 0)
                fail_msg("line %d: '%s' is not in the grammar's language", idx, text);
            assert_string_equal(finish, "stop");
        } else if (idx == 4) {
            const char *e = json_string_value(json_object_get(j, "error"));
            assert_non_null(e);
            assert_non_null(strstr(e, "unknown rule 'valu'"));
        } else {
            assert_non_null(text);
            assert_int_equal(text[0], '{');
        }
        json_decref(j);
    }
    assert_int_equal(n_lines, 6);
    remove(path);
}

static void test_batch_ctx_limit_and_kv_type(void **state) {
    (void)state;
    char path[4096], cmd[8192], out[8192];
    snprintf(path, sizeof(path), "%s/test_batch_ctx.jsonl", testutil_build_dir());
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs("{\"prompt\":[5,6,7],\"max_tokens\":4,\"temperature\":0,\"ignore_eos\":true}\n"
          "{\"prompt\":[5,6,7,8,9,10],\"max_tokens\":8,\"temperature\":0,\"ignore_eos\":true}\n", f);
    fclose(f);
    const char *m = testutil_path(testutil_build_dir(), "tests/models/llama-f32.gguf");
    snprintf(cmd, sizeof(cmd), "%s batch -m %s --prompts %s --ctx 10 --kv-type q8_0 -t 1 "
             "2>/dev/null", bin(), m, path);
    assert_int_equal(run(cmd, out, sizeof(out)), 0);
    assert_non_null(strstr(out, "{\"index\":0,\"text\""));
    assert_non_null(strstr(out, "\"finish_reason\":\"length\""));
    assert_non_null(strstr(out, "{\"index\":1,\"error\":\"the context is 10 tokens, but the "
                                "prompt has 6 and max_tokens asks for 8 more\"}"));
    snprintf(cmd, sizeof(cmd), "%s batch -m %s --prompts %s --kv-type int4 2>/dev/null", bin(), m,
             path);
    assert_int_equal(run(cmd, out, sizeof(out)), 2);
    remove(path);
}

/* Speculative decoding (batch --draft-n): the tokens are exactly those of
 * decoding one at a time, greedy and sampled (same seed, penalties, a stop
 * string), including when the KV pool is too small for every draft; from
 * [BOS] they are the README's greedy ids. Prompts that repeat themselves
 * make drafts that get accepted (the batch line's draft counters). */
static const char *const k_spec_lines[] = {
    "{\"prompt\": [1], \"max_tokens\": 31, \"temperature\": 0}",
    "{\"prompt\": \"Once upon a time, there was a little girl named Lily. She loved to play "
    "outside in the park. Once upon a time, there was a little girl named Lily. She loved to\", "
    "\"max_tokens\": 60, \"temperature\": 0}",
    "{\"prompt\": \"Tom had a red ball. Tom had a red ball. Tom had a red\", \"max_tokens\": 60, "
    "\"temperature\": 0}",
    "{\"prompt\": \"Tom had a red ball. Tom had a red ball. Tom had a red\", \"max_tokens\": 60, "
    "\"temperature\": 0.8, \"seed\": 7, \"repetition_penalty\": 1.1}",
    "{\"prompt\": \"The cat sat on the mat. The cat sat on the mat. The cat\", \"max_tokens\": 40, "
    "\"temperature\": 1.0, \"top_k\": 20, \"seed\": 3, \"stop\": [\"dog\"]}",
};
#define N_SPEC ((int)(sizeof(k_spec_lines) / sizeof(k_spec_lines[0])))

/* Runs batch with extra flags; fills ids[i] (a JSON array, owned) by index
 * and returns the draft_accepted counter of its stderr line (and its
 * draft_tokens in *drafted, when not NULL). */
static long long spec_run_drafted(const char *m, const char *prompts, const char *flags,
                                  json_t *ids[N_SPEC], long long *drafted) {
    char cmd[8192];
    const char *err = testutil_path(testutil_build_dir(), "tests/spec-batch.err");
    snprintf(cmd, sizeof(cmd), "%s batch -m %s --prompts %s -t 1 %s 2>%s", bin(), m, prompts,
             flags, err);
    static char out[1 << 16];
    assert_int_equal(run(cmd, out, sizeof(out)), 0);
    for (int i = 0; i < N_SPEC; i++) ids[i] = NULL;
    for (char *line = strtok(out, "\n"); line; line = strtok(NULL, "\n")) {
        json_t *j = json_loads(line, JSON_ALLOW_NUL, NULL);
        assert_non_null(j);
        int idx = (int)json_integer_value(json_object_get(j, "index"));
        assert_true(idx >= 0 && idx < N_SPEC);
        ids[idx] = json_incref(json_object_get(j, "token_ids"));
        assert_non_null(ids[idx]);
        json_decref(j);
    }
    char *e = testutil_read_file(err, NULL);
    assert_non_null(e);
    const char *c = strstr(e, "draft_accepted=");
    assert_non_null(c);
    long long accepted = atoll(c + strlen("draft_accepted="));
    const char *t = strstr(e, "draft_tokens=");
    assert_non_null(t);
    if (drafted) *drafted = atoll(t + strlen("draft_tokens="));
    free(e);
    return accepted;
}

static long long spec_run(const char *m, const char *prompts, const char *flags,
                          json_t *ids[N_SPEC]) {
    return spec_run_drafted(m, prompts, flags, ids, NULL);
}

/* ../shared/models/README.md: stories260K's 31 greedy ids after [BOS]
 * (k_spec_lines[0]'s answer). */
static void expect_readme_ids(json_t *ids) {
    static const int readme[31] = {403, 407, 261, 378, 432, 383, 286, 261, 376, 298, 315,
                                   421, 395, 317, 426, 338, 401, 396, 267, 337, 410, 408,
                                   419, 292, 411, 322, 265, 282, 295, 433, 426};
    assert_int_equal(json_array_size(ids), 31);
    for (int i = 0; i < 31; i++)
        assert_int_equal(json_integer_value(json_array_get(ids, (size_t)i)), readme[i]);
}

/* Writes lines [0, n) of k_spec_lines to a file; returns its path (static). */
static const char *spec_prompts(const char *name, int n) {
    static char path[4096];
    snprintf(path, sizeof(path), "%s", testutil_path(testutil_build_dir(), name));
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    for (int i = 0; i < n; i++) fprintf(f, "%s\n", k_spec_lines[i]);
    fclose(f);
    return path;
}

/* Speculative decoding with a draft model (batch --draft-model): the
 * tokens are exactly those without it, greedy and sampled with a seed. stories260K
 * drafting for itself is right at every greedy draft (its greedy choice is
 * what it then says: all accepted); its Q8_0 copy (llmserve quantize) and
 * a tiny draft pool that evicts change no token; a draft model of another
 * vocabulary (a synthetic 300-token one) is refused by name. Sampled
 * without a seed, drafts are sampled and kept by the general rule: all of
 * them, drafting for itself. */
static void test_batch_draft_model_exact(void **state) {
    (void)state;
    const char *shared = shared_or_skip();
    char m[4096], cmd[16384], out[8192];
    snprintf(m, sizeof(m), "%s/models/stories260K.gguf", shared);
    char q8[4096];  // testutil_path's buffers are reused: a copy
    snprintf(q8, sizeof(q8), "%s", testutil_path(testutil_build_dir(), "tests/spec-draft-q8_0.gguf"));
    snprintf(cmd, sizeof(cmd), "%s quantize %s %s Q8_0 >/dev/null 2>&1", bin(), m, q8);
    assert_int_equal(system(cmd), 0);
    json_t *ref[N_SPEC], *got[N_SPEC];
    char flags[8192];
    // Greedy lines only (0..2): every draft of the model itself is accepted.
    const char *greedy = spec_prompts("tests/spec-greedy.jsonl", 3);
    assert_int_equal(spec_run(m, greedy, "--max-seqs 1", ref), 0);
    snprintf(flags, sizeof(flags), "--max-seqs 4 --draft-model %s --draft-always", m);
    long long drafted = 0;
    long long accepted = spec_run_drafted(m, greedy, flags, got, &drafted);
    print_message("self-draft, greedy: %lld of %lld accepted\n", accepted, drafted);
    assert_true(drafted > 50);
    assert_int_equal(accepted, drafted);
    expect_readme_ids(got[0]);  // drafted, the README's ids still
    for (int i = 0; i < 3; i++) {
        assert_true(json_equal(got[i], ref[i]));
        json_decref(got[i]);
        json_decref(ref[i]);
    }
    // Every line, greedy and sampled, against decoding without drafts.
    const char *all = spec_prompts("tests/spec-prompts-dm.jsonl", N_SPEC);
    assert_int_equal(spec_run(m, all, "--max-seqs 1", ref), 0);
    expect_readme_ids(ref[0]);
    char tiny[8192];
    snprintf(tiny, sizeof(tiny), "--max-seqs 4 --draft-model %s --draft-always --draft-kv-blocks 6",
             q8);
    const char *runs[] = {flags, tiny, NULL};
    char q8flags[8192], policy[8192];
    snprintf(q8flags, sizeof(q8flags), "--max-seqs 1 --draft-model %s --draft-n 8 --draft-always",
             q8);
    snprintf(policy, sizeof(policy), "--max-seqs 2 --draft-model %s", q8);
    const char *more[] = {q8flags, policy};
    for (int r = 0; r < 4; r++) {
        const char *fl = r < 2 ? runs[r] : more[r - 2];
        accepted = spec_run_drafted(m, all, fl, got, &drafted);
        print_message("%s: %lld of %lld accepted\n", fl, accepted, drafted);
        if (r < 3) assert_true(accepted > 0);
        for (int i = 0; i < N_SPEC; i++) {
            assert_non_null(got[i]);
            assert_true(json_equal(got[i], ref[i]));
            json_decref(got[i]);
        }
    }
    for (int i = 0; i < N_SPEC; i++) json_decref(ref[i]);
    // Another vocabulary: refused, with both sizes named.
    const char *other = testutil_path(testutil_build_dir(), "tests/models/llama-f32.gguf");
    snprintf(cmd, sizeof(cmd), "%s batch -m %s --prompts %s --draft-model %s 2>&1", bin(), m, all,
             other);
    assert_int_equal(run(cmd, out, sizeof(out)), 1);
    assert_non_null(strstr(out, "another vocabulary than the model (512 and 300 tokens"));
    // The same size, one token apart: llama-tools-f32 is llama-f32 with its ids
    // 297..299 made control tokens (tests/models/meson.build).
    const char *tools = testutil_path(testutil_build_dir(), "tests/models/llama-tools-f32.gguf");
    snprintf(cmd, sizeof(cmd), "%s batch -m %s --prompts %s --draft-model %s 2>&1", bin(), other,
             all, tools);
    assert_int_equal(run(cmd, out, sizeof(out)), 1);
    assert_non_null(strstr(out, "(300 and 300 tokens; id 297 is"));
    assert_non_null(strstr(out, "and '<tool_call>' in the draft"));

    // Sampling without a seed drafts by sampling (the rejection rule against the
    // draft's distribution q): drafting for itself, q is the model's own p, so every
    // draft is kept (p / q = 1: with penalties too, since each draft token's q sees
    // the draft's tokens before it in the history, as p does at verification); with
    // a seed, drafts stay greedy and are kept only where the sample is the top
    // token. No token oracle without a seed: each line must still give
    // 1..max_tokens tokens.
    static const char *const unseeded[] = {
        "{\"prompt\": \"Tom had a red ball. Tom had a red\", \"max_tokens\": 60, "
        "\"temperature\": 0.8}",
        "{\"prompt\": \"The cat sat on the mat. The cat\", \"max_tokens\": 40, "
        "\"temperature\": 1.0, \"top_k\": 20}",
        "{\"prompt\": \"Once upon a time\", \"max_tokens\": 60, \"top_p\": 0.9}",
        "{\"prompt\": \"Tom had a red ball. Tom had a red\", \"max_tokens\": 60, "
        "\"temperature\": 0.9, \"presence_penalty\": 0.6, \"frequency_penalty\": 0.5, "
        "\"repetition_penalty\": 1.2}",
    };
    enum { N_UNSEEDED = sizeof(unseeded) / sizeof(unseeded[0]) };
    const int max_tokens[N_UNSEEDED] = {60, 40, 60, 60};
    for (int seeded = 0; seeded < 2; seeded++) {
        const char *path = testutil_path(testutil_build_dir(), "tests/spec-unseeded.jsonl");
        FILE *f = fopen(path, "w");
        assert_non_null(f);
        for (int i = 0; i < N_UNSEEDED; i++) {
            const size_t n = strlen(unseeded[i]);
            fprintf(f, "%.*s%s}\n", (int)(n - 1), unseeded[i], seeded ? ", \"seed\": 5" : "");
        }
        fclose(f);
        accepted = spec_run_drafted(m, path, flags, got, &drafted);
        print_message("self-draft, sampled, %s: %lld of %lld accepted\n",
                      seeded ? "seeded (greedy drafts)" : "unseeded (sampled drafts)", accepted,
                      drafted);
        assert_true(drafted > 20);
        if (seeded) {
            assert_true(accepted < drafted);
        } else {
            assert_int_equal(accepted, drafted);
        }
        for (int i = 0; i < N_UNSEEDED; i++) {
            assert_true(json_is_array(got[i]));
            assert_true(json_array_size(got[i]) >= 1 &&
                        json_array_size(got[i]) <= (size_t)max_tokens[i]);
            json_decref(got[i]);
        }
    }
    remove(q8);
}

static void test_batch_draft_exact(void **state) {
    (void)state;
    const char *shared = shared_or_skip();
    char m[4096];
    snprintf(m, sizeof(m), "%s/models/stories260K.gguf", shared);
    const char *prompts = testutil_path(testutil_build_dir(), "tests/spec-prompts.jsonl");
    FILE *f = fopen(prompts, "w");
    assert_non_null(f);
    for (int i = 0; i < N_SPEC; i++) fprintf(f, "%s\n", k_spec_lines[i]);
    fclose(f);
    json_t *ref[N_SPEC], *got[N_SPEC];
    assert_int_equal(spec_run(m, prompts, "--max-seqs 1", ref), 0);
    expect_readme_ids(ref[0]);
    // --draft-always: every possible draft is verified (the timing policy
    // would turn drafting off for this tiny model); the last run has the policy.
    const char *flags[] = {"--max-seqs 1 --draft-n 4 --draft-always",
                           "--max-seqs 1 --draft-n 16 --draft-always", "--draft-n 3 --draft-always",
                           "--max-seqs 2 --draft-n 8 --kv-blocks 14 --draft-always",
                           "--max-seqs 1 --draft-n 4"};
    for (int k = 0; k < 5; k++) {
        long long accepted = spec_run(m, prompts, flags[k], got);
        print_message("%s: %lld draft tokens accepted\n", flags[k], accepted);
        if (k < 4) assert_true(accepted > 0);
        for (int i = 0; i < N_SPEC; i++) {
            assert_non_null(got[i]);
            assert_true(json_equal(got[i], ref[i]));
            json_decref(got[i]);
        }
    }
    for (int i = 0; i < N_SPEC; i++) json_decref(ref[i]);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_generate_stories260k_prints_reference_ids),
        cmocka_unit_test(test_generate_lora_matches_reference_greedy),
        cmocka_unit_test(test_generate_stories260k_continues_prompt_ids),
        cmocka_unit_test(test_generate_rejects_bad_input),
        cmocka_unit_test(test_generate_synthetic_model_prints_n_ids),
        cmocka_unit_test(test_generate_stories260k_text_prompt),
        cmocka_unit_test(test_generate_seed_reproducible),
        cmocka_unit_test(test_tokenize_detokenize_round_trip),
        cmocka_unit_test(test_generate_rejects_bad_text),
        cmocka_unit_test(test_generate_ctx_limit),
        cmocka_unit_test(test_generate_kv_types),
        cmocka_unit_test(test_batch_grammar),
        cmocka_unit_test(test_batch_ctx_limit_and_kv_type),
        cmocka_unit_test(test_batch_draft_exact),
        cmocka_unit_test(test_batch_draft_model_exact),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
