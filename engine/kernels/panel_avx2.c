/*
 * panel_avx2.c - the matrix product over weight panels (kernels.h) with AVX2
 * + FMA (+ F16C for f16): a k step of a panel is two ymm, and a tile keeps up
 * to PANEL_MR tokens x one panel of outputs in 12 of the 16 registers.
 *
 * Every output is one lane accumulating fma(w[j], x[j], acc) for j = 0..k-1
 * in order, as in kern_panel_ref_*: bit-identical to the portable and
 * AVX-512 versions at any batch size. Compiled with -mavx2 -mfma -mf16c;
 * called only when CPUID has them.
 */
#include <immintrin.h>
#include <string.h>

#include "engine/kernels/kernels.h"

#define PANEL_MR          6
#define PANEL_CHUNK_BYTES (256 * 1024)  // activations of a chunk of tokens, kept in L2

static int64_t chunk_tokens(int64_t k) {
    int64_t mc = PANEL_CHUNK_BYTES / (k * (int64_t)sizeof(float)) / PANEL_MR * PANEL_MR;
    return mc < PANEL_MR ? PANEL_MR : mc;
}

static inline void load_f32(const float *p, __m256 *lo, __m256 *hi) {
    *lo = _mm256_loadu_ps(p);
    *hi = _mm256_loadu_ps(p + 8);
}
static inline void load_f16(const uint16_t *p, __m256 *lo, __m256 *hi) {
    *lo = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
    *hi = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + 8)));
}
static inline __m256 bf16_8(const uint16_t *p) {
    __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
}
static inline void load_bf16(const uint16_t *p, __m256 *lo, __m256 *hi) {
    *lo = bf16_8(p);
    *hi = bf16_8(p + 8);
}

/* y[m][0 .. rows) for m < MR over one panel pw (rows <= 16). */
#define PANEL_TILE(TAG, T, LOAD, MR)                                                        \
    static void tile_##TAG##_##MR(const float *restrict x, int64_t k, const T *restrict pw, \
                                  float *restrict y, int64_t ldy, int64_t rows) {           \
        __m256 lo[MR], hi[MR];                                                              \
        for (int m = 0; m < MR; m++) lo[m] = hi[m] = _mm256_setzero_ps();                   \
        for (int64_t j = 0; j < k; j++) {                                                   \
            __m256 wl, wh;                                                                  \
            LOAD(pw + j * 16, &wl, &wh);                                                    \
            for (int m = 0; m < MR; m++) {                                                  \
                __m256 b = _mm256_set1_ps(x[m * k + j]);                                    \
                lo[m] = _mm256_fmadd_ps(wl, b, lo[m]);                                      \
                hi[m] = _mm256_fmadd_ps(wh, b, hi[m]);                                      \
            }                                                                               \
        }                                                                                   \
        for (int m = 0; m < MR; m++) {                                                      \
            if (rows == 16) {                                                               \
                _mm256_storeu_ps(y + m * ldy, lo[m]);                                       \
                _mm256_storeu_ps(y + m * ldy + 8, hi[m]);                                   \
            } else {                                                                        \
                float tmp[16];                                                              \
                _mm256_storeu_ps(tmp, lo[m]);                                               \
                _mm256_storeu_ps(tmp + 8, hi[m]);                                           \
                memcpy(y + m * ldy, tmp, (size_t)rows * sizeof(float));                     \
            }                                                                               \
        }                                                                                   \
    }

#define PANEL_RUN(NAME, TAG, T, LOAD)                                                              \
    PANEL_TILE(TAG, T, LOAD, 1)                                                                    \
    PANEL_TILE(TAG, T, LOAD, 2)                                                                    \
    PANEL_TILE(TAG, T, LOAD, 3)                                                                    \
    PANEL_TILE(TAG, T, LOAD, 4) PANEL_TILE(TAG, T, LOAD, 5) PANEL_TILE(TAG, T, LOAD, 6) void NAME( \
        const float *restrict x, int64_t n_tokens, const void *restrict pw, int64_t k, int64_t n,  \
        int64_t p0, int64_t p1, float *restrict y) {                                               \
        typedef void (*fn)(const float *restrict, int64_t, const T *restrict, float *restrict,     \
                           int64_t, int64_t);                                                      \
        static const fn tiles[PANEL_MR] = {tile_##TAG##_1, tile_##TAG##_2, tile_##TAG##_3,         \
                                           tile_##TAG##_4, tile_##TAG##_5, tile_##TAG##_6};        \
        const T *w = pw;                                                                           \
        const int64_t mc = chunk_tokens(k);                                                        \
        for (int64_t t0 = 0; t0 < n_tokens; t0 += mc) {                                            \
            const int64_t t1 = n_tokens - t0 < mc ? n_tokens : t0 + mc;                            \
            for (int64_t p = p0; p < p1; p++) {                                                    \
                const int64_t rows = n - p * KERN_PANEL_ROWS < KERN_PANEL_ROWS                     \
                                         ? n - p * KERN_PANEL_ROWS                                 \
                                         : KERN_PANEL_ROWS;                                        \
                for (int64_t t = t0; t < t1; t += PANEL_MR) {                                      \
                    const int64_t mr = t1 - t < PANEL_MR ? t1 - t : PANEL_MR;                      \
                    tiles[mr - 1](x + t * k, k, w + p * k * KERN_PANEL_ROWS,                       \
                                  y + t * n + p * KERN_PANEL_ROWS, n, rows);                       \
                }                                                                                  \
            }                                                                                      \
        }                                                                                          \
    }

PANEL_RUN(kern_panel_avx2_f32, f32, float, load_f32)
PANEL_RUN(kern_panel_avx2_f16, f16, uint16_t, load_f16)
PANEL_RUN(kern_panel_avx2_bf16, bf16, uint16_t, load_bf16)
