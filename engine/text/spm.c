/*
 * spm.c - SentencePiece-style BPE over a score-ranked vocabulary.
 *
 * The text is one linked list of symbols (initially its UTF-8 characters);
 * every adjacent pair whose concatenation is a vocabulary piece goes into a
 * max-heap keyed by that piece's score. Popping the best pair merges it and
 * queues the two new pairs with its neighbours; entries made stale by earlier
 * merges are recognised by their length and skipped. O(n log n) in the text.
 * All scratch is allocated per call and freed before returning.
 */
#include "engine/text/spm.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/base/alloc.h"
#include "engine/base/err.h"
#include "engine/text/vocab.h"

#define SPM_SPACE "\xe2\x96\x81"  // U+2581, SentencePiece's visible space
#define SPM_SPACE_LEN 3

struct spm_symbol {
    uint32_t start;  // byte offset in the escaped text
    uint32_t len;    // bytes; 0 once merged into its left neighbour
    int32_t prev;    // index of the previous live symbol, -1 at the start
    int32_t next;    // index of the next live symbol, -1 at the end
};

struct spm_bigram {
    float score;     // score of the merged piece
    int32_t left;    // symbol indices
    int32_t right;
    uint32_t len;    // left.len + right.len when queued: stale if it changed
};

/* a goes before b: higher score, then leftmost. */
static bool bigram_before(const struct spm_bigram *a, const struct spm_bigram *b) {
    return a->score > b->score || (a->score == b->score && a->left < b->left);
}

static void heap_push(struct spm_bigram *h, size_t *n, struct spm_bigram v) {
    size_t i = (*n)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!bigram_before(&v, &h[p])) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = v;
}

static struct spm_bigram heap_pop(struct spm_bigram *h, size_t *n) {
    struct spm_bigram top = h[0];
    struct spm_bigram last = h[--(*n)];
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

struct spm_work {
    const struct vocab *v;
    const char *text;           // escaped text, borrowed
    struct spm_symbol *sym;     // [n_sym]
    struct spm_bigram *heap;    // [cap_heap]
    size_t n_heap;
    size_t cap_heap;
};

static void try_bigram(struct spm_work *w, int32_t left, int32_t right) {
    if (left < 0 || right < 0) return;
    const struct spm_symbol *l = &w->sym[left];
    const struct spm_symbol *r = &w->sym[right];
    uint32_t len = l->len + r->len;
    int32_t id = vocab_find(w->v, w->text + l->start, len);
    if (id < 0) return;
    ASSERT(w->n_heap < w->cap_heap);
    heap_push(w->heap, &w->n_heap,
              (struct spm_bigram){vocab_score(w->v, id), left, right, len});
}

static size_t utf8_len(unsigned char c) {
    if (c < 0x80) return 1;
    if ((c & 0xE0) == 0xC0) return 2;
    if ((c & 0xF0) == 0xE0) return 3;
    if ((c & 0xF8) == 0xF0) return 4;
    return 1;
}

int spm_encode(const struct vocab *v, const char *text, size_t len, bool add_prefix,
               int32_t *out, size_t *n_out) {
    if (len == 0) return 0;
    // Escape: optional prefix, then every ' ' as U+2581. [n_esc] bytes
    size_t cap_esc = SPM_SPACE_LEN * (len + 1);
    char *esc = malloc(cap_esc);
    struct spm_symbol *sym = malloc((len + 1) * sizeof(*sym));
    // Initial pairs <= n_sym, and each merge queues at most 2 more.
    size_t cap_heap = 3 * (len + 1);
    struct spm_bigram *heap = malloc(cap_heap * sizeof(*heap));
    if (!esc || !sym || !heap) {
        free(esc);
        free(sym);
        free(heap);
        return ERR_NOMEM;
    }
    size_t n_esc = 0;
    if (add_prefix) {
        memcpy(esc, SPM_SPACE, SPM_SPACE_LEN);
        n_esc = SPM_SPACE_LEN;
    }
    for (size_t i = 0; i < len; i++) {
        if (text[i] == ' ') {
            memcpy(esc + n_esc, SPM_SPACE, SPM_SPACE_LEN);
            n_esc += SPM_SPACE_LEN;
        } else {
            esc[n_esc++] = text[i];
        }
    }

    // One symbol per UTF-8 character (the text was validated by the caller).
    int32_t n_sym = 0;
    for (size_t off = 0; off < n_esc;) {
        size_t cl = utf8_len((unsigned char)esc[off]);
        if (cl > n_esc - off) cl = n_esc - off;
        sym[n_sym] = (struct spm_symbol){(uint32_t)off, (uint32_t)cl, n_sym - 1, -1};
        if (n_sym > 0) sym[n_sym - 1].next = n_sym;
        n_sym++;
        off += cl;
    }

    struct spm_work w = {v, esc, sym, heap, 0, cap_heap};
    for (int32_t i = 1; i < n_sym; i++) try_bigram(&w, i - 1, i);

    // Merge the best pair until no pair forms a piece.
    while (w.n_heap > 0) {
        struct spm_bigram b = heap_pop(w.heap, &w.n_heap);
        struct spm_symbol *l = &sym[b.left];
        struct spm_symbol *r = &sym[b.right];
        if (l->len == 0 || r->len == 0 || l->len + r->len != b.len) continue;  // stale
        l->len += r->len;
        r->len = 0;
        l->next = r->next;
        if (r->next >= 0) sym[r->next].prev = b.left;
        try_bigram(&w, l->prev, b.left);
        try_bigram(&w, b.left, l->next);
    }

    // Emit pieces; a symbol that is no piece (a single character) becomes bytes.
    int32_t byte_ids[256];
    for (int i = 0; i < 256; i++) byte_ids[i] = -2;  // -2: not looked up yet
    int32_t unk = v->unk;
    for (int32_t i = 0; i >= 0 && i < n_sym; i = sym[i].next) {
        int32_t id = vocab_find(v, esc + sym[i].start, sym[i].len);
        if (id >= 0) {
            out[(*n_out)++] = id;
            continue;
        }
        for (uint32_t k = 0; k < sym[i].len; k++) {
            unsigned char c = (unsigned char)esc[sym[i].start + k];
            if (byte_ids[c] == -2) {
                char name[8];
                snprintf(name, sizeof(name), "<0x%02X>", c);
                byte_ids[c] = vocab_find(v, name, 6);
            }
            if (byte_ids[c] >= 0) {
                out[(*n_out)++] = byte_ids[c];
            } else if (unk >= 0) {
                // No byte fallback: the whole character is one unknown token.
                out[(*n_out)++] = unk;
                break;
            }
        }
    }
    free(esc);
    free(sym);
    free(heap);
    return 0;
}
