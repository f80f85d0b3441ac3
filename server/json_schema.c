/*
 * server/json_schema.c - JSON Schema to GBNF (json_schema.h has the subset).
 *
 * Each subschema becomes one rule `sN ::= ...`; a $ref target gets its rule
 * name before its body is written, so recursive schemas refer to themselves
 * by name. The JSON primitives (value, object, array, string, char, number,
 * integer, ws) are written once at the end. Whitespace appears only inside
 * containers (after '{' '[' ',' ':' and each member), never after the root
 * value, so a grammar for an object is complete at its closing brace and the
 * sequence ends there.
 *
 * Strings are matched as JSON text, so a pattern's characters are mapped to
 * their JSON encodings ('"' is \", a newline is \n).
 */
#include "server/json_schema.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/base/alloc.h"
#include "engine/base/err.h"
#include "engine/engine.h"

#define PATH_MAX_LEN 192

struct ref_name {
    char *ref;  // owned; the $ref string
    int rule;   // its rule number
};

struct gen {
    json_t *root;     // borrowed; the whole schema, for $ref
    struct buf *out;  // borrowed; the grammar
    char *msg;        // borrowed; [msg_size] the error
    size_t msg_size;
    int n_rules;            // next rule number
    struct ref_name *refs;  // owned; [n_refs] $ref strings already given a rule
    int n_refs;
    int cap_refs;
};

static int fail(struct gen *g, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static int fail(struct gen *g, const char *fmt, ...) {
    if (g->msg && g->msg_size) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(g->msg, g->msg_size, fmt, ap);
        va_end(ap);
    }
    return ERR_INVAL;
}

static void appendf(struct buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void appendf(struct buf *b, const char *fmt, ...) {
    char tmp[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof(tmp), fmt, ap);
    va_end(ap);
    ASSERT(n >= 0 && (size_t)n < sizeof(tmp));  // only short rule text goes through here
    buf_append(b, tmp, (size_t)n);
}

void json_schema_gbnf_literal(struct buf *out, const char *s, size_t len) {
    buf_append_char(out, '"');
    for (size_t i = 0; i < len; i++) {
        uint8_t c = (uint8_t)s[i];
        if (c == '"' || c == '\\') {
            buf_append_char(out, '\\');
            buf_append_char(out, (char)c);
        } else if (c < 0x20 || c == 0x7f) {
            appendf(out, "\\x%02X", c);
        } else {
            buf_append_char(out, (char)c);  // UTF-8 passes through: GBNF literals are UTF-8
        }
    }
    buf_append_char(out, '"');
}

/* The GBNF literal matching v's compact JSON text (const, enum). */
static int value_literal(struct gen *g, json_t *v, struct buf *body, const char *path) {
    char *text = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY | JSON_SORT_KEYS);
    if (!text) return fail(g, "value at %s cannot be serialised", path);
    json_schema_gbnf_literal(body, text, strlen(text));
    free(text);
    return 0;
}

/* ---- regex patterns -------------------------------------------------------- */

struct re {
    struct gen *g;
    const char *s;  // the pattern (UTF-8, from jansson)
    size_t n;
    size_t pos;
    const char *path;  // for messages
    int depth;
};

static int re_fail(struct re *r, const char *what) {
    return fail(r->g, "unsupported regex %s at offset %zu in 'pattern' at %s", what, r->pos,
                r->path);
}

/* Decodes the code point at r->pos (valid UTF-8: jansson checked it). */
static uint32_t re_next_cp(struct re *r) {
    const uint8_t *p = (const uint8_t *)r->s + r->pos;
    uint32_t c = p[0];
    int len = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
    if (r->pos + (size_t)len > r->n) len = 1;
    if (len > 1) c &= 0xFFu >> (len + 1);
    for (int i = 1; i < len; i++) c = (c << 6) | (p[i] & 0x3F);
    r->pos += (size_t)len;
    return c;
}

/* One code point's JSON encoding inside a string, as a GBNF literal. */
static void re_json_char(struct buf *b, uint32_t cp) {
    switch (cp) {
        case '"':
            buf_append_str(b, "\"\\\\\\\"\"");
            return;  // \"
        case '\\':
            buf_append_str(b, "\"\\\\\\\\\"");
            return;  // \\ (two bytes)
        case '\n':
            buf_append_str(b, "\"\\\\n\"");
            return;
        case '\r':
            buf_append_str(b, "\"\\\\r\"");
            return;
        case '\t':
            buf_append_str(b, "\"\\\\t\"");
            return;
        default:
            break;
    }
    if (cp < 0x20) {
        appendf(b, "\"\\\\u%04x\"", (unsigned)cp);
        return;
    }
    char u[4];
    int n = 0;
    if (cp < 0x80) {
        u[n++] = (char)cp;
    } else if (cp < 0x800) {
        u[n++] = (char)(0xC0 | (cp >> 6));
        u[n++] = (char)(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
        u[n++] = (char)(0xE0 | (cp >> 12));
        u[n++] = (char)(0x80 | ((cp >> 6) & 0x3F));
        u[n++] = (char)(0x80 | (cp & 0x3F));
    } else {
        u[n++] = (char)(0xF0 | (cp >> 18));
        u[n++] = (char)(0x80 | ((cp >> 12) & 0x3F));
        u[n++] = (char)(0x80 | ((cp >> 6) & 0x3F));
        u[n++] = (char)(0x80 | (cp & 0x3F));
    }
    json_schema_gbnf_literal(b, u, (size_t)n);
}

/* A code point inside a GBNF character class. */
static void class_cp(struct buf *b, uint32_t cp) {
    if ((cp >= '0' && cp <= '9') || (cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z'))
        buf_append_char(b, (char)cp);
    else if (cp < 0x10000)
        appendf(b, "\\u%04X", (unsigned)cp);
    else
        appendf(b, "\\U%08X", (unsigned)cp);
}

struct cp_range {
    uint32_t lo, hi;
};

#define RE_CLASS_MAX 64

struct re_class {
    struct cp_range r[RE_CLASS_MAX];
    int n;
    bool negated;
};

static int class_add(struct re *r, struct re_class *c, uint32_t lo, uint32_t hi) {
    if (c->n == RE_CLASS_MAX) return re_fail(r, "class with too many ranges");
    c->r[c->n++] = (struct cp_range){lo, hi};
    return 0;
}

/* \d \w \s into c; other letters are not classes (0 added, returns 1). */
static int class_shorthand(struct re *r, struct re_class *c, char e) {
    switch (e) {
        case 'd':
            return class_add(r, c, '0', '9');
        case 'w':
            if (class_add(r, c, '0', '9') || class_add(r, c, 'a', 'z') || class_add(r, c, 'A', 'Z'))
                return ERR_INVAL;
            return class_add(r, c, '_', '_');
        case 's':
            if (class_add(r, c, ' ', ' ') || class_add(r, c, '\t', '\r')) return ERR_INVAL;
            return 0;
        default:
            return 1;
    }
}

/* A single-character escape's code point (\. \n \t \\ ...), or -1. */
static int64_t re_escape_cp(char e) {
    switch (e) {
        case 'n':
            return '\n';
        case 'r':
            return '\r';
        case 't':
            return '\t';
        case 'f':
            return '\f';
        case 'v':
            return '\v';
        case '0':
            return 0;
        default:
            break;
    }
    if (strchr("\\^$.|?*+()[]{}/-\"' #:!<>=,&~@%`;", e)) return (unsigned char)e;
    return -1;
}

/* A parsed class as GBNF: its JSON text is one unescaped character in the
 * class, or the escape of one that must be escaped in JSON. */
static void class_emit(const struct re_class *c, struct buf *b) {
    buf_append_str(b, "(");
    bool first = true;
    if (c->negated) {
        // Anything but the listed code points, and never a raw '"', '\' or control.
        buf_append_str(b, "[^");
        for (int i = 0; i < c->n; i++) {
            class_cp(b, c->r[i].lo);
            if (c->r[i].hi != c->r[i].lo) {
                buf_append_char(b, '-');
                class_cp(b, c->r[i].hi);
            }
        }
        buf_append_str(b, "\"\\\\\\x00-\\x1F]");
        first = false;
        static const uint32_t escaped[] = {'"', '\\'};
        for (size_t k = 0; k < sizeof(escaped) / sizeof(escaped[0]); k++) {
            bool excluded = false;
            for (int i = 0; i < c->n; i++)
                excluded |= c->r[i].lo <= escaped[k] && escaped[k] <= c->r[i].hi;
            if (excluded) continue;
            buf_append_str(b, " | ");
            re_json_char(b, escaped[k]);
        }
        buf_append_str(b, ")");
        return;
    }
    // The plain part: each range minus '"', '\' and controls, in one class.
    struct buf plain = {0};
    for (int i = 0; i < c->n; i++) {
        uint32_t lo = c->r[i].lo, hi = c->r[i].hi;
        // cut [lo, hi] at the code points that JSON escapes: 0x00-0x1F, '"', '\'
        uint32_t cuts[][2] = {{0, 0x1F}, {'"', '"'}, {'\\', '\\'}};
        uint32_t a = lo;
        while (a <= hi) {
            bool cut = false;
            for (size_t k = 0; k < 3; k++) {
                if (a >= cuts[k][0] && a <= cuts[k][1]) {
                    if (!first) buf_append_str(b, " | ");
                    re_json_char(b, a);
                    first = false;
                    cut = true;
                }
            }
            if (cut) {
                a++;
                continue;
            }
            uint32_t e = hi;  // the longest run from a with nothing to cut
            for (size_t k = 0; k < 3; k++)
                if (cuts[k][0] > a && cuts[k][0] - 1 < e) e = cuts[k][0] - 1;
            class_cp(&plain, a);
            if (e != a) {
                buf_append_char(&plain, '-');
                class_cp(&plain, e);
            }
            if (e == UINT32_MAX) break;
            a = e + 1;
        }
    }
    if (plain.len) {
        if (!first) buf_append_str(b, " | ");
        buf_append_char(b, '[');
        buf_append(b, plain.data, plain.len);
        buf_append_char(b, ']');
        first = false;
    }
    buf_free(&plain);
    if (first) buf_append_str(b, "[^\\x00-\\U0010FFFF]");  // an empty class matches nothing
    buf_append_str(b, ")");
}

static int re_class(struct re *r, struct buf *b) {
    struct re_class c = {.n = 0};
    r->pos++;  // '['
    if (r->pos < r->n && r->s[r->pos] == '^') {
        c.negated = true;
        r->pos++;
    }
    bool first = true;
    while (r->pos < r->n && (r->s[r->pos] != ']' || first)) {
        first = false;
        uint32_t lo;
        if (r->s[r->pos] == '\\') {
            if (r->pos + 1 >= r->n) return re_fail(r, "trailing '\\'");
            char e = r->s[r->pos + 1];
            r->pos += 2;
            int sh = class_shorthand(r, &c, e);
            if (sh <= 0) {
                if (sh < 0) return sh;
                continue;
            }
            int64_t cp = re_escape_cp(e);
            if (cp < 0) {
                r->pos -= 2;
                return re_fail(r, "escape in a class");
            }
            lo = (uint32_t)cp;
        } else {
            lo = re_next_cp(r);
        }
        uint32_t hi = lo;
        if (r->pos + 1 < r->n && r->s[r->pos] == '-' && r->s[r->pos + 1] != ']') {
            r->pos++;
            if (r->s[r->pos] == '\\') {
                if (r->pos + 1 >= r->n) return re_fail(r, "trailing '\\'");
                int64_t cp = re_escape_cp(r->s[r->pos + 1]);
                if (cp < 0) return re_fail(r, "escape in a class range");
                r->pos += 2;
                hi = (uint32_t)cp;
            } else {
                hi = re_next_cp(r);
            }
            if (hi < lo) return re_fail(r, "reversed class range");
        }
        int err = class_add(r, &c, lo, hi);
        if (err) return err;
    }
    if (r->pos >= r->n) return re_fail(r, "unterminated '['");
    r->pos++;  // ']'
    class_emit(&c, b);
    return 0;
}

static int re_alt(struct re *r, struct buf *b);

/* The JSON text of any one character (the regex '.'; also around unanchored patterns). */
static const char json_any_char[] = "char";

/* One atom into b. */
static int re_atom(struct re *r, struct buf *b) {
    char c = r->s[r->pos];
    switch (c) {
        case '(': {
            r->pos++;
            if (r->pos + 1 < r->n && r->s[r->pos] == '?') {
                if (r->s[r->pos + 1] != ':') return re_fail(r, "group '(?'");
                r->pos += 2;
            }
            if (++r->depth > JSON_SCHEMA_DEPTH_MAX) return re_fail(r, "nesting");
            buf_append_char(b, '(');
            int err = re_alt(r, b);
            if (err) return err;
            r->depth--;
            if (r->pos >= r->n || r->s[r->pos] != ')') return re_fail(r, "unbalanced '('");
            r->pos++;
            buf_append_char(b, ')');
            return 0;
        }
        case '[':
            return re_class(r, b);
        case '.':
            r->pos++;
            buf_append_str(b, json_any_char);
            return 0;
        case '\\': {
            if (r->pos + 1 >= r->n) return re_fail(r, "trailing '\\'");
            char e = r->s[r->pos + 1];
            struct re_class cl = {.n = 0};
            char lower = (char)(e | 0x20);
            if (e == 'd' || e == 'w' || e == 's' || e == 'D' || e == 'W' || e == 'S') {
                r->pos += 2;
                int err = class_shorthand(r, &cl, lower);
                if (err) return err;
                cl.negated = e != lower;
                class_emit(&cl, b);
                return 0;
            }
            int64_t cp = re_escape_cp(e);
            if (cp < 0) return re_fail(r, "escape");
            r->pos += 2;
            re_json_char(b, (uint32_t)cp);
            return 0;
        }
        case ')':
            return re_fail(r, "unbalanced ')'");
        case '*':
        case '+':
        case '?':
            return re_fail(r, "quantifier without an atom");
        case '^':
        case '$':
            return re_fail(r, "anchor inside the pattern");
        default:
            re_json_char(b, re_next_cp(r));
            return 0;
    }
}

/* {m}, {m,}, {m,n} at r->pos: 1 with *lo, *hi (-1: unbounded); 0 if not one. */
static int re_braces(struct re *r, long *lo, long *hi) {
    size_t p = r->pos + 1;
    char *end;
    if (p >= r->n || r->s[p] < '0' || r->s[p] > '9') return 0;
    *lo = strtol(r->s + p, &end, 10);
    p = (size_t)(end - r->s);
    *hi = *lo;
    if (p < r->n && r->s[p] == ',') {
        p++;
        *hi = -1;
        if (p < r->n && r->s[p] >= '0' && r->s[p] <= '9') {
            *hi = strtol(r->s + p, &end, 10);
            p = (size_t)(end - r->s);
        }
    }
    if (p >= r->n || r->s[p] != '}') return 0;
    r->pos = p + 1;
    return 1;
}

/* A sequence of quantified atoms into b. A repetition of an atom that can
 * match the empty string ((a?)*, (|yT){2,}) is written as it is: the grammar
 * compiler takes it (gbnf.c, remove_nullable_stars()). */
static int re_seq(struct re *r, struct buf *b) {
    bool any = false;
    while (r->pos < r->n && r->s[r->pos] != '|' && r->s[r->pos] != ')') {
        if (r->s[r->pos] == '$' && r->pos + 1 == r->n) break;  // the end anchor
        if (any) buf_append_char(b, ' ');
        buf_append_char(b, '(');
        int err = re_atom(r, b);
        if (err) return err;
        buf_append_char(b, ')');
        any = true;
        if (r->pos >= r->n) break;
        char q = r->s[r->pos];
        long lo, hi;
        if (q == '*' || q == '+' || q == '?') {
            buf_append_char(b, q);
            r->pos++;
        } else if (q == '{' && re_braces(r, &lo, &hi)) {
            if (lo > GBNF_REPEAT_MAX || hi > GBNF_REPEAT_MAX)
                return re_fail(r,
                               "repetition count over "
                               "1000");
            if (hi >= 0 && hi < lo) return re_fail(r, "repetition {m,n} with n < m");
            if (hi < 0)
                appendf(b, "{%ld,}", lo);
            else
                appendf(b, "{%ld,%ld}", lo, hi);
        }
        if (r->pos < r->n && (r->s[r->pos] == '?' || r->s[r->pos] == '+'))
            return re_fail(r, "lazy or possessive quantifier");
        if (r->pos < r->n && strchr("*+?", r->s[r->pos])) return re_fail(r, "double quantifier");
    }
    if (!any) buf_append_str(b, "\"\"");
    return 0;
}

/* Alternatives into b. */
static int re_alt(struct re *r, struct buf *b) {
    int err = re_seq(r, b);
    while (!err && r->pos < r->n && r->s[r->pos] == '|') {
        r->pos++;
        buf_append_str(b, " | ");
        err = re_seq(r, b);
    }
    return err;
}

/* The JSON string whose value the pattern (search semantics: unanchored ends
 * allow anything there) matches. */
static int pattern_expr(struct gen *g, const char *pat, const char *path, struct buf *body) {
    struct re r = {.g = g, .s = pat, .n = strlen(pat), .path = path};
    bool start = r.n > 0 && pat[0] == '^';
    bool end = r.n > 1 && pat[r.n - 1] == '$' && pat[r.n - 2] != '\\';
    if (start) r.pos = 1;
    for (size_t i = r.pos, depth = 0; i < r.n;
         i++) {  // a top-level '|' with anchors changes their reach
        if (pat[i] == '\\')
            i++;
        else if (pat[i] == '[')
            while (i < r.n && pat[i] != ']') i += pat[i] == '\\' ? 2 : 1;
        else if (pat[i] == '(')
            depth++;
        else if (pat[i] == ')' && depth)
            depth--;
        else if (pat[i] == '|' && depth == 0 && (start || end))
            return re_fail(&r, "'|' beside an anchor");
    }
    buf_append_str(body, "\"\\\"\" ");
    if (!start) buf_append_str(body, "char* ");
    buf_append_char(body, '(');
    int err = re_alt(&r, body);
    if (err) return err;
    if (r.pos < r.n && !(end && r.pos == r.n - 1)) return re_fail(&r, "unbalanced ')'");
    buf_append_str(body, ") ");
    if (!end) buf_append_str(body, "char* ");
    buf_append_str(body, "\"\\\"\"");
    return 0;
}

/* ---- schemas --------------------------------------------------------------- */

static const char *const annotations[] = {
    "title",      "description", "default",   "examples", "$schema",     "$id",    "$comment",
    "deprecated", "readOnly",    "writeOnly", "$defs",    "definitions", "strict", NULL,
};
static const char *const supported[] = {
    "type",     "properties", "required",  "additionalProperties",
    "enum",     "const",      "anyOf",     "oneOf",
    "allOf",    "$ref",       "items",     "minItems",
    "maxItems", "minLength",  "maxLength", "pattern",
    "format",   NULL,
};

static bool in_list(const char *const *list, const char *k) {
    for (int i = 0; list[i]; i++)
        if (strcmp(list[i], k) == 0) return true;
    return false;
}

static int new_rule(struct gen *g) {
    return g->n_rules++;
}

static void subpath(char *dst, const char *path, const char *a, const char *b) {
    snprintf(dst, PATH_MAX_LEN, "%s/%s%s%s", path, a, b ? "/" : "", b ? b : "");
}

static int gen_rule(struct gen *g, json_t *s, const char *path, int depth, int rule);

/* A fresh rule for subschema s; its number into *rule. */
static int gen_sub(struct gen *g, json_t *s, const char *path, int depth, int *rule) {
    *rule = new_rule(g);
    return gen_rule(g, s, path, depth + 1, *rule);
}

static int get_count(struct gen *g, json_t *s, const char *key, const char *path, long *out) {
    json_t *v = json_object_get(s, key);
    if (!v) return 0;
    if (!json_is_integer(v) || json_integer_value(v) < 0)
        return fail(g, "'%s' at %s must be a non-negative integer", key, path);
    if (json_integer_value(v) > GBNF_REPEAT_MAX)
        return fail(g, "'%s' at %s is over %d", key, path, GBNF_REPEAT_MAX);
    *out = (long)json_integer_value(v);
    return 0;
}

/* x{lo,hi} for a repetition whose hi may be -1 (unbounded). */
static void repeat(struct buf *b, long lo, long hi) {
    if (lo == 0 && hi < 0)
        buf_append_char(b, '*');
    else if (lo == 1 && hi < 0)
        buf_append_char(b, '+');
    else if (hi < 0)
        appendf(b, "{%ld,}", lo);
    else
        appendf(b, "{%ld,%ld}", lo, hi);
}

/* A property name as JSON text, quotes and escapes as jansson writes them.
 * Owned by the caller (free()). */
static char *key_text(const char *name) {
    json_t *ks = json_string(name);
    char *kt = json_dumps(ks, JSON_ENCODE_ANY);
    json_decref(ks);
    ASSERT(kt);  // a key jansson parsed is valid UTF-8; only memory can fail
    return kt;
}

static int object_expr(struct gen *g, json_t *s, const char *path, int depth, struct buf *body) {
    json_t *props = json_object_get(s, "properties");
    json_t *req = json_object_get(s, "required");
    json_t *add = json_object_get(s, "additionalProperties");
    if (props && !json_is_object(props))
        return fail(g, "'properties' at %s must be an object", path);
    if (req && !json_is_array(req)) return fail(g, "'required' at %s must be an array", path);
    if (add && !json_is_boolean(add) && !json_is_object(add))
        return fail(g, "'additionalProperties' at %s must be a boolean or a schema", path);
    size_t i;
    json_t *v;
    json_array_foreach(req, i, v) {
        if (!json_is_string(v)) return fail(g, "'required' at %s must hold strings", path);
        if (!props || !json_object_get(props, json_string_value(v)))
            return fail(g, "required property '%s' at %s is not in 'properties'",
                        json_string_value(v), path);
    }
    // The member rule of additional properties: -1 none, -2 any value.
    // NOTE: beside declared properties, others are left out even when
    // additionalProperties is absent (a sound subset: every document still
    // validates), and refused when asked for, since a grammar cannot keep an
    // extra key from spelling a declared one (with escapes, in many ways).
    int extra = -1;
    size_t n_props = props ? json_object_size(props) : 0;
    if (n_props && add && !json_is_false(add))
        return fail(
            g, "unsupported: 'additionalProperties' other than false beside 'properties' at %s",
            path);
    if (!n_props && (!add || json_is_true(add))) {
        extra = -2;
    } else if (!n_props && json_is_object(add)) {
        char p[PATH_MAX_LEN];
        subpath(p, path, "additionalProperties", NULL);
        int err = gen_sub(g, add, p, depth, &extra);
        if (err) return err;
    }
    size_t n = props ? json_object_size(props) : 0;
    // Declared members in order; member k may be left out unless required:
    //   first(k) = m_k rest(k+1) | first(k+1)   (the first member written)
    //   rest(k)  = ("," ws m_k)? rest(k+1)      (after one was written)
    // with first(n) / rest(n) the additional members. Two rules per member.
    int base = g->n_rules;
    g->n_rules += 2 * (int)n + 2;
    int *member = xcalloc(n ? n : 1, sizeof(*member));
    bool *required = xcalloc(n ? n : 1, sizeof(*required));
    const char **names = xcalloc(n ? n : 1, sizeof(*names));
    size_t k = 0;
    const char *key;
    json_object_foreach(props, key, v) {
        char p[PATH_MAX_LEN];
        subpath(p, path, "properties", key);
        int err = gen_sub(g, v, p, depth, &member[k]);
        if (err) {
            free(member);
            free(required);
            free(names);
            return err;
        }
        names[k] = key;
        json_t *r;
        json_array_foreach(req, i, r) required[k] |= strcmp(json_string_value(r), key) == 0;
        k++;
    }
    struct buf *o = g->out;
    for (k = 0; k <= n; k++) {
        int first = base + 2 * (int)k, rest = first + 1;
        appendf(o, "s%d ::= ", first);
        if (k == n) {
            if (extra == -1)
                buf_append_str(o, "\"\"");
            else if (extra == -2)
                buf_append_str(o, "(kv (\",\" ws kv)*)?");
            else
                appendf(o, "(kv-s%d (\",\" ws kv-s%d)*)?", extra, extra);
        } else {
            char *kt = key_text(names[k]);
            json_schema_gbnf_literal(o, kt, strlen(kt));
            free(kt);
            appendf(o, " ws \":\" ws s%d ws s%d", member[k], rest + 2);
            if (!required[k]) appendf(o, " | s%d", first + 2);
        }
        buf_append_char(o, '\n');
        appendf(o, "s%d ::= ", rest);
        if (k == n) {
            if (extra == -1)
                buf_append_str(o, "\"\"");
            else if (extra == -2)
                buf_append_str(o, "(\",\" ws kv)*");
            else
                appendf(o, "(\",\" ws kv-s%d)*", extra);
        } else {
            char *kt = key_text(names[k]);
            buf_append_str(o, required[k] ? "\",\" ws " : "(\",\" ws ");
            json_schema_gbnf_literal(o, kt, strlen(kt));
            free(kt);
            appendf(o, " ws \":\" ws s%d ws%s s%d", member[k], required[k] ? "" : ")?", rest + 2);
        }
        buf_append_char(o, '\n');
    }
    if (extra >= 0) appendf(o, "kv-s%d ::= string ws \":\" ws s%d ws\n", extra, extra);
    free(member);
    free(required);
    free(names);
    appendf(body, "\"{\" ws s%d \"}\"", base);
    return 0;
}

static int array_expr(struct gen *g, json_t *s, const char *path, int depth, struct buf *body) {
    json_t *items = json_object_get(s, "items");
    long lo = 0, hi = -1;
    int err = get_count(g, s, "minItems", path, &lo);
    if (!err) err = get_count(g, s, "maxItems", path, &hi);
    if (err) return err;
    if (json_object_get(s, "maxItems") && hi < lo)
        return fail(g, "'maxItems' at %s is below 'minItems'", path);
    char item[32] = "value";
    if (items) {
        if (!json_is_object(items) && !json_is_boolean(items))
            return fail(g, "'items' at %s must be a schema", path);
        char p[PATH_MAX_LEN];
        subpath(p, path, "items", NULL);
        int rule;
        err = gen_sub(g, items, p, depth, &rule);
        if (err) return err;
        snprintf(item, sizeof(item), "s%d", rule);
    }
    if (hi == 0) {
        buf_append_str(body, "\"[\" ws \"]\"");
        return 0;
    }
    // "[" ws (item ws ("," ws item ws){lo-1,hi-1})? "]", the group required when lo > 0
    appendf(body, "\"[\" ws (%s ws (\",\" ws %s ws)", item, item);
    repeat(body, lo > 0 ? lo - 1 : 0, hi < 0 ? -1 : hi - 1);
    buf_append_str(body, lo > 0 ? ") \"]\"" : ")? \"]\"");
    return 0;
}

static int string_expr(struct gen *g, json_t *s, const char *path, struct buf *body) {
    json_t *pattern = json_object_get(s, "pattern");
    json_t *format = json_object_get(s, "format");
    bool has_len = json_object_get(s, "minLength") || json_object_get(s, "maxLength");
    if ((pattern || format) && has_len)
        return fail(g, "unsupported: 'minLength'/'maxLength' together with '%s' at %s",
                    pattern ? "pattern" : "format", path);
    if (pattern && format)
        return fail(g, "unsupported: 'pattern' together with 'format' at %s", path);
    if (pattern) {
        if (!json_is_string(pattern)) return fail(g, "'pattern' at %s must be a string", path);
        return pattern_expr(g, json_string_value(pattern), path, body);
    }
    if (format) {
        if (!json_is_string(format)) return fail(g, "'format' at %s must be a string", path);
        const char *f = json_string_value(format);
        if (strcmp(f, "date") == 0)
            buf_append_str(body, "\"\\\"\" date \"\\\"\"");
        else if (strcmp(f, "time") == 0)
            buf_append_str(body, "\"\\\"\" time \"\\\"\"");
        else if (strcmp(f, "date-time") == 0)
            buf_append_str(body, "\"\\\"\" date \"T\" time \"\\\"\"");
        else if (strcmp(f, "uuid") == 0)
            buf_append_str(body, "\"\\\"\" uuid \"\\\"\"");
        else
            return fail(g, "unsupported JSON Schema format '%s' at %s", f, path);
        return 0;
    }
    long lo = 0, hi = -1;
    int err = get_count(g, s, "minLength", path, &lo);
    if (!err) err = get_count(g, s, "maxLength", path, &hi);
    if (err) return err;
    if (json_object_get(s, "maxLength") && hi < lo)
        return fail(g, "'maxLength' at %s is below 'minLength'", path);
    if (lo == 0 && hi < 0) {
        buf_append_str(body, "string");
        return 0;
    }
    buf_append_str(body, "\"\\\"\" char");
    repeat(body, lo, hi);
    buf_append_str(body, " \"\\\"\"");
    return 0;
}

/* One type's expression for schema s. */
static int type_expr(struct gen *g, json_t *s, const char *type, const char *path, int depth,
                     struct buf *body) {
    if (strcmp(type, "object") == 0) return object_expr(g, s, path, depth, body);
    if (strcmp(type, "array") == 0) return array_expr(g, s, path, depth, body);
    if (strcmp(type, "string") == 0) return string_expr(g, s, path, body);
    if (strcmp(type, "number") == 0)
        buf_append_str(body, "number");
    else if (strcmp(type, "integer") == 0)
        buf_append_str(body, "integer");
    else if (strcmp(type, "boolean") == 0)
        buf_append_str(body, "(\"true\" | \"false\")");
    else if (strcmp(type, "null") == 0)
        buf_append_str(body, "\"null\"");
    else
        return fail(g, "unknown type '%s' at %s", type, path);
    return 0;
}

/* The target of a $ref inside this document. */
static json_t *resolve_ref(struct gen *g, const char *ref) {
    if (strcmp(ref, "#") == 0) return g->root;
    const char *name = NULL;
    json_t *defs = NULL;
    if (strncmp(ref, "#/$defs/", 8) == 0) {
        defs = json_object_get(g->root, "$defs");
        name = ref + 8;
    } else if (strncmp(ref, "#/definitions/", 14) == 0) {
        defs = json_object_get(g->root, "definitions");
        name = ref + 14;
    }
    if (!defs || !json_is_object(defs)) return NULL;
    // JSON Pointer escapes (RFC 6901): ~1 is '/', ~0 is '~'
    char key[256];
    size_t n = 0;
    for (const char *p = name; *p; p++) {
        if (n + 1 >= sizeof(key) || *p == '/') return NULL;
        if (*p == '~' && (p[1] == '0' || p[1] == '1')) {
            key[n++] = p[1] == '0' ? '~' : '/';
            p++;
        } else {
            key[n++] = *p;
        }
    }
    key[n] = '\0';
    return json_object_get(defs, key);
}

static int ref_rule(struct gen *g, const char *ref, const char *path, int depth, int *rule) {
    for (int i = 0; i < g->n_refs; i++) {
        if (strcmp(g->refs[i].ref, ref) == 0) {
            *rule = g->refs[i].rule;
            return 0;
        }
    }
    json_t *target = resolve_ref(g, ref);
    if (!target) return fail(g, "unresolvable $ref '%s' at %s", ref, path);
    if (g->n_refs == g->cap_refs) {
        g->cap_refs = g->cap_refs ? 2 * g->cap_refs : 8;
        g->refs = xrealloc(g->refs, (size_t)g->cap_refs * sizeof(*g->refs));
    }
    *rule = new_rule(g);
    g->refs[g->n_refs++] = (struct ref_name){xstrdup(ref), *rule};
    char p[PATH_MAX_LEN];
    snprintf(p, sizeof(p), "%s", ref);
    return gen_rule(g, target, p, depth + 1, *rule);
}

/* Alternatives of a list of subschemas (anyOf, oneOf, a one-element allOf). */
static int alternatives(struct gen *g, json_t *list, const char *key, const char *path, int depth,
                        struct buf *body) {
    if (!json_is_array(list) || json_array_size(list) == 0)
        return fail(g, "'%s' at %s must be a non-empty array", key, path);
    if (strcmp(key, "allOf") == 0 && json_array_size(list) != 1)
        return fail(g, "unsupported JSON Schema keyword 'allOf' with more than one schema at %s",
                    path);
    buf_append_char(body, '(');
    size_t i;
    json_t *v;
    json_array_foreach(list, i, v) {
        char idx[24];
        snprintf(idx, sizeof(idx), "%zu", i);
        char p[PATH_MAX_LEN];
        subpath(p, path, key, idx);
        int rule;
        int err = gen_sub(g, v, p, depth, &rule);
        if (err) return err;
        appendf(body, "%ss%d", i ? " | " : "", rule);
    }
    buf_append_char(body, ')');
    return 0;
}

static int schema_expr(struct gen *g, json_t *s, const char *path, int depth, struct buf *body) {
    if (depth > JSON_SCHEMA_DEPTH_MAX)
        return fail(g, "schema nested deeper than %d at %s", JSON_SCHEMA_DEPTH_MAX, path);
    if (json_is_true(s)) {
        buf_append_str(body, "value");
        return 0;
    }
    if (json_is_false(s)) return fail(g, "schema 'false' at %s matches nothing", path);
    if (!json_is_object(s)) return fail(g, "schema at %s must be an object or a boolean", path);
    const char *key;
    json_t *v;
    json_object_foreach(s, key, v) {
        if (!in_list(supported, key) && !in_list(annotations, key))
            return fail(g, "unsupported JSON Schema keyword '%s' at %s", key, path);
    }
    json_t *ref = json_object_get(s, "$ref");
    if (ref) {
        if (!json_is_string(ref)) return fail(g, "'$ref' at %s must be a string", path);
        json_object_foreach(s, key, v) {
            if (strcmp(key, "$ref") != 0 && !in_list(annotations, key))
                return fail(g, "unsupported: '%s' beside '$ref' at %s", key, path);
        }
        int rule = -1;
        int err = ref_rule(g, json_string_value(ref), path, depth, &rule);
        if (!err) appendf(body, "s%d", rule);
        return err;
    }
    if ((v = json_object_get(s, "const"))) return value_literal(g, v, body, path);
    if ((v = json_object_get(s, "enum"))) {
        if (!json_is_array(v) || json_array_size(v) == 0)
            return fail(g, "'enum' at %s must be a non-empty array", path);
        size_t i;
        json_t *e;
        buf_append_char(body, '(');
        json_array_foreach(v, i, e) {
            if (i) buf_append_str(body, " | ");
            int err = value_literal(g, e, body, path);
            if (err) return err;
        }
        buf_append_char(body, ')');
        return 0;
    }
    static const char *const combinators[] = {"anyOf", "oneOf", "allOf"};
    for (int c = 0; c < 3; c++) {
        if ((v = json_object_get(s, combinators[c]))) {
            const char *other = json_object_get(s, "type") ? "type" : NULL;
            if (other)
                return fail(g, "unsupported: 'type' beside '%s' at %s", combinators[c], path);
            return alternatives(g, v, combinators[c], path, depth, body);
        }
    }
    json_t *type = json_object_get(s, "type");
    if (!type) {  // the type the keywords imply, or any value
        if (json_object_get(s, "properties") || json_object_get(s, "additionalProperties") ||
            json_object_get(s, "required"))
            return object_expr(g, s, path, depth, body);
        if (json_object_get(s, "items") || json_object_get(s, "minItems") ||
            json_object_get(s, "maxItems"))
            return array_expr(g, s, path, depth, body);
        if (json_object_get(s, "pattern") || json_object_get(s, "format") ||
            json_object_get(s, "minLength") || json_object_get(s, "maxLength"))
            return string_expr(g, s, path, body);
        buf_append_str(body, "value");
        return 0;
    }
    if (json_is_string(type)) return type_expr(g, s, json_string_value(type), path, depth, body);
    if (!json_is_array(type) || json_array_size(type) == 0)
        return fail(g, "'type' at %s must be a string or a non-empty array", path);
    size_t i;
    json_t *t;
    buf_append_char(body, '(');
    json_array_foreach(type, i, t) {
        if (!json_is_string(t)) return fail(g, "'type' at %s must hold strings", path);
        if (i) buf_append_str(body, " | ");
        int err = type_expr(g, s, json_string_value(t), path, depth, body);
        if (err) return err;
    }
    buf_append_char(body, ')');
    return 0;
}

static int gen_rule(struct gen *g, json_t *s, const char *path, int depth, int rule) {
    struct buf body = {0};
    int err = schema_expr(g, s, path, depth, &body);
    if (!err) {
        appendf(g->out, "s%d ::= ", rule);
        buf_append(g->out, body.data, body.len);
        buf_append_char(g->out, '\n');
    }
    buf_free(&body);
    return err;
}

/* The JSON primitives every schema grammar may name. */
static void primitives(struct buf *out) {
    buf_append_str(
        out,
        "value ::= object | array | string | number | (\"true\" | \"false\") | \"null\"\n"
        "object ::= \"{\" ws (kv (\",\" ws kv)*)? \"}\"\n"
        "kv ::= string ws \":\" ws value ws\n"
        "array ::= \"[\" ws (value ws (\",\" ws value ws)*)? \"]\"\n"
        "string ::= \"\\\"\" char* \"\\\"\"\n"
        "char ::= [^\"\\\\\\x00-\\x1F] | \"\\\\\" ([\"\\\\/bfnrt] | \"u\" [0-9a-fA-F]{4})\n"
        "number ::= integer (\".\" [0-9]{1,16})? ([eE] [-+]? [0-9]{1,3})?\n"
        "integer ::= \"-\"? (\"0\" | [1-9] [0-9]{0,15})\n"
        "ws ::= | \" \" | \"\\n\" [ \\t]{0,12}\n"  // indentation up to 12, so values end
        // RFC 3339 full-date with the days each month has; February stops at 28
        // (29 needs the leap-year rule, which a grammar spells out only at length)
        "date ::= year \"-\" ((\"0\" [13578] | \"1\" [02]) \"-\" (\"0\" [1-9] | [12] [0-9] | \"3\" "
        "[01]) | "
        "(\"0\" [469] | \"11\") \"-\" (\"0\" [1-9] | [12] [0-9] | \"30\") | "
        "\"02-\" (\"0\" [1-9] | \"1\" [0-9] | \"2\" [0-8]))\n"
        "year ::= [1-9] [0-9]{3} | \"0\" ([1-9] [0-9]{2} | \"0\" ([1-9] [0-9] | \"0\" [1-9]))\n"
        "time ::= ([01] [0-9] | \"2\" [0-3]) \":\" [0-5] [0-9] \":\" [0-5] [0-9] (\".\" "
        "[0-9]{1,6})? "
        "(\"Z\" | [+-] ([01] [0-9] | \"2\" [0-3]) \":\" [0-5] [0-9])\n"
        "uuid ::= hex{8} \"-\" hex{4} \"-\" hex{4} \"-\" hex{4} \"-\" hex{12}\n"
        "hex ::= [0-9a-fA-F]\n");
}

/* The schema's rules (without root and primitives) into out; the start rule's
 * number into *out_rule. */
static int schema_rules(json_t *schema, struct buf *out, int *out_rule, char *msg,
                        size_t msg_size) {
    if (msg && msg_size) msg[0] = '\0';
    struct gen g = {.root = schema, .out = out, .msg = msg, .msg_size = msg_size};
    size_t len0 = out->len;
    int rule = new_rule(&g);
    int err = gen_rule(&g, schema, "#", 0, rule);
    for (int i = 0; i < g.n_refs; i++) free(g.refs[i].ref);
    free(g.refs);
    if (err) out->len = len0;
    *out_rule = rule;
    return err;
}

int json_schema_to_gbnf(json_t *schema, struct buf *out, char *msg, size_t msg_size) {
    int rule = 0;
    int err = schema_rules(schema, out, &rule, msg, msg_size);
    if (err) return err;
    appendf(out, "root ::= s%d\n", rule);
    primitives(out);
    return 0;
}

static bool is_name_char(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           c == '_' || c == '-';
}

/* Whether text[0..n) is a rule name of ours: sN or kv-sN. */
static bool is_own_rule(const char *t, size_t n) {
    if (n > 3 && memcmp(t, "kv-", 3) == 0) {
        t += 3;
        n -= 3;
    }
    if (n < 2 || t[0] != 's') return false;
    for (size_t i = 1; i < n; i++) {
        if (t[i] < '0' || t[i] > '9') return false;
    }
    return true;
}

int json_schema_to_gbnf_rule(json_t *schema, const char *name, struct buf *out, char *msg,
                             size_t msg_size) {
    struct buf rules = {0};
    int rule = 0;
    int err = schema_rules(schema, &rules, &rule, msg, msg_size);
    if (err) {
        buf_free(&rules);
        return err;
    }
    // Copy with every sN / kv-sN renamed name-sN / kv-name-sN: names outside
    // literals and classes only (the generator writes no comments).
    const char *t = rules.data ? rules.data : "";
    size_t n = rules.len, i = 0;
    while (i < n) {
        char c = t[i];
        if (c == '"' || c == '[') {
            char close = c == '"' ? '"' : ']';
            size_t j = i + 1;
            while (j < n && t[j] != close) j += t[j] == '\\' ? 2 : 1;
            if (j > n) j = n - 1;
            buf_append(out, t + i, j + 1 - i);
            i = j + 1;
        } else if (is_name_char(c)) {
            size_t j = i;
            while (j < n && is_name_char(t[j])) j++;
            if (is_own_rule(t + i, j - i)) {
                bool kv = t[i] == 'k';
                if (kv) buf_append_str(out, "kv-");
                buf_append_str(out, name);
                buf_append_char(out, '-');
                buf_append(out, t + i + (kv ? 3 : 0), j - i - (kv ? 3 : 0));
            } else {
                buf_append(out, t + i, j - i);
            }
            i = j;
        } else {
            buf_append_char(out, c);
            i++;
        }
    }
    buf_free(&rules);
    appendf(out, "%s ::= %s-s%d\n", name, name, rule);
    return 0;
}

void json_schema_primitives_gbnf(struct buf *out) {
    primitives(out);
}

void json_schema_object_gbnf(struct buf *out) {
    buf_append_str(out, "root ::= object\n");
    primitives(out);
}
