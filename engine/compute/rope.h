/*
 * rope.h - rotary position embeddings, in the two layouts GGUF models use.
 * Pure functions; any thread.
 */
#ifndef LLMSERVE_ROPE_H
#define LLMSERVE_ROPE_H

#include <stdint.h>

#include "engine/model/arch.h"

/* cos/sin of pos * inv_freq[i] for i < n_pairs, computed in double. */
void rope_cache(const float *inv_freq, int32_t n_pairs, int32_t pos, float *cos_out,
                float *sin_out);

/* Rotates the first n_rot dims of each of n_heads heads of x [n_heads][head_dim]
 * by the angles of one position (cos/sin [n_rot / 2]). NORMAL rotates the
 * pairs (2i, 2i+1), NEOX the pairs (i, i + n_rot/2). */
void rope_apply(float *x, int32_t n_heads, int32_t head_dim, int32_t n_rot, const float *cos_t,
                const float *sin_t, enum arch_rope layout);

#endif
