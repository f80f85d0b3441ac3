/*
 * scheduler/block_hash.h - prefix-cache keys for full KV blocks.
 *
 * A block's key is hash(parent key, the block's block_size tokens, adapter id),
 * so equal keys mean "same tokens at the same positions after the same prefix,
 * under the same adapter". The key is 128 bits wide (two independent 64-bit
 * lanes); block_alloc additionally stores and compares the block's own tokens
 * and adapter, so a reused block never holds different tokens, and a wrong
 * prefix would need a 128-bit collision of the parent chain.
 * Threads: pure functions. [any thread]
 */
#ifndef SCHEDULER_BLOCK_HASH_H
#define SCHEDULER_BLOCK_HASH_H

#include <stdbool.h>
#include <stdint.h>

struct block_hash {
    uint64_t lo;
    uint64_t hi;
};

/* The parent of a sequence's first block. */
#define BLOCK_HASH_ROOT ((struct block_hash){0x6c6c6d7365727665ull, 0x626c6f636b726f6full})

/* Key of a block holding tokens[0..n_tokens) after the prefix whose last block
 * has key parent, computed under the adapter with identity adapter_id (0 =
 * none). The identity is never an adapter slot number, which is reused for
 * other adapters: it is the loaded adapter object's info.id (engine/lora.h),
 * which no other load of the model ever gets. */
struct block_hash block_hash_compute(struct block_hash parent, const int32_t *tokens,
                                     int32_t n_tokens, uint64_t adapter_id);

bool block_hash_equal(struct block_hash a, struct block_hash b);

#endif // SCHEDULER_BLOCK_HASH_H
