/*
 * test_lora_http.c - adapters as clients see them: the real `llmserve serve`
 * with --lora and --allow-runtime-lora on a synthetic model, spoken to over
 * sockets. /v1/models lists base and adapters; "model" selects one (unknown
 * -> 404 model_not_found); load and unload at run time (400 / 409 / 404 / 403
 * / 401 cases); unload while a stream runs (it finishes unchanged); start-up
 * with an adapter that cannot load exits non-zero; `llmserve batch` selects
 * adapters by "model" and agrees with HTTP; the prefix cache finds an
 * adapter's blocks again after an eviction from its slot, not after an
 * unload and a new load. (Loads that take a while: test_lora_load.c.)
 *
 * The adapters are GGUF LoRA files (general.type = adapter, tensors
 * <weight>.lora_a [n_in, r] and <weight>.lora_b [r, n_out], llama.cpp's
 * layout) written here with tests/helpers/gguf_builder for the llama-f32
 * synthetic model (n_embd 64, n_head_kv 2 x head_dim 16, n_ff 96, 2 layers),
 * with large random values so that greedy outputs change.
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

#include "tests/helpers/gguf_builder.h"
#include "tests/helpers/testutil.h"
#include "tests/integration/httptest.h"

enum { RANK = 8, N_EMBD = 64, N_KV = 32, N_FF = 96, N_LAYER = 2 };

static struct httptest_server srv;
static char path_a[4096], path_b[4096], path_c[4096], path_bad[4096];

static float frand(uint64_t *s) {
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((double)(*s >> 11) / (double)(1ull << 53)) * 2.0f - 1.0f;
}

static void add_pair(struct gguf_builder *b, const char *w, int64_t n_in, int64_t n_out,
                     uint64_t *rng) {
    char name[96];
    float *a = malloc((size_t)(n_in * RANK) * sizeof(float));
    float *bb = malloc((size_t)(RANK * n_out) * sizeof(float));
    assert_true(a && bb);
    for (int64_t i = 0; i < n_in * RANK; i++) a[i] = frand(rng);
    for (int64_t i = 0; i < RANK * n_out; i++) bb[i] = frand(rng);
    int64_t ne_a[2] = {n_in, RANK};
    int64_t ne_b[2] = {RANK, n_out};
    snprintf(name, sizeof(name), "%s.lora_a", w);
    gguf_builder_tensor(b, name, 2, ne_a, 0, a, (size_t)(n_in * RANK) * sizeof(float));
    snprintf(name, sizeof(name), "%s.lora_b", w);
    gguf_builder_tensor(b, name, 2, ne_b, 0, bb, (size_t)(RANK * n_out) * sizeof(float));
    free(a);
    free(bb);
}

/* A GGUF LoRA adapter on attn_q, attn_v and ffn_down of every layer;
 * n_out_q != N_EMBD makes a shape mismatch the loader must reject. */
static void write_adapter(char *out, size_t out_size, const char *tag, uint64_t seed,
                          int64_t n_out_q) {
    struct gguf_builder *b = gguf_builder_create(3);
    gguf_builder_kv_str(b, "general.architecture", "llama");
    gguf_builder_kv_str(b, "general.type", "adapter");
    gguf_builder_kv_str(b, "adapter.type", "lora");
    gguf_builder_kv_f32(b, "adapter.lora.alpha", (float)RANK);
    uint64_t rng = seed;
    for (int il = 0; il < N_LAYER; il++) {
        char w[64];
        snprintf(w, sizeof(w), "blk.%d.attn_q.weight", il);
        add_pair(b, w, N_EMBD, n_out_q, &rng);
        snprintf(w, sizeof(w), "blk.%d.attn_v.weight", il);
        add_pair(b, w, N_EMBD, N_KV, &rng);
        snprintf(w, sizeof(w), "blk.%d.ffn_down.weight", il);
        add_pair(b, w, N_FF, N_EMBD, &rng);
    }
    size_t n = 0;
    uint8_t *bytes = gguf_builder_finish(b, &n);
    snprintf(out, out_size, "%s/tests/integration/lora-%s.gguf", testutil_build_dir(), tag);
    FILE *f = fopen(out, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(bytes, 1, n, f), n);
    fclose(f);
    free(bytes);
    gguf_builder_destroy(b);
}

static int group_setup(void **state) {
    (void)state;
    write_adapter(path_a, sizeof(path_a), "a", 1, N_EMBD);
    write_adapter(path_b, sizeof(path_b), "b", 2, N_EMBD);
    write_adapter(path_c, sizeof(path_c), "c", 4, N_EMBD);
    write_adapter(path_bad, sizeof(path_bad), "bad", 3, N_EMBD + 16);
    char args[8192];
    snprintf(args, sizeof(args), "--lora a=%s --allow-runtime-lora --lora-dir %s/tests "
             "--max-loras 2", path_a, testutil_build_dir());
    httptest_start(&srv, httptest_model("llama-f32"), args);
    return 0;
}

static int group_teardown(void **state) {
    (void)state;
    httptest_stop(&srv, SIGTERM);
    return 0;
}

static struct httptest_resp post(int port, const char *path, const char *hdrs, const char *body,
                                 int want) {
    struct httptest_resp r;
    int st = httptest_request(port, "POST", path, hdrs, body, &r);
    if (st != want) fail_msg("POST %s %s: status %d, want %d: %s", path, body, st, want, r.body);
    if (want >= 400 && !httptest_is_openai_error(r.body)) fail_msg("not an OpenAI error: %s", r.body);
    return r;
}

/* The greedy completion text of prompt under model (NULL: no "model"). */
static char *complete(const char *model, int max_tokens) {
    char body[512];
    snprintf(body, sizeof(body),
             "{%s%s%s\"prompt\":[1,5,6,7,8],\"max_tokens\":%d,\"temperature\":0,"
             "\"ignore_eos\":true}",
             model ? "\"model\":\"" : "", model ? model : "", model ? "\"," : "", max_tokens);
    struct httptest_resp r = post(srv.port, "/v1/completions", NULL, body, 200);
    httptest_no_nul(r.body);
    if (model) {
        char *m = httptest_json_str(r.body, "model");
        assert_string_equal(m, model);  // the response names the adapter
        free(m);
    }
    char *text = httptest_json_str(r.body, "text");
    assert_non_null(text);
    httptest_resp_free(&r);
    return text;
}

static char *base_name(void) {
    struct httptest_resp r;
    assert_int_equal(httptest_request(srv.port, "GET", "/v1/models", NULL, NULL, &r), 200);
    char *id = httptest_json_str(r.body, "id");
    httptest_resp_free(&r);
    return id;
}

static void test_lora_models_list_and_select(void **state) {
    (void)state;
    struct httptest_resp r;
    assert_int_equal(httptest_request(srv.port, "GET", "/v1/models", NULL, NULL, &r), 200);
    char *base = httptest_json_str(r.body, "id");
    const char *ad = strstr(r.body, "\"id\":\"a\"");
    assert_non_null(ad);
    char *parent = httptest_json_str(ad, "parent");
    char *root = httptest_json_str(ad, "root");
    assert_string_equal(parent, base);
    assert_string_equal(root, path_a);
    assert_non_null(strstr(r.body, "\"parent\":null"));  // the base's
    free(parent);
    free(root);
    httptest_resp_free(&r);

    char *t_none = complete(NULL, 12);
    char *t_base = complete(base, 12);
    char *t_a = complete("a", 12);
    char *t_a2 = complete("a", 12);
    assert_string_equal(t_none, t_base);  // the base's name = no adapter
    assert_string_equal(t_a, t_a2);
    if (strcmp(t_a, t_base) == 0) fail_msg("the adapter changed nothing: '%s'", t_a);
    free(t_none);
    free(t_base);
    free(t_a);
    free(t_a2);
    free(base);

    // Unknown model: 404 in OpenAI's shape, on both routes.
    r = post(srv.port, "/v1/completions", NULL, "{\"model\":\"nope\",\"prompt\":\"x\"}", 404);
    char *code = httptest_json_str(r.body, "code");
    char *param = httptest_json_str(r.body, "param");
    char *type = httptest_json_str(r.body, "type");
    assert_string_equal(code, "model_not_found");
    assert_string_equal(param, "model");
    assert_string_equal(type, "invalid_request_error");
    free(code);
    free(param);
    free(type);
    httptest_resp_free(&r);
    r = post(srv.port, "/v1/chat/completions", NULL,
             "{\"model\":\"nope\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}", 404);
    httptest_resp_free(&r);
    r = post(srv.port, "/v1/chat/completions", NULL,
             "{\"model\":\"a\",\"max_tokens\":3,\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}",
             200);
    httptest_resp_free(&r);
    assert_true(httptest_get_metric(srv.port, "llmserve_lora_slot_loads_total") >= 1);
    assert_int_equal(httptest_get_metric(srv.port, "llmserve_lora_slots"), 2);
}

static void test_lora_load_and_unload_at_run_time(void **state) {
    (void)state;
    char body[8192];
    struct httptest_resp r;
    // Bad bodies: 400.
    const char *bad[] = {"not json", "{}", "{\"lora_name\":\"b\"}", "{\"lora_name\":5,\"lora_path\":\"x\"}",
                         "{\"lora_name\":\"\",\"lora_path\":\"x\"}"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        r = post(srv.port, "/v1/load_lora_adapter", NULL, bad[i], 400);
        httptest_resp_free(&r);
    }
    // The base model's name, a missing file, a mismatching adapter: 400, server up.
    char *base = base_name();
    snprintf(body, sizeof(body), "{\"lora_name\":\"%s\",\"lora_path\":\"%s\"}", base, path_b);
    r = post(srv.port, "/v1/load_lora_adapter", NULL, body, 400);
    httptest_resp_free(&r);
    free(base);
    r = post(srv.port, "/v1/load_lora_adapter", NULL,
             "{\"lora_name\":\"gone\",\"lora_path\":\"integration/no-such-adapter.gguf\"}", 400);
    httptest_resp_free(&r);
    snprintf(body, sizeof(body), "{\"lora_name\":\"bad\",\"lora_path\":\"%s\"}", path_bad);
    r = post(srv.port, "/v1/load_lora_adapter", NULL, body, 400);
    assert_non_null(strstr(r.body, "bad"));
    httptest_resp_free(&r);
    r = post(srv.port, "/v1/completions", NULL, "{\"model\":\"bad\",\"prompt\":\"x\"}", 404);
    httptest_resp_free(&r);

    // Load b: selectable and listed; a second load of the name: 409.
    snprintf(body, sizeof(body), "{\"lora_name\":\"b\",\"lora_path\":\"%s\"}", path_b);
    r = post(srv.port, "/v1/load_lora_adapter", NULL, body, 200);
    httptest_resp_free(&r);
    r = post(srv.port, "/v1/load_lora_adapter", NULL, body, 409);
    httptest_resp_free(&r);
    assert_int_equal(httptest_request(srv.port, "GET", "/v1/models", NULL, NULL, &r), 200);
    assert_non_null(strstr(r.body, "\"id\":\"b\""));
    httptest_resp_free(&r);
    char *t_a = complete("a", 10);
    char *t_b = complete("b", 10);
    assert_string_not_equal(t_a, t_b);
    assert_int_equal(httptest_get_metric(srv.port, "llmserve_lora_adapters"), 2);

    // Unload b: 200, then 404 for requests and for a second unload.
    r = post(srv.port, "/v1/unload_lora_adapter", NULL, "{\"lora_name\":\"b\"}", 200);
    httptest_resp_free(&r);
    r = post(srv.port, "/v1/unload_lora_adapter", NULL, "{\"lora_name\":\"b\"}", 404);
    httptest_resp_free(&r);
    r = post(srv.port, "/v1/unload_lora_adapter", NULL, "{}", 400);
    httptest_resp_free(&r);
    r = post(srv.port, "/v1/completions", NULL, "{\"model\":\"b\",\"prompt\":\"x\"}", 404);
    httptest_resp_free(&r);
    // Reloaded under the same name: the same outputs as before.
    r = post(srv.port, "/v1/load_lora_adapter", NULL, body, 200);
    httptest_resp_free(&r);
    char *t_b2 = complete("b", 10);
    assert_string_equal(t_b, t_b2);
    r = post(srv.port, "/v1/unload_lora_adapter", NULL, "{\"lora_name\":\"b\"}", 200);
    httptest_resp_free(&r);
    free(t_a);
    free(t_b);
    free(t_b2);
}

/* The text of a completions stream: every chunk's "text", in order. */
static char *stream_text(char *body) {
    httptest_no_nul(body);
    int n = 0;
    char **ev = httptest_sse_events(body, &n);
    assert_true(n >= 2);
    assert_string_equal(ev[n - 1], "[DONE]");
    char *fr = httptest_json_str(ev[n - 2], "finish_reason");
    assert_non_null(fr);
    assert_string_equal(fr, "length");
    free(fr);
    char *text = calloc(1, strlen(body) + 1);
    assert_non_null(text);
    for (int i = 0; i < n - 1; i++) {
        char *piece = httptest_json_str(ev[i], "text");
        if (piece) strcat(text, piece);
        free(piece);
    }
    httptest_events_free(ev, n);
    return text;
}

/* A stream under "s" keeps its adapter when "s" is unloaded mid-stream. */
static void test_lora_unload_while_streaming(void **state) {
    (void)state;
    char body[8192];
    snprintf(body, sizeof(body), "{\"lora_name\":\"s\",\"lora_path\":\"%s\"}", path_b);
    struct httptest_resp r = post(srv.port, "/v1/load_lora_adapter", NULL, body, 200);
    httptest_resp_free(&r);
    const int n_tokens = 2000;  // long enough to be running when the unload comes
    char *want = complete("s", n_tokens);
    snprintf(body, sizeof(body),
             "{\"model\":\"s\",\"prompt\":[1,5,6,7,8],\"max_tokens\":%d,\"temperature\":0,"
             "\"ignore_eos\":true,\"stream\":true}", n_tokens);
    // The gauge is a per-step snapshot: wait until it no longer counts the
    // request above, so that "running" below means this stream.
    int polls = 0;
    while (httptest_get_metric(srv.port, "llmserve_requests_running") != 0 && polls++ < 5000)
        httptest_sleep_ms(1);
    int fd = httptest_send(srv.port, "POST", "/v1/completions", NULL, body);
    polls = 0;
    while (httptest_get_metric(srv.port, "llmserve_requests_running") < 1 && polls++ < 5000)
        httptest_sleep_ms(1);
    r = post(srv.port, "/v1/unload_lora_adapter", NULL, "{\"lora_name\":\"s\"}", 200);
    httptest_resp_free(&r);
    // Still streaming after the unload (else this test proved nothing).
    assert_true(httptest_get_metric(srv.port, "llmserve_requests_running") >= 1);
    r = post(srv.port, "/v1/completions", NULL, "{\"model\":\"s\",\"prompt\":\"x\"}", 404);
    httptest_resp_free(&r);
    struct httptest_resp sr;
    assert_int_equal(httptest_recv(fd, &sr), 200);
    char *got = stream_text(sr.body);
    assert_string_equal(got, want);  // the adapter stayed until the end
    free(got);
    httptest_resp_free(&sr);
    free(want);
}

/* The greedy text of a 40-token prompt (two full 16-token blocks before the
 * last token) under model, and the prefix-cache hits it added. */
static char *complete_long(const char *model, double *out_hits) {
    char body[1024];
    int n = snprintf(body, sizeof(body), "{\"model\":\"%s\",\"prompt\":[", model);
    for (int i = 0; i < 40; i++)
        n += snprintf(body + n, sizeof(body) - (size_t)n, "%s%d", i ? "," : "", 2 + i * 7);
    snprintf(body + n, sizeof(body) - (size_t)n,
             "],\"max_tokens\":4,\"temperature\":0,\"ignore_eos\":true}");
    double h0 = httptest_get_metric(srv.port, "llmserve_prefix_cache_hit_tokens_total");
    struct httptest_resp r = post(srv.port, "/v1/completions", NULL, body, 200);
    *out_hits = httptest_get_metric(srv.port, "llmserve_prefix_cache_hit_tokens_total") - h0;
    httptest_no_nul(r.body);
    char *text = httptest_json_str(r.body, "text");
    assert_non_null(text);
    httptest_resp_free(&r);
    return text;
}

static void load_as(const char *name, const char *path) {
    char body[8192];
    snprintf(body, sizeof(body), "{\"lora_name\":\"%s\",\"lora_path\":\"%s\"}", name, path);
    struct httptest_resp r = post(srv.port, "/v1/load_lora_adapter", NULL, body, 200);
    httptest_resp_free(&r);
}

static void unload_name(const char *name) {
    char body[256];
    snprintf(body, sizeof(body), "{\"lora_name\":\"%s\"}", name);
    struct httptest_resp r = post(srv.port, "/v1/unload_lora_adapter", NULL, body, 200);
    httptest_resp_free(&r);
}

/* The prefix cache knows an adapter by the loaded object: evicted from its
 * slot (two slots, three adapters) and put back, it hits its cached blocks;
 * unloaded and loaded again from the same file, it is a new object and
 * starts with none (same outputs all along). */
static void test_lora_prefix_cache_follows_the_loaded_adapter(void **state) {
    (void)state;
    load_as("p1", path_b);
    load_as("p2", path_c);
    double hits = 0;
    char *want = complete_long("p1", &hits);
    assert_true(hits == 0);
    free(complete_long("a", &hits));
    free(complete_long("p2", &hits));  // two slots: p1, the least recently used, goes
    double loads = httptest_get_metric(srv.port, "llmserve_lora_slot_loads_total");
    char *got = complete_long("p1", &hits);
    assert_true(httptest_get_metric(srv.port, "llmserve_lora_slot_loads_total") == loads + 1);
    assert_true(hits == 32);  // put back into a slot: its blocks are found again
    assert_string_equal(got, want);
    free(got);

    unload_name("p1");
    load_as("p1", path_b);
    got = complete_long("p1", &hits);
    assert_true(hits == 0);  // a new load: nothing computed before is reused
    assert_string_equal(got, want);
    free(got);
    got = complete_long("p1", &hits);
    assert_true(hits == 32);
    assert_string_equal(got, want);
    free(got);
    free(want);
    unload_name("p1");
    unload_name("p2");
}

/* `llmserve batch --lora` selects by "model" and agrees with the server. */
static void test_lora_batch_selects_by_model(void **state) {
    (void)state;
    char *base = base_name();
    char jsonl[4096];
    snprintf(jsonl, sizeof(jsonl), "%s/tests/integration/lora_batch.jsonl", testutil_build_dir());
    FILE *f = fopen(jsonl, "w");
    assert_non_null(f);
    const char *models[4] = {"a", NULL, "a", base};
    for (int i = 0; i < 4; i++)
        fprintf(f, "{%s%s%s\"prompt\":[1,5,6,7,8],\"max_tokens\":12,\"temperature\":0,"
                   "\"ignore_eos\":true}\n",
                models[i] ? "\"model\":\"" : "", models[i] ? models[i] : "",
                models[i] ? "\"," : "");
    fprintf(f, "{\"model\":\"zzz\",\"prompt\":[1,2]}\n");
    fclose(f);
    char cmd[16384];
    snprintf(cmd, sizeof(cmd), "%s batch -m %s --lora a=%s --prompts %s 2>/dev/null",
             httptest_bin(), httptest_model("llama-f32"), path_a, jsonl);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    char line[65536];
    for (int i = 0; i < 5; i++) {
        assert_non_null(fgets(line, sizeof(line), p));
        if (i == 4) {
            assert_non_null(strstr(line, "\"error\""));
            continue;
        }
        httptest_no_nul(line);
        char *got = httptest_json_str(line, "text");
        char *want = complete(models[i], 12);
        assert_string_equal(got, want);
        free(got);
        free(want);
    }
    assert_int_equal(pclose(p), 0);
    free(base);
}

static void test_lora_admin_routes_guarded(void **state) {
    (void)state;
    char body[8192];
    snprintf(body, sizeof(body), "{\"lora_name\":\"b\",\"lora_path\":\"%s\"}", path_b);
    // Without --allow-runtime-lora: 403, and --lora still serves.
    struct httptest_server s;
    char args[8192];
    snprintf(args, sizeof(args), "--lora a=%s", path_a);
    httptest_start(&s, httptest_model("llama-f32"), args);
    struct httptest_resp r = post(s.port, "/v1/load_lora_adapter", NULL, body, 403);
    httptest_resp_free(&r);
    r = post(s.port, "/v1/unload_lora_adapter", NULL, "{\"lora_name\":\"a\"}", 403);
    httptest_resp_free(&r);
    r = post(s.port, "/v1/completions", NULL, "{\"model\":\"a\",\"prompt\":\"x\",\"max_tokens\":2}",
             200);
    httptest_resp_free(&r);
    assert_int_equal(httptest_stop(&s, SIGTERM), 0);

    // With an API key: the key is needed.
    snprintf(args, sizeof(args), "--allow-runtime-lora --lora-dir %s/tests --api-key k1",
             testutil_build_dir());
    httptest_start(&s, httptest_model("llama-f32"), args);
    r = post(s.port, "/v1/load_lora_adapter", NULL, body, 401);
    httptest_resp_free(&r);
    r = post(s.port, "/v1/load_lora_adapter", "Authorization: Bearer wrong\r\n", body, 401);
    httptest_resp_free(&r);
    r = post(s.port, "/v1/load_lora_adapter", "Authorization: Bearer k1\r\n", body, 200);
    httptest_resp_free(&r);
    r = post(s.port, "/v1/unload_lora_adapter", NULL, "{\"lora_name\":\"b\"}", 401);
    httptest_resp_free(&r);
    r = post(s.port, "/v1/unload_lora_adapter", "Authorization: Bearer k1\r\n",
             "{\"lora_name\":\"b\"}", 200);
    httptest_resp_free(&r);
    assert_int_equal(httptest_stop(&s, SIGTERM), 0);
}

/* An adapter that cannot load at start-up: a clear error, exit non-zero. */
static void test_lora_bad_adapter_at_startup_exits(void **state) {
    (void)state;
    const char *cases[2] = {"/nonexistent/adapter.gguf", path_bad};
    for (int i = 0; i < 2; i++) {
        char log[4096];
        snprintf(log, sizeof(log), "%s/tests/integration/lora_start_%d.log", testutil_build_dir(), i);
        char cmd[16384];
        snprintf(cmd, sizeof(cmd), "timeout 60 %s serve -m %s --port 1 --lora x=%s 2>%s", httptest_bin(),
                 httptest_model("llama-f32"), cases[i], log);
        int st = testutil_system(cmd);
        assert_true(st != 0);
        size_t n = 0;
        char *text = testutil_read_file(log, &n);
        assert_non_null(text);
        if (!strstr(text, "--lora x=")) fail_msg("no clear error: %s", text);
        free(text);
    }
}

int main(void) {
    const struct CMUnitTest shared[] = {
        cmocka_unit_test(test_lora_models_list_and_select),
        cmocka_unit_test(test_lora_load_and_unload_at_run_time),
        cmocka_unit_test(test_lora_unload_while_streaming),
        cmocka_unit_test(test_lora_batch_selects_by_model),
        cmocka_unit_test(test_lora_prefix_cache_follows_the_loaded_adapter),
    };
    const struct CMUnitTest alone[] = {
        cmocka_unit_test(test_lora_admin_routes_guarded),
        cmocka_unit_test(test_lora_bad_adapter_at_startup_exits),
    };
    int fails = cmocka_run_group_tests_name("lora_http", shared, group_setup, group_teardown);
    fails += cmocka_run_group_tests_name("lora_http_alone", alone, NULL, NULL);
    return fails;
}
