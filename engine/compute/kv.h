/*
 * kv.h - KV block storage: one allocation, made once from the budget, holding
 * K and V of every layer for n_blocks blocks of block_size tokens. Addressed
 * by (layer, block id, kv head); the scheduler decides which block id belongs
 * to which sequence, the engine only reads and writes where it is told.
 *
 * Each of K and V is [n_blocks][n_layer][n_head_kv][tile], one contiguous tile
 * per kv head of a block, which is what attention walks (bs = block_size,
 * hd = head_dim, ng = ceil(hd / 32) groups of 32 values along head_dim). A
 * block's tiles of every layer are side by side, so the memory a sequence
 * commits (kv.c: pages are committed when first written, 2 MiB ones where the
 * kernel grants them) grows with its blocks, not with the layers times a
 * page:
 *
 *   f32   K tile: float    k[hd][bs]     transposed: a block's scores are vector FMAs
 *         V tile: float    v[bs][hd]
 *   f16   the same, in IEEE halves (uint16_t)
 *   q8_0  K tile: float    d[ng][bs]     scale of group g of token j
 *                 int8_t   q[hd][bs]     k[dim][j] = d[dim / 32][j] * q[dim][j]
 *         V tile: float    d[bs][ng]
 *                 int8_t   q[bs][hd]     v[j][dim] = d[j][dim / 32] * q[j][dim]
 *   (f16 and q8_0 tiles are padded to a multiple of 4 bytes: scales stay aligned)
 *
 * q8_0 quantizes each token's values per group on write as GGUF's Q8_0 does:
 * d = max |x| / 127, q = round(x / d), so |x - d q| <= d / 2 = max |x| / 254.
 * A token's stored bytes depend only on its own K/V, never on the batch.
 * Block 0 is the null block: never written.
 *
 * Divided over n_parts ranks (sequence parallelism with its KV cache divided,
 * `--sp-kv divided`): the ids 0 .. n_blocks - 1 are every rank's, but this
 * store holds only the blocks b with b % n_parts == part, at local index
 * b / n_parts: n_blocks / n_parts blocks of storage. Ids come off the
 * scheduler's one free list, so a sequence's blocks fall on the ranks in turn
 * (and, after churn, evenly on average); every rank writes and reads only its
 * own. Undivided, n_parts is 1 and every block is here.
 */
#ifndef LLMSERVE_KV_H
#define LLMSERVE_KV_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/format/kv_type.h"

struct kv_store {
    enum engine_kv_type type;
    int32_t n_layer;
    int32_t n_blocks;     // block ids, over all parts
    int32_t n_parts;      // 1: every block here; N: one block in N (above)
    int32_t part;         // this store's blocks: b % n_parts == part
    int32_t n_local;      // n_blocks / n_parts: the blocks of storage here
    int32_t block_size;
    int32_t n_head_kv;
    int32_t head_dim;
    size_t tile_bytes;    // one kv head of one block, K or V (kv_tile_bytes)
    size_t block_bytes;   // n_head_kv * tile_bytes: one block of one layer
    uint8_t *k;           // owned (kv_free)
    uint8_t *v;           // owned
    size_t pool_bytes;    // of each of k and v
};

/* Bytes of one K (or V) tile: one kv head of one block. */
size_t kv_tile_bytes(enum engine_kv_type type, int32_t head_dim, int32_t block_size);

/* Bytes one block takes over all layers, K and V. */
size_t kv_block_bytes(enum engine_kv_type type, int32_t n_layer, int32_t n_head_kv,
                      int32_t head_dim, int32_t block_size);

/* Allocates the storage. Returns 0 or ERR_NOMEM (logged with the size). */
int kv_init(struct kv_store *kv, enum engine_kv_type type, int32_t n_layer, int32_t n_blocks,
            int32_t block_size, int32_t n_head_kv, int32_t head_dim);

/* kv_init of the part `part` of n_parts (n_blocks a multiple of n_parts). */
int kv_init_part(struct kv_store *kv, enum engine_kv_type type, int32_t n_layer,
                 int32_t n_blocks, int32_t block_size, int32_t n_head_kv, int32_t head_dim,
                 int32_t n_parts, int32_t part);
/* Frees; safe on a zeroed struct. */
void kv_free(struct kv_store *kv);

/* Whether block b is stored here (always, undivided). */
static inline bool kv_holds(const struct kv_store *kv, int32_t b) {
    return kv->n_parts == 1 || b % kv->n_parts == kv->part;
}

/* Where the tiles of kv head h of block b (held here) of layer il start. */
static inline size_t kv_tile_offset(const struct kv_store *kv, int32_t il, int32_t b, int32_t h) {
    const int32_t local = kv->n_parts == 1 ? b : b / kv->n_parts;
    return ((size_t)local * (size_t)kv->n_layer + (size_t)il) * kv->block_bytes +
           (size_t)h * kv->tile_bytes;
}

/* The K tile or V tile of kv head h of block b in layer il (layouts above). */
static inline void *kv_k_tile(const struct kv_store *kv, int32_t il, int32_t b, int32_t h) {
    return kv->k + kv_tile_offset(kv, il, b, h);
}

static inline void *kv_v_tile(const struct kv_store *kv, int32_t il, int32_t b, int32_t h) {
    return kv->v + kv_tile_offset(kv, il, b, h);
}

/* Stores one token's K and V ([n_head_kv][head_dim] floats each) into slot
 * `slot` of block `block` in layer il, converting to the store's type.
 * Distinct (block, slot) pairs may be written from different threads. */
void kv_write_token(const struct kv_store *kv, int32_t il, int32_t block, int32_t slot,
                    const float *k, const float *v);

/* kv_write_token() for kv heads [h0, h1) only (k and v still the token's
 * whole rows): the token's heads may be written from different threads. */
void kv_write_heads(const struct kv_store *kv, int32_t il, int32_t block, int32_t slot,
                    int32_t h0, int32_t h1, const float *k, const float *v);

/* The stored values of one token back as floats ([n_head_kv][head_dim] each):
 * what attention computes with. For tests and tools, not the hot path. */
void kv_read_token(const struct kv_store *kv, int32_t il, int32_t block, int32_t slot, float *k,
                   float *v);

#endif
