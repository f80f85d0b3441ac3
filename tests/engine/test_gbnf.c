/*
 * test_gbnf.c - the GBNF compiler, judged by the language it accepts: sets of
 * strings derived by hand from each grammar's definition (in the published
 * GBNF semantics llama.cpp documents in grammars/README.md), a json.gbnf-shaped
 * grammar written here against strings whose JSON validity is RFC 8259's, the
 * error for each kind of bad grammar, and a seeded fuzz of mutated grammars
 * that must compile or fail cleanly, never crash.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/base/err.h"
#include "engine/text/gbnf.h"
#include "engine/text/grammar.h"

enum { REJECT = -1, PREFIX = 0, FULL = 1 };

/* FULL when text is a sentence of the grammar, PREFIX when only a prefix of
 * one, REJECT otherwise. */
static int match(const char *grammar, const char *text) {
    struct gbnf *g = NULL;
    char msg[256];
    int err = gbnf_compile(grammar, strlen(grammar), &g, msg, sizeof(msg));
    if (err) fail_msg("compile failed: %s", msg);
    struct grammar *gm = grammar_create(g);
    gbnf_release(g);
    enum grammar_step st = grammar_accept_bytes(gm, text, strlen(text));
    int r = st == GRAMMAR_STEP_REJECT ? REJECT : grammar_is_accepting(gm) ? FULL : PREFIX;
    grammar_free(gm);
    return r;
}

/* The same, one byte at a time (the matcher's state carried across calls). */
static int match_bytewise(const char *grammar, const char *text) {
    struct gbnf *g = NULL;
    char msg[256];
    assert_int_equal(gbnf_compile(grammar, strlen(grammar), &g, msg, sizeof(msg)), 0);
    struct grammar *gm = grammar_create(g);
    gbnf_release(g);
    int r = PREFIX;
    for (size_t i = 0; text[i]; i++) {
        if (grammar_accept_bytes(gm, &text[i], 1) == GRAMMAR_STEP_REJECT) {
            r = REJECT;
            break;
        }
    }
    if (r != REJECT) r = grammar_is_accepting(gm) ? FULL : PREFIX;
    grammar_free(gm);
    return r;
}

struct case_ {
    const char *text;
    int want;
};

static void check_cases(const char *grammar, const struct case_ *c, size_t n) {
    for (size_t i = 0; i < n; i++) {
        int got = match(grammar, c[i].text);
        if (got != c[i].want)
            fail_msg("grammar %s on \"%s\": got %d want %d", grammar, c[i].text, got, c[i].want);
        assert_int_equal(match_bytewise(grammar, c[i].text), c[i].want);
    }
}

#define CHECK(g, ...)                                                  \
    do {                                                               \
        const struct case_ cs_[] = {__VA_ARGS__};                      \
        check_cases(g, cs_, sizeof(cs_) / sizeof(cs_[0]));             \
    } while (0)

static void test_gbnf_alternation_and_literals(void **state) {
    (void)state;
    CHECK("root ::= \"cat\" | \"dog\" | \"\"",
          {"", FULL}, {"cat", FULL}, {"dog", FULL}, {"ca", PREFIX}, {"d", PREFIX},
          {"cow", REJECT}, {"cats", REJECT}, {"catdog", REJECT});
    CHECK("root ::= greet \" \" name\ngreet ::= \"hi\" | \"hello\"\nname ::= \"bob\"",
          {"hi bob", FULL}, {"hello bob", FULL}, {"hell", PREFIX}, {"hi", PREFIX},
          {"hibob", REJECT}, {"hello  bob", REJECT});
}

static void test_gbnf_repetition(void **state) {
    (void)state;
    CHECK("root ::= \"a\"*", {"", FULL}, {"a", FULL}, {"aaaa", FULL}, {"b", REJECT});
    CHECK("root ::= \"ab\"+", {"", PREFIX}, {"ab", FULL}, {"abab", FULL}, {"aba", PREFIX},
          {"abb", REJECT});
    CHECK("root ::= \"x\"? \"y\"", {"y", FULL}, {"xy", FULL}, {"x", PREFIX}, {"xxy", REJECT});
    CHECK("root ::= [0-9]{3}", {"12", PREFIX}, {"123", FULL}, {"1234", REJECT},
          {"12a", REJECT});
    CHECK("root ::= \"a\"{2,4}", {"a", PREFIX}, {"aa", FULL}, {"aaa", FULL}, {"aaaa", FULL},
          {"aaaaa", REJECT});
    CHECK("root ::= \"a\"{2,} \"b\"", {"aab", FULL}, {"aaaaaab", FULL}, {"ab", REJECT},
          {"aaaa", PREFIX});
    CHECK("root ::= (\"a\" | \"bc\"){0,2} \"!\"", {"!", FULL}, {"a!", FULL}, {"bca!", FULL},
          {"aaa!", REJECT}, {"b!", REJECT});
    CHECK("root ::= \"a\"{ 1 , 2 }", {"a", FULL}, {"aa", FULL}, {"aaa", REJECT});
}

/* Whether grammars a and b agree (FULL, PREFIX or REJECT) on every string of
 * at most max_len bytes over alphabet: the oracle for a rewritten grammar is
 * an equivalent one written by hand without the construct under test. */
static void check_same_language(const char *a, const char *b, const char *alphabet,
                                int max_len) {
    const int k = (int)strlen(alphabet);
    char s[16];
    int idx[16];
    for (int len = 0; len <= max_len; len++) {
        for (int i = 0; i < len; i++) idx[i] = 0;
        for (;;) {
            for (int i = 0; i < len; i++) s[i] = alphabet[idx[i]];
            s[len] = '\0';
            int ga = match(a, s);
            int gb = match(b, s);
            if (ga != gb) fail_msg("on \"%s\": %s gives %d, %s gives %d", s, a, ga, b, gb);
            int i = len - 1;
            while (i >= 0 && ++idx[i] == k) idx[i--] = 0;
            if (i < 0) break;
        }
    }
}

/* A repetition whose body can match the empty string: x* matches what
 * (x without ε)* does. Oracles: strings derived
 * by hand, and equivalence with the grammar written without a nullable
 * body. */
static void test_gbnf_repetition_of_nullable(void **state) {
    (void)state;
    CHECK("root ::= (\"\" | \"a\")*", {"", FULL}, {"a", FULL}, {"aaa", FULL}, {"b", REJECT},
          {"ab", REJECT});
    CHECK("root ::= (\"\" | \"a\")+ \"b\"", {"b", FULL}, {"ab", FULL}, {"aaab", FULL},
          {"", PREFIX}, {"aa", PREFIX}, {"ba", REJECT});
    CHECK("root ::= (\"a\"?)*", {"", FULL}, {"a", FULL}, {"aaaa", FULL}, {"b", REJECT});
    CHECK("root ::= (| \"yT\"){2,} \"3\"", {"3", FULL}, {"yT3", FULL}, {"yTyTyT3", FULL},
          {"y", PREFIX}, {"yT", PREFIX}, {"yy", REJECT}, {"T3", REJECT});
    CHECK("root ::= (\"\")* \"x\"", {"x", FULL}, {"", PREFIX}, {"xx", REJECT});
    const char *abc = "abc";
    check_same_language("root ::= (\"\" | \"a\")*", "root ::= \"a\"*", abc, 5);
    check_same_language("root ::= (\"a\"? \"b\"?)*", "root ::= [ab]*", abc, 5);
    check_same_language("root ::= ((\"a\" | \"\") (\"b\" | \"\"))+ \"c\"", "root ::= [ab]* \"c\"",
                        abc, 5);
    check_same_language("root ::= x* \"c\"\nx ::= \"\" | \"ab\" | y\ny ::= \"b\"?",
                        "root ::= (\"ab\" | \"b\")* \"c\"", abc, 6);
    check_same_language("root ::= ((\"\" | \"a\")* \"b\"?)*", "root ::= [ab]*", abc, 5);
    check_same_language("root ::= (\"a\"?){2,}", "root ::= \"a\"*", abc, 5);
    check_same_language("root ::= (\"a\"? \"b\"){1,2} (\"c\"?)+", "root ::= (\"a\"? \"b\"){1,2} \"c\"*",
                        abc, 6);
    check_same_language("root ::= (\"\")*", "root ::= \"\"", abc, 3);
    check_same_language("root ::= (e)* \"a\"\ne ::= \"\" | e2\ne2 ::= \"\"", "root ::= \"a\"", abc,
                        3);
    // A rule that recurs through the repetition: nesting, not left recursion.
    check_same_language("root ::= (\"(\" root \")\" | \"\")*", "root ::= (\"(\" root \")\")*",
                        "()", 6);
}

/* ---- random regular grammars against a recogniser written here ---------------- */

/* A random regular expression over {a, b} as a tree, and an independent
 * recogniser of it (position sets, no GBNF, no automaton): for a set of start
 * positions, the set of end positions; a star is a fixpoint. Trying a byte at
 * the end of the input sets hit_end: the input is then a viable prefix (every
 * node here matches some string, so the attempt can be completed). */
enum rx_kind { RX_A, RX_B, RX_EMPTY, RX_CAT, RX_ALT, RX_STAR, RX_PLUS, RX_OPT, RX_REP };
struct rx {
    enum rx_kind kind;
    int l, r;   // children (indices), -1 when none
    int m, n;   // RX_REP: {m,n}, n < 0 unbounded
};
struct rx_tree {
    struct rx node[64];
    int n_nodes;
};

static uint64_t rx_next(uint64_t *x) {
    *x = *x * 6364136223846793005ull + 1442695040888963407ull;
    return *x >> 33;
}

static int rx_make(struct rx_tree *t, uint64_t *x, int depth) {
    int i = t->n_nodes++;
    struct rx *nd = &t->node[i];
    *nd = (struct rx){.l = -1, .r = -1};
    int k = depth <= 0 || t->n_nodes > 40 ? (int)(rx_next(x) % 3) : (int)(rx_next(x) % 9);
    nd->kind = (enum rx_kind)k;
    if (k >= RX_CAT) {
        int l = rx_make(t, x, depth - 1);
        t->node[i].l = l;
        if (k <= RX_ALT) {
            int r = rx_make(t, x, depth - 1);
            t->node[i].r = r;
        }
        if (k == RX_REP) {
            t->node[i].m = (int)(rx_next(x) % 3);
            t->node[i].n = rx_next(x) % 2 ? -1 : t->node[i].m + (int)(rx_next(x) % 2);
        }
    }
    return i;
}

static void rx_gbnf(const struct rx_tree *t, int i, char *out, size_t cap) {
    const struct rx *nd = &t->node[i];
    size_t len = strlen(out);
    char *p = out + len;
    size_t left = cap - len;
    char l[1024] = "";
    char r[1024] = "";
    if (nd->l >= 0) rx_gbnf(t, nd->l, l, sizeof(l));
    if (nd->r >= 0) rx_gbnf(t, nd->r, r, sizeof(r));
    switch (nd->kind) {
        case RX_A: snprintf(p, left, "\"a\""); break;
        case RX_B: snprintf(p, left, "\"b\""); break;
        case RX_EMPTY: snprintf(p, left, "\"\""); break;
        case RX_CAT: snprintf(p, left, "(%s %s)", l, r); break;
        case RX_ALT: snprintf(p, left, "(%s | %s)", l, r); break;
        case RX_STAR: snprintf(p, left, "(%s)*", l); break;
        case RX_PLUS: snprintf(p, left, "(%s)+", l); break;
        case RX_OPT: snprintf(p, left, "(%s)?", l); break;
        case RX_REP:
            if (nd->n < 0) snprintf(p, left, "(%s){%d,}", l, nd->m);
            else snprintf(p, left, "(%s){%d,%d}", l, nd->m, nd->n);
            break;
    }
}

struct rx_rec {
    const char *s;
    int n;
    bool hit_end;
};

typedef uint32_t rx_set;  // bit p: position p (inputs are short)

static rx_set rx_run(const struct rx_tree *t, int i, rx_set in, struct rx_rec *c);

static rx_set rx_star(const struct rx_tree *t, int i, rx_set in, struct rx_rec *c) {
    rx_set all = in;
    rx_set at = in;
    while (at) {
        rx_set next = rx_run(t, i, at, c) & ~all;
        all |= next;
        at = next;
    }
    return all;
}

static rx_set rx_run(const struct rx_tree *t, int i, rx_set in, struct rx_rec *c) {
    const struct rx *nd = &t->node[i];
    switch (nd->kind) {
        case RX_A:
        case RX_B: {
            const char want = nd->kind == RX_A ? 'a' : 'b';
            rx_set out = 0;
            for (int p = 0; p <= c->n; p++) {
                if (!(in >> p & 1)) continue;
                if (p == c->n) c->hit_end = true;
                else if (c->s[p] == want) out |= 1u << (p + 1);
            }
            return out;
        }
        case RX_EMPTY: return in;
        case RX_CAT: return rx_run(t, nd->r, rx_run(t, nd->l, in, c), c);
        case RX_ALT: return rx_run(t, nd->l, in, c) | rx_run(t, nd->r, in, c);
        case RX_STAR: return rx_star(t, nd->l, in, c);
        case RX_PLUS: return rx_star(t, nd->l, rx_run(t, nd->l, in, c), c);
        case RX_OPT: return in | rx_run(t, nd->l, in, c);
        case RX_REP: {
            rx_set at = in;
            for (int k = 0; k < nd->m; k++) at = rx_run(t, nd->l, at, c);
            if (nd->n < 0) return rx_star(t, nd->l, at, c);
            rx_set all = at;
            for (int k = nd->m; k < nd->n; k++) {
                at = rx_run(t, nd->l, at, c);
                all |= at;
            }
            return all;
        }
    }
    return 0;
}

/* 400 random expressions, many repeating what can match nothing, against
 * every string over {a, b, c} of up to 4 bytes: the compiler and matcher
 * agree with the recogniser on FULL, PREFIX and REJECT. */
static void test_gbnf_random_regular_grammars(void **state) {
    (void)state;
    uint64_t x = 0x6e62;
    int n_nullable_repeats = 0;
    for (int it = 0; it < 400; it++) {
        struct rx_tree t = {.n_nodes = 0};
        int root = rx_make(&t, &x, 4);
        char g[4096] = "root ::= ";
        rx_gbnf(&t, root, g, sizeof(g));
        for (int i = 0; i < t.n_nodes; i++) {
            const struct rx *nd = &t.node[i];
            if (nd->kind == RX_STAR || nd->kind == RX_PLUS || (nd->kind == RX_REP && nd->n < 0)) {
                struct rx_rec e = {.s = "", .n = 0};
                if (rx_run(&t, nd->l, 1u, &e) & 1u) n_nullable_repeats++;
            }
        }
        const char alphabet[] = "abc";
        char s[8];
        for (int len = 0; len <= 4; len++) {
            int n_str = 1;
            for (int k = 0; k < len; k++) n_str *= 3;
            for (int code = 0; code < n_str; code++) {
                int v = code;
                for (int k = 0; k < len; k++) {
                    s[k] = alphabet[v % 3];
                    v /= 3;
                }
                s[len] = '\0';
                struct rx_rec c = {.s = s, .n = len};
                rx_set ends = rx_run(&t, root, 1u, &c);
                int want = ends >> len & 1 ? FULL : c.hit_end ? PREFIX : REJECT;
                int got = match(g, s);
                if (got != want) fail_msg("%s on \"%s\": got %d want %d", g, s, got, want);
            }
        }
    }
    assert_true(n_nullable_repeats > 50);  // the case under test is common here
}

static void test_gbnf_grouping_and_newlines(void **state) {
    (void)state;
    const char *g = "root ::= (\n"
                    "    \"[\" item (\",\" item)* \"]\"   # a list\n"
                    "  | \"()\"\n"
                    ")\n"
                    "item ::= [a-c]\n";
    CHECK(g, {"[a]", FULL}, {"[a,b,c]", FULL}, {"()", FULL}, {"[a,", PREFIX}, {"[]", REJECT},
          {"[d]", REJECT}, {"[a,b]x", REJECT});
}

static void test_gbnf_char_classes(void **state) {
    (void)state;
    CHECK("root ::= [a-cx]+", {"abcx", FULL}, {"d", REJECT}, {"xa", FULL});
    CHECK("root ::= [^a-z\\n]", {"A", FULL}, {"0", FULL}, {"a", REJECT}, {"\n", REJECT},
          {"\xc3\xa9", FULL}, {"\xe2\x82\xac", FULL}, {"\xf0\x9f\x98\x80", FULL},
          {"\xc3", PREFIX}, {"AB", REJECT});
    // negation excludes non-ASCII members too: é (U+00E9) and € (U+20AC)
    CHECK("root ::= [^\\u00e9\\u20AC]", {"e", FULL}, {"\xc3\xa9", REJECT},
          {"\xc3\xa8", FULL}, {"\xe2\x82\xac", REJECT}, {"\xe2\x82\xad", FULL});
    // a range of Greek letters, written as UTF-8 in the grammar
    CHECK("root ::= [α-ω]+", {"αβγ", FULL}, {"ω", FULL}, {"a", REJECT}, {"Α", REJECT},
          {"\xce", PREFIX});
    // ranges that cross UTF-8 length boundaries: U+007E..U+0801
    CHECK("root ::= [\\x7e-\\u0801]", {"~", FULL}, {"\x7f", FULL}, {"\xc2\x80", FULL},
          {"\xdf\xbf", FULL}, {"\xe0\xa0\x80", FULL}, {"\xe0\xa0\x81", FULL},
          {"\xe0\xa0\x82", REJECT}, {"}", REJECT});
    // invalid UTF-8 is never produced: overlong, surrogate, beyond U+10FFFF
    CHECK("root ::= .", {"\xc0\x80", REJECT}, {"\xed\xa0\x80", REJECT},
          {"\xf4\x90\x80\x80", REJECT}, {"\xf4\x8f\xbf\xbf", FULL}, {"\x80", REJECT},
          {"\xff", REJECT}, {"\n", FULL});
    CHECK("root ::= [\\]\\[\\-]+", {"[]-", FULL}, {"a", REJECT});
    CHECK("root ::= [-a]", {"-", FULL}, {"a", FULL});
}

static void test_gbnf_utf8_literals_and_escapes(void **state) {
    (void)state;
    CHECK("root ::= \"héllo \\u00e9\\n\\t\\\"\\\\\"", {"héllo é\n\t\"\\", FULL},
          {"hello", REJECT}, {"h\xc3", PREFIX});
    CHECK("root ::= \"\\xe9\"", {"\xc3\xa9", FULL}, {"\xe9", REJECT});  // \x is U+00E9
    CHECK("root ::= \"😀\"", {"\xf0\x9f\x98\x80", FULL}, {"\xf0\x9f", PREFIX});
}

/* The shape of llama.cpp's grammars/json.gbnf (objects, arrays, strings with
 * escapes, numbers, literals, whitespace), written here from RFC 8259. */
static const char json_gbnf[] =
    "root   ::= object\n"
    "value  ::= object | array | string | number | (\"true\" | \"false\" | \"null\") ws\n"
    "\n"
    "object ::=\n"
    "  \"{\" ws (\n"
    "            string \":\" ws value\n"
    "    (\",\" ws string \":\" ws value)*\n"
    "  )? \"}\" ws\n"
    "\n"
    "array  ::=\n"
    "  \"[\" ws (\n"
    "            value\n"
    "    (\",\" ws value)*\n"
    "  )? \"]\" ws\n"
    "\n"
    "string ::=\n"
    "  \"\\\"\" (\n"
    "    [^\"\\\\\\x7F\\x00-\\x1F] |\n"
    "    \"\\\\\" ([\"\\\\/bfnrt] | \"u\" [0-9a-fA-F]{4}) # escapes\n"
    "  )* \"\\\"\" ws\n"
    "\n"
    "number ::= (\"-\"? ([0-9] | [1-9] [0-9]{0,15})) (\".\" [0-9]+)? ([eE] [-+]? [0-9] [1-9]{0,15})? ws\n"
    "\n"
    "# Optional space: by convention, applied in this grammar after literal chars when allowed\n"
    "ws ::= | \" \" | \"\\n\" [ \\t]{0,20}\n";

static void test_gbnf_json_grammar(void **state) {
    (void)state;
    CHECK(json_gbnf, {"{}", FULL}, {"{\"a\": 1}", FULL}, {"{\"a\":[1, 2.5e3, -0.1]}", FULL},
          {"{\"k\": {\"n\": null, \"t\": true, \"f\": false}}", FULL},
          {"{\"s\": \"x\\n\\u00e9\\\"y\"}", FULL}, {"{\"é\": \"日本\"}", FULL},
          {"{\"a\": 1", PREFIX}, {"{\"a", PREFIX}, {"", PREFIX},
          {"{a: 1}", REJECT}, {"{\"a\": 01}", REJECT}, {"{\"a\": [1,]}", REJECT},
          {"{\"a\": \"\x01\"}", REJECT}, {"{\"a\": \"\\x\"}", REJECT}, {"[1]", REJECT},
          {"{\"a\": tru}", REJECT}, {"{} {}", REJECT}, {"{\"a\":\"\\u12g4\"}", REJECT});
}

/* A grammar that ends with a rule called last (the tail-call path) deep in
 * recursion, and right recursion that grows the stack. */
static void test_gbnf_recursion(void **state) {
    (void)state;
    const char *g = "root ::= expr\nexpr ::= \"(\" expr \")\" | \"x\"";
    CHECK(g, {"x", FULL}, {"(x)", FULL}, {"((((x))))", FULL}, {"((x)", PREFIX},
          {"(x))", REJECT}, {"()", REJECT});
    char deep[4100];
    for (int i = 0; i < 2000; i++) deep[i] = '(';
    deep[2000] = 'x';
    for (int i = 0; i < 2000; i++) deep[2001 + i] = ')';
    deep[4001] = '\0';
    assert_int_equal(match(g, deep), FULL);
    deep[4000] = '\0';
    assert_int_equal(match(g, deep), PREFIX);
}

static void expect_error(const char *grammar, const char *needle) {
    struct gbnf *g = NULL;
    char msg[256];
    int err = gbnf_compile(grammar, strlen(grammar), &g, msg, sizeof(msg));
    if (err != ERR_INVAL) fail_msg("grammar %s: got %d, want ERR_INVAL", grammar, err);
    assert_null(g);
    if (!strstr(msg, needle)) fail_msg("grammar %s: message \"%s\" lacks \"%s\"", grammar, msg, needle);
}

static void test_gbnf_errors(void **state) {
    (void)state;
    expect_error("", "no rule named 'root'");
    expect_error("foo ::= \"a\"", "no rule named 'root'");
    expect_error("root ::= valu\nvalue ::= \"a\"", "unknown rule 'valu'");
    expect_error("root ::= (\"a\" | \"b\"", "unbalanced '('");
    expect_error("root ::= \"a\")", "unbalanced ')'");
    expect_error("root ::= \"abc", "unterminated string");
    expect_error("root ::= [abc", "unterminated character class");
    expect_error("root ::= [z-a]", "reversed");
    expect_error("root ::= \"\\q\"", "unknown escape");
    expect_error("root ::= \"\\xZZ\"", "bad hex digit");
    expect_error("root ::= \"\\ud800\"", "not a Unicode scalar value");
    expect_error("root ::= \"a\"{1001}", "repetition count over 1000");
    expect_error("root ::= \"a\"{3,2}", "max < min");
    expect_error("root ::= \"a\"{2", "expected '}'");
    expect_error("root ::= root \"a\" | \"b\"", "left recursion: rule 'root'");
    expect_error("root ::= a\na ::= b \"x\"\nb ::= a | \"y\"", "left recursion");
    expect_error("root ::= opt root \"a\" | \"b\"\nopt ::= \"\" | \"c\"", "left recursion");
    // A repetition of something that can match nothing is not left recursion
    // (test_gbnf_repetition_of_nullable), but one that recurs through it is.
    expect_error("root ::= (root | \"\")* \"a\"", "left recursion");
    expect_error("root ::= x\nx ::= (\"\" | x \"b\")*", "left recursion");
    expect_error("root ::= \"a\"\nroot ::= \"b\"", "defined twice");
    expect_error("root ::= \"a\" $", "unexpected character '$'");
    expect_error("root := \"a\"", "expected '::='");
    expect_error("root ::= \"\xff\"", "invalid UTF-8");
    // repetition expands linearly, so only a long text reaches the item cap
    size_t cap = 16 + 1100 * 10;
    char *big = malloc(cap);
    size_t len = (size_t)snprintf(big, cap, "root ::=");
    for (int i = 0; i < 1100; i++) len += (size_t)snprintf(big + len, cap - len, " \"a\"{1000}");
    expect_error(big, "more than 1048576 items");
    free(big);
    char deep[300];
    int n = 0;
    n += snprintf(deep, sizeof(deep), "root ::= ");
    for (int i = 0; i < 70; i++) deep[n++] = '(';
    deep[n++] = '"';
    deep[n++] = 'a';
    deep[n++] = '"';
    for (int i = 0; i < 70; i++) deep[n++] = ')';
    deep[n] = '\0';
    expect_error(deep, "nested deeper than 64");
    // the line of the error is named
    expect_error("root ::= a\n\na ::= \"x\" |\n  bogus\n", "line 4");
}

/* Mutations of the json grammar (bytes replaced, deleted, duplicated) must
 * compile or fail with ERR_INVAL and a message; the compiled ones must match
 * random inputs without crashing (ASan/UBSan watch this test too). */
static void test_gbnf_fuzz(void **state) {
    (void)state;
    uint64_t x = 0x5eed;
    size_t n0 = strlen(json_gbnf);
    char *buf = malloc(n0 * 2 + 16);
    const char alphabet[] = "()[]{}|*+?\"\\:=-^.#\n ab0x,u";
    int n_ok = 0;
    int n_err = 0;
    for (int it = 0; it < 3000; it++) {
        memcpy(buf, json_gbnf, n0);
        size_t n = n0;
        int n_mut = 1 + (int)((x = x * 6364136223846793005ull + 1442695040888963407ull) >> 61);
        for (int m = 0; m < n_mut; m++) {
            x = x * 6364136223846793005ull + 1442695040888963407ull;
            size_t at = (size_t)((x >> 20) % n);
            int kind = (int)((x >> 50) % 3);
            char c = alphabet[(x >> 8) % (sizeof(alphabet) - 1)];
            if (kind == 0) {
                buf[at] = c;
            } else if (kind == 1 && n > 1) {
                memmove(buf + at, buf + at + 1, n - at - 1);
                n--;
            } else {
                memmove(buf + at + 1, buf + at, n - at);
                buf[at] = c;
                n++;
            }
        }
        struct gbnf *g = NULL;
        char msg[256];
        int err = gbnf_compile(buf, n, &g, msg, sizeof(msg));
        if (err) {
            assert_int_equal(err, ERR_INVAL);
            assert_true(msg[0] != '\0');
            n_err++;
            continue;
        }
        n_ok++;
        struct grammar *gm = grammar_create(g);
        gbnf_release(g);
        for (int k = 0; k < 64; k++) {
            x = x * 6364136223846793005ull + 1442695040888963407ull;
            uint8_t b = (uint8_t)(x >> 56);
            if (grammar_accept_bytes(gm, &b, 1) == GRAMMAR_STEP_DONE) break;
        }
        grammar_free(gm);
    }
    free(buf);
    // both outcomes happen, so the fuzz reaches the parser's depths
    assert_true(n_ok > 100);
    assert_true(n_err > 100);
}

static void test_gbnf_refcount(void **state) {
    (void)state;
    struct gbnf *g = NULL;
    assert_int_equal(gbnf_compile("root ::= \"a\"", 12, &g, NULL, 0), 0);
    assert_ptr_equal(gbnf_retain(g), g);
    gbnf_release(g);
    assert_int_equal(g->n_rules >= 1, 1);
    gbnf_release(g);
    gbnf_release(NULL);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gbnf_alternation_and_literals),
        cmocka_unit_test(test_gbnf_repetition),
        cmocka_unit_test(test_gbnf_repetition_of_nullable),
        cmocka_unit_test(test_gbnf_random_regular_grammars),
        cmocka_unit_test(test_gbnf_grouping_and_newlines),
        cmocka_unit_test(test_gbnf_char_classes),
        cmocka_unit_test(test_gbnf_utf8_literals_and_escapes),
        cmocka_unit_test(test_gbnf_json_grammar),
        cmocka_unit_test(test_gbnf_recursion),
        cmocka_unit_test(test_gbnf_errors),
        cmocka_unit_test(test_gbnf_fuzz),
        cmocka_unit_test(test_gbnf_refcount),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
