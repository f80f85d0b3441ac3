/*
 * engine/text/grammar.h - grammar-constrained decoding: a per-sequence matcher
 * over a compiled GBNF program (engine/text/gbnf.h) that yields, at each step, the
 * set of tokens whose bytes keep the output a prefix of the grammar's
 * language, and advances by the sampled token.
 *
 * How: the matcher's state is a set of parse stacks (a pushdown automaton's
 * configurations). Stacks are hash-consed into nodes (position, parent) and
 * sets of stacks into numbered states, so the automaton is determinised
 * lazily: each state has a 256-entry byte transition table filled on first
 * use, and a cached token mask. The mask of a state is one depth-first walk
 * of the vocabulary's byte trie (struct grammar_vocab, built once per
 * tokenizer) along those transitions, pruning every subtree whose prefix the
 * grammar rejects; a JSON grammar revisits few distinct states, so most steps
 * are a cache hit and the rest a walk of table look-ups. Tokens spanning
 * several grammar elements and characters split across tokens need nothing
 * special: everything is bytes.
 *
 * End of generation: the end-of-generation tokens are allowed exactly when the
 * output so far is a whole sentence of the grammar; a state whose only stack
 * is empty can take nothing more, and grammar_accept_token() says DONE.
 *
 * Threads: a grammar_vocab is immutable after creation (any thread may read
 * it). A struct grammar belongs to the thread that samples its sequence.
 */
#ifndef ENGINE_GRAMMAR_H
#define ENGINE_GRAMMAR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct gbnf;
struct tokenizer;
struct grammar_vocab;
struct grammar;

/* Words of a token mask: bit i of word i / 64 is token i. */
static inline size_t grammar_mask_words(int32_t n_vocab) { return ((size_t)n_vocab + 63) / 64; }

/* The byte trie of every token's piece (tokenizer_token_to_piece without
 * special text; control tokens and empty pieces are never allowed under a
 * grammar) and the end-of-generation ids. Owned by the caller
 * (grammar_vocab_free()); NULL when out of memory. [any thread] */
struct grammar_vocab *grammar_vocab_create(const struct tokenizer *t);
void grammar_vocab_free(struct grammar_vocab *v);  // NULL-safe
int32_t grammar_vocab_n_vocab(const struct grammar_vocab *v);
int32_t grammar_vocab_n_nodes(const struct grammar_vocab *v);  // trie nodes, for benchmarks

/* A matcher at the start of g's root rule. Retains g until grammar_free().
 * Owned by the caller; NULL when out of memory. */
struct grammar *grammar_create(struct gbnf *g);
void grammar_free(struct grammar *gm);  // NULL-safe

/* Writes the allowed tokens into allow [grammar_mask_words(n_vocab)] and
 * returns how many there are (0: a dead end, no token continues the grammar;
 * the caller ends the sequence). Caches per state, so calling it again before
 * the next accept is cheap. The work of one call is bounded (2^18 stacks and
 * configurations visited: tens of ms): for a grammar so ambiguous that the
 * bound is reached, the tokens the walk has not reached by then are left out
 * (grammar_n_masks_cut() counts such masks), so every allowed token still
 * continues the grammar. [the sequence's thread] */
int32_t grammar_mask(struct grammar *gm, const struct grammar_vocab *v, uint64_t *allow);

enum grammar_step {
    GRAMMAR_STEP_OK,      // accepted; more may follow
    GRAMMAR_STEP_DONE,    // accepted, and the grammar is complete: nothing can follow
    GRAMMAR_STEP_REJECT,  // the token does not continue the grammar; state unchanged
};

/* Advances by token's bytes. An end-of-generation token is accepted (DONE)
 * exactly when the grammar is complete or may end here. [the sequence's thread] */
enum grammar_step grammar_accept_token(struct grammar *gm, const struct grammar_vocab *v,
                                       int32_t token);

/* Advances by len raw bytes (a trigger's text, tests, tools): OK, DONE or REJECT as
 * above; on REJECT the state is unchanged. */
enum grammar_step grammar_accept_bytes(struct grammar *gm, const void *bytes, size_t len);

/* A trial (a speculative draft checked against the grammar): grammar_mark()
 * returns the current state, the accepts that follow advance as usual, and
 * grammar_rewind(gm, mark) goes back to the marked state. While a mark is
 * held the matcher does not compact (the mark stays a valid state; the
 * tables may pass their caps by what the trial's tokens add, at most a
 * closure's bound per byte), and one mark at a time. [the sequence's thread] */
int32_t grammar_mark(struct grammar *gm);
void grammar_rewind(struct grammar *gm, int32_t mark);

/* True when byte b may come next; the state is unchanged. */
bool grammar_allows_byte(struct grammar *gm, uint8_t b);

/* True when the output so far is a whole sentence of the grammar. */
bool grammar_is_accepting(const struct grammar *gm);

/* Lazily built automaton size, for tests and benchmarks: states, and stack
 * frames (nodes) of every state kept. */
int32_t grammar_n_states(const struct grammar *gm);
int32_t grammar_n_nodes(const struct grammar *gm);

/* Times the matcher emptied its tables and kept only the current stacks
 * (between two accepts, when the tables pass their caps), for tests. */
int64_t grammar_n_compactions(const struct grammar *gm);

/* Masks of this matcher cut short by grammar_mask()'s bound of work. */
int64_t grammar_n_masks_cut(const struct grammar *gm);

/* Whether the last grammar_mask() was cut short by its bound of work (computed
 * then or, cut short before, from the cache): it may leave out tokens that
 * continue the grammar, so grammar_accept_token() may accept a token it did
 * not allow. An uncut mask allows exactly the tokens that are accepted. */
bool grammar_is_mask_cut(const struct grammar *gm);

/* Whether the last grammar_mask() allowed nothing because it was cut short
 * (not a dead end: the grammar was too ambiguous to follow; the caller ends
 * the sequence with an error rather than as complete). It is also true once
 * the current stacks alone hold more than 2^17 frames (an ambiguous grammar
 * whose every stack grows with each byte): from then on the matcher accepts
 * nothing, allows no byte, and every mask is empty and cut. */
bool grammar_is_cut_dead(const struct grammar *gm);

#endif // ENGINE_GRAMMAR_H
