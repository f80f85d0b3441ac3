/*
 * scheduler/draft.c - prompt-lookup drafts (draft.h).
 */
#include "scheduler/draft.h"

#include <string.h>

/* The start of the most recent occurrence of tokens [n - g, n) that ends
 * before n - 1 (so at least one token follows it), or -1. */
static int32_t last_occurrence(const int32_t *tokens, int32_t n, int32_t g) {
    const int32_t *tail = tokens + n - g;
    for (int32_t i = n - g - 1; i >= 0; i--) {
        if (tokens[i] == tail[0] && memcmp(tokens + i, tail, (size_t)g * sizeof(*tokens)) == 0)
            return i;
    }
    return -1;
}

int32_t draft_lookup(const int32_t *tokens, int32_t n, int32_t max_n, int32_t *out) {
    if (max_n <= 0) return 0;
    for (int32_t g = DRAFT_NGRAM_MAX; g >= DRAFT_NGRAM_MIN; g--) {
        if (n < g + 1) continue;
        int32_t at = last_occurrence(tokens, n, g);
        if (at < 0) continue;
        int32_t from = at + g, k = n - from < max_n ? n - from : max_n;
        memcpy(out, tokens + from, (size_t)k * sizeof(*out));
        return k;
    }
    return 0;
}
