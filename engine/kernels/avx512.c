/*
 * avx512.c - AVX-512 (F, BW, VL) quantized dot products, compiled twice by
 * engine/meson.build: once as kern_avx512_* and once with -mavx512vnni
 * -DKERN_VNNI as kern_vnni_*, where the byte products accumulate with
 * vpdpbusd instead of vpmaddubsw + vpmaddwd. Only called after
 * kern_dispatch_init() found the features. Two 32-element blocks fill one
 * 512-bit register; eight blocks per step share one conversion of their
 * half-precision scales (scalar conversions per block cost more than the
 * integer work); an odd last block goes through the reference kernel.
 * The integer sums equal kernels/ref.c's exactly.
 */
#include <immintrin.h>
#include <string.h>

#include "engine/kernels/kernels.h"
#include "engine/format/quant.h"

#ifdef KERN_VNNI
#define KFN(name) kern_vnni_##name
/* acc + sum of 4 adjacent u8 * s8 products per int32 lane. */
static __m512i dot_u8s8(__m512i acc, __m512i u, __m512i s) { return _mm512_dpbusd_epi32(acc, u, s); }
#else
#define KFN(name) kern_avx512_##name
static __m512i dot_u8s8(__m512i acc, __m512i u, __m512i s) {
    __m512i p = _mm512_madd_epi16(_mm512_maddubs_epi16(u, s), _mm512_set1_epi16(1));
    return _mm512_add_epi32(acc, p);
}
#endif

/* Signed w * x: |w| times x negated where w < 0. */
static __m512i dot_s8s8(__m512i w, __m512i x) {
    __mmask64 neg = _mm512_movepi8_mask(w);
    __m512i sx = _mm512_mask_sub_epi8(x, neg, _mm512_setzero_si512(), x);
    return dot_u8s8(_mm512_setzero_si512(), _mm512_abs_epi8(w), sx);
}

static __m512i load2x256(const void *lo, const void *hi) {
    __m512i v = _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)lo));
    return _mm512_inserti64x4(v, _mm256_loadu_si256((const __m256i *)hi), 1);
}

static __m512 scale2(float d0, float d1) {
    return _mm512_mask_blend_ps(0xff00, _mm512_set1_ps(d0), _mm512_set1_ps(d1));
}

static float h2f(uint16_t h) { return _cvtsh_ss(h); }

/* d of 8 consecutive blocks (the leading f16 of each, stride bytes apart) times
 * the same of the activation blocks: 8 floats. */
static __m256 scales8(const uint8_t *w, const uint8_t *x, size_t wstride, size_t xstride) {
    uint16_t hw[8], hx[8];
    for (int i = 0; i < 8; i++) {
        memcpy(&hw[i], w + (size_t)i * wstride, 2);
        memcpy(&hx[i], x + (size_t)i * xstride, 2);
    }
    __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)hw));
    __m256 dx = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)hx));
    return _mm256_mul_ps(dw, dx);
}

/* Lanes 0..7 = d[2p], lanes 8..15 = d[2p + 1]. */
static __m512 pair_scale(__m512 d, int p) {
    const __m512i idx = _mm512_set_epi32(2 * p + 1, 2 * p + 1, 2 * p + 1, 2 * p + 1, 2 * p + 1,
                                         2 * p + 1, 2 * p + 1, 2 * p + 1, 2 * p, 2 * p, 2 * p,
                                         2 * p, 2 * p, 2 * p, 2 * p, 2 * p);
    return _mm512_permutexvar_ps(idx, d);
}

/* 64 unpacked 4-bit weights minus 8 of blocks a[0], a[1] in element order. */
static __m512i q4_0_pair(const struct block_q4_0 *a) {
    const __m256i m4 = _mm256_set1_epi8(15);
    __m256i v = _mm256_set_m128i(_mm_loadu_si128((const __m128i *)a[1].qs),
                                 _mm_loadu_si128((const __m128i *)a[0].qs));
    __m256i lo = _mm256_and_si256(v, m4);
    __m256i hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
    __m512i q = _mm512_castsi256_si512(_mm256_permute2x128_si256(lo, hi, 0x20));
    q = _mm512_inserti64x4(q, _mm256_permute2x128_si256(lo, hi, 0x31), 1);
    return _mm512_sub_epi8(q, _mm512_set1_epi8(8));
}

float KFN(vec_dot_q8_0)(const void *restrict w, const void *restrict xq, int64_t n) {
    const struct block_q8_0 *a = w;
    const struct block_q8_0 *b = xq;
    const int64_t nb = n / QK8_0;
    __m512 acc = _mm512_setzero_ps();
    int64_t ib = 0;
    for (; ib + 8 <= nb; ib += 8) {
        __m512 d = _mm512_castps256_ps512(scales8((const uint8_t *)(a + ib),
                                                  (const uint8_t *)(b + ib), sizeof(*a),
                                                  sizeof(*b)));
        for (int p = 0; p < 4; p++) {
            __m512i qa = load2x256(a[ib + 2 * p].qs, a[ib + 2 * p + 1].qs);
            __m512i qb = load2x256(b[ib + 2 * p].qs, b[ib + 2 * p + 1].qs);
            acc = _mm512_fmadd_ps(pair_scale(d, p), _mm512_cvtepi32_ps(dot_s8s8(qa, qb)), acc);
        }
    }
    for (; ib + 2 <= nb; ib += 2) {
        __m512i qa = load2x256(a[ib].qs, a[ib + 1].qs);
        __m512i qb = load2x256(b[ib].qs, b[ib + 1].qs);
        __m512 d = scale2(h2f(a[ib].d) * h2f(b[ib].d), h2f(a[ib + 1].d) * h2f(b[ib + 1].d));
        acc = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(dot_s8s8(qa, qb)), acc);
    }
    float sum = _mm512_reduce_add_ps(acc);
    if (ib < nb) sum += kern_ref_vec_dot_q8_0(a + ib, b + ib, QK8_0);
    return sum;
}

float KFN(vec_dot_q4_0)(const void *restrict w, const void *restrict xq, int64_t n) {
    const struct block_q4_0 *a = w;
    const struct block_q8_0 *b = xq;
    const int64_t nb = n / QK4_0;
    __m512 acc = _mm512_setzero_ps();
    int64_t ib = 0;
    for (; ib + 8 <= nb; ib += 8) {
        __m512 d = _mm512_castps256_ps512(scales8((const uint8_t *)(a + ib),
                                                  (const uint8_t *)(b + ib), sizeof(*a),
                                                  sizeof(*b)));
        for (int p = 0; p < 4; p++) {
            __m512i q = q4_0_pair(a + ib + 2 * p);
            __m512i qb = load2x256(b[ib + 2 * p].qs, b[ib + 2 * p + 1].qs);
            acc = _mm512_fmadd_ps(pair_scale(d, p), _mm512_cvtepi32_ps(dot_s8s8(q, qb)), acc);
        }
    }
    for (; ib + 2 <= nb; ib += 2) {
        // [block 0 low nibbles, block 0 high, block 1 low, block 1 high]
        __m512i q = q4_0_pair(a + ib);
        __m512i qb = load2x256(b[ib].qs, b[ib + 1].qs);
        __m512 d = scale2(h2f(a[ib].d) * h2f(b[ib].d), h2f(a[ib + 1].d) * h2f(b[ib + 1].d));
        acc = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(dot_s8s8(q, qb)), acc);
    }
    float sum = _mm512_reduce_add_ps(acc);
    if (ib < nb) sum += kern_ref_vec_dot_q4_0(a + ib, b + ib, QK4_0);
    return sum;
}
