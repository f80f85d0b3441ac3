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

/* ---- the formats' unpack steps ------------------------------------------------
 *
 * A format is a few inline functions over one block of the tile's half panel
 * (qb: its quants, 32 bytes of each 64-byte chunk; mb: its meta; h: which 8
 * of the panel's 16 rows, for the per-row meta fields); they hold all that
 * differs between formats, and the tile skeleton below calls them. A block
 * has NSUB sub-blocks of NU units; a unit is VPU (1 or 2) weight vectors,
 * each multiplied by the token's 4 activation bytes at F_xoff(j, u, v):
 *   F_unpack(qb, j, u)    the unit's weight bytes (u8; for q8_0 |w| and w)
 *   F_init(a, ib, j)      the int32 sums' start (the offset term, e.g.
 *                         -8 x the block sum of the activations for q4_0)
 *   F_scale(mb, j, h)     the scale of the sub-block's int sums: the weights'
 *                         d (a block of 32) or d x the sub-block scale (K)
 * plus, for the K formats with mins, F_min_unpack(mb, i, h) and
 * F_min_x(a, ib, i): the mins as int16 and the activation sums they multiply.
 * Each of kernels/qpanel.c's chunk orders is documented there. */

struct qunit {
    __m256i w[2];  // the unit's weight vectors (VPU of them; q8_0: |w| and w)
};

static inline struct qunit unit2(__m256i w0, __m256i w1) {
    return (struct qunit){{w0, w1}};
}

static inline __m256i nib_lo(__m256i v) {
    return _mm256_and_si256(v, _mm256_set1_epi8(15));
}
static inline __m256i nib_hi(__m256i v) {
    return nib_lo(_mm256_srli_epi16(v, 4));
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

/* The weights' f16 d of the 8 rows (every format's meta starts with them). */
static inline __m256 scale_d(const uint8_t *mb, int j, int h) {
    (void)j;
    return load_f16x8(mb + 16 * h);
}

static inline __m256i init_zero(const struct kern_qact *a, int64_t ib, int j) {
    (void)a, (void)ib, (void)j;
    return _mm256_setzero_si256();
}

/* q8_0: unit g of a block = w + 128 of group g; |w| times x with w's sign. */
static inline struct qunit q8_0_unpack(const uint8_t *qb, int j, int u) {
    (void)j;
    const __m256i ws = _mm256_xor_si256(load8(qb + u * 64), _mm256_set1_epi8((char)0x80));
    return unit2(_mm256_abs_epi8(ws), ws);
}
static inline int q8_0_xoff(int j, int u, int v) {
    return (void)j, (void)v, 4 * u;
}
#define q8_0_init  init_zero
#define q8_0_scale scale_d

/* q4_0, q5_0, q4_1, q5_1: unit c = nibbles of groups c (low) and c + 4 (high),
 * q5's 5th bits in the chunk at 256. */
static inline struct qunit q4_0_unpack(const uint8_t *qb, int j, int u) {
    (void)j;
    const __m256i v = load8(qb + u * 64);
    return unit2(nib_lo(v), nib_hi(v));
}
/* The 5th bits come first: in the other order GCC's schedule cost q5_0 5%
 * at one token (docs/benchmarks.md, the q-panel skeleton). */
static inline struct qunit q5_0_unpack(const uint8_t *qb, int j, int u) {
    const __m256i hb = load8(qb + 256);
    const __m256i h0 = hbit16(hb, u), h1 = hbit16(hb, u + 4);
    const struct qunit n = q4_0_unpack(qb, j, u);
    return unit2(_mm256_or_si256(n.w[0], h0), _mm256_or_si256(n.w[1], h1));
}
static inline int b32_xoff(int j, int u, int v) {
    return (void)j, 16 * v + 4 * u;
}
static inline __m256i q4_0_init(const struct kern_qact *a, int64_t ib, int j) {
    return (void)j, _mm256_set1_epi32(a->n8[ib]);
}
static inline __m256i q5_0_init(const struct kern_qact *a, int64_t ib, int j) {
    return (void)j, _mm256_set1_epi32(a->n16[ib]);
}
#define q4_1_unpack q4_0_unpack
#define q5_1_unpack q5_0_unpack
#define q4_0_xoff   b32_xoff
#define q5_0_xoff   b32_xoff
#define q4_1_xoff   b32_xoff
#define q5_1_xoff   b32_xoff
#define q4_1_init   init_zero
#define q5_1_init   init_zero
#define q4_0_scale  scale_d
#define q5_0_scale  scale_d
#define q4_1_scale  scale_d
#define q5_1_scale  scale_d

/* q4_K, q5_K: sub-block j = units 0..7 of chunks 8 (j / 2) .. (low nibbles for
 * even j, high for odd), q5_K's 5th bits in chunk 2048 / 64 + j (bit 8 b + u);
 * meta: d, dmin (at 32), 8 u8 scales per row at 64, mins (u8) at 192. */
static inline struct qunit q4_K_unpack(const uint8_t *qb, int j, int u) {
    __m256i v = load8(qb + (8 * (j / 2) + u) * 64);
    if (j % 2) v = _mm256_srli_epi16(v, 4);  // one shift, then q5_K's or fuses with the and
    const __m256i w = nib_lo(v);
    return unit2(w, w);
}
static inline struct qunit q5_K_unpack(const uint8_t *qb, int j, int u) {
    const __m256i hb = load8(qb + 2048 + 64 * j);
    const __m256i w = _mm256_or_si256(q4_K_unpack(qb, j, u).w[0], hbit16(hb, u));
    return unit2(w, w);
}
static inline int k4_xoff(int j, int u, int v) {
    return (void)v, 64 * (j / 2) + 32 * (j % 2) + 4 * u;
}
static inline __m256 k4_scale(const uint8_t *mb, int j, int h) {
    uint64_t sc8;
    memcpy(&sc8, mb + 64 + 16 * j + 8 * h, 8);
    const __m256 sc = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)sc8)));
    return _mm256_mul_ps(scale_d(mb, j, h), sc);
}
static inline __m256i k4_min_unpack(const uint8_t *mb, int i, int h) {
    return _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(mb + 192 + 32 * i + 16 * h)));
}
static inline const int16_t *k4_min_x(const struct kern_qact *a, int64_t ib, int i) {
    return a->b32 + 8 * ib + 2 * i;
}
#define q4_K_xoff       k4_xoff
#define q5_K_xoff       k4_xoff
#define q4_K_init       init_zero
#define q5_K_init       init_zero
#define q4_K_scale      k4_scale
#define q5_K_scale      k4_scale
#define q4_K_min_unpack k4_min_unpack
#define q5_K_min_unpack k4_min_unpack
#define q4_K_min_x      k4_min_x
#define q5_K_min_x      k4_min_x

/* q6_K: sub-block j = chunks 3 j, 3 j + 1 (low nibbles), 3 j + 2 (high bits);
 * unit u = groups 2 u, 2 u + 1; meta: d, 16 i8 scales per row at 32. */
static inline struct qunit q6_K_unpack(const uint8_t *qb, int j, int u) {
    const __m256i m30 = _mm256_set1_epi8(0x30);
    const uint8_t *c = qb + 192 * j;
    const __m256i n = load8(c + 64 * u);
    const __m256i hb = load8(c + 128);
    /* groups 2u, 2u + 1: high bits 4u, 4u + 2 .. moved to bits 4, 5 */
    const __m256i h0 = u ? hb : _mm256_slli_epi16(hb, 4);
    const __m256i h1 = u ? _mm256_srli_epi16(hb, 2) : _mm256_slli_epi16(hb, 2);
    return unit2(_mm256_or_si256(nib_lo(n), _mm256_and_si256(h0, m30)),
                 _mm256_or_si256(nib_hi(n), _mm256_and_si256(h1, m30)));
}
static inline int q6_K_xoff(int j, int u, int v) {
    return 16 * j + 8 * u + 4 * v;
}
static inline __m256i q6_K_init(const struct kern_qact *a, int64_t ib, int j) {
    return _mm256_set1_epi32(a->n32[16 * ib + j]);
}
static inline __m256 k6_scale(const uint8_t *mb, int j, int h) {
    const __m256 sc = _mm256_cvtepi32_ps(
        _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(mb + 32 + 16 * j + 8 * h))));
    return _mm256_mul_ps(scale_d(mb, j, h), sc);
}
#define q6_K_scale k6_scale

/* q3_K, q2_K: 16 chunks of 2-bit values (group i in bits 2 i), q3_K's 3rd bits
 * in 8 more chunks (bit 8 b + 4 (j % 2) + i). q3_K meta: d, i8 scales at 32;
 * q2_K meta: d, dmin (at 32), scale | min << 4 per sub-block at 64. */
static inline struct qunit q2_K_unpack(const uint8_t *qb, int j, int u) {
    const __m256i w = bits2(load8(qb + 64 * j), u);
    return unit2(w, w);
}
static inline struct qunit q3_K_unpack(const uint8_t *qb, int j, int u) {
    const __m256i hb = load8(qb + 1024 + 64 * (j / 2));
    const __m256i w = _mm256_or_si256(q2_K_unpack(qb, j, u).w[0], hbit4(hb, 4 * (j % 2) + u));
    return unit2(w, w);
}
static inline int k2_xoff(int j, int u, int v) {
    return (void)v, 16 * j + 4 * u;
}
static inline __m256i q3_K_init(const struct kern_qact *a, int64_t ib, int j) {
    return _mm256_set1_epi32(a->n4[16 * ib + j]);
}
static inline __m256 q2_K_scale(const uint8_t *mb, int j, int h) {
    /* scale | min << 4 of sub-blocks 2 (j / 2) and 2 (j / 2) + 1 per row */
    __m256i w =
        _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(mb + 64 + 32 * (j / 2) + 16 * h)));
    if (j % 2) w = _mm256_srli_epi32(w, 8);
    const __m256 sc = _mm256_cvtepi32_ps(_mm256_and_si256(w, _mm256_set1_epi32(15)));
    return _mm256_mul_ps(scale_d(mb, j, h), sc);
}
static inline __m256i q2_K_min_unpack(const uint8_t *mb, int i, int h) {
    return _mm256_srli_epi16(
        _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(mb + 64 + 32 * i + 16 * h))), 4);
}
static inline const int16_t *q2_K_min_x(const struct kern_qact *a, int64_t ib, int i) {
    return a->b16 + 16 * ib + 2 * i;
}
#define q3_K_xoff  k2_xoff
#define q2_K_xoff  k2_xoff
#define q2_K_init  init_zero
#define q3_K_scale k6_scale

/* Formats without mins (never called: NMIN is 0 for them). */
#define NO_MIN_UNPACK(mb, i, h) _mm256_setzero_si256()
#define NO_MIN_X(a, ib, i)      ((const int16_t *)(a)->qs)

/* The unit dots: u8 x s8 pair sums into t16 (flushed into the int32 sums
 * before they can overflow); q8_0 gives x w's sign first. */
#define DOT_QUNIT(is, t16, q, v, x) DOT_U8(t16, (q).w[v], x)
#define DOT_Q8_0(is, t16, q, v, x)  DOT_U8(t16, (q).w[0], _mm256_sign_epi8((x), (q).w[1]))

/* ---- the tile skeleton: MR tokens x rows 8 h .. 8 h + 7 of one panel ------------
 *
 * q: the panel's quants offset by 32 h bytes; meta: its meta. F: the format's
 * prefix; TYPE its quant_type; QK values and QB quant bytes (per panel) of a
 * block, MB meta bytes; NSUB sub-blocks of NU units of VPU vectors; FLUSH:
 * units between int16 flushes (0: at the end of the sub-block); KSUB: 1 when
 * the scales are per sub-block and the block's activation d multiplies their
 * sum (K formats), 0 when one block scale multiplies the int sums (then
 * FSMIN: 1 adds the weights' min times the activations' block sum,
 * q4_1/q5_1); NMIN: units of K mins (0: none); DOT: the unit dot. The float
 * work per (row, token) is kernels/qpanel.c's sequence, so the outputs equal
 * the portable and AVX-512 ones bit for bit. */
#define TILE_ARGS                                                                     \
    const uint8_t *restrict xq, size_t act_row, int64_t k, const uint8_t *restrict q, \
        const uint8_t *restrict meta, int h, float *restrict y, int64_t ldy, int rows

#define TILE(F, TYPE, QK, QB, MB, NSUB, NU, VPU, FLUSH, KSUB, FSMIN, NMIN, MINU, MINX, DOT, MR)    \
    static void tile_##F##_##MR(TILE_ARGS) {                                                       \
        const int64_t nb = k / (QK);                                                               \
        struct kern_qact a[MR];                                                                    \
        for (int m = 0; m < MR; m++) a[m] = kern_qact_view(TYPE, xq + m * act_row, k);             \
        __m256 acc[MR];                                                                            \
        for (int m = 0; m < MR; m++) acc[m] = _mm256_setzero_ps();                                 \
        for (int64_t ib = 0; ib < nb; ib++) {                                                      \
            const uint8_t *qb = q + ib * (QB);                                                     \
            const uint8_t *mb = meta + ib * (MB);                                                  \
            __m256 s[MR];                                                                          \
            for (int m = 0; m < MR; m++) s[m] = _mm256_setzero_ps();                               \
            for (int j = 0; j < (NSUB); j++) {                                                     \
                __m256i is[MR], t16[MR];                                                           \
                for (int m = 0; m < MR; m++) {                                                     \
                    is[m] = F##_init(&a[m], ib, j);                                                \
                    t16[m] = _mm256_setzero_si256();                                               \
                }                                                                                  \
                for (int u = 0; u < (NU); u++) {                                                   \
                    const struct qunit w = F##_unpack(qb, j, u);                                   \
                    for (int m = 0; m < MR; m++)                                                   \
                        for (int v = 0; v < (VPU); v++) {                                          \
                            const __m256i x = bcast4(a[m].qs + ib * (QK) + F##_xoff(j, u, v));     \
                            DOT(is[m], t16[m], w, v, x);                                           \
                        }                                                                          \
                    if ((FLUSH) && u % ((FLUSH) ? (FLUSH) : 1) == (FLUSH)-1) {                     \
                        for (int m = 0; m < MR; m++) {                                             \
                            FLUSH16(is[m], t16[m]);                                                \
                            t16[m] = _mm256_setzero_si256();                                       \
                        }                                                                          \
                    }                                                                              \
                }                                                                                  \
                const __m256 sc = F##_scale(mb, j, h);                                             \
                for (int m = 0; m < MR; m++) {                                                     \
                    if (!(FLUSH)) FLUSH16(is[m], t16[m]);                                          \
                    if (KSUB) {                                                                    \
                        s[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(is[m]), sc, s[m]);               \
                        continue;                                                                  \
                    }                                                                              \
                    const __m256 dx = _mm256_set1_ps(a[m].d[ib]);                                  \
                    acc[m] =                                                                       \
                        _mm256_fmadd_ps(_mm256_cvtepi32_ps(is[m]), _mm256_mul_ps(sc, dx), acc[m]); \
                    if (FSMIN) {                                                                   \
                        acc[m] = _mm256_fmadd_ps(_mm256_set1_ps(a[m].fs[ib]),                      \
                                                 _mm256_mul_ps(load_f16x8(mb + 32 + 16 * h), dx),  \
                                                 acc[m]);                                          \
                    }                                                                              \
                }                                                                                  \
            }                                                                                      \
            if (!(KSUB)) continue;                                                                 \
            if (NMIN) {                                                                            \
                __m256i mn[MR];                                                                    \
                for (int m = 0; m < MR; m++) mn[m] = _mm256_setzero_si256();                       \
                for (int i = 0; i < (NMIN); i++) {                                                 \
                    const __m256i mv = MINU(mb, i, h);                                             \
                    for (int m = 0; m < MR; m++) {                                                 \
                        const __m256i b = bcast4((const int8_t *)MINX(&a[m], ib, i));              \
                        mn[m] = _mm256_add_epi32(mn[m], _mm256_madd_epi16(mv, b));                 \
                    }                                                                              \
                }                                                                                  \
                const __m256 dmin = load_f16x8(mb + 32 + 16 * h);                                  \
                for (int m = 0; m < MR; m++) {                                                     \
                    const __m256i neg = _mm256_sub_epi32(_mm256_setzero_si256(), mn[m]);           \
                    s[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(neg), dmin, s[m]);                   \
                }                                                                                  \
            }                                                                                      \
            for (int m = 0; m < MR; m++) {                                                         \
                acc[m] = _mm256_fmadd_ps(s[m], _mm256_set1_ps(a[m].d[ib]), acc[m]);                \
            }                                                                                      \
        }                                                                                          \
        for (int m = 0; m < MR; m++) store_rows(y + m * ldy, acc[m], rows);                        \
    }

/* Each format's row: F, TYPE, QK, QB, MB, NSUB, NU, VPU, FLUSH, KSUB, FSMIN, NMIN, mins.
 * 4-bit units sum 8 products per int16 (8 x 15 x 127 x 2 < 32768) before a
 * flush, 5-bit ones 4, 6-bit ones 2, q8_0's one. */
// clang-format off
#define TILE_Q8_0(MR) TILE(q8_0, QUANT_Q8_0, QK8_0, 512,   32, 1,  8, 1, 1, 0, 0, 0, NO_MIN_UNPACK, NO_MIN_X, DOT_Q8_0, MR)
#define TILE_Q4_0(MR) TILE(q4_0, QUANT_Q4_0, QK4_0, 256,   32, 1,  4, 2, 0, 0, 0, 0, NO_MIN_UNPACK, NO_MIN_X, DOT_QUNIT, MR)
#define TILE_Q5_0(MR) TILE(q5_0, QUANT_Q5_0, 32,    320,   32, 1,  4, 2, 2, 0, 0, 0, NO_MIN_UNPACK, NO_MIN_X, DOT_QUNIT, MR)
#define TILE_Q4_1(MR) TILE(q4_1, QUANT_Q4_1, 32,    256,   64, 1,  4, 2, 0, 0, 1, 0, NO_MIN_UNPACK, NO_MIN_X, DOT_QUNIT, MR)
#define TILE_Q5_1(MR) TILE(q5_1, QUANT_Q5_1, 32,    320,   64, 1,  4, 2, 2, 0, 1, 0, NO_MIN_UNPACK, NO_MIN_X, DOT_QUNIT, MR)
#define TILE_Q4_K(MR) TILE(q4_K, QUANT_Q4_K, QK_K,  2048, 320, 8,  8, 1, 0, 1, 0, 4, q4_K_min_unpack, q4_K_min_x, DOT_QUNIT, MR)
#define TILE_Q5_K(MR) TILE(q5_K, QUANT_Q5_K, QK_K,  2560, 320, 8,  8, 1, 4, 1, 0, 4, q5_K_min_unpack, q5_K_min_x, DOT_QUNIT, MR)
#define TILE_Q6_K(MR) TILE(q6_K, QUANT_Q6_K, QK_K,  3072, 288, 16, 2, 2, 1, 1, 0, 0, NO_MIN_UNPACK, NO_MIN_X, DOT_QUNIT, MR)
#define TILE_Q3_K(MR) TILE(q3_K, QUANT_Q3_K, QK_K,  1536, 288, 16, 4, 1, 0, 1, 0, 0, NO_MIN_UNPACK, NO_MIN_X, DOT_QUNIT, MR)
#define TILE_Q2_K(MR) TILE(q2_K, QUANT_Q2_K, QK_K,  1024, 320, 16, 4, 1, 0, 1, 0, 8, q2_K_min_unpack, q2_K_min_x, DOT_QUNIT, MR)
// clang-format on

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

/* Blocks of 32 get tiles of up to 4 tokens, K blocks (more registers for the
 * sub-block sums) up to 3. */
#define TILES_4(TILE) TILE(1) TILE(2) TILE(3) TILE(4)
#define TILES_3(TILE) TILE(1) TILE(2) TILE(3)
TILES_4(TILE_Q8_0)
TILES_4(TILE_Q4_0)
TILES_4(TILE_Q5_0)
TILES_4(TILE_Q4_1)
TILES_4(TILE_Q5_1)
TILES_3(TILE_Q4_K)
TILES_3(TILE_Q5_K)
TILES_3(TILE_Q6_K)
TILES_3(TILE_Q3_K)
TILES_3(TILE_Q2_K)

#define QPANEL_FN(NAME, TYPE, QB, ...)                                                            \
    void kern_qpanel_avx2_##NAME(const void *restrict xq, int64_t n_tokens,                       \
                                 const void *restrict pw, int64_t k, int64_t n, int64_t p0,       \
                                 int64_t p1, float *restrict y) {                                 \
        static const qtile_fn tiles[] = {__VA_ARGS__};                                            \
        run(TYPE, tiles, (int)(sizeof(tiles) / sizeof(tiles[0])), QB, xq, n_tokens, pw, k, n, p0, \
            p1, y);                                                                               \
    }
#define TABLE_4(NAME) tile_##NAME##_1, tile_##NAME##_2, tile_##NAME##_3, tile_##NAME##_4
#define TABLE_3(NAME) tile_##NAME##_1, tile_##NAME##_2, tile_##NAME##_3

QPANEL_FN(q8_0, QUANT_Q8_0, 512, TABLE_4(q8_0))
QPANEL_FN(q4_0, QUANT_Q4_0, 256, TABLE_4(q4_0))
QPANEL_FN(q5_0, QUANT_Q5_0, 320, TABLE_4(q5_0))
QPANEL_FN(q4_1, QUANT_Q4_1, 256, TABLE_4(q4_1))
QPANEL_FN(q5_1, QUANT_Q5_1, 320, TABLE_4(q5_1))
QPANEL_FN(q4_K, QUANT_Q4_K, 2048, TABLE_3(q4_K))
QPANEL_FN(q5_K, QUANT_Q5_K, 2560, TABLE_3(q5_K))
QPANEL_FN(q6_K, QUANT_Q6_K, 3072, TABLE_3(q6_K))
QPANEL_FN(q3_K, QUANT_Q3_K, 1536, TABLE_3(q3_K))
QPANEL_FN(q2_K, QUANT_Q2_K, 1024, TABLE_3(q2_K))

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
