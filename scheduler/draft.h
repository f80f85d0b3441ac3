/*
 * scheduler/draft.h - draft tokens for speculative decoding by prompt lookup:
 * a sequence that copies from its own text (a summary quoting its source, an
 * edit of a given file, code that repeats a name) has its next tokens
 * already in its tokens. The last few tokens are looked up earlier in the
 * sequence; the tokens that followed there are the draft, which one
 * batched forward pass then verifies (scheduler.c). Pure functions.
 */
#ifndef SCHEDULER_DRAFT_H
#define SCHEDULER_DRAFT_H

#include <stdint.h>

/* The n-gram sizes tried, longest first. One token matches too often to be
 * worth verifying. */
#define DRAFT_NGRAM_MAX 3
#define DRAFT_NGRAM_MIN 2

/* Writes to out up to max_n tokens that followed the most recent earlier
 * occurrence of the last g tokens of tokens [n] (g from DRAFT_NGRAM_MAX down
 * to DRAFT_NGRAM_MIN, the first g that occurs); returns how many (0: no
 * occurrence, or max_n <= 0). */
int32_t draft_lookup(const int32_t *tokens, int32_t n, int32_t max_n, int32_t *out);

#endif // SCHEDULER_DRAFT_H
