/*
 * kv_type.h - how K and V are stored in the KV pool: the type enum of the
 * public API (engine.h includes this header), its names, and the Q8_0 group
 * size. The one place below both the facade and engine/compute/kv.c, so that
 * the KV store, the attention kernels and the facade name the types alike
 * without including one another. engine/compute/kv.h has the exact layouts.
 */
#ifndef LLMSERVE_KV_TYPE_H
#define LLMSERVE_KV_TYPE_H

/* Per token, layer and kv head (K and V together, hd = head_dim):
 *   F32:  8 * hd bytes
 *   F16:  4 * hd bytes (IEEE half)
 *   Q8_0: 2 * (hd + 4 * ceil(hd / 32)) bytes: int8 values with one f32 scale
 *         per 32 values along head_dim (GGUF Q8_0 style), e.g. 272 for hd 128 */
enum engine_kv_type {
    ENGINE_KV_TYPE_F32,
    ENGINE_KV_TYPE_F16,
    ENGINE_KV_TYPE_Q8_0,
    ENGINE_KV_TYPE_COUNT,
};

#define KV_Q8_0_GROUP 32  // values per scale along head_dim (QK8_0)

/* "f32", "f16" or "q8_0" (llama.cpp's --cache-type-k names); "?" for a value
 * outside the enum. [any thread] */
const char *engine_kv_type_name(enum engine_kv_type t);

/* Parses one of those names into *out. Returns 0, or ERR_INVAL for anything
 * else, NULL included (not logged: the caller names the flag). [any thread] */
int engine_kv_type_parse(const char *name, enum engine_kv_type *out);

#endif
