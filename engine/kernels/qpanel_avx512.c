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

/* ---- q8_0: chunk g of a block = w + 128 of group g ------------------------- */

#ifdef KERN_VNNI
/* u = w + 128: sum u x + (-128 sum x) = sum w x. */
#define Q8_PREP(p)       (void)0
#define Q8_INIT(m, ib)   _mm512_set1_epi32(a[m].n128[ib])
#define Q8_DOT(is, p, x) ((is) = _mm512_dpbusd_epi32((is), wv[p], (x)))
#else
/* |w| times x negated where w < 0 (|w| <= 128, |x| <= 127: no saturation). */
#define Q8_PREP(p)                                                           \
    do {                                                                     \
        __m512i ws_ = _mm512_xor_si512(wv[p], _mm512_set1_epi8((char)0x80)); \
        neg[p] = _mm512_movepi8_mask(ws_);                                   \
        wv[p] = _mm512_abs_epi8(ws_);                                        \
    } while (0)
#define Q8_INIT(m, ib) _mm512_setzero_si512()
#define Q8_DOT(is, p, x)                                                                       \
    ((is) = _mm512_add_epi32(                                                                  \
         (is), _mm512_madd_epi16(                                                              \
                   _mm512_maddubs_epi16(                                                       \
                       wv[p], _mm512_mask_sub_epi8((x), neg[p], _mm512_setzero_si512(), (x))), \
                   _mm512_set1_epi16(1))))
#endif

#define TILE_Q8_0(MR, NP)                                                                       \
    static void tile_q8_0_##MR##_##NP(                                                          \
        const uint8_t *restrict xq, size_t act_row, int64_t k, const uint8_t *restrict pw,      \
        size_t stride, float *restrict y, int64_t ldy, __mmask16 last, bool stream) {           \
        const int64_t nb = k / QK8_0;                                                           \
        struct kern_qact a[MR];                                                                 \
        for (int m = 0; m < MR; m++) a[m] = kern_qact_view(QUANT_Q8_0, xq + m * act_row, k);    \
        __m512 acc[MR][NP];                                                                     \
        for (int m = 0; m < MR; m++)                                                            \
            for (int p = 0; p < NP; p++) acc[m][p] = _mm512_setzero_ps();                       \
        for (int64_t ib = 0; ib < nb; ib++) {                                                   \
            if (stream)                                                                         \
                for (int p = 0; p < NP; p++) prefetch_ahead(pw + p * stride + ib * 512, 512);   \
            __m512i is[MR][NP];                                                                 \
            for (int m = 0; m < MR; m++)                                                        \
                for (int p = 0; p < NP; p++) is[m][p] = Q8_INIT(m, ib);                         \
            for (int g = 0; g < 8; g++) {                                                       \
                __m512i wv[NP];                                                                 \
                __mmask64 neg[NP];                                                              \
                (void)neg;                                                                      \
                for (int p = 0; p < NP; p++) {                                                  \
                    wv[p] = _mm512_loadu_si512(pw + p * stride + ib * 512 + g * 64);            \
                    Q8_PREP(p);                                                                 \
                }                                                                               \
                for (int m = 0; m < MR; m++) {                                                  \
                    const __m512i x = bcast4(a[m].qs + ib * QK8_0 + 4 * g);                     \
                    for (int p = 0; p < NP; p++) Q8_DOT(is[m][p], p, x);                        \
                }                                                                               \
            }                                                                                   \
            for (int p = 0; p < NP; p++) {                                                      \
                const __m512 dw = load_f16x16(pw + p * stride + nb * 512 + ib * 32);            \
                for (int m = 0; m < MR; m++) {                                                  \
                    const __m512 dd = _mm512_mul_ps(dw, _mm512_set1_ps(a[m].d[ib]));            \
                    acc[m][p] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(is[m][p]), dd, acc[m][p]);   \
                }                                                                               \
            }                                                                                   \
        }                                                                                       \
        for (int m = 0; m < MR; m++) {                                                          \
            for (int p = 0; p < NP - 1; p++) _mm512_storeu_ps(y + m * ldy + p * 16, acc[m][p]); \
            _mm512_mask_storeu_ps(y + m * ldy + (NP - 1) * 16, last, acc[m][NP - 1]);           \
        }                                                                                       \
    }

/* ---- q4_0: chunk c = nibbles of groups c (low) and c + 4 (high) ------------ */

#define TILE_Q4_0(MR, NP)                                                                       \
    static void tile_q4_0_##MR##_##NP(                                                          \
        const uint8_t *restrict xq, size_t act_row, int64_t k, const uint8_t *restrict pw,      \
        size_t stride, float *restrict y, int64_t ldy, __mmask16 last, bool stream) {           \
        const int64_t nb = k / QK4_0;                                                           \
        const __m512i m4 = _mm512_set1_epi8(15);                                                \
        struct kern_qact a[MR];                                                                 \
        for (int m = 0; m < MR; m++) a[m] = kern_qact_view(QUANT_Q4_0, xq + m * act_row, k);    \
        __m512 acc[MR][NP];                                                                     \
        for (int m = 0; m < MR; m++)                                                            \
            for (int p = 0; p < NP; p++) acc[m][p] = _mm512_setzero_ps();                       \
        for (int64_t ib = 0; ib < nb; ib++) {                                                   \
            if (stream)                                                                         \
                for (int p = 0; p < NP; p++) prefetch_ahead(pw + p * stride + ib * 256, 256);   \
            __m512i is[MR][NP], t16[MR][NP];                                                    \
            (void)t16;                                                                          \
            for (int m = 0; m < MR; m++)                                                        \
                for (int p = 0; p < NP; p++) {                                                  \
                    is[m][p] = _mm512_set1_epi32(a[m].n8[ib]);                                  \
                    ZERO16(t16[m][p]);                                                          \
                }                                                                               \
            for (int c = 0; c < 4; c++) {                                                       \
                __m512i lo[NP], hi[NP];                                                         \
                for (int p = 0; p < NP; p++) {                                                  \
                    const __m512i v = _mm512_loadu_si512(pw + p * stride + ib * 256 + c * 64);  \
                    lo[p] = _mm512_and_si512(v, m4);                                            \
                    hi[p] = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);                      \
                }                                                                               \
                for (int m = 0; m < MR; m++) {                                                  \
                    const __m512i x0 = bcast4(a[m].qs + ib * QK4_0 + 4 * c);                    \
                    const __m512i x1 = bcast4(a[m].qs + ib * QK4_0 + 16 + 4 * c);               \
                    for (int p = 0; p < NP; p++) {                                              \
                        DOT_U8(is[m][p], t16[m][p], lo[p], x0);                                 \
                        DOT_U8(is[m][p], t16[m][p], hi[p], x1);                                 \
                    }                                                                           \
                }                                                                               \
            }                                                                                   \
            for (int p = 0; p < NP; p++) {                                                      \
                const __m512 dw = load_f16x16(pw + p * stride + nb * 256 + ib * 32);            \
                for (int m = 0; m < MR; m++) {                                                  \
                    FLUSH16(is[m][p], t16[m][p]);                                               \
                    const __m512 dd = _mm512_mul_ps(dw, _mm512_set1_ps(a[m].d[ib]));            \
                    acc[m][p] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(is[m][p]), dd, acc[m][p]);   \
                }                                                                               \
            }                                                                                   \
        }                                                                                       \
        for (int m = 0; m < MR; m++) {                                                          \
            for (int p = 0; p < NP - 1; p++) _mm512_storeu_ps(y + m * ldy + p * 16, acc[m][p]); \
            _mm512_mask_storeu_ps(y + m * ldy + (NP - 1) * 16, last, acc[m][NP - 1]);           \
        }                                                                                       \
    }

/* ---- q4_K: chunks 8 h .. 8 h + 7 = sub-blocks 2 h (low nibbles), 2 h + 1 (high) */

#ifdef KERN_VNNI
#define DOT_I16(acc, a16, b16) ((acc) = _mm512_dpwssd_epi32((acc), (a16), (b16)))
#else
#define DOT_I16(acc, a16, b16) ((acc) = _mm512_add_epi32((acc), _mm512_madd_epi16((a16), (b16))))
#endif

#define TILE_Q4_K(MR, NP)                                                                        \
    static void tile_q4_K_##MR##_##NP(                                                           \
        const uint8_t *restrict xq, size_t act_row, int64_t k, const uint8_t *restrict pw,       \
        size_t stride, float *restrict y, int64_t ldy, __mmask16 last, bool stream) {            \
        const int64_t nb = k / QK_K;                                                             \
        const __m512i m4 = _mm512_set1_epi8(15);                                                 \
        struct kern_qact a[MR];                                                                  \
        for (int m = 0; m < MR; m++) a[m] = kern_qact_view(QUANT_Q4_K, xq + m * act_row, k);     \
        __m512 acc[MR][NP];                                                                      \
        for (int m = 0; m < MR; m++)                                                             \
            for (int p = 0; p < NP; p++) acc[m][p] = _mm512_setzero_ps();                        \
        for (int64_t ib = 0; ib < nb; ib++) {                                                    \
            if (stream)                                                                          \
                for (int p = 0; p < NP; p++) prefetch_ahead(pw + p * stride + ib * 2048, 2048);  \
            __m512 s[MR][NP];                                                                    \
            for (int m = 0; m < MR; m++)                                                         \
                for (int p = 0; p < NP; p++) s[m][p] = _mm512_setzero_ps();                      \
            for (int j = 0; j < 8; j++) {                                                        \
                __m512i is[MR][NP], t16[MR][NP];                                                 \
                (void)t16;                                                                       \
                for (int m = 0; m < MR; m++)                                                     \
                    for (int p = 0; p < NP; p++) {                                               \
                        is[m][p] = _mm512_setzero_si512();                                       \
                        ZERO16(t16[m][p]);                                                       \
                    }                                                                            \
                for (int t = 0; t < 8; t++) {                                                    \
                    __m512i wv[NP];                                                              \
                    for (int p = 0; p < NP; p++) {                                               \
                        __m512i v = _mm512_loadu_si512(pw + p * stride + ib * 2048 +             \
                                                       (8 * (j / 2) + t) * 64);                  \
                        if (j % 2) v = _mm512_srli_epi16(v, 4);                                  \
                        wv[p] = _mm512_and_si512(v, m4);                                         \
                    }                                                                            \
                    for (int m = 0; m < MR; m++) {                                               \
                        const __m512i x =                                                        \
                            bcast4(a[m].qs + ib * QK_K + 64 * (j / 2) + 32 * (j % 2) + 4 * t);   \
                        for (int p = 0; p < NP; p++) DOT_U8(is[m][p], t16[m][p], wv[p], x);      \
                    }                                                                            \
                }                                                                                \
                for (int p = 0; p < NP; p++) {                                                   \
                    const uint8_t *meta = pw + p * stride + nb * 2048 + ib * 320;                \
                    const __m512 sc = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(                   \
                        _mm_loadu_si128((const __m128i *)(meta + 64 + 16 * j))));                \
                    const __m512 dsc = _mm512_mul_ps(load_f16x16(meta), sc);                     \
                    for (int m = 0; m < MR; m++) {                                               \
                        FLUSH16(is[m][p], t16[m][p]);                                            \
                        s[m][p] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(is[m][p]), dsc, s[m][p]);   \
                    }                                                                            \
                }                                                                                \
            }                                                                                    \
            __m512i mn[MR][NP];                                                                  \
            for (int m = 0; m < MR; m++)                                                         \
                for (int p = 0; p < NP; p++) mn[m][p] = _mm512_setzero_si512();                  \
            for (int i = 0; i < 4; i++) {                                                        \
                __m512i mv[NP];                                                                  \
                for (int p = 0; p < NP; p++) {                                                   \
                    const uint8_t *meta = pw + p * stride + nb * 2048 + ib * 320;                \
                    mv[p] = _mm512_cvtepu8_epi16(                                                \
                        _mm256_loadu_si256((const __m256i *)(meta + 192 + 32 * i)));             \
                }                                                                                \
                for (int m = 0; m < MR; m++) {                                                   \
                    const __m512i b = bcast4((const int8_t *)(a[m].b32 + 8 * ib + 2 * i));       \
                    for (int p = 0; p < NP; p++) DOT_I16(mn[m][p], mv[p], b);                    \
                }                                                                                \
            }                                                                                    \
            for (int p = 0; p < NP; p++) {                                                       \
                const __m512 dmin = load_f16x16(pw + p * stride + nb * 2048 + ib * 320 + 32);    \
                for (int m = 0; m < MR; m++) {                                                   \
                    const __m512i neg = _mm512_sub_epi32(_mm512_setzero_si512(), mn[m][p]);      \
                    s[m][p] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(neg), dmin, s[m][p]);           \
                    acc[m][p] = _mm512_fmadd_ps(s[m][p], _mm512_set1_ps(a[m].d[ib]), acc[m][p]); \
                }                                                                                \
            }                                                                                    \
        }                                                                                        \
        for (int m = 0; m < MR; m++) {                                                           \
            for (int p = 0; p < NP - 1; p++) _mm512_storeu_ps(y + m * ldy + p * 16, acc[m][p]);  \
            _mm512_mask_storeu_ps(y + m * ldy + (NP - 1) * 16, last, acc[m][NP - 1]);            \
        }                                                                                        \
    }

/* ---- q6_K: sub-block j = chunks 3 j, 3 j + 1 (low nibbles), 3 j + 2 (high bits) */

#define TILE_Q6_K(MR, NP)                                                                         \
    static void tile_q6_K_##MR##_##NP(                                                            \
        const uint8_t *restrict xq, size_t act_row, int64_t k, const uint8_t *restrict pw,        \
        size_t stride, float *restrict y, int64_t ldy, __mmask16 last, bool stream) {             \
        const int64_t nb = k / QK_K;                                                              \
        const __m512i m4 = _mm512_set1_epi8(15);                                                  \
        const __m512i m30 = _mm512_set1_epi8(0x30);                                               \
        struct kern_qact a[MR];                                                                   \
        for (int m = 0; m < MR; m++) a[m] = kern_qact_view(QUANT_Q6_K, xq + m * act_row, k);      \
        __m512 acc[MR][NP];                                                                       \
        for (int m = 0; m < MR; m++)                                                              \
            for (int p = 0; p < NP; p++) acc[m][p] = _mm512_setzero_ps();                         \
        for (int64_t ib = 0; ib < nb; ib++) {                                                     \
            if (stream)                                                                           \
                for (int p = 0; p < NP; p++) prefetch_ahead(pw + p * stride + ib * 3072, 3072);   \
            __m512 s[MR][NP];                                                                     \
            for (int m = 0; m < MR; m++)                                                          \
                for (int p = 0; p < NP; p++) s[m][p] = _mm512_setzero_ps();                       \
            for (int j = 0; j < 16; j++) {                                                        \
                __m512i is[MR][NP], t16[MR][NP];                                                  \
                (void)t16;                                                                        \
                for (int m = 0; m < MR; m++)                                                      \
                    for (int p = 0; p < NP; p++) {                                                \
                        is[m][p] = _mm512_set1_epi32(a[m].n32[16 * ib + j]);                      \
                        ZERO16(t16[m][p]);                                                        \
                    }                                                                             \
                for (int h = 0; h < 2; h++) {                                                     \
                    __m512i w0[NP], w1[NP];                                                       \
                    for (int p = 0; p < NP; p++) {                                                \
                        const uint8_t *c = pw + p * stride + ib * 3072 + 192 * j;                 \
                        const __m512i n = _mm512_loadu_si512(c + 64 * h);                         \
                        const __m512i hb = _mm512_loadu_si512(c + 128);                           \
                        /* groups 2h, 2h + 1: high bits 4h, 4h + 2 .. moved to bits 4, 5 */       \
                        const __m512i h0 = h ? hb : _mm512_slli_epi16(hb, 4);                     \
                        const __m512i h1 =                                                        \
                            h ? _mm512_srli_epi16(hb, 2) : _mm512_slli_epi16(hb, 2);              \
                        w0[p] =                                                                   \
                            _mm512_or_si512(_mm512_and_si512(n, m4), _mm512_and_si512(h0, m30));  \
                        w1[p] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(n, 4), m4),    \
                                                _mm512_and_si512(h1, m30));                       \
                    }                                                                             \
                    for (int m = 0; m < MR; m++) {                                                \
                        const int8_t *x = a[m].qs + ib * QK_K + 16 * j + 8 * h;                   \
                        const __m512i x0 = bcast4(x);                                             \
                        const __m512i x1 = bcast4(x + 4);                                         \
                        for (int p = 0; p < NP; p++) {                                            \
                            DOT_U8(is[m][p], t16[m][p], w0[p], x0);                               \
                            DOT_U8(is[m][p], t16[m][p], w1[p], x1);                               \
                        }                                                                         \
                    }                                                                             \
                    /* two 6-bit products per int16 lane: flush after every two */                \
                    for (int m = 0; m < MR; m++)                                                  \
                        for (int p = 0; p < NP; p++) {                                            \
                            FLUSH16(is[m][p], t16[m][p]);                                         \
                            ZERO16(t16[m][p]);                                                    \
                        }                                                                         \
                }                                                                                 \
                for (int p = 0; p < NP; p++) {                                                    \
                    const uint8_t *meta = pw + p * stride + nb * 3072 + ib * 288;                 \
                    const __m512 sc = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(                    \
                        _mm_loadu_si128((const __m128i *)(meta + 32 + 16 * j))));                 \
                    const __m512 dsc = _mm512_mul_ps(load_f16x16(meta), sc);                      \
                    for (int m = 0; m < MR; m++) {                                                \
                        s[m][p] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(is[m][p]), dsc, s[m][p]);    \
                    }                                                                             \
                }                                                                                 \
            }                                                                                     \
            for (int m = 0; m < MR; m++) {                                                        \
                const __m512 dx = _mm512_set1_ps(a[m].d[ib]);                                     \
                for (int p = 0; p < NP; p++) acc[m][p] = _mm512_fmadd_ps(s[m][p], dx, acc[m][p]); \
            }                                                                                     \
        }                                                                                         \
        for (int m = 0; m < MR; m++) {                                                            \
            for (int p = 0; p < NP - 1; p++) _mm512_storeu_ps(y + m * ldy + p * 16, acc[m][p]);   \
            _mm512_mask_storeu_ps(y + m * ldy + (NP - 1) * 16, last, acc[m][NP - 1]);             \
        }                                                                                         \
    }

/* ---- q5_0, q4_1, q5_1: q4_0's chunks, plus a chunk of 5th bits (bit 8 b + g)
 * and, for q4_1/q5_1, mins times the token's block sum. ----------------------- */

/* The 5th bits of group g (bit 8 b + g of each lane) as 0x10 in each byte. */
static inline __m512i hbit16(__m512i hb, int g) {
    const __m512i v = g < 4 ? _mm512_slli_epi32(hb, 4 - g) : _mm512_srli_epi32(hb, g - 4);
    return _mm512_and_si512(v, _mm512_set1_epi8(0x10));
}

#define TILE_B32(NAME, TYPE, QB, MB, HBIT, INIT, MIN, MR, NP)                                    \
    static void tile_##NAME##_##MR##_##NP(                                                       \
        const uint8_t *restrict xq, size_t act_row, int64_t k, const uint8_t *restrict pw,       \
        size_t stride, float *restrict y, int64_t ldy, __mmask16 last, bool stream) {            \
        const int64_t nb = k / 32;                                                               \
        const __m512i m4 = _mm512_set1_epi8(15);                                                 \
        struct kern_qact a[MR];                                                                  \
        for (int m = 0; m < MR; m++) a[m] = kern_qact_view(TYPE, xq + m * act_row, k);           \
        __m512 acc[MR][NP];                                                                      \
        for (int m = 0; m < MR; m++)                                                             \
            for (int p = 0; p < NP; p++) acc[m][p] = _mm512_setzero_ps();                        \
        for (int64_t ib = 0; ib < nb; ib++) {                                                    \
            if (stream)                                                                          \
                for (int p = 0; p < NP; p++) prefetch_ahead(pw + p * stride + ib * (QB), (QB));  \
            __m512i is[MR][NP], t16[MR][NP];                                                     \
            (void)t16;                                                                           \
            for (int m = 0; m < MR; m++)                                                         \
                for (int p = 0; p < NP; p++) {                                                   \
                    is[m][p] = INIT(m, ib);                                                      \
                    ZERO16(t16[m][p]);                                                           \
                }                                                                                \
            for (int c = 0; c < 4; c++) {                                                        \
                __m512i lo[NP], hi[NP];                                                          \
                for (int p = 0; p < NP; p++) {                                                   \
                    const uint8_t *qb = pw + p * stride + ib * (QB);                             \
                    const __m512i v = _mm512_loadu_si512(qb + c * 64);                           \
                    lo[p] = _mm512_and_si512(v, m4);                                             \
                    hi[p] = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);                       \
                    if (HBIT) {                                                                  \
                        const __m512i hb = _mm512_loadu_si512(qb + 256);                         \
                        lo[p] = _mm512_or_si512(lo[p], hbit16(hb, c));                           \
                        hi[p] = _mm512_or_si512(hi[p], hbit16(hb, c + 4));                       \
                    }                                                                            \
                }                                                                                \
                for (int m = 0; m < MR; m++) {                                                   \
                    const __m512i x0 = bcast4(a[m].qs + ib * 32 + 4 * c);                        \
                    const __m512i x1 = bcast4(a[m].qs + ib * 32 + 16 + 4 * c);                   \
                    for (int p = 0; p < NP; p++) {                                               \
                        DOT_U8(is[m][p], t16[m][p], lo[p], x0);                                  \
                        DOT_U8(is[m][p], t16[m][p], hi[p], x1);                                  \
                    }                                                                            \
                }                                                                                \
                /* 5-bit pairs reach 31 x 127 x 2: four of them per int16 at most */             \
                if (HBIT && c % 2 == 1) {                                                        \
                    for (int m = 0; m < MR; m++)                                                 \
                        for (int p = 0; p < NP; p++) {                                           \
                            FLUSH16(is[m][p], t16[m][p]);                                        \
                            ZERO16(t16[m][p]);                                                   \
                        }                                                                        \
                }                                                                                \
            }                                                                                    \
            for (int p = 0; p < NP; p++) {                                                       \
                const uint8_t *mb = pw + p * stride + nb * (QB) + ib * (MB);                     \
                const __m512 dw = load_f16x16(mb);                                               \
                for (int m = 0; m < MR; m++) {                                                   \
                    if (!(HBIT)) FLUSH16(is[m][p], t16[m][p]);                                   \
                    const __m512 dx = _mm512_set1_ps(a[m].d[ib]);                                \
                    acc[m][p] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(is[m][p]),                    \
                                                _mm512_mul_ps(dw, dx), acc[m][p]);               \
                    if (MIN) {                                                                   \
                        acc[m][p] =                                                              \
                            _mm512_fmadd_ps(_mm512_set1_ps(a[m].fs[ib]),                         \
                                            _mm512_mul_ps(load_f16x16(mb + 32), dx), acc[m][p]); \
                    }                                                                            \
                }                                                                                \
            }                                                                                    \
        }                                                                                        \
        for (int m = 0; m < MR; m++) {                                                           \
            for (int p = 0; p < NP - 1; p++) _mm512_storeu_ps(y + m * ldy + p * 16, acc[m][p]);  \
            _mm512_mask_storeu_ps(y + m * ldy + (NP - 1) * 16, last, acc[m][NP - 1]);            \
        }                                                                                        \
    }

#define INIT_N16(m, ib)   _mm512_set1_epi32(a[m].n16[ib])
#define INIT_ZERO(m, ib)  _mm512_setzero_si512()
#define TILE_Q5_0(MR, NP) TILE_B32(q5_0, QUANT_Q5_0, 320, 32, 1, INIT_N16, 0, MR, NP)
#define TILE_Q4_1(MR, NP) TILE_B32(q4_1, QUANT_Q4_1, 256, 64, 0, INIT_ZERO, 1, MR, NP)
#define TILE_Q5_1(MR, NP) TILE_B32(q5_1, QUANT_Q5_1, 320, 64, 1, INIT_ZERO, 1, MR, NP)

/* ---- q5_K: q4_K plus a chunk of 5th bits per sub-block (bit 8 b + t) -------- */

#define TILE_Q5_K(MR, NP)                                                                        \
    static void tile_q5_K_##MR##_##NP(                                                           \
        const uint8_t *restrict xq, size_t act_row, int64_t k, const uint8_t *restrict pw,       \
        size_t stride, float *restrict y, int64_t ldy, __mmask16 last, bool stream) {            \
        const int64_t nb = k / QK_K;                                                             \
        const __m512i m4 = _mm512_set1_epi8(15);                                                 \
        struct kern_qact a[MR];                                                                  \
        for (int m = 0; m < MR; m++) a[m] = kern_qact_view(QUANT_Q5_K, xq + m * act_row, k);     \
        __m512 acc[MR][NP];                                                                      \
        for (int m = 0; m < MR; m++)                                                             \
            for (int p = 0; p < NP; p++) acc[m][p] = _mm512_setzero_ps();                        \
        for (int64_t ib = 0; ib < nb; ib++) {                                                    \
            if (stream)                                                                          \
                for (int p = 0; p < NP; p++) prefetch_ahead(pw + p * stride + ib * 2560, 2560);  \
            __m512 s[MR][NP];                                                                    \
            for (int m = 0; m < MR; m++)                                                         \
                for (int p = 0; p < NP; p++) s[m][p] = _mm512_setzero_ps();                      \
            for (int j = 0; j < 8; j++) {                                                        \
                __m512i is[MR][NP], t16[MR][NP];                                                 \
                (void)t16;                                                                       \
                for (int m = 0; m < MR; m++)                                                     \
                    for (int p = 0; p < NP; p++) {                                               \
                        is[m][p] = _mm512_setzero_si512();                                       \
                        ZERO16(t16[m][p]);                                                       \
                    }                                                                            \
                for (int t = 0; t < 8; t++) {                                                    \
                    __m512i wv[NP];                                                              \
                    for (int p = 0; p < NP; p++) {                                               \
                        const uint8_t *qb = pw + p * stride + ib * 2560;                         \
                        __m512i v = _mm512_loadu_si512(qb + (8 * (j / 2) + t) * 64);             \
                        if (j % 2) v = _mm512_srli_epi16(v, 4);                                  \
                        const __m512i hb = _mm512_loadu_si512(qb + 2048 + 64 * j);               \
                        wv[p] = _mm512_or_si512(_mm512_and_si512(v, m4), hbit16(hb, t));         \
                    }                                                                            \
                    for (int m = 0; m < MR; m++) {                                               \
                        const __m512i x =                                                        \
                            bcast4(a[m].qs + ib * QK_K + 64 * (j / 2) + 32 * (j % 2) + 4 * t);   \
                        for (int p = 0; p < NP; p++) DOT_U8(is[m][p], t16[m][p], wv[p], x);      \
                    }                                                                            \
                    if (t % 4 == 3) {                                                            \
                        for (int m = 0; m < MR; m++)                                             \
                            for (int p = 0; p < NP; p++) {                                       \
                                FLUSH16(is[m][p], t16[m][p]);                                    \
                                ZERO16(t16[m][p]);                                               \
                            }                                                                    \
                    }                                                                            \
                }                                                                                \
                for (int p = 0; p < NP; p++) {                                                   \
                    const uint8_t *meta = pw + p * stride + nb * 2560 + ib * 320;                \
                    const __m512 sc = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(                   \
                        _mm_loadu_si128((const __m128i *)(meta + 64 + 16 * j))));                \
                    const __m512 dsc = _mm512_mul_ps(load_f16x16(meta), sc);                     \
                    for (int m = 0; m < MR; m++) {                                               \
                        s[m][p] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(is[m][p]), dsc, s[m][p]);   \
                    }                                                                            \
                }                                                                                \
            }                                                                                    \
            __m512i mn[MR][NP];                                                                  \
            for (int m = 0; m < MR; m++)                                                         \
                for (int p = 0; p < NP; p++) mn[m][p] = _mm512_setzero_si512();                  \
            for (int i = 0; i < 4; i++) {                                                        \
                __m512i mv[NP];                                                                  \
                for (int p = 0; p < NP; p++) {                                                   \
                    const uint8_t *meta = pw + p * stride + nb * 2560 + ib * 320;                \
                    mv[p] = _mm512_cvtepu8_epi16(                                                \
                        _mm256_loadu_si256((const __m256i *)(meta + 192 + 32 * i)));             \
                }                                                                                \
                for (int m = 0; m < MR; m++) {                                                   \
                    const __m512i b = bcast4((const int8_t *)(a[m].b32 + 8 * ib + 2 * i));       \
                    for (int p = 0; p < NP; p++) DOT_I16(mn[m][p], mv[p], b);                    \
                }                                                                                \
            }                                                                                    \
            for (int p = 0; p < NP; p++) {                                                       \
                const __m512 dmin = load_f16x16(pw + p * stride + nb * 2560 + ib * 320 + 32);    \
                for (int m = 0; m < MR; m++) {                                                   \
                    const __m512i neg = _mm512_sub_epi32(_mm512_setzero_si512(), mn[m][p]);      \
                    s[m][p] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(neg), dmin, s[m][p]);           \
                    acc[m][p] = _mm512_fmadd_ps(s[m][p], _mm512_set1_ps(a[m].d[ib]), acc[m][p]); \
                }                                                                                \
            }                                                                                    \
        }                                                                                        \
        for (int m = 0; m < MR; m++) {                                                           \
            for (int p = 0; p < NP - 1; p++) _mm512_storeu_ps(y + m * ldy + p * 16, acc[m][p]);  \
            _mm512_mask_storeu_ps(y + m * ldy + (NP - 1) * 16, last, acc[m][NP - 1]);            \
        }                                                                                        \
    }

/* ---- q3_K, q2_K: 16 chunks of 2-bit values (group i in bits 2 i), q3_K's 3rd
 * bits in 8 more chunks (bit 8 b + 4 (j % 2) + i) ------------------------------ */

/* The 2 bits of group i (bits 2 i, 2 i + 1 of each byte) as 0..3. */
static inline __m512i bits2(__m512i c, int i) {
    return _mm512_and_si512(i ? _mm512_srli_epi16(c, 2 * i) : c, _mm512_set1_epi8(3));
}

/* The 3rd bits of group g (bit 8 b + g of each lane) as 0x04 in each byte. */
static inline __m512i hbit4(__m512i hb, int g) {
    const __m512i v = g < 2 ? _mm512_slli_epi32(hb, 2 - g) : _mm512_srli_epi32(hb, g - 2);
    return _mm512_and_si512(v, _mm512_set1_epi8(4));
}

#define TILE_Q3_K(MR, NP)                                                                         \
    static void tile_q3_K_##MR##_##NP(                                                            \
        const uint8_t *restrict xq, size_t act_row, int64_t k, const uint8_t *restrict pw,        \
        size_t stride, float *restrict y, int64_t ldy, __mmask16 last, bool stream) {             \
        const int64_t nb = k / QK_K;                                                              \
        struct kern_qact a[MR];                                                                   \
        for (int m = 0; m < MR; m++) a[m] = kern_qact_view(QUANT_Q3_K, xq + m * act_row, k);      \
        __m512 acc[MR][NP];                                                                       \
        for (int m = 0; m < MR; m++)                                                              \
            for (int p = 0; p < NP; p++) acc[m][p] = _mm512_setzero_ps();                         \
        for (int64_t ib = 0; ib < nb; ib++) {                                                     \
            if (stream)                                                                           \
                for (int p = 0; p < NP; p++) prefetch_ahead(pw + p * stride + ib * 1536, 1536);   \
            __m512 s[MR][NP];                                                                     \
            for (int m = 0; m < MR; m++)                                                          \
                for (int p = 0; p < NP; p++) s[m][p] = _mm512_setzero_ps();                       \
            for (int j = 0; j < 16; j++) {                                                        \
                __m512i is[MR][NP], t16[MR][NP];                                                  \
                (void)t16;                                                                        \
                for (int m = 0; m < MR; m++)                                                      \
                    for (int p = 0; p < NP; p++) {                                                \
                        is[m][p] = _mm512_set1_epi32(a[m].n4[16 * ib + j]);                       \
                        ZERO16(t16[m][p]);                                                        \
                    }                                                                             \
                for (int i = 0; i < 4; i++) {                                                     \
                    __m512i wv[NP];                                                               \
                    for (int p = 0; p < NP; p++) {                                                \
                        const uint8_t *qb = pw + p * stride + ib * 1536;                          \
                        const __m512i c2 = _mm512_loadu_si512(qb + 64 * j);                       \
                        const __m512i hb = _mm512_loadu_si512(qb + 1024 + 64 * (j / 2));          \
                        wv[p] = _mm512_or_si512(bits2(c2, i), hbit4(hb, 4 * (j % 2) + i));        \
                    }                                                                             \
                    for (int m = 0; m < MR; m++) {                                                \
                        const __m512i x = bcast4(a[m].qs + ib * QK_K + 16 * j + 4 * i);           \
                        for (int p = 0; p < NP; p++) DOT_U8(is[m][p], t16[m][p], wv[p], x);       \
                    }                                                                             \
                }                                                                                 \
                for (int p = 0; p < NP; p++) {                                                    \
                    const uint8_t *meta = pw + p * stride + nb * 1536 + ib * 288;                 \
                    const __m512 sc = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(                    \
                        _mm_loadu_si128((const __m128i *)(meta + 32 + 16 * j))));                 \
                    const __m512 dsc = _mm512_mul_ps(load_f16x16(meta), sc);                      \
                    for (int m = 0; m < MR; m++) {                                                \
                        FLUSH16(is[m][p], t16[m][p]);                                             \
                        s[m][p] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(is[m][p]), dsc, s[m][p]);    \
                    }                                                                             \
                }                                                                                 \
            }                                                                                     \
            for (int m = 0; m < MR; m++) {                                                        \
                const __m512 dx = _mm512_set1_ps(a[m].d[ib]);                                     \
                for (int p = 0; p < NP; p++) acc[m][p] = _mm512_fmadd_ps(s[m][p], dx, acc[m][p]); \
            }                                                                                     \
        }                                                                                         \
        for (int m = 0; m < MR; m++) {                                                            \
            for (int p = 0; p < NP - 1; p++) _mm512_storeu_ps(y + m * ldy + p * 16, acc[m][p]);   \
            _mm512_mask_storeu_ps(y + m * ldy + (NP - 1) * 16, last, acc[m][NP - 1]);             \
        }                                                                                         \
    }

#define TILE_Q2_K(MR, NP)                                                                        \
    static void tile_q2_K_##MR##_##NP(                                                           \
        const uint8_t *restrict xq, size_t act_row, int64_t k, const uint8_t *restrict pw,       \
        size_t stride, float *restrict y, int64_t ldy, __mmask16 last, bool stream) {            \
        const int64_t nb = k / QK_K;                                                             \
        struct kern_qact a[MR];                                                                  \
        for (int m = 0; m < MR; m++) a[m] = kern_qact_view(QUANT_Q2_K, xq + m * act_row, k);     \
        __m512 acc[MR][NP];                                                                      \
        for (int m = 0; m < MR; m++)                                                             \
            for (int p = 0; p < NP; p++) acc[m][p] = _mm512_setzero_ps();                        \
        for (int64_t ib = 0; ib < nb; ib++) {                                                    \
            if (stream)                                                                          \
                for (int p = 0; p < NP; p++) prefetch_ahead(pw + p * stride + ib * 1024, 1024);  \
            __m512 s[MR][NP];                                                                    \
            for (int m = 0; m < MR; m++)                                                         \
                for (int p = 0; p < NP; p++) s[m][p] = _mm512_setzero_ps();                      \
            for (int j = 0; j < 16; j++) {                                                       \
                __m512i is[MR][NP], t16[MR][NP];                                                 \
                (void)t16;                                                                       \
                for (int m = 0; m < MR; m++)                                                     \
                    for (int p = 0; p < NP; p++) {                                               \
                        is[m][p] = _mm512_setzero_si512();                                       \
                        ZERO16(t16[m][p]);                                                       \
                    }                                                                            \
                for (int i = 0; i < 4; i++) {                                                    \
                    __m512i wv[NP];                                                              \
                    for (int p = 0; p < NP; p++) {                                               \
                        const __m512i c2 =                                                       \
                            _mm512_loadu_si512(pw + p * stride + ib * 1024 + 64 * j);            \
                        wv[p] = bits2(c2, i);                                                    \
                    }                                                                            \
                    for (int m = 0; m < MR; m++) {                                               \
                        const __m512i x = bcast4(a[m].qs + ib * QK_K + 16 * j + 4 * i);          \
                        for (int p = 0; p < NP; p++) DOT_U8(is[m][p], t16[m][p], wv[p], x);      \
                    }                                                                            \
                }                                                                                \
                for (int p = 0; p < NP; p++) {                                                   \
                    const uint8_t *meta = pw + p * stride + nb * 1024 + ib * 320;                \
                    /* scale | min << 4 of sub-blocks 2 (j / 2) and 2 (j / 2) + 1 per row */     \
                    __m512i w = _mm512_cvtepu16_epi32(                                           \
                        _mm256_loadu_si256((const __m256i *)(meta + 64 + 32 * (j / 2))));        \
                    if (j % 2) w = _mm512_srli_epi32(w, 8);                                      \
                    const __m512 sc =                                                            \
                        _mm512_cvtepi32_ps(_mm512_and_si512(w, _mm512_set1_epi32(15)));          \
                    const __m512 dsc = _mm512_mul_ps(load_f16x16(meta), sc);                     \
                    for (int m = 0; m < MR; m++) {                                               \
                        FLUSH16(is[m][p], t16[m][p]);                                            \
                        s[m][p] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(is[m][p]), dsc, s[m][p]);   \
                    }                                                                            \
                }                                                                                \
            }                                                                                    \
            __m512i mn[MR][NP];                                                                  \
            for (int m = 0; m < MR; m++)                                                         \
                for (int p = 0; p < NP; p++) mn[m][p] = _mm512_setzero_si512();                  \
            for (int i = 0; i < 8; i++) {                                                        \
                __m512i mv[NP];                                                                  \
                for (int p = 0; p < NP; p++) {                                                   \
                    const uint8_t *meta = pw + p * stride + nb * 1024 + ib * 320;                \
                    mv[p] = _mm512_srli_epi16(_mm512_cvtepu8_epi16(_mm256_loadu_si256(           \
                                                  (const __m256i *)(meta + 64 + 32 * i))),       \
                                              4);                                                \
                }                                                                                \
                for (int m = 0; m < MR; m++) {                                                   \
                    const __m512i b = bcast4((const int8_t *)(a[m].b16 + 16 * ib + 2 * i));      \
                    for (int p = 0; p < NP; p++) DOT_I16(mn[m][p], mv[p], b);                    \
                }                                                                                \
            }                                                                                    \
            for (int p = 0; p < NP; p++) {                                                       \
                const __m512 dmin = load_f16x16(pw + p * stride + nb * 1024 + ib * 320 + 32);    \
                for (int m = 0; m < MR; m++) {                                                   \
                    const __m512i neg = _mm512_sub_epi32(_mm512_setzero_si512(), mn[m][p]);      \
                    s[m][p] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(neg), dmin, s[m][p]);           \
                    acc[m][p] = _mm512_fmadd_ps(s[m][p], _mm512_set1_ps(a[m].d[ib]), acc[m][p]); \
                }                                                                                \
            }                                                                                    \
        }                                                                                        \
        for (int m = 0; m < MR; m++) {                                                           \
            for (int p = 0; p < NP - 1; p++) _mm512_storeu_ps(y + m * ldy + p * 16, acc[m][p]);  \
            _mm512_mask_storeu_ps(y + m * ldy + (NP - 1) * 16, last, acc[m][NP - 1]);            \
        }                                                                                        \
    }

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

TILES_4x2(TILE_Q8_0) TILES_4x2(TILE_Q4_0) TILES_4x2(TILE_Q4_K) TILES_4x2(TILE_Q6_K)
    TILES_4x2(TILE_Q5_0) TILES_4x2(TILE_Q4_1) TILES_4x2(TILE_Q5_1) TILES_4x2(TILE_Q5_K)
        TILES_4x2(TILE_Q3_K) TILES_4x2(TILE_Q2_K)
#define QPANEL_FN(NAME, TYPE)                                                                     \
    void QFN(NAME)(const void *restrict xq, int64_t n_tokens, const void *restrict pw, int64_t k, \
                   int64_t n, int64_t p0, int64_t p1, float *restrict y) {                        \
        static const qtile_fn tiles[] = TABLE_4x2(NAME);                                          \
        run(TYPE, tiles, 4, 2, xq, n_tokens, pw, k, n, p0, p1, y);                                \
    }

            QPANEL_FN(q8_0, QUANT_Q8_0) QPANEL_FN(q4_0, QUANT_Q4_0) QPANEL_FN(q4_K, QUANT_Q4_K)
                QPANEL_FN(q6_K, QUANT_Q6_K) QPANEL_FN(q5_0, QUANT_Q5_0) QPANEL_FN(q4_1, QUANT_Q4_1)
                    QPANEL_FN(q5_1, QUANT_Q5_1) QPANEL_FN(q5_K, QUANT_Q5_K)
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
