/*
 * avx2.c - AVX2 + FMA + F16C kernels. Compiled with -mavx2 -mfma -mf16c and
 * only ever called after kern_dispatch_init() found those features.
 */
#include <immintrin.h>
#include <string.h>

#include "engine/kernels/exp_avx2.h"
#include "engine/kernels/kernels.h"
#include "engine/format/quant.h"

void kern_avx2_f16_to_f32(const void *restrict src, float *restrict dst, int64_t n) {
    const uint16_t *s = src;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m128i h = _mm_loadu_si128((const __m128i *)(s + i));
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(h));
    }
    for (; i < n; i++) dst[i] = quant_f16_to_f32(s[i]);
}

/* kern_ref_swiglu on 8 lanes, the same operations in the same order;
 * the tail goes through the portable loop itself. */
void kern_avx2_swiglu(float *restrict g, const float *restrict u, int64_t n) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    const __m256 one = _mm256_set1_ps(1.0f);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 z = _mm256_loadu_ps(g + i);
        const __m256 e = kern_exp_neg_avx2(_mm256_or_ps(z, sign));  // exp(-|z|)
        const __m256 pos = _mm256_cmp_ps(z, _mm256_setzero_ps(), _CMP_GE_OQ);
        const __m256 s = _mm256_div_ps(_mm256_blendv_ps(e, one, pos), _mm256_add_ps(one, e));
        _mm256_storeu_ps(g + i, _mm256_mul_ps(_mm256_mul_ps(z, s), _mm256_loadu_ps(u + i)));
    }
    kern_ref_swiglu(g + i, u + i, n - i);
}

/* vcvtps2ph rounds to nearest even and gets subnormals and infinities right,
 * as quant_f32_to_f16 does; a NaN keeps part of its payload there, so NaN
 * lanes are replaced by quant_f32_to_f16's quiet NaN (sign | 0x7e00). */
void kern_avx2_f32_to_f16(const float *restrict src, void *restrict dst, int64_t n) {
    uint16_t *d = dst;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 x = _mm256_loadu_ps(src + i);
        __m128i h = _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        const __m256 nan = _mm256_cmp_ps(x, x, _CMP_UNORD_Q);
        if (_mm256_movemask_ps(nan)) {
            const __m256i nan32 = _mm256_castps_si256(nan);
            const __m128i nan16 = _mm_packs_epi32(_mm256_castsi256_si128(nan32),
                                                  _mm256_extractf128_si256(nan32, 1));
            const __m128i sign = _mm_and_si128(h, _mm_set1_epi16((short)0x8000));
            const __m128i qnan = _mm_or_si128(sign, _mm_set1_epi16(0x7e00));
            h = _mm_blendv_epi8(h, qnan, nan16);
        }
        _mm_storeu_si128((__m128i *)(d + i), h);
    }
    for (; i < n; i++) d[i] = quant_f32_to_f16(src[i]);
}

void kern_avx2_bf16_to_f32(const void *restrict src, float *restrict dst, int64_t n) {
    const uint16_t *s = src;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m128i h = _mm_loadu_si128((const __m128i *)(s + i));
        __m256i w = _mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16);
        _mm256_storeu_ps(dst + i, _mm256_castsi256_ps(w));
    }
    for (; i < n; i++) dst[i] = quant_bf16_to_f32(s[i]);
}

static float hsum256(__m256 v) {
    __m128 lo = _mm256_castps256_ps128(v);
    __m128 hi = _mm256_extractf128_ps(v, 1);
    lo = _mm_add_ps(lo, hi);
    lo = _mm_hadd_ps(lo, lo);
    lo = _mm_hadd_ps(lo, lo);
    return _mm_cvtss_f32(lo);
}

float kern_avx2_dot_f32(const float *restrict a, const float *restrict b, int64_t n) {
    __m256 acc0 = _mm256_setzero_ps();
    __m256 acc1 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
        acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), acc1);
    }
    for (; i + 8 <= n; i += 8) {
        acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
    }
    float sum = hsum256(_mm256_add_ps(acc0, acc1));
    for (; i < n; i++) sum += a[i] * b[i];
    return sum;
}

float kern_avx2_dot_f16(const void *restrict w, const float *restrict x, int64_t n) {
    const uint16_t *h = w;
    __m256 acc0 = _mm256_setzero_ps();
    __m256 acc1 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256 w0 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(h + i)));
        __m256 w1 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(h + i + 8)));
        acc0 = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x + i), acc0);
        acc1 = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x + i + 8), acc1);
    }
    float sum = hsum256(_mm256_add_ps(acc0, acc1));
    for (; i < n; i++) sum += quant_f16_to_f32(h[i]) * x[i];
    return sum;
}

float kern_avx2_dot_bf16(const void *restrict w, const float *restrict x, int64_t n) {
    const uint16_t *h = w;
    __m256 acc0 = _mm256_setzero_ps();
    __m256 acc1 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256i a = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(h + i)));
        __m256i b = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(h + i + 8)));
        __m256 w0 = _mm256_castsi256_ps(_mm256_slli_epi32(a, 16));
        __m256 w1 = _mm256_castsi256_ps(_mm256_slli_epi32(b, 16));
        acc0 = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x + i), acc0);
        acc1 = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x + i + 8), acc1);
    }
    float sum = hsum256(_mm256_add_ps(acc0, acc1));
    for (; i < n; i++) sum += quant_bf16_to_f32(h[i]) * x[i];
    return sum;
}

/* ---- quantized dot products (same integer sums as kernels/ref.c) ------------
 *
 * Signed int8 x int8 products use the sign trick: maddubs multiplies unsigned
 * by signed bytes, so |w| times (x with w's sign) gives w * x. Weights of
 * -128 (never written by our quantizer) can saturate a 16-bit pair sum. */

static float h2f(uint16_t h) { return _cvtsh_ss(h); }

static __m256i dot_i8_pairs(__m256i w, __m256i x) {  // 8 x int32 partial sums of w * x
    __m256i p = _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w));
    return _mm256_madd_epi16(p, _mm256_set1_epi16(1));
}

float kern_avx2_vec_dot_q8_0(const void *restrict w, const void *restrict xq, int64_t n) {
    const struct block_q8_0 *a = w;
    const struct block_q8_0 *b = xq;
    __m256 acc = _mm256_setzero_ps();
    for (int64_t ib = 0; ib < n / QK8_0; ib++) {
        __m256i qa = _mm256_loadu_si256((const __m256i *)a[ib].qs);
        __m256i qb = _mm256_loadu_si256((const __m256i *)b[ib].qs);
        __m256 d = _mm256_set1_ps(h2f(a[ib].d) * h2f(b[ib].d));
        acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(dot_i8_pairs(qa, qb)), acc);
    }
    return hsum256(acc);
}

/* 16 bytes of nibbles -> 32 bytes: low nibbles (elements 0..15), then high. */
static __m256i unpack_nibbles(const uint8_t *qs) {
    __m128i v = _mm_loadu_si128((const __m128i *)qs);
    __m128i m = _mm_set1_epi8(15);
    return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(v, 4), m), _mm_and_si128(v, m));
}

float kern_avx2_vec_dot_q4_0(const void *restrict w, const void *restrict xq, int64_t n) {
    const struct block_q4_0 *a = w;
    const struct block_q8_0 *b = xq;
    __m256 acc = _mm256_setzero_ps();
    const __m256i eight = _mm256_set1_epi8(8);
    for (int64_t ib = 0; ib < n / QK4_0; ib++) {
        __m256i qa = _mm256_sub_epi8(unpack_nibbles(a[ib].qs), eight);
        __m256i qb = _mm256_loadu_si256((const __m256i *)b[ib].qs);
        __m256 d = _mm256_set1_ps(h2f(a[ib].d) * h2f(b[ib].d));
        acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(dot_i8_pairs(qa, qb)), acc);
    }
    return hsum256(acc);
}

/* The 5th bits of a q5 block as 0x10 bytes, element order. */
static __m256i q5_high_bits(const uint8_t qh[4]) {
    uint32_t bits;
    memcpy(&bits, qh, 4);
    // byte i of the result takes bit i of bits: spread the 4 bytes, test one bit each
    const __m256i shuf = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202,
                                           0x0101010101010101, 0x0000000000000000);
    __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32((int)bits), shuf);
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ull);
    v = _mm256_cmpeq_epi8(_mm256_and_si256(v, bit), bit);
    return _mm256_and_si256(v, _mm256_set1_epi8(0x10));
}

float kern_avx2_vec_dot_q5_0(const void *restrict w, const void *restrict xq, int64_t n) {
    const struct block_q5_0 *a = w;
    const struct block_q8_0 *b = xq;
    __m256 acc = _mm256_setzero_ps();
    const __m256i sixteen = _mm256_set1_epi8(16);
    for (int64_t ib = 0; ib < n / QK5_0; ib++) {
        __m256i q = _mm256_or_si256(unpack_nibbles(a[ib].qs), q5_high_bits(a[ib].qh));
        __m256i qa = _mm256_sub_epi8(q, sixteen);
        __m256i qb = _mm256_loadu_si256((const __m256i *)b[ib].qs);
        __m256 d = _mm256_set1_ps(h2f(a[ib].d) * h2f(b[ib].d));
        acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(dot_i8_pairs(qa, qb)), acc);
    }
    return hsum256(acc);
}

/* Unsigned weights (q4_1, q5_1): maddubs takes them as they are. */
static __m256i dot_u8_i8(__m256i u, __m256i x) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, x), _mm256_set1_epi16(1));
}

float kern_avx2_vec_dot_q4_1(const void *restrict w, const void *restrict xq, int64_t n) {
    const struct block_q4_1 *a = w;
    const struct block_q8_1 *b = xq;
    const __m256i ones = _mm256_set1_epi8(1);  // the min term: exact sum of the qs (ref.c)
    __m256 acc = _mm256_setzero_ps();
    __m256 msum = _mm256_setzero_ps();
    for (int64_t ib = 0; ib < n / QK4_1; ib++) {
        __m256i qb = _mm256_loadu_si256((const __m256i *)b[ib].qs);
        __m256 d = _mm256_set1_ps(h2f(a[ib].d) * h2f(b[ib].d));
        acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(dot_u8_i8(unpack_nibbles(a[ib].qs), qb)), acc);
        __m256 dm = _mm256_set1_ps(h2f(a[ib].m) * h2f(b[ib].d));
        msum = _mm256_fmadd_ps(dm, _mm256_cvtepi32_ps(dot_u8_i8(ones, qb)), msum);
    }
    return hsum256(_mm256_add_ps(acc, msum));
}

float kern_avx2_vec_dot_q5_1(const void *restrict w, const void *restrict xq, int64_t n) {
    const struct block_q5_1 *a = w;
    const struct block_q8_1 *b = xq;
    const __m256i ones = _mm256_set1_epi8(1);  // the min term: exact sum of the qs (ref.c)
    __m256 acc = _mm256_setzero_ps();
    __m256 msum = _mm256_setzero_ps();
    for (int64_t ib = 0; ib < n / QK5_1; ib++) {
        __m256i q = _mm256_or_si256(unpack_nibbles(a[ib].qs), q5_high_bits(a[ib].qh));
        __m256i qb = _mm256_loadu_si256((const __m256i *)b[ib].qs);
        __m256 d = _mm256_set1_ps(h2f(a[ib].d) * h2f(b[ib].d));
        acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(dot_u8_i8(q, qb)), acc);
        __m256 dm = _mm256_set1_ps(h2f(a[ib].m) * h2f(b[ib].d));
        msum = _mm256_fmadd_ps(dm, _mm256_cvtepi32_ps(dot_u8_i8(ones, qb)), msum);
    }
    return hsum256(_mm256_add_ps(acc, msum));
}

float kern_avx2_vec_dot_q4_K(const void *restrict w, const void *restrict xq, int64_t n) {
    const struct block_q4_K *a = w;
    const struct block_q8_K *b = xq;
    const __m256i m4 = _mm256_set1_epi8(15);
    __m256 acc = _mm256_setzero_ps();
    float summ = 0.0f;
    for (int64_t ib = 0; ib < n / QK_K; ib++) {
        uint8_t sc[8], m[8];
        int32_t smin = 0;
        for (int j = 0; j < 8; j++) {
            quant_get_scale_min_k4(j, a[ib].scales, &sc[j], &m[j]);
            smin += m[j] * (b[ib].bsums[2 * j] + b[ib].bsums[2 * j + 1]);
        }
        __m256i isum = _mm256_setzero_si256();
        for (int j2 = 0; j2 < 4; j2++) {
            __m256i q = _mm256_loadu_si256((const __m256i *)(a[ib].qs + 32 * j2));
            __m256i lo = _mm256_and_si256(q, m4);
            __m256i hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
            __m256i x0 = _mm256_loadu_si256((const __m256i *)(b[ib].qs + 64 * j2));
            __m256i x1 = _mm256_loadu_si256((const __m256i *)(b[ib].qs + 64 * j2 + 32));
            __m256i p0 = _mm256_madd_epi16(_mm256_maddubs_epi16(lo, x0),
                                           _mm256_set1_epi16(sc[2 * j2]));
            __m256i p1 = _mm256_madd_epi16(_mm256_maddubs_epi16(hi, x1),
                                           _mm256_set1_epi16(sc[2 * j2 + 1]));
            isum = _mm256_add_epi32(isum, _mm256_add_epi32(p0, p1));
        }
        const float d = b[ib].d * h2f(a[ib].d);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(isum), acc);
        summ += b[ib].d * h2f(a[ib].dmin) * (float)smin;
    }
    return hsum256(acc) - summ;
}

float kern_avx2_vec_dot_q6_K(const void *restrict w, const void *restrict xq, int64_t n) {
    const struct block_q6_K *a = w;
    const struct block_q8_K *b = xq;
    const __m256i m4 = _mm256_set1_epi8(15);
    const __m256i m2 = _mm256_set1_epi8(0x30);
    __m256 acc = _mm256_setzero_ps();
    float summ = 0.0f;
    for (int64_t ib = 0; ib < n / QK_K; ib++) {
        const int8_t *sc = a[ib].scales;
        int32_t corr = 0;  // sum of scale * bsum: the -32 offset of every q
        for (int j = 0; j < 16; j++) corr += sc[j] * b[ib].bsums[j];
        __m256i isum = _mm256_setzero_si256();
        for (int h = 0; h < 2; h++) {
            const uint8_t *ql = a[ib].ql + 64 * h;
            __m256i qh = _mm256_loadu_si256((const __m256i *)(a[ib].qh + 32 * h));
            __m256i l0 = _mm256_loadu_si256((const __m256i *)ql);
            __m256i l1 = _mm256_loadu_si256((const __m256i *)(ql + 32));
            __m256i q[4] = {
                _mm256_or_si256(_mm256_and_si256(l0, m4), _mm256_and_si256(_mm256_slli_epi16(qh, 4), m2)),
                _mm256_or_si256(_mm256_and_si256(l1, m4), _mm256_and_si256(_mm256_slli_epi16(qh, 2), m2)),
                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4), _mm256_and_si256(qh, m2)),
                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                                _mm256_and_si256(_mm256_srli_epi16(qh, 2), m2)),
            };
            for (int c = 0; c < 4; c++) {
                __m256i x = _mm256_loadu_si256((const __m256i *)(b[ib].qs + 128 * h + 32 * c));
                const int js = 8 * h + 2 * c;
                __m256i s = _mm256_set_m128i(_mm_set1_epi16(sc[js + 1]), _mm_set1_epi16(sc[js]));
                isum = _mm256_add_epi32(isum, _mm256_madd_epi16(_mm256_maddubs_epi16(q[c], x), s));
            }
        }
        const float d = b[ib].d * h2f(a[ib].d);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(isum), acc);
        summ += d * 32.0f * (float)corr;
    }
    return hsum256(acc) - summ;
}
