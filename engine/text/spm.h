/*
 * spm.h - SentencePiece-style BPE (tokenizer.ggml.model = "llama"): pieces are
 * merged by vocabulary score, characters without a piece fall back to
 * <0xNN> byte tokens. Private to engine/ (tokenizer.c and the tests).
 *
 * Stateless: everything it needs comes from the tokenizer's vocabulary through
 * engine/text/vocab.h. [any thread]
 */
#ifndef LLMSERVE_SPM_H
#define LLMSERVE_SPM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct vocab;

/* Upper bound on the ids spm_encode() writes for len bytes of text: every
 * escaped byte (a space becomes 3 bytes of U+2581) gives at most one byte
 * token, plus the prefix. */
static inline size_t spm_max_tokens(size_t len) { return 3 * len + 3; }

/* Encodes len bytes of valid UTF-8 text with no special tokens in it:
 * spaces become U+2581, add_prefix puts one U+2581 in front, then the adjacent
 * pair whose concatenation is a piece with the highest score is merged
 * (ties: leftmost first) until none is left (llama.cpp's and sentencepiece's
 * BPE). Symbols that are no piece become their bytes' <0xNN> tokens, or unk.
 * Appends the ids to out[*n_out ...], which must have room for
 * spm_max_tokens(len) more. Returns 0 or ERR_NOMEM. [any thread] */
int spm_encode(const struct vocab *v, const char *text, size_t len, bool add_prefix,
               int32_t *out, size_t *n_out);

#endif
