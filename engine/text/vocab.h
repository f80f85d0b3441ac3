/*
 * vocab.h - the part of a tokenizer its algorithms read: token text -> id,
 * the score of an id, the unk id. tokenizer.c owns the arrays and hands a
 * view of them to spm.c and bpe.c, so the algorithms never include
 * tokenizer.h and the tokenizer's dispatch is the only way down
 * (tokenizer -> spm, bpe -> vocab). Header only; a view is valid as long as
 * the tokenizer it was taken from. [any thread]
 */
#ifndef LLMSERVE_VOCAB_H
#define LLMSERVE_VOCAB_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

struct vocab {
    int32_t n_vocab;
    const char *texts;         // borrowed: every token text, NUL-terminated, at text_off[id]
    const uint32_t *text_off;  // borrowed [n_vocab]
    const uint32_t *text_len;  // borrowed [n_vocab] bytes, without the NUL
    const float *scores;       // borrowed [n_vocab]
    const int32_t *index;      // borrowed: open-addressed text -> id, -1 empty, [index_mask + 1]
    uint64_t index_mask;
    int32_t unk;               // -1 when absent
};

/* The hash the index is built with (FNV-1a, high bits folded in). */
static inline uint64_t vocab_hash(const char *s, size_t len) {
    uint64_t h = 0xcbf29ce484222325ULL;
    for (size_t i = 0; i < len; i++) {
        h ^= (unsigned char)s[i];
        h *= 0x100000001b3ULL;
    }
    return h ^ (h >> 29);
}

/* The id whose text is exactly s[0..len), or -1. */
static inline int32_t vocab_find(const struct vocab *v, const char *s, size_t len) {
    for (uint64_t i = vocab_hash(s, len) & v->index_mask;; i = (i + 1) & v->index_mask) {
        int32_t id = v->index[i];
        if (id < 0) return -1;
        if (v->text_len[id] == len && memcmp(v->texts + v->text_off[id], s, len) == 0) return id;
    }
}

/* The score of id, 0 for an id out of range. */
static inline float vocab_score(const struct vocab *v, int32_t id) {
    return id >= 0 && id < v->n_vocab ? v->scores[id] : 0.0f;
}

#endif
