/*
 * tokenizer.h - text <-> token ids for a model, from its GGUF metadata
 * (tokenizer.ggml.*): SentencePiece-style BPE (model "llama", engine/spm.c) and
 * byte-level BPE (model "gpt2", engine/bpe.c, pre-tokenizers in engine/pretok.c).
 *
 * A tokenizer is immutable after tokenizer_load(): any thread may encode and
 * decode with it at the same time. Incremental decoding state lives in a
 * caller-owned struct tokenizer_stream, one per sequence.
 */
#ifndef LLMSERVE_TOKENIZER_H
#define LLMSERVE_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/base/buf.h"

struct gguf_file;
struct tokenizer;

/* Token types of tokenizer.ggml.token_type (llama.cpp's numbering). */
enum tokenizer_token_type {
    TOKENIZER_TYPE_UNDEFINED = 0,
    TOKENIZER_TYPE_NORMAL = 1,
    TOKENIZER_TYPE_UNKNOWN = 2,
    TOKENIZER_TYPE_CONTROL = 3,
    TOKENIZER_TYPE_USER_DEFINED = 4,
    TOKENIZER_TYPE_UNUSED = 5,
    TOKENIZER_TYPE_BYTE = 6,
};

/* Builds the tokenizer from f's metadata. *out is owned by the caller
 * (tokenizer_free()); it copies what it needs, so f may be closed afterwards.
 * Returns 0, ERR_FORMAT (missing/mistyped keys, inconsistent arrays; logged),
 * ERR_UNSUPPORTED (unknown tokenizer.ggml.model or tokenizer.ggml.pre; logged,
 * naming the value) or ERR_NOMEM. */
int tokenizer_load(const struct gguf_file *f, struct tokenizer **out);

/* NULL-safe. */
void tokenizer_free(struct tokenizer *t);

int32_t tokenizer_n_vocab(const struct tokenizer *t);

/* Special token ids, -1 when the model has none. */
int32_t tokenizer_bos(const struct tokenizer *t);
int32_t tokenizer_eos(const struct tokenizer *t);
int32_t tokenizer_eot(const struct tokenizer *t);
int32_t tokenizer_pad(const struct tokenizer *t);
int32_t tokenizer_unk(const struct tokenizer *t);

/* Whether encoding with add_special adds BOS / EOS (tokenizer.ggml.add_bos_token /
 * add_eos_token, with llama.cpp's defaults per model when absent). */
bool tokenizer_adds_bos(const struct tokenizer *t);
bool tokenizer_adds_eos(const struct tokenizer *t);

/* True for tokens that end generation: eos, eot, and the other end-of-turn
 * control tokens the vocabulary marks (e.g. <|im_end|>, <|eot_id|>, <end_of_turn>). */
bool tokenizer_is_eog(const struct tokenizer *t, int32_t id);

/* The token's type; TOKENIZER_TYPE_UNDEFINED for ids out of range. */
enum tokenizer_token_type tokenizer_token_type(const struct tokenizer *t, int32_t id);

/* The token's vocabulary string (e.g. "▁the", "<0x0A>", "Ġthe"), NUL-terminated,
 * borrowed for the tokenizer's life; NULL for ids out of range. */
const char *tokenizer_token_text(const struct tokenizer *t, int32_t id);

/* The id of the token whose vocabulary string is exactly s, or -1. */
int32_t tokenizer_find(const struct tokenizer *t, const char *s, size_t len);

/* The token's tokenizer.ggml.scores entry (0 when the file has none or id is
 * out of range). SPM merges the pair with the highest score first. */
float tokenizer_token_score(const struct tokenizer *t, int32_t id);

/* Encodes len bytes of text. add_special: add BOS/EOS as the model asks.
 * parse_special: text that spells a control token (e.g. "<|im_start|>")
 * becomes that token; otherwise it is tokenized as plain text. User-defined
 * tokens (TOKENIZER_TYPE_USER_DEFINED: the added, non-special tokens of HF
 * vocabularies, e.g. deepseek-coder's "ü") are vocabulary text and match
 * whatever parse_special says, as in HF tokenizers and llama.cpp (the
 * upstream test vectors depend on it).
 * Special strings are found left to right, the longest one first where several
 * start at the same byte. SPM adds its dummy "▁" prefix (unless
 * tokenizer.ggml.add_space_prefix is false) at the start of the text and after
 * every special token, as llama.cpp does; empty text adds no prefix.
 * On success *out_ids (owned by the caller; free()) holds *out_n ids.
 * Returns 0, ERR_INVAL (text is not valid UTF-8 or contains a NUL byte) or
 * ERR_NOMEM. Empty text gives just the special tokens. [any thread] */
int tokenizer_encode(const struct tokenizer *t, const char *text, size_t len, bool add_special,
                     bool parse_special, int32_t **out_ids, int32_t *out_n);

/* Appends the bytes token id stands for to out: SPM "▁" -> " ", "<0xNN>" ->
 * that byte, byte-level BPE's byte map undone. Control tokens append their
 * text only when special is true. The bytes may be an incomplete UTF-8
 * sequence (byte tokens): use a tokenizer_stream to stream text. */
void tokenizer_token_to_piece(const struct tokenizer *t, int32_t id, bool special,
                              struct buf *out);

/* Decodes ids into out (appended). skip_special: drop control tokens.
 * Invalid or incomplete UTF-8 in the bytes becomes U+FFFD, so the result is
 * always valid UTF-8. Equals the concatenation of a tokenizer_stream fed the
 * same ids and then flushed.
 * Leading space: ids are taken as the start of a text. For SPM vocabularies
 * with the dummy prefix, the first non-control token loses one leading space
 * (the prefix encode added), as HF's and sentencepiece's decoders do, so
 * decode(encode(s)) == s. Control tokens (BOS) before it do not count. To
 * decode ids that continue earlier text (generated tokens after a prompt), use
 * a stream set up with tokenizer_stream_init_after(). Byte-level BPE
 * strips nothing and does no clean-up of spaces. Ids out of range are
 * skipped. */
void tokenizer_decode(const struct tokenizer *t, const int32_t *ids, int32_t n, bool skip_special,
                      struct buf *out);

/* Incremental decoding for streaming: text appended by feed() is always valid
 * UTF-8; bytes of a character split across tokens are held back until the
 * character is complete. One per sequence, owned by the caller; zero it or call
 * tokenizer_stream_init(). */
struct tokenizer_stream {
    uint8_t pending[8];  // bytes of an incomplete UTF-8 sequence
    int32_t n_pending;
    int32_t n_fed;       // tokens fed so far
    bool skip_special;
    bool has_text;       // a non-control token was fed: no leading space is stripped any more
};

void tokenizer_stream_init(struct tokenizer_stream *s, bool skip_special);
/* As tokenizer_stream_init() for ids that continue prompt [n_prompt] (e.g.
 * generated tokens after a prompt): the stream's text is then exactly
 * decode(prompt + ids) with decode(prompt)'s bytes removed. A prompt that
 * gives text (any non-control token) has used the SPM dummy prefix, so no
 * leading space is stripped; a prompt of only control tokens (BOS) or none
 * leaves the first text token to lose it, as decode would. */
void tokenizer_stream_init_after(struct tokenizer_stream *s, const struct tokenizer *t,
                                 const int32_t *prompt, int32_t n_prompt, bool skip_special);
void tokenizer_stream_feed(const struct tokenizer *t, struct tokenizer_stream *s, int32_t id,
                           struct buf *out);
/* Appends the raw bytes token id adds to the stream's text (maybe an
 * incomplete UTF-8 sequence, never held back: for log-probability token
 * strings), control tokens' text included whatever skip_special says, and
 * advances s past the leading-space rule as feed() would. s's pending bytes
 * are untouched: use a separate stream from the one that feeds the text. */
void tokenizer_stream_piece(const struct tokenizer *t, struct tokenizer_stream *s, int32_t id,
                            struct buf *out);
/* Emits what is still held back (as U+FFFD where it is not valid UTF-8). */
void tokenizer_stream_flush(const struct tokenizer *t, struct tokenizer_stream *s,
                            struct buf *out);

/* True when len bytes are valid UTF-8 (no overlongs, no surrogates, <= U+10FFFF). */
bool tokenizer_utf8_valid(const char *s, size_t len);

#endif
