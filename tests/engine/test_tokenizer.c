/*
 * test_tokenizer.c - engine/tokenizer.c, spm.c, bpe.c and pretok.c.
 *
 * Oracles: the upstream test vectors in ../shared/models/vocab (.inp strings,
 * .out ids, produced by the models' reference HF tokenizers), the stories260K
 * README's prompt ids, Unicode's UTF-8 rules, and properties (round trips,
 * streaming == whole decode, spans covering the text). Files built in memory
 * cover hostile metadata and the rules that need no shared data.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/base/buf.h"
#include "engine/base/err.h"
#include "engine/base/log.h"
#include "engine/format/gguf.h"
#include "engine/text/pretok.h"
#include "engine/text/tokenizer.h"
#include "tests/helpers/testutil.h"

/* ---- a small in-memory GGUF writer (metadata only) ----------------------- */

struct mini_gguf {
    struct buf kvs;
    uint64_t n_kv;
    struct buf file;
};

static void put(struct buf *b, const void *p, size_t n) { buf_append(b, p, n); }
static void put_u32(struct buf *b, uint32_t v) { put(b, &v, 4); }
static void put_u64(struct buf *b, uint64_t v) { put(b, &v, 8); }
static void put_str(struct buf *b, const char *s, size_t n) {
    put_u64(b, n);
    put(b, s, n);
}
static void kv_head(struct mini_gguf *g, const char *key, uint32_t type) {
    put_str(&g->kvs, key, strlen(key));
    put_u32(&g->kvs, type);
    g->n_kv++;
}
static void kv_str(struct mini_gguf *g, const char *key, const char *v) {
    kv_head(g, key, GGUF_TYPE_STRING);
    put_str(&g->kvs, v, strlen(v));
}
static void kv_u32(struct mini_gguf *g, const char *key, uint32_t v) {
    kv_head(g, key, GGUF_TYPE_UINT32);
    put_u32(&g->kvs, v);
}
static void kv_bool(struct mini_gguf *g, const char *key, bool v) {
    kv_head(g, key, GGUF_TYPE_BOOL);
    uint8_t x = v;
    put(&g->kvs, &x, 1);
}
static void kv_strs(struct mini_gguf *g, const char *key, const char *const *v, size_t n) {
    kv_head(g, key, GGUF_TYPE_ARRAY);
    put_u32(&g->kvs, GGUF_TYPE_STRING);
    put_u64(&g->kvs, n);
    for (size_t i = 0; i < n; i++) put_str(&g->kvs, v[i], strlen(v[i]));
}
static void kv_f32s(struct mini_gguf *g, const char *key, const float *v, size_t n) {
    kv_head(g, key, GGUF_TYPE_ARRAY);
    put_u32(&g->kvs, GGUF_TYPE_FLOAT32);
    put_u64(&g->kvs, n);
    put(&g->kvs, v, 4 * n);
}
static void kv_i32s(struct mini_gguf *g, const char *key, const int32_t *v, size_t n) {
    kv_head(g, key, GGUF_TYPE_ARRAY);
    put_u32(&g->kvs, GGUF_TYPE_INT32);
    put_u64(&g->kvs, n);
    put(&g->kvs, v, 4 * n);
}

/* Opens the file built so far; the bytes live in g until mini_free(). */
static int mini_open(struct mini_gguf *g, struct gguf_file **f) {
    buf_reset(&g->file);
    put(&g->file, "GGUF", 4);
    put_u32(&g->file, 3);
    put_u64(&g->file, 0);
    put_u64(&g->file, g->n_kv);
    put(&g->file, g->kvs.data, g->kvs.len);
    return gguf_open_memory(g->file.data, g->file.len, "mini.gguf", f);
}

static void mini_free(struct mini_gguf *g) {
    buf_free(&g->kvs);
    buf_free(&g->file);
}

/* Loads a tokenizer from g; returns tokenizer_load's code. */
static int mini_load(struct mini_gguf *g, struct tokenizer **t) {
    struct gguf_file *f = NULL;
    assert_int_equal(mini_open(g, &f), 0);
    int rc = tokenizer_load(f, t);
    gguf_close(f);
    return rc;
}

/* A synthetic SPM vocabulary: <unk> <s> </s>, the 256 byte tokens, then
 * pieces with scores chosen so the merge order is known. */
#define SYN_N_BASE TESTUTIL_SPM_BASE
static const char *const syn_pieces[] = {"\xe2\x96\x81", "a", "b", "c", "ab", "bc", "abc",
                                         "\xe2\x96\x81" "abc", "<|end|>"};
static const float syn_scores[] = {-1, -2, -2, -2, -5, -3, -4, -6, 0};

static void build_syn_spm(struct mini_gguf *g, int n_pieces) {
    const char *tokens[SYN_N_BASE + 16];
    float scores[SYN_N_BASE + 16];
    int32_t types[SYN_N_BASE + 16];
    testutil_spm_base(tokens, scores, types);
    for (int i = 0; i < n_pieces; i++) {
        tokens[SYN_N_BASE + i] = syn_pieces[i];
        scores[SYN_N_BASE + i] = syn_scores[i];
        types[SYN_N_BASE + i] = i == 8 ? TOKENIZER_TYPE_CONTROL : TOKENIZER_TYPE_NORMAL;
    }
    size_t n = (size_t)(SYN_N_BASE + n_pieces);
    kv_str(g, "tokenizer.ggml.model", "llama");
    kv_strs(g, "tokenizer.ggml.tokens", tokens, n);
    kv_f32s(g, "tokenizer.ggml.scores", scores, n);
    kv_i32s(g, "tokenizer.ggml.token_type", types, n);
    kv_u32(g, "tokenizer.ggml.bos_token_id", 1);
    kv_u32(g, "tokenizer.ggml.eos_token_id", 2);
}

#define SYN_SPACE (SYN_N_BASE + 0)
#define SYN_A (SYN_N_BASE + 1)
#define SYN_B (SYN_N_BASE + 2)
#define SYN_C (SYN_N_BASE + 3)
#define SYN_AB (SYN_N_BASE + 4)
#define SYN_BC (SYN_N_BASE + 5)
#define SYN_ABC (SYN_N_BASE + 6)
#define SYN_SPACE_ABC (SYN_N_BASE + 7)
#define SYN_END (SYN_N_BASE + 8)

static void expect_ids(const struct tokenizer *t, const char *text, bool add_special,
                       bool parse_special, const int32_t *want, int32_t n_want) {
    int32_t *ids = NULL;
    int32_t n = -1;
    assert_int_equal(tokenizer_encode(t, text, strlen(text), add_special, parse_special, &ids, &n),
                     0);
    if (n != n_want || (n > 0 && memcmp(ids, want, (size_t)n * sizeof(int32_t)) != 0)) {
        print_message("text '%s': got", text);
        for (int32_t i = 0; i < n; i++) print_message(" %d", ids[i]);
        print_message("\n");
        fail();
    }
    free(ids);
}

/* Feeds ids one by one: every chunk must be valid UTF-8, and the whole must
 * equal tokenizer_decode(). */
static void check_stream(const struct tokenizer *t, const int32_t *ids, int32_t n,
                         bool skip_special) {
    struct buf whole = {0}, streamed = {0}, chunk = {0};
    tokenizer_decode(t, ids, n, skip_special, &whole);
    assert_true(tokenizer_utf8_valid(whole.data ? whole.data : "", whole.len));
    struct tokenizer_stream s;
    tokenizer_stream_init(&s, skip_special);
    for (int32_t i = 0; i <= n; i++) {
        buf_reset(&chunk);
        if (i < n)
            tokenizer_stream_feed(t, &s, ids[i], &chunk);
        else
            tokenizer_stream_flush(t, &s, &chunk);
        assert_true(tokenizer_utf8_valid(chunk.data ? chunk.data : "", chunk.len));
        buf_append(&streamed, chunk.data ? chunk.data : "", chunk.len);
    }
    assert_int_equal(streamed.len, whole.len);
    assert_memory_equal(streamed.data ? streamed.data : "", whole.data ? whole.data : "",
                        whole.len);
    buf_free(&whole);
    buf_free(&streamed);
    buf_free(&chunk);
}

/* ---- synthetic SPM ---------------------------------------------------------- */

static void test_spm_merges_by_score(void **state) {
    (void)state;
    struct mini_gguf g = {0};
    build_syn_spm(&g, 9);
    struct tokenizer *t = NULL;
    assert_int_equal(mini_load(&g, &t), 0);
    // "▁abc": the prefix, then "bc" (-3) merges before "ab" (-5), then "abc" (-4),
    // then "▁abc" (-6). Had "ab" merged first, "abc" could still form: the test
    // below with "abab" tells the orders apart.
    expect_ids(t, "abc", false, false, (int32_t[]){SYN_SPACE_ABC}, 1);
    // "▁abab": ab, ab (nothing scores higher), no "▁ab" or "abab" piece.
    expect_ids(t, "abab", false, false, (int32_t[]){SYN_SPACE, SYN_AB, SYN_AB}, 3);
    // "▁abc" with BOS; a space inside becomes another "▁".
    expect_ids(t, "abc c", true, false, (int32_t[]){1, SYN_SPACE_ABC, SYN_SPACE, SYN_C}, 4);
    // No piece for "d" or "é": byte fallback, one token per byte.
    expect_ids(t, "d\xc3\xa9", false, false, (int32_t[]){SYN_SPACE, 3 + 'd', 3 + 0xC3, 3 + 0xA9},
               4);
    // Empty text: nothing, or just BOS.
    expect_ids(t, "", false, false, NULL, 0);
    expect_ids(t, "", true, false, (int32_t[]){1}, 1);
    assert_true(tokenizer_adds_bos(t));
    assert_false(tokenizer_adds_eos(t));
    tokenizer_free(t);
    mini_free(&g);
}

static void test_spm_parse_special_and_prefix(void **state) {
    (void)state;
    struct mini_gguf g = {0};
    build_syn_spm(&g, 9);
    struct tokenizer *t = NULL;
    assert_int_equal(mini_load(&g, &t), 0);
    // Control text is found only with parse_special; the prefix comes back after it.
    expect_ids(t, "a<|end|>a", false, true,
               (int32_t[]){SYN_SPACE, SYN_A, SYN_END, SYN_SPACE, SYN_A}, 5);
    int32_t *ids = NULL;
    int32_t n = 0;
    assert_int_equal(tokenizer_encode(t, "a<|end|>a", 9, false, false, &ids, &n), 0);
    for (int32_t i = 0; i < n; i++) assert_int_not_equal(ids[i], SYN_END);
    free(ids);
    assert_int_equal(tokenizer_eot(t), SYN_END);  // found by its text
    assert_true(tokenizer_is_eog(t, SYN_END));
    assert_true(tokenizer_is_eog(t, 2));
    assert_false(tokenizer_is_eog(t, SYN_A));
    assert_false(tokenizer_is_eog(t, -5));
    assert_int_equal(tokenizer_token_type(t, 99999), TOKENIZER_TYPE_UNDEFINED);
    assert_null(tokenizer_token_text(t, -1));
    assert_string_equal(tokenizer_token_text(t, SYN_AB), "ab");
    assert_int_equal(tokenizer_find(t, "ab", 2), SYN_AB);
    assert_int_equal(tokenizer_find(t, "zz", 2), -1);
    tokenizer_free(t);
    mini_free(&g);

    // add_space_prefix = false: no dummy prefix, and decode strips nothing.
    struct mini_gguf g2 = {0};
    build_syn_spm(&g2, 9);
    kv_bool(&g2, "tokenizer.ggml.add_space_prefix", false);
    assert_int_equal(mini_load(&g2, &t), 0);
    expect_ids(t, "abc", false, false, (int32_t[]){SYN_ABC}, 1);
    struct buf out = {0};
    int32_t sp[] = {SYN_SPACE_ABC};
    tokenizer_decode(t, sp, 1, true, &out);
    assert_string_equal(out.data, " abc");
    buf_free(&out);
    tokenizer_free(t);
    mini_free(&g2);
}

static void test_tokenizer_rejects_bad_text(void **state) {
    (void)state;
    struct mini_gguf g = {0};
    build_syn_spm(&g, 9);
    struct tokenizer *t = NULL;
    assert_int_equal(mini_load(&g, &t), 0);
    const char *bad[] = {"a\xff", "\xc0\xaf", "\xed\xa0\x80", "\xf4\x90\x80\x80", "\xe4\xb8",
                         "\x80"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        int32_t *ids = (int32_t *)1;
        int32_t n = 7;
        assert_int_equal(tokenizer_encode(t, bad[i], strlen(bad[i]), true, true, &ids, &n),
                         ERR_INVAL);
        assert_null(ids);
        assert_int_equal(n, 0);
    }
    int32_t *ids = NULL;
    int32_t n = 0;
    assert_int_equal(tokenizer_encode(t, "a\0b", 3, false, false, &ids, &n), ERR_INVAL);
    assert_true(tokenizer_utf8_valid("\xf0\x9f\xa6\x99", 4));
    assert_false(tokenizer_utf8_valid("\xf0\x9f\xa6", 3));
    tokenizer_free(t);
    mini_free(&g);
}

static void test_tokenizer_decode_replaces_invalid_utf8(void **state) {
    (void)state;
    struct mini_gguf g = {0};
    build_syn_spm(&g, 9);
    struct tokenizer *t = NULL;
    assert_int_equal(mini_load(&g, &t), 0);
    struct buf out = {0};
    // E4 then 'A': the broken prefix is one U+FFFD, 'A' stays.
    int32_t a[] = {3 + 0xE4, 3 + 'A'};
    tokenizer_decode(t, a, 2, true, &out);
    assert_string_equal(out.data, "\xef\xbf\xbd" "A");
    // A lone continuation byte, then "中" split over three byte tokens, then a
    // truncated sequence left at the end.
    buf_reset(&out);
    int32_t b[] = {3 + 0x80, 3 + 0xE4, 3 + 0xB8, 3 + 0xAD, 3 + 0xF0, 3 + 0x9F};
    tokenizer_decode(t, b, 6, true, &out);
    assert_string_equal(out.data, "\xef\xbf\xbd" "\xe4\xb8\xad" "\xef\xbf\xbd");
    check_stream(t, b, 6, true);
    // Surrogates and overlongs are not let through.
    buf_reset(&out);
    int32_t c[] = {3 + 0xED, 3 + 0xA0, 3 + 0x80, 3 + 0xC0, 3 + 0xAF};
    tokenizer_decode(t, c, 5, true, &out);
    assert_true(tokenizer_utf8_valid(out.data, out.len));
    assert_null(strstr(out.data, "\xed\xa0"));
    // Control tokens: shown only without skip_special; out-of-range ids skipped.
    buf_reset(&out);
    int32_t d[] = {1, SYN_SPACE_ABC, 99999, 2};
    tokenizer_decode(t, d, 4, false, &out);
    assert_string_equal(out.data, "<s>abc</s>");
    buf_reset(&out);
    tokenizer_decode(t, d, 4, true, &out);
    assert_string_equal(out.data, "abc");
    // A stream after a prompt: decode(prompt + ids) less decode(prompt). A
    // prompt with text used the dummy prefix, so " abc" keeps its space; a
    // prompt of BOS only (or none) did not, so the space goes, as in decode.
    struct {
        int32_t prompt[2];
        int32_t n_prompt;
        const char *want;
    } after[] = {
        {{1, SYN_SPACE_ABC}, 2, " abc"},
        {{SYN_SPACE_ABC, 0}, 1, " abc"},
        {{1, 0}, 1, "abc"},
        {{0, 0}, 0, "abc"},
        {{1, 99999}, 2, "abc"},  // out of range: no text
    };
    for (size_t k = 0; k < sizeof(after) / sizeof(after[0]); k++) {
        buf_reset(&out);
        struct tokenizer_stream s;
        tokenizer_stream_init_after(&s, t, after[k].prompt, after[k].n_prompt, true);
        tokenizer_stream_feed(t, &s, SYN_SPACE_ABC, &out);
        tokenizer_stream_flush(t, &s, &out);
        assert_string_equal(out.data, after[k].want);
        // The log-probability piece agrees, and only the first loses the space.
        buf_reset(&out);
        tokenizer_stream_init_after(&s, t, after[k].prompt, after[k].n_prompt, true);
        tokenizer_stream_piece(t, &s, SYN_SPACE_ABC, &out);
        assert_string_equal(out.data, after[k].want);
        buf_reset(&out);
        tokenizer_stream_piece(t, &s, SYN_SPACE_ABC, &out);
        assert_string_equal(out.data, " abc");
    }
    buf_free(&out);
    tokenizer_free(t);
    mini_free(&g);
}

/* ---- hostile metadata ---------------------------------------------------- */

static void test_tokenizer_rejects_hostile_metadata(void **state) {
    (void)state;
    struct tokenizer *t = NULL;
    const char *toks[] = {"a", "b", "ab"};
    const float scores2[] = {0, 0};
    const int32_t types[] = {1, 1, 1};
    const int32_t bad_types[] = {1, 1, 42};

    // No tokens array.
    struct mini_gguf g = {0};
    kv_str(&g, "tokenizer.ggml.model", "llama");
    assert_int_equal(mini_load(&g, &t), ERR_FORMAT);
    assert_null(t);
    mini_free(&g);
    // No model key.
    g = (struct mini_gguf){0};
    kv_strs(&g, "tokenizer.ggml.tokens", toks, 3);
    assert_int_equal(mini_load(&g, &t), ERR_FORMAT);
    mini_free(&g);
    // Tokens of the wrong type.
    g = (struct mini_gguf){0};
    kv_str(&g, "tokenizer.ggml.model", "llama");
    kv_f32s(&g, "tokenizer.ggml.tokens", scores2, 2);
    assert_int_equal(mini_load(&g, &t), ERR_FORMAT);
    mini_free(&g);
    // Scores of another length.
    g = (struct mini_gguf){0};
    kv_str(&g, "tokenizer.ggml.model", "llama");
    kv_strs(&g, "tokenizer.ggml.tokens", toks, 3);
    kv_f32s(&g, "tokenizer.ggml.scores", scores2, 2);
    assert_int_equal(mini_load(&g, &t), ERR_FORMAT);
    mini_free(&g);
    // token_type of another length, and with a value that is no type.
    g = (struct mini_gguf){0};
    kv_str(&g, "tokenizer.ggml.model", "llama");
    kv_strs(&g, "tokenizer.ggml.tokens", toks, 3);
    kv_i32s(&g, "tokenizer.ggml.token_type", types, 2);
    assert_int_equal(mini_load(&g, &t), ERR_FORMAT);
    mini_free(&g);
    g = (struct mini_gguf){0};
    kv_str(&g, "tokenizer.ggml.model", "llama");
    kv_strs(&g, "tokenizer.ggml.tokens", toks, 3);
    kv_i32s(&g, "tokenizer.ggml.token_type", bad_types, 3);
    assert_int_equal(mini_load(&g, &t), ERR_FORMAT);
    mini_free(&g);
    // Special ids out of range (0xFFFFFFFF means "none" and is fine).
    const char *id_keys[] = {"tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id",
                             "tokenizer.ggml.unknown_token_id", "tokenizer.ggml.padding_token_id",
                             "tokenizer.ggml.eot_token_id"};
    for (size_t k = 0; k < 5; k++) {
        g = (struct mini_gguf){0};
        kv_str(&g, "tokenizer.ggml.model", "llama");
        kv_strs(&g, "tokenizer.ggml.tokens", toks, 3);
        kv_u32(&g, id_keys[k], 3);
        assert_int_equal(mini_load(&g, &t), ERR_FORMAT);
        mini_free(&g);
    }
    g = (struct mini_gguf){0};
    kv_str(&g, "tokenizer.ggml.model", "llama");
    kv_strs(&g, "tokenizer.ggml.tokens", toks, 3);
    kv_u32(&g, "tokenizer.ggml.padding_token_id", 0xFFFFFFFFu);
    kv_u32(&g, "tokenizer.ggml.bos_token_id", 0xFFFFFFFFu);
    assert_int_equal(mini_load(&g, &t), 0);
    assert_int_equal(tokenizer_pad(t), -1);
    assert_int_equal(tokenizer_bos(t), -1);
    assert_false(tokenizer_adds_bos(t));  // asked for, but there is no BOS
    tokenizer_free(t);
    mini_free(&g);
    // Unknown model and unknown pre-tokenizer.
    g = (struct mini_gguf){0};
    kv_str(&g, "tokenizer.ggml.model", "wordpiece-9000");
    kv_strs(&g, "tokenizer.ggml.tokens", toks, 3);
    assert_int_equal(mini_load(&g, &t), ERR_UNSUPPORTED);
    mini_free(&g);

    const char *merges_ok[] = {"a b"};
    const char *merges_unknown[] = {"a c"};
    const char *merges_result[] = {"b a"};  // "ba" is no token
    const char *merges_nospace[] = {"ab"};
    struct {
        const char *pre;
        const char *const *merges;
        int want;
    } cases[] = {
        {"gpt-2", merges_ok, 0},
        {"no-such-pre", merges_ok, ERR_UNSUPPORTED},
        {"gpt-2", merges_unknown, ERR_FORMAT},
        {"gpt-2", merges_result, ERR_FORMAT},
        {"gpt-2", merges_nospace, ERR_FORMAT},
        {"gpt-2", NULL, ERR_FORMAT},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        g = (struct mini_gguf){0};
        kv_str(&g, "tokenizer.ggml.model", "gpt2");
        kv_str(&g, "tokenizer.ggml.pre", cases[i].pre);
        kv_strs(&g, "tokenizer.ggml.tokens", toks, 3);
        if (cases[i].merges) kv_strs(&g, "tokenizer.ggml.merges", cases[i].merges, 1);
        int rc = mini_load(&g, &t);
        assert_int_equal(rc, cases[i].want);
        if (rc == 0) {
            expect_ids(t, "abba", false, false, (int32_t[]){2, 1, 0}, 3);
            assert_false(tokenizer_adds_bos(t));  // gpt2 default
            tokenizer_free(t);
        }
        mini_free(&g);
    }
}

/* ---- pre-tokenizers -------------------------------------------------------- */

static void split_expect(const char *pre, const char *text, const char *const *want, size_t n_want) {
    struct pretok *p = NULL;
    assert_int_equal(pretok_create(pre, strlen(pre), &p, NULL), 0);
    size_t len = strlen(text);
    struct pretok_span *spans = malloc(2 * len * sizeof(*spans));
    size_t n = 0;
    assert_int_equal(pretok_split(p, text, len, spans, spans + len, len, &n), 0);
    if (n != n_want) {
        for (size_t i = 0; i < n; i++)
            print_message("[%.*s]", (int)spans[i].len, text + spans[i].start);
        print_message("\n");
    }
    assert_int_equal(n, n_want);
    for (size_t i = 0; i < n; i++) {
        assert_int_equal(spans[i].len, strlen(want[i]));
        assert_memory_equal(text + spans[i].start, want[i], spans[i].len);
    }
    free(spans);
    pretok_free(p);
}

static void test_pretok_splits_like_the_reference_regexes(void **state) {
    (void)state;
    // Expected splits written from the patterns' definitions (tokenizer.json).
    split_expect("gpt-2", "Hello world's  12345!!",
                 (const char *[]){"Hello", " world", "'s", " ", " 12345", "!!"}, 6);
    split_expect("llama-bpe", "I'VE 12345 apples\n\n",
                 (const char *[]){"I", "'VE", " ", "123", "45", " apples", "\n\n"}, 7);
    split_expect("qwen2", "x 123", (const char *[]){"x", " ", "1", "2", "3"}, 5);
    split_expect("deepseek-coder", "ab\ncd 12",
                 (const char *[]){"ab", "\n", "cd", " ", "1", "2"}, 6);
    split_expect("bloom", "hi, you", (const char *[]){"hi", ",", " you"}, 3);
}

static void test_pretok_knows_the_popular_names(void **state) {
    (void)state;
    const char *names[] = {
        "default", "gpt-2", "llama3", "llama-bpe", "qwen2", "deepseek-coder", "deepseek-llm",
        "deepseek-v3", "falcon", "starcoder", "refact", "command-r", "mpt", "phi-2", "smollm",
        "gpt-4o", "llama4", "stablelm2", "olmo", "dbrx", "smaug-bpe", "jais", "tekken",
        "chatglm-bpe", "poro-chat", "viking", "codeshell", "bloom", "gpt3-finnish", "exaone",
        "minerva-7b", "chameleon", "seed-coder", "bailingmoe", "megrez", "deepseek-r1-qwen",
    };
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        struct pretok *p = NULL;
        struct pretok_info info;
        assert_int_equal(pretok_create(names[i], strlen(names[i]), &p, &info), 0);
        // Every piece set covers the text exactly, in order.
        const char *text = "Hello, y'all! 3.14159 \xe4\xbd\xa0\xe5\xa5\xbd  \n\t\xf0\x9f\xa6\x99 end ";
        size_t len = strlen(text);
        struct pretok_span spans[128];
        size_t n = 0;
        assert_true(len <= 64);
        assert_int_equal(pretok_split(p, text, len, spans, spans + 64, 64, &n), 0);
        uint32_t at = 0;
        for (size_t k = 0; k < n; k++) {
            assert_int_equal(spans[k].start, at);
            assert_true(spans[k].len > 0);
            at += spans[k].len;
        }
        assert_int_equal(at, len);
        pretok_free(p);
    }
    struct pretok *p = (struct pretok *)1;
    assert_int_equal(pretok_create("zzz-unknown", 11, &p, NULL), ERR_UNSUPPORTED);
    assert_null(p);
}

/* ---- the upstream vectors ------------------------------------------------ */

/* Splits the .inp file: each test string is followed by "\n__ggml_vocab_test__\n". */
static int32_t read_inputs(char *data, size_t len, char **strs, size_t *lens, int32_t max) {
    static const char sep[] = "\n__ggml_vocab_test__\n";
    size_t n_sep = sizeof(sep) - 1;
    int32_t n = 0;
    size_t at = 0;
    while (at < len && n < max) {
        char *hit = NULL;
        for (size_t i = at; i + n_sep <= len; i++) {
            if (memcmp(data + i, sep, n_sep) == 0) {
                hit = data + i;
                break;
            }
        }
        // An empty string is written as just its "\n__ggml_vocab_test__\n" terminator.
        if (!hit) break;
        strs[n] = data + at;
        lens[n] = (size_t)(hit - (data + at));
        n++;
        at = (size_t)(hit - data) + n_sep;
    }
    return n;
}

static void run_vocab(const char *shared, const char *vocab, int32_t *n_pass_out) {
    char name[256];
    snprintf(name, sizeof(name), "models/vocab/%s", vocab);
    struct gguf_file *f = NULL;
    assert_int_equal(gguf_open(testutil_path(shared, name), &f), 0);
    struct tokenizer *t = NULL;
    assert_int_equal(tokenizer_load(f, &t), 0);
    gguf_close(f);

    snprintf(name, sizeof(name), "models/vocab/%s.inp", vocab);
    size_t inp_len = 0;
    char *inp = testutil_read_file(testutil_path(shared, name), &inp_len);
    snprintf(name, sizeof(name), "models/vocab/%s.out", vocab);
    size_t out_len = 0;
    char *out = testutil_read_file(testutil_path(shared, name), &out_len);
    assert_non_null(inp);
    assert_non_null(out);

    char *strs[128];
    size_t lens[128];
    int32_t n = read_inputs(inp, inp_len, strs, lens, 128);
    assert_true(n > 0);

    int32_t n_pass = 0, n_round = 0;
    char *line = out;
    for (int32_t i = 0; i < n; i++) {
        assert_non_null(line);
        char *eol = strchr(line, '\n');
        if (eol) *eol = '\0';
        int32_t want[512];
        int32_t n_want = 0;
        for (char *p = line; *p;) {
            char *end = NULL;
            long v = strtol(p, &end, 10);
            if (end == p) break;
            assert_true(n_want < 512);
            want[n_want++] = (int32_t)v;
            p = end;
        }
        line = eol ? eol + 1 : NULL;

        int32_t *ids = NULL;
        int32_t n_ids = 0;
        assert_int_equal(tokenizer_encode(t, strs[i], lens[i], false, false, &ids, &n_ids), 0);
        bool ok = n_ids == n_want &&
                  (n_ids == 0 || memcmp(ids, want, (size_t)n_ids * sizeof(int32_t)) == 0);
        if (ok) {
            n_pass++;
        } else {
            print_message("%s: string %d '%.*s' got", vocab, i, (int)lens[i], strs[i]);
            for (int32_t k = 0; k < n_ids; k++) print_message(" %d", ids[k]);
            print_message("\n");
        }
        // decode(encode(s)) == s; streaming equals the whole decode.
        struct buf dec = {0};
        tokenizer_decode(t, ids, n_ids, false, &dec);
        if (dec.len == lens[i] && (lens[i] == 0 || memcmp(dec.data, strs[i], lens[i]) == 0))
            n_round++;
        else
            print_message("%s: string %d does not round-trip: '%s'\n", vocab, i,
                          dec.data ? dec.data : "");
        check_stream(t, ids, n_ids, false);
        buf_free(&dec);
        free(ids);
    }
    print_message("%s: %d/%d vectors pass, %d/%d round-trip\n", vocab, n_pass, n, n_round, n);
    assert_int_equal(n_pass, n);
    assert_int_equal(n_round, n);
    *n_pass_out = n_pass;
    free(inp);
    free(out);
    tokenizer_free(t);
}

#define SKIP_WITHOUT_SHARED(shared)                                     \
    const char *shared = testutil_shared_dir();                         \
    if (!shared) {                                                      \
        print_message("skipped: ../shared (LLMSERVE_SHARED) is absent\n"); \
        skip();                                                         \
    }

static void test_tokenizer_vectors_llama_spm(void **state) {
    (void)state;
    SKIP_WITHOUT_SHARED(shared);
    int32_t n = 0;
    run_vocab(shared, "ggml-vocab-llama-spm.gguf", &n);
}

static void test_tokenizer_vectors_phi3(void **state) {
    (void)state;
    SKIP_WITHOUT_SHARED(shared);
    int32_t n = 0;
    run_vocab(shared, "ggml-vocab-phi-3.gguf", &n);
}

static void test_tokenizer_vectors_gpt2(void **state) {
    (void)state;
    SKIP_WITHOUT_SHARED(shared);
    int32_t n = 0;
    run_vocab(shared, "ggml-vocab-gpt-2.gguf", &n);
}

static void test_tokenizer_vectors_deepseek_coder(void **state) {
    (void)state;
    SKIP_WITHOUT_SHARED(shared);
    int32_t n = 0;
    run_vocab(shared, "ggml-vocab-deepseek-coder.gguf", &n);
}

static struct tokenizer *load_shared(const char *shared, const char *rel) {
    struct gguf_file *f = NULL;
    assert_int_equal(gguf_open(testutil_path(shared, rel), &f), 0);
    struct tokenizer *t = NULL;
    assert_int_equal(tokenizer_load(f, &t), 0);
    gguf_close(f);
    return t;
}

static void test_tokenizer_stories260k_prompt(void **state) {
    (void)state;
    SKIP_WITHOUT_SHARED(shared);
    struct tokenizer *t = load_shared(shared, "models/stories260K.gguf");
    // README: "Once upon a time" encodes to BOS, " Once", " upon", " a", " time".
    expect_ids(t, "Once upon a time", true, false, (int32_t[]){1, 403, 407, 261, 378}, 5);
    assert_int_equal(tokenizer_n_vocab(t), 512);
    assert_int_equal(tokenizer_bos(t), 1);
    assert_int_equal(tokenizer_eos(t), 2);
    assert_int_equal(tokenizer_unk(t), 0);
    assert_true(tokenizer_adds_bos(t));
    struct buf out = {0};
    int32_t ids[] = {1, 403, 407, 261, 378, 432};
    tokenizer_decode(t, ids, 6, true, &out);
    assert_string_equal(out.data, "Once upon a time,");
    buf_free(&out);
    tokenizer_free(t);
}

static void test_tokenizer_streams_multibyte_text(void **state) {
    (void)state;
    SKIP_WITHOUT_SHARED(shared);
    const char *vocabs[] = {"models/vocab/ggml-vocab-llama-spm.gguf",
                            "models/vocab/ggml-vocab-gpt-2.gguf",
                            "models/stories260K.gguf"};
    // CJK, emoji with ZWJ and variation selector, combining marks, Khmer.
    const char *text = "\xe6\x88\x91\xe6\x83\xb3\xe5\x9c\xa8 apple \xf0\x9f\x98\xb6\xe2\x80\x8d"
                       "\xf0\x9f\x8c\xab\xef\xb8\x8f e\xcc\x81\xcc\x81 "
                       "\xe1\x9e\x80\xe1\x9e\xb6\xe1\x9e\x93\xe1\x9f\x8b \xf0\x9f\xa6\x99!";
    for (size_t v = 0; v < 3; v++) {
        struct tokenizer *t = load_shared(shared, vocabs[v]);
        int32_t *ids = NULL;
        int32_t n = 0;
        assert_int_equal(tokenizer_encode(t, text, strlen(text), true, false, &ids, &n), 0);
        check_stream(t, ids, n, true);
        check_stream(t, ids, n, false);
        struct buf out = {0};
        tokenizer_decode(t, ids, n, true, &out);
        assert_string_equal(out.data, text);
        buf_free(&out);
        free(ids);
        tokenizer_free(t);
    }
}

static void test_tokenizer_special_tokens_phi3(void **state) {
    (void)state;
    SKIP_WITHOUT_SHARED(shared);
    struct tokenizer *t = load_shared(shared, "models/vocab/ggml-vocab-phi-3.gguf");
    assert_int_equal(tokenizer_eos(t), 32000);
    assert_int_equal(tokenizer_eot(t), 32007);  // <|end|>
    assert_true(tokenizer_is_eog(t, 32000));
    assert_true(tokenizer_is_eog(t, 32007));
    assert_false(tokenizer_is_eog(t, 32010));
    const char *chat = "<|user|>\nHi<|end|>\n<|assistant|>";
    int32_t *ids = NULL;
    int32_t n = 0;
    assert_int_equal(tokenizer_encode(t, chat, strlen(chat), true, true, &ids, &n), 0);
    assert_true(n >= 5);
    assert_int_equal(ids[0], 1);
    assert_int_equal(ids[1], 32010);
    assert_int_equal(ids[n - 1], 32001);
    bool has_end = false;
    for (int32_t i = 0; i < n; i++) has_end |= ids[i] == 32007;
    assert_true(has_end);
    free(ids);
    assert_int_equal(tokenizer_encode(t, chat, strlen(chat), false, false, &ids, &n), 0);
    for (int32_t i = 0; i < n; i++) assert_true(ids[i] < 32000);
    free(ids);
    tokenizer_free(t);

    t = load_shared(shared, "models/vocab/ggml-vocab-gpt-2.gguf");
    assert_false(tokenizer_adds_bos(t));
    assert_int_equal(tokenizer_eos(t), 50256);
    expect_ids(t, "a<|endoftext|>", false, true, (int32_t[]){64, 50256}, 2);
    tokenizer_free(t);
}

int main(void) {
    log_set_level(LOG_LEVEL_ERROR);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_spm_merges_by_score),
        cmocka_unit_test(test_spm_parse_special_and_prefix),
        cmocka_unit_test(test_tokenizer_rejects_bad_text),
        cmocka_unit_test(test_tokenizer_decode_replaces_invalid_utf8),
        cmocka_unit_test(test_tokenizer_rejects_hostile_metadata),
        cmocka_unit_test(test_pretok_splits_like_the_reference_regexes),
        cmocka_unit_test(test_pretok_knows_the_popular_names),
        cmocka_unit_test(test_tokenizer_vectors_llama_spm),
        cmocka_unit_test(test_tokenizer_vectors_phi3),
        cmocka_unit_test(test_tokenizer_vectors_gpt2),
        cmocka_unit_test(test_tokenizer_vectors_deepseek_coder),
        cmocka_unit_test(test_tokenizer_stories260k_prompt),
        cmocka_unit_test(test_tokenizer_streams_multibyte_text),
        cmocka_unit_test(test_tokenizer_special_tokens_phi3),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
