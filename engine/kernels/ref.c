/*
 * ref.c - portable reference kernels: the oracles every SIMD path is tested
 * against, and the fallback on CPUs without AVX2.
 */
#include "engine/kernels/kernels.h"

#include <math.h>
#include "engine/format/quant.h"

void kern_ref_f16_to_f32(const void *restrict src, float *restrict dst, int64_t n) {
    const uint16_t *s = src;
    for (int64_t i = 0; i < n; i++) dst[i] = quant_f16_to_f32(s[i]);
}

void kern_ref_f32_to_f16(const float *restrict src, void *restrict dst, int64_t n) {
    uint16_t *d = dst;
    for (int64_t i = 0; i < n; i++) d[i] = quant_f32_to_f16(src[i]);
}

void kern_ref_bf16_to_f32(const void *restrict src, float *restrict dst, int64_t n) {
    const uint16_t *s = src;
    for (int64_t i = 0; i < n; i++) dst[i] = quant_bf16_to_f32(s[i]);
}

/* exp(x) for x <= 0, kern_exp_neg_avx2's operations (kernels/exp_avx2.h) in
 * scalar: 2^n e^f, n = round(x / ln 2) (to nearest even), f = x - n ln 2 in
 * two parts, |f| <= ln 2 / 2, e^f by its degree-6 Taylor polynomial (Horner,
 * fused multiply-adds), 2^n applied by ldexpf (exact, or one correct
 * rounding into the subnormals). x < -87 gives 0, a NaN is taken as -87. */
static float exp_nonpositive(float x) {
    if (x < -87.0f) return 0.0f;
    if (!(x >= -87.0f)) x = -87.0f;  // NaN
    const float n = nearbyintf(x * 1.44269504088896341f);
    float f = fmaf(-n, 0.693145751953125f, x);
    f = fmaf(-n, 1.428606765330187045e-06f, f);
    float p = 1.0f / 720.0f;
    p = fmaf(p, f, 1.0f / 120.0f);
    p = fmaf(p, f, 1.0f / 24.0f);
    p = fmaf(p, f, 1.0f / 6.0f);
    p = fmaf(p, f, 0.5f);
    p = fmaf(p, f, 1.0f);
    p = fmaf(p, f, 1.0f);
    return ldexpf(p, (int)n);
}

void kern_ref_swiglu(float *restrict g, const float *restrict u, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        const float z = g[i];
        const float e = exp_nonpositive(-fabsf(z));
        const float s = (z >= 0.0f ? 1.0f : e) / (1.0f + e);
        g[i] = z * s * u[i];
    }
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

/* ---- quantized dot products: weight row x activation row of its partner type
 * (quant_traits()->vec_dot_type). Integer sums per (sub-)block, one float
 * multiply-add per block; the SIMD paths compute the same integer sums. */

static float h2f(uint16_t h) { return quant_f16_to_f32(h); }

float kern_ref_vec_dot_q8_0(const void *restrict w, const void *restrict xq, int64_t n) {
    const struct block_q8_0 *a = w;
    const struct block_q8_0 *b = xq;
    float sum = 0.0f;
    for (int64_t ib = 0; ib < n / QK8_0; ib++) {
        int32_t s = 0;
        for (int l = 0; l < QK8_0; l++) s += a[ib].qs[l] * b[ib].qs[l];
        sum += h2f(a[ib].d) * h2f(b[ib].d) * (float)s;
    }
    return sum;
}

float kern_ref_vec_dot_q4_0(const void *restrict w, const void *restrict xq, int64_t n) {
    const struct block_q4_0 *a = w;
    const struct block_q8_0 *b = xq;
    float sum = 0.0f;
    for (int64_t ib = 0; ib < n / QK4_0; ib++) {
        int32_t s = 0;
        for (int l = 0; l < 16; l++) {
            s += ((a[ib].qs[l] & 15) - 8) * b[ib].qs[l];
            s += ((a[ib].qs[l] >> 4) - 8) * b[ib].qs[l + 16];
        }
        sum += h2f(a[ib].d) * h2f(b[ib].d) * (float)s;
    }
    return sum;
}

float kern_ref_vec_dot_q4_1(const void *restrict w, const void *restrict xq, int64_t n) {
    const struct block_q4_1 *a = w;
    const struct block_q8_1 *b = xq;
    float sum = 0.0f;
    for (int64_t ib = 0; ib < n / QK4_1; ib++) {
        int32_t s = 0, sx = 0;
        for (int l = 0; l < 16; l++) {
            s += (a[ib].qs[l] & 15) * b[ib].qs[l];
            s += (a[ib].qs[l] >> 4) * b[ib].qs[l + 16];
            sx += b[ib].qs[l] + b[ib].qs[l + 16];
        }
        // NOTE: the min term uses the exact sum of qs, not the f16 s field, so
        // the result equals the dot of the dequantized rows (as the sgemm path).
        const float dx = h2f(b[ib].d);
        sum += dx * (h2f(a[ib].d) * (float)s + h2f(a[ib].m) * (float)sx);
    }
    return sum;
}

static uint32_t qh_bits(const uint8_t qh[4]) {
    return (uint32_t)qh[0] | (uint32_t)qh[1] << 8 | (uint32_t)qh[2] << 16 | (uint32_t)qh[3] << 24;
}

float kern_ref_vec_dot_q5_0(const void *restrict w, const void *restrict xq, int64_t n) {
    const struct block_q5_0 *a = w;
    const struct block_q8_0 *b = xq;
    float sum = 0.0f;
    for (int64_t ib = 0; ib < n / QK5_0; ib++) {
        const uint32_t qh = qh_bits(a[ib].qh);
        int32_t s = 0;
        for (int l = 0; l < 16; l++) {
            int lo = (a[ib].qs[l] & 15) | (int)((qh >> l) & 1) << 4;
            int hi = (a[ib].qs[l] >> 4) | (int)((qh >> (l + 16)) & 1) << 4;
            s += (lo - 16) * b[ib].qs[l] + (hi - 16) * b[ib].qs[l + 16];
        }
        sum += h2f(a[ib].d) * h2f(b[ib].d) * (float)s;
    }
    return sum;
}

float kern_ref_vec_dot_q5_1(const void *restrict w, const void *restrict xq, int64_t n) {
    const struct block_q5_1 *a = w;
    const struct block_q8_1 *b = xq;
    float sum = 0.0f;
    for (int64_t ib = 0; ib < n / QK5_1; ib++) {
        const uint32_t qh = qh_bits(a[ib].qh);
        int32_t s = 0, sx = 0;
        for (int l = 0; l < 16; l++) {
            int lo = (a[ib].qs[l] & 15) | (int)((qh >> l) & 1) << 4;
            int hi = (a[ib].qs[l] >> 4) | (int)((qh >> (l + 16)) & 1) << 4;
            s += lo * b[ib].qs[l] + hi * b[ib].qs[l + 16];
            sx += b[ib].qs[l] + b[ib].qs[l + 16];
        }
        const float dx = h2f(b[ib].d);
        sum += dx * (h2f(a[ib].d) * (float)s + h2f(a[ib].m) * (float)sx);
    }
    return sum;
}

float kern_ref_vec_dot_q2_K(const void *restrict w, const void *restrict xq, int64_t n) {
    const struct block_q2_K *a = w;
    const struct block_q8_K *b = xq;
    float sum = 0.0f;
    for (int64_t ib = 0; ib < n / QK_K; ib++) {
        int32_t s = 0, smin = 0;
        for (int j = 0; j < 16; j++) {
            int32_t sj = 0;
            for (int l = 0; l < 16; l++) {
                int i = 16 * j + l;
                int q = (a[ib].qs[32 * (i / 128) + i % 32] >> (2 * ((i % 128) / 32))) & 3;
                sj += q * b[ib].qs[i];
            }
            s += (a[ib].scales[j] & 15) * sj;
            smin += (a[ib].scales[j] >> 4) * b[ib].bsums[j];
        }
        sum += b[ib].d * (h2f(a[ib].d) * (float)s - h2f(a[ib].dmin) * (float)smin);
    }
    return sum;
}

float kern_ref_vec_dot_q3_K(const void *restrict w, const void *restrict xq, int64_t n) {
    const struct block_q3_K *a = w;
    const struct block_q8_K *b = xq;
    float sum = 0.0f;
    for (int64_t ib = 0; ib < n / QK_K; ib++) {
        const uint8_t *sc = a[ib].scales;
        int32_t s = 0;
        for (int j = 0; j < 16; j++) {
            int scale = (((sc[j % 8] >> (4 * (j / 8))) & 15) | ((sc[8 + j % 4] >> (2 * (j / 4))) & 3) << 4) - 32;
            int32_t sj = 0;
            for (int l = 0; l < 16; l++) {
                int i = 16 * j + l;
                int q = (a[ib].qs[32 * (i / 128) + i % 32] >> (2 * ((i % 128) / 32))) & 3;
                q |= ((a[ib].hmask[i % 32] >> (i / 32)) & 1) << 2;
                sj += (q - 4) * b[ib].qs[i];
            }
            s += scale * sj;
        }
        sum += b[ib].d * h2f(a[ib].d) * (float)s;
    }
    return sum;
}

float kern_ref_vec_dot_q4_K(const void *restrict w, const void *restrict xq, int64_t n) {
    const struct block_q4_K *a = w;
    const struct block_q8_K *b = xq;
    float sum = 0.0f;
    for (int64_t ib = 0; ib < n / QK_K; ib++) {
        int32_t s = 0, smin = 0;
        for (int j = 0; j < 8; j++) {
            uint8_t sc, m;
            quant_get_scale_min_k4(j, a[ib].scales, &sc, &m);
            const uint8_t *q = a[ib].qs + 32 * (j / 2);
            int32_t sj = 0;
            for (int l = 0; l < 32; l++) sj += ((q[l] >> (4 * (j % 2))) & 15) * b[ib].qs[32 * j + l];
            s += sc * sj;
            smin += m * (b[ib].bsums[2 * j] + b[ib].bsums[2 * j + 1]);
        }
        sum += b[ib].d * (h2f(a[ib].d) * (float)s - h2f(a[ib].dmin) * (float)smin);
    }
    return sum;
}

float kern_ref_vec_dot_q5_K(const void *restrict w, const void *restrict xq, int64_t n) {
    const struct block_q5_K *a = w;
    const struct block_q8_K *b = xq;
    float sum = 0.0f;
    for (int64_t ib = 0; ib < n / QK_K; ib++) {
        int32_t s = 0, smin = 0;
        for (int j = 0; j < 8; j++) {
            uint8_t sc, m;
            quant_get_scale_min_k4(j, a[ib].scales, &sc, &m);
            const uint8_t *q = a[ib].qs + 32 * (j / 2);
            int32_t sj = 0;
            for (int l = 0; l < 32; l++) {
                int v = ((q[l] >> (4 * (j % 2))) & 15) | ((a[ib].qh[l] >> j) & 1) << 4;
                sj += v * b[ib].qs[32 * j + l];
            }
            s += sc * sj;
            smin += m * (b[ib].bsums[2 * j] + b[ib].bsums[2 * j + 1]);
        }
        sum += b[ib].d * (h2f(a[ib].d) * (float)s - h2f(a[ib].dmin) * (float)smin);
    }
    return sum;
}

float kern_ref_vec_dot_q6_K(const void *restrict w, const void *restrict xq, int64_t n) {
    const struct block_q6_K *a = w;
    const struct block_q8_K *b = xq;
    float sum = 0.0f;
    for (int64_t ib = 0; ib < n / QK_K; ib++) {
        int32_t s = 0;
        for (int j = 0; j < 16; j++) {
            int32_t sj = 0;
            for (int l = 0; l < 16; l++) {
                int i = 16 * j + l;
                int h = i / 128, c = (i % 128) / 32, e = i % 32;
                int lo = (a[ib].ql[64 * h + e + 32 * (c % 2)] >> (4 * (c / 2))) & 15;
                int hi = (a[ib].qh[32 * h + e] >> (2 * c)) & 3;
                sj += ((lo | hi << 4) - 32) * b[ib].qs[i];
            }
            s += a[ib].scales[j] * sj;
        }
        sum += b[ib].d * h2f(a[ib].d) * (float)s;
    }
    return sum;
}
