/*
 * exp_avx2.h - the AVX2 exp of non-positive arguments that attention's
 * softmax (attn_avx2.c) and SwiGLU (avx2.c) share; kern_ref_swiglu
 * (ref.c) does its operations in scalar, in the same order, for the same
 * bits. Included only by files compiled with -mavx2 -mfma.
 */
#ifndef LLMSERVE_EXP_AVX2_H
#define LLMSERVE_EXP_AVX2_H

#include <immintrin.h>

/* exp(x) for x <= 0 (attention's scores minus their running max, SwiGLU's
 * -|z|): 2^n * e^f with n = round(x / ln 2), |f| <= ln2/2, e^f by a degree-6
 * Taylor/Horner polynomial (relative error < 2e-7 on that range), 2^n built
 * in the exponent field (n >= -126 here, so it is ldexpf's value). x < -87
 * gives 0; a NaN is taken as -87 (vmaxps returns its second operand). */
static inline __m256 kern_exp_neg_avx2(__m256 x) {
    const __m256 lo = _mm256_set1_ps(-87.0f);
    __m256 is_small = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
    x = _mm256_max_ps(x, lo);
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 f = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693145751953125f), x);
    f = _mm256_fnmadd_ps(n, _mm256_set1_ps(1.428606765330187045e-06f), f);
    __m256 p = _mm256_set1_ps(1.0f / 720.0f);
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0f / 120.0f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0f / 24.0f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0f / 6.0f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(0.5f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0f));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)),
                                  23);
    __m256 r = _mm256_mul_ps(p, _mm256_castsi256_ps(e));
    return _mm256_andnot_ps(is_small, r);
}

#endif
