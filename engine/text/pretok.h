/*
 * pretok.h - pre-tokenizers of byte-level BPE vocabularies: the split
 * regexes named by tokenizer.ggml.pre, run with PCRE2 (UTF + UCP, JIT when
 * available). Private to engine/ (tokenizer.c, bpe.c and the tests).
 *
 * A pre-tokenizer is a list of 1..PRETOK_MAX_PATTERNS regexes applied in
 * sequence, each one splitting every piece the previous one produced, with the
 * text between matches kept as pieces of its own (HF's Split "Isolated").
 * Owns its compiled patterns; immutable after pretok_create(), so any thread
 * may split with it at the same time (match state is per call).
 * The only file that includes pcre2.h is pretok.c (STYLE 2.10).
 */
#ifndef LLMSERVE_PRETOK_H
#define LLMSERVE_PRETOK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define PRETOK_MAX_PATTERNS 8

/* One piece of the text: bytes [start, start + len). */
struct pretok_span {
    uint32_t start;
    uint32_t len;
};

/* Per tokenizer.ggml.pre value, what llama.cpp's loader also sets. */
struct pretok_info {
    bool ignore_merges;  // a word that is itself a token is emitted whole (llama3, tekken)
    bool adds_bos;       // default for add_bos when tokenizer.ggml.add_bos_token is absent
};

struct pretok;

/* Compiles the patterns of pre-tokenizer `name` (name_len bytes, need not be
 * NUL-terminated; "default" when name is NULL). On success *out is owned by the
 * caller (pretok_free()) and *info, if not NULL, is filled. Returns 0,
 * ERR_UNSUPPORTED (unknown name; logged, naming it) or ERR_NOMEM. */
int pretok_create(const char *name, size_t name_len, struct pretok **out, struct pretok_info *info);

/* NULL-safe. */
void pretok_free(struct pretok *p);

/* The canonical pattern-set name the value maps to (e.g. "llama3" for
 * "llama-bpe"), or NULL when unknown. Static string. */
const char *pretok_family(const char *name, size_t name_len);

/* Splits len bytes of valid UTF-8 text into pieces written to spans
 * (capacity cap, which must be >= len: pieces are never empty) in text order;
 * the pieces cover the text exactly. *n_spans receives the count.
 * scratch must hold cap spans too. Returns 0, ERR_NOMEM or ERR_INVAL (the
 * regex engine failed, e.g. its match limit; logged). [any thread] */
int pretok_split(const struct pretok *p, const char *text, size_t len, struct pretok_span *spans,
                 struct pretok_span *scratch, size_t cap, size_t *n_spans);

#endif
