/*
 * bpe.c - byte-level BPE as GPT-2 defined it (HF tokenizers' BPE model with
 * the ByteLevel pre-tokenizer and decoder).
 *
 * Every byte of a pre-tokenized piece is first mapped to one printable
 * character (GPT-2's bytes_to_unicode: the printable Latin-1 bytes stand for
 * themselves, the other 68 bytes for U+0100.. in byte order), then pairs of
 * adjacent symbols are merged by rank, lowest first, through a min-heap with
 * stale-entry checks, as in spm.c. Merges are keyed by the two token ids, so
 * no string is built while encoding.
 * The merge table is immutable after bpe_create(); scratch is per call.
 */
#include "engine/text/bpe.h"

#include <stdlib.h>
#include <string.h>

#include "engine/base/alloc.h"
#include "engine/base/err.h"
#include "engine/format/gguf.h"
#include "engine/text/pretok.h"
#include "engine/text/vocab.h"
#define LOG_TAG "bpe"
#include "engine/base/log.h"

struct bpe_merge {
    uint64_t key;    // pair_key(left, right); 0 marks an empty slot
    int32_t rank;    // index in tokenizer.ggml.merges
    int32_t merged;  // id of the merged token
};

struct bpe {
    struct bpe_merge *merges;     // owned; open-addressed hash table of [mask + 1] slots
    uint64_t mask;
    struct pretok *pretok;        // owned
    bool ignore_merges;           // whole-word lookup first (llama3, tekken)
    char byte_chars[256][3];      // UTF-8 of the character byte b maps to, NUL-padded
    uint8_t byte_char_len[256];
};

/* Slots store key + 1 so that the pair (0, 0) is representable. */
static uint64_t hash_u64(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    x ^= x >> 33;
    return x;
}

static uint64_t pair_key(int32_t left, int32_t right) {
    return (((uint64_t)(uint32_t)left << 32) | (uint32_t)right) + 1;
}

static const struct bpe_merge *find_merge(const struct bpe *b, int32_t left, int32_t right) {
    uint64_t key = pair_key(left, right);
    for (uint64_t i = hash_u64(key) & b->mask;; i = (i + 1) & b->mask) {
        if (b->merges[i].key == key) return &b->merges[i];
        if (b->merges[i].key == 0) return NULL;
    }
}

/* GPT-2's bytes_to_unicode(). */
static void build_byte_map(struct bpe *b) {
    int n_other = 0;
    for (int c = 0; c < 256; c++) {
        bool printable = (c >= 0x21 && c <= 0x7E) || (c >= 0xA1 && c <= 0xAC) || (c >= 0xAE);
        uint32_t cp = printable ? (uint32_t)c : 256u + (uint32_t)n_other++;
        memset(b->byte_chars[c], 0, 3);
        if (cp < 0x80) {
            b->byte_chars[c][0] = (char)cp;
            b->byte_char_len[c] = 1;
        } else {
            b->byte_chars[c][0] = (char)(0xC0 | (cp >> 6));
            b->byte_chars[c][1] = (char)(0x80 | (cp & 0x3F));
            b->byte_char_len[c] = 2;
        }
    }
}

void bpe_text_to_bytes(const char *s, size_t len, struct buf *out) {
    // Inverse map: code points 0..323 -> byte, -1 where the map has none.
    int16_t inv[324];
    for (int i = 0; i < 324; i++) inv[i] = -1;
    int n_other = 0;
    for (int c = 0; c < 256; c++) {
        bool printable = (c >= 0x21 && c <= 0x7E) || (c >= 0xA1 && c <= 0xAC) || (c >= 0xAE);
        inv[printable ? c : 256 + n_other++] = (int16_t)c;
    }
    size_t i = 0;
    while (i < len) {
        unsigned char c0 = (unsigned char)s[i];
        uint32_t cp = 0;
        size_t n = 1;
        if (c0 < 0x80) {
            cp = c0;
        } else if ((c0 & 0xE0) == 0xC0 && i + 1 < len) {
            cp = ((uint32_t)(c0 & 0x1F) << 6) | ((unsigned char)s[i + 1] & 0x3F);
            n = 2;
        } else {
            cp = UINT32_MAX;  // 3- and 4-byte characters are never in the map
            n = (c0 & 0xF0) == 0xE0 ? 3 : (c0 & 0xF8) == 0xF0 ? 4 : 1;
            if (n > len - i) n = len - i;
        }
        if (cp < 324 && inv[cp] >= 0) {
            buf_append_char(out, (char)inv[cp]);
        } else {
            buf_append(out, s + i, n);  // not byte-level text: keep it as it is
        }
        i += n;
    }
}

void bpe_free(struct bpe *b) {
    if (!b) return;
    free(b->merges);
    pretok_free(b->pretok);
    free(b);
}

int bpe_create(const struct vocab *v, const struct gguf_kv *merges, const char *pre,
               size_t pre_len, struct bpe **out, bool *adds_bos) {
    *out = NULL;
    struct bpe *b = calloc(1, sizeof(*b));
    if (!b) return ERR_NOMEM;
    build_byte_map(b);

    struct pretok_info info = {0};
    int rc = pretok_create(pre, pre_len, &b->pretok, &info);
    if (rc) goto fail;
    b->ignore_merges = info.ignore_merges;
    *adds_bos = info.adds_bos;

    uint64_t n = merges->arr_n;
    uint64_t slots = 16;
    while (slots < 2 * n) slots *= 2;
    b->mask = slots - 1;
    b->merges = calloc(slots, sizeof(*b->merges));
    if (!b->merges) {
        rc = ERR_NOMEM;
        goto fail;
    }
    char tmp[512];
    for (uint64_t i = 0; i < n; i++) {
        struct gguf_str m = merges->strs[i];
        // "left right": token texts of byte-level vocabularies hold no raw space.
        const char *sp = m.len > 1 ? memchr(m.data + 1, ' ', m.len - 1) : NULL;
        if (!sp) {
            LOG_ERROR("tokenizer.ggml.merges[%llu] has no space", (unsigned long long)i);
            rc = ERR_FORMAT;
            goto fail;
        }
        size_t n_left = (size_t)(sp - m.data);
        size_t n_right = m.len - n_left - 1;
        int32_t left = vocab_find(v, m.data, n_left);
        int32_t right = vocab_find(v, sp + 1, n_right);
        int32_t merged = -1;
        if (left >= 0 && right >= 0 && n_left + n_right <= sizeof(tmp)) {
            memcpy(tmp, m.data, n_left);
            memcpy(tmp + n_left, sp + 1, n_right);
            merged = vocab_find(v, tmp, n_left + n_right);
        }
        if (merged < 0) {
            LOG_ERROR("tokenizer.ggml.merges[%llu] '%.*s' names a token not in the vocabulary",
                      (unsigned long long)i, (int)(m.len > 64 ? 64 : m.len), m.data);
            rc = ERR_FORMAT;
            goto fail;
        }
        uint64_t key = pair_key(left, right);
        uint64_t s = hash_u64(key) & b->mask;
        while (b->merges[s].key != 0 && b->merges[s].key != key) s = (s + 1) & b->mask;
        if (b->merges[s].key == key) continue;  // duplicate: the first (lowest) rank wins
        b->merges[s] = (struct bpe_merge){key, (int32_t)i, merged};
    }
    *out = b;
    return 0;
fail:
    bpe_free(b);
    return rc;
}

struct bpe_symbol {
    uint32_t start;  // byte offset in the mapped word
    uint32_t len;    // bytes; 0 once merged into its left neighbour
    int32_t id;      // token id of the symbol's text, -1 if it is no token
    int32_t prev;
    int32_t next;
};

struct bpe_bigram {
    int32_t rank;
    int32_t left;
    int32_t right;
    int32_t left_id;   // ids when queued: the entry is stale if either changed
    int32_t right_id;
    int32_t merged;
};

static bool bigram_before(const struct bpe_bigram *a, const struct bpe_bigram *b) {
    return a->rank < b->rank || (a->rank == b->rank && a->left < b->left);
}

static void heap_push(struct bpe_bigram *h, size_t *n, struct bpe_bigram v) {
    size_t i = (*n)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!bigram_before(&v, &h[p])) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = v;
}

static struct bpe_bigram heap_pop(struct bpe_bigram *h, size_t *n) {
    struct bpe_bigram top = h[0];
    struct bpe_bigram last = h[--(*n)];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && bigram_before(&h[c + 1], &h[c])) c++;
        if (!bigram_before(&h[c], &last)) break;
        h[i] = h[c];
        i = c;
    }
    if (*n > 0) h[i] = last;
    return top;
}

static void try_bigram(const struct bpe *b, struct bpe_symbol *sym, struct bpe_bigram *heap,
                       size_t *n_heap, size_t cap_heap, int32_t left, int32_t right) {
    if (left < 0 || right < 0 || sym[left].id < 0 || sym[right].id < 0) return;
    const struct bpe_merge *m = find_merge(b, sym[left].id, sym[right].id);
    if (!m) return;
    ASSERT(*n_heap < cap_heap);
    heap_push(heap, n_heap,
              (struct bpe_bigram){m->rank, left, right, sym[left].id, sym[right].id, m->merged});
}

int bpe_encode(const struct vocab *v, const struct bpe *b, const char *text, size_t len,
               int32_t *out, size_t *n_out) {
    if (len == 0) return 0;
    int rc = 0;
    struct pretok_span *spans = malloc(2 * len * sizeof(*spans));  // [len] result + [len] scratch
    char *word = NULL;
    struct bpe_symbol *sym = NULL;
    struct bpe_bigram *heap = NULL;
    if (!spans) return ERR_NOMEM;
    size_t n_spans = 0;
    rc = pretok_split(b->pretok, text, len, spans, spans + len, len, &n_spans);
    if (rc) goto done;

    size_t max_span = 0;
    for (size_t i = 0; i < n_spans; i++)
        if (spans[i].len > max_span) max_span = spans[i].len;
    word = malloc(2 * max_span);                  // mapped bytes: <= 2 per byte
    sym = malloc(max_span * sizeof(*sym));        // one per byte
    size_t cap_heap = 3 * max_span;               // initial pairs + 2 per merge
    heap = malloc(cap_heap * sizeof(*heap));
    if (!word || !sym || !heap) {
        rc = ERR_NOMEM;
        goto done;
    }
    int32_t unk = v->unk;

    for (size_t is = 0; is < n_spans; is++) {
        const unsigned char *p = (const unsigned char *)text + spans[is].start;
        uint32_t plen = spans[is].len;
        // Map bytes to characters; each byte is one initial symbol.
        uint32_t n_word = 0;
        int32_t n_sym = 0;
        for (uint32_t k = 0; k < plen; k++) {
            uint8_t cl = b->byte_char_len[p[k]];
            memcpy(word + n_word, b->byte_chars[p[k]], cl);
            sym[n_sym] = (struct bpe_symbol){n_word, cl, -1, n_sym - 1, -1};
            if (n_sym > 0) sym[n_sym - 1].next = n_sym;
            n_sym++;
            n_word += cl;
        }
        if (b->ignore_merges) {
            int32_t id = vocab_find(v, word, n_word);
            if (id >= 0) {
                out[(*n_out)++] = id;
                continue;
            }
        }
        for (int32_t i = 0; i < n_sym; i++)
            sym[i].id = vocab_find(v, word + sym[i].start, sym[i].len);

        size_t n_heap = 0;
        for (int32_t i = 1; i < n_sym; i++) try_bigram(b, sym, heap, &n_heap, cap_heap, i - 1, i);
        while (n_heap > 0) {
            struct bpe_bigram g = heap_pop(heap, &n_heap);
            struct bpe_symbol *l = &sym[g.left];
            struct bpe_symbol *r = &sym[g.right];
            if (l->len == 0 || r->len == 0 || l->next != g.right || l->id != g.left_id ||
                r->id != g.right_id)
                continue;  // stale: one side merged since it was queued
            l->len += r->len;
            l->id = g.merged;
            r->len = 0;
            l->next = r->next;
            if (r->next >= 0) sym[r->next].prev = g.left;
            try_bigram(b, sym, heap, &n_heap, cap_heap, l->prev, g.left);
            try_bigram(b, sym, heap, &n_heap, cap_heap, g.left, l->next);
        }
        for (int32_t i = 0; i >= 0 && i < n_sym; i = sym[i].next) {
            if (sym[i].id >= 0) {
                out[(*n_out)++] = sym[i].id;
            } else if (unk >= 0) {
                out[(*n_out)++] = unk;  // a byte whose character is not in the vocabulary
            }
        }
    }
done:
    free(spans);
    free(word);
    free(sym);
    free(heap);
    return rc;
}
