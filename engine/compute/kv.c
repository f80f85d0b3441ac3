/*
 * kv.c - allocation of the KV block storage, and the conversion of one
 * token's K/V into (and, for tests, out of) the store's type.
 */
#define LOG_TAG "kv"
#include "engine/compute/kv.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/base/alloc.h"
#include "engine/base/err.h"
#include "engine/base/log.h"
#include "engine/base/pages.h"
#include "engine/kernels/kernels.h"
#include "engine/format/quant.h"

static int32_t n_groups(int32_t head_dim) { return (head_dim + KV_Q8_0_GROUP - 1) / KV_Q8_0_GROUP; }

size_t kv_tile_bytes(enum engine_kv_type type, int32_t head_dim, int32_t block_size) {
    const size_t n = (size_t)head_dim * (size_t)block_size;
    switch (type) {
    case ENGINE_KV_TYPE_F32: return n * sizeof(float);
    case ENGINE_KV_TYPE_F16: return (n * sizeof(uint16_t) + 3) & ~(size_t)3;
    case ENGINE_KV_TYPE_Q8_0:
        return ((size_t)n_groups(head_dim) * (size_t)block_size * sizeof(float) + n + 3) &
               ~(size_t)3;
    case ENGINE_KV_TYPE_COUNT: break;
    }
    UNREACHABLE();
}

size_t kv_block_bytes(enum engine_kv_type type, int32_t n_layer, int32_t n_head_kv,
                      int32_t head_dim, int32_t block_size) {
    return 2 * (size_t)n_layer * (size_t)n_head_kv * kv_tile_bytes(type, head_dim, block_size);
}

/* n zeroed bytes, committed only where first written (so --kv-memory costs
 * what the sequences use), in 2 MiB pages where the kernel grants them
 * (pages.h). With 4 KiB pages every new block faulted in fresh pages in
 * every layer: 15% of a fresh 32-stream run of the 110M model
 * (docs/benchmarks.md). Under AddressSanitizer, calloc, whose redzones catch
 * a write past the pool. NULL when there is no memory. */
static void *pool_alloc(size_t n) {
#ifdef __SANITIZE_ADDRESS__
    return calloc(n ? n : 1, 1);
#else
    return pages_reserve(n, true);
#endif
}

static void pool_free(void *p, size_t n) {
#ifdef __SANITIZE_ADDRESS__
    (void)n;
    free(p);
#else
    pages_release(p, n);
#endif
}

int kv_init(struct kv_store *kv, enum engine_kv_type type, int32_t n_layer, int32_t n_blocks,
            int32_t block_size, int32_t n_head_kv, int32_t head_dim) {
    return kv_init_part(kv, type, n_layer, n_blocks, block_size, n_head_kv, head_dim, 1, 0);
}

int kv_init_part(struct kv_store *kv, enum engine_kv_type type, int32_t n_layer,
                 int32_t n_blocks, int32_t block_size, int32_t n_head_kv, int32_t head_dim,
                 int32_t n_parts, int32_t part) {
    memset(kv, 0, sizeof(*kv));
    ASSERT(type >= 0 && type < ENGINE_KV_TYPE_COUNT);
    ASSERT(n_parts >= 1 && part >= 0 && part < n_parts && n_blocks % n_parts == 0);
    kv->type = type;
    kv->n_layer = n_layer;
    kv->n_blocks = n_blocks;
    kv->n_parts = n_parts;
    kv->part = part;
    kv->n_local = n_blocks / n_parts;
    kv->block_size = block_size;
    kv->n_head_kv = n_head_kv;
    kv->head_dim = head_dim;
    kv->tile_bytes = kv_tile_bytes(type, head_dim, block_size);
    kv->block_bytes = (size_t)n_head_kv * kv->tile_bytes;
    size_t n = (size_t)n_layer * (size_t)kv->n_local * kv->block_bytes;
    kv->pool_bytes = n;
    kv->k = pool_alloc(n);
    kv->v = pool_alloc(n);
    if (!kv->k || !kv->v) {
        LOG_ERROR("%s: cannot allocate %zu MiB of %s KV storage for %d blocks", __func__,
                  2 * n >> 20, engine_kv_type_name(type), kv->n_local);
        kv_free(kv);
        return ERR_NOMEM;
    }
    return 0;
}

void kv_free(struct kv_store *kv) {
    pool_free(kv->k, kv->pool_bytes);
    pool_free(kv->v, kv->pool_bytes);
    kv->k = kv->v = NULL;
}

/* d and q of one group of n values (n <= 32), GGUF Q8_0's rule. */
static float quantize_group(const float *x, int32_t n, int8_t *q, int32_t q_stride) {
    float amax = 0.0f;
    for (int32_t i = 0; i < n; i++) amax = fabsf(x[i]) > amax ? fabsf(x[i]) : amax;
    const float d = amax / 127.0f;
    const float id = d > 0.0f ? 1.0f / d : 0.0f;
    for (int32_t i = 0; i < n; i++) q[(size_t)i * q_stride] = (int8_t)lrintf(x[i] * id);
    return d;
}

void kv_write_token(const struct kv_store *kv, int32_t il, int32_t block, int32_t slot,
                    const float *k, const float *v) {
    kv_write_heads(kv, il, block, slot, 0, kv->n_head_kv, k, v);
}

void kv_write_heads(const struct kv_store *kv, int32_t il, int32_t block, int32_t slot,
                    int32_t h0, int32_t h1, const float *k, const float *v) {
    const int32_t hd = kv->head_dim;
    const int32_t bs = kv->block_size;
    const int32_t ng = n_groups(hd);
    ASSERT(h0 >= 0 && h0 <= h1 && h1 <= kv->n_head_kv);
    for (int32_t h = h0; h < h1; h++) {
        const float *kh = k + (size_t)h * hd;
        const float *vh = v + (size_t)h * hd;
        void *kt = kv_k_tile(kv, il, block, h);
        void *vt = kv_v_tile(kv, il, block, h);
        switch (kv->type) {
        case ENGINE_KV_TYPE_F32: {
            float *kf = kt;  // [hd][bs]: column `slot`
            for (int32_t d = 0; d < hd; d++) kf[(size_t)d * bs + slot] = kh[d];
            memcpy((float *)vt + (size_t)slot * hd, vh, (size_t)hd * sizeof(float));
            break;
        }
        case ENGINE_KV_TYPE_F16: {
            // converted by the kernels (F16C: one instruction per 8 values, the
            // scalar rounding was 7% of a 32-sequence decode step), K through a
            // buffer because its column is strided
            const kern_from_f32_fn to_f16 = kern_get()->f32_to_f16;
            uint16_t *kf = kt;
            uint16_t kbuf[64];
            for (int32_t d0 = 0; d0 < hd; d0 += 64) {
                const int32_t n = hd - d0 < 64 ? hd - d0 : 64;
                to_f16(kh + d0, kbuf, n);
                for (int32_t d = 0; d < n; d++) kf[(size_t)(d0 + d) * bs + slot] = kbuf[d];
            }
            to_f16(vh, (uint16_t *)vt + (size_t)slot * hd, hd);
            break;
        }
        case ENGINE_KV_TYPE_Q8_0: {
            float *kd = kt;                                    // [ng][bs]
            int8_t *kq = (int8_t *)(kd + (size_t)ng * bs);     // [hd][bs]
            float *vd = vt;                                    // [bs][ng]
            int8_t *vq = (int8_t *)(vd + (size_t)ng * bs);     // [bs][hd]
            for (int32_t g = 0; g < ng; g++) {
                const int32_t d0 = g * KV_Q8_0_GROUP;
                const int32_t n = hd - d0 < KV_Q8_0_GROUP ? hd - d0 : KV_Q8_0_GROUP;
                kd[(size_t)g * bs + slot] =
                    quantize_group(kh + d0, n, kq + (size_t)d0 * bs + slot, bs);
                vd[(size_t)slot * ng + g] =
                    quantize_group(vh + d0, n, vq + (size_t)slot * hd + d0, 1);
            }
            break;
        }
        case ENGINE_KV_TYPE_COUNT: UNREACHABLE();
        }
    }
}

void kv_read_token(const struct kv_store *kv, int32_t il, int32_t block, int32_t slot, float *k,
                   float *v) {
    const int32_t hd = kv->head_dim;
    const int32_t bs = kv->block_size;
    const int32_t ng = n_groups(hd);
    for (int32_t h = 0; h < kv->n_head_kv; h++) {
        float *kh = k + (size_t)h * hd;
        float *vh = v + (size_t)h * hd;
        const void *kt = kv_k_tile(kv, il, block, h);
        const void *vt = kv_v_tile(kv, il, block, h);
        for (int32_t d = 0; d < hd; d++) {
            switch (kv->type) {
            case ENGINE_KV_TYPE_F32:
                kh[d] = ((const float *)kt)[(size_t)d * bs + slot];
                vh[d] = ((const float *)vt)[(size_t)slot * hd + d];
                break;
            case ENGINE_KV_TYPE_F16:
                kh[d] = quant_f16_to_f32(((const uint16_t *)kt)[(size_t)d * bs + slot]);
                vh[d] = quant_f16_to_f32(((const uint16_t *)vt)[(size_t)slot * hd + d]);
                break;
            case ENGINE_KV_TYPE_Q8_0: {
                const float *kd = kt;
                const int8_t *kq = (const int8_t *)(kd + (size_t)ng * bs);
                const float *vd = vt;
                const int8_t *vq = (const int8_t *)(vd + (size_t)ng * bs);
                const int32_t g = d / KV_Q8_0_GROUP;
                kh[d] = kd[(size_t)g * bs + slot] * (float)kq[(size_t)d * bs + slot];
                vh[d] = vd[(size_t)slot * ng + g] * (float)vq[(size_t)slot * hd + d];
                break;
            }
            case ENGINE_KV_TYPE_COUNT: UNREACHABLE();
            }
        }
    }
}
