/*
 * bpe.h - byte-level BPE (tokenizer.ggml.model = "gpt2"): GPT-2's
 * byte <-> unicode map, merge ranks from tokenizer.ggml.merges, and the
 * pre-tokenizer of tokenizer.ggml.pre (engine/pretok.h). Private to engine/.
 *
 * A struct bpe is built once by tokenizer_load() and owned by the tokenizer;
 * immutable afterwards, so any thread may encode with it.
 */
#ifndef LLMSERVE_BPE_H
#define LLMSERVE_BPE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/base/buf.h"

struct gguf_kv;
struct vocab;
struct bpe;

/* Builds the merge table from merges (a STRING array of "left right" entries,
 * rank = index) over vocabulary v, and the pre-tokenizer named pre
 * (pre_len bytes; NULL for "default"). v must already answer
 * vocab_find(); it is not retained. *adds_bos receives the
 * pre-tokenizer's default for add_bos. On success *out is owned by the
 * caller (bpe_free()). Returns 0, ERR_FORMAT (an entry without a space, or one
 * whose left, right or merged text is not a token; logged with its index),
 * ERR_UNSUPPORTED (unknown pre; logged) or ERR_NOMEM. */
int bpe_create(const struct vocab *v, const struct gguf_kv *merges, const char *pre,
               size_t pre_len, struct bpe **out, bool *adds_bos);

/* NULL-safe. */
void bpe_free(struct bpe *b);

/* Upper bound on the ids bpe_encode() writes for len bytes: one per byte. */
static inline size_t bpe_max_tokens(size_t len) { return len; }

/* Encodes len bytes of valid UTF-8 text with no special tokens in it:
 * pre-tokenize, map every byte through GPT-2's byte map, merge by rank
 * (lowest first, ties leftmost) within each piece. Appends the ids to
 * out[*n_out ...], which must have room for bpe_max_tokens(len) more.
 * Returns 0, ERR_NOMEM or ERR_INVAL (the split regex failed). [any thread] */
int bpe_encode(const struct vocab *v, const struct bpe *b, const char *text, size_t len,
               int32_t *out, size_t *n_out);

/* Appends the bytes a byte-level token text stands for (GPT-2's map undone;
 * characters outside the map are copied as they are). */
void bpe_text_to_bytes(const char *s, size_t len, struct buf *out);

#endif
