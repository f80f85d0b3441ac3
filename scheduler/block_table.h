/*
 * scheduler/block_table.h - one sequence's block table: entry i holds the KV
 * block of positions [i * block_size, (i + 1) * block_size).
 *
 * Owns the id array (allocated once, at the sequence's largest size) and one
 * reference (block_alloc n_refs) on every nonzero entry. Entries of blocks
 * wholly outside a sliding window are 0, the null block, after a trim.
 * Threads: the step thread only.
 */
#ifndef SCHEDULER_BLOCK_TABLE_H
#define SCHEDULER_BLOCK_TABLE_H

#include <stdint.h>

struct block_alloc;

/* Outcome of a reservation (not an error, STYLE 2.5). */
enum block_reserve {
    BLOCK_RESERVE_OK,     // the blocks are in the table
    BLOCK_RESERVE_LATER,  // not enough free blocks now; nothing changed
    BLOCK_RESERVE_NEVER,  // the sequence alone would not fit in the pool; nothing changed
};

struct block_table {
    int32_t *ids;      // owned; [cap] block ids, 0 = null entry
    int32_t n_blocks;  // entries in use (null entries included)
    int32_t n_live;    // nonzero entries, each holding one reference
    int32_t cap;       // entries allocated: the most the sequence can ever need
};

/* Blocks that cover n_tokens positions. */
int32_t block_table_blocks_for(int32_t n_tokens, int32_t block_size);

/* Sets up an empty table with room for cap entries: one allocation, sized by
 * the request's max_tokens, so it may fail (and a test may make it fail:
 * engine/base/fault.h, site kv). Returns 0 or ERR_NOMEM (t is then empty,
 * and block_table_deinit() is still safe). */
int block_table_init(struct block_table *t, int32_t cap);
/* Frees the id array; the table must be released first. NULL-safe contents. */
void block_table_deinit(struct block_table *t);

/* Makes the table cover positions [0, n_tokens) by appending fresh blocks.
 * NEVER when the live entries it would then hold exceed the pool (or cap);
 * LATER when the pool has too few free blocks now. */
enum block_reserve block_table_reserve(struct block_table *t, struct block_alloc *a,
                                       int32_t n_tokens);

/* Appends block id (a prefix-cache hit) and takes a reference on it. */
void block_table_append(struct block_table *t, struct block_alloc *a, int32_t id);

/* Copy-on-write before writing position pos: when the block holding pos is
 * shared (n_refs > 1) it is replaced by a fresh block and the shared one
 * unreferenced. The engine has no block copy, so the copy is a recompute:
 * returns the first position whose KV must be (re)written, the replaced
 * block's start, or pos when nothing was shared or pos is past the table;
 * returns -1 (nothing changed) when no block is free. */
int32_t block_table_copy_on_write(struct block_table *t, struct block_alloc *a, int32_t pos);

/* Sliding window: releases every block wholly before position first_pos and
 * sets its entry to 0. Returns the number of blocks released. */
int32_t block_table_trim(struct block_table *t, struct block_alloc *a, int32_t first_pos);

/* Releases the blocks past those covering positions [0, n_tokens) (a
 * rejected draft's, scheduler.c). */
void block_table_truncate(struct block_table *t, struct block_alloc *a, int32_t n_tokens);

/* Releases every block (last block first, so a sequence's tail blocks are
 * evicted before its shared prefix) and empties the table. */
void block_table_release(struct block_table *t, struct block_alloc *a);

#endif // SCHEDULER_BLOCK_TABLE_H
