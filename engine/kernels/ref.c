/*
 * ref.c - portable reference kernels: the oracles every SIMD path is tested
 * against, and the fallback on CPUs without AVX2.
 */
#include "engine/kernels/kernels.h"
#include "engine/quant.h"

void kern_ref_f16_to_f32(const void *restrict src, float *restrict dst, int64_t n) {
    const uint16_t *s = src;
    for (int64_t i = 0; i < n; i++) dst[i] = quant_f16_to_f32(s[i]);
}

void kern_ref_bf16_to_f32(const void *restrict src, float *restrict dst, int64_t n) {
    const uint16_t *s = src;
    for (int64_t i = 0; i < n; i++) dst[i] = quant_bf16_to_f32(s[i]);
}

float kern_ref_dot_f32(const float *restrict a, const float *restrict b, int64_t n) {
    float sum = 0.0f;
    for (int64_t i = 0; i < n; i++) sum += a[i] * b[i];
    return sum;
}

float kern_ref_dot_f16(const void *restrict w, const float *restrict x, int64_t n) {
    const uint16_t *h = w;
    float sum = 0.0f;
    for (int64_t i = 0; i < n; i++) sum += quant_f16_to_f32(h[i]) * x[i];
    return sum;
}

float kern_ref_dot_bf16(const void *restrict w, const float *restrict x, int64_t n) {
    const uint16_t *h = w;
    float sum = 0.0f;
    for (int64_t i = 0; i < n; i++) sum += quant_bf16_to_f32(h[i]) * x[i];
    return sum;
}
