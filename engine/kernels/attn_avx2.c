/*
 * attn_avx2.c - AVX2 + FMA attention kernels for f32, f16 and q8_0 KV tiles.
 * Compiled with -mavx2 -mfma -mf16c and called only after kern_attn_select()
 * found those features. f16 values become floats with vcvtph2ps as they are
 * loaded, q8_0 values with a sign extension and vcvtdq2ps; q8_0 scores keep a
 * partial sum per group of 32 dims and multiply it by the group's scales (one
 * vector of 8 keys' scales) once per group. The one-row and multi-row score
 * kernels sum each key in the same order (even-dim chain + odd-dim chain, the
 * same 8-key passes and scalar tails), so a token's attention has the same
 * bits decoded alone and in a prefill tile (batch invariance).
 */
#include <immintrin.h>
#include <math.h>

#include "engine/kernels/attn.h"
#include "engine/kernels/exp_avx2.h"

static inline __m256 load8_f16(const uint16_t *p) {
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)p));
}

static inline __m256 cvt8_q8(__m128i x) { return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(x)); }

static inline __m256 load8_q8(const int8_t *p) {
    return cvt8_q8(_mm_loadl_epi64((const __m128i *)(const void *)p));
}

static int32_t n_groups(int32_t hd) { return (hd + KV_Q8_0_GROUP - 1) / KV_Q8_0_GROUP; }

/* The scalar form of one score (tails), shared by the one-row and multi-row
 * kernels so a key's score has the same bits in both. */
static float score_f32(const float *q, const float *kt, int32_t hd, int32_t bs, int32_t j) {
    float sum = 0.0f;
    for (int32_t d = 0; d < hd; d++) sum += q[d] * kt[(int64_t)d * bs + j];
    return sum;
}

/* One row (decode without GQA sharing): 16 keys per pass, even and odd dims in
 * separate accumulators so four FMA chains run at once. Each key's score is
 * summed in the order of the multi-row kernel (even-dim chain + odd-dim chain,
 * the same 8-key passes and scalar tail), so a token gets the same bits
 * decoded alone and in a prefill tile (batch invariance). */
static void scores_one_row(const float *q, const float *kt, int32_t hd, int32_t bs, float scale,
                           float *s) {
    int32_t j = 0;
    for (; j + 8 <= bs; j += 16) {
        if (j + 16 > bs) {  // one 8-key pass left
            __m256 a0 = _mm256_setzero_ps(), a2 = _mm256_setzero_ps();
            int32_t d = 0;
            for (; d + 2 <= hd; d += 2) {
                a0 = _mm256_fmadd_ps(_mm256_broadcast_ss(q + d),
                                     _mm256_loadu_ps(kt + (int64_t)d * bs + j), a0);
                a2 = _mm256_fmadd_ps(_mm256_broadcast_ss(q + d + 1),
                                     _mm256_loadu_ps(kt + (int64_t)(d + 1) * bs + j), a2);
            }
            for (; d < hd; d++) {
                a0 = _mm256_fmadd_ps(_mm256_broadcast_ss(q + d),
                                     _mm256_loadu_ps(kt + (int64_t)d * bs + j), a0);
            }
            _mm256_storeu_ps(s + j, _mm256_mul_ps(_mm256_add_ps(a0, a2), _mm256_set1_ps(scale)));
            j += 8;
            break;
        }
        __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
        __m256 a2 = _mm256_setzero_ps(), a3 = _mm256_setzero_ps();
        int32_t d = 0;
        for (; d + 2 <= hd; d += 2) {
            const float *k0 = kt + (int64_t)d * bs + j;
            const float *k1 = k0 + bs;
            __m256 q0 = _mm256_broadcast_ss(q + d);
            __m256 q1 = _mm256_broadcast_ss(q + d + 1);
            a0 = _mm256_fmadd_ps(q0, _mm256_loadu_ps(k0), a0);
            a1 = _mm256_fmadd_ps(q0, _mm256_loadu_ps(k0 + 8), a1);
            a2 = _mm256_fmadd_ps(q1, _mm256_loadu_ps(k1), a2);
            a3 = _mm256_fmadd_ps(q1, _mm256_loadu_ps(k1 + 8), a3);
        }
        for (; d < hd; d++) {
            const float *k0 = kt + (int64_t)d * bs + j;
            __m256 q0 = _mm256_broadcast_ss(q + d);
            a0 = _mm256_fmadd_ps(q0, _mm256_loadu_ps(k0), a0);
            a1 = _mm256_fmadd_ps(q0, _mm256_loadu_ps(k0 + 8), a1);
        }
        __m256 sc = _mm256_set1_ps(scale);
        _mm256_storeu_ps(s + j, _mm256_mul_ps(_mm256_add_ps(a0, a2), sc));
        _mm256_storeu_ps(s + j + 8, _mm256_mul_ps(_mm256_add_ps(a1, a3), sc));
    }
    for (; j < bs; j++) s[j] = score_f32(q, kt, hd, bs, j) * scale;
}

void kern_attn_avx2_scores_f32(const float *const *q, int32_t n_rows, const void *ktv,
                               int32_t hd, int32_t bs, float scale, float *s) {
    const float *kt = ktv;
    if (n_rows == 1) {
        scores_one_row(q[0], kt, hd, bs, scale, s);
        return;
    }
    int32_t j = 0;
    // 4 rows x 8 keys per pass: one K^T vector load feeds 4 FMAs; even and odd
    // dims in separate chains, as scores_one_row.
    for (; j + 8 <= bs; j += 8) {
        __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
        __m256 a2 = _mm256_setzero_ps(), a3 = _mm256_setzero_ps();
        __m256 b0 = _mm256_setzero_ps(), b1 = _mm256_setzero_ps();
        __m256 b2 = _mm256_setzero_ps(), b3 = _mm256_setzero_ps();
        const float *q0 = q[0];
        const float *q1 = n_rows > 1 ? q[1] : q[0];
        const float *q2 = n_rows > 2 ? q[2] : q[0];
        const float *q3 = n_rows > 3 ? q[3] : q[0];
        int32_t d = 0;
        for (; d + 2 <= hd; d += 2) {
            __m256 k = _mm256_loadu_ps(kt + (int64_t)d * bs + j);
            __m256 k1 = _mm256_loadu_ps(kt + (int64_t)(d + 1) * bs + j);
            a0 = _mm256_fmadd_ps(_mm256_broadcast_ss(q0 + d), k, a0);
            a1 = _mm256_fmadd_ps(_mm256_broadcast_ss(q1 + d), k, a1);
            a2 = _mm256_fmadd_ps(_mm256_broadcast_ss(q2 + d), k, a2);
            a3 = _mm256_fmadd_ps(_mm256_broadcast_ss(q3 + d), k, a3);
            b0 = _mm256_fmadd_ps(_mm256_broadcast_ss(q0 + d + 1), k1, b0);
            b1 = _mm256_fmadd_ps(_mm256_broadcast_ss(q1 + d + 1), k1, b1);
            b2 = _mm256_fmadd_ps(_mm256_broadcast_ss(q2 + d + 1), k1, b2);
            b3 = _mm256_fmadd_ps(_mm256_broadcast_ss(q3 + d + 1), k1, b3);
        }
        for (; d < hd; d++) {
            __m256 k = _mm256_loadu_ps(kt + (int64_t)d * bs + j);
            a0 = _mm256_fmadd_ps(_mm256_broadcast_ss(q0 + d), k, a0);
            a1 = _mm256_fmadd_ps(_mm256_broadcast_ss(q1 + d), k, a1);
            a2 = _mm256_fmadd_ps(_mm256_broadcast_ss(q2 + d), k, a2);
            a3 = _mm256_fmadd_ps(_mm256_broadcast_ss(q3 + d), k, a3);
        }
        __m256 sc = _mm256_set1_ps(scale);
        _mm256_storeu_ps(s + j, _mm256_mul_ps(_mm256_add_ps(a0, b0), sc));
        if (n_rows > 1) _mm256_storeu_ps(s + bs + j, _mm256_mul_ps(_mm256_add_ps(a1, b1), sc));
        if (n_rows > 2) {
            _mm256_storeu_ps(s + 2 * (int64_t)bs + j, _mm256_mul_ps(_mm256_add_ps(a2, b2), sc));
        }
        if (n_rows > 3) {
            _mm256_storeu_ps(s + 3 * (int64_t)bs + j, _mm256_mul_ps(_mm256_add_ps(a3, b3), sc));
        }
    }
    for (; j < bs; j++) {
        for (int32_t r = 0; r < n_rows; r++) {
            s[(int64_t)r * bs + j] = score_f32(q[r], kt, hd, bs, j) * scale;
        }
    }
}

float kern_attn_avx2_exp_sum(float *p, const float *s, float m, int32_t n) {
    __m256 vm = _mm256_set1_ps(m);
    __m256 acc = _mm256_setzero_ps();
    int32_t j = 0;
    for (; j + 8 <= n; j += 8) {
        __m256 e = kern_exp_neg_avx2(_mm256_sub_ps(_mm256_loadu_ps(s + j), vm));
        _mm256_storeu_ps(p + j, e);
        acc = _mm256_add_ps(acc, e);
    }
    __m128 lo = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
    lo = _mm_hadd_ps(lo, lo);
    lo = _mm_hadd_ps(lo, lo);
    float sum = _mm_cvtss_f32(lo);
    for (; j < n; j++) {
        p[j] = expf(s[j] - m);
        sum += p[j];
    }
    return sum;
}

void kern_attn_avx2_pv_f32(float *acc, float corr, const float *p, const void *vt, int32_t j0,
                           int32_t n, int32_t hd, int32_t bs) {
    (void)bs;
    const float *v = (const float *)vt + (int64_t)j0 * hd;
    const __m256 vc = _mm256_set1_ps(corr);
    int32_t d = 0;
    // 32 dims at a time stay in registers across all keys of the block.
    for (; d + 32 <= hd; d += 32) {
        __m256 a0 = _mm256_mul_ps(_mm256_loadu_ps(acc + d), vc);
        __m256 a1 = _mm256_mul_ps(_mm256_loadu_ps(acc + d + 8), vc);
        __m256 a2 = _mm256_mul_ps(_mm256_loadu_ps(acc + d + 16), vc);
        __m256 a3 = _mm256_mul_ps(_mm256_loadu_ps(acc + d + 24), vc);
        for (int32_t j = 0; j < n; j++) {
            const float *vj = v + (int64_t)j * hd + d;
            __m256 pj = _mm256_broadcast_ss(p + j);
            a0 = _mm256_fmadd_ps(pj, _mm256_loadu_ps(vj), a0);
            a1 = _mm256_fmadd_ps(pj, _mm256_loadu_ps(vj + 8), a1);
            a2 = _mm256_fmadd_ps(pj, _mm256_loadu_ps(vj + 16), a2);
            a3 = _mm256_fmadd_ps(pj, _mm256_loadu_ps(vj + 24), a3);
        }
        _mm256_storeu_ps(acc + d, a0);
        _mm256_storeu_ps(acc + d + 8, a1);
        _mm256_storeu_ps(acc + d + 16, a2);
        _mm256_storeu_ps(acc + d + 24, a3);
    }
    for (; d + 8 <= hd; d += 8) {
        __m256 a0 = _mm256_mul_ps(_mm256_loadu_ps(acc + d), vc);
        for (int32_t j = 0; j < n; j++) {
            a0 = _mm256_fmadd_ps(_mm256_broadcast_ss(p + j), _mm256_loadu_ps(v + (int64_t)j * hd + d),
                                 a0);
        }
        _mm256_storeu_ps(acc + d, a0);
    }
    for (; d < hd; d++) {
        float a = acc[d] * corr;
        for (int32_t j = 0; j < n; j++) a += p[j] * v[(int64_t)j * hd + d];
        acc[d] = a;
    }
}

/* ---- f16: the f32 kernels with converting loads ------------------------- */

static float score_f16(const float *q, const uint16_t *kt, int32_t hd, int32_t bs, int32_t j) {
    float sum = 0.0f;
    for (int32_t d = 0; d < hd; d++) sum += q[d] * _cvtsh_ss(kt[(int64_t)d * bs + j]);
    return sum;
}

static void scores_one_row_f16(const float *q, const uint16_t *kt, int32_t hd, int32_t bs,
                               float scale, float *s) {
    int32_t j = 0;
    for (; j + 8 <= bs; j += 16) {
        if (j + 16 > bs) {  // one 8-key pass left, as in kern_attn_avx2_scores_f16
            __m256 a0 = _mm256_setzero_ps(), a2 = _mm256_setzero_ps();
            int32_t d = 0;
            for (; d + 2 <= hd; d += 2) {
                a0 = _mm256_fmadd_ps(_mm256_broadcast_ss(q + d),
                                     load8_f16(kt + (int64_t)d * bs + j), a0);
                a2 = _mm256_fmadd_ps(_mm256_broadcast_ss(q + d + 1),
                                     load8_f16(kt + (int64_t)(d + 1) * bs + j), a2);
            }
            for (; d < hd; d++) {
                a0 = _mm256_fmadd_ps(_mm256_broadcast_ss(q + d),
                                     load8_f16(kt + (int64_t)d * bs + j), a0);
            }
            _mm256_storeu_ps(s + j, _mm256_mul_ps(_mm256_add_ps(a0, a2), _mm256_set1_ps(scale)));
            j += 8;
            break;
        }
        __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
        __m256 a2 = _mm256_setzero_ps(), a3 = _mm256_setzero_ps();
        int32_t d = 0;
        for (; d + 2 <= hd; d += 2) {
            const uint16_t *k0 = kt + (int64_t)d * bs + j;
            const uint16_t *k1 = k0 + bs;
            __m256 q0 = _mm256_broadcast_ss(q + d);
            __m256 q1 = _mm256_broadcast_ss(q + d + 1);
            a0 = _mm256_fmadd_ps(q0, load8_f16(k0), a0);
            a1 = _mm256_fmadd_ps(q0, load8_f16(k0 + 8), a1);
            a2 = _mm256_fmadd_ps(q1, load8_f16(k1), a2);
            a3 = _mm256_fmadd_ps(q1, load8_f16(k1 + 8), a3);
        }
        for (; d < hd; d++) {
            const uint16_t *k0 = kt + (int64_t)d * bs + j;
            __m256 q0 = _mm256_broadcast_ss(q + d);
            a0 = _mm256_fmadd_ps(q0, load8_f16(k0), a0);
            a1 = _mm256_fmadd_ps(q0, load8_f16(k0 + 8), a1);
        }
        __m256 sc = _mm256_set1_ps(scale);
        _mm256_storeu_ps(s + j, _mm256_mul_ps(_mm256_add_ps(a0, a2), sc));
        _mm256_storeu_ps(s + j + 8, _mm256_mul_ps(_mm256_add_ps(a1, a3), sc));
    }
    for (; j < bs; j++) s[j] = score_f16(q, kt, hd, bs, j) * scale;
}

void kern_attn_avx2_scores_f16(const float *const *q, int32_t n_rows, const void *ktv,
                               int32_t hd, int32_t bs, float scale, float *s) {
    const uint16_t *kt = ktv;
    if (n_rows == 1) {
        scores_one_row_f16(q[0], kt, hd, bs, scale, s);
        return;
    }
    int32_t j = 0;
    // Even and odd dims in separate chains, as scores_one_row_f16.
    for (; j + 8 <= bs; j += 8) {
        __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
        __m256 a2 = _mm256_setzero_ps(), a3 = _mm256_setzero_ps();
        __m256 b0 = _mm256_setzero_ps(), b1 = _mm256_setzero_ps();
        __m256 b2 = _mm256_setzero_ps(), b3 = _mm256_setzero_ps();
        const float *q0 = q[0];
        const float *q1 = n_rows > 1 ? q[1] : q[0];
        const float *q2 = n_rows > 2 ? q[2] : q[0];
        const float *q3 = n_rows > 3 ? q[3] : q[0];
        int32_t d = 0;
        for (; d + 2 <= hd; d += 2) {
            __m256 k = load8_f16(kt + (int64_t)d * bs + j);
            __m256 k1 = load8_f16(kt + (int64_t)(d + 1) * bs + j);
            a0 = _mm256_fmadd_ps(_mm256_broadcast_ss(q0 + d), k, a0);
            a1 = _mm256_fmadd_ps(_mm256_broadcast_ss(q1 + d), k, a1);
            a2 = _mm256_fmadd_ps(_mm256_broadcast_ss(q2 + d), k, a2);
            a3 = _mm256_fmadd_ps(_mm256_broadcast_ss(q3 + d), k, a3);
            b0 = _mm256_fmadd_ps(_mm256_broadcast_ss(q0 + d + 1), k1, b0);
            b1 = _mm256_fmadd_ps(_mm256_broadcast_ss(q1 + d + 1), k1, b1);
            b2 = _mm256_fmadd_ps(_mm256_broadcast_ss(q2 + d + 1), k1, b2);
            b3 = _mm256_fmadd_ps(_mm256_broadcast_ss(q3 + d + 1), k1, b3);
        }
        for (; d < hd; d++) {
            __m256 k = load8_f16(kt + (int64_t)d * bs + j);
            a0 = _mm256_fmadd_ps(_mm256_broadcast_ss(q0 + d), k, a0);
            a1 = _mm256_fmadd_ps(_mm256_broadcast_ss(q1 + d), k, a1);
            a2 = _mm256_fmadd_ps(_mm256_broadcast_ss(q2 + d), k, a2);
            a3 = _mm256_fmadd_ps(_mm256_broadcast_ss(q3 + d), k, a3);
        }
        __m256 sc = _mm256_set1_ps(scale);
        _mm256_storeu_ps(s + j, _mm256_mul_ps(_mm256_add_ps(a0, b0), sc));
        if (n_rows > 1) _mm256_storeu_ps(s + bs + j, _mm256_mul_ps(_mm256_add_ps(a1, b1), sc));
        if (n_rows > 2) {
            _mm256_storeu_ps(s + 2 * (int64_t)bs + j, _mm256_mul_ps(_mm256_add_ps(a2, b2), sc));
        }
        if (n_rows > 3) {
            _mm256_storeu_ps(s + 3 * (int64_t)bs + j, _mm256_mul_ps(_mm256_add_ps(a3, b3), sc));
        }
    }
    for (; j < bs; j++) {
        for (int32_t r = 0; r < n_rows; r++) {
            s[(int64_t)r * bs + j] = score_f16(q[r], kt, hd, bs, j) * scale;
        }
    }
}

void kern_attn_avx2_pv_f16(float *acc, float corr, const float *p, const void *vt, int32_t j0,
                           int32_t n, int32_t hd, int32_t bs) {
    (void)bs;
    const uint16_t *v = (const uint16_t *)vt + (int64_t)j0 * hd;
    const __m256 vc = _mm256_set1_ps(corr);
    int32_t d = 0;
    for (; d + 32 <= hd; d += 32) {
        __m256 a0 = _mm256_mul_ps(_mm256_loadu_ps(acc + d), vc);
        __m256 a1 = _mm256_mul_ps(_mm256_loadu_ps(acc + d + 8), vc);
        __m256 a2 = _mm256_mul_ps(_mm256_loadu_ps(acc + d + 16), vc);
        __m256 a3 = _mm256_mul_ps(_mm256_loadu_ps(acc + d + 24), vc);
        for (int32_t j = 0; j < n; j++) {
            const uint16_t *vj = v + (int64_t)j * hd + d;
            __m256 pj = _mm256_broadcast_ss(p + j);
            a0 = _mm256_fmadd_ps(pj, load8_f16(vj), a0);
            a1 = _mm256_fmadd_ps(pj, load8_f16(vj + 8), a1);
            a2 = _mm256_fmadd_ps(pj, load8_f16(vj + 16), a2);
            a3 = _mm256_fmadd_ps(pj, load8_f16(vj + 24), a3);
        }
        _mm256_storeu_ps(acc + d, a0);
        _mm256_storeu_ps(acc + d + 8, a1);
        _mm256_storeu_ps(acc + d + 16, a2);
        _mm256_storeu_ps(acc + d + 24, a3);
    }
    for (; d + 8 <= hd; d += 8) {
        __m256 a0 = _mm256_mul_ps(_mm256_loadu_ps(acc + d), vc);
        for (int32_t j = 0; j < n; j++) {
            a0 = _mm256_fmadd_ps(_mm256_broadcast_ss(p + j), load8_f16(v + (int64_t)j * hd + d), a0);
        }
        _mm256_storeu_ps(acc + d, a0);
    }
    for (; d < hd; d++) {
        float a = acc[d] * corr;
        for (int32_t j = 0; j < n; j++) a += p[j] * _cvtsh_ss(v[(int64_t)j * hd + d]);
        acc[d] = a;
    }
}

/* ---- q8_0: int8 values, partial sums per group of 32 dims --------------- */

/* The scalar form of one score (tails), in the portable kernel's order. */
static float score_q8_0(const float *q, const float *kd, const int8_t *kq, int32_t hd,
                        int32_t bs, int32_t j) {
    float sum = 0.0f;
    for (int32_t d0 = 0; d0 < hd; d0 += KV_Q8_0_GROUP) {
        const int32_t d1 = d0 + KV_Q8_0_GROUP < hd ? d0 + KV_Q8_0_GROUP : hd;
        float part = 0.0f;
        for (int32_t d = d0; d < d1; d++) part += q[d] * (float)kq[(int64_t)d * bs + j];
        sum += part * kd[(int64_t)(d0 / KV_Q8_0_GROUP) * bs + j];
    }
    return sum;
}

static void scores_one_row_q8_0(const float *q, const float *kd, const int8_t *kq, int32_t hd,
                                int32_t bs, float scale, float *s) {
    int32_t j = 0;
    for (; j + 8 <= bs; j += 16) {
        if (j + 16 > bs) {  // one 8-key pass left, as in kern_attn_avx2_scores_q8_0
            __m256 a0 = _mm256_setzero_ps();
            for (int32_t d0 = 0; d0 < hd; d0 += KV_Q8_0_GROUP) {
                const int32_t d1 = d0 + KV_Q8_0_GROUP < hd ? d0 + KV_Q8_0_GROUP : hd;
                __m256 g0 = _mm256_setzero_ps(), g2 = _mm256_setzero_ps();
                int32_t d = d0;
                for (; d + 2 <= d1; d += 2) {
                    g0 = _mm256_fmadd_ps(_mm256_broadcast_ss(q + d),
                                         load8_q8(kq + (int64_t)d * bs + j), g0);
                    g2 = _mm256_fmadd_ps(_mm256_broadcast_ss(q + d + 1),
                                         load8_q8(kq + (int64_t)(d + 1) * bs + j), g2);
                }
                for (; d < d1; d++) {
                    g0 = _mm256_fmadd_ps(_mm256_broadcast_ss(q + d),
                                         load8_q8(kq + (int64_t)d * bs + j), g0);
                }
                const float *dg = kd + (int64_t)(d0 / KV_Q8_0_GROUP) * bs + j;
                a0 = _mm256_fmadd_ps(_mm256_add_ps(g0, g2), _mm256_loadu_ps(dg), a0);
            }
            _mm256_storeu_ps(s + j, _mm256_mul_ps(a0, _mm256_set1_ps(scale)));
            j += 8;
            break;
        }
        __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
        for (int32_t d0 = 0; d0 < hd; d0 += KV_Q8_0_GROUP) {
            const int32_t d1 = d0 + KV_Q8_0_GROUP < hd ? d0 + KV_Q8_0_GROUP : hd;
            __m256 g0 = _mm256_setzero_ps(), g1 = _mm256_setzero_ps();
            __m256 g2 = _mm256_setzero_ps(), g3 = _mm256_setzero_ps();
            int32_t d = d0;
            for (; d + 2 <= d1; d += 2) {
                const int8_t *k0 = kq + (int64_t)d * bs + j;
                __m128i x0 = _mm_loadu_si128((const __m128i *)(const void *)k0);
                __m128i x1 = _mm_loadu_si128((const __m128i *)(const void *)(k0 + bs));
                __m256 q0 = _mm256_broadcast_ss(q + d);
                __m256 q1 = _mm256_broadcast_ss(q + d + 1);
                g0 = _mm256_fmadd_ps(q0, cvt8_q8(x0), g0);
                g1 = _mm256_fmadd_ps(q0, cvt8_q8(_mm_unpackhi_epi64(x0, x0)), g1);
                g2 = _mm256_fmadd_ps(q1, cvt8_q8(x1), g2);
                g3 = _mm256_fmadd_ps(q1, cvt8_q8(_mm_unpackhi_epi64(x1, x1)), g3);
            }
            for (; d < d1; d++) {
                const int8_t *k0 = kq + (int64_t)d * bs + j;
                __m256 q0 = _mm256_broadcast_ss(q + d);
                g0 = _mm256_fmadd_ps(q0, load8_q8(k0), g0);
                g1 = _mm256_fmadd_ps(q0, load8_q8(k0 + 8), g1);
            }
            const float *dg = kd + (int64_t)(d0 / KV_Q8_0_GROUP) * bs + j;
            a0 = _mm256_fmadd_ps(_mm256_add_ps(g0, g2), _mm256_loadu_ps(dg), a0);
            a1 = _mm256_fmadd_ps(_mm256_add_ps(g1, g3), _mm256_loadu_ps(dg + 8), a1);
        }
        __m256 sc = _mm256_set1_ps(scale);
        _mm256_storeu_ps(s + j, _mm256_mul_ps(a0, sc));
        _mm256_storeu_ps(s + j + 8, _mm256_mul_ps(a1, sc));
    }
    for (; j < bs; j++) s[j] = score_q8_0(q, kd, kq, hd, bs, j) * scale;
}

void kern_attn_avx2_scores_q8_0(const float *const *q, int32_t n_rows, const void *kt,
                                int32_t hd, int32_t bs, float scale, float *s) {
    const int32_t ng = n_groups(hd);
    const float *kd = kt;                                        // [ng][bs]
    const int8_t *kq = (const int8_t *)(kd + (int64_t)ng * bs);  // [hd][bs]
    if (n_rows == 1) {
        scores_one_row_q8_0(q[0], kd, kq, hd, bs, scale, s);
        return;
    }
    const float *q0 = q[0];
    const float *q1 = n_rows > 1 ? q[1] : q[0];
    const float *q2 = n_rows > 2 ? q[2] : q[0];
    const float *q3 = n_rows > 3 ? q[3] : q[0];
    int32_t j = 0;
    // 4 rows x 8 keys per pass: one converted K^T vector feeds 4 FMAs; even and
    // odd dims of a group in separate chains, as scores_one_row_q8_0.
    for (; j + 8 <= bs; j += 8) {
        __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
        __m256 a2 = _mm256_setzero_ps(), a3 = _mm256_setzero_ps();
        for (int32_t d0 = 0; d0 < hd; d0 += KV_Q8_0_GROUP) {
            const int32_t d1 = d0 + KV_Q8_0_GROUP < hd ? d0 + KV_Q8_0_GROUP : hd;
            __m256 g0 = _mm256_setzero_ps(), g1 = _mm256_setzero_ps();
            __m256 g2 = _mm256_setzero_ps(), g3 = _mm256_setzero_ps();
            __m256 h0 = _mm256_setzero_ps(), h1 = _mm256_setzero_ps();
            __m256 h2 = _mm256_setzero_ps(), h3 = _mm256_setzero_ps();
            int32_t d = d0;
            for (; d + 2 <= d1; d += 2) {
                __m256 k = load8_q8(kq + (int64_t)d * bs + j);
                __m256 k1 = load8_q8(kq + (int64_t)(d + 1) * bs + j);
                g0 = _mm256_fmadd_ps(_mm256_broadcast_ss(q0 + d), k, g0);
                g1 = _mm256_fmadd_ps(_mm256_broadcast_ss(q1 + d), k, g1);
                g2 = _mm256_fmadd_ps(_mm256_broadcast_ss(q2 + d), k, g2);
                g3 = _mm256_fmadd_ps(_mm256_broadcast_ss(q3 + d), k, g3);
                h0 = _mm256_fmadd_ps(_mm256_broadcast_ss(q0 + d + 1), k1, h0);
                h1 = _mm256_fmadd_ps(_mm256_broadcast_ss(q1 + d + 1), k1, h1);
                h2 = _mm256_fmadd_ps(_mm256_broadcast_ss(q2 + d + 1), k1, h2);
                h3 = _mm256_fmadd_ps(_mm256_broadcast_ss(q3 + d + 1), k1, h3);
            }
            for (; d < d1; d++) {
                __m256 k = load8_q8(kq + (int64_t)d * bs + j);
                g0 = _mm256_fmadd_ps(_mm256_broadcast_ss(q0 + d), k, g0);
                g1 = _mm256_fmadd_ps(_mm256_broadcast_ss(q1 + d), k, g1);
                g2 = _mm256_fmadd_ps(_mm256_broadcast_ss(q2 + d), k, g2);
                g3 = _mm256_fmadd_ps(_mm256_broadcast_ss(q3 + d), k, g3);
            }
            __m256 dg = _mm256_loadu_ps(kd + (int64_t)(d0 / KV_Q8_0_GROUP) * bs + j);
            a0 = _mm256_fmadd_ps(_mm256_add_ps(g0, h0), dg, a0);
            a1 = _mm256_fmadd_ps(_mm256_add_ps(g1, h1), dg, a1);
            a2 = _mm256_fmadd_ps(_mm256_add_ps(g2, h2), dg, a2);
            a3 = _mm256_fmadd_ps(_mm256_add_ps(g3, h3), dg, a3);
        }
        __m256 sc = _mm256_set1_ps(scale);
        _mm256_storeu_ps(s + j, _mm256_mul_ps(a0, sc));
        if (n_rows > 1) _mm256_storeu_ps(s + bs + j, _mm256_mul_ps(a1, sc));
        if (n_rows > 2) _mm256_storeu_ps(s + 2 * (int64_t)bs + j, _mm256_mul_ps(a2, sc));
        if (n_rows > 3) _mm256_storeu_ps(s + 3 * (int64_t)bs + j, _mm256_mul_ps(a3, sc));
    }
    for (; j < bs; j++) {
        for (int32_t r = 0; r < n_rows; r++) {
            s[(int64_t)r * bs + j] = score_q8_0(q[r], kd, kq, hd, bs, j) * scale;
        }
    }
}

void kern_attn_avx2_pv_q8_0(float *acc, float corr, const float *p, const void *vt, int32_t j0,
                            int32_t n, int32_t hd, int32_t bs) {
    const int32_t ng = n_groups(hd);
    const float *vd = (const float *)vt + (int64_t)j0 * ng;  // [n][ng]
    const int8_t *vq = (const int8_t *)((const float *)vt + (int64_t)ng * bs) +
                       (int64_t)j0 * hd;                     // [n][hd]
    const __m256 vc = _mm256_set1_ps(corr);
    int32_t d = 0;
    // One group of 32 dims at a time: p[j] times the group's scale is one scalar.
    for (; d + 32 <= hd; d += 32) {
        const int32_t g = d / KV_Q8_0_GROUP;
        __m256 a0 = _mm256_mul_ps(_mm256_loadu_ps(acc + d), vc);
        __m256 a1 = _mm256_mul_ps(_mm256_loadu_ps(acc + d + 8), vc);
        __m256 a2 = _mm256_mul_ps(_mm256_loadu_ps(acc + d + 16), vc);
        __m256 a3 = _mm256_mul_ps(_mm256_loadu_ps(acc + d + 24), vc);
        for (int32_t j = 0; j < n; j++) {
            const int8_t *vj = vq + (int64_t)j * hd + d;
            __m256 c = _mm256_set1_ps(p[j] * vd[(int64_t)j * ng + g]);
            __m256i x = _mm256_loadu_si256((const __m256i *)(const void *)vj);
            __m128i lo = _mm256_castsi256_si128(x);
            __m128i hi = _mm256_extracti128_si256(x, 1);
            a0 = _mm256_fmadd_ps(c, cvt8_q8(lo), a0);
            a1 = _mm256_fmadd_ps(c, cvt8_q8(_mm_unpackhi_epi64(lo, lo)), a1);
            a2 = _mm256_fmadd_ps(c, cvt8_q8(hi), a2);
            a3 = _mm256_fmadd_ps(c, cvt8_q8(_mm_unpackhi_epi64(hi, hi)), a3);
        }
        _mm256_storeu_ps(acc + d, a0);
        _mm256_storeu_ps(acc + d + 8, a1);
        _mm256_storeu_ps(acc + d + 16, a2);
        _mm256_storeu_ps(acc + d + 24, a3);
    }
    for (; d + 8 <= hd; d += 8) {
        const int32_t g = d / KV_Q8_0_GROUP;  // 8 divides 32: one group
        __m256 a0 = _mm256_mul_ps(_mm256_loadu_ps(acc + d), vc);
        for (int32_t j = 0; j < n; j++) {
            __m256 c = _mm256_set1_ps(p[j] * vd[(int64_t)j * ng + g]);
            a0 = _mm256_fmadd_ps(c, load8_q8(vq + (int64_t)j * hd + d), a0);
        }
        _mm256_storeu_ps(acc + d, a0);
    }
    for (; d < hd; d++) {
        const int32_t g = d / KV_Q8_0_GROUP;
        float a = acc[d] * corr;
        for (int32_t j = 0; j < n; j++) {
            a += p[j] * vd[(int64_t)j * ng + g] * (float)vq[(int64_t)j * hd + d];
        }
        acc[d] = a;
    }
}
