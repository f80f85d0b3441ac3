/*
 * test_grammar.c - token masks of the grammar matcher. Oracles: masks derived
 * by hand for a small SPM vocabulary (multi-element tokens, byte tokens that
 * split a UTF-8 character, a dummy-prefix space, control tokens), and, over
 * random walks, a brute force that feeds every token's bytes to a fresh
 * matcher replaying the history (no trie, no cached transitions), on the
 * synthetic vocabulary and on stories260K's real one when ../shared has it.
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
#include "engine/text/gbnf.h"
#include "engine/format/gguf.h"
#include "engine/text/grammar.h"
#include "engine/text/tokenizer.h"
#include "tests/helpers/gguf_builder.h"
#include "tests/helpers/testutil.h"

#define N_BASE 259  // <unk> <s> </s> and the 256 byte tokens
static const char *const extra[] = {
    "{", "{\"", "\"", "\":", "a", "ab", "b\":", "1", "12", "}", "1}", "\xe2\x96\x81{",
    "\xc3\xa9", "x\"", "\":1}", "<|ctl|>",
};
#define N_EXTRA ((int)(sizeof(extra) / sizeof(extra[0])))
#define N_VOCAB (N_BASE + N_EXTRA)

static int32_t tok(const char *piece) {
    for (int i = 0; i < N_EXTRA; i++)
        if (strcmp(extra[i], piece) == 0) return N_BASE + i;
    fail_msg("no token %s", piece);
    return -1;
}

static int32_t byte_tok(int b) { return 3 + b; }

static struct tokenizer *syn_tokenizer(void) {
    static char names[256][8];
    const char *tokens[N_VOCAB];
    float scores[N_VOCAB];
    int32_t types[N_VOCAB];
    tokens[0] = "<unk>";
    tokens[1] = "<s>";
    tokens[2] = "</s>";
    types[0] = TOKENIZER_TYPE_UNKNOWN;
    types[1] = types[2] = TOKENIZER_TYPE_CONTROL;
    for (int i = 0; i < 256; i++) {
        snprintf(names[i], sizeof(names[i]), "<0x%02X>", i);
        tokens[3 + i] = names[i];
        types[3 + i] = TOKENIZER_TYPE_BYTE;
    }
    for (int i = 0; i < N_EXTRA; i++) {
        tokens[N_BASE + i] = extra[i];
        types[N_BASE + i] = TOKENIZER_TYPE_NORMAL;
    }
    types[N_VOCAB - 1] = TOKENIZER_TYPE_CONTROL;
    for (int i = 0; i < N_VOCAB; i++) scores[i] = -(float)i;
    struct gguf_builder *b = gguf_builder_create(3);
    gguf_builder_kv_str(b, "tokenizer.ggml.model", "llama");
    gguf_builder_kv_arr_str(b, "tokenizer.ggml.tokens", N_VOCAB, tokens);
    gguf_builder_kv_arr(b, "tokenizer.ggml.scores", GGUF_TYPE_FLOAT32, N_VOCAB, scores);
    gguf_builder_kv_arr(b, "tokenizer.ggml.token_type", GGUF_TYPE_INT32, N_VOCAB, types);
    gguf_builder_kv_u32(b, "tokenizer.ggml.bos_token_id", 1);
    gguf_builder_kv_u32(b, "tokenizer.ggml.eos_token_id", 2);
    size_t size = 0;
    uint8_t *bytes = gguf_builder_finish(b, &size);
    struct gguf_file *f = NULL;
    assert_int_equal(gguf_open_memory(bytes, size, "syn.gguf", &f), 0);
    struct tokenizer *t = NULL;
    assert_int_equal(tokenizer_load(f, &t), 0);
    gguf_close(f);
    free(bytes);
    gguf_builder_destroy(b);
    return t;
}

static struct grammar *make(const char *text) {
    struct gbnf *g = NULL;
    char msg[256];
    if (gbnf_compile(text, strlen(text), &g, msg, sizeof(msg))) fail_msg("%s", msg);
    struct grammar *gm = grammar_create(g);
    gbnf_release(g);
    return gm;
}

static bool has(const uint64_t *m, int32_t id) { return (m[id >> 6] >> (id & 63)) & 1; }

/* The mask must be exactly want [n_want]. */
static void expect_mask(struct grammar *gm, const struct grammar_vocab *v, const int32_t *want,
                        int n_want) {
    uint64_t m[(N_VOCAB + 63) / 64];
    int32_t n = grammar_mask(gm, v, m);
    for (int32_t id = 0; id < N_VOCAB; id++) {
        bool w = false;
        for (int i = 0; i < n_want; i++) w |= want[i] == id;
        if (has(m, id) != w) fail_msg("token %d: allowed %d, want %d", (int)id, has(m, id), w);
    }
    assert_int_equal(n, n_want);
}

static void test_grammar_mask_hand_derived(void **state) {
    (void)state;
    struct tokenizer *t = syn_tokenizer();
    struct grammar_vocab *v = grammar_vocab_create(t);
    struct grammar *gm = make("root ::= \"{\\\"\" [a-z]+ \"\\\":\" [0-9]+ \"}\"");
    // start: only tokens that begin with '{' and stay inside the sentence
    int32_t w0[] = {tok("{"), tok("{\""), byte_tok('{')};
    expect_mask(gm, v, w0, 3);
    assert_int_equal(grammar_accept_token(gm, v, tok("{\"")), GRAMMAR_STEP_OK);
    // inside the key: letters, and tokens that run on into the closing quote
    int32_t w1[30];
    int n1 = 0;
    for (int c = 'a'; c <= 'z'; c++) w1[n1++] = byte_tok(c);
    w1[n1++] = tok("a");
    w1[n1++] = tok("ab");
    w1[n1++] = tok("b\":");
    w1[n1++] = tok("x\"");
    expect_mask(gm, v, w1, n1);
    assert_int_equal(grammar_accept_token(gm, v, tok("ab")), GRAMMAR_STEP_OK);
    int32_t w2[40];
    int n2 = 0;
    for (int i = 0; i < n1; i++) w2[n2++] = w1[i];
    w2[n2++] = tok("\"");
    w2[n2++] = tok("\":");
    w2[n2++] = tok("\":1}");
    w2[n2++] = byte_tok('"');
    expect_mask(gm, v, w2, n2);
    assert_int_equal(grammar_accept_token(gm, v, tok("\":")), GRAMMAR_STEP_OK);
    int32_t w3[20];
    int n3 = 0;
    for (int c = '0'; c <= '9'; c++) w3[n3++] = byte_tok(c);
    w3[n3++] = tok("1");
    w3[n3++] = tok("12");
    w3[n3++] = tok("1}");
    expect_mask(gm, v, w3, n3);
    // not allowed: state unchanged
    assert_int_equal(grammar_accept_token(gm, v, tok("}")), GRAMMAR_STEP_REJECT);
    assert_int_equal(grammar_accept_token(gm, v, 2), GRAMMAR_STEP_REJECT);  // eos too early
    assert_int_equal(grammar_accept_token(gm, v, tok("12")), GRAMMAR_STEP_OK);
    w3[n3++] = tok("}");
    w3[n3++] = byte_tok('}');
    expect_mask(gm, v, w3, n3);
    assert_false(grammar_is_accepting(gm));
    assert_int_equal(grammar_accept_token(gm, v, tok("}")), GRAMMAR_STEP_DONE);
    // complete: only the end-of-generation token
    int32_t w4[] = {2};
    expect_mask(gm, v, w4, 1);
    grammar_free(gm);
    grammar_vocab_free(v);
    tokenizer_free(t);
}

/* A character split across byte tokens, and an optional ending. */
static void test_grammar_mask_partial_utf8(void **state) {
    (void)state;
    struct tokenizer *t = syn_tokenizer();
    struct grammar_vocab *v = grammar_vocab_create(t);
    struct grammar *gm = make("root ::= (\"\xc3\xa9\" | \"\xc3\xab\") \"1\"?");
    int32_t w0[] = {tok("\xc3\xa9"), byte_tok(0xC3)};
    expect_mask(gm, v, w0, 2);
    assert_int_equal(grammar_accept_token(gm, v, byte_tok(0xC3)), GRAMMAR_STEP_OK);
    int32_t w1[] = {byte_tok(0xA9), byte_tok(0xAB)};
    expect_mask(gm, v, w1, 2);
    assert_int_equal(grammar_accept_token(gm, v, byte_tok(0xAB)), GRAMMAR_STEP_OK);
    // may end (eos allowed) or take the optional "1" (alone, or as "1}"? no: '}' is not allowed)
    int32_t w2[] = {2, tok("1"), byte_tok('1')};
    expect_mask(gm, v, w2, 3);
    assert_true(grammar_is_accepting(gm));
    assert_int_equal(grammar_accept_token(gm, v, 2), GRAMMAR_STEP_DONE);
    grammar_free(gm);
    // the dummy-prefix space is a byte like any other
    gm = make("root ::= \" \"? \"{\" \"}\"");
    int32_t w3[] = {tok("{"), byte_tok('{'), byte_tok(' '), tok("\xe2\x96\x81{")};
    expect_mask(gm, v, w3, 4);
    grammar_free(gm);
    grammar_vocab_free(v);
    tokenizer_free(t);
}

/* Allowed by brute force: a fresh matcher fed the history, then the piece. */
static bool brute_allows(const char *grammar, const struct buf *hist, const struct tokenizer *t,
                         const struct grammar_vocab *v, int32_t id) {
    struct grammar *gm = make(grammar);
    bool ok = hist->len == 0 || grammar_accept_bytes(gm, hist->data, hist->len) != GRAMMAR_STEP_REJECT;
    assert_true(ok);
    if (tokenizer_is_eog(t, id)) {
        ok = grammar_is_accepting(gm);
    } else {
        struct buf piece = {0};
        tokenizer_token_to_piece(t, id, false, &piece);
        ok = piece.len > 0 && grammar_accept_bytes(gm, piece.data, piece.len) != GRAMMAR_STEP_REJECT;
        buf_free(&piece);
    }
    (void)v;
    grammar_free(gm);
    return ok;
}

static const char walk_grammar[] =
    "root ::= \"{\" ws pair (\",\" ws pair)* \"}\"\n"
    "pair ::= str \":\" ws val ws\n"
    "val ::= str | num | \"true\" | \"null\" | \"[\" ws (val (\",\" ws val)*)? \"]\" | root\n"
    "str ::= \"\\\"\" ([^\"\\\\] | \"\\\\\" [\"\\\\n])* \"\\\"\"\n"
    "num ::= \"-\"? [0-9]+ (\".\" [0-9]+)?\n"
    "ws ::= [ \\n]?\n";

static void random_walks(const struct tokenizer *t, int n_walks, int n_steps, uint64_t seed) {
    struct grammar_vocab *v = grammar_vocab_create(t);
    int32_t n_vocab = tokenizer_n_vocab(t);
    uint64_t *m = malloc(grammar_mask_words(n_vocab) * sizeof(*m));
    uint64_t x = seed;
    for (int w = 0; w < n_walks; w++) {
        struct grammar *gm = make(walk_grammar);
        struct buf hist = {0};
        for (int step = 0; step < n_steps; step++) {
            int32_t n = grammar_mask(gm, v, m);
            int32_t n_brute = 0;
            for (int32_t id = 0; id < n_vocab; id++) {
                bool b = brute_allows(walk_grammar, &hist, t, v, id);
                if (b != has(m, id))
                    fail_msg("seed %llu walk %d step %d token %d: mask %d brute %d",
                             (unsigned long long)seed, w, step, (int)id, has(m, id), b);
                n_brute += b;
            }
            assert_int_equal(n, n_brute);
            if (n == 0) break;
            // pick the k-th allowed token, preferring to move on
            x = x * 6364136223846793005ull + 1442695040888963407ull;
            int32_t k = (int32_t)((x >> 33) % (uint64_t)n);
            int32_t id = -1;
            for (int32_t i = 0; i < n_vocab; i++) {
                if (has(m, i) && k-- == 0) {
                    id = i;
                    break;
                }
            }
            enum grammar_step st = grammar_accept_token(gm, v, id);
            assert_int_not_equal(st, GRAMMAR_STEP_REJECT);
            if (st == GRAMMAR_STEP_DONE) break;
            tokenizer_token_to_piece(t, id, false, &hist);
        }
        buf_free(&hist);
        grammar_free(gm);
    }
    free(m);
    grammar_vocab_free(v);
}

static void test_grammar_mask_matches_brute_force_synthetic(void **state) {
    (void)state;
    struct tokenizer *t = syn_tokenizer();
    random_walks(t, 4, 24, 7);
    tokenizer_free(t);
}

static void test_grammar_mask_matches_brute_force_stories(void **state) {
    (void)state;
    const char *shared = testutil_shared_dir();
    const char *path = shared ? testutil_path(shared, "models/stories260K.gguf") : NULL;
    if (!path || !testutil_exists(path)) skip();  // needs ../shared/models/stories260K.gguf
    struct gguf_file *f = NULL;
    assert_int_equal(gguf_open(path, &f), 0);
    struct tokenizer *t = NULL;
    assert_int_equal(tokenizer_load(f, &t), 0);
    gguf_close(f);
    random_walks(t, 3, 16, 11);
    tokenizer_free(t);
}

/* Many steps through distinct states: the tables pass their caps and the
 * matcher compacts, without changing what it accepts. */
static void test_grammar_compaction_keeps_language(void **state) {
    (void)state;
    // 5 x 1001 distinct states along the way: more than the 4096 transition
    // tables a matcher keeps, so it compacts on the way.
    struct grammar *gm = make("root ::= (\"a\"{0,1000} \"b\"){5} \"!\"");
    for (int blk = 0; blk < 5; blk++) {
        for (int i = 0; i < 1000; i++) assert_int_equal(grammar_accept_bytes(gm, "a", 1), GRAMMAR_STEP_OK);
        if (blk == 4) assert_int_equal(grammar_accept_bytes(gm, "a", 1), GRAMMAR_STEP_REJECT);
        assert_int_equal(grammar_accept_bytes(gm, "b", 1), GRAMMAR_STEP_OK);
    }
    assert_true(grammar_n_states(gm) < 4200);  // without compaction: over 5000
    assert_int_equal(grammar_accept_bytes(gm, "b", 1), GRAMMAR_STEP_REJECT);
    assert_false(grammar_is_accepting(gm));
    assert_int_equal(grammar_accept_bytes(gm, "!", 1), GRAMMAR_STEP_DONE);
    grammar_free(gm);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_grammar_mask_hand_derived),
        cmocka_unit_test(test_grammar_mask_partial_utf8),
        cmocka_unit_test(test_grammar_mask_matches_brute_force_synthetic),
        cmocka_unit_test(test_grammar_mask_matches_brute_force_stories),
        cmocka_unit_test(test_grammar_compaction_keeps_language),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
