/*
 * test_grammar.c - token masks of the grammar matcher. Oracles: masks derived
 * by hand for a small SPM vocabulary (multi-element tokens, byte tokens that
 * split a UTF-8 character, a dummy-prefix space, control tokens), and, over
 * random walks, a brute force: a token is allowed iff history + its bytes is
 * a viable prefix for a backtracking recogniser of the same grammar written
 * by hand in this file (no GBNF parser, no automaton), on the synthetic
 * vocabulary and on stories260K's real one when ../shared has it.
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

#define N_BASE TESTUTIL_SPM_BASE  // <unk> <s> </s> and the 256 byte tokens
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
    const char *tokens[N_VOCAB];
    float scores[N_VOCAB];
    int32_t types[N_VOCAB];
    testutil_spm_base(tokens, scores, types);
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

/* An independent recogniser of walk_grammar below, written by hand from the
 * grammar's text (no GBNF parser, no automaton): each nonterminal maps a set of
 * start positions to the set of end positions it can reach, backtracking
 * through every alternative. Trying a terminal at the end of the input sets
 * hit_end: the input is then a viable prefix (every rule here derives some
 * non-empty string, so the attempt can be completed). Code points are decoded
 * by RFC 3629's table of well-formed UTF-8 sequences. */
#define RP_MAX 512
struct rpos {
    uint64_t w[RP_MAX / 64];
};
struct rec {
    const uint8_t *s;
    size_t n;
    bool hit_end;
};

static bool rp_has(const struct rpos *p, size_t i) { return (p->w[i >> 6] >> (i & 63)) & 1; }
static void rp_add(struct rpos *p, size_t i) { p->w[i >> 6] |= 1ull << (i & 63); }
static bool rp_empty(const struct rpos *p) {
    for (int i = 0; i < RP_MAX / 64; i++)
        if (p->w[i]) return false;
    return true;
}
static struct rpos rp_or(struct rpos a, const struct rpos *b) {
    for (int i = 0; i < RP_MAX / 64; i++) a.w[i] |= b->w[i];
    return a;
}
static struct rpos rp_one(size_t i) {
    struct rpos p = {{0}};
    rp_add(&p, i);
    return p;
}

static struct rpos r_lit(struct rec *r, struct rpos in, const char *lit) {
    struct rpos out = {{0}};
    size_t len = strlen(lit);
    for (size_t p = 0; p <= r->n; p++) {
        if (!rp_has(&in, p)) continue;
        size_t i = 0;
        while (i < len && p + i < r->n && r->s[p + i] == (uint8_t)lit[i]) i++;
        if (i == len) rp_add(&out, p + len);
        else if (p + i == r->n) r->hit_end = true;
    }
    return out;
}

/* One byte b with in_set(b). */
static struct rpos r_byte(struct rec *r, struct rpos in, bool (*in_set)(int)) {
    struct rpos out = {{0}};
    for (size_t p = 0; p <= r->n; p++) {
        if (!rp_has(&in, p)) continue;
        if (p == r->n) r->hit_end = true;
        else if (in_set(r->s[p])) rp_add(&out, p + 1);
    }
    return out;
}

/* One well-formed UTF-8 character other than '"' and '\\' ([^"\\]). */
static struct rpos r_str_char(struct rec *r, struct rpos in) {
    struct rpos out = {{0}};
    for (size_t p = 0; p <= r->n; p++) {
        if (!rp_has(&in, p)) continue;
        if (p == r->n) {
            r->hit_end = true;
            continue;
        }
        uint8_t c = r->s[p];
        size_t len;
        uint8_t lo = 0x80, hi = 0xBF;  // the second byte's range (RFC 3629, section 4)
        if (c < 0x80) {
            if (c != '"' && c != '\\') rp_add(&out, p + 1);
            continue;
        } else if (c >= 0xC2 && c <= 0xDF) {
            len = 2;
        } else if (c >= 0xE0 && c <= 0xEF) {
            len = 3;
            if (c == 0xE0) lo = 0xA0;
            if (c == 0xED) hi = 0x9F;
        } else if (c >= 0xF0 && c <= 0xF4) {
            len = 4;
            if (c == 0xF0) lo = 0x90;
            if (c == 0xF4) hi = 0x8F;
        } else {
            continue;
        }
        size_t i = 1;
        for (; i < len && p + i < r->n; i++) {
            uint8_t b = r->s[p + i];
            if (i == 1 ? (b < lo || b > hi) : (b < 0x80 || b > 0xBF)) break;
        }
        if (i == len) rp_add(&out, p + len);
        else if (p + i == r->n) r->hit_end = true;
    }
    return out;
}

static bool set_digit(int b) { return b >= '0' && b <= '9'; }
static bool set_ws(int b) { return b == ' ' || b == '\n'; }
static bool set_esc(int b) { return b == '"' || b == '\\' || b == 'n'; }

static struct rpos r_opt(struct rpos in, struct rpos taken) { return rp_or(in, &taken); }

static struct rpos r_ws(struct rec *r, struct rpos in) { return r_opt(in, r_byte(r, in, set_ws)); }

static struct rpos r_str(struct rec *r, struct rpos in) {
    struct rpos at = r_lit(r, in, "\"");
    struct rpos all = at;
    while (!rp_empty(&at)) {  // ( [^"\\] | "\\" ["\\n] )*
        struct rpos a = r_str_char(r, at);
        struct rpos b = r_byte(r, r_lit(r, at, "\\"), set_esc);
        struct rpos next = rp_or(a, &b);
        for (int i = 0; i < RP_MAX / 64; i++) next.w[i] &= ~all.w[i];
        all = rp_or(all, &next);
        at = next;
    }
    return r_lit(r, all, "\"");
}

static struct rpos r_plus_digits(struct rec *r, struct rpos in) {
    struct rpos at = r_byte(r, in, set_digit);
    struct rpos all = at;
    while (!rp_empty(&at)) {
        at = r_byte(r, at, set_digit);
        all = rp_or(all, &at);
    }
    return all;
}

static struct rpos r_num(struct rec *r, struct rpos in) {
    struct rpos a = r_plus_digits(r, r_opt(in, r_lit(r, in, "-")));
    return r_opt(a, r_plus_digits(r, r_lit(r, a, ".")));
}

static struct rpos r_root(struct rec *r, struct rpos in);

static struct rpos r_val(struct rec *r, struct rpos in) {
    if (rp_empty(&in)) return in;  // the recursion ends when nothing is left to parse
    struct rpos out = r_str(r, in);
    struct rpos x = r_num(r, in);
    out = rp_or(out, &x);
    x = r_lit(r, in, "true");
    out = rp_or(out, &x);
    x = r_lit(r, in, "null");
    out = rp_or(out, &x);
    // "[" ws (val ("," ws val)*)? "]"
    struct rpos open = r_ws(r, r_lit(r, in, "["));
    if (!rp_empty(&open)) {
        struct rpos at = r_val(r, open);
        struct rpos items = at;
        while (!rp_empty(&at)) {
            at = r_val(r, r_ws(r, r_lit(r, at, ",")));
            items = rp_or(items, &at);
        }
        x = r_lit(r, rp_or(open, &items), "]");
        out = rp_or(out, &x);
    }
    x = r_root(r, in);
    return rp_or(out, &x);
}

static struct rpos r_pair(struct rec *r, struct rpos in) {
    return r_ws(r, r_val(r, r_ws(r, r_lit(r, r_str(r, in), ":"))));
}

static struct rpos r_root(struct rec *r, struct rpos in) {
    struct rpos at = r_pair(r, r_ws(r, r_lit(r, in, "{")));
    struct rpos all = at;
    while (!rp_empty(&at)) {
        at = r_pair(r, r_ws(r, r_lit(r, at, ",")));
        all = rp_or(all, &at);
    }
    return r_lit(r, all, "}");
}

/* REJECT, PREFIX (viable, not complete) or FULL. */
enum { R_REJECT, R_PREFIX, R_FULL };
static int recognise(const uint8_t *s, size_t n) {
    assert_true(n < RP_MAX);
    struct rec r = {.s = s, .n = n};
    struct rpos end = r_root(&r, rp_one(0));
    if (rp_has(&end, n)) return R_FULL;
    return r.hit_end || n == 0 ? R_PREFIX : R_REJECT;
}

/* The recogniser itself, on strings whose status is plain from the grammar. */
static void test_grammar_recogniser_oracle_is_sound(void **state) {
    (void)state;
    const char *full[] = {"{\"a\":1}", "{\"a\": [1, \"x\", true]}", "{\"\xc3\xa9\":{\"b\":null}}",
                          "{\"a\":\"\\n\"\n}", "{\"a\":-1.5,\n\"b\":[]}"};
    const char *prefix[] = {"", "{", "{\"a", "{\"a\":1", "{\"a\":-", "{\"\xc3", "{\"a\":[1,"};
    const char *reject[] = {"}", "{}", "{\"a\":1,}", "{\"a\":01.}", "{\"\xc3\x41",
                            "{\"\xed\xa0\x80\"", "{\"a\":1}}", "{\"a\":[,]}"};
    for (size_t i = 0; i < sizeof(full) / sizeof(*full); i++)
        assert_int_equal(recognise((const uint8_t *)full[i], strlen(full[i])), R_FULL);
    for (size_t i = 0; i < sizeof(prefix) / sizeof(*prefix); i++)
        assert_int_equal(recognise((const uint8_t *)prefix[i], strlen(prefix[i])), R_PREFIX);
    for (size_t i = 0; i < sizeof(reject) / sizeof(*reject); i++)
        if (recognise((const uint8_t *)reject[i], strlen(reject[i])) != R_REJECT)
            fail_msg("\"%s\" should be rejected", reject[i]);
}

/* Allowed by brute force: the history plus the token's piece is a viable
 * prefix for the independent recogniser; an end-of-generation token needs
 * the history to be complete. */
static bool brute_allows(const struct buf *hist, const struct tokenizer *t, int32_t id) {
    if (tokenizer_is_eog(t, id)) return recognise((const uint8_t *)hist->data, hist->len) == R_FULL;
    struct buf text = {0};
    if (hist->len) buf_append(&text, hist->data, hist->len);
    size_t n0 = text.len;
    tokenizer_token_to_piece(t, id, false, &text);
    bool ok = text.len > n0 && recognise((const uint8_t *)text.data, text.len) != R_REJECT;
    buf_free(&text);
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
                bool b = brute_allows(&hist, t, id);
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
        assert_int_equal(grammar_n_masks_cut(gm), 0);  // a JSON grammar is far from the bound
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
/* grammar_mark / grammar_rewind (a speculative draft tried against the
 * grammar). Hand-derived from root ::= ("a"{0,1000} "b"){5} "!": five blocks
 * of up to 1000 a's and a b, then "!". A trial that completes the grammar is
 * undone; a trial of 5004 new states (4 full blocks and 1000 a's: past the
 * 4096 tables the matcher keeps before it compacts, as the test below shows)
 * compacts nothing while the mark is held, and the mark is then still the
 * start; the first accept after the rewind compacts. */
static void test_grammar_mark_and_rewind(void **state) {
    (void)state;
    struct grammar *gm = make("root ::= (\"a\"{0,1000} \"b\"){5} \"!\"");
    assert_int_equal(grammar_accept_bytes(gm, "ab", 2), GRAMMAR_STEP_OK);  // block 1
    int32_t at = grammar_mark(gm);
    assert_int_equal(grammar_accept_bytes(gm, "bbbb", 4), GRAMMAR_STEP_OK);
    assert_int_equal(grammar_accept_bytes(gm, "!", 1), GRAMMAR_STEP_DONE);
    grammar_rewind(gm, at);
    assert_false(grammar_is_accepting(gm));
    assert_int_equal(grammar_accept_bytes(gm, "bbb!", 4), GRAMMAR_STEP_REJECT);  // 4 blocks
    assert_int_equal(grammar_accept_bytes(gm, "bbbb!", 5), GRAMMAR_STEP_DONE);
    grammar_free(gm);

    gm = make("root ::= (\"a\"{0,1000} \"b\"){5} \"!\"");
    at = grammar_mark(gm);
    for (int blk = 0; blk < 5; blk++) {
        for (int i = 0; i < 1000; i++) assert_int_equal(grammar_accept_bytes(gm, "a", 1), GRAMMAR_STEP_OK);
        if (blk < 4) assert_int_equal(grammar_accept_bytes(gm, "b", 1), GRAMMAR_STEP_OK);
    }
    assert_true(grammar_n_states(gm) > 5000);
    assert_int_equal(grammar_n_compactions(gm), 0);
    grammar_rewind(gm, at);
    assert_int_equal(grammar_accept_bytes(gm, "b", 1), GRAMMAR_STEP_OK);  // block 1 of 0 a's
    assert_int_equal(grammar_n_compactions(gm), 1);
    assert_int_equal(grammar_accept_bytes(gm, "bbbb!", 5), GRAMMAR_STEP_DONE);
    grammar_free(gm);
}

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

/* A grammar ambiguous enough that the matcher follows tens of thousands of
 * stacks at once (found by the grammar fuzz target: ')', '+' and '-' are
 * both syntax and term characters, so each of them multiplies the ways to
 * read the nesting): grammar_mask() stops at its bound of work instead of taking
 * 100+ ms per token (docs/reliability.md), and what it allows stays sound.
 * Oracle, derived by hand from the grammar: its bytes are '(' and [)-9],
 * and after any string of them every one of them continues it (')' can
 * always be a term character, '(' always opens a group, a term may follow
 * anything), so the tokens allowed are exactly those whose every byte is
 * in [(-9]; and the string is a whole sentence, so end of generation is
 * allowed, exactly when closing the innermost open group at each ')' closes
 * them all. A cut mask may only leave tokens out, an uncut one must be
 * exact. */
static void test_grammar_ambiguous_masks_are_bounded_and_sound(void **state) {
    (void)state;
    struct tokenizer *t = syn_tokenizer();
    struct grammar_vocab *v = grammar_vocab_create(t);
    // [)-9] holds ')' and '+', '-', digits: each of those is both a term character and
    // syntax. The drive is the fuzzer's input, the bytes the grammar accepted.
    struct grammar *gm = make("root ::= expr\n"
                              "expr ::= term* ((\"+\" | \"-\") term)*\n"
                              "term ::= [)-9]+ | \"(\" expr \")\"\n");
    static const char text[] =
        "(1+2)))))))))))))))))))))))))))))))-9+()(1+2)(((((+()(1+2)(1+2)(((((+()(1+2)"
        "(((((((((((((((((((((((((((((((((((((((()))))))))))))))))))))))-9+"
        "((((((((((((((((((((((((()9((1(5";
    struct buf drive = {0};
    buf_append(&drive, text, sizeof(text) - 1);
    uint64_t m[(N_VOCAB + 63) / 64];
    int64_t n_cut = 0;
    int32_t depth = 0;  // groups left open when each ')' closes one if it can
    for (size_t i = 0; i < drive.len; i++) {
        const int64_t cut0 = grammar_n_masks_cut(gm);
        const int32_t n = grammar_mask(gm, v, m);
        // Cut now (counted), or cut before and cached (not counted again): either way
        // grammar_is_mask_cut says so, and a mask it calls uncut must be exact (below).
        const bool is_cut = grammar_is_mask_cut(gm);
        if (grammar_n_masks_cut(gm) > cut0) assert_true(is_cut);
        n_cut += is_cut;
        if (n > 0) {  // asked again: the same mask from the cache, still known to be cut
            uint64_t again[(N_VOCAB + 63) / 64];  // (one that allowed nothing is not cached:
            assert_int_equal(grammar_mask(gm, v, again), n);  // a new walk may get further)
            assert_memory_equal(again, m, sizeof(m));
            assert_true(grammar_is_mask_cut(gm) == is_cut);
        }
        int32_t n_set = 0;
        for (int b = 0; b < 256; b++) {
            const bool in_mask = has(m, byte_tok(b));
            const bool allowed = b >= '(' && b <= '9';
            if (in_mask && !allowed) fail_msg("byte %d: %d allowed, not in the grammar", (int)i, b);
            if (!is_cut && in_mask != allowed) {
                fail_msg("byte %d: %d left out of an uncut mask", (int)i, b);
            }
        }
        for (int k = 0; k < N_EXTRA - 1; k++) {  // multi-byte pieces: every byte in [(-9]
            bool in_range = true;
            for (const char *q = extra[k]; *q; q++) in_range &= *q >= '(' && *q <= '9';
            const bool in_mask = has(m, N_BASE + k);
            if (in_mask && !in_range) fail_msg("byte %d: '%s' allowed", (int)i, extra[k]);
            if (!is_cut && in_mask != in_range) {
                fail_msg("byte %d: '%s' left out", (int)i, extra[k]);
            }
        }
        assert_int_equal(has(m, 2), depth == 0);  // eos: the end is never cut
        for (int32_t id = 0; id < N_VOCAB; id++) n_set += has(m, id);
        assert_int_equal(n, n_set);
        assert_true(n > 0 || is_cut);  // the grammar never dead-ends on this drive
        if (n == 0) assert_true(grammar_is_cut_dead(gm));
        const uint8_t c = (uint8_t)drive.data[i];
        assert_true(grammar_allows_byte(gm, c));
        assert_int_not_equal(grammar_accept_bytes(gm, &c, 1), GRAMMAR_STEP_REJECT);
        if (c == '(') depth++;
        if (c == ')' && depth > 0) depth--;
    }
    print_message("%lld of %zu masks cut short\n", (long long)n_cut, drive.len);
    assert_true(n_cut > 0);  // the bound was reached: the test reaches the cut path
    buf_free(&drive);
    grammar_free(gm);
    grammar_vocab_free(v);
    tokenizer_free(t);
}

/* An ambiguous grammar whose stacks all grow with every byte (the grammar
 * fuzz target's slow input, docs/reliability.md): before, once the frames
 * of the current stacks passed the matcher's 2^18-node cap, every byte
 * copied them all again (a tenth of a second a byte, 12 s for this drive).
 * Oracle, derived by hand from the grammar: after n 'a's there are 2^n
 * stacks (each 'a' opens a p whose end is "b" or "c"), and each '(' puts one
 * more frame (the ")" to come) on every one of them, so after 12 'a's and k
 * '(' the stacks hold over 4096 k frames: past 2^17 (the bound a compaction
 * may keep) by k = 32, below it up to k = 16. So: the first 12 + 16 bytes
 * are accepted; then the matcher may stop following, and once it does it
 * accepts nothing, allows no byte and gives cut, empty masks; it never
 * holds more than 2^18 nodes plus one byte's growth; and it compacts a
 * handful of times (each compaction keeps at most 2^17 nodes, and the next
 * one waits until 2^17 more are made), not once a byte. A deep nesting with
 * a single stack is followed to the end. */
static void test_grammar_growing_stacks_are_bounded(void **state) {
    (void)state;
    struct tokenizer *t = syn_tokenizer();
    struct grammar_vocab *v = grammar_vocab_create(t);
    uint64_t m[(N_VOCAB + 63) / 64];
    struct grammar *gm = make("root ::= p\n"
                              "p ::= \"a\" p \"b\" | \"a\" p \"c\" | q\n"
                              "q ::= \"(\" q \")\" | \"x\"\n");
    int i_stop = -1;  // the first byte refused
    for (int i = 0; i < 12 + 300; i++) {
        const uint8_t c = i < 12 ? 'a' : '(';
        const bool allowed = grammar_allows_byte(gm, c);
        const enum grammar_step st = grammar_accept_bytes(gm, &c, 1);
        assert_int_equal(st != GRAMMAR_STEP_REJECT, allowed);
        assert_true(grammar_n_nodes(gm) <= 3 << 17);
        if (st == GRAMMAR_STEP_REJECT && i_stop < 0) i_stop = i;
        if (i_stop >= 0) assert_int_equal(st, GRAMMAR_STEP_REJECT);  // stopped for good
    }
    print_message("stopped following at byte %d, %lld compactions\n", i_stop,
                  (long long)grammar_n_compactions(gm));
    assert_true(i_stop < 0 || i_stop >= 12 + 16);
    assert_true(grammar_n_compactions(gm) <= 4);  // before: about 250
    if (i_stop >= 0) {
        assert_false(grammar_allows_byte(gm, 'x'));
        assert_int_equal(grammar_mask(gm, v, m), 0);
        assert_true(grammar_is_cut_dead(gm));  // not a dead end: the caller says so
        assert_int_equal(grammar_accept_token(gm, v, 2), GRAMMAR_STEP_REJECT);
    }
    grammar_free(gm);

    gm = make("root ::= q\nq ::= \"(\" q \")\" | \"x\"\n");  // one stack, 20000 frames deep
    for (int i = 0; i < 20000; i++) assert_int_equal(grammar_accept_bytes(gm, "(", 1), GRAMMAR_STEP_OK);
    assert_int_equal(grammar_accept_bytes(gm, "x", 1), GRAMMAR_STEP_OK);
    for (int i = 0; i < 19999; i++) assert_int_equal(grammar_accept_bytes(gm, ")", 1), GRAMMAR_STEP_OK);
    assert_int_equal(grammar_accept_bytes(gm, ")", 1), GRAMMAR_STEP_DONE);
    grammar_free(gm);
    grammar_vocab_free(v);
    tokenizer_free(t);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_grammar_recogniser_oracle_is_sound),
        cmocka_unit_test(test_grammar_mask_hand_derived),
        cmocka_unit_test(test_grammar_mask_partial_utf8),
        cmocka_unit_test(test_grammar_mask_matches_brute_force_synthetic),
        cmocka_unit_test(test_grammar_mask_matches_brute_force_stories),
        cmocka_unit_test(test_grammar_compaction_keeps_language),
        cmocka_unit_test(test_grammar_ambiguous_masks_are_bounded_and_sound),
        cmocka_unit_test(test_grammar_growing_stacks_are_bounded),
        cmocka_unit_test(test_grammar_mark_and_rewind),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
