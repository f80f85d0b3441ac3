/*
 * scheduler/block_alloc.h - the KV block ledger: which block ids are in use,
 * by how many block tables, and which free blocks still hold a cached prefix.
 *
 * Owns: per-block n_refs, prefix-cache key and tokens, the intrusive LRU free
 * list (doubly linked, with a sentinel) and the key -> block map (open
 * addressing, sized once). Does not own the KV data (the engine does) nor the
 * block tables (block_table.c); only this file touches n_refs and list links.
 *
 * Block 0 is the null block: never handed out, never on the free list.
 * Every other block is in exactly one of three states:
 *   used    n_refs > 0, not on the free list (may be cached: has a key)
 *   cached  n_refs == 0, has a key, on the free list (reusable by a prefix hit)
 *   free    n_refs == 0, no key, on the free list
 * and free + used + cached == n_blocks - 1. Freed blocks go to the tail of the
 * free list, fresh allocations come from the head, so unused cached blocks
 * are evicted least recently used first. All operations are O(1) (the map
 * lookup is O(1) expected).
 * Threads: the step thread only (or one test thread).
 */
#ifndef SCHEDULER_BLOCK_ALLOC_H
#define SCHEDULER_BLOCK_ALLOC_H

#include <stdbool.h>
#include <stdint.h>

#include "scheduler/block_hash.h"

struct block_alloc;

/* A ledger of n_blocks blocks (block 0 included) of block_size tokens.
 * n_blocks >= 2, block_size >= 1. *out is owned by the caller
 * (block_alloc_destroy()). Returns 0, ERR_INVAL or ERR_NOMEM (sized by the
 * config: n_blocks * block_size tokens are kept for the cache keys). */
int  block_alloc_create(int32_t n_blocks, int32_t block_size, struct block_alloc **out);
void block_alloc_destroy(struct block_alloc *a);  // NULL-safe

/* ---- queries ---- */

int32_t block_alloc_block_size(const struct block_alloc *a);
int32_t block_alloc_n_total(const struct block_alloc *a);   // n_blocks - 1 (no null block)
int32_t block_alloc_n_free(const struct block_alloc *a);    // on the free list: free + cached
int32_t block_alloc_n_cached(const struct block_alloc *a);  // on the free list with a key
int32_t block_alloc_n_used(const struct block_alloc *a);    // n_refs > 0
int32_t block_alloc_n_refs(const struct block_alloc *a, int32_t id);
bool    block_alloc_is_cached(const struct block_alloc *a, int32_t id);  // has a key

/* ---- operations ---- */

/* Takes the block at the head of the free list (evicting its cache key if it
 * has one) and returns its id with n_refs = 1 and no key; 0 when the free
 * list is empty. */
int32_t block_alloc_allocate(struct block_alloc *a);

/* n_refs++ of a used block, or of a cached block (which leaves the free list:
 * a prefix hit). */
void block_alloc_ref(struct block_alloc *a, int32_t id);

/* n_refs--; at 0 the block goes to the tail of the free list, keeping its key
 * (it becomes cached) if it has one. */
void block_alloc_unref(struct block_alloc *a, int32_t id);

/* The block whose key is key and whose tokens equal tokens[0..block_size)
 * under adapter_id (0 = none), or 0. Does not change n_refs (the caller refs a hit). */
int32_t block_alloc_lookup(const struct block_alloc *a, struct block_hash key,
                           const int32_t *tokens, uint64_t adapter_id);

/* Publishes used block id, now full of tokens[0..block_size) (its KV written),
 * under key. Returns true when published; false when the block already has a
 * key or another block holds this key (the block then stays uncached). */
bool block_alloc_publish(struct block_alloc *a, int32_t id, struct block_hash key,
                         const int32_t *tokens, uint64_t adapter_id);

/* Drops every cache key of a block on the free list (they become plain
 * free); keys of used blocks stay. */
void block_alloc_clear_cache(struct block_alloc *a);

/* Verifies all of the ledger (STYLE 2.6): the three states add up to the
 * total, the free list links are consistent both ways and hold exactly the
 * n_refs == 0 blocks, the map holds exactly the keyed blocks, block 0 is
 * untouched. Logs the first violation and returns false. */
bool block_alloc_check(const struct block_alloc *a);

#endif // SCHEDULER_BLOCK_ALLOC_H
