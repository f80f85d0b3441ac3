/*
 * engine/text/gbnf.c - the GBNF parser and compiler (gbnf.h has the language and
 * the program layout).
 *
 * A recursive-descent parser writes rules into a builder (each rule a list of
 * alternatives, each alternative a vector of items); groups and repetitions
 * become helper rules named after the rule they appear in ("value_3"), as
 * llama.cpp names them. Character classes become byte-sequence alternatives
 * by splitting code-point ranges at UTF-8 boundaries. The finished builder is
 * checked (every rule defined), unbounded repetitions of what can match the
 * empty string are rewritten (remove_nullable_stars()), the result is checked
 * for left recursion, and it is flattened into one
 * allocation. Memory is bookkeeping-sized: the text is at most GBNF_TEXT_MAX
 * bytes and the program at most GBNF_ITEMS_MAX items.
 */
#include "engine/text/gbnf.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/base/alloc.h"
#include "engine/base/err.h"

#define GBNF_CP_MAX 0x10FFFF
#define GBNF_NAME_MAX 128

struct ivec {
    int32_t *v;  // owned
    int32_t n;
    int32_t cap;
};

struct brule {
    char *name;         // owned
    int32_t owner;      // the user rule a helper belongs to (itself for user rules)
    int32_t line;       // first line that named it
    bool is_defined;
    struct ivec *alts;  // owned; [n_alts] item vectors without the END
    int32_t n_alts;
    int32_t cap_alts;
};

struct builder {
    const char *p;          // next byte of the text
    const char *end;
    int32_t line;
    int32_t depth;          // open ( ) groups
    int32_t cur;            // rule being defined
    struct brule *rules;    // owned; [n_rules]
    int32_t n_rules;
    int32_t cap_rules;
    uint64_t (*sets)[4];    // owned; [n_sets]
    int32_t n_sets;
    int32_t cap_sets;
    int64_t n_items;        // items so far, against GBNF_ITEMS_MAX
    struct ivec stars;      // the S ::= x S | ε helpers of unbounded repetitions
    char *msg;
    size_t msg_size;
};

/* The compiled grammar: one allocation behind the public view. */
struct gbnf_owned {
    struct gbnf g;
    atomic_int n_refs;
};

static int fail(struct builder *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static int fail(struct builder *b, const char *fmt, ...) {
    if (b->msg && b->msg_size) {
        int n = snprintf(b->msg, b->msg_size, "grammar line %d: ", (int)b->line);
        if (n >= 0 && (size_t)n < b->msg_size) {
            va_list ap;
            va_start(ap, fmt);
            vsnprintf(b->msg + n, b->msg_size - (size_t)n, fmt, ap);
            va_end(ap);
        }
    }
    return ERR_INVAL;
}

/* ---- vectors, rules, sets ------------------------------------------------- */

static void ivec_push(struct ivec *v, int32_t x) {
    if (v->n == v->cap) {
        v->cap = v->cap ? v->cap * 2 : 8;
        v->v = xrealloc(v->v, (size_t)v->cap * sizeof(*v->v));
    }
    v->v[v->n++] = x;
}

static int32_t item(enum gbnf_op op, int32_t arg) { return (int32_t)((uint32_t)arg << 2) | op; }

/* Counts n items against the program budget. */
static int budget(struct builder *b, int64_t n) {
    b->n_items += n;
    if (b->n_items > GBNF_ITEMS_MAX)
        return fail(b, "the grammar expands to more than %d items (repetitions too large?)",
                    GBNF_ITEMS_MAX);
    return 0;
}

static int32_t rule_add(struct builder *b, const char *name, size_t len, int32_t owner) {
    if (b->n_rules == b->cap_rules) {
        b->cap_rules = b->cap_rules ? b->cap_rules * 2 : 16;
        b->rules = xrealloc(b->rules, (size_t)b->cap_rules * sizeof(*b->rules));
    }
    int32_t id = b->n_rules++;
    struct brule *r = &b->rules[id];
    memset(r, 0, sizeof(*r));
    r->name = xmalloc(len + 1);
    memcpy(r->name, name, len);
    r->name[len] = '\0';
    r->owner = owner < 0 ? id : owner;
    r->line = b->line;
    return id;
}

static int32_t rule_find(const struct builder *b, const char *name, size_t len) {
    for (int32_t i = 0; i < b->n_rules; i++) {
        if (strlen(b->rules[i].name) == len && memcmp(b->rules[i].name, name, len) == 0) return i;
    }
    return -1;
}

/* A defined helper rule of the rule being parsed, named "<owner>_<n>". */
static int32_t helper_add(struct builder *b) {
    char name[GBNF_NAME_MAX + 16];
    const struct brule *owner = &b->rules[b->rules[b->cur].owner];
    int n = snprintf(name, sizeof(name), "%s_%d", owner->name, (int)b->n_rules);
    int32_t id = rule_add(b, name, (size_t)n, owner->owner);
    b->rules[id].is_defined = true;
    return id;
}

/* Takes ownership of seq's vector as a new alternative of rule r. */
static void rule_add_alt(struct builder *b, int32_t r, struct ivec *seq) {
    struct brule *rl = &b->rules[r];
    if (rl->n_alts == rl->cap_alts) {
        rl->cap_alts = rl->cap_alts ? rl->cap_alts * 2 : 4;
        rl->alts = xrealloc(rl->alts, (size_t)rl->cap_alts * sizeof(*rl->alts));
    }
    rl->alts[rl->n_alts++] = *seq;
    memset(seq, 0, sizeof(*seq));
}

static int32_t set_add(struct builder *b, const uint64_t set[4]) {
    for (int32_t i = 0; i < b->n_sets; i++) {
        if (memcmp(b->sets[i], set, sizeof(b->sets[i])) == 0) return i;
    }
    if (b->n_sets == b->cap_sets) {
        b->cap_sets = b->cap_sets ? b->cap_sets * 2 : 32;
        b->sets = xrealloc(b->sets, (size_t)b->cap_sets * sizeof(*b->sets));
    }
    memcpy(b->sets[b->n_sets], set, sizeof(b->sets[0]));
    return b->n_sets++;
}

static int32_t set_range(struct builder *b, uint32_t lo, uint32_t hi) {
    uint64_t set[4] = {0, 0, 0, 0};
    for (uint32_t c = lo; c <= hi; c++) set[c >> 6] |= 1ull << (c & 63);
    return set_add(b, set);
}

static void builder_deinit(struct builder *b) {
    for (int32_t i = 0; i < b->n_rules; i++) {
        struct brule *r = &b->rules[i];
        for (int32_t j = 0; j < r->n_alts; j++) free(r->alts[j].v);
        free(r->alts);
        free(r->name);
    }
    free(b->rules);
    free(b->sets);
    free(b->stars.v);
}

/* ---- lexing ---------------------------------------------------------------- */

static bool is_name_char(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           c == '_' || c == '-';
}

/* Skips blanks and comments; newlines too when newline_ok. */
static void skip_space(struct builder *b, bool newline_ok) {
    while (b->p < b->end) {
        char c = *b->p;
        if (c == ' ' || c == '\t') {
            b->p++;
        } else if (c == '#') {
            while (b->p < b->end && *b->p != '\n' && *b->p != '\r') b->p++;
        } else if ((c == '\n' || c == '\r') && newline_ok) {
            if (c == '\n') b->line++;
            b->p++;
        } else {
            break;
        }
    }
}

/* One UTF-8 encoded code point of the text into *cp. */
static int decode_utf8(struct builder *b, uint32_t *cp) {
    const unsigned char *s = (const unsigned char *)b->p;
    size_t avail = (size_t)(b->end - b->p);
    unsigned char c = s[0];
    int n;
    uint32_t v;
    if (c < 0x80) {
        n = 1;
        v = c;
    } else if (c >= 0xC2 && c <= 0xDF) {
        n = 2;
        v = c & 0x1F;
    } else if (c >= 0xE0 && c <= 0xEF) {
        n = 3;
        v = c & 0x0F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        n = 4;
        v = c & 0x07;
    } else {
        return fail(b, "invalid UTF-8 in the grammar text");
    }
    if ((size_t)n > avail) return fail(b, "invalid UTF-8 in the grammar text");
    for (int i = 1; i < n; i++) {
        if ((s[i] & 0xC0) != 0x80) return fail(b, "invalid UTF-8 in the grammar text");
        v = (v << 6) | (s[i] & 0x3F);
    }
    static const uint32_t min_of_len[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (v < min_of_len[n] || v > GBNF_CP_MAX || (v >= 0xD800 && v <= 0xDFFF))
        return fail(b, "invalid UTF-8 in the grammar text");
    b->p += n;
    *cp = v;
    return 0;
}

static int parse_hex(struct builder *b, int n_digits, uint32_t *out) {
    uint32_t v = 0;
    for (int i = 0; i < n_digits; i++) {
        if (b->p >= b->end) return fail(b, "truncated \\x / \\u escape");
        char c = *b->p++;
        int d;
        if (c >= '0' && c <= '9') d = c - '0';
        else if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
        else if (c >= 'A' && c <= 'F') d = c - 'A' + 10;
        else return fail(b, "bad hex digit '%c' in an escape", c);
        v = v * 16 + (uint32_t)d;
    }
    if (v > GBNF_CP_MAX || (v >= 0xD800 && v <= 0xDFFF))
        return fail(b, "escape U+%X is not a Unicode scalar value", (unsigned)v);
    *out = v;
    return 0;
}

/* One character of a literal or class (escapes decoded) into *cp. */
static int parse_char(struct builder *b, uint32_t *cp) {
    if (b->p >= b->end) return fail(b, "unexpected end of the grammar");
    if (*b->p != '\\') return decode_utf8(b, cp);
    b->p++;
    if (b->p >= b->end) return fail(b, "unexpected end of the grammar after '\\'");
    char c = *b->p++;
    switch (c) {
    case 'n': *cp = '\n'; return 0;
    case 'r': *cp = '\r'; return 0;
    case 't': *cp = '\t'; return 0;
    case '\\': case '"': case '[': case ']': case '-': case '^': *cp = (uint32_t)c; return 0;
    case 'x': return parse_hex(b, 2, cp);
    case 'u': return parse_hex(b, 4, cp);
    case 'U': return parse_hex(b, 8, cp);
    default: return fail(b, "unknown escape '\\%c'", c);
    }
}

/* ---- UTF-8 byte sequences of code-point ranges ----------------------------- */

static int encode_utf8(uint32_t cp, uint8_t out[4]) {
    if (cp < 0x80) {
        out[0] = (uint8_t)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (uint8_t)(0xC0 | (cp >> 6));
        out[1] = (uint8_t)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (uint8_t)(0xE0 | (cp >> 12));
        out[1] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (uint8_t)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (uint8_t)(0xF0 | (cp >> 18));
    out[1] = (uint8_t)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (uint8_t)(0x80 | (cp & 0x3F));
    return 4;
}

/* Collects byte-range sequences for a class. ascii: the union of the
 * one-byte part; seqs: alternatives of several BYTE items. */
struct class_out {
    uint64_t ascii[4];
    bool has_ascii;
};

/* Appends the byte sequences matching exactly the code points [lo, hi],
 * which all encode to the same length and contain no surrogate: split until
 * each piece is a product of byte ranges (the construction RE2 and Rust's
 * regex-syntax describe), then one alternative per piece. */
static int utf8_split(struct builder *b, int32_t rule, struct class_out *co, uint32_t lo,
                      uint32_t hi) {
    uint8_t lb[4];
    uint8_t hb[4];
    int n = encode_utf8(lo, lb);
    if (n == 1) {
        for (uint32_t c = lo; c <= hi; c++) co->ascii[c >> 6] |= 1ull << (c & 63);
        co->has_ascii = true;
        return 0;
    }
    for (int i = 1; i < n; i++) {
        uint32_t m = (1u << (6 * i)) - 1;
        if ((lo & ~m) != (hi & ~m)) {
            if ((lo & m) != 0) {
                int err = utf8_split(b, rule, co, lo, lo | m);
                return err ? err : utf8_split(b, rule, co, (lo | m) + 1, hi);
            }
            if ((hi & m) != m) {
                int err = utf8_split(b, rule, co, lo, (hi & ~m) - 1);
                return err ? err : utf8_split(b, rule, co, hi & ~m, hi);
            }
        }
    }
    encode_utf8(hi, hb);
    int err = budget(b, n + 1);
    if (err) return err;
    struct ivec seq = {0};
    for (int i = 0; i < n; i++) ivec_push(&seq, item(GBNF_OP_BYTE, set_range(b, lb[i], hb[i])));
    rule_add_alt(b, rule, &seq);
    return 0;
}

/* Splits [lo, hi] at the encoding lengths and around the surrogates. */
static int utf8_range(struct builder *b, int32_t rule, struct class_out *co, uint32_t lo,
                      uint32_t hi) {
    static const uint32_t cuts[][2] = {
        {0x0, 0x7F}, {0x80, 0x7FF}, {0x800, 0xD7FF}, {0xE000, 0xFFFF}, {0x10000, GBNF_CP_MAX},
    };
    for (size_t i = 0; i < sizeof(cuts) / sizeof(cuts[0]); i++) {
        uint32_t a = lo > cuts[i][0] ? lo : cuts[i][0];
        uint32_t z = hi < cuts[i][1] ? hi : cuts[i][1];
        if (a > z) continue;
        int err = utf8_split(b, rule, co, a, z);
        if (err) return err;
    }
    return 0;
}

struct cp_range {
    uint32_t lo;
    uint32_t hi;
};

static int cp_range_cmp(const void *pa, const void *pb) {
    const struct cp_range *a = pa;
    const struct cp_range *c = pb;
    return a->lo < c->lo ? -1 : a->lo > c->lo;
}

/* Appends to seq the item(s) matching one character out of ranges [n]
 * (negated: any character but those): one BYTE item when every character is
 * one byte, else a helper rule of byte-sequence alternatives. Sorts and
 * merges ranges in place. */
static int emit_class(struct builder *b, struct cp_range *r, int32_t n, bool is_negated,
                      struct ivec *seq) {
    if (n > 0) qsort(r, (size_t)n, sizeof(*r), cp_range_cmp);
    int32_t m = 0;
    for (int32_t i = 0; i < n; i++) {
        if (m > 0 && r[i].lo <= r[m - 1].hi + 1) {
            if (r[i].hi > r[m - 1].hi) r[m - 1].hi = r[i].hi;
        } else {
            r[m++] = r[i];
        }
    }
    int32_t rule = helper_add(b);
    struct class_out co = {{0, 0, 0, 0}, false};
    int err = 0;
    if (!is_negated) {
        for (int32_t i = 0; i < m && !err; i++) err = utf8_range(b, rule, &co, r[i].lo, r[i].hi);
    } else {
        uint32_t next = 0;
        for (int32_t i = 0; i < m && !err; i++) {
            if (r[i].lo > next) err = utf8_range(b, rule, &co, next, r[i].lo - 1);
            next = r[i].hi + 1;
        }
        if (!err && next <= GBNF_CP_MAX) err = utf8_range(b, rule, &co, next, GBNF_CP_MAX);
    }
    if (err) return err;
    err = budget(b, 2);
    if (err) return err;
    struct brule *rl = &b->rules[rule];
    if (co.has_ascii && rl->n_alts == 0) {
        // A one-byte class: the helper stays unused (empty), the set is inline.
        ivec_push(seq, item(GBNF_OP_BYTE, set_add(b, co.ascii)));
        return 0;
    }
    if (co.has_ascii) {
        struct ivec one = {0};
        ivec_push(&one, item(GBNF_OP_BYTE, set_add(b, co.ascii)));
        rule_add_alt(b, rule, &one);
    }
    if (b->rules[rule].n_alts == 0) return fail(b, "a character class that matches nothing");
    ivec_push(seq, item(GBNF_OP_RULE, rule));
    return 0;
}

/* ---- the parser ------------------------------------------------------------ */

static int parse_alternatives(struct builder *b, int32_t rule, bool is_nested);

/* [...] after the '[': appends the class's item to seq. */
static int parse_class(struct builder *b, struct ivec *seq) {
    bool is_negated = b->p < b->end && *b->p == '^';
    if (is_negated) b->p++;
    struct cp_range *r = NULL;
    int32_t n = 0;
    int32_t cap = 0;
    int err = 0;
    while (!err) {
        if (b->p >= b->end) {
            err = fail(b, "unterminated character class (missing ']')");
            break;
        }
        if (*b->p == ']') {
            b->p++;
            break;
        }
        uint32_t lo;
        uint32_t hi;
        err = parse_char(b, &lo);
        if (err) break;
        hi = lo;
        if (b->p + 1 < b->end && *b->p == '-' && b->p[1] != ']') {
            b->p++;
            err = parse_char(b, &hi);
            if (err) break;
            if (hi < lo) {
                err = fail(b, "character range U+%X-U+%X is reversed", (unsigned)lo, (unsigned)hi);
                break;
            }
        }
        if (n == cap) {
            if (cap >= GBNF_ITEMS_MAX) {
                err = fail(b, "character class too long");
                break;
            }
            cap = cap ? cap * 2 : 8;
            r = xrealloc(r, (size_t)cap * sizeof(*r));
        }
        r[n++] = (struct cp_range){lo, hi};
    }
    if (!err && n == 0 && !is_negated) err = fail(b, "empty character class []");
    if (!err) err = emit_class(b, r, n, is_negated, seq);
    free(r);
    return err;
}

/* "..." after the opening quote: one BYTE item per UTF-8 byte. */
static int parse_literal(struct builder *b, struct ivec *seq) {
    for (;;) {
        if (b->p >= b->end || *b->p == '\n' || *b->p == '\r')
            return fail(b, "unterminated string literal (missing '\"')");
        if (*b->p == '"') {
            b->p++;
            return 0;
        }
        uint32_t cp;
        int err = parse_char(b, &cp);
        if (err) return err;
        uint8_t bytes[4];
        int nb = encode_utf8(cp, bytes);
        err = budget(b, nb);
        if (err) return err;
        for (int i = 0; i < nb; i++) ivec_push(seq, item(GBNF_OP_BYTE, set_range(b, bytes[i], bytes[i])));
    }
}

static int parse_count(struct builder *b, int32_t *out) {
    int64_t v = 0;
    const char *start = b->p;
    while (b->p < b->end && *b->p >= '0' && *b->p <= '9') {
        v = v * 10 + (*b->p++ - '0');
        if (v > GBNF_REPEAT_MAX) return fail(b, "repetition count over %d", GBNF_REPEAT_MAX);
    }
    if (b->p == start) return fail(b, "expected a number in {m,n}");
    *out = (int32_t)v;
    return 0;
}

/* Appends x{m,n} (n < 0: unbounded) of the one item x to seq. */
static int emit_repeat(struct builder *b, int32_t x, int32_t m, int32_t n, struct ivec *seq) {
    int err = budget(b, (int64_t)m + 4 * ((n < 0 ? 1 : (int64_t)n - m) + 1));
    if (err) return err;
    for (int32_t i = 0; i < m; i++) ivec_push(seq, x);
    if (n < 0) {  // S ::= x S | ε
        int32_t s = helper_add(b);
        struct ivec alt = {0};
        ivec_push(&alt, x);
        ivec_push(&alt, item(GBNF_OP_RULE, s));
        rule_add_alt(b, s, &alt);
        rule_add_alt(b, s, &alt);  // the empty alternative
        ivec_push(seq, item(GBNF_OP_RULE, s));
        ivec_push(&b->stars, s);  // x may turn out to match ε: remove_nullable_stars()
        return 0;
    }
    // T_1 ::= x | ε;  T_k ::= x T_{k-1} | ε
    int32_t prev = -1;
    for (int32_t k = 1; k <= n - m; k++) {
        int32_t t = helper_add(b);
        struct ivec alt = {0};
        ivec_push(&alt, x);
        if (prev >= 0) ivec_push(&alt, item(GBNF_OP_RULE, prev));
        rule_add_alt(b, t, &alt);
        rule_add_alt(b, t, &alt);
        prev = t;
    }
    if (prev >= 0) ivec_push(seq, item(GBNF_OP_RULE, prev));
    return 0;
}

/* A name at b->p; *len its length (0: not a name). */
static size_t name_len(const struct builder *b) {
    size_t n = 0;
    while (b->p + n < b->end && is_name_char(b->p[n])) n++;
    return n;
}

/* One term and its postfix, appended to seq. */
static int parse_term(struct builder *b, struct ivec *seq) {
    struct ivec frag = {0};
    int err = 0;
    char c = *b->p;
    if (c == '"') {
        b->p++;
        err = parse_literal(b, &frag);
    } else if (c == '[') {
        b->p++;
        err = parse_class(b, &frag);
    } else if (c == '.') {
        b->p++;
        err = emit_class(b, NULL, 0, true, &frag);
    } else if (c == '(') {
        b->p++;
        if (++b->depth > GBNF_DEPTH_MAX) {
            err = fail(b, "groups nested deeper than %d", GBNF_DEPTH_MAX);
        } else {
            int32_t g = helper_add(b);
            err = parse_alternatives(b, g, true);
            if (!err && (b->p >= b->end || *b->p != ')'))
                err = fail(b, "unbalanced '(': expected ')'");
            if (!err) {
                b->p++;
                b->depth--;
                ivec_push(&frag, item(GBNF_OP_RULE, g));
                err = budget(b, 1);
            }
        }
    } else if (is_name_char(c)) {
        size_t len = name_len(b);
        if (len > GBNF_NAME_MAX) {
            err = fail(b, "rule name longer than %d bytes", GBNF_NAME_MAX);
        } else {
            int32_t r = rule_find(b, b->p, len);
            if (r < 0) r = rule_add(b, b->p, len, -1);
            b->p += len;
            ivec_push(&frag, item(GBNF_OP_RULE, r));
            err = budget(b, 1);
        }
    } else if (c == ')') {
        err = fail(b, "unbalanced ')'");
    } else {
        err = fail(b, "unexpected character '%c'", c);
    }
    if (err) {
        free(frag.v);
        return err;
    }
    // postfix operator, directly after the term (blanks allowed)
    skip_space(b, false);
    int32_t m = -1;
    int32_t n = -1;
    if (b->p < b->end) {
        if (*b->p == '*') {
            m = 0;
        } else if (*b->p == '+') {
            m = 1;
        } else if (*b->p == '?') {
            m = 0;
            n = 1;
        } else if (*b->p == '{') {
            b->p++;
            skip_space(b, false);
            err = parse_count(b, &m);
            skip_space(b, false);
            n = m;
            if (!err && b->p < b->end && *b->p == ',') {
                b->p++;
                skip_space(b, false);
                n = -1;
                if (b->p < b->end && *b->p != '}') err = parse_count(b, &n);
                skip_space(b, false);
            }
            if (!err && (b->p >= b->end || *b->p != '}')) err = fail(b, "expected '}' in {m,n}");
            if (!err && n >= 0 && n < m) err = fail(b, "repetition {%d,%d} has max < min", m, n);
            if (err) {
                free(frag.v);
                return err;
            }
        }
    }
    if (m < 0) {  // no postfix: the fragment's items go in as they are
        for (int32_t i = 0; i < frag.n; i++) ivec_push(seq, frag.v[i]);
        free(frag.v);
        return 0;
    }
    b->p++;
    int32_t x;
    if (frag.n == 1) {
        x = frag.v[0];
        free(frag.v);
    } else {  // several items repeat together: wrap them in a helper rule
        int32_t h = helper_add(b);
        rule_add_alt(b, h, &frag);
        x = item(GBNF_OP_RULE, h);
    }
    return emit_repeat(b, x, m, n, seq);
}

static bool at_rule_start(const struct builder *b) {
    size_t len = name_len(b);
    if (len == 0) return false;
    const char *q = b->p + len;
    while (q < b->end && (*q == ' ' || *q == '\t')) q++;
    return b->end - q >= 3 && memcmp(q, "::=", 3) == 0;
}

static int parse_sequence(struct builder *b, struct ivec *seq, bool is_nested) {
    for (;;) {
        skip_space(b, is_nested);
        if (b->p >= b->end) return 0;
        char c = *b->p;
        if (c == '|' || c == ')' || c == '\n' || c == '\r') return 0;
        if (!is_nested && at_rule_start(b)) return 0;
        int err = parse_term(b, seq);
        if (err) return err;
    }
}

static int parse_alternatives(struct builder *b, int32_t rule, bool is_nested) {
    for (;;) {
        struct ivec seq = {0};
        int err = parse_sequence(b, &seq, is_nested);
        if (!err) err = budget(b, 1);
        if (err) {
            free(seq.v);
            return err;
        }
        rule_add_alt(b, rule, &seq);
        if (b->p >= b->end || *b->p != '|') return 0;
        b->p++;
        skip_space(b, true);
    }
}

static int parse_rule(struct builder *b) {
    size_t len = name_len(b);
    if (len == 0) return fail(b, "expected a rule name, got '%c'", *b->p);
    if (len > GBNF_NAME_MAX) return fail(b, "rule name longer than %d bytes", GBNF_NAME_MAX);
    const char *name = b->p;
    b->p += len;
    skip_space(b, false);
    if (b->end - b->p < 3 || memcmp(b->p, "::=", 3) != 0)
        return fail(b, "expected '::=' after rule name '%.*s'", (int)len, name);
    b->p += 3;
    int32_t r = rule_find(b, name, len);
    if (r >= 0 && b->rules[r].is_defined)
        return fail(b, "rule '%.*s' is defined twice", (int)len, name);
    if (r < 0) r = rule_add(b, name, len, -1);
    b->rules[r].is_defined = true;
    b->rules[r].line = b->line;
    b->cur = r;
    skip_space(b, true);
    int err = parse_alternatives(b, r, false);
    if (err) return err;
    if (b->p < b->end && *b->p == ')') return fail(b, "unbalanced ')'");
    return 0;
}

/* ---- checks ---------------------------------------------------------------- */

/* Rules that can match the empty string (a fixpoint). */
static bool *compute_nullable(const struct builder *b) {
    bool *nullable = xcalloc((size_t)b->n_rules, sizeof(bool));
    bool changed = true;
    while (changed) {
        changed = false;
        for (int32_t r = 0; r < b->n_rules; r++) {
            if (nullable[r]) continue;
            const struct brule *rl = &b->rules[r];
            for (int32_t a = 0; a < rl->n_alts && !nullable[r]; a++) {
                bool all = true;
                for (int32_t i = 0; i < rl->alts[a].n && all; i++) {
                    int32_t it = rl->alts[a].v[i];
                    all = gbnf_item_op(it) == GBNF_OP_RULE && nullable[gbnf_item_arg(it)];
                }
                if (all) {
                    nullable[r] = true;
                    changed = true;
                }
            }
        }
    }
    return nullable;
}

/* ---- repetitions of what can match the empty string --------------------------- */

/* The rule r' that matches what r matches but the empty string (see
 * remove_nullable_stars()), made on first use; r is queued in work to get
 * its alternatives. */
static int32_t nonempty_rule(struct builder *b, int32_t *nonempty, struct ivec *work, int32_t r) {
    if (nonempty[r] >= 0) return nonempty[r];
    char name[GBNF_NAME_MAX + 16];
    const int32_t owner = b->rules[r].owner;
    int n = snprintf(name, sizeof(name), "%s_%d", b->rules[owner].name, (int)b->n_rules);
    int32_t id = rule_add(b, name, (size_t)n, owner);
    b->rules[id].is_defined = true;
    b->rules[id].line = b->rules[r].line;
    nonempty[r] = id;
    ivec_push(work, r);
    return id;
}

/* Drops the alternatives of rule r that name a rule marked in is_void; whether
 * any was dropped. */
static bool drop_void_alts(struct builder *b, int32_t r, const bool *is_void) {
    struct brule *rl = &b->rules[r];
    bool changed = false;
    for (int32_t a = 0; a < rl->n_alts;) {
        bool is_dead = false;
        for (int32_t i = 0; i < rl->alts[a].n && !is_dead; i++) {
            int32_t it = rl->alts[a].v[i];
            is_dead = gbnf_item_op(it) == GBNF_OP_RULE && is_void[gbnf_item_arg(it)];
        }
        if (!is_dead) {
            a++;
            continue;
        }
        free(rl->alts[a].v);
        memmove(&rl->alts[a], &rl->alts[a + 1], (size_t)(rl->n_alts - a - 1) * sizeof(*rl->alts));
        rl->n_alts--;
        changed = true;
    }
    return changed;
}

/* x* (and x+, x{m,}) is written S ::= x S | ε, which goes round without
 * consuming when x can match the empty string: left recursion, which the
 * matcher cannot run. But x* matches what (x')* does, x' being x without
 * the empty string, so S's x becomes x' (x{m,n} needs nothing: its helpers
 * T_k ::= x T_{k-1} | ε do not recur). llama.cpp's left-recursion check
 * refuses these grammars; accepting them is ours.
 * For a rule r that can match ε, r' has, for each alternative i_1 ... i_k
 * of r and each j such that i_1 ... i_{j-1} can all match ε, the
 * alternative i_j' i_{j+1} ... i_k, where i_j' is i_j when it cannot match
 * ε (a byte, or such a rule) and the rule i_j' otherwise: a non-empty match
 * of the alternative is the empty string for some leading items, then a
 * non-empty match of the next. Every r' starts with something that must
 * consume, so S no longer recurs without consuming; an r' of an r that
 * matches only ε has no alternative and matches nothing, so alternatives
 * naming it are dropped (until none is left that does). Real left
 * recursion, in x or elsewhere, stays and check_left_recursion() refuses
 * it. The new rules count against GBNF_ITEMS_MAX. */
static int remove_nullable_stars(struct builder *b) {
    bool *nullable = compute_nullable(b);
    const int32_t n_orig = b->n_rules;  // rules from here on are r' rules: never nullable
    int32_t *nonempty = xmalloc((size_t)n_orig * sizeof(int32_t));
    for (int32_t r = 0; r < n_orig; r++) nonempty[r] = -1;
    struct ivec work = {0};
    int err = 0;
    // First every S (so that an r' built from an S sees S ::= x' S | ε).
    for (int32_t k = 0; k < b->stars.n; k++) {
        const int32_t s = b->stars.v[k];
        const int32_t x = b->rules[s].alts[0].v[0];
        if (gbnf_item_op(x) != GBNF_OP_RULE || !nullable[gbnf_item_arg(x)]) continue;
        const int32_t xp = nonempty_rule(b, nonempty, &work, gbnf_item_arg(x));
        b->rules[s].alts[0].v[0] = item(GBNF_OP_RULE, xp);
    }
    while (work.n > 0 && !err) {
        const int32_t r = work.v[--work.n];
        for (int32_t a = 0; a < b->rules[r].n_alts && !err; a++) {
            for (int32_t j = 0; j < b->rules[r].alts[a].n; j++) {
                const int32_t it = b->rules[r].alts[a].v[j];
                const int32_t arg = gbnf_item_arg(it);
                const bool is_null = gbnf_item_op(it) == GBNF_OP_RULE && arg < n_orig &&
                                     nullable[arg];
                err = budget(b, b->rules[r].alts[a].n - j + 1);
                if (err) break;
                struct ivec alt = {0};
                // nonempty_rule() may move b->rules: read the alternative after it
                ivec_push(&alt, is_null ? item(GBNF_OP_RULE, nonempty_rule(b, nonempty, &work, arg))
                                        : it);
                const struct ivec *src = &b->rules[r].alts[a];
                for (int32_t i = j + 1; i < src->n; i++) ivec_push(&alt, src->v[i]);
                rule_add_alt(b, nonempty[r], &alt);
                if (!is_null) break;  // later items cannot lead
            }
        }
    }
    if (!err) {
        // r' rules without alternatives match nothing: drop what names them.
        bool *is_void = xcalloc((size_t)b->n_rules, sizeof(bool));
        bool changed = true;
        while (changed) {
            changed = false;
            for (int32_t r = n_orig; r < b->n_rules; r++) {
                if (!is_void[r] && b->rules[r].n_alts == 0) {
                    is_void[r] = true;
                    changed = true;
                }
            }
            if (!changed) break;
            changed = false;
            for (int32_t k = 0; k < b->stars.n; k++) {
                if (drop_void_alts(b, b->stars.v[k], is_void)) changed = true;
            }
            for (int32_t r = n_orig; r < b->n_rules; r++) {
                if (!is_void[r] && drop_void_alts(b, r, is_void)) changed = true;
            }
        }
        free(is_void);
    }
    free(work.v);
    free(nonempty);
    free(nullable);
    return err;
}

/* Depth-first search over "r can start with rule s" edges; a back edge is
 * left recursion. color: 0 new, 1 on the path, 2 done. Iterative, with an
 * explicit stack of (rule, alternative, item) cursors, so a deep grammar
 * cannot overflow the C stack. */
static int check_left_recursion(struct builder *b) {
    bool *nullable = compute_nullable(b);
    uint8_t *color = xcalloc((size_t)b->n_rules, 1);
    struct cursor {
        int32_t r;
        int32_t a;
        int32_t i;
    } *stack = xmalloc((size_t)b->n_rules * sizeof(*stack));
    int err = 0;
    for (int32_t start = 0; start < b->n_rules && !err; start++) {
        if (color[start]) continue;
        int32_t top = 0;
        stack[0] = (struct cursor){start, 0, 0};
        color[start] = 1;
        while (top >= 0 && !err) {
            struct cursor *c = &stack[top];
            const struct brule *rl = &b->rules[c->r];
            if (c->a >= rl->n_alts) {
                color[c->r] = 2;
                top--;
                continue;
            }
            const struct ivec *alt = &rl->alts[c->a];
            // stop at the first item that must consume a byte
            bool is_past = c->i >= alt->n;
            if (!is_past && c->i > 0) {
                int32_t prev = alt->v[c->i - 1];
                is_past = !(gbnf_item_op(prev) == GBNF_OP_RULE && nullable[gbnf_item_arg(prev)]);
            }
            if (is_past) {
                c->a++;
                c->i = 0;
                continue;
            }
            int32_t it = alt->v[c->i++];
            if (gbnf_item_op(it) != GBNF_OP_RULE) {
                c->i = alt->n;  // a byte: nothing after it is a left corner
                continue;
            }
            int32_t s = gbnf_item_arg(it);
            if (color[s] == 1) {
                b->line = b->rules[b->rules[s].owner].line;
                err = fail(b, "left recursion: rule '%s' can reach itself without consuming "
                              "input", b->rules[b->rules[s].owner].name);
            } else if (color[s] == 0) {
                color[s] = 1;
                stack[++top] = (struct cursor){s, 0, 0};
            }
        }
    }
    free(stack);
    free(color);
    free(nullable);
    return err;
}

/* ---- compile ---------------------------------------------------------------- */

static struct gbnf *flatten(const struct builder *b, int32_t root) {
    int64_t n_items = 0;
    int32_t n_alts = 0;
    for (int32_t r = 0; r < b->n_rules; r++) {
        n_alts += b->rules[r].n_alts;
        for (int32_t a = 0; a < b->rules[r].n_alts; a++) n_items += b->rules[r].alts[a].n + 1;
    }
    size_t bytes = sizeof(struct gbnf_owned) + (size_t)n_items * sizeof(int32_t) +
                   (size_t)n_alts * sizeof(int32_t) + ((size_t)b->n_rules + 1) * sizeof(int32_t);
    bytes = (bytes + 7) & ~(size_t)7;
    size_t sets_off = bytes;
    bytes += (size_t)b->n_sets * sizeof(b->sets[0]);
    char *mem = malloc(bytes);
    if (!mem) return NULL;
    struct gbnf_owned *o = (struct gbnf_owned *)mem;
    int32_t *items = (int32_t *)(mem + sizeof(*o));
    int32_t *alts = items + n_items;
    int32_t *rule_alt0 = alts + n_alts;
    uint64_t(*sets)[4] = (uint64_t(*)[4])(mem + sets_off);
    if (b->n_sets) memcpy(sets, b->sets, (size_t)b->n_sets * sizeof(b->sets[0]));
    int32_t i_item = 0;
    int32_t i_alt = 0;
    for (int32_t r = 0; r < b->n_rules; r++) {
        rule_alt0[r] = i_alt;
        for (int32_t a = 0; a < b->rules[r].n_alts; a++) {
            const struct ivec *v = &b->rules[r].alts[a];
            alts[i_alt++] = i_item;
            if (v->n) memcpy(&items[i_item], v->v, (size_t)v->n * sizeof(int32_t));  // v->v is NULL when empty
            i_item += v->n;
            items[i_item++] = item(GBNF_OP_END, 0);
        }
    }
    rule_alt0[b->n_rules] = i_alt;
    o->g = (struct gbnf){
        .items = items,
        .n_items = (int32_t)n_items,
        .sets = (const uint64_t(*)[4])sets,
        .n_sets = b->n_sets,
        .alts = alts,
        .n_alts = n_alts,
        .rule_alt0 = rule_alt0,
        .n_rules = b->n_rules,
        .root = root,
    };
    atomic_init(&o->n_refs, 1);
    return &o->g;
}

int gbnf_compile(const char *text, size_t len, struct gbnf **out, char *msg, size_t msg_size) {
    *out = NULL;
    if (msg && msg_size) msg[0] = '\0';
    struct builder b = {.p = text, .end = text + len, .line = 1, .msg = msg, .msg_size = msg_size};
    int err = 0;
    if (len > GBNF_TEXT_MAX) err = fail(&b, "grammar longer than %d bytes", GBNF_TEXT_MAX);
    for (;;) {
        if (err) break;
        skip_space(&b, true);
        if (b.p >= b.end) break;
        err = parse_rule(&b);
    }
    int32_t root = err ? -1 : rule_find(&b, "root", 4);
    if (!err && root < 0) err = fail(&b, "no rule named 'root'");
    for (int32_t r = 0; r < b.n_rules && !err; r++) {
        if (!b.rules[r].is_defined) {
            b.line = b.rules[r].line;
            err = fail(&b, "unknown rule '%s'", b.rules[r].name);
        }
    }
    if (!err) err = remove_nullable_stars(&b);
    if (!err) err = check_left_recursion(&b);
    if (!err) {
        *out = flatten(&b, root);
        if (!*out) err = ERR_NOMEM;
    }
    builder_deinit(&b);
    return err;
}

struct gbnf *gbnf_retain(struct gbnf *g) {
    struct gbnf_owned *o = (struct gbnf_owned *)g;
    atomic_fetch_add(&o->n_refs, 1);
    return g;
}

void gbnf_release(struct gbnf *g) {
    if (!g) return;
    struct gbnf_owned *o = (struct gbnf_owned *)g;
    if (atomic_fetch_sub(&o->n_refs, 1) == 1) free(o);
}
