/*
 * tests/scheduler/test_batch_invariance.c - the real engine through the
 * scheduler: greedy outputs of a request are the same alone as among 1..64
 * others arriving at random steps, with and without the prefix cache, with
 * chunked prefill (small token budget) and without, and across preemption
 * (tiny pools). Uses the synthetic models of tests/models/meson.build
 * (llama-f32, llama-swa for a sliding window, llama-q8_0, llama-q4_0 and
 * llama256-q4_k_m for quantized weights: q-panels), with f32, f16 and q8_0
 * KV, and with LoRA and bottleneck adapters (the adapters of tests/models:
 * requests on the base model and four adapters, more adapters than slots, a
 * shared prompt prefix that the prefix cache must not hand from one adapter
 * to another); skips when they are not built.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "engine/base/log.h"
#include "scheduler/scheduler.h"
#include "tests/helpers/testutil.h"

enum { MAX_REQ = 65, MAX_GEN = 12, MAX_PROMPT = 80 };

struct req_spec {
    int32_t prompt[MAX_PROMPT];
    int32_t n_prompt;
    int32_t max_tokens;
    int32_t arrival_step;
    struct engine_adapter *adapter;  // borrowed; NULL: the base model
    struct gbnf *grammar;            // borrowed; NULL: unconstrained
    const char *grammar_trigger;     // NULL: the grammar holds from the start
    float temperature;               // 0: greedy
    uint64_t seed;
};

struct result {
    int32_t tokens[MAX_GEN];
    int32_t n_tokens;
    enum channel_finish finish;
};

static uint64_t rng_next(uint64_t *s) {
    uint64_t x = *s += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static struct engine_model *load(const char *name) {
    const char *path = testutil_path(testutil_path(testutil_build_dir(), "tests/models"), name);
    if (!testutil_exists(path)) return NULL;
    struct engine_model_params p = engine_model_default_params();
    p.path = path;
    struct engine_model *m = NULL;
    assert_int_equal(engine_model_load(&p, &m), 0);
    return m;
}

static struct scheduler_params params(int32_t n_blocks, int32_t budget, bool prefix,
                                      enum engine_kv_type kv_type) {
    struct scheduler_params p = scheduler_default_params();
    p.kv_type = kv_type;
    p.kv_blocks = n_blocks;
    p.block_size = 16;
    p.max_batch_tokens = budget;
    p.max_seqs = 64;
    p.enable_prefix_cache = prefix;
    p.n_threads = 2;
    return p;
}

static bool collect(struct channel *c, struct result *res) {
    struct channel_output out;
    channel_read(c, &out);
    for (int32_t i = 0; i < out.n_tokens; i++) {
        assert_true(res->n_tokens < MAX_GEN);
        res->tokens[res->n_tokens++] = out.token_ids[i];
    }
    res->finish = out.finish;
    channel_output_free(&out);
    return res->finish != CHANNEL_FINISH_NONE;
}

static void run(const struct engine_model *m, const struct scheduler_params *p,
                const struct req_spec *reqs, int n, struct result *res, int64_t *n_preempt) {
    struct scheduler *s;
    assert_int_equal(scheduler_create(m, p, &s), 0);
    struct channel *ch[MAX_REQ] = {0};
    bool done[MAX_REQ] = {0};
    memset(res, 0, (size_t)n * sizeof(*res));
    int n_done = 0;
    for (int32_t step = 0; n_done < n; step++) {
        assert_true(step < 100000);
        for (int i = 0; i < n; i++) {
            if (reqs[i].arrival_step != step) continue;
            struct scheduler_request q = scheduler_default_request();
            q.prompt = reqs[i].prompt;
            q.n_prompt = reqs[i].n_prompt;
            q.max_tokens = reqs[i].max_tokens;
            q.sampling.temperature = reqs[i].temperature;
            q.sampling.has_seed = true;
            q.sampling.seed = reqs[i].seed;
            q.ignore_eos = true;
            q.adapter = reqs[i].adapter;
            q.grammar = reqs[i].grammar;
            q.grammar_trigger = reqs[i].grammar_trigger;
            uint64_t id;
            assert_int_equal(scheduler_submit(s, &q, &id, &ch[i]), 0);
        }
        assert_true(scheduler_step(s) >= 0);
        assert_true(scheduler_check(s));
        for (int i = 0; i < n; i++) {
            if (!ch[i] || done[i] || !collect(ch[i], &res[i])) continue;
            done[i] = true;
            n_done++;
            channel_release(ch[i]);
        }
    }
    if (n_preempt) {
        struct scheduler_stats st;
        scheduler_get_stats(s, &st);
        *n_preempt += st.n_preemptions;
    }
    scheduler_free(s);
}

static void make_reqs(uint64_t seed, int32_t n_vocab, struct req_spec *reqs, int n) {
    uint64_t rng = seed;
    int32_t prefix[40];
    for (int j = 0; j < 40; j++) prefix[j] = (int32_t)(rng_next(&rng) % (uint64_t)n_vocab);
    for (int i = 0; i < n; i++) {
        struct req_spec *r = &reqs[i];
        r->n_prompt = 1 + (int32_t)(rng_next(&rng) % (MAX_PROMPT - 1));
        bool shared = rng_next(&rng) % 2;
        for (int32_t j = 0; j < r->n_prompt; j++)
            r->prompt[j] = (shared && j < 40) ? prefix[j]
                                              : (int32_t)(rng_next(&rng) % (uint64_t)n_vocab);
        r->max_tokens = 1 + (int32_t)(rng_next(&rng) % MAX_GEN);
        r->arrival_step = (int32_t)(rng_next(&rng) % 12);
        r->adapter = NULL;
        r->grammar = NULL;
        r->grammar_trigger = NULL;
        r->temperature = 0.0f;
        r->seed = 0;
    }
    reqs[0].arrival_step = 0;
}

static void check_kv(const char *model_name, enum engine_kv_type kv_type, uint64_t seed,
                     int n_others, int32_t n_blocks, int32_t budget, bool prefix,
                     int64_t *n_preempt) {
    struct engine_model *m = load(model_name);
    assert_non_null(m);
    int32_t n_vocab = engine_model_get_info(m)->n_vocab;
    struct req_spec reqs[MAX_REQ];
    struct result alone[MAX_REQ], got[MAX_REQ];
    int n = n_others + 1;
    make_reqs(seed, n_vocab, reqs, n);
    struct scheduler_params big = params(1024, 512, false, kv_type);
    for (int i = 0; i < n; i++) {
        struct req_spec one = reqs[i];
        one.arrival_step = 0;
        run(m, &big, &one, 1, &alone[i], NULL);
    }
    struct scheduler_params p = params(n_blocks, budget, prefix, kv_type);
    run(m, &p, reqs, n, got, n_preempt);
    for (int i = 0; i < n; i++) {
        bool same = alone[i].n_tokens == got[i].n_tokens &&
                    !memcmp(alone[i].tokens, got[i].tokens, (size_t)got[i].n_tokens * sizeof(int32_t));
        if (!same) {
            fprintf(stderr, "%s kv=%s: request %d of %d differs from alone (seed=%llu blocks=%d "
                    "budget=%d prefix=%d)\n", model_name, engine_kv_type_name(kv_type), i, n,
                    (unsigned long long)seed,
                    (int)n_blocks, (int)budget, (int)prefix);
            fail();
        }
    }
    engine_model_free(m);
}

static void check(const char *model_name, uint64_t seed, int n_others, int32_t n_blocks,
                  int32_t budget, bool prefix, int64_t *n_preempt) {
    check_kv(model_name, ENGINE_KV_TYPE_F32, seed, n_others, n_blocks, budget, prefix, n_preempt);
}

static bool have_models(void) {
    const char *dir = testutil_path(testutil_build_dir(), "tests/models");
    if (testutil_exists(testutil_path(dir, "llama-f32.gguf"))) return true;
    printf("skipping: %s/llama-f32.gguf not built (tests/models/meson.build)\n", dir);
    return false;
}

static void test_batch_invariance_greedy_alone_equals_batched(void **state) {
    (void)state;
    if (!have_models()) {
        skip();
        return;
    }
    int counts[] = {1, 4, 16, 64};
    for (int k = 0; k < 4; k++) {
        uint64_t seed = 100 + (uint64_t)k;
        check("llama-f32.gguf", seed, counts[k], 1024, 512, true, NULL);
        check("llama-f32.gguf", seed, counts[k], 1024, 512, false, NULL);
        check("llama-f32.gguf", seed, counts[k], 1024, 13, true, NULL);  // chunked prefill
    }
}

/* Grammar-constrained sequences, sampled at temperature 1 with seeds: each
 * gives the same tokens alone as among 31 others (half constrained, half
 * not), since its mask depends only on its own grammar state. Their text is
 * a prefix of the grammar's language, and a sequence that stopped before
 * max_tokens stopped because the grammar was complete. */
static void test_batch_invariance_grammar(void **state) {
    (void)state;
    if (!have_models()) {
        skip();
        return;
    }
    const char *text = "root ::= \"{\\\"n\\\": [\" num (\", \" num)* \"]}\"\n"
                       "num ::= \"-\"? [0-9]{1,3}\n";
    struct gbnf *g = NULL;
    assert_int_equal(gbnf_compile(text, strlen(text), &g, NULL, 0), 0);
    struct engine_model *m = load("llama-f32.gguf");
    int32_t n_vocab = engine_model_get_info(m)->n_vocab;
    const struct tokenizer *tok = engine_model_tokenizer(m);
    enum { N = 32 };
    struct req_spec reqs[N];
    struct result alone[N], got[N];
    make_reqs(500, n_vocab, reqs, N);
    for (int i = 0; i < N; i += 2) {
        reqs[i].grammar = g;
        reqs[i].temperature = 1.0f;
        reqs[i].seed = 1000 + (uint64_t)i;
        reqs[i].max_tokens = MAX_GEN;
    }
    struct scheduler_params big = params(1024, 512, false, ENGINE_KV_TYPE_F32);
    for (int i = 0; i < N; i++) {
        struct req_spec one = reqs[i];
        one.arrival_step = 0;
        run(m, &big, &one, 1, &alone[i], NULL);
    }
    struct scheduler_params p = params(1024, 64, true, ENGINE_KV_TYPE_F32);
    run(m, &p, reqs, N, got, NULL);
    int n_stopped = 0;
    for (int i = 0; i < N; i++) {
        assert_int_equal(alone[i].n_tokens, got[i].n_tokens);
        assert_memory_equal(alone[i].tokens, got[i].tokens,
                            (size_t)got[i].n_tokens * sizeof(int32_t));
        if (!reqs[i].grammar) continue;
        struct buf bytes = {0};
        for (int32_t k = 0; k < got[i].n_tokens; k++)
            tokenizer_token_to_piece(tok, got[i].tokens[k], false, &bytes);
        struct grammar *gm = grammar_create(g);
        assert_int_not_equal(grammar_accept_bytes(gm, bytes.data, bytes.len), GRAMMAR_STEP_REJECT);
        assert_true(bytes.len > 0 && bytes.data[0] == '{');
        if (got[i].finish == CHANNEL_FINISH_STOP) {
            assert_true(grammar_is_accepting(gm));
            assert_true(got[i].n_tokens <= MAX_GEN);
            n_stopped++;
        }
        grammar_free(gm);
        buf_free(&bytes);
    }
    (void)n_stopped;
    gbnf_release(g);
    engine_model_free(m);
}

/* A grammar whose language is the 10 strings "{0}" .. "{9}": sampled at
 * temperature 1, every sequence ends with STOP (not LENGTH, though
 * max_tokens allows more) as soon as its text is one of them, in at most 3
 * tokens (each token carries at least one byte). */
static void test_batch_invariance_grammar_completion_stops(void **state) {
    (void)state;
    if (!have_models()) {
        skip();
        return;
    }
    const char *text = "root ::= \"{\" [0-9] \"}\"";
    struct gbnf *g = NULL;
    assert_int_equal(gbnf_compile(text, strlen(text), &g, NULL, 0), 0);
    struct engine_model *m = load("llama-f32.gguf");
    int32_t n_vocab = engine_model_get_info(m)->n_vocab;
    const struct tokenizer *tok = engine_model_tokenizer(m);
    enum { N = 8 };
    struct req_spec reqs[N];
    struct result got[N];
    make_reqs(77, n_vocab, reqs, N);
    for (int i = 0; i < N; i++) {
        reqs[i].grammar = g;
        reqs[i].temperature = 1.0f;
        reqs[i].seed = 40 + (uint64_t)i;
        reqs[i].max_tokens = MAX_GEN - 1;
    }
    struct scheduler_params p = params(1024, 64, true, ENGINE_KV_TYPE_F32);
    run(m, &p, reqs, N, got, NULL);
    for (int i = 0; i < N; i++) {
        assert_int_equal(got[i].finish, CHANNEL_FINISH_STOP);
        assert_true(got[i].n_tokens >= 1 && got[i].n_tokens <= 3);
        struct buf bytes = {0};
        for (int32_t k = 0; k < got[i].n_tokens; k++)
            tokenizer_token_to_piece(tok, got[i].tokens[k], false, &bytes);
        assert_int_equal(bytes.len, 3);
        assert_true(bytes.data[0] == '{' && bytes.data[1] >= '0' && bytes.data[1] <= '9' &&
                    bytes.data[2] == '}');
        buf_free(&bytes);
    }
    gbnf_release(g);
    engine_model_free(m);
}

/* A GBNF literal of ASCII text, every byte as \xHH (grammar text of the test's own). */
static void hex_literal(struct buf *b, const char *s, size_t n) {
    buf_append_char(b, '"');
    for (size_t i = 0; i < n; i++) {
        char hx[8];
        snprintf(hx, sizeof(hx), "\\x%02x", (unsigned)(unsigned char)s[i]);
        buf_append_str(b, hx);
    }
    buf_append_char(b, '"');
}

/* A grammar waiting for a trigger (tool calling's "auto"): judged against
 * the same request run free. With the trigger chosen as the text of the
 * free run's token k (the first one that is plain ASCII, 2+ letters, and
 * not in the text before it), tokens 0..k are the free run's (nothing is
 * constrained before the trigger), then the grammar takes over: one digit
 * and the sequence stops (STOP, before max_tokens). With a grammar whose
 * sentences have "~" where the trigger's last byte is, the trigger's own
 * bytes leave it: the grammar is dropped and the run is the free one. */
static void test_batch_invariance_grammar_trigger(void **state) {
    (void)state;
    if (!have_models()) {
        skip();
        return;
    }
    struct engine_model *m = load("llama-f32.gguf");
    int32_t n_vocab = engine_model_get_info(m)->n_vocab;
    const struct tokenizer *tok = engine_model_tokenizer(m);
    struct req_spec req[1];
    struct result free_run[1], got[1];
    struct scheduler_params p = params(1024, 64, true, ENGINE_KV_TYPE_F32);
    int n_checked = 0;
    for (uint64_t seed = 300; seed < 340 && n_checked < 3; seed++) {
        make_reqs(seed, n_vocab, req, 1);
        req[0].max_tokens = MAX_GEN;
        run(m, &p, req, 1, free_run, NULL);
        // the trigger: token k's piece, ASCII letters only, not in the text before it
        struct buf text = {0}, piece = {0};
        int32_t k = -1;
        for (int32_t i = 0; i + 2 < free_run[0].n_tokens && k < 0; i++) {
            buf_reset(&piece);
            tokenizer_token_to_piece(tok, free_run[0].tokens[i], true, &piece);
            bool letters = piece.len >= 2;
            for (size_t j = 0; j < piece.len; j++)
                letters &= (piece.data[j] >= 'a' && piece.data[j] <= 'z');
            buf_append(&text, piece.data ? piece.data : "", piece.len);
            if (!letters) continue;
            bool earlier = false;  // the trigger must first appear ending at token i
            for (size_t j = 0; j + piece.len < text.len; j++)
                earlier |= memcmp(text.data + j, piece.data, piece.len) == 0;
            if (!earlier) k = i;
        }
        if (k < 0) {
            buf_free(&text);
            buf_free(&piece);
            continue;
        }
        char trigger[64];
        snprintf(trigger, sizeof(trigger), "%.*s", (int)piece.len, piece.data);
        struct buf gt = {0};
        buf_append_str(&gt, "root ::= ");
        hex_literal(&gt, trigger, strlen(trigger));
        buf_append_str(&gt, " [0-9]");
        struct gbnf *g = NULL;
        assert_int_equal(gbnf_compile(gt.data, gt.len, &g, NULL, 0), 0);
        req[0].grammar = g;
        // The trigger alone, then as one of two alternatives ('\n' between them) beside
        // one that never appears (bytes no token here writes), first and second: the
        // same run each time.
        char alt1[160], alt2[160];
        snprintf(alt1, sizeof(alt1), "\x01\x02\x03\x04\x05\x06\x07\x08\n%s", trigger);
        snprintf(alt2, sizeof(alt2), "%s\n\x01\x02\x03", trigger);
        const char *const triggers[3] = {trigger, alt1, alt2};
        for (int a = 0; a < 3; a++) {
            req[0].grammar_trigger = triggers[a];
            run(m, &p, req, 1, got, NULL);
            assert_true(got[0].n_tokens >= k + 2);
            assert_memory_equal(got[0].tokens, free_run[0].tokens,
                                (size_t)(k + 1) * sizeof(int32_t));
            struct buf rest = {0};
            for (int32_t i = k + 1; i < got[0].n_tokens; i++)
                tokenizer_token_to_piece(tok, got[0].tokens[i], false, &rest);
            assert_int_equal(rest.len, 1);
            assert_true(rest.data[0] >= '0' && rest.data[0] <= '9');
            assert_int_equal(got[0].finish, CHANNEL_FINISH_STOP);
            buf_free(&rest);
        }
        req[0].grammar_trigger = trigger;
        gbnf_release(g);
        // a grammar the trigger token's bytes leave: dropped, the run is the free one
        buf_reset(&gt);
        buf_append_str(&gt, "root ::= ");
        hex_literal(&gt, trigger, strlen(trigger) - 1);
        buf_append_str(&gt, " \"~\" [0-9]");
        g = NULL;
        assert_int_equal(gbnf_compile(gt.data, gt.len, &g, NULL, 0), 0);
        req[0].grammar = g;
        run(m, &p, req, 1, got, NULL);
        assert_int_equal(got[0].n_tokens, free_run[0].n_tokens);
        assert_memory_equal(got[0].tokens, free_run[0].tokens,
                            (size_t)free_run[0].n_tokens * sizeof(int32_t));
        assert_int_equal(got[0].finish, free_run[0].finish);
        gbnf_release(g);
        buf_free(&gt);
        buf_free(&text);
        buf_free(&piece);
        n_checked++;
    }
    assert_int_equal(n_checked, 3);
    engine_model_free(m);
}

static void test_batch_invariance_across_preemption(void **state) {
    (void)state;
    if (!have_models()) {
        skip();
        return;
    }
    int64_t n_preempt = 0;
    for (uint64_t seed = 200; seed < 203; seed++) {
        // 8 usable blocks = 128 tokens; a request needs at most 92.
        check("llama-f32.gguf", seed, 16, 9, 64, true, &n_preempt);
        check("llama-f32.gguf", seed, 16, 9, 64, false, &n_preempt);
    }
    assert_true(n_preempt > 0);
}

static void test_batch_invariance_sliding_window(void **state) {
    (void)state;
    const char *dir = testutil_path(testutil_build_dir(), "tests/models");
    if (!testutil_exists(testutil_path(dir, "llama-swa.gguf"))) {
        printf("skipping: %s/llama-swa.gguf not built\n", dir);
        skip();
        return;
    }
    check("llama-swa.gguf", 300, 16, 1024, 512, true, NULL);
    check("llama-swa.gguf", 301, 16, 1024, 7, false, NULL);
    check("llama-swa.gguf", 302, 16, 12, 32, true, NULL);
}

/* Quantized weights: activations are rounded to 8 bits per token and the
 * q-panel products compute every (row, token) by the same operations at any
 * batch size, so a token's logits do not depend on its batch. */
static void test_batch_invariance_quantized(void **state) {
    (void)state;
    const char *dir = testutil_path(testutil_build_dir(), "tests/models");
    const char *names[] = {"llama-q8_0.gguf", "llama256-q4_k_m.gguf", "llama-q4_0.gguf"};
    for (int k = 0; k < 3; k++) {
        if (!testutil_exists(testutil_path(dir, names[k]))) {
            printf("skipping: %s/%s not built\n", dir, names[k]);
            skip();
            return;
        }
    }
    for (int k = 0; k < 3; k++) {
        check(names[k], 400, 16, 1024, 512, true, NULL);
        check(names[k], 401, 16, 1024, 13, false, NULL);  // chunked prefill
        check(names[k], 402, 64, 1024, 512, false, NULL);
    }
}

/* f16 and q8_0 KV: a token's stored K/V depend only on that token (q8_0
 * scales are per token and group of 32 dims), so batching changes nothing. */
static void test_batch_invariance_kv_types(void **state) {
    (void)state;
    if (!have_models()) {
        skip();
        return;
    }
    const enum engine_kv_type types[] = {ENGINE_KV_TYPE_F16, ENGINE_KV_TYPE_Q8_0};
    const char *dir = testutil_path(testutil_build_dir(), "tests/models");
    const bool has_swa = testutil_exists(testutil_path(dir, "llama-swa.gguf"));
    for (int k = 0; k < 2; k++) {
        int64_t n_preempt = 0;
        check_kv("llama-f32.gguf", types[k], 500, 16, 1024, 512, true, NULL);
        check_kv("llama-f32.gguf", types[k], 501, 64, 1024, 13, false, NULL);  // chunked prefill
        check_kv("llama-f32.gguf", types[k], 502, 16, 9, 64, true, &n_preempt);
        assert_true(n_preempt > 0);
        if (has_swa) check_kv("llama-swa.gguf", types[k], 503, 16, 12, 32, true, NULL);
    }
}

/* Requests on the base model and four adapters (LoRA in f32/f16/bf16 and a
 * bottleneck adapter), max_loras slots: the same tokens as each alone. */
static void check_lora(uint64_t seed, int n_others, int32_t max_loras, int32_t n_blocks,
                       int32_t budget, bool prefix, int64_t *n_preempt) {
    struct engine_model *m = load("llama-f32.gguf");
    assert_non_null(m);
    const char *names[4] = {"llama-peft", "llama-gguf-f16.gguf", "llama-bn", "llama-peft-bf16-rs"};
    struct engine_adapter *ad[4];
    for (int k = 0; k < 4; k++) {
        const char *path =
            testutil_path(testutil_path(testutil_build_dir(), "tests/models"), names[k]);
        assert_int_equal(engine_adapter_load(m, path, &ad[k]), 0);
    }
    int32_t n_vocab = engine_model_get_info(m)->n_vocab;
    struct req_spec reqs[MAX_REQ];
    struct result alone[MAX_REQ], got[MAX_REQ];
    int n = n_others + 1;
    make_reqs(seed, n_vocab, reqs, n);
    uint64_t rng = seed * 7919;
    for (int i = 0; i < n; i++) {
        int k = (int)(rng_next(&rng) % 5) - 1;
        reqs[i].adapter = k < 0 ? NULL : ad[k];
    }
    struct scheduler_params big = params(1024, 512, false, ENGINE_KV_TYPE_F32);
    big.max_loras = 1;
    for (int i = 0; i < n; i++) {
        struct req_spec one = reqs[i];
        one.arrival_step = 0;
        run(m, &big, &one, 1, &alone[i], NULL);
    }
    struct scheduler_params p = params(n_blocks, budget, prefix, ENGINE_KV_TYPE_F32);
    p.max_loras = max_loras;
    run(m, &p, reqs, n, got, n_preempt);
    for (int i = 0; i < n; i++) {
        bool same = alone[i].n_tokens == got[i].n_tokens &&
                    !memcmp(alone[i].tokens, got[i].tokens, (size_t)got[i].n_tokens * sizeof(int32_t));
        if (!same) {
            fprintf(stderr, "lora: request %d of %d (adapter %p) differs from alone (seed=%llu "
                    "max_loras=%d blocks=%d budget=%d prefix=%d)\n", i, n,
                    (void *)reqs[i].adapter, (unsigned long long)seed, (int)max_loras,
                    (int)n_blocks, (int)budget, (int)prefix);
            fail();
        }
    }
    for (int k = 0; k < 4; k++) engine_adapter_release(ad[k]);
    engine_model_free(m);
}

static void test_batch_invariance_lora_adapters(void **state) {
    (void)state;
    const char *dir = testutil_path(testutil_build_dir(), "tests/models");
    if (!testutil_exists(testutil_path(dir, "llama-peft.stamp"))) {
        printf("skipping: the adapters of tests/models are not built\n");
        skip();
        return;
    }
    check_lora(600, 16, 4, 1024, 512, true, NULL);
    check_lora(601, 16, 2, 1024, 512, true, NULL);    // fewer slots than adapters
    check_lora(602, 64, 3, 1024, 13, true, NULL);     // chunked prefill
    int64_t n_preempt = 0;
    check_lora(603, 16, 2, 9, 64, true, &n_preempt);  // preemption
    check_lora(604, 16, 4, 9, 64, false, &n_preempt);
    assert_true(n_preempt > 0);
}

int main(void) {
    log_set_level(LOG_LEVEL_WARN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_batch_invariance_greedy_alone_equals_batched),
        cmocka_unit_test(test_batch_invariance_across_preemption),
        cmocka_unit_test(test_batch_invariance_grammar),
        cmocka_unit_test(test_batch_invariance_grammar_completion_stops),
        cmocka_unit_test(test_batch_invariance_grammar_trigger),
        cmocka_unit_test(test_batch_invariance_sliding_window),
        cmocka_unit_test(test_batch_invariance_quantized),
        cmocka_unit_test(test_batch_invariance_kv_types),
        cmocka_unit_test(test_batch_invariance_lora_adapters),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
