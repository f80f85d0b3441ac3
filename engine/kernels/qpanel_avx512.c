/*
 * qpanel_avx512.c - products over q-panels (kernels.h, "q-panels") with
 * AVX-512 F/BW/VL, compiled twice by engine/meson.build: as
 * kern_qpanel_avx512_* and, with -mavx512vnni -DKERN_VNNI, as
 * kern_qpanel_vnni_*. One zmm of a chunk is 16 output rows x 4 k; a tile
 * keeps MR tokens x NP panels of int32 block sums and float accumulators in
 * registers and, per chunk, loads (and unpacks) NP weight vectors once and
 * multiplies each by every token's 4 broadcast activation bytes.
 *
 * VNNI: vpdpbusd (u8 x s8, 4 products into each int32 lane) starts from the
 * token's offset term (e.g. -128 x the block sum of q8_0), so the int32 is
 * the exact GGUF sum. Without VNNI, vpmaddubsw + vpmaddwd compute the same
 * sums: 4- and 6-bit quants (at most 63 x 127 x 2 per int16 pair) never
 * saturate; q8_0 (w + 128 would) goes back to signed bytes and multiplies
 * |w| by x with w's sign. The float work per (row, token) is the sequence of
 * kernels/qpanel.c, so every level and tile shape gives the same bits.
 * Called only after kern_dispatch_init() found the features.
 */
#include <immintrin.h>
#include <string.h>

#include "engine/kernels/kernels.h"
#include "engine/format/quant.h"

#ifdef KERN_VNNI
#define QFN(name) kern_qpanel_vnni_##name
#else
#define QFN(name) kern_qpanel_avx512_##name
#endif

#define QPANEL_CHUNK_BYTES (384 * 1024)  // activations of a chunk of tokens, kept in L2

/* The 4 activation bytes at p in every int32 lane. */
static inline __m512i bcast4(const int8_t *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return _mm512_set1_epi32(v);
}

static inline __m512 load_f16x16(const uint8_t *p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
}

/* u8 x s8 products of 4-bit and 6-bit quants: VNNI accumulates into the
 * int32 sums directly; otherwise int16 pair sums are added up in `t16` and
 * folded into int32 by flush16() (callers flush before they can overflow). */
#ifdef KERN_VNNI
#define DOT_U8(is, t16, w, x) ((is) = _mm512_dpbusd_epi32((is), (w), (x)))
#define FLUSH16(is, t16)      ((void)0)
#define ZERO16(t16)           ((void)0)
#else
#define DOT_U8(is, t16, w, x) ((t16) = _mm512_add_epi16((t16), _mm512_maddubs_epi16((w), (x))))
#define FLUSH16(is, t16) \
    ((is) = _mm512_add_epi32((is), _mm512_madd_epi16((t16), _mm512_set1_epi16(1))))
#define ZERO16(t16) ((t16) = _mm512_setzero_si512())
#endif

/* Decode streams the panels from memory: asking for the lines QPANEL_PREFETCH
 * bytes ahead of the block being multiplied made one token's product faster
 * on 2 threads (q4_0 23.6 -> 26.5 GB/s, q4_K and q5_K 7-20%, q8_0 and q6_K
 * within noise; 1, 1.5 and 3 KiB ahead were no better). Tiles do it only
 * when the batch is one group of tokens (`stream`): with the lines already
 * in L1/L2 (prefill) the extra loads cost 5-18%. */
#define QPANEL_PREFETCH 2048

static inline void prefetch_ahead(const uint8_t *block, int bytes) {
    for (int i = 0; i < bytes; i += 64) {
        _mm_prefetch((const char *)(block + QPANEL_PREFETCH + i), _MM_HINT_T0);
    }
}

/* ---- the formats' unpack steps ------------------------------------------------
 *
 * A format is a set of inline functions over one block of one panel (qb: its
 * quants, meta: its scales) that the tile skeleton below calls; they hold all
 * that differs between formats. A block has NSUB sub-blocks of NU units; a
 * unit is VPU (1 or 2) weight vectors, each multiplied by the token's 4
 * activation bytes at F_xoff(j, u, v) within the block:
 *   F_init(a, ib, j)      the int32 sums' start (the offset term, e.g.
 *                         -8 x the block sum of the activations for q4_0)
 *   F_unpack(qb, j, u)    the unit's weight bytes (u8, or for q8_0 |w| and
 *                         w's sign without VNNI)
 *   F_scale(meta, j)      the scale of the sub-block's int sums: the weights'
 *                         d (a block of 32) or d x the sub-block scale (K)
 * plus, for the K formats with mins, F_min_unpack(meta, i) and F_min_x(a, ib, i)
 * (the mins as int16 and the activation sums they multiply). */

struct qunit {
    __m512i w[2];   // the unit's weight vectors (VPU of them)
    __mmask64 neg;  // q8_0 without VNNI: the bytes whose weight is negative
};

static inline struct qunit unit2(__m512i w0, __m512i w1) {
    return (struct qunit){{w0, w1}, 0};
}

static inline __m512i nib_lo(__m512i v) {
    return _mm512_and_si512(v, _mm512_set1_epi8(15));
}
static inline __m512i nib_hi(__m512i v) {
    return nib_lo(_mm512_srli_epi16(v, 4));
}

/* Each format's int8 dot of a unit vector with 4 broadcast activation bytes. */
#define DOT_QUNIT(is, t16, q, v, x) DOT_U8(is, t16, (q).w[v], x)

/* q8_0: unit g of a block = w + 128 of group g. */
static inline struct qunit q8_0_unpack(const uint8_t *qb, int j, int u) {
    (void)j;
    const __m512i v = _mm512_loadu_si512(qb + u * 64);
#ifdef KERN_VNNI
    return unit2(v, v);
#else
    /* |w| times x negated where w < 0 (|w| <= 128, |x| <= 127: no saturation). */
    const __m512i ws = _mm512_xor_si512(v, _mm512_set1_epi8((char)0x80));
    return (struct qunit){{_mm512_abs_epi8(ws), ws}, _mm512_movepi8_mask(ws)};
#endif
}
static inline int q8_0_xoff(int j, int u, int v) {
    return (void)j, (void)v, 4 * u;
}
#ifdef KERN_VNNI
/* u = w + 128: sum u x + (-128 sum x) = sum w x. */
static inline __m512i q8_0_init(const struct kern_qact *a, int64_t ib, int j) {
    return (void)j, _mm512_set1_epi32(a->n128[ib]);
}
#define DOT_Q8_0(is, t16, q, v, x) ((is) = _mm512_dpbusd_epi32((is), (q).w[0], (x)))
#else
static inline __m512i q8_0_init(const struct kern_qact *a, int64_t ib, int j) {
    return (void)a, (void)ib, (void)j, _mm512_setzero_si512();
}
/* One pair sum of |w| x (x negated where w < 0) reaches 128 x 127 x 2 < 32768:
 * one unit per int16 flush. */
#define DOT_Q8_0(is, t16, q, v, x)    \
    ((t16) = _mm512_add_epi16(        \
         (t16), _mm512_maddubs_epi16( \
                    (q).w[0], _mm512_mask_sub_epi8((x), (q).neg, _mm512_setzero_si512(), (x)))))
#endif
static inline __m512 b32_scale(const uint8_t *meta, int j) {
    return (void)j, load_f16x16(meta);
}
#define q8_0_scale b32_scale

/* q4_0, q5_0, q4_1, q5_1: unit c = nibbles of groups c (low) and c + 4 (high),
 * q5's 5th bits from a chunk at 256 (bit 8 b + g). */

/* The 5th bits of group g (bit 8 b + g of each lane) as 0x10 in each byte. */
static inline __m512i hbit16(__m512i hb, int g) {
    const __m512i v = g < 4 ? _mm512_slli_epi32(hb, 4 - g) : _mm512_srli_epi32(hb, g - 4);
    return _mm512_and_si512(v, _mm512_set1_epi8(0x10));
}

static inline struct qunit q4_0_unpack(const uint8_t *qb, int j, int u) {
    (void)j;
    const __m512i v = _mm512_loadu_si512(qb + u * 64);
    return unit2(nib_lo(v), nib_hi(v));
}
static inline struct qunit q5_0_unpack(const uint8_t *qb, int j, int u) {
    const struct qunit n = q4_0_unpack(qb, j, u);
    const __m512i hb = _mm512_loadu_si512(qb + 256);
    return unit2(_mm512_or_si512(n.w[0], hbit16(hb, u)),
                 _mm512_or_si512(n.w[1], hbit16(hb, u + 4)));
}
#define q4_1_unpack q4_0_unpack
#define q5_1_unpack q5_0_unpack
static inline int b32_xoff(int j, int u, int v) {
    return (void)j, 16 * v + 4 * u;
}
#define q4_0_xoff b32_xoff
#define q5_0_xoff b32_xoff
#define q4_1_xoff b32_xoff
#define q5_1_xoff b32_xoff
static inline __m512i q4_0_init(const struct kern_qact *a, int64_t ib, int j) {
    return (void)j, _mm512_set1_epi32(a->n8[ib]);
}
static inline __m512i q5_0_init(const struct kern_qact *a, int64_t ib, int j) {
    return (void)j, _mm512_set1_epi32(a->n16[ib]);
}
static inline __m512i init_zero(const struct kern_qact *a, int64_t ib, int j) {
    return (void)a, (void)ib, (void)j, _mm512_setzero_si512();
}
#define q4_1_init  init_zero
#define q5_1_init  init_zero
#define q4_0_scale b32_scale
#define q5_0_scale b32_scale
#define q4_1_scale b32_scale
#define q5_1_scale b32_scale

/* q4_K, q5_K: sub-block j = units 0..7 of chunks 8 (j / 2) .. (low nibbles for
 * even j, high for odd), q5_K's 5th bits in chunk 2048 / 64 + j (bit 8 b + t);
 * meta: d, dmin (at 32), 8 u8 scales per row at 64, mins (u8) at 192. */
static inline struct qunit q4_K_unpack(const uint8_t *qb, int j, int u) {
    const __m512i v = _mm512_loadu_si512(qb + (8 * (j / 2) + u) * 64);
    return unit2(j % 2 ? nib_hi(v) : nib_lo(v), v);
}
/* NOTE: q4_K's nibbles, but shifted first and then masked. With the 5th bits
 * or'ed in, q4_K's select form compiled 10% slower at 4 and 64 tokens; for
 * q4_K alone the shift form was 10% slower at one token (VNNI; the compiler
 * keeps the sub-block loop, so j % 2 is not a constant). */
static inline struct qunit q5_K_unpack(const uint8_t *qb, int j, int u) {
    __m512i v = _mm512_loadu_si512(qb + (8 * (j / 2) + u) * 64);
    if (j % 2) v = _mm512_srli_epi16(v, 4);
    const __m512i hb = _mm512_loadu_si512(qb + 2048 + 64 * j);
    const __m512i w = _mm512_or_si512(nib_lo(v), hbit16(hb, u));
    return unit2(w, w);
}
static inline int k4_xoff(int j, int u, int v) {
    return (void)v, 64 * (j / 2) + 32 * (j % 2) + 4 * u;
}
#define q4_K_xoff k4_xoff
#define q5_K_xoff k4_xoff
#define q4_K_init init_zero
#define q5_K_init init_zero
static inline __m512 k4_scale(const uint8_t *meta, int j) {
    const __m512 sc = _mm512_cvtepi32_ps(
        _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(meta + 64 + 16 * j))));
    return _mm512_mul_ps(load_f16x16(meta), sc);
}
#define q4_K_scale k4_scale
#define q5_K_scale k4_scale
static inline __m512i k4_min_unpack(const uint8_t *meta, int i) {
    return _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(meta + 192 + 32 * i)));
}
static inline const int16_t *k4_min_x(const struct kern_qact *a, int64_t ib, int i) {
    return a->b32 + 8 * ib + 2 * i;
}
#define q4_K_min_unpack k4_min_unpack
#define q5_K_min_unpack k4_min_unpack
#define q4_K_min_x      k4_min_x
#define q5_K_min_x      k4_min_x

/* q6_K: sub-block j = chunks 3 j, 3 j + 1 (low nibbles), 3 j + 2 (high bits);
 * unit h = groups 2 h, 2 h + 1; meta: d, 16 i8 scales per row at 32. */
static inline struct qunit q6_K_unpack(const uint8_t *qb, int j, int u) {
    const __m512i m30 = _mm512_set1_epi8(0x30);
    const uint8_t *c = qb + 192 * j;
    const __m512i n = _mm512_loadu_si512(c + 64 * u);
    const __m512i hb = _mm512_loadu_si512(c + 128);
    /* groups 2u, 2u + 1: high bits 4u, 4u + 2 .. moved to bits 4, 5 */
    const __m512i h0 = u ? hb : _mm512_slli_epi16(hb, 4);
    const __m512i h1 = u ? _mm512_srli_epi16(hb, 2) : _mm512_slli_epi16(hb, 2);
    return unit2(_mm512_or_si512(nib_lo(n), _mm512_and_si512(h0, m30)),
                 _mm512_or_si512(nib_hi(n), _mm512_and_si512(h1, m30)));
}
static inline int q6_K_xoff(int j, int u, int v) {
    return 16 * j + 8 * u + 4 * v;
}
static inline __m512i q6_K_init(const struct kern_qact *a, int64_t ib, int j) {
    return _mm512_set1_epi32(a->n32[16 * ib + j]);
}
static inline __m512 k6_scale(const uint8_t *meta, int j) {
    const __m512 sc = _mm512_cvtepi32_ps(
        _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(meta + 32 + 16 * j))));
    return _mm512_mul_ps(load_f16x16(meta), sc);
}
#define q6_K_scale k6_scale

/* q3_K, q2_K: 16 chunks of 2-bit values (group i in bits 2 i), q3_K's 3rd bits
 * in 8 more chunks (bit 8 b + 4 (j % 2) + i). q3_K meta: d, i8 scales at 32;
 * q2_K meta: d, dmin (at 32), scale | min << 4 per sub-block at 64. */

/* The 2 bits of group i (bits 2 i, 2 i + 1 of each byte) as 0..3. */
static inline __m512i bits2(__m512i c, int i) {
    return _mm512_and_si512(i ? _mm512_srli_epi16(c, 2 * i) : c, _mm512_set1_epi8(3));
}

/* The 3rd bits of group g (bit 8 b + g of each lane) as 0x04 in each byte. */
static inline __m512i hbit4(__m512i hb, int g) {
    const __m512i v = g < 2 ? _mm512_slli_epi32(hb, 2 - g) : _mm512_srli_epi32(hb, g - 2);
    return _mm512_and_si512(v, _mm512_set1_epi8(4));
}

static inline struct qunit q2_K_unpack(const uint8_t *qb, int j, int u) {
    const __m512i w = bits2(_mm512_loadu_si512(qb + 64 * j), u);
    return unit2(w, w);
}
static inline struct qunit q3_K_unpack(const uint8_t *qb, int j, int u) {
    const __m512i hb = _mm512_loadu_si512(qb + 1024 + 64 * (j / 2));
    const __m512i w = _mm512_or_si512(q2_K_unpack(qb, j, u).w[0], hbit4(hb, 4 * (j % 2) + u));
    return unit2(w, w);
}
static inline int k2_xoff(int j, int u, int v) {
    return (void)v, 16 * j + 4 * u;
}
#define q3_K_xoff k2_xoff
#define q2_K_xoff k2_xoff
static inline __m512i q3_K_init(const struct kern_qact *a, int64_t ib, int j) {
    return _mm512_set1_epi32(a->n4[16 * ib + j]);
}
#define q2_K_init  init_zero
#define q3_K_scale k6_scale
static inline __m512 q2_K_scale(const uint8_t *meta, int j) {
    /* scale | min << 4 of sub-blocks 2 (j / 2) and 2 (j / 2) + 1 per row */
    __m512i w =
        _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(meta + 64 + 32 * (j / 2))));
    if (j % 2) w = _mm512_srli_epi32(w, 8);
    const __m512 sc = _mm512_cvtepi32_ps(_mm512_and_si512(w, _mm512_set1_epi32(15)));
    return _mm512_mul_ps(load_f16x16(meta), sc);
}
static inline __m512i q2_K_min_unpack(const uint8_t *meta, int i) {
    return _mm512_srli_epi16(
        _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(meta + 64 + 32 * i))), 4);
}
static inline const int16_t *q2_K_min_x(const struct kern_qact *a, int64_t ib, int i) {
    return a->b16 + 16 * ib + 2 * i;
}

/* Formats without mins (never called: NMIN is 0 for them). */
#define NO_MIN_UNPACK(meta, i) _mm512_setzero_si512()
#define NO_MIN_X(a, ib, i)     ((const int16_t *)(a)->qs)

#ifdef KERN_VNNI
#define DOT_I16(acc, a16, b16) ((acc) = _mm512_dpwssd_epi32((acc), (a16), (b16)))
#else
#define DOT_I16(acc, a16, b16) ((acc) = _mm512_add_epi32((acc), _mm512_madd_epi16((a16), (b16))))
#endif

/* ---- the tile skeleton: MR tokens x NP panels, written once ----------------------
 *
 * F: the format's prefix; TYPE its quant_type; QK values and QB quant bytes
 * (per panel) of a block, MB meta bytes; NSUB sub-blocks of NU units of VPU
 * vectors; FLUSH: units between int16 flushes without VNNI (0: at the end of
 * the sub-block); KSUB: 1 when the scales are per sub-block and the block's
 * activation d multiplies their sum (K formats), 0 when one block scale
 * multiplies the int sums (then FSMIN: 1 adds the weights' min times the
 * activations' block sum, q4_1/q5_1); NMIN: units of K mins (0: none);
 * DOT: the unit dot. The float work per (row, token) is kernels/qpanel.c's
 * sequence, so every format and tile shape gives the portable bits. */
#define TILE(F, TYPE, QK, QB, MB, NSUB, NU, VPU, FLUSH, KSUB, FSMIN, NMIN, MINU, MINX, DOT, MR,    \
             NP)                                                                                   \
    static void tile_##F##_##MR##_##NP(                                                            \
        const uint8_t *restrict xq, size_t act_row, int64_t k, const uint8_t *restrict pw,         \
        size_t stride, float *restrict y, int64_t ldy, __mmask16 last, bool stream) {              \
        const int64_t nb = k / (QK);                                                               \
        struct kern_qact a[MR];                                                                    \
        for (int m = 0; m < MR; m++) a[m] = kern_qact_view(TYPE, xq + m * act_row, k);             \
        __m512 acc[MR][NP];                                                                        \
        for (int m = 0; m < MR; m++)                                                               \
            for (int p = 0; p < NP; p++) acc[m][p] = _mm512_setzero_ps();                          \
        for (int64_t ib = 0; ib < nb; ib++) {                                                      \
            if (stream)                                                                            \
                for (int p = 0; p < NP; p++) prefetch_ahead(pw + p * stride + ib * (QB), (QB));    \
            __m512 s[MR][NP];                                                                      \
            for (int m = 0; m < MR; m++)                                                           \
                for (int p = 0; p < NP; p++) s[m][p] = _mm512_setzero_ps();                        \
            for (int j = 0; j < (NSUB); j++) {                                                     \
                __m512i is[MR][NP], t16[MR][NP];                                                   \
                (void)t16;                                                                         \
                for (int m = 0; m < MR; m++)                                                       \
                    for (int p = 0; p < NP; p++) {                                                 \
                        is[m][p] = F##_init(&a[m], ib, j);                                         \
                        ZERO16(t16[m][p]);                                                         \
                    }                                                                              \
                for (int u = 0; u < (NU); u++) {                                                   \
                    struct qunit w[NP];                                                            \
                    for (int p = 0; p < NP; p++)                                                   \
                        w[p] = F##_unpack(pw + p * stride + ib * (QB), j, u);                      \
                    for (int m = 0; m < MR; m++)                                                   \
                        for (int v = 0; v < (VPU); v++) {                                          \
                            const __m512i x = bcast4(a[m].qs + ib * (QK) + F##_xoff(j, u, v));     \
                            for (int p = 0; p < NP; p++) DOT(is[m][p], t16[m][p], w[p], v, x);     \
                        }                                                                          \
                    if ((FLUSH) && u % ((FLUSH) ? (FLUSH) : 1) == (FLUSH)-1) {                     \
                        for (int m = 0; m < MR; m++)                                               \
                            for (int p = 0; p < NP; p++) {                                         \
                                FLUSH16(is[m][p], t16[m][p]);                                      \
                                ZERO16(t16[m][p]);                                                 \
                            }                                                                      \
                    }                                                                              \
                }                                                                                  \
                for (int p = 0; p < NP; p++) {                                                     \
                    const uint8_t *meta = pw + p * stride + nb * (QB) + ib * (MB);                 \
                    const __m512 sc = F##_scale(meta, j);                                          \
                    for (int m = 0; m < MR; m++) {                                                 \
                        if (!(FLUSH)) FLUSH16(is[m][p], t16[m][p]);                                \
                        if (KSUB) {                                                                \
                            s[m][p] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(is[m][p]), sc, s[m][p]);  \
                            continue;                                                              \
                        }                                                                          \
                        const __m512 dx = _mm512_set1_ps(a[m].d[ib]);                              \
                        acc[m][p] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(is[m][p]),                  \
                                                    _mm512_mul_ps(sc, dx), acc[m][p]);             \
                        if (FSMIN) {                                                               \
                            acc[m][p] = _mm512_fmadd_ps(_mm512_set1_ps(a[m].fs[ib]),               \
                                                        _mm512_mul_ps(load_f16x16(meta + 32), dx), \
                                                        acc[m][p]);                                \
                        }                                                                          \
                    }                                                                              \
                }                                                                                  \
            }                                                                                      \
            if (!(KSUB)) continue;                                                                 \
            __m512i mn[MR][NP];                                                                    \
            for (int m = 0; m < MR; m++)                                                           \
                for (int p = 0; p < NP; p++) mn[m][p] = _mm512_setzero_si512();                    \
            for (int i = 0; i < (NMIN); i++) {                                                     \
                __m512i mv[NP];                                                                    \
                for (int p = 0; p < NP; p++)                                                       \
                    mv[p] = MINU(pw + p * stride + nb * (QB) + ib * (MB), i);                      \
                for (int m = 0; m < MR; m++) {                                                     \
                    const __m512i b = bcast4((const int8_t *)MINX(&a[m], ib, i));                  \
                    for (int p = 0; p < NP; p++) DOT_I16(mn[m][p], mv[p], b);                      \
                }                                                                                  \
            }                                                                                      \
            for (int p = 0; p < NP; p++) {                                                         \
                const __m512 dmin = load_f16x16(pw + p * stride + nb * (QB) + ib * (MB) + 32);     \
                for (int m = 0; m < MR; m++) {                                                     \
                    if (NMIN) {                                                                    \
                        const __m512i neg = _mm512_sub_epi32(_mm512_setzero_si512(), mn[m][p]);    \
                        s[m][p] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(neg), dmin, s[m][p]);         \
                    }                                                                              \
                    acc[m][p] = _mm512_fmadd_ps(s[m][p], _mm512_set1_ps(a[m].d[ib]), acc[m][p]);   \
                }                                                                                  \
            }                                                                                      \
        }                                                                                          \
        for (int m = 0; m < MR; m++) {                                                             \
            for (int p = 0; p < NP - 1; p++) _mm512_storeu_ps(y + m * ldy + p * 16, acc[m][p]);    \
            _mm512_mask_storeu_ps(y + m * ldy + (NP - 1) * 16, last, acc[m][NP - 1]);              \
        }                                                                                          \
    }

/* Each format's row: F, TYPE, QK, QB, MB, NSUB, NU, VPU, FLUSH, KSUB, FSMIN, NMIN, mins.
 * Without VNNI, 4-bit units sum 8 products per int16 (8 x 15 x 127 x 2 < 32768)
 * before a flush, 5-bit ones 4, 6-bit ones 2. */
// clang-format off
#define TILE_Q8_0(MR, NP) TILE(q8_0, QUANT_Q8_0, QK8_0, 512,   32, 1,  8, 1, 1, 0, 0, 0, NO_MIN_UNPACK, NO_MIN_X, DOT_Q8_0, MR, NP)
#define TILE_Q4_0(MR, NP) TILE(q4_0, QUANT_Q4_0, QK4_0, 256,   32, 1,  4, 2, 0, 0, 0, 0, NO_MIN_UNPACK, NO_MIN_X, DOT_QUNIT, MR, NP)
#define TILE_Q5_0(MR, NP) TILE(q5_0, QUANT_Q5_0, 32,    320,   32, 1,  4, 2, 2, 0, 0, 0, NO_MIN_UNPACK, NO_MIN_X, DOT_QUNIT, MR, NP)
#define TILE_Q4_1(MR, NP) TILE(q4_1, QUANT_Q4_1, 32,    256,   64, 1,  4, 2, 0, 0, 1, 0, NO_MIN_UNPACK, NO_MIN_X, DOT_QUNIT, MR, NP)
#define TILE_Q5_1(MR, NP) TILE(q5_1, QUANT_Q5_1, 32,    320,   64, 1,  4, 2, 2, 0, 1, 0, NO_MIN_UNPACK, NO_MIN_X, DOT_QUNIT, MR, NP)
#define TILE_Q4_K(MR, NP) TILE(q4_K, QUANT_Q4_K, QK_K,  2048, 320, 8,  8, 1, 0, 1, 0, 4, q4_K_min_unpack, q4_K_min_x, DOT_QUNIT, MR, NP)
#define TILE_Q5_K(MR, NP) TILE(q5_K, QUANT_Q5_K, QK_K,  2560, 320, 8,  8, 1, 4, 1, 0, 4, q5_K_min_unpack, q5_K_min_x, DOT_QUNIT, MR, NP)
#define TILE_Q6_K(MR, NP) TILE(q6_K, QUANT_Q6_K, QK_K,  3072, 288, 16, 2, 2, 1, 1, 0, 0, NO_MIN_UNPACK, NO_MIN_X, DOT_QUNIT, MR, NP)
#define TILE_Q3_K(MR, NP) TILE(q3_K, QUANT_Q3_K, QK_K,  1536, 288, 16, 4, 1, 0, 1, 0, 0, NO_MIN_UNPACK, NO_MIN_X, DOT_QUNIT, MR, NP)
#define TILE_Q2_K(MR, NP) TILE(q2_K, QUANT_Q2_K, QK_K,  1024, 320, 16, 4, 1, 0, 1, 0, 8, q2_K_min_unpack, q2_K_min_x, DOT_QUNIT, MR, NP)
// clang-format on

typedef void (*qtile_fn)(const uint8_t *restrict xq, size_t act_row, int64_t k,
                         const uint8_t *restrict pw, size_t stride, float *restrict y, int64_t ldy,
                         __mmask16 last, bool stream);

/* Loops over chunks of tokens (their activations stay in L2), then groups of
 * up to np_max panels, then groups of up to mr_max tokens; tiles[np - 1][mr - 1]. */
static void run(enum quant_type t, const qtile_fn *tiles, int mr_max, int np_max,
                const void *restrict xq, int64_t n_tokens, const void *restrict pw, int64_t k,
                int64_t n, int64_t p0, int64_t p1, float *restrict y) {
    const size_t act_row = kern_qpanel_act_bytes(t, k);
    const size_t stride = kern_qpanel_stride(t, k);
    const int64_t n_panels = (n + KERN_PANEL_ROWS - 1) / KERN_PANEL_ROWS;
    int64_t mc = (int64_t)(QPANEL_CHUNK_BYTES / act_row) / mr_max * mr_max;
    if (mc < mr_max) mc = mr_max;
    for (int64_t t0 = 0; t0 < n_tokens; t0 += mc) {
        const int64_t t1 = n_tokens - t0 < mc ? n_tokens : t0 + mc;
        // one group of tokens: every weight line comes from memory once (decode)
        const bool stream = t1 - t0 <= mr_max;
        for (int64_t p = p0; p < p1; p += np_max) {
            const int64_t np = p1 - p < np_max ? p1 - p : np_max;
            __mmask16 last = 0xffff;
            if (p + np == n_panels && n % KERN_PANEL_ROWS) {
                last = (__mmask16)((1u << (n % KERN_PANEL_ROWS)) - 1);
            }
            for (int64_t tt = t0; tt < t1; tt += mr_max) {
                const int64_t mr = t1 - tt < mr_max ? t1 - tt : mr_max;
                tiles[(np - 1) * mr_max + (mr - 1)]((const uint8_t *)xq + (size_t)tt * act_row,
                                                    act_row, k, (const uint8_t *)pw + p * stride,
                                                    stride, y + tt * n + p * KERN_PANEL_ROWS, n,
                                                    last, stream);
            }
        }
    }
}

// clang-format off
/* Every tile of up to 4 tokens x 2 panels (4 x 2 measured as good as 6 x 2,
 * 5 x 2, 8 x 1 and 3 x 3 within noise), and their table by [np - 1][mr - 1]. */
#define TILES_4x2(TILE) \
    TILE(1, 1) TILE(2, 1) TILE(3, 1) TILE(4, 1) TILE(1, 2) TILE(2, 2) TILE(3, 2) TILE(4, 2)
#define TABLE_4x2(NAME) { \
    tile_##NAME##_1_1, tile_##NAME##_2_1, tile_##NAME##_3_1, tile_##NAME##_4_1, \
    tile_##NAME##_1_2, tile_##NAME##_2_2, tile_##NAME##_3_2, tile_##NAME##_4_2 }
// clang-format on

TILES_4x2(TILE_Q8_0) TILES_4x2(TILE_Q4_0) TILES_4x2(TILE_Q5_0) TILES_4x2(TILE_Q4_1)
    TILES_4x2(TILE_Q5_1) TILES_4x2(TILE_Q4_K) TILES_4x2(TILE_Q5_K) TILES_4x2(TILE_Q6_K)
        TILES_4x2(TILE_Q3_K) TILES_4x2(TILE_Q2_K)
#define QPANEL_FN(NAME, TYPE)                                                                     \
    void QFN(NAME)(const void *restrict xq, int64_t n_tokens, const void *restrict pw, int64_t k, \
                   int64_t n, int64_t p0, int64_t p1, float *restrict y) {                        \
        static const qtile_fn tiles[] = TABLE_4x2(NAME);                                          \
        run(TYPE, tiles, 4, 2, xq, n_tokens, pw, k, n, p0, p1, y);                                \
    }

            QPANEL_FN(q8_0, QUANT_Q8_0) QPANEL_FN(q4_0, QUANT_Q4_0) QPANEL_FN(q5_0, QUANT_Q5_0)
                QPANEL_FN(q4_1, QUANT_Q4_1) QPANEL_FN(q5_1, QUANT_Q5_1) QPANEL_FN(q4_K, QUANT_Q4_K)
                    QPANEL_FN(q5_K, QUANT_Q5_K) QPANEL_FN(q6_K, QUANT_Q6_K)
                        QPANEL_FN(q3_K, QUANT_Q3_K) QPANEL_FN(q2_K, QUANT_Q2_K)

#ifndef KERN_VNNI
    /* ---- activations: the rounding of quant.c's q8_0/q8_1/q8_K from_f32 (max |x|,
     * d = max / 127, q = lrint(x / d) within +-127, in float), 16 lanes at a
     * time; the scale's f16 conversion is quant.c's own. ------------------------- */

    /* 16 rounded values of x * id in [-127, 127] (the current rounding mode is
     * lrintf's: to nearest even). */
    static inline __m512i round16(const float *x, float id) {
    __m512i q = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(x), _mm512_set1_ps(id)));
    return _mm512_max_epi32(_mm512_min_epi32(q, _mm512_set1_epi32(127)), _mm512_set1_epi32(-127));
}

static inline float max_abs(const float *x, int n) {
    __m512 m = _mm512_setzero_ps();
    for (int i = 0; i < n; i += 16) m = _mm512_max_ps(m, _mm512_abs_ps(_mm512_loadu_ps(x + i)));
    return _mm512_reduce_max_ps(m);
}

void kern_qpanel_avx512_act(enum quant_type t, const float *restrict x, int64_t k,
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
                const __m512i q = round16(x + 16 * j, id);
                _mm_storeu_si128((__m128i *)(qs + ib * QK_K + 16 * j), _mm512_cvtsepi32_epi8(q));
                const int32_t sum = _mm512_reduce_add_epi32(q);
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
        const __m512i q0 = round16(x, id);
        const __m512i q1 = round16(x + 16, id);
        _mm_storeu_si128((__m128i *)(qs + ib * QK8_0), _mm512_cvtsepi32_epi8(q0));
        _mm_storeu_si128((__m128i *)(qs + ib * QK8_0 + 16), _mm512_cvtsepi32_epi8(q1));
        const int32_t sum = _mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1));
        n8[ib] = -8 * sum;
        n16[ib] = -16 * sum;
        n128[ib] = -128 * sum;
        fs[ib] = (float)sum;
    }
}
#endif
