/*
 * qpanel_avx2.c - products over q-panels (kernels.h, "q-panels") with AVX2 +
 * FMA + F16C. A ymm is half a chunk: 8 output rows x 4 k; a tile keeps MR
 * tokens x 8 rows of int32 sums and float accumulators in the 16 registers.
 * Byte products use vpmaddubsw + vpmaddwd: 4- and 6-bit quants never
 * saturate an int16 pair (at most 63 x 127 x 2); q8_0 goes back to signed
 * bytes and multiplies |w| by x with w's sign. The integer sums are exact
 * and the float work per (row, token) is kernels/qpanel.c's sequence, so the
 * outputs equal the portable and AVX-512 ones bit for bit. Compiled with
 * -mavx2 -mfma -mf16c; called only when CPUID has them.
 */
#include <immintrin.h>
#include <string.h>

#include "engine/kernels/kernels.h"
#include "engine/format/quant.h"

#define QPANEL_CHUNK_BYTES (256 * 1024)  // activations of a chunk of tokens, kept in L2

static inline __m256i bcast4(const int8_t *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return _mm256_set1_epi32(v);
}

static inline __m256i load8(const uint8_t *p) {
    return _mm256_loadu_si256((const __m256i *)p);
}

static inline __m256 load_f16x8(const uint8_t *p) {
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
}

/* int16 pair sums of u8 x s8 into t16; flush16 adds them to int32 sums. */
#define DOT_U8(t16, w, x) ((t16) = _mm256_add_epi16((t16), _mm256_maddubs_epi16((w), (x))))
#define FLUSH16(is, t16) \
    ((is) = _mm256_add_epi32((is), _mm256_madd_epi16((t16), _mm256_set1_epi16(1))))

/* Stores acc (8 rows) at y for the first `rows` of them. */
static inline void store_rows(float *y, __m256 acc, int rows) {
    if (rows == 8) {
        _mm256_storeu_ps(y, acc);
        return;
    }
    float tmp[8];
    _mm256_storeu_ps(tmp, acc);
    memcpy(y, tmp, (size_t)rows * sizeof(float));
}

/* Every tile: MR tokens x rows 8 h .. 8 h + 7 of one panel (q: the panel's
 * quants offset by 32 h bytes; meta: its meta). */
#define TILE_ARGS                                                                     \
    const uint8_t *restrict xq, size_t act_row, int64_t k, const uint8_t *restrict q, \
        const uint8_t *restrict meta, int h, float *restrict y, int64_t ldy, int rows

#define TILE_Q8_0(MR)                                                                              \
    static void tile_q8_0_##MR(TILE_ARGS) {                                                        \
        const int64_t nb = k / QK8_0;                                                              \
        struct kern_qact a[MR];                                                                    \
        for (int m = 0; m < MR; m++) a[m] = kern_qact_view(QUANT_Q8_0, xq + m * act_row, k);       \
        __m256 acc[MR];                                                                            \
        for (int m = 0; m < MR; m++) acc[m] = _mm256_setzero_ps();                                 \
        for (int64_t ib = 0; ib < nb; ib++) {                                                      \
            __m256i is[MR];                                                                        \
            for (int m = 0; m < MR; m++) is[m] = _mm256_setzero_si256();                           \
            for (int g = 0; g < 8; g++) {                                                          \
                const __m256i ws =                                                                 \
                    _mm256_xor_si256(load8(q + ib * 512 + g * 64), _mm256_set1_epi8((char)0x80));  \
                const __m256i wa = _mm256_abs_epi8(ws);                                            \
                for (int m = 0; m < MR; m++) {                                                     \
                    const __m256i x = _mm256_sign_epi8(bcast4(a[m].qs + ib * QK8_0 + 4 * g), ws);  \
                    is[m] = _mm256_add_epi32(is[m], _mm256_madd_epi16(_mm256_maddubs_epi16(wa, x), \
                                                                      _mm256_set1_epi16(1)));      \
                }                                                                                  \
            }                                                                                      \
            const __m256 dw = load_f16x8(meta + ib * 32 + 16 * h);                                 \
            for (int m = 0; m < MR; m++) {                                                         \
                const __m256 dd = _mm256_mul_ps(dw, _mm256_set1_ps(a[m].d[ib]));                   \
                acc[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(is[m]), dd, acc[m]);                   \
            }                                                                                      \
        }                                                                                          \
        for (int m = 0; m < MR; m++) store_rows(y + m * ldy, acc[m], rows);                        \
    }

#define TILE_Q4_0(MR)                                                                        \
    static void tile_q4_0_##MR(TILE_ARGS) {                                                  \
        const int64_t nb = k / QK4_0;                                                        \
        const __m256i m4 = _mm256_set1_epi8(15);                                             \
        struct kern_qact a[MR];                                                              \
        for (int m = 0; m < MR; m++) a[m] = kern_qact_view(QUANT_Q4_0, xq + m * act_row, k); \
        __m256 acc[MR];                                                                      \
        for (int m = 0; m < MR; m++) acc[m] = _mm256_setzero_ps();                           \
        for (int64_t ib = 0; ib < nb; ib++) {                                                \
            __m256i t16[MR];                                                                 \
            for (int m = 0; m < MR; m++) t16[m] = _mm256_setzero_si256();                    \
            for (int c = 0; c < 4; c++) {                                                    \
                const __m256i v = load8(q + ib * 256 + c * 64);                              \
                const __m256i lo = _mm256_and_si256(v, m4);                                  \
                const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);            \
                for (int m = 0; m < MR; m++) {                                               \
                    DOT_U8(t16[m], lo, bcast4(a[m].qs + ib * QK4_0 + 4 * c));                \
                    DOT_U8(t16[m], hi, bcast4(a[m].qs + ib * QK4_0 + 16 + 4 * c));           \
                }                                                                            \
            }                                                                                \
            const __m256 dw = load_f16x8(meta + ib * 32 + 16 * h);                           \
            for (int m = 0; m < MR; m++) {                                                   \
                __m256i is = _mm256_set1_epi32(a[m].n8[ib]);                                 \
                FLUSH16(is, t16[m]);                                                         \
                const __m256 dd = _mm256_mul_ps(dw, _mm256_set1_ps(a[m].d[ib]));             \
                acc[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(is), dd, acc[m]);                \
            }                                                                                \
        }                                                                                    \
        for (int m = 0; m < MR; m++) store_rows(y + m * ldy, acc[m], rows);                  \
    }

#define TILE_Q4_K(MR)                                                                              \
    static void tile_q4_K_##MR(TILE_ARGS) {                                                        \
        const int64_t nb = k / QK_K;                                                               \
        const __m256i m4 = _mm256_set1_epi8(15);                                                   \
        struct kern_qact a[MR];                                                                    \
        for (int m = 0; m < MR; m++) a[m] = kern_qact_view(QUANT_Q4_K, xq + m * act_row, k);       \
        __m256 acc[MR];                                                                            \
        for (int m = 0; m < MR; m++) acc[m] = _mm256_setzero_ps();                                 \
        for (int64_t ib = 0; ib < nb; ib++) {                                                      \
            const uint8_t *mb = meta + ib * 320;                                                   \
            const __m256 d = load_f16x8(mb + 16 * h);                                              \
            __m256 s[MR];                                                                          \
            for (int m = 0; m < MR; m++) s[m] = _mm256_setzero_ps();                               \
            for (int j = 0; j < 8; j++) {                                                          \
                __m256i t16[MR];                                                                   \
                for (int m = 0; m < MR; m++) t16[m] = _mm256_setzero_si256();                      \
                for (int t = 0; t < 8; t++) {                                                      \
                    __m256i v = load8(q + ib * 2048 + (8 * (j / 2) + t) * 64);                     \
                    if (j % 2) v = _mm256_srli_epi16(v, 4);                                        \
                    const __m256i w = _mm256_and_si256(v, m4);                                     \
                    for (int m = 0; m < MR; m++) {                                                 \
                        DOT_U8(t16[m], w,                                                          \
                               bcast4(a[m].qs + ib * QK_K + 64 * (j / 2) + 32 * (j % 2) + 4 * t)); \
                    }                                                                              \
                }                                                                                  \
                uint64_t sc8;                                                                      \
                memcpy(&sc8, mb + 64 + 16 * j + 8 * h, 8);                                         \
                const __m256 sc =                                                                  \
                    _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)sc8)));   \
                const __m256 dsc = _mm256_mul_ps(d, sc);                                           \
                for (int m = 0; m < MR; m++) {                                                     \
                    __m256i is = _mm256_setzero_si256();                                           \
                    FLUSH16(is, t16[m]);                                                           \
                    s[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(is), dsc, s[m]);                     \
                }                                                                                  \
            }                                                                                      \
            __m256i mn[MR];                                                                        \
            for (int m = 0; m < MR; m++) mn[m] = _mm256_setzero_si256();                           \
            for (int i = 0; i < 4; i++) {                                                          \
                const __m256i mv = _mm256_cvtepu8_epi16(                                           \
                    _mm_loadu_si128((const __m128i *)(mb + 192 + 32 * i + 16 * h)));               \
                for (int m = 0; m < MR; m++) {                                                     \
                    const __m256i b = bcast4((const int8_t *)(a[m].b32 + 8 * ib + 2 * i));         \
                    mn[m] = _mm256_add_epi32(mn[m], _mm256_madd_epi16(mv, b));                     \
                }                                                                                  \
            }                                                                                      \
            const __m256 dmin = load_f16x8(mb + 32 + 16 * h);                                      \
            for (int m = 0; m < MR; m++) {                                                         \
                const __m256i neg = _mm256_sub_epi32(_mm256_setzero_si256(), mn[m]);               \
                s[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(neg), dmin, s[m]);                       \
                acc[m] = _mm256_fmadd_ps(s[m], _mm256_set1_ps(a[m].d[ib]), acc[m]);                \
            }                                                                                      \
        }                                                                                          \
        for (int m = 0; m < MR; m++) store_rows(y + m * ldy, acc[m], rows);                        \
    }

#define TILE_Q6_K(MR)                                                                              \
    static void tile_q6_K_##MR(TILE_ARGS) {                                                        \
        const int64_t nb = k / QK_K;                                                               \
        const __m256i m4 = _mm256_set1_epi8(15);                                                   \
        const __m256i m30 = _mm256_set1_epi8(0x30);                                                \
        struct kern_qact a[MR];                                                                    \
        for (int m = 0; m < MR; m++) a[m] = kern_qact_view(QUANT_Q6_K, xq + m * act_row, k);       \
        __m256 acc[MR];                                                                            \
        for (int m = 0; m < MR; m++) acc[m] = _mm256_setzero_ps();                                 \
        for (int64_t ib = 0; ib < nb; ib++) {                                                      \
            const uint8_t *mb = meta + ib * 288;                                                   \
            const __m256 d = load_f16x8(mb + 16 * h);                                              \
            __m256 s[MR];                                                                          \
            for (int m = 0; m < MR; m++) s[m] = _mm256_setzero_ps();                               \
            for (int j = 0; j < 16; j++) {                                                         \
                const uint8_t *c = q + ib * 3072 + 192 * j;                                        \
                const __m256i hb = load8(c + 128);                                                 \
                __m256i is[MR];                                                                    \
                for (int m = 0; m < MR; m++) is[m] = _mm256_set1_epi32(a[m].n32[16 * ib + j]);     \
                for (int hh = 0; hh < 2; hh++) {                                                   \
                    const __m256i n = load8(c + 64 * hh);                                          \
                    const __m256i h0 = hh ? hb : _mm256_slli_epi16(hb, 4);                         \
                    const __m256i h1 = hh ? _mm256_srli_epi16(hb, 2) : _mm256_slli_epi16(hb, 2);   \
                    const __m256i w0 =                                                             \
                        _mm256_or_si256(_mm256_and_si256(n, m4), _mm256_and_si256(h0, m30));       \
                    const __m256i w1 = _mm256_or_si256(                                            \
                        _mm256_and_si256(_mm256_srli_epi16(n, 4), m4), _mm256_and_si256(h1, m30)); \
                    for (int m = 0; m < MR; m++) {                                                 \
                        const int8_t *x = a[m].qs + ib * QK_K + 16 * j + 8 * hh;                   \
                        __m256i t16 = _mm256_maddubs_epi16(w0, bcast4(x));                         \
                        DOT_U8(t16, w1, bcast4(x + 4));                                            \
                        FLUSH16(is[m], t16);                                                       \
                    }                                                                              \
                }                                                                                  \
                const __m256 sc = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(                         \
                    _mm_loadl_epi64((const __m128i *)(mb + 32 + 16 * j + 8 * h))));                \
                const __m256 dsc = _mm256_mul_ps(d, sc);                                           \
                for (int m = 0; m < MR; m++) {                                                     \
                    s[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(is[m]), dsc, s[m]);                  \
                }                                                                                  \
            }                                                                                      \
            for (int m = 0; m < MR; m++) {                                                         \
                acc[m] = _mm256_fmadd_ps(s[m], _mm256_set1_ps(a[m].d[ib]), acc[m]);                \
            }                                                                                      \
        }                                                                                          \
        for (int m = 0; m < MR; m++) store_rows(y + m * ldy, acc[m], rows);                        \
    }

/* The 5th bits of group g (bit 8 b + g of each lane) as 0x10 in each byte. */
static inline __m256i hbit16(__m256i hb, int g) {
    const __m256i v = g < 4 ? _mm256_slli_epi32(hb, 4 - g) : _mm256_srli_epi32(hb, g - 4);
    return _mm256_and_si256(v, _mm256_set1_epi8(0x10));
}

/* The 3rd bits of group g as 0x04 in each byte. */
static inline __m256i hbit4(__m256i hb, int g) {
    const __m256i v = g < 2 ? _mm256_slli_epi32(hb, 2 - g) : _mm256_srli_epi32(hb, g - 2);
    return _mm256_and_si256(v, _mm256_set1_epi8(4));
}

/* The 2 bits of group i (bits 2 i, 2 i + 1 of each byte) as 0..3. */
static inline __m256i bits2(__m256i c, int i) {
    return _mm256_and_si256(i ? _mm256_srli_epi16(c, 2 * i) : c, _mm256_set1_epi8(3));
}

/* q5_0, q4_1, q5_1 (q4_0's chunks, 5th bits in the chunk after them, mins). */
#define TILE_B32(NAME, TYPE, QB, MB, HBIT, INIT, MIN, MR)                                         \
    static void tile_##NAME##_##MR(TILE_ARGS) {                                                   \
        const int64_t nb = k / 32;                                                                \
        const __m256i m4 = _mm256_set1_epi8(15);                                                  \
        struct kern_qact a[MR];                                                                   \
        for (int m = 0; m < MR; m++) a[m] = kern_qact_view(TYPE, xq + m * act_row, k);            \
        __m256 acc[MR];                                                                           \
        for (int m = 0; m < MR; m++) acc[m] = _mm256_setzero_ps();                                \
        for (int64_t ib = 0; ib < nb; ib++) {                                                     \
            __m256i is[MR], t16[MR];                                                              \
            for (int m = 0; m < MR; m++) {                                                        \
                is[m] = INIT(m, ib);                                                              \
                t16[m] = _mm256_setzero_si256();                                                  \
            }                                                                                     \
            for (int c = 0; c < 4; c++) {                                                         \
                const __m256i v = load8(q + ib * (QB) + c * 64);                                  \
                __m256i lo = _mm256_and_si256(v, m4);                                             \
                __m256i hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);                       \
                if (HBIT) {                                                                       \
                    const __m256i hb = load8(q + ib * (QB) + 256);                                \
                    lo = _mm256_or_si256(lo, hbit16(hb, c));                                      \
                    hi = _mm256_or_si256(hi, hbit16(hb, c + 4));                                  \
                }                                                                                 \
                for (int m = 0; m < MR; m++) {                                                    \
                    DOT_U8(t16[m], lo, bcast4(a[m].qs + ib * 32 + 4 * c));                        \
                    DOT_U8(t16[m], hi, bcast4(a[m].qs + ib * 32 + 16 + 4 * c));                   \
                }                                                                                 \
                if (!(HBIT) ? c == 3 : c % 2 == 1) { /* 5-bit pairs: four per int16 */            \
                    for (int m = 0; m < MR; m++) {                                                \
                        FLUSH16(is[m], t16[m]);                                                   \
                        t16[m] = _mm256_setzero_si256();                                          \
                    }                                                                             \
                }                                                                                 \
            }                                                                                     \
            const uint8_t *mb = meta + ib * (MB);                                                 \
            const __m256 dw = load_f16x8(mb + 16 * h);                                            \
            for (int m = 0; m < MR; m++) {                                                        \
                const __m256 dx = _mm256_set1_ps(a[m].d[ib]);                                     \
                acc[m] =                                                                          \
                    _mm256_fmadd_ps(_mm256_cvtepi32_ps(is[m]), _mm256_mul_ps(dw, dx), acc[m]);    \
                if (MIN) {                                                                        \
                    acc[m] =                                                                      \
                        _mm256_fmadd_ps(_mm256_set1_ps(a[m].fs[ib]),                              \
                                        _mm256_mul_ps(load_f16x8(mb + 32 + 16 * h), dx), acc[m]); \
                }                                                                                 \
            }                                                                                     \
        }                                                                                         \
        for (int m = 0; m < MR; m++) store_rows(y + m * ldy, acc[m], rows);                       \
    }

#define INIT_N16(m, ib)  _mm256_set1_epi32(a[m].n16[ib])
#define INIT_ZERO(m, ib) _mm256_setzero_si256()
#define TILE_Q5_0(MR)    TILE_B32(q5_0, QUANT_Q5_0, 320, 32, 1, INIT_N16, 0, MR)
#define TILE_Q4_1(MR)    TILE_B32(q4_1, QUANT_Q4_1, 256, 64, 0, INIT_ZERO, 1, MR)
#define TILE_Q5_1(MR)    TILE_B32(q5_1, QUANT_Q5_1, 320, 64, 1, INIT_ZERO, 1, MR)

#define TILE_Q5_K(MR)                                                                              \
    static void tile_q5_K_##MR(TILE_ARGS) {                                                        \
        const int64_t nb = k / QK_K;                                                               \
        const __m256i m4 = _mm256_set1_epi8(15);                                                   \
        struct kern_qact a[MR];                                                                    \
        for (int m = 0; m < MR; m++) a[m] = kern_qact_view(QUANT_Q5_K, xq + m * act_row, k);       \
        __m256 acc[MR];                                                                            \
        for (int m = 0; m < MR; m++) acc[m] = _mm256_setzero_ps();                                 \
        for (int64_t ib = 0; ib < nb; ib++) {                                                      \
            const uint8_t *mb = meta + ib * 320;                                                   \
            const __m256 d = load_f16x8(mb + 16 * h);                                              \
            __m256 s[MR];                                                                          \
            for (int m = 0; m < MR; m++) s[m] = _mm256_setzero_ps();                               \
            for (int j = 0; j < 8; j++) {                                                          \
                const __m256i hb = load8(q + ib * 2560 + 2048 + 64 * j);                           \
                __m256i is[MR], t16[MR];                                                           \
                for (int m = 0; m < MR; m++) {                                                     \
                    is[m] = _mm256_setzero_si256();                                                \
                    t16[m] = _mm256_setzero_si256();                                               \
                }                                                                                  \
                for (int t = 0; t < 8; t++) {                                                      \
                    __m256i v = load8(q + ib * 2560 + (8 * (j / 2) + t) * 64);                     \
                    if (j % 2) v = _mm256_srli_epi16(v, 4);                                        \
                    const __m256i w = _mm256_or_si256(_mm256_and_si256(v, m4), hbit16(hb, t));     \
                    for (int m = 0; m < MR; m++) {                                                 \
                        DOT_U8(t16[m], w,                                                          \
                               bcast4(a[m].qs + ib * QK_K + 64 * (j / 2) + 32 * (j % 2) + 4 * t)); \
                    }                                                                              \
                    if (t % 4 == 3) {                                                              \
                        for (int m = 0; m < MR; m++) {                                             \
                            FLUSH16(is[m], t16[m]);                                                \
                            t16[m] = _mm256_setzero_si256();                                       \
                        }                                                                          \
                    }                                                                              \
                }                                                                                  \
                uint64_t sc8;                                                                      \
                memcpy(&sc8, mb + 64 + 16 * j + 8 * h, 8);                                         \
                const __m256 sc =                                                                  \
                    _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)sc8)));   \
                const __m256 dsc = _mm256_mul_ps(d, sc);                                           \
                for (int m = 0; m < MR; m++) {                                                     \
                    s[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(is[m]), dsc, s[m]);                  \
                }                                                                                  \
            }                                                                                      \
            __m256i mn[MR];                                                                        \
            for (int m = 0; m < MR; m++) mn[m] = _mm256_setzero_si256();                           \
            for (int i = 0; i < 4; i++) {                                                          \
                const __m256i mv = _mm256_cvtepu8_epi16(                                           \
                    _mm_loadu_si128((const __m128i *)(mb + 192 + 32 * i + 16 * h)));               \
                for (int m = 0; m < MR; m++) {                                                     \
                    const __m256i b = bcast4((const int8_t *)(a[m].b32 + 8 * ib + 2 * i));         \
                    mn[m] = _mm256_add_epi32(mn[m], _mm256_madd_epi16(mv, b));                     \
                }                                                                                  \
            }                                                                                      \
            const __m256 dmin = load_f16x8(mb + 32 + 16 * h);                                      \
            for (int m = 0; m < MR; m++) {                                                         \
                const __m256i neg = _mm256_sub_epi32(_mm256_setzero_si256(), mn[m]);               \
                s[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(neg), dmin, s[m]);                       \
                acc[m] = _mm256_fmadd_ps(s[m], _mm256_set1_ps(a[m].d[ib]), acc[m]);                \
            }                                                                                      \
        }                                                                                          \
        for (int m = 0; m < MR; m++) store_rows(y + m * ldy, acc[m], rows);                        \
    }

#define TILE_Q3_K(MR)                                                                            \
    static void tile_q3_K_##MR(TILE_ARGS) {                                                      \
        const int64_t nb = k / QK_K;                                                             \
        struct kern_qact a[MR];                                                                  \
        for (int m = 0; m < MR; m++) a[m] = kern_qact_view(QUANT_Q3_K, xq + m * act_row, k);     \
        __m256 acc[MR];                                                                          \
        for (int m = 0; m < MR; m++) acc[m] = _mm256_setzero_ps();                               \
        for (int64_t ib = 0; ib < nb; ib++) {                                                    \
            const uint8_t *mb = meta + ib * 288;                                                 \
            const __m256 d = load_f16x8(mb + 16 * h);                                            \
            __m256 s[MR];                                                                        \
            for (int m = 0; m < MR; m++) s[m] = _mm256_setzero_ps();                             \
            for (int j = 0; j < 16; j++) {                                                       \
                const __m256i c2 = load8(q + ib * 1536 + 64 * j);                                \
                const __m256i hb = load8(q + ib * 1536 + 1024 + 64 * (j / 2));                   \
                __m256i t16[MR];                                                                 \
                for (int m = 0; m < MR; m++) t16[m] = _mm256_setzero_si256();                    \
                for (int i = 0; i < 4; i++) {                                                    \
                    const __m256i w = _mm256_or_si256(bits2(c2, i), hbit4(hb, 4 * (j % 2) + i)); \
                    for (int m = 0; m < MR; m++) {                                               \
                        DOT_U8(t16[m], w, bcast4(a[m].qs + ib * QK_K + 16 * j + 4 * i));         \
                    }                                                                            \
                }                                                                                \
                const __m256 sc = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(                       \
                    _mm_loadl_epi64((const __m128i *)(mb + 32 + 16 * j + 8 * h))));              \
                const __m256 dsc = _mm256_mul_ps(d, sc);                                         \
                for (int m = 0; m < MR; m++) {                                                   \
                    __m256i is = _mm256_set1_epi32(a[m].n4[16 * ib + j]);                        \
                    FLUSH16(is, t16[m]);                                                         \
                    s[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(is), dsc, s[m]);                   \
                }                                                                                \
            }                                                                                    \
            for (int m = 0; m < MR; m++) {                                                       \
                acc[m] = _mm256_fmadd_ps(s[m], _mm256_set1_ps(a[m].d[ib]), acc[m]);              \
            }                                                                                    \
        }                                                                                        \
        for (int m = 0; m < MR; m++) store_rows(y + m * ldy, acc[m], rows);                      \
    }

#define TILE_Q2_K(MR)                                                                        \
    static void tile_q2_K_##MR(TILE_ARGS) {                                                  \
        const int64_t nb = k / QK_K;                                                         \
        struct kern_qact a[MR];                                                              \
        for (int m = 0; m < MR; m++) a[m] = kern_qact_view(QUANT_Q2_K, xq + m * act_row, k); \
        __m256 acc[MR];                                                                      \
        for (int m = 0; m < MR; m++) acc[m] = _mm256_setzero_ps();                           \
        for (int64_t ib = 0; ib < nb; ib++) {                                                \
            const uint8_t *mb = meta + ib * 320;                                             \
            const __m256 d = load_f16x8(mb + 16 * h);                                        \
            __m256 s[MR];                                                                    \
            for (int m = 0; m < MR; m++) s[m] = _mm256_setzero_ps();                         \
            for (int j = 0; j < 16; j++) {                                                   \
                const __m256i c2 = load8(q + ib * 1024 + 64 * j);                            \
                __m256i t16[MR];                                                             \
                for (int m = 0; m < MR; m++) t16[m] = _mm256_setzero_si256();                \
                for (int i = 0; i < 4; i++) {                                                \
                    const __m256i w = bits2(c2, i);                                          \
                    for (int m = 0; m < MR; m++) {                                           \
                        DOT_U8(t16[m], w, bcast4(a[m].qs + ib * QK_K + 16 * j + 4 * i));     \
                    }                                                                        \
                }                                                                            \
                __m256i wsc = _mm256_cvtepu16_epi32(                                         \
                    _mm_loadu_si128((const __m128i *)(mb + 64 + 32 * (j / 2) + 16 * h)));    \
                if (j % 2) wsc = _mm256_srli_epi32(wsc, 8);                                  \
                const __m256 sc =                                                            \
                    _mm256_cvtepi32_ps(_mm256_and_si256(wsc, _mm256_set1_epi32(15)));        \
                const __m256 dsc = _mm256_mul_ps(d, sc);                                     \
                for (int m = 0; m < MR; m++) {                                               \
                    __m256i is = _mm256_setzero_si256();                                     \
                    FLUSH16(is, t16[m]);                                                     \
                    s[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(is), dsc, s[m]);               \
                }                                                                            \
            }                                                                                \
            __m256i mn[MR];                                                                  \
            for (int m = 0; m < MR; m++) mn[m] = _mm256_setzero_si256();                     \
            for (int i = 0; i < 8; i++) {                                                    \
                const __m256i mv = _mm256_srli_epi16(                                        \
                    _mm256_cvtepu8_epi16(                                                    \
                        _mm_loadu_si128((const __m128i *)(mb + 64 + 32 * i + 16 * h))),      \
                    4);                                                                      \
                for (int m = 0; m < MR; m++) {                                               \
                    const __m256i b = bcast4((const int8_t *)(a[m].b16 + 16 * ib + 2 * i));  \
                    mn[m] = _mm256_add_epi32(mn[m], _mm256_madd_epi16(mv, b));               \
                }                                                                            \
            }                                                                                \
            const __m256 dmin = load_f16x8(mb + 32 + 16 * h);                                \
            for (int m = 0; m < MR; m++) {                                                   \
                const __m256i neg = _mm256_sub_epi32(_mm256_setzero_si256(), mn[m]);         \
                s[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(neg), dmin, s[m]);                 \
                acc[m] = _mm256_fmadd_ps(s[m], _mm256_set1_ps(a[m].d[ib]), acc[m]);          \
            }                                                                                \
        }                                                                                    \
        for (int m = 0; m < MR; m++) store_rows(y + m * ldy, acc[m], rows);                  \
    }

typedef void (*qtile_fn)(TILE_ARGS);

/* Loops over chunks of tokens (their activations stay in L2), then panels
 * and their two halves of 8 rows, then groups of up to MR tokens. */
static void run(enum quant_type t, const qtile_fn *tiles, int mr_max, int64_t q_bytes,
                const void *restrict xq, int64_t n_tokens, const void *restrict pw, int64_t k,
                int64_t n, int64_t p0, int64_t p1, float *restrict y) {
    const size_t act_row = kern_qpanel_act_bytes(t, k);
    const size_t stride = kern_qpanel_stride(t, k);
    const int64_t nb = k / quant_traits(t)->block_size;
    int64_t mc = (int64_t)(QPANEL_CHUNK_BYTES / act_row) / mr_max * mr_max;
    if (mc < mr_max) mc = mr_max;
    for (int64_t t0 = 0; t0 < n_tokens; t0 += mc) {
        const int64_t t1 = n_tokens - t0 < mc ? n_tokens : t0 + mc;
        for (int64_t p = p0; p < p1; p++) {
            const uint8_t *panel = (const uint8_t *)pw + (size_t)p * stride;
            for (int h = 0; h < 2; h++) {
                const int64_t r0 = p * KERN_PANEL_ROWS + 8 * h;
                if (r0 >= n) break;
                const int rows = n - r0 < 8 ? (int)(n - r0) : 8;
                for (int64_t tt = t0; tt < t1; tt += mr_max) {
                    const int64_t mr = t1 - tt < mr_max ? t1 - tt : mr_max;
                    tiles[mr - 1]((const uint8_t *)xq + (size_t)tt * act_row, act_row, k,
                                  panel + 32 * h, panel + nb * q_bytes, h, y + tt * n + r0, n,
                                  rows);
                }
            }
        }
    }
}

TILE_Q8_0(1)
TILE_Q8_0(2) TILE_Q8_0(3) TILE_Q8_0(4) TILE_Q4_0(1) TILE_Q4_0(2) TILE_Q4_0(3) TILE_Q4_0(4)
    TILE_Q4_K(1) TILE_Q4_K(2) TILE_Q4_K(3) TILE_Q6_K(1) TILE_Q6_K(2) TILE_Q6_K(3) TILE_Q5_0(1)
        TILE_Q5_0(2) TILE_Q5_0(3) TILE_Q5_0(4) TILE_Q4_1(1) TILE_Q4_1(2) TILE_Q4_1(3) TILE_Q4_1(4)
            TILE_Q5_1(1) TILE_Q5_1(2) TILE_Q5_1(3) TILE_Q5_1(4) TILE_Q5_K(1) TILE_Q5_K(2)
                TILE_Q5_K(3) TILE_Q3_K(1) TILE_Q3_K(2) TILE_Q3_K(3) TILE_Q2_K(1) TILE_Q2_K(2)
                    TILE_Q2_K(3)

                        void kern_qpanel_avx2_q8_0(const void *restrict xq, int64_t n_tokens,
                                                   const void *restrict pw, int64_t k, int64_t n,
                                                   int64_t p0, int64_t p1, float *restrict y) {
    static const qtile_fn tiles[] = {tile_q8_0_1, tile_q8_0_2, tile_q8_0_3, tile_q8_0_4};
    run(QUANT_Q8_0, tiles, 4, 512, xq, n_tokens, pw, k, n, p0, p1, y);
}

void kern_qpanel_avx2_q4_0(const void *restrict xq, int64_t n_tokens, const void *restrict pw,
                           int64_t k, int64_t n, int64_t p0, int64_t p1, float *restrict y) {
    static const qtile_fn tiles[] = {tile_q4_0_1, tile_q4_0_2, tile_q4_0_3, tile_q4_0_4};
    run(QUANT_Q4_0, tiles, 4, 256, xq, n_tokens, pw, k, n, p0, p1, y);
}

void kern_qpanel_avx2_q4_K(const void *restrict xq, int64_t n_tokens, const void *restrict pw,
                           int64_t k, int64_t n, int64_t p0, int64_t p1, float *restrict y) {
    static const qtile_fn tiles[] = {tile_q4_K_1, tile_q4_K_2, tile_q4_K_3};
    run(QUANT_Q4_K, tiles, 3, 2048, xq, n_tokens, pw, k, n, p0, p1, y);
}

void kern_qpanel_avx2_q6_K(const void *restrict xq, int64_t n_tokens, const void *restrict pw,
                           int64_t k, int64_t n, int64_t p0, int64_t p1, float *restrict y) {
    static const qtile_fn tiles[] = {tile_q6_K_1, tile_q6_K_2, tile_q6_K_3};
    run(QUANT_Q6_K, tiles, 3, 3072, xq, n_tokens, pw, k, n, p0, p1, y);
}

void kern_qpanel_avx2_q5_0(const void *restrict xq, int64_t n_tokens, const void *restrict pw,
                           int64_t k, int64_t n, int64_t p0, int64_t p1, float *restrict y) {
    static const qtile_fn tiles[] = {tile_q5_0_1, tile_q5_0_2, tile_q5_0_3, tile_q5_0_4};
    run(QUANT_Q5_0, tiles, 4, 320, xq, n_tokens, pw, k, n, p0, p1, y);
}

void kern_qpanel_avx2_q4_1(const void *restrict xq, int64_t n_tokens, const void *restrict pw,
                           int64_t k, int64_t n, int64_t p0, int64_t p1, float *restrict y) {
    static const qtile_fn tiles[] = {tile_q4_1_1, tile_q4_1_2, tile_q4_1_3, tile_q4_1_4};
    run(QUANT_Q4_1, tiles, 4, 256, xq, n_tokens, pw, k, n, p0, p1, y);
}

void kern_qpanel_avx2_q5_1(const void *restrict xq, int64_t n_tokens, const void *restrict pw,
                           int64_t k, int64_t n, int64_t p0, int64_t p1, float *restrict y) {
    static const qtile_fn tiles[] = {tile_q5_1_1, tile_q5_1_2, tile_q5_1_3, tile_q5_1_4};
    run(QUANT_Q5_1, tiles, 4, 320, xq, n_tokens, pw, k, n, p0, p1, y);
}

void kern_qpanel_avx2_q5_K(const void *restrict xq, int64_t n_tokens, const void *restrict pw,
                           int64_t k, int64_t n, int64_t p0, int64_t p1, float *restrict y) {
    static const qtile_fn tiles[] = {tile_q5_K_1, tile_q5_K_2, tile_q5_K_3};
    run(QUANT_Q5_K, tiles, 3, 2560, xq, n_tokens, pw, k, n, p0, p1, y);
}

void kern_qpanel_avx2_q3_K(const void *restrict xq, int64_t n_tokens, const void *restrict pw,
                           int64_t k, int64_t n, int64_t p0, int64_t p1, float *restrict y) {
    static const qtile_fn tiles[] = {tile_q3_K_1, tile_q3_K_2, tile_q3_K_3};
    run(QUANT_Q3_K, tiles, 3, 1536, xq, n_tokens, pw, k, n, p0, p1, y);
}

void kern_qpanel_avx2_q2_K(const void *restrict xq, int64_t n_tokens, const void *restrict pw,
                           int64_t k, int64_t n, int64_t p0, int64_t p1, float *restrict y) {
    static const qtile_fn tiles[] = {tile_q2_K_1, tile_q2_K_2, tile_q2_K_3};
    run(QUANT_Q2_K, tiles, 3, 1024, xq, n_tokens, pw, k, n, p0, p1, y);
}

/* ---- activations: quant.c's q8_0/q8_1/q8_K rounding, 8 lanes at a time -------- */

/* 8 rounded values of x * id in [-127, 127] (to nearest even, as lrintf). */
static inline __m256i round8(const float *x, float id) {
    __m256i q = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x), _mm256_set1_ps(id)));
    return _mm256_max_epi32(_mm256_min_epi32(q, _mm256_set1_epi32(127)), _mm256_set1_epi32(-127));
}

static inline float max_abs(const float *x, int n) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 m = _mm256_setzero_ps();
    for (int i = 0; i < n; i += 8)
        m = _mm256_max_ps(m, _mm256_andnot_ps(sign, _mm256_loadu_ps(x + i)));
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_movehdup_ps(h));
    return _mm_cvtss_f32(h);
}

/* Stores 16 values (two round8 results) as int8 at dst; returns their sum. */
static inline int32_t store16(int8_t *dst, __m256i q0, __m256i q1) {
    const __m256i w = _mm256_packs_epi32(q0, q1);  // 16 x int16, lanes interleaved
    const __m128i b = _mm_packs_epi16(_mm256_castsi256_si128(w), _mm256_extracti128_si256(w, 1));
    // order after the two packs: q0[0..3] q1[0..3] q0[4..7] q1[4..7]
    _mm_storeu_si128((__m128i *)dst, _mm_shuffle_epi32(b, _MM_SHUFFLE(3, 1, 2, 0)));
    __m256i s = _mm256_add_epi32(q0, q1);
    __m128i h = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
    h = _mm_add_epi32(h, _mm_shuffle_epi32(h, _MM_SHUFFLE(1, 0, 3, 2)));
    h = _mm_add_epi32(h, _mm_shuffle_epi32(h, _MM_SHUFFLE(2, 3, 0, 1)));
    return _mm_cvtsi128_si32(h);
}

void kern_qpanel_avx2_act(enum quant_type t, const float *restrict x, int64_t k,
                          void *restrict dst) {
    struct kern_qact a = kern_qact_view(t, dst, k);
    int8_t *qs = (int8_t *)a.qs;
    float *d = (float *)a.d;
    if (quant_traits(t)->vec_dot_type == QUANT_Q8_K) {
        int32_t *n32 = (int32_t *)a.n32, *n4 = (int32_t *)a.n4;
        int16_t *b16 = (int16_t *)a.b16, *b32 = (int16_t *)a.b32;
        for (int64_t ib = 0; ib < k / QK_K; ib++, x += QK_K) {
            const float db = max_abs(x, QK_K) / 127.0f;
            const float id = db != 0.0f ? 1.0f / db : 0.0f;
            d[ib] = db;
            for (int j = 0; j < 16; j++) {
                const int32_t sum = store16(qs + ib * QK_K + 16 * j, round8(x + 16 * j, id),
                                            round8(x + 16 * j + 8, id));
                n32[16 * ib + j] = -32 * sum;
                n4[16 * ib + j] = -4 * sum;
                b16[16 * ib + j] = (int16_t)sum;
                if (j % 2) b32[8 * ib + j / 2] = (int16_t)(b16[16 * ib + j - 1] + sum);
            }
        }
        return;
    }
    int32_t *n8 = (int32_t *)a.n8, *n16 = (int32_t *)a.n16, *n128 = (int32_t *)a.n128;
    float *fs = (float *)a.fs;
    for (int64_t ib = 0; ib < k / QK8_0; ib++, x += QK8_0) {
        const float db = max_abs(x, QK8_0) / 127.0f;
        const float id = db != 0.0f ? 1.0f / db : 0.0f;
        d[ib] = quant_f16_to_f32(quant_f32_to_f16(db));
        const int32_t sum = store16(qs + ib * QK8_0, round8(x, id), round8(x + 8, id)) +
                            store16(qs + ib * QK8_0 + 16, round8(x + 16, id), round8(x + 24, id));
        n8[ib] = -8 * sum;
        n16[ib] = -16 * sum;
        n128[ib] = -128 * sum;
        fs[ib] = (float)sum;
    }
}
