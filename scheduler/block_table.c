/*
 * scheduler/block_table.c - reserve, copy-on-write, trim and release of one
 * sequence's blocks. All reference changes go through block_alloc.c.
 */
#include "scheduler/block_table.h"

#include <stdlib.h>

#include "engine/base/alloc.h"
#include "engine/base/err.h"
#include "engine/base/fault.h"
#include "scheduler/block_alloc.h"

int32_t block_table_blocks_for(int32_t n_tokens, int32_t block_size) {
    return n_tokens <= 0 ? 0 : (n_tokens - 1) / block_size + 1;
}

int block_table_init(struct block_table *t, int32_t cap) {
    ASSERT(cap >= 0);
    t->ids = fault_calloc(FAULT_SITE_KV, (size_t)cap + 1, sizeof(*t->ids));
    t->n_blocks = 0;
    t->n_live = 0;
    t->cap = t->ids ? cap : 0;
    return t->ids ? 0 : ERR_NOMEM;
}

void block_table_deinit(struct block_table *t) {
    ASSERT(t->n_live == 0);
    free(t->ids);
    t->ids = NULL;
    t->cap = 0;
    t->n_blocks = 0;
}

enum block_reserve block_table_reserve(struct block_table *t, struct block_alloc *a,
                                       int32_t n_tokens) {
    int32_t want = block_table_blocks_for(n_tokens, block_alloc_block_size(a));
    if (want <= t->n_blocks) return BLOCK_RESERVE_OK;
    int32_t n_new = want - t->n_blocks;
    if (want > t->cap || t->n_live + n_new > block_alloc_n_total(a)) return BLOCK_RESERVE_NEVER;
    if (n_new > block_alloc_n_free(a)) return BLOCK_RESERVE_LATER;
    for (int32_t i = 0; i < n_new; i++) {
        int32_t id = block_alloc_allocate(a);
        ASSERT(id > 0);  // counted above
        t->ids[t->n_blocks++] = id;
        t->n_live++;
    }
    return BLOCK_RESERVE_OK;
}

void block_table_append(struct block_table *t, struct block_alloc *a, int32_t id) {
    ASSERT(t->n_blocks < t->cap && id > 0);
    block_alloc_ref(a, id);
    t->ids[t->n_blocks++] = id;
    t->n_live++;
}

int32_t block_table_copy_on_write(struct block_table *t, struct block_alloc *a, int32_t pos) {
    int32_t bs = block_alloc_block_size(a);
    int32_t i = pos / bs;
    if (i >= t->n_blocks || t->ids[i] == 0) return pos;
    int32_t old = t->ids[i];
    if (block_alloc_n_refs(a, old) <= 1) return pos;
    int32_t id = block_alloc_allocate(a);
    if (id == 0) return -1;
    block_alloc_unref(a, old);
    t->ids[i] = id;
    return i * bs;
}

int32_t block_table_trim(struct block_table *t, struct block_alloc *a, int32_t first_pos) {
    int32_t n_before = first_pos / block_alloc_block_size(a);  // blocks wholly before first_pos
    if (n_before > t->n_blocks) n_before = t->n_blocks;
    int32_t n_released = 0;
    // Newest of them first, so the oldest blocks end up nearer the tail of the LRU.
    for (int32_t i = n_before - 1; i >= 0; i--) {
        if (t->ids[i] == 0) break;  // everything before is trimmed already
        block_alloc_unref(a, t->ids[i]);
        t->ids[i] = 0;
        t->n_live--;
        n_released++;
    }
    return n_released;
}

void block_table_truncate(struct block_table *t, struct block_alloc *a, int32_t n_tokens) {
    int32_t keep = block_table_blocks_for(n_tokens, block_alloc_block_size(a));
    while (t->n_blocks > keep) {
        int32_t id = t->ids[--t->n_blocks];
        t->ids[t->n_blocks] = 0;
        if (id == 0) continue;
        block_alloc_unref(a, id);
        t->n_live--;
    }
}

void block_table_release(struct block_table *t, struct block_alloc *a) {
    for (int32_t i = t->n_blocks - 1; i >= 0; i--) {
        if (t->ids[i] == 0) continue;
        block_alloc_unref(a, t->ids[i]);
        t->ids[i] = 0;
    }
    t->n_blocks = 0;
    t->n_live = 0;
}
