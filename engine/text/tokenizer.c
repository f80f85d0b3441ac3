/*
 * tokenizer.c - the vocabulary and special tokens from GGUF metadata, the
 * encode dispatch (special-token partition, then spm.c or bpe.c per plain
 * fragment) and UTF-8-safe incremental decoding.
 *
 * Owns copies of every token text and of its decoded bytes (the "piece"),
 * computed once at load so decoding is a table lookup, plus a hash index from
 * text to id. Immutable after tokenizer_load(): any thread may use it.
 * Invariant: every id stored in the tokenizer (bos, eos, specials, ...) is
 * < n_vocab; ids from callers are checked on every query.
 */
#include "engine/text/tokenizer.h"

#include <stdlib.h>
#include <string.h>

#include "engine/base/alloc.h"
#include "engine/base/err.h"
#include "engine/text/bpe.h"
#include "engine/format/gguf.h"
#include "engine/text/spm.h"
#include "engine/text/vocab.h"
#define LOG_TAG "tokenizer"
#include "engine/base/log.h"

#define TOKENIZER_MAX_TEXT_BYTES (1u << 30)  // longer input is refused (ERR_INVAL)

enum tokenizer_model {
    TOKENIZER_MODEL_SPM,  // "llama"
    TOKENIZER_MODEL_BPE,  // "gpt2"
};

struct tokenizer {
    enum tokenizer_model model;
    int32_t n_vocab;
    char *texts;              // owned: every token text, each NUL-terminated
    uint32_t *text_off;       // [n_vocab] offsets into texts
    uint32_t *text_len;       // [n_vocab] bytes, without the NUL
    char *pieces;             // owned: decoded bytes of every token, back to back
    uint32_t *piece_off;      // [n_vocab]
    uint32_t *piece_len;      // [n_vocab]
    float *scores;            // owned [n_vocab]; zeros when the file has none
    uint8_t *types;           // owned [n_vocab] enum tokenizer_token_type
    uint8_t *is_eog;          // owned [n_vocab]
    int32_t *index;           // owned: open-addressed text -> id table, -1 empty, [index_mask + 1]
    uint64_t index_mask;
    int32_t *specials;        // owned: ids parse_special matches, by first byte, then longest first
    int32_t n_specials;
    int32_t special_first[257];  // specials[special_first[c] .. special_first[c+1]) start with byte c
    int32_t bos, eos, eot, pad, unk;  // -1 when absent
    bool add_bos;
    bool add_eos;
    bool add_space_prefix;    // SPM: dummy "▁" before the text and after special tokens
    struct bpe *bpe;          // owned; BPE only
};

/* ---- vocabulary index ---------------------------------------------------- */

/* The view of the vocabulary spm.c and bpe.c read (engine/text/vocab.h). */
static struct vocab vocab_of(const struct tokenizer *t) {
    return (struct vocab){t->n_vocab, t->texts, t->text_off, t->text_len, t->scores,
                          t->index, t->index_mask, t->unk};
}

int32_t tokenizer_find(const struct tokenizer *t, const char *s, size_t len) {
    const struct vocab v = vocab_of(t);
    return vocab_find(&v, s, len);
}

/* ---- queries -------------------------------------------------------------- */

int32_t tokenizer_n_vocab(const struct tokenizer *t) { return t->n_vocab; }
int32_t tokenizer_bos(const struct tokenizer *t) { return t->bos; }
int32_t tokenizer_eos(const struct tokenizer *t) { return t->eos; }
int32_t tokenizer_eot(const struct tokenizer *t) { return t->eot; }
int32_t tokenizer_pad(const struct tokenizer *t) { return t->pad; }
int32_t tokenizer_unk(const struct tokenizer *t) { return t->unk; }
bool tokenizer_adds_bos(const struct tokenizer *t) { return t->add_bos && t->bos >= 0; }
bool tokenizer_adds_eos(const struct tokenizer *t) { return t->add_eos && t->eos >= 0; }

static bool in_range(const struct tokenizer *t, int32_t id) { return id >= 0 && id < t->n_vocab; }

bool tokenizer_is_eog(const struct tokenizer *t, int32_t id) {
    return in_range(t, id) && t->is_eog[id];
}

enum tokenizer_token_type tokenizer_token_type(const struct tokenizer *t, int32_t id) {
    return in_range(t, id) ? (enum tokenizer_token_type)t->types[id] : TOKENIZER_TYPE_UNDEFINED;
}

const char *tokenizer_token_text(const struct tokenizer *t, int32_t id) {
    return in_range(t, id) ? t->texts + t->text_off[id] : NULL;
}

float tokenizer_token_score(const struct tokenizer *t, int32_t id) {
    return in_range(t, id) ? t->scores[id] : 0.0f;
}

/* Tokens whose text is only rendered on request (decode with special). */
static bool is_control_like(uint8_t type) {
    return type == TOKENIZER_TYPE_CONTROL || type == TOKENIZER_TYPE_UNKNOWN ||
           type == TOKENIZER_TYPE_UNUSED;
}

/* ---- loading -------------------------------------------------------------- */

void tokenizer_free(struct tokenizer *t) {
    if (!t) return;
    free(t->texts);
    free(t->text_off);
    free(t->text_len);
    free(t->pieces);
    free(t->piece_off);
    free(t->piece_len);
    free(t->scores);
    free(t->types);
    free(t->is_eog);
    free(t->index);
    free(t->specials);
    bpe_free(t->bpe);
    free(t);
}

/* Reads an optional token-id key into *out (preset with the default). The
 * converters' "none" (-1 or 0xFFFFFFFF) gives -1; any other id must be in range. */
static int read_id(const struct gguf_file *f, const char *key, int32_t n_vocab, int32_t *out) {
    int64_t v = 0;
    int rc = gguf_get_i64(f, key, &v);
    if (rc == ERR_NOTFOUND) return 0;
    if (rc) {
        LOG_ERROR("%s: %s has a non-integer type", gguf_name(f), key);
        return ERR_FORMAT;
    }
    if (v == -1 || v == 0xFFFFFFFFLL) {
        *out = -1;
        return 0;
    }
    if (v < 0 || v >= n_vocab) {
        LOG_ERROR("%s: %s = %lld is out of range (n_vocab %d)", gguf_name(f), key, (long long)v,
                  n_vocab);
        return ERR_FORMAT;
    }
    *out = (int32_t)v;
    return 0;
}

static int read_bool(const struct gguf_file *f, const char *key, bool *out) {
    int rc = gguf_get_bool(f, key, out);
    if (rc == ERR_NOTFOUND) return 0;
    if (rc) LOG_ERROR("%s: %s is not a bool", gguf_name(f), key);
    return rc ? ERR_FORMAT : 0;
}

static int build_index(struct tokenizer *t) {
    uint64_t slots = 16;
    while (slots < 2 * (uint64_t)t->n_vocab) slots *= 2;
    t->index = malloc(slots * sizeof(*t->index));
    if (!t->index) return ERR_NOMEM;
    memset(t->index, 0xFF, slots * sizeof(*t->index));  // -1
    t->index_mask = slots - 1;
    for (int32_t id = 0; id < t->n_vocab; id++) {
        const char *s = t->texts + t->text_off[id];
        uint64_t i = vocab_hash(s, t->text_len[id]) & t->index_mask;
        for (;; i = (i + 1) & t->index_mask) {
            int32_t o = t->index[i];
            if (o < 0) {
                t->index[i] = id;
                break;
            }
            if (t->text_len[o] == t->text_len[id] && memcmp(t->texts + t->text_off[o], s,
                                                            t->text_len[id]) == 0)
                break;  // duplicate text: the lowest id keeps it
        }
    }
    return 0;
}

/* Parses "<0xNN>" into *byte. */
static bool parse_byte_token(const char *s, size_t len, unsigned char *byte) {
    if (len != 6 || memcmp(s, "<0x", 3) != 0 || s[5] != '>') return false;
    unsigned v = 0;
    for (int i = 3; i < 5; i++) {
        char c = s[i];
        unsigned d = (c >= '0' && c <= '9')   ? (unsigned)(c - '0')
                     : (c >= 'A' && c <= 'F') ? (unsigned)(c - 'A' + 10)
                     : (c >= 'a' && c <= 'f') ? (unsigned)(c - 'a' + 10)
                                              : 16u;
        if (d > 15) return false;
        v = v * 16 + d;
    }
    *byte = (unsigned char)v;
    return true;
}

/* The bytes each token stands for, in one blob. */
static int build_pieces(struct tokenizer *t) {
    struct buf b = {0};
    t->piece_off = malloc((size_t)t->n_vocab * sizeof(uint32_t));
    t->piece_len = malloc((size_t)t->n_vocab * sizeof(uint32_t));
    if (!t->piece_off || !t->piece_len) return ERR_NOMEM;
    for (int32_t id = 0; id < t->n_vocab; id++) {
        const char *s = t->texts + t->text_off[id];
        size_t len = t->text_len[id];
        size_t start = b.len;
        unsigned char byte = 0;
        uint8_t type = t->types[id];
        if (type == TOKENIZER_TYPE_BYTE && parse_byte_token(s, len, &byte)) {
            buf_append_char(&b, (char)byte);
        } else if (is_control_like(type)) {
            buf_append(&b, s, len);
        } else if (t->model == TOKENIZER_MODEL_SPM) {
            // "▁" (E2 96 81) stands for a space.
            for (size_t i = 0; i < len; i++) {
                if (i + 2 < len && (unsigned char)s[i] == 0xE2 && (unsigned char)s[i + 1] == 0x96 &&
                    (unsigned char)s[i + 2] == 0x81) {
                    buf_append_char(&b, ' ');
                    i += 2;
                } else {
                    buf_append_char(&b, s[i]);
                }
            }
        } else if (type == TOKENIZER_TYPE_USER_DEFINED) {
            buf_append(&b, s, len);  // added tokens are raw text, not byte-mapped
        } else {
            bpe_text_to_bytes(s, len, &b);
        }
        if (b.len > UINT32_MAX) {
            buf_free(&b);
            return ERR_FORMAT;
        }
        t->piece_off[id] = (uint32_t)start;
        t->piece_len[id] = (uint32_t)(b.len - start);
    }
    t->pieces = b.data ? buf_take(&b) : xcalloc(1, 1);
    return 0;
}

/* Special strings for parse_special: grouped by first byte, longest first. */
struct special_key {
    unsigned char first;
    uint32_t len;
    int32_t id;
};

static int cmp_special(const void *pa, const void *pb) {
    const struct special_key *a = pa, *b = pb;
    if (a->first != b->first) return a->first < b->first ? -1 : 1;
    if (a->len != b->len) return a->len > b->len ? -1 : 1;
    return a->id < b->id ? -1 : (a->id > b->id);
}

static bool is_special_type(uint8_t ty) {
    return ty == TOKENIZER_TYPE_CONTROL || ty == TOKENIZER_TYPE_USER_DEFINED ||
           ty == TOKENIZER_TYPE_UNKNOWN;
}

static int build_specials(struct tokenizer *t) {
    int32_t n = 0;
    for (int32_t id = 0; id < t->n_vocab; id++)
        if (is_special_type(t->types[id]) && t->text_len[id] > 0) n++;
    struct special_key *keys = malloc((size_t)(n ? n : 1) * sizeof(*keys));
    t->specials = malloc((size_t)(n ? n : 1) * sizeof(int32_t));
    if (!keys || !t->specials) {
        free(keys);
        return ERR_NOMEM;
    }
    n = 0;
    for (int32_t id = 0; id < t->n_vocab; id++) {
        if (is_special_type(t->types[id]) && t->text_len[id] > 0)
            keys[n++] = (struct special_key){(unsigned char)t->texts[t->text_off[id]],
                                             t->text_len[id], id};
    }
    qsort(keys, (size_t)n, sizeof(*keys), cmp_special);
    for (int32_t i = 0; i < n; i++) t->specials[i] = keys[i].id;
    t->n_specials = n;
    int32_t k = 0;
    for (int c = 0; c < 256; c++) {
        while (k < n && keys[k].first < c) k++;
        t->special_first[c] = k;
    }
    t->special_first[256] = n;
    free(keys);
    return 0;
}

/* End-of-generation markers of popular chat vocabularies, found by text. */
static const char *const eot_texts[] = {
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|EOT|>",
    "<EOT>", "_<EOT>", "<|return|>", "<\xef\xbd\x9c" "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>",
};
static const char *const eog_texts[] = {
    "<|eot_id|>", "<|eom_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
    "<|EOT|>", "<EOT>", "_<EOT>", "<|return|>", "<|call|>", "<|end_of_text|>",
    "<\xef\xbd\x9c" "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>",
};
#define N_ELEMS(a) (sizeof(a) / sizeof((a)[0]))

static int load_vocab(struct tokenizer *t, const struct gguf_file *f) {
    const char *name = gguf_name(f);
    const struct gguf_kv *tokens = NULL;
    int rc = gguf_get_arr(f, "tokenizer.ggml.tokens", GGUF_TYPE_STRING, &tokens);
    if (rc) {
        LOG_ERROR("%s: tokenizer.ggml.tokens is %s", name,
                  rc == ERR_NOTFOUND ? "missing" : "not a string array");
        return ERR_FORMAT;
    }
    if (tokens->arr_n == 0 || tokens->arr_n > INT32_MAX / 2) {
        LOG_ERROR("%s: tokenizer.ggml.tokens has %llu entries", name,
                  (unsigned long long)tokens->arr_n);
        return ERR_FORMAT;
    }
    int32_t n = (int32_t)tokens->arr_n;
    t->n_vocab = n;

    uint64_t total = 0;
    for (int32_t i = 0; i < n; i++) total += tokens->strs[i].len + 1;
    if (total > UINT32_MAX) {
        LOG_ERROR("%s: tokenizer.ggml.tokens holds %llu bytes", name, (unsigned long long)total);
        return ERR_FORMAT;
    }
    t->texts = malloc(total);
    t->text_off = malloc((size_t)n * sizeof(uint32_t));
    t->text_len = malloc((size_t)n * sizeof(uint32_t));
    t->scores = calloc((size_t)n, sizeof(float));
    t->types = malloc((size_t)n);
    t->is_eog = calloc((size_t)n, 1);
    if (!t->texts || !t->text_off || !t->text_len || !t->scores || !t->types || !t->is_eog)
        return ERR_NOMEM;
    uint32_t off = 0;
    for (int32_t i = 0; i < n; i++) {
        struct gguf_str s = tokens->strs[i];
        memcpy(t->texts + off, s.data, s.len);
        t->texts[off + s.len] = '\0';
        t->text_off[i] = off;
        t->text_len[i] = (uint32_t)s.len;
        off += (uint32_t)s.len + 1;
    }

    const struct gguf_kv *kv = NULL;
    rc = gguf_get_arr(f, "tokenizer.ggml.scores", GGUF_TYPE_FLOAT32, &kv);
    if (rc == 0) {
        if (kv->arr_n != (uint64_t)n) {
            LOG_ERROR("%s: tokenizer.ggml.scores has %llu entries for %d tokens", name,
                      (unsigned long long)kv->arr_n, n);
            return ERR_FORMAT;
        }
        for (int32_t i = 0; i < n; i++) t->scores[i] = gguf_arr_f32(kv, (uint64_t)i);
    } else if (rc != ERR_NOTFOUND) {
        LOG_ERROR("%s: tokenizer.ggml.scores is not a float32 array", name);
        return ERR_FORMAT;
    }

    rc = gguf_get_arr(f, "tokenizer.ggml.token_type", GGUF_TYPE_INT32, &kv);
    if (rc == 0) {
        if (kv->arr_n != (uint64_t)n) {
            LOG_ERROR("%s: tokenizer.ggml.token_type has %llu entries for %d tokens", name,
                      (unsigned long long)kv->arr_n, n);
            return ERR_FORMAT;
        }
        for (int32_t i = 0; i < n; i++) {
            int32_t ty = gguf_arr_i32(kv, (uint64_t)i);
            if (ty < TOKENIZER_TYPE_UNDEFINED || ty > TOKENIZER_TYPE_BYTE) {
                LOG_ERROR("%s: tokenizer.ggml.token_type[%d] = %d is not a token type", name, i,
                          ty);
                return ERR_FORMAT;
            }
            t->types[i] = (uint8_t)ty;
        }
    } else if (rc == ERR_NOTFOUND) {
        memset(t->types, TOKENIZER_TYPE_NORMAL, (size_t)n);
    } else {
        LOG_ERROR("%s: tokenizer.ggml.token_type is not an int32 array", name);
        return ERR_FORMAT;
    }
    return 0;
}

static int load_special_ids(struct tokenizer *t, const struct gguf_file *f) {
    int32_t n = t->n_vocab;
    // llama.cpp's SPM defaults (<unk>, <s>, </s>); none for BPE.
    bool spm = t->model == TOKENIZER_MODEL_SPM;
    t->unk = spm && n > 0 ? 0 : -1;
    t->bos = spm && n > 1 ? 1 : -1;
    t->eos = spm && n > 2 ? 2 : -1;
    t->eot = -1;
    t->pad = -1;
    int rc = 0;
    if ((rc = read_id(f, "tokenizer.ggml.bos_token_id", n, &t->bos)) ||
        (rc = read_id(f, "tokenizer.ggml.eos_token_id", n, &t->eos)) ||
        (rc = read_id(f, "tokenizer.ggml.unknown_token_id", n, &t->unk)) ||
        (rc = read_id(f, "tokenizer.ggml.padding_token_id", n, &t->pad)) ||
        (rc = read_id(f, "tokenizer.ggml.eot_token_id", n, &t->eot)))
        return rc;
    if (t->eot < 0) {
        for (size_t i = 0; i < N_ELEMS(eot_texts) && t->eot < 0; i++) {
            int32_t id = tokenizer_find(t, eot_texts[i], strlen(eot_texts[i]));
            if (id >= 0 && (t->types[id] == TOKENIZER_TYPE_CONTROL ||
                            t->types[id] == TOKENIZER_TYPE_USER_DEFINED))
                t->eot = id;
        }
    }
    if (t->eos >= 0) t->is_eog[t->eos] = 1;
    if (t->eot >= 0) t->is_eog[t->eot] = 1;
    for (size_t i = 0; i < N_ELEMS(eog_texts); i++) {
        int32_t id = tokenizer_find(t, eog_texts[i], strlen(eog_texts[i]));
        if (id >= 0 && (t->types[id] == TOKENIZER_TYPE_CONTROL ||
                        t->types[id] == TOKENIZER_TYPE_USER_DEFINED))
            t->is_eog[id] = 1;
    }
    return 0;
}

int tokenizer_load(const struct gguf_file *f, struct tokenizer **out) {
    *out = NULL;
    const char *name = gguf_name(f);
    struct gguf_str model = {0};
    if (gguf_get_str(f, "tokenizer.ggml.model", &model) != 0) {
        LOG_ERROR("%s: tokenizer.ggml.model is missing or not a string", name);
        return ERR_FORMAT;
    }
    struct tokenizer *t = calloc(1, sizeof(*t));
    if (!t) return ERR_NOMEM;
    int rc = 0;
    if (gguf_str_eq(model, "llama")) {
        t->model = TOKENIZER_MODEL_SPM;
    } else if (gguf_str_eq(model, "gpt2")) {
        t->model = TOKENIZER_MODEL_BPE;
    } else {
        LOG_ERROR("%s: unsupported tokenizer.ggml.model '%.*s'", name,
                  (int)(model.len > 64 ? 64 : model.len), model.data);
        rc = ERR_UNSUPPORTED;
        goto fail;
    }
    if ((rc = load_vocab(t, f)) || (rc = build_index(t)) || (rc = load_special_ids(t, f)))
        goto fail;

    t->add_space_prefix = t->model == TOKENIZER_MODEL_SPM;
    t->add_bos = t->model == TOKENIZER_MODEL_SPM;
    t->add_eos = false;
    if (t->model == TOKENIZER_MODEL_BPE) {
        const struct gguf_kv *merges = NULL;
        rc = gguf_get_arr(f, "tokenizer.ggml.merges", GGUF_TYPE_STRING, &merges);
        if (rc) {
            LOG_ERROR("%s: tokenizer.ggml.merges is %s", name,
                      rc == ERR_NOTFOUND ? "missing" : "not a string array");
            rc = ERR_FORMAT;
            goto fail;
        }
        struct gguf_str pre = {0};
        rc = gguf_get_str(f, "tokenizer.ggml.pre", &pre);
        if (rc && rc != ERR_NOTFOUND) {
            LOG_ERROR("%s: tokenizer.ggml.pre is not a string", name);
            rc = ERR_FORMAT;
            goto fail;
        }
        bool adds_bos = false;
        const struct vocab voc = vocab_of(t);
        rc = bpe_create(&voc, merges, rc ? NULL : pre.data, rc ? 0 : (size_t)pre.len, &t->bpe,
                        &adds_bos);
        if (rc) goto fail;
        t->add_bos = adds_bos;
    }
    if ((rc = read_bool(f, "tokenizer.ggml.add_bos_token", &t->add_bos)) ||
        (rc = read_bool(f, "tokenizer.ggml.add_eos_token", &t->add_eos)) ||
        (rc = read_bool(f, "tokenizer.ggml.add_space_prefix", &t->add_space_prefix)))
        goto fail;
    if (t->model == TOKENIZER_MODEL_BPE) t->add_space_prefix = false;
    if ((rc = build_pieces(t)) || (rc = build_specials(t))) goto fail;
    LOG_DEBUG("%s: %s tokenizer n_vocab=%d bos=%d eos=%d eot=%d unk=%d n_specials=%d", name,
              t->model == TOKENIZER_MODEL_SPM ? "spm" : "bpe", t->n_vocab, t->bos, t->eos, t->eot,
              t->unk, t->n_specials);
    *out = t;
    return 0;
fail:
    if (rc == ERR_NOMEM) LOG_ERROR("%s: out of memory building the tokenizer", name);
    tokenizer_free(t);
    return rc;
}

/* ---- UTF-8 ---------------------------------------------------------------- */

/* The length of the sequence lead byte c starts, 0 if c cannot start one. */
static int utf8_seq_len(unsigned char c) {
    if (c < 0x80) return 1;
    if (c >= 0xC2 && c <= 0xDF) return 2;
    if (c >= 0xE0 && c <= 0xEF) return 3;
    if (c >= 0xF0 && c <= 0xF4) return 4;
    return 0;
}

/* Whether c may follow lead at position 1 (excludes overlongs, surrogates and
 * code points above U+10FFFF); later positions take any continuation byte. */
static bool utf8_second_ok(unsigned char lead, unsigned char c) {
    switch (lead) {
    case 0xE0: return c >= 0xA0 && c <= 0xBF;
    case 0xED: return c >= 0x80 && c <= 0x9F;
    case 0xF0: return c >= 0x90 && c <= 0xBF;
    case 0xF4: return c >= 0x80 && c <= 0x8F;
    default: return (c & 0xC0) == 0x80;
    }
}

bool tokenizer_utf8_valid(const char *s, size_t len) {
    size_t i = 0;
    while (i < len) {
        unsigned char c = (unsigned char)s[i];
        int n = utf8_seq_len(c);
        if (n == 0 || (size_t)n > len - i) return false;
        if (n > 1 && !utf8_second_ok(c, (unsigned char)s[i + 1])) return false;
        for (int k = 2; k < n; k++)
            if (((unsigned char)s[i + k] & 0xC0) != 0x80) return false;
        i += (size_t)n;
    }
    return true;
}

/* ---- encoding ------------------------------------------------------------- */

/* The id of the longest special string at text[0..len), or -1. User-defined
 * tokens always match; control and unknown-type ones only with parse_special. */
static int32_t match_special(const struct tokenizer *t, const char *text, size_t len,
                             bool parse_special) {
    unsigned char c = (unsigned char)text[0];
    for (int32_t k = t->special_first[c]; k < t->special_first[c + 1]; k++) {
        int32_t id = t->specials[k];
        if (!parse_special && t->types[id] != TOKENIZER_TYPE_USER_DEFINED) continue;
        uint32_t n = t->text_len[id];
        if (n <= len && memcmp(t->texts + t->text_off[id], text, n) == 0) return id;
    }
    return -1;
}

struct id_vec {
    int32_t *ids;  // owned (malloc)
    size_t n;
    size_t cap;
};

static int vec_reserve(struct id_vec *v, size_t extra) {
    if (v->cap - v->n >= extra) return 0;
    size_t cap = v->cap ? v->cap : 64;
    while (cap - v->n < extra) {
        if (cap > SIZE_MAX / 2 / sizeof(int32_t)) return ERR_NOMEM;
        cap *= 2;
    }
    int32_t *p = realloc(v->ids, cap * sizeof(int32_t));
    if (!p) return ERR_NOMEM;
    v->ids = p;
    v->cap = cap;
    return 0;
}

static int encode_fragment(const struct tokenizer *t, const char *text, size_t len,
                           bool after_special, struct id_vec *v) {
    const struct vocab voc = vocab_of(t);
    int rc = 0;
    if (t->model == TOKENIZER_MODEL_SPM) {
        if ((rc = vec_reserve(v, spm_max_tokens(len)))) return rc;
        return spm_encode(&voc, text, len, t->add_space_prefix && after_special, v->ids, &v->n);
    }
    if ((rc = vec_reserve(v, bpe_max_tokens(len)))) return rc;
    return bpe_encode(&voc, t->bpe, text, len, v->ids, &v->n);
}

int tokenizer_encode(const struct tokenizer *t, const char *text, size_t len, bool add_special,
                     bool parse_special, int32_t **out_ids, int32_t *out_n) {
    *out_ids = NULL;
    *out_n = 0;
    if (len > TOKENIZER_MAX_TEXT_BYTES || (len > 0 && !text)) return ERR_INVAL;
    if (len > 0 && (memchr(text, '\0', len) || !tokenizer_utf8_valid(text, len))) return ERR_INVAL;

    struct id_vec v = {0};
    int rc = vec_reserve(&v, 16);
    if (rc) return rc;
    if (add_special && tokenizer_adds_bos(t)) v.ids[v.n++] = t->bos;

    // Plain fragments between special strings; SPM's prefix goes at the start
    // and after each special token.
    bool after_special = true;
    size_t frag = 0;
    if (t->n_specials > 0) {
        for (size_t i = 0; i < len;) {
            int32_t id = match_special(t, text + i, len - i, parse_special);
            if (id < 0) {
                i++;
                continue;
            }
            if (i > frag && (rc = encode_fragment(t, text + frag, i - frag, after_special, &v)))
                goto fail;
            if ((rc = vec_reserve(&v, 1))) goto fail;
            v.ids[v.n++] = id;
            after_special = true;
            i += t->text_len[id];
            frag = i;
        }
    }
    if (len > frag && (rc = encode_fragment(t, text + frag, len - frag, after_special, &v)))
        goto fail;

    if (add_special && tokenizer_adds_eos(t)) {
        if ((rc = vec_reserve(&v, 1))) goto fail;
        v.ids[v.n++] = t->eos;
    }
    if (v.n > INT32_MAX) {
        rc = ERR_INVAL;
        goto fail;
    }
    *out_ids = v.ids;
    *out_n = (int32_t)v.n;
    return 0;
fail:
    free(v.ids);
    return rc;
}

/* ---- decoding ------------------------------------------------------------- */

void tokenizer_token_to_piece(const struct tokenizer *t, int32_t id, bool special,
                              struct buf *out) {
    if (!in_range(t, id)) return;
    if (is_control_like(t->types[id]) && !special) return;
    buf_append(out, t->pieces + t->piece_off[id], t->piece_len[id]);
}

void tokenizer_stream_init(struct tokenizer_stream *s, bool skip_special) {
    memset(s, 0, sizeof(*s));
    s->skip_special = skip_special;
}

/* Whether token id gives text of its own (the first such token of a text
 * loses the SPM dummy prefix). */
static bool gives_text(const struct tokenizer *t, int32_t id) {
    return in_range(t, id) && !is_control_like(t->types[id]) && t->piece_len[id] > 0;
}

void tokenizer_stream_init_after(struct tokenizer_stream *s, const struct tokenizer *t,
                                 const int32_t *prompt, int32_t n_prompt, bool skip_special) {
    tokenizer_stream_init(s, skip_special);
    for (int32_t i = 0; i < n_prompt && !s->has_text; i++) s->has_text = gives_text(t, prompt[i]);
}

/* The bytes id adds at s's point: its piece, less the SPM dummy prefix when
 * it is the text's first token (which it then marks as begun). */
static void stream_bytes(const struct tokenizer *t, struct tokenizer_stream *s, int32_t id,
                         const unsigned char **p, uint32_t *n) {
    *p = (const unsigned char *)t->pieces + t->piece_off[id];
    *n = t->piece_len[id];
    if (s->has_text || !gives_text(t, id)) return;
    if (t->add_space_prefix && t->types[id] != TOKENIZER_TYPE_BYTE && (*p)[0] == ' ') {
        (*p)++;
        (*n)--;
    }
    s->has_text = true;
}

void tokenizer_stream_piece(const struct tokenizer *t, struct tokenizer_stream *s, int32_t id,
                            struct buf *out) {
    if (!in_range(t, id)) return;
    const unsigned char *p;
    uint32_t n;
    stream_bytes(t, s, id, &p, &n);
    buf_append(out, p, n);
}

static void append_replacement(struct buf *out) { buf_append(out, "\xef\xbf\xbd", 3); }

/* Adds one byte to the pending sequence and emits what is decided: a complete
 * character as it is, an invalid prefix as one U+FFFD (the "maximal subpart"
 * rule of Unicode ch. 3), after which the offending byte starts afresh.
 * Invariant on return: pending is empty or a valid but incomplete prefix. */
static void stream_push_byte(struct tokenizer_stream *s, unsigned char c, struct buf *out) {
    s->pending[s->n_pending++] = c;
    while (s->n_pending > 0) {
        unsigned char lead = s->pending[0];
        int need = utf8_seq_len(lead);
        if (need == 0) {
            append_replacement(out);
            memmove(s->pending, s->pending + 1, (size_t)--s->n_pending);
            continue;
        }
        int bad = 0;  // index of the first byte that cannot continue the sequence
        for (int k = 1; k < s->n_pending && !bad; k++) {
            bool ok = k == 1 ? utf8_second_ok(lead, s->pending[k]) : (s->pending[k] & 0xC0) == 0x80;
            if (!ok) bad = k;
        }
        if (bad) {
            append_replacement(out);
            s->n_pending -= bad;
            memmove(s->pending, s->pending + bad, (size_t)s->n_pending);
            continue;
        }
        if (s->n_pending < need) return;  // wait for more bytes
        buf_append(out, s->pending, (size_t)need);
        s->n_pending = 0;
    }
}

void tokenizer_stream_feed(const struct tokenizer *t, struct tokenizer_stream *s, int32_t id,
                           struct buf *out) {
    s->n_fed++;
    if (!in_range(t, id)) return;
    bool control = is_control_like(t->types[id]);
    if (control && s->skip_special) return;
    const unsigned char *p;
    uint32_t n;
    stream_bytes(t, s, id, &p, &n);
    if (s->n_pending == 0 && tokenizer_utf8_valid((const char *)p, n)) {
        buf_append(out, p, n);  // the common case: a whole, valid piece
        return;
    }
    for (uint32_t i = 0; i < n; i++) stream_push_byte(s, p[i], out);
}

void tokenizer_stream_flush(const struct tokenizer *t, struct tokenizer_stream *s,
                            struct buf *out) {
    (void)t;
    if (s->n_pending > 0) append_replacement(out);  // pending is one incomplete character
    s->n_pending = 0;
}

void tokenizer_decode(const struct tokenizer *t, const int32_t *ids, int32_t n, bool skip_special,
                      struct buf *out) {
    struct tokenizer_stream s;
    tokenizer_stream_init(&s, skip_special);
    for (int32_t i = 0; i < n; i++) tokenizer_stream_feed(t, &s, ids[i], out);
    tokenizer_stream_flush(t, &s, out);
}
