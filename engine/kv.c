/*
 * kv.c - allocation of the KV block storage.
 */
#define LOG_TAG "kv"
#include "engine/kv.h"

#include <stdlib.h>
#include <string.h>

#include "engine/base/err.h"
#include "engine/base/log.h"

size_t kv_block_bytes(int32_t n_layer, int32_t n_head_kv, int32_t head_dim, int32_t block_size) {
    return 2 * (size_t)n_layer * (size_t)n_head_kv * (size_t)head_dim * (size_t)block_size *
           sizeof(float);
}

int kv_init(struct kv_store *kv, int32_t n_layer, int32_t n_blocks, int32_t block_size,
            int32_t n_head_kv, int32_t head_dim) {
    memset(kv, 0, sizeof(*kv));
    kv->n_layer = n_layer;
    kv->n_blocks = n_blocks;
    kv->block_size = block_size;
    kv->n_head_kv = n_head_kv;
    kv->head_dim = head_dim;
    kv->head_floats = (size_t)block_size * (size_t)head_dim;
    kv->block_floats = (size_t)n_head_kv * kv->head_floats;
    size_t n = (size_t)n_layer * (size_t)n_blocks * kv->block_floats;
    // calloc: the pages are committed only when first written.
    kv->k = calloc(n, sizeof(float));
    kv->v = calloc(n, sizeof(float));
    if (!kv->k || !kv->v) {
        LOG_ERROR("%s: cannot allocate %zu MiB of KV storage for %d blocks", __func__,
                  2 * n * sizeof(float) >> 20, n_blocks);
        kv_free(kv);
        return ERR_NOMEM;
    }
    return 0;
}

void kv_free(struct kv_store *kv) {
    free(kv->k);
    free(kv->v);
    kv->k = kv->v = NULL;
}
