/*
 * test_tp.c - `llmserve generate` and `llmserve serve` under tensor
 * parallelism, as a user runs them: `mpirun -np N llmserve ... --tp N` on
 * this machine (loopback TCP). Oracles: the greedy ids of stories260K in
 * ../shared/models/README.md and the README's text; for the synthetic
 * models, the single-process run (no slices, no allreduce: another code
 * path through the same kernels). Built and run only with MPI
 * (tests/integration/meson.build); LLMSERVE_MPIRUN is mpirun and its flags.
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

#include "tests/helpers/testutil.h"
#include "tests/integration/httptest.h"

/* Runs cmd, captures stdout into out (size n); returns the exit status. */
static int run(const char *cmd, char *out, size_t n) {
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    size_t got = fread(out, 1, n - 1, p);
    out[got] = '\0';
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static const char *mpirun(void) {
    const char *m = getenv("LLMSERVE_MPIRUN");
    assert_non_null(m);
    return m;
}

static const char *stories_or_skip(void) {
    static char path[4096];
    const char *shared = testutil_shared_dir();
    if (!shared) {
        print_message("skipped: ../shared is absent (stories260K.gguf)\n");
        skip();
    }
    snprintf(path, sizeof(path), "%s/models/stories260K.gguf", shared);
    return path;
}

/* ../shared/models/README.md, section A: the greedy continuation of [BOS],
 * at TP 2 and 4 (stories260K has 4 kv heads). */
static void test_tp_generate_stories260k_prints_reference_ids(void **state) {
    (void)state;
    const char *model = stories_or_skip();
    for (int n = 2; n <= 4; n += 2) {
        char cmd[8192], out[4096];
        snprintf(cmd, sizeof(cmd), "%s -np %d %s generate -m %s --prompt-ids 1 -n 31 -t 1 --tp %d",
                 mpirun(), n, httptest_bin(), model, n);
        assert_int_equal(run(cmd, out, sizeof(out)), 0);
        assert_string_equal(out,
                            "403 407 261 378 432 383 286 261 376 298 315 421 395 317 426 338 401 "
                            "396 267 337 410 408 419 292 411 322 265 282 295 433 426\n");
    }
}

/* Synthetic models: the same greedy ids as one process, for 24 tokens past a
 * 9-token prompt (prefill and decode both sharded). */
static void check_same_ids(const char *name, int n_ranks) {
    const char *model = httptest_model(name);
    char cmd[8192], one[4096], split[4096];
    snprintf(cmd, sizeof(cmd),
             "%s generate -m %s --prompt-ids 5,17,3,250,9,88,1,42,7 -n 24 "
             "--ignore-eos -t 1",
             httptest_bin(), model);
    assert_int_equal(run(cmd, one, sizeof(one)), 0);
    snprintf(cmd, sizeof(cmd),
             "%s -np %d %s generate -m %s --prompt-ids 5,17,3,250,9,88,1,42,7 "
             "-n 24 --ignore-eos -t 1 --tp %d",
             mpirun(), n_ranks, httptest_bin(), model, n_ranks);
    assert_int_equal(run(cmd, split, sizeof(split)), 0);
    print_message("%s tp=%d: %s", name, n_ranks, split);
    assert_string_equal(split, one);
}

static void test_tp_generate_synthetic_same_ids_as_one_process(void **state) {
    (void)state;
    check_same_ids("llama-kv4-q8_0", 2);
    check_same_ids("llama-kv4-q8_0", 4);
    check_same_ids("llama-kv4-f32", 4);
    check_same_ids("qwen2-f32", 2);
}

/* A job of another size than --tp, and a model --tp does not divide: exit 1
 * with a message that says what to do. */
static void test_tp_generate_refuses_wrong_sizes(void **state) {
    (void)state;
    char cmd[8192], out[4096];
    snprintf(cmd, sizeof(cmd), "%s generate -m %s --prompt-ids 1 -n 2 --tp 2 2>&1 >/dev/null",
             httptest_bin(), httptest_model("llama-f32"));
    assert_int_equal(run(cmd, out, sizeof(out)), 1);
    assert_non_null(strstr(out, "mpirun -np 2"));
    snprintf(cmd, sizeof(cmd),
             "%s -np 4 %s generate -m %s --prompt-ids 1 -n 2 --tp 4 2>&1 "
             ">/dev/null",
             mpirun(), httptest_bin(), httptest_model("llama-f32"));
    assert_int_not_equal(run(cmd, out, sizeof(out)), 0);
    assert_non_null(strstr(out, "2 kv heads to be a multiple of 4"));
}

/* serve --tp 2: /health answers, a greedy completion is the README's text
 * (the single-process `generate -p "Once upon a time" -n 30 --temp 0`), and
 * SIGTERM ends the job. */
static void test_tp_serve_completion_matches_one_process(void **state) {
    (void)state;
    const char *model = stories_or_skip();
    char launch[2048];
    snprintf(launch, sizeof(launch), "%s -np 2", mpirun());
    setenv("LLMSERVE_LAUNCH", launch, 1);
    struct httptest_server s;
    httptest_start(&s, model, "--tp 2");
    unsetenv("LLMSERVE_LAUNCH");
    struct httptest_resp r;
    assert_int_equal(httptest_request(s.port, "POST", "/v1/completions", NULL,
                                      "{\"prompt\": \"Once upon a time\", \"max_tokens\": 30, "
                                      "\"temperature\": 0}",
                                      &r),
                     200);
    char *text = httptest_json_str(r.body, "text");
    assert_non_null(text);
    assert_string_equal(text,
                        ", there was a little girl named Lily. She loved to play outside "
                        "in the park. One day,");
    free(text);
    httptest_resp_free(&r);
    httptest_stop(&s, SIGTERM);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tp_generate_stories260k_prints_reference_ids),
        cmocka_unit_test(test_tp_generate_synthetic_same_ids_as_one_process),
        cmocka_unit_test(test_tp_generate_refuses_wrong_sizes),
        cmocka_unit_test(test_tp_serve_completion_matches_one_process),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
