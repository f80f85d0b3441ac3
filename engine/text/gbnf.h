/*
 * engine/text/gbnf.h - GBNF grammars (the format llama.cpp users write) parsed and
 * compiled into a byte-level pushdown program that engine/text/grammar.h runs.
 *
 * The language: `name ::= body` rules (names [A-Za-z0-9_-]+, `root` is the
 * start), alternation `|`, grouping `( )`, repetition `* + ? {m} {m,} {m,n}`,
 * literals "..." and character classes [...] / [^...] with ranges and the
 * escapes \n \r \t \\ \" \[ \] \- \xHH \uHHHH \UHHHHHHHH, `.` (any
 * character), `#` comments. Newlines end a rule's body except inside
 * parentheses or after `::=` and `|`. Literals and classes are UTF-8: a class
 * over code points is compiled into alternatives of byte sequences (RFC 3629
 * encodings, surrogates excluded), so the program only ever matches bytes and
 * a character split across two tokens needs nothing special.
 *
 * The program:
 *   items  [n_items]  one int32 per item: op in the low 2 bits, argument above
 *                     GBNF_OP_END   end of an alternative
 *                     GBNF_OP_BYTE  one byte out of set `arg` (sets [n_sets])
 *                     GBNF_OP_RULE  rule `arg`
 *   rule r's alternatives start at items[alts[rule_alt0[r] ... rule_alt0[r+1])]
 * Repetitions are expanded into helper rules (x* is R ::= x R | ε), so the
 * program has only sequences, alternatives and rule references. When x can
 * match the empty string (("" | "a")*, ("a"? "b"?)+), R's x is a helper
 * that matches x's non-empty strings (the same language, and R no longer
 * goes round without consuming). (llama.cpp refuses these as left recursion.)
 *
 * Checked at compile time, each an ERR_INVAL with a message naming the place:
 * syntax (unbalanced brackets, quotes, bad escapes), an undefined or twice
 * defined rule, a missing root, left recursion (a rule that can reach itself
 * without consuming a byte; a repetition of what can match nothing is not
 * that, but one that recurs through its body, (root | "")*, still is), repetition counts over GBNF_REPEAT_MAX, nesting
 * deeper than GBNF_DEPTH_MAX and programs over GBNF_ITEMS_MAX items.
 *
 * Threads: a struct gbnf is immutable after gbnf_compile() and reference
 * counted (atomically): any thread may retain, release and read it.
 */
#ifndef ENGINE_GBNF_H
#define ENGINE_GBNF_H

#include <stddef.h>
#include <stdint.h>

#define GBNF_REPEAT_MAX 1000       // largest m or n in x{m,n}
#define GBNF_DEPTH_MAX 64          // deepest nesting of ( ) groups
#define GBNF_ITEMS_MAX (1 << 20)   // largest compiled program
#define GBNF_TEXT_MAX (1 << 20)    // longest grammar text, bytes

enum gbnf_op {
    GBNF_OP_END = 0,
    GBNF_OP_BYTE = 1,
    GBNF_OP_RULE = 2,
};

static inline enum gbnf_op gbnf_item_op(int32_t item) { return (enum gbnf_op)(item & 3); }
static inline int32_t gbnf_item_arg(int32_t item) { return item >> 2; }

/* The compiled program; every array is owned by the struct gbnf. Read-only. */
struct gbnf {
    const int32_t *items;      // [n_items]
    int32_t n_items;
    const uint64_t (*sets)[4]; // [n_sets] 256-bit byte sets, bit b of word b / 64
    int32_t n_sets;
    const int32_t *alts;       // [n_alts] start of each alternative in items
    int32_t n_alts;
    const int32_t *rule_alt0;  // [n_rules + 1] first alternative of each rule
    int32_t n_rules;
    int32_t root;              // the rule named root
};

/* Compiles len bytes of GBNF text. On success *out is owned by the caller
 * (one reference; gbnf_release()). Returns 0, ERR_INVAL with a message in msg
 * (msg_size bytes, e.g. "line 3: unknown rule 'valu'") or ERR_NOMEM. The
 * text is client input: nothing in it can crash the parser. [any thread] */
int gbnf_compile(const char *text, size_t len, struct gbnf **out, char *msg, size_t msg_size);

/* Adds a reference; returns g. [any thread] */
struct gbnf *gbnf_retain(struct gbnf *g);

/* Drops a reference, freeing g with the last one. NULL-safe. [any thread] */
void gbnf_release(struct gbnf *g);

/* True when byte b is in set i. */
static inline int gbnf_set_has(const struct gbnf *g, int32_t i, uint8_t b) {
    return (int)((g->sets[i][b >> 6] >> (b & 63)) & 1);
}

#endif // ENGINE_GBNF_H
