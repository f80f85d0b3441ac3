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
#include <errno.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cmocka.h>

#include "tests/helpers/testutil.h"
#include "tests/integration/httptest.h"

/* stories260K's greedy ids after BOS (`generate --prompt-ids 1 -n 31`), as
 * its README and llama2.c give them, one line. */
#define STORIES_README_IDS                                                                 \
    "403 407 261 378 432 383 286 261 376 298 315 421 395 317 426 338 401 396 267 337 410 " \
    "408 419 292 411 322 265 282 295 433 426\n"

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

/* The server a test has running, stopped by the teardown when an assertion
 * fails before the test's own stop: else the mpirun job outlives the test. */
static struct httptest_server *live;

static int stop_live(void **state) {
    (void)state;
    if (live) httptest_stop(live, SIGTERM);
    live = NULL;
    return 0;
}

/* serve on model under `mpirun -np n_ranks` with flags (the split); the
 * teardown stop_live stops it if the test fails first. */
static void start_job(struct httptest_server *s, const char *model, int n_ranks,
                      const char *flags) {
    char launch[2048];
    snprintf(launch, sizeof(launch), "%s -np %d", mpirun(), n_ranks);
    setenv("LLMSERVE_LAUNCH", launch, 1);
    httptest_start(s, model, flags);
    live = s;
    unsetenv("LLMSERVE_LAUNCH");
}

/* The README's greedy completion of "Once upon a time" (the single-process
 * `generate -p "Once upon a time" -n 30 --temp 0`); returns its prompt tokens. */
static long long check_readme_completion(int port) {
    struct httptest_resp r;
    assert_int_equal(httptest_request(port, "POST", "/v1/completions", NULL,
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
    const long long n_prompt = httptest_json_int(r.body, "prompt_tokens", -1);
    assert_true(n_prompt > 0);
    httptest_resp_free(&r);
    return n_prompt;
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
        assert_string_equal(out, STORIES_README_IDS);
    }
}

/* Pipeline parallelism: the same README ids at PP 2 (stories260K's 5 layers
 * as 2 + 3) and PP 4 (1 + 1 + 1 + 2). */
static void test_pp_generate_stories260k_prints_reference_ids(void **state) {
    (void)state;
    const char *model = stories_or_skip();
    for (int n = 2; n <= 4; n += 2) {
        char cmd[8192], out[4096];
        snprintf(cmd, sizeof(cmd), "%s -np %d %s generate -m %s --prompt-ids 1 -n 31 -t 1 --pp %d",
                 mpirun(), n, httptest_bin(), model, n);
        assert_int_equal(run(cmd, out, sizeof(out)), 0);
        assert_string_equal(out, STORIES_README_IDS);
    }
}

/* Synthetic models: the same greedy ids as one process, for 24 tokens past a
 * 9-token prompt (prefill and decode both sharded). */
/* flags: the split ("--tp 2", "--tp 2 --pp 2"), over n_ranks ranks; ids: the
 * prompt (check_same_ids: 9 tokens). */
static void check_same_ids_of(const char *name, const char *flags, int n_ranks,
                              const char *ids) {
    const char *model = httptest_model(name);
    char cmd[8192], one[4096], split[4096];
    snprintf(cmd, sizeof(cmd), "%s generate -m %s --prompt-ids %s -n 24 --ignore-eos -t 1",
             httptest_bin(), model, ids);
    assert_int_equal(run(cmd, one, sizeof(one)), 0);
    snprintf(cmd, sizeof(cmd),
             "%s -np %d %s generate -m %s --prompt-ids %s -n 24 --ignore-eos -t 1 %s",
             mpirun(), n_ranks, httptest_bin(), model, ids, flags);
    assert_int_equal(run(cmd, split, sizeof(split)), 0);
    print_message("%s %s: %s", name, flags, split);
    assert_string_equal(split, one);
}

static void check_same_ids(const char *name, const char *flags, int n_ranks) {
    check_same_ids_of(name, flags, n_ranks, "5,17,3,250,9,88,1,42,7");
}

/* A 70-token prompt as comma-separated ids, into ids (size >= 400). */
static void long_prompt_ids(char *ids, size_t size) {
    size_t n = 0;
    for (int i = 0; i < 70; i++) {
        n += (size_t)snprintf(ids + n, size - n, "%s%d", i ? "," : "", 3 + (i * 37) % 290);
        assert_true(n < size);
    }
}

/* Sequence parallelism: a 70-token prompt's prefill split over 2 and 4 ranks
 * (forward.c: at least 16 tokens per rank; the K/V of every layer shared),
 * its decode steps run whole on every rank: the same ids as one process.
 * And stories260K's README ids at SP 2 (a 1-token prompt: never split). */
/* SP's models against one process, with `extra` after the --sp flag: the
 * 70-token prompt split at SP 2 and 4 (a quantized model, a sliding window
 * over the shared or divided K/V), a 9-token one run whole on each rank. */
static void check_sp_same_ids(const char *extra) {
    char ids[1024], flags[2][64];
    long_prompt_ids(ids, sizeof(ids));
    for (int i = 0; i < 2; i++) snprintf(flags[i], sizeof(flags[i]), "--sp %d%s", 2 + 2 * i, extra);
    check_same_ids_of("llama-kv4-q8_0", flags[0], 2, ids);
    check_same_ids_of("llama-f32", flags[0], 2, ids);
    check_same_ids_of("qwen2-f32", flags[1], 4, ids);
    check_same_ids_of("llama-swa", flags[1], 4, ids);
    check_same_ids("llama-f32", flags[0], 2);
}

static void test_sp_generate_same_ids_as_one_process(void **state) {
    (void)state;
    check_sp_same_ids("");
    const char *model = stories_or_skip();
    char cmd[8192], out[4096];
    snprintf(cmd, sizeof(cmd), "%s -np 2 %s generate -m %s --prompt-ids 1 -n 31 -t 1 --sp 2",
             mpirun(), httptest_bin(), model);
    assert_int_equal(run(cmd, out, sizeof(out)), 0);
    assert_string_equal(out, STORIES_README_IDS);
}

/* The KV pool divided over the SP ranks (--sp-divide-kv): the same ids as
 * one process, for the 70-token prompt (its prefill split, the partials of
 * every layer combined by a reduce-scatter) and its decode steps (run whole on
 * every rank, combined by two allreduces a layer), at SP 2 and 4; stories260K's
 * README ids at SP 2. What that costs is counted by hand: stories260K has 5
 * layers of 8 heads of 8 dims, so a decode step of 1 token has each rank hand
 * 5 x (8 maxima + 8 x (8 + 1) sums) floats = 1,600 bytes to the allreduces,
 * and the 31 steps of `--prompt-ids 1 -n 31` (1 prefill token, 30 decodes)
 * 49,600 bytes more than the undivided job. */
static void test_sp_divided_generate_same_ids_as_one_process(void **state) {
    (void)state;
    check_sp_same_ids(" --sp-divide-kv");
    const char *model = stories_or_skip();
    long long bytes[2];
    for (int divided = 0; divided < 2; divided++) {
        // The ids on stdout; stderr, with rank 0's "mpi: ... handed N bytes" line,
        // into a file of its own (mixed in one pipe, mpirun may interleave them).
        char err_path[] = "/tmp/llmserve-test-tp-XXXXXX";
        const int fd = mkstemp(err_path);
        assert_true(fd >= 0);
        close(fd);
        char cmd[8192], out[4096];
        snprintf(cmd, sizeof(cmd),
                 "%s -np 2 %s generate -m %s --prompt-ids 1 -n 31 -t 1 --sp 2 %s 2>%s",
                 mpirun(), httptest_bin(), model, divided ? "--sp-divide-kv" : "", err_path);
        assert_int_equal(run(cmd, out, sizeof(out)), 0);
        char *err = testutil_read_file(err_path, NULL);
        unlink(err_path);
        assert_non_null(err);
        const char *handed = strstr(err, "rank 0 handed ");
        if (handed) bytes[divided] = atoll(handed + strlen("rank 0 handed "));
        free(err);
        assert_non_null(handed);
        assert_true(bytes[divided] > 0);
        assert_string_equal(out, STORIES_README_IDS);
    }
    print_message("sp 2, rank 0: %lld bytes whole, %lld divided\n", bytes[0], bytes[1]);
    assert_int_equal(bytes[1] - bytes[0], 31 * 5 * (8 + 8 * 9) * 4);
}

/* A greedy completion of prompt (n tokens) by the server on port is the
 * single process's: a plain `generate` of model asked here. Returns the
 * prompt's tokens. */
static long long check_one_process_text(int port, const char *model, const char *prompt, int n) {
    char cmd[8192], want[4096];
    snprintf(cmd, sizeof(cmd), "%s generate -m %s -p '%s' -n %d --temp 0 -t 1 2>/dev/null",
             httptest_bin(), model, prompt, n);
    assert_int_equal(run(cmd, want, sizeof(want)), 0);
    size_t n_want = strlen(want);
    if (n_want > 0 && want[n_want - 1] == '\n') want[n_want - 1] = '\0';  // generate's own
    char body[1024];
    snprintf(body, sizeof(body),
             "{\"prompt\": \"%s\", \"max_tokens\": %d, \"temperature\": 0}", prompt, n);
    struct httptest_resp r;
    assert_int_equal(httptest_request(port, "POST", "/v1/completions", NULL, body, &r), 200);
    const long long n_prompt = httptest_json_int(r.body, "prompt_tokens", -1);
    char *text = httptest_json_str(r.body, "text");
    assert_non_null(text);
    assert_string_equal(text, want);
    free(text);
    httptest_resp_free(&r);
    return n_prompt;
}

/* serve --sp 2: the README's greedy completion text of a prompt long enough
 * to be split (the story's first 40 or so tokens as the prompt, then its
 * continuation), and both ranks report. */
static void test_sp_serve_completion_matches_one_process(void **state) {
    (void)state;
    const char *model = stories_or_skip();
    struct httptest_server s;
    start_job(&s, model, 2, "--sp 2");
    struct httptest_resp r;
    check_readme_completion(s.port);
    // The same text as a prompt of 33 tokens or more (split over the 2 ranks): the one
    // process's continuation of it.
    const char *longp = "Once upon a time, there was a little girl named Lily. She loved to "
                        "play outside in the park. One day,";
    const long long n_prompt = check_one_process_text(s.port, model, longp, 20);
    print_message("sp 2: a %lld-token prompt\n", n_prompt);
    assert_true(n_prompt >= 32);
    assert_int_equal(httptest_request(s.port, "GET", "/health", NULL, NULL, &r), 200);
    assert_true(httptest_json_int(r.body, "n_ranks", 0) == 2);
    httptest_resp_free(&r);
    live = NULL;
    httptest_stop(&s, SIGTERM);
}

/* serve --sp 2 --sp-divide-kv: the README's text and a split prompt's
 * one-process continuation, and the pool is twice one rank's: stories260K's
 * f16 block is 2 (K, V) x 5 layers x 4 kv heads x 8 dims x 16 tokens x 2
 * bytes = 10,240 bytes, so 1 MiB holds 102 blocks; a rank holds one id in 2,
 * so 204 ids, of which the null block is one: 203 (whole on each rank: 102). */
static void test_sp_divided_serve_matches_one_process(void **state) {
    (void)state;
    const char *model = stories_or_skip();
    struct httptest_server s;
    start_job(&s, model, 2, "--sp 2 --sp-divide-kv --kv-memory 1M");
    check_readme_completion(s.port);
    const char *longp = "Once upon a time, there was a little girl named Lily. She loved to "
                        "play outside in the park. One day,";
    assert_true(check_one_process_text(s.port, model, longp, 20) >= 32);
    // Twice (the prefix cache): the second request's prompt blocks come from it.
    assert_true(check_one_process_text(s.port, model, longp, 20) >= 32);
    assert_int_equal(httptest_get_metric(s.port, "llmserve_kv_blocks_total"), 203);
    live = NULL;
    httptest_stop(&s, SIGTERM);
}

/* A 70-token prompt: its prefill runs as micro-batches through the stages
 * (forward.c: 16 tokens at least each, up to 2 per stage), the same ids as
 * one process. */
static void test_pp_micro_batches_same_ids_as_one_process(void **state) {
    (void)state;
    char ids[1024];
    long_prompt_ids(ids, sizeof(ids));
    check_same_ids_of("llama-kv4-q8_0", "--pp 2", 2, ids);
    check_same_ids_of("llama-f32", "--pp 2", 2, ids);
    check_same_ids_of("llama-kv4-f32", "--tp 2 --pp 2", 4, ids);
    check_same_ids_of("qwen2-f32", "--tp 2 --pp 2", 4, ids);
}

static void test_tp_generate_synthetic_same_ids_as_one_process(void **state) {
    (void)state;
    check_same_ids("llama-kv4-q8_0", "--tp 2", 2);
    check_same_ids("llama-kv4-q8_0", "--tp 4", 4);
    check_same_ids("llama-kv4-f32", "--tp 4", 4);
    check_same_ids("qwen2-f32", "--tp 2", 2);
}

/* Adapters under each split: `generate --lora` gives the ids of one process
 * with the same adapter (which is itself checked against the numpy merge in
 * tests/engine/test_lora.c), and they are not the base model's. One per
 * format: PEFT LoRA on every projection, a GGUF LoRA on layer 1 only (so
 * stage 0 of a pipeline holds none of it), a bottleneck adapter. */
static void test_lora_generate_same_ids_as_one_process(void **state) {
    (void)state;
    const char *model = httptest_model("llama-f32");
    char ids[1024];
    long_prompt_ids(ids, sizeof(ids));  // 70 tokens: a prefill SP 2 splits
    const char *adapters[] = {"llama-peft", "llama-gguf-f16", "llama-bn"};
    const char *splits[][2] = {{"--tp 2", "2"}, {"--pp 2", "2"}, {"--tp 2 --pp 2", "4"},
                               {"--sp 2", "2"}};
    char cmd[8192], base[4096], one[4096], split[4096], path[4096];
    snprintf(cmd, sizeof(cmd), "%s generate -m %s --prompt-ids %s -n 24 --ignore-eos -t 1",
             httptest_bin(), model, ids);
    assert_int_equal(run(cmd, base, sizeof(base)), 0);
    for (size_t a = 0; a < sizeof(adapters) / sizeof(adapters[0]); a++) {
        testutil_adapter_path(adapters[a], path, sizeof(path));
        snprintf(cmd, sizeof(cmd),
                 "%s generate -m %s --prompt-ids %s -n 24 --ignore-eos -t 1 --lora x=%s",
                 httptest_bin(), model, ids, path);
        assert_int_equal(run(cmd, one, sizeof(one)), 0);
        if (strcmp(one, base) == 0) fail_msg("%s does not change the ids", adapters[a]);
        for (size_t k = 0; k < sizeof(splits) / sizeof(splits[0]); k++) {
            snprintf(cmd, sizeof(cmd),
                     "%s -np %s %s generate -m %s --prompt-ids %s -n 24 --ignore-eos -t 1 "
                     "--lora x=%s %s",
                     mpirun(), splits[k][1], httptest_bin(), model, ids, path, splits[k][0]);
            assert_int_equal(run(cmd, split, sizeof(split)), 0);
            print_message("%s %s: %s", adapters[a], splits[k][0], split);
            assert_string_equal(split, one);
        }
    }
}

/* The greedy text of 16 tokens after [1,5,6,7,8] under adapter `model` (NULL:
 * the base), from the server on port; owned by the caller (U+0000 made
 * U+0001: httptest_no_nul). */
static char *lora_completion(int port, const char *model) {
    char body[512];
    snprintf(body, sizeof(body),
             "{%s%s%s\"prompt\":[1,5,6,7,8],\"max_tokens\":16,\"temperature\":0,"
             "\"ignore_eos\":true}",
             model ? "\"model\":\"" : "", model ? model : "", model ? "\"," : "");
    struct httptest_resp r;
    assert_int_equal(httptest_request(port, "POST", "/v1/completions", NULL, body, &r), 200);
    httptest_no_nul(r.body);
    char *text = httptest_json_str(r.body, "text");
    assert_non_null(text);
    httptest_resp_free(&r);
    return text;
}

/* The requests of the served-adapter test on port, their texts into out[5]:
 * a (--lora), the base, b loaded at run time, then a and b again. With one
 * adapter slot every change of adapter evicts the other, so the slot is
 * filled again (and its adapter sent to the ranks again) four times. */
static void lora_requests(int port, const char *b_path, char **out) {
    char body[4096];
    snprintf(body, sizeof(body), "{\"lora_name\":\"b\",\"lora_path\":\"%s\"}", b_path);
    out[0] = lora_completion(port, "a");
    out[1] = lora_completion(port, NULL);
    struct httptest_resp r;
    assert_int_equal(httptest_request(port, "POST", "/v1/load_lora_adapter", NULL, body, &r),
                     200);
    httptest_resp_free(&r);
    out[2] = lora_completion(port, "b");
    out[3] = lora_completion(port, "a");
    out[4] = lora_completion(port, "b");
    assert_int_equal(httptest_request(port, "GET", "/metrics", NULL, NULL, &r), 200);
    assert_true(httptest_metric(r.body, "llmserve_lora_slot_loads_total") == 4.0);
    assert_true(httptest_metric(r.body, "llmserve_lora_slot_evictions_total") == 3.0);
    httptest_resp_free(&r);
}

/* serve with adapters under TP 2 and TP 2 x PP 2: an adapter of --lora and one
 * loaded at run time through /v1/load_lora_adapter (read on rank 0 alone,
 * inside --lora-dir) give the texts the one-process server gives, the base
 * model's stays the base model's, and the adapters change the text. */
static void test_tp_serve_lora_matches_one_process(void **state) {
    (void)state;
    const char *model = httptest_model("llama-f32");
    char a_path[4096], args[8192];
    testutil_adapter_path("llama-peft", a_path, sizeof(a_path));
    const char *b_path = "models/llama-bn";  // inside --lora-dir
    snprintf(args, sizeof(args),
             "--lora a=%s --allow-runtime-lora --lora-dir %s/tests --max-loras 1 -t 1", a_path,
             testutil_build_dir());
    struct httptest_server s;
    char *want[5], *got[5];
    httptest_start(&s, model, args);
    live = &s;
    lora_requests(s.port, b_path, want);
    live = NULL;
    httptest_stop(&s, SIGTERM);
    assert_string_not_equal(want[0], want[1]);
    assert_string_not_equal(want[2], want[1]);
    assert_string_not_equal(want[0], want[2]);
    assert_string_equal(want[0], want[3]);
    assert_string_equal(want[2], want[4]);
    const char *splits[][3] = {{"--tp 2", "2"}, {"--tp 2 --pp 2", "4"}};
    for (size_t k = 0; k < sizeof(splits) / sizeof(splits[0]); k++) {
        char job_args[8448];
        snprintf(job_args, sizeof(job_args), "%s %s", args, splits[k][0]);
        start_job(&s, model, atoi(splits[k][1]), job_args);
        lora_requests(s.port, b_path, got);
        live = NULL;
        httptest_stop(&s, SIGTERM);
        for (int i = 0; i < 5; i++) {
            print_message("%s request %d: %s\n", splits[k][0], i,
                          strcmp(got[i], want[i]) == 0 ? "same text" : "DIFFERENT");
            assert_string_equal(got[i], want[i]);
            free(got[i]);
        }
    }
    for (int i = 0; i < 5; i++) free(want[i]);
}

/* Two stages of one layer each (the synthetic models have 2 layers). */
static void test_pp_generate_synthetic_same_ids_as_one_process(void **state) {
    (void)state;
    check_same_ids("llama-kv4-q8_0", "--pp 2", 2);
    check_same_ids("llama-f32", "--pp 2", 2);
    check_same_ids("qwen2-f32", "--pp 2", 2);
}

/* TP x PP: two stages of two TP ranks each (job ranks 0-1 stage 0, 2-3 stage 1). */
static void test_tpxpp_generate_synthetic_same_ids_as_one_process(void **state) {
    (void)state;
    check_same_ids("llama-kv4-q8_0", "--tp 2 --pp 2", 4);
    check_same_ids("llama-kv4-f32", "--tp 2 --pp 2", 4);
    check_same_ids("qwen2-f32", "--tp 2 --pp 2", 4);
}

/* stories260K at TP 2 x PP 2 (layers 2 + 3, 2 kv heads per rank): the README ids. */
static void test_tpxpp_generate_stories260k_prints_reference_ids(void **state) {
    (void)state;
    const char *model = stories_or_skip();
    char cmd[8192], out[4096];
    snprintf(cmd, sizeof(cmd),
             "%s -np 4 %s generate -m %s --prompt-ids 1 -n 31 -t 1 --tp 2 --pp 2", mpirun(),
             httptest_bin(), model);
    assert_int_equal(run(cmd, out, sizeof(out)), 0);
    assert_string_equal(out, STORIES_README_IDS);
}

/* Each rank's "rank R of N read B bytes of tensor data" (model.c, at info)
 * in the job's output, against scripts/shard-bytes, which works the slices
 * out from the file and shard.h's description alone. */
static void check_rank_reads(const char *model, const char *flags, int n_ranks) {
    char cmd[8192], got[65536], want[4096];
    snprintf(cmd, sizeof(cmd), "/usr/bin/python3 %s/scripts/shard-bytes %s %s",
             testutil_source_dir(), model, flags);
    assert_int_equal(run(cmd, want, sizeof(want)), 0);
    snprintf(cmd, sizeof(cmd),
             "%s -np %d %s generate -m %s --prompt-ids 1,2,3 -n 2 -t 1 %s --log-level info "
             "2>&1 >/dev/null",
             mpirun(), n_ranks, httptest_bin(), model, flags);
    assert_int_equal(run(cmd, got, sizeof(got)), 0);
    const char *w = want;
    for (int r = 0; r < n_ranks; r++) {
        int wr = -1;
        long long wb = -1;
        int used = 0;
        assert_int_equal(sscanf(w, "%d %lld\n%n", &wr, &wb, &used), 2);
        assert_int_equal(wr, r);
        w += used;
        char needle[128];
        snprintf(needle, sizeof(needle), "rank %d of %d read ", r, n_ranks);
        const char *line = strstr(got, needle);
        if (!line) fail_msg("no line '%s' in:\n%s", needle, got);
        long long gb = atoll(line + strlen(needle));
        print_message("%s %s: rank %d read %lld bytes, shard-bytes %lld\n", model, flags, r,
                      gb, wb);
        assert_int_equal(gb, wb);
    }
}

static void test_parallel_ranks_read_only_their_slices(void **state) {
    (void)state;
    check_rank_reads(httptest_model("llama-kv4-q8_0"), "--tp 2", 2);
    check_rank_reads(httptest_model("llama-kv4-q8_0"), "--tp 4", 4);
    check_rank_reads(httptest_model("llama-q8_0"), "--tp 2", 2);
    check_rank_reads(httptest_model("qwen2-f32"), "--tp 2", 2);
    check_rank_reads(httptest_model("llama-kv4-q8_0"), "--pp 2", 2);
    // tied: stage 0 reads its rows of the one tensor for the embedding, the last stage
    // the same rows for the classifier
    check_rank_reads(httptest_model("llama-kv4-tied-v301"), "--pp 2", 2);
    check_rank_reads(httptest_model("llama-kv4-tied-v301"), "--tp 2 --pp 2", 4);
    const char *shared = testutil_shared_dir();
    if (shared) {
        char stories[4096];
        snprintf(stories, sizeof(stories), "%s/models/stories260K.gguf", shared);
        check_rank_reads(stories, "--tp 4", 4);
        check_rank_reads(stories, "--pp 2", 2);
        check_rank_reads(stories, "--pp 4", 4);  // 5 layers: stages 1 and 2 read no rows
    }
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

/* A served job's figures after the README completion, whose prompt had p1
 * tokens: past the report interval (ENGINE_RANK_REPORT_MS) the next step
 * asks every rank for its figures, so a 1-token completion then makes each
 * rank's report count every step so far (rank 0's own figures are always
 * fresh). The steps are 1 prefill + 29 decodes (the first token comes from
 * the prefill) + 1 prefill, into *steps, and their tokens into *tokens.
 * The reply can come before the step that sent it has published its figures
 * (emit, then publish): /metrics is polled, boundedly, until rank 0 shows
 * the last step, into *metrics (the caller frees it). */
static void figures_after_readme(int port, long long p1, double *steps, double *tokens,
                                 struct httptest_resp *metrics) {
    httptest_sleep_ms(1100);
    struct httptest_resp r;
    assert_int_equal(httptest_request(port, "POST", "/v1/completions", NULL,
                                      "{\"prompt\": \"Lily\", \"max_tokens\": 1, "
                                      "\"temperature\": 0}",
                                      &r),
                     200);
    const long long p2 = httptest_json_int(r.body, "prompt_tokens", -1);
    assert_true(p2 > 0);
    httptest_resp_free(&r);
    *steps = 1 + 29 + 1;
    *tokens = (double)p1 + 29 + (double)p2;
    for (int i = 0; i < 200; i++) {
        assert_int_equal(httptest_request(port, "GET", "/metrics", NULL, NULL, metrics), 200);
        if (httptest_metric(metrics->body, "llmserve_rank_steps_total{rank=\"0\"}") == *steps) {
            return;
        }
        httptest_resp_free(metrics);
        httptest_sleep_ms(25);
    }
    fail_msg("rank 0 never showed %.0f steps", *steps);
}

/* serve --tp 2: /health answers, a greedy completion is the README's text
 * (the single-process `generate -p "Once upon a time" -n 30 --temp 0`),
 * /metrics and /health report both ranks, and SIGTERM ends the job. */
static void test_tp_serve_completion_matches_one_process(void **state) {
    (void)state;
    const char *model = stories_or_skip();
    struct httptest_server s;
    start_job(&s, model, 2, "--tp 2");
    struct httptest_resp r;
    const long long p1 = check_readme_completion(s.port);
    double steps, tokens;
    figures_after_readme(s.port, p1, &steps, &tokens, &r);

    // Oracles by hand: rank 1 hands (2 allreduces x 5 layers + 1 for the embedding's
    // vocabulary rows) x 64 floats x 4 bytes per forward token to the collectives
    // (stories260K: ../shared/models/README.md), and per step the logits of its 256 of
    // the 512 vocabulary rows for the one row that wants them (gathered on rank 0), plus
    // a few ints of agreement and its 48-byte reports.
    const double allreduce_bytes = (2.0 * 5 + 1) * 64 * 4 * tokens;
    const double follower_bytes = allreduce_bytes + steps * 256 * 4;  // + its logits
    assert_non_null(r.body);
    assert_true(httptest_metric(r.body, "llmserve_ranks") == 2.0);
    for (int rank = 0; rank < 2; rank++) {
        char name[128];
        snprintf(name, sizeof(name), "llmserve_rank_steps_total{rank=\"%d\"}", rank);
        assert_true(httptest_metric(r.body, name) == steps);
        snprintf(name, sizeof(name), "llmserve_rank_forward_seconds_total{rank=\"%d\"}", rank);
        assert_true(httptest_metric(r.body, name) > 0.0);
        snprintf(name, sizeof(name), "llmserve_rank_peak_rss_bytes{rank=\"%d\"}", rank);
        assert_true(httptest_metric(r.body, name) > 1e6);  // a process, at least 1 MiB
    }
    const double comm1 = httptest_metric(r.body, "llmserve_rank_comm_bytes_total{rank=\"1\"}");
    print_message("rank 1: %.0f bytes to collectives, %.0f by hand + reports\n", comm1,
                  follower_bytes);
    assert_true(comm1 >= follower_bytes && comm1 <= follower_bytes + 1024);
    // rank 0 gathers the logits (sends none) and broadcasts every step's descriptor:
    // more than its allreduces
    assert_true(httptest_metric(r.body, "llmserve_rank_comm_bytes_total{rank=\"0\"}") >
                allreduce_bytes);
    httptest_resp_free(&r);
    assert_int_equal(httptest_request(s.port, "GET", "/health", NULL, NULL, &r), 200);
    assert_true(httptest_json_int(r.body, "n_ranks", 0) == 2);
    const char *rank1 = strstr(r.body, "\"rank\":1");
    assert_non_null(rank1);
    assert_true(httptest_json_int(rank1, "steps", -1) == (long long)steps);
    assert_true(httptest_json_int(rank1, "comm_bytes", -1) == (long long)comm1);
    // what rank 1 read from the file: scripts/shard-bytes' figure for it
    char cmd[8192], want[256];
    snprintf(cmd, sizeof(cmd), "/usr/bin/python3 %s/scripts/shard-bytes %s --tp 2 | sed -n 2p",
             testutil_source_dir(), model);
    assert_int_equal(run(cmd, want, sizeof(want)), 0);
    long long want1 = -1;
    assert_int_equal(sscanf(want, "1 %lld", &want1), 1);
    assert_true(httptest_json_int(rank1, "model_read_bytes", -1) == want1);
    const long long rss1 = httptest_json_int(rank1, "rss_bytes", -1);
    // a process, at least 1 MiB (not compared with the peak: the kernel updates
    // getrusage's high-water mark lazily, so it can trail the current figure)
    print_message("rank 1: rss %lld, peak %lld bytes\n", rss1,
                  httptest_json_int(rank1, "peak_rss_bytes", -1));
    assert_true(rss1 > 1000000);
    httptest_resp_free(&r);
    live = NULL;
    httptest_stop(&s, SIGTERM);
}

/* serve --pp 2: the README's greedy completion text, and both stages report. */
static void test_pp_serve_completion_matches_one_process(void **state) {
    (void)state;
    const char *model = stories_or_skip();
    struct httptest_server s;
    start_job(&s, model, 2, "--pp 2");
    struct httptest_resp r;
    check_readme_completion(s.port);
    assert_int_equal(httptest_request(s.port, "GET", "/health", NULL, NULL, &r), 200);
    assert_true(httptest_json_int(r.body, "n_ranks", 0) == 2);
    httptest_resp_free(&r);
    live = NULL;
    httptest_stop(&s, SIGTERM);
}

/* serve --tp 2 --pp 2: the README's greedy completion text, every rank
 * reports, and each follower's bytes handed to collectives are what the split
 * implies, by hand (stories260K: 5 layers of width 64, so stage 0 has layers
 * 0-1 and stage 1 layers 2-4): per forward token, 2 allreduces per layer of
 * its stage among its own stage's 2 ranks (64 floats x 4 bytes each), at
 * stage 0 one more for the embedding's vocabulary rows and the residual
 * stream it sends on to stage 1; per step at stage 1 (the classifier's) the
 * logits of the one row that wants them: rank 3 gives its 256 vocabulary
 * rows to rank 2, which sends all 512 to rank 0; plus a few ints of
 * agreement and the 48-byte reports. */
static void test_tpxpp_serve_completion_matches_one_process(void **state) {
    (void)state;
    const char *model = stories_or_skip();
    struct httptest_server s;
    start_job(&s, model, 4, "--tp 2 --pp 2");
    struct httptest_resp r;
    const long long p1 = check_readme_completion(s.port);
    double steps, tokens;
    figures_after_readme(s.port, p1, &steps, &tokens, &r);
    assert_non_null(r.body);
    assert_true(httptest_metric(r.body, "llmserve_ranks") == 4.0);
    const double row = 64 * 4;  // one token's residual stream, bytes
    const double want[4] = {0, (2 * 2 + 1 + 1) * row * tokens,
                            2 * 3 * row * tokens + steps * 512 * 4,
                            2 * 3 * row * tokens + steps * 256 * 4};
    for (int rank = 0; rank < 4; rank++) {
        char name[128];
        snprintf(name, sizeof(name), "llmserve_rank_steps_total{rank=\"%d\"}", rank);
        assert_true(httptest_metric(r.body, name) == steps);
        if (rank == 0) continue;  // rank 0 also broadcasts every step's descriptor
        snprintf(name, sizeof(name), "llmserve_rank_comm_bytes_total{rank=\"%d\"}", rank);
        const double got = httptest_metric(r.body, name);
        print_message("rank %d: %.0f bytes to collectives, %.0f by hand + reports\n", rank, got,
                      want[rank]);
        assert_true(got >= want[rank] && got <= want[rank] + 1024);
    }
    httptest_resp_free(&r);
    assert_int_equal(httptest_request(s.port, "GET", "/health", NULL, NULL, &r), 200);
    assert_true(httptest_json_int(r.body, "n_ranks", 0) == 4);
    httptest_resp_free(&r);
    live = NULL;
    httptest_stop(&s, SIGTERM);
}

/* The draft counters of /metrics once they stand still (a reply can come
 * before its step has published them: read until two reads 200 ms apart
 * agree, boundedly). */
static void draft_counts(int port, double *drafted, double *accepted) {
    double last = -1.0;
    for (int i = 0; i < 50; i++) {
        struct httptest_resp r;
        assert_int_equal(httptest_request(port, "GET", "/metrics", NULL, NULL, &r), 200);
        *drafted = httptest_metric(r.body, "llmserve_draft_tokens_total");
        *accepted = httptest_metric(r.body, "llmserve_draft_accepted_tokens_total");
        httptest_resp_free(&r);
        if (*drafted == last) return;
        last = *drafted;
        httptest_sleep_ms(200);
    }
    fail_msg("the draft counters never stood still");
}

/* The README's greedy text, n times in one request (n > 1 decodes the
 * choices side by side, so a step verifies the drafts of each). */
static void check_readme_choices(int port, int n) {
    static const char want[] = "\", there was a little girl named Lily. She loved to play "
                               "outside in the park. One day,\"";
    char body[256];
    snprintf(body, sizeof(body),
             "{\"prompt\": \"Once upon a time\", \"max_tokens\": 30, \"temperature\": 0, "
             "\"n\": %d}", n);
    struct httptest_resp r;
    assert_int_equal(httptest_request(port, "POST", "/v1/completions", NULL, body, &r), 200);
    int found = 0;
    for (const char *at = r.body; (at = strstr(at, want)) != NULL; at += sizeof(want) - 1) found++;
    assert_int_equal(found, n);
    httptest_resp_free(&r);
}

/* At SP 2, the first step of check_readme_choices(port, 2) verifies 16
 * drafts of each choice (the draft length before its costs are measured is
 * the room: 16 of the 29 tokens left), 34 tokens, so it is split: rank 1
 * computes 17 of them. By hand (stories260K: 5 layers, 4 KV heads of 8,
 * 512 tokens), it hands 5 x (K, V) x 17 x 32 floats of its K/V rows and
 * its 17 rows of 512 logits to the collectives, 4 bytes each; every later
 * step has 12 tokens or fewer (12 left), whole on each rank, and adds only
 * its few ints of report. The reports reach rank 0 with a step at most
 * once a second: one more request after a second, then /metrics. */
static void check_sp_split_verify(int port) {
    const double want = (5.0 * 2 * 17 * 32 + 17 * 512) * 4;
    httptest_sleep_ms(1100);
    struct httptest_resp r;
    assert_int_equal(httptest_request(port, "POST", "/v1/completions", NULL,
                                      "{\"prompt\": \"Lily\", \"max_tokens\": 1}", &r),
                     200);
    httptest_resp_free(&r);
    for (int i = 0; i < 200; i++) {
        assert_int_equal(httptest_request(port, "GET", "/metrics", NULL, NULL, &r), 200);
        const double got = httptest_metric(r.body, "llmserve_rank_comm_bytes_total{rank=\"1\"}");
        const double steps0 = httptest_metric(r.body, "llmserve_rank_steps_total{rank=\"0\"}");
        const double steps1 = httptest_metric(r.body, "llmserve_rank_steps_total{rank=\"1\"}");
        httptest_resp_free(&r);
        if (steps1 == steps0) {
            print_message("sp 2, rank 1: %.0f bytes to collectives, %.0f by hand + reports\n",
                          got, want);
            assert_true(got >= want && got <= want + 1024);
            return;
        }
        httptest_sleep_ms(25);
    }
    fail_msg("rank 1's report never caught up with rank 0");
}

/* Speculative decoding under every split (a draft model on rank 0 beside
 * the split model, or prompt lookup; the drafts are verified in one step
 * of the split model): the single process's greedy text. stories260K
 * drafting for itself gives its own greedy choice at every position, so
 * every draft is kept (the rejection rule for a point-mass draft equal to
 * the model's argmax); sampled without a seed, q is p up to the rounding of
 * the split's sums, so nearly every draft is kept (min(1, p/q)). At SP 2
 * with --draft-n 16, two choices' step of 2 x 17 tokens is split over the
 * ranks. Prompt lookup at TP 2 gives the single process's text of a prompt
 * that repeats itself. Every job runs with --draft-always: the policy
 * turns drafting off where steps with drafts are measured slower, which on
 * a loaded machine (ASan, a CI beside) left the sampled request with no
 * draft at all. */
static void test_spec_serve_under_every_split(void **state) {
    (void)state;
    const char *model = stories_or_skip();
    static const struct {
        const char *flags;
        int n_ranks, n_choices;
    } k_jobs[] = {
        {"--tp 2 --draft-model %s --draft-always", 2, 1},
        {"--pp 2 --draft-model %s --draft-always", 2, 1},
        {"--tp 2 --pp 2 --draft-model %s --draft-always", 4, 1},
        {"--sp 2 --draft-model %s --draft-n 16 --draft-always", 2, 2},
    };
    for (size_t j = 0; j < sizeof(k_jobs) / sizeof(k_jobs[0]); j++) {
        char flags[8192];
        snprintf(flags, sizeof(flags), k_jobs[j].flags, model);
        struct httptest_server s;
        start_job(&s, model, k_jobs[j].n_ranks, flags);
        check_readme_choices(s.port, k_jobs[j].n_choices);
        double drafted, accepted;
        draft_counts(s.port, &drafted, &accepted);
        print_message("%s: %.0f of %.0f drafts kept\n", k_jobs[j].flags, accepted, drafted);
        assert_true(drafted > 0);
        assert_true(accepted == drafted);
        if (j == 0) {
            struct httptest_resp r;
            assert_int_equal(httptest_request(s.port, "POST", "/v1/completions", NULL,
                                              "{\"prompt\": \"Once upon a time\", "
                                              "\"max_tokens\": 60, \"temperature\": 1}",
                                              &r),
                             200);
            assert_true(httptest_json_int(r.body, "completion_tokens", -1) >= 1);
            httptest_resp_free(&r);
            double d2, a2;
            draft_counts(s.port, &d2, &a2);
            print_message("sampled: %.0f of %.0f drafts kept\n", a2 - accepted, d2 - drafted);
            assert_true(d2 > drafted);
            assert_true(a2 - accepted >= 0.9 * (d2 - drafted));
        }
        if (k_jobs[j].n_choices > 1) check_sp_split_verify(s.port);
        live = NULL;
        httptest_stop(&s, SIGTERM);
    }
    // Prompt lookup at TP 2: the single process's continuation.
    struct httptest_server s;
    start_job(&s, model, 2, "--tp 2 --draft-n 4 --draft-always");
    check_one_process_text(s.port, model, "Tom had a red ball. Tom had a red ball. Tom had a red",
                           24);
    double drafted, accepted;
    draft_counts(s.port, &drafted, &accepted);
    print_message("prompt lookup at tp 2: %.0f of %.0f drafts kept\n", accepted, drafted);
    assert_true(drafted > 0);
    live = NULL;
    httptest_stop(&s, SIGTERM);
}

/* Runs cmd (a batch) into out and drops each line's "ttft_ms" figure (a
 * timing), so that two runs' outputs compare. */
static void run_batch(const char *cmd, char *out, size_t n) {
    assert_int_equal(run(cmd, out, n), 0);
    char *w = out;
    for (const char *r = out; *r;) {
        const char *t = strstr(r, ",\"ttft_ms\":");
        if (!t) {
            memmove(w, r, strlen(r) + 1);
            return;
        }
        memmove(w, r, (size_t)(t - r));
        w += t - r;
        r = t + strlen(",\"ttft_ms\":");
        while (*r && *r != ',' && *r != '}') r++;
    }
    *w = '\0';
}

/* `llmserve batch` under every split prints what one process prints: greedy
 * lines (the README's prompt, whose text is the README's; a prompt that
 * repeats itself; a 70-token prompt, whose prefill SP 2 splits), a seeded
 * sampled line, a grammar line and an error line, without drafts, with a
 * draft model and with prompt lookup (verified by the split model); and an
 * adapter line beside a base line at TP 2. */
static void test_batch_under_every_split(void **state) {
    (void)state;
    const char *model = stories_or_skip();
    char jsonl[4096], ids[1024];
    snprintf(jsonl, sizeof(jsonl), "%s/tests/integration/tp_batch.jsonl", testutil_build_dir());
    long_prompt_ids(ids, sizeof(ids));
    FILE *f = fopen(jsonl, "w");
    assert_non_null(f);
    fprintf(f, "{\"prompt\": \"Once upon a time\", \"max_tokens\": 30, \"temperature\": 0}\n"
               "{\"prompt\": \"Tom had a red ball. Tom had a red ball. Tom had a red\", "
               "\"max_tokens\": 24, \"temperature\": 0}\n"
               "{\"prompt\": [%s], \"max_tokens\": 12, \"temperature\": 0}\n"
               "{\"prompt\": \"One day\", \"max_tokens\": 24, \"temperature\": 0.8, \"seed\": 3}\n"
               "{\"prompt\": \"Lily said\", \"max_tokens\": 16, \"temperature\": 0, "
               "\"grammar\": \"root ::= (\\\" yes\\\" | \\\" no\\\") \\\"!\\\"\"}\n"
               "{\"model\": \"zzz\", \"prompt\": \"x\"}\n",
            ids);
    fclose(f);
    char cmd[32768], one[16384], split[16384];
    snprintf(cmd, sizeof(cmd), "%s batch -m %s --prompts %s -t 1 2>/dev/null", httptest_bin(),
             model, jsonl);
    run_batch(cmd, one, sizeof(one));
    assert_non_null(strstr(one, "\"text\":\", there was a little girl named Lily. She loved to "
                                "play outside in the park. One day,\""));
    assert_true(strstr(one, "\"text\":\" yes!\"") || strstr(one, "\"text\":\" no!\""));
    static const struct {
        const char *flags;
        int n_ranks;
    } k_runs[] = {
        {"--tp 2", 2},
        {"--pp 2", 2},
        {"--sp 2", 2},
        {"--tp 2 --pp 2 --draft-model %s --draft-always", 4},
        {"--sp 2 --draft-n 4 --draft-always", 2},
    };
    for (size_t k = 0; k < sizeof(k_runs) / sizeof(k_runs[0]); k++) {
        char flags[8192];
        snprintf(flags, sizeof(flags), k_runs[k].flags, model);
        snprintf(cmd, sizeof(cmd), "%s -np %d %s batch -m %s --prompts %s -t 1 %s 2>/dev/null",
                 mpirun(), k_runs[k].n_ranks, httptest_bin(), model, jsonl, flags);
        run_batch(cmd, split, sizeof(split));
        print_message("batch %s: %zu bytes\n", k_runs[k].flags, strlen(split));
        assert_string_equal(split, one);
    }
    // An adapter line and a base line at TP 2 (llama-f32 and its PEFT adapter).
    const char *synth = httptest_model("llama-f32");
    char path[4096];
    testutil_adapter_path("llama-peft", path, sizeof(path));
    f = fopen(jsonl, "w");
    assert_non_null(f);
    fprintf(f, "{\"model\": \"a\", \"prompt\": [%s], \"max_tokens\": 12, \"temperature\": 0, "
               "\"ignore_eos\": true}\n"
               "{\"prompt\": [%s], \"max_tokens\": 12, \"temperature\": 0, \"ignore_eos\": true}\n",
            ids, ids);
    fclose(f);
    snprintf(cmd, sizeof(cmd), "%s batch -m %s --prompts %s -t 1 --lora a=%s 2>/dev/null",
             httptest_bin(), synth, jsonl, path);
    run_batch(cmd, one, sizeof(one));
    snprintf(cmd, sizeof(cmd),
             "%s -np 2 %s batch -m %s --prompts %s -t 1 --lora a=%s --tp 2 2>/dev/null",
             mpirun(), httptest_bin(), synth, jsonl, path);
    run_batch(cmd, split, sizeof(split));
    assert_string_equal(split, one);
    const char *second = strchr(one, '\n');
    assert_non_null(second);
    assert_true(strncmp(strstr(one, "\"token_ids\""), strstr(second, "\"token_ids\""), 40) != 0);
}

/* The pid rank `rank` logged (comm_open: "rank R/N: pid P") in the job's log, or 0. */
static pid_t rank_pid(const char *log_path, int rank) {
    FILE *f = fopen(log_path, "r");
    if (!f) return 0;
    char line[1024], needle[64];
    snprintf(needle, sizeof(needle), "rank %d/", rank);
    pid_t pid = 0;
    while (!pid && fgets(line, sizeof(line), f)) {
        const char *p = strstr(line, needle);
        const char *q = p ? strstr(p, ": pid ") : NULL;
        if (q) pid = (pid_t)atol(q + 6);
    }
    fclose(f);
    return pid;
}

static bool log_has(const char *log_path, const char *text) {
    FILE *f = fopen(log_path, "r");
    if (!f) return false;
    char line[4096];
    bool found = false;
    while (!found && fgets(line, sizeof(line), f)) found = strstr(line, text) != NULL;
    fclose(f);
    return found;
}

/* serve --tp 2, rank 1 killed with SIGKILL in the middle of a stream: the
 * stream ends (EOF or reset within 60 s, never [DONE]: it did not finish)
 * with an OpenAI-shaped error event (code job_failed), a plain request in
 * progress gets a 503 with that code,
 * the whole job exits within 60 s and with a failure, rank 0's log says
 * why, and /health no longer answers 200. The bounds are polls, not timings:
 * Open MPI takes a few seconds (mpirun notices the death, SIGTERMs the
 * others and SIGKILLs them 1 s later). */
static void test_tp_serve_rank_killed_ends_job(void **state) {
    (void)state;
    const char *model = stories_or_skip();
    struct httptest_server s;
    start_job(&s, model, 2, "--tp 2");
    pid_t pid1 = 0;
    for (int i = 0; i < 100 && !pid1; i++) {
        pid1 = rank_pid(s.log_path, 1);
        if (!pid1) httptest_sleep_ms(50);
    }
    assert_true(pid1 > 0);

    // A plain request sent first, generating beside the stream when the rank dies (it
    // is answered only at its end).
    int fd_plain = httptest_send(s.port, "POST", "/v1/completions", NULL,
                                 "{\"prompt\": \"Lily\", \"max_tokens\": 400, "
                                 "\"ignore_eos\": true, \"temperature\": 0}");
    // 480 tokens of a 512-token context: far longer than the time to the kill below.
    int fd = httptest_send(s.port, "POST", "/v1/completions", NULL,
                           "{\"prompt\": \"Once\", \"max_tokens\": 480, \"ignore_eos\": true, "
                           "\"temperature\": 0, \"stream\": true}");
    assert_true(httptest_recv_until(fd, "data: ", 1 << 20));
    // At once: a release build decodes the whole stream in a fraction of a second. Once
    // rank 1 is gone the next step's collective never completes, so nothing finishes.
    assert_int_equal(kill(pid1, SIGKILL), 0);

    struct timeval tv = {.tv_sec = 60};
    assert_int_equal(setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)), 0);
    char buf[1 << 16];
    size_t len = 0;
    ssize_t got;
    do {
        got = read(fd, buf + len, sizeof(buf) - 1 - len);
        if (got > 0) len += (size_t)got;
        if (len == sizeof(buf) - 1) len = 0;  // keep reading; only the tail matters
    } while (got > 0 || (got < 0 && errno == EINTR));
    const int read_errno = got < 0 ? errno : 0;
    close(fd);
    buf[len] = '\0';
    assert_true(read_errno != EAGAIN && read_errno != EWOULDBLOCK);  // not a stuck stream
    assert_null(strstr(buf, "[DONE]"));
    if (!strstr(buf, "data: {\"error\":") || !strstr(buf, "\"job_failed\"")) {
        fail_msg("the stream ended without a job_failed error event; its tail:\n%s", buf);
    }
    struct timeval tv_plain = {.tv_sec = 60};
    assert_int_equal(setsockopt(fd_plain, SOL_SOCKET, SO_RCVTIMEO, &tv_plain, sizeof(tv_plain)),
                     0);
    struct httptest_resp plain;
    assert_int_equal(httptest_recv(fd_plain, &plain), 503);
    assert_true(httptest_is_openai_error(plain.body));
    assert_non_null(strstr(plain.body, "\"job_failed\""));
    httptest_resp_free(&plain);

    int status = 0;
    pid_t done = 0;
    for (int i = 0; i < 600 && done == 0; i++) {
        done = waitpid(s.pid, &status, WNOHANG);
        if (done == 0) httptest_sleep_ms(100);
    }
    if (done == s.pid) live = NULL;  // reaped: nothing left to stop
    assert_int_equal(done, s.pid);
    assert_false(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    struct httptest_resp r;
    assert_int_not_equal(httptest_request(s.port, "GET", "/health", NULL, NULL, &r), 200);
    httptest_resp_free(&r);
    assert_true(log_has(s.log_path, "exited on signal 9"));  // mpirun's line: which rank
    assert_true(log_has(s.log_path, "ending the job"));      // rank 0's own
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tp_generate_stories260k_prints_reference_ids),
        cmocka_unit_test(test_tp_generate_synthetic_same_ids_as_one_process),
        cmocka_unit_test(test_tp_generate_refuses_wrong_sizes),
        cmocka_unit_test(test_parallel_ranks_read_only_their_slices),
        cmocka_unit_test(test_pp_generate_stories260k_prints_reference_ids),
        cmocka_unit_test(test_pp_generate_synthetic_same_ids_as_one_process),
        cmocka_unit_test_teardown(test_pp_serve_completion_matches_one_process, stop_live),
        cmocka_unit_test(test_tpxpp_generate_synthetic_same_ids_as_one_process),
        cmocka_unit_test(test_pp_micro_batches_same_ids_as_one_process),
        cmocka_unit_test(test_sp_generate_same_ids_as_one_process),
        cmocka_unit_test_teardown(test_sp_serve_completion_matches_one_process, stop_live),
        cmocka_unit_test(test_sp_divided_generate_same_ids_as_one_process),
        cmocka_unit_test_teardown(test_sp_divided_serve_matches_one_process, stop_live),
        cmocka_unit_test(test_tpxpp_generate_stories260k_prints_reference_ids),
        cmocka_unit_test_teardown(test_tpxpp_serve_completion_matches_one_process, stop_live),
        cmocka_unit_test_teardown(test_tp_serve_completion_matches_one_process, stop_live),
        cmocka_unit_test_teardown(test_tp_serve_rank_killed_ends_job, stop_live),
        cmocka_unit_test(test_lora_generate_same_ids_as_one_process),
        cmocka_unit_test_teardown(test_tp_serve_lora_matches_one_process, stop_live),
        cmocka_unit_test_teardown(test_spec_serve_under_every_split, stop_live),
        cmocka_unit_test(test_batch_under_every_split),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
