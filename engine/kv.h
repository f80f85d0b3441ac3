/*
 * kv.h - KV block storage: one allocation, made once from the budget, holding
 * K and V of every layer for n_blocks blocks of block_size tokens. Addressed
 * by (layer, block id, kv head); the scheduler decides which block id belongs
 * to which sequence, the engine only reads and writes where it is told.
 *
 * Layout of each of K and V (f32): [n_layer][n_blocks][n_head_kv][tile], one
 * contiguous tile per kv head of a block, which is what attention walks:
 *   K tile: [head_dim][block_size]  (transposed: a block's scores are vector FMAs)
 *   V tile: [block_size][head_dim]
 * Block 0 is the null block: never written.
 */
#ifndef LLMSERVE_KV_H
#define LLMSERVE_KV_H

#include <stddef.h>
#include <stdint.h>

struct kv_store {
    int32_t n_layer;
    int32_t n_blocks;
    int32_t block_size;
    int32_t n_head_kv;
    int32_t head_dim;
    size_t head_floats;   // block_size * head_dim: one kv head of one block
    size_t block_floats;  // n_head_kv * head_floats
    float *k;             // owned
    float *v;             // owned
};

/* Bytes one block takes over all layers, K and V. */
size_t kv_block_bytes(int32_t n_layer, int32_t n_head_kv, int32_t head_dim, int32_t block_size);

/* Allocates the storage. Returns 0 or ERR_NOMEM (logged with the size). */
int kv_init(struct kv_store *kv, int32_t n_layer, int32_t n_blocks, int32_t block_size,
            int32_t n_head_kv, int32_t head_dim);

/* Frees; safe on a zeroed struct. */
void kv_free(struct kv_store *kv);

/* The K tile [head_dim][block_size] (kv_k_tile) or V tile [block_size][head_dim]
 * (kv_v_tile) of kv head h of block b in layer il. */
static inline float *kv_k_tile(const struct kv_store *kv, int32_t il, int32_t b, int32_t h) {
    return kv->k + ((size_t)il * (size_t)kv->n_blocks + (size_t)b) * kv->block_floats +
           (size_t)h * kv->head_floats;
}

static inline float *kv_v_tile(const struct kv_store *kv, int32_t il, int32_t b, int32_t h) {
    return kv->v + ((size_t)il * (size_t)kv->n_blocks + (size_t)b) * kv->block_floats +
           (size_t)h * kv->head_floats;
}

#endif
