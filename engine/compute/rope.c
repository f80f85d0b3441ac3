/*
 * rope.c - RoPE (Su et al., "RoFormer", 2021): the pair (a, b) at frequency i
 * turns by theta_i = pos * inv_freq[i]: (a cos - b sin, a sin + b cos).
 * Scaling (linear factor, Llama 3 per-pair factors) is folded into inv_freq
 * at load time (engine/model.c).
 */
#include "engine/compute/rope.h"

#include <math.h>

void rope_cache(const float *inv_freq, int32_t n_pairs, int32_t pos, float *cos_out,
                float *sin_out) {
    for (int32_t i = 0; i < n_pairs; i++) {
        double theta = (double)pos * (double)inv_freq[i];
        cos_out[i] = (float)cos(theta);
        sin_out[i] = (float)sin(theta);
    }
}

void rope_apply(float *x, int32_t n_heads, int32_t head_dim, int32_t n_rot, const float *cos_t,
                const float *sin_t, enum arch_rope layout) {
    const int32_t half = n_rot / 2;
    for (int32_t h = 0; h < n_heads; h++) {
        float *xh = x + (int64_t)h * head_dim;
        for (int32_t i = 0; i < half; i++) {
            int32_t ia = layout == ARCH_ROPE_NORMAL ? 2 * i : i;
            int32_t ib = layout == ARCH_ROPE_NORMAL ? 2 * i + 1 : i + half;
            float a = xh[ia];
            float b = xh[ib];
            xh[ia] = a * cos_t[i] - b * sin_t[i];
            xh[ib] = a * sin_t[i] + b * cos_t[i];
        }
    }
}
