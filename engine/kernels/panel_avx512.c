/*
 * panel_avx512.c - the matrix product over weight panels (kernels.h) with
 * AVX-512F: one zmm holds one k step of a panel (16 output rows), so the
 * micro-kernel keeps up to PANEL_MR tokens x PANEL_NP panels of outputs in
 * registers and, for each k step, loads PANEL_NP weight vectors once and
 * broadcasts each token's activation against them. The weights of a panel
 * pair are read from memory once per chunk of tokens (every call up to ~128
 * tokens) and from L2 for every further group of PANEL_MR tokens;
 * activations come from L1/L2. No k blocking: a tile runs the whole row, so
 * the outputs are stored once and never re-read.
 *
 * Every output is one lane accumulating fma(w[j], x[j], acc) for j = 0..k-1
 * in order, as in kern_panel_ref_*, whatever the tile shape: bit-identical
 * to the portable and AVX2 versions, and to itself at any batch size.
 * Compiled with -mavx512f -mfma -mf16c; called only when CPUID has them.
 */
#include <immintrin.h>

#include "engine/kernels/kernels.h"

#define PANEL_MR 8  // tokens per tile: 8 x 2 accumulators + 2 weights + 1 broadcast
#define PANEL_NP 2  // panels per tile

static inline __m512 load_f32(const float *p) {
    return _mm512_loadu_ps(p);
}
static inline __m512 load_f16(const uint16_t *p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
}
static inline __m512 load_bf16(const uint16_t *p) {
    __m512i v = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
}

/* y[m][0 .. 16 NP) for m < MR over panels pw, pw + pstride, ...; the last
 * panel's store is masked by `last` (rows past n). */
#define PANEL_TILE(TAG, T, LOAD, MR, NP)                                                           \
    static void tile_##TAG##_##MR##_##NP(const float *restrict x, int64_t k, const T *restrict pw, \
                                         int64_t pstride, float *restrict y, int64_t ldy,          \
                                         __mmask16 last) {                                         \
        __m512 acc[MR][NP];                                                                        \
        for (int m = 0; m < MR; m++)                                                               \
            for (int p = 0; p < NP; p++) acc[m][p] = _mm512_setzero_ps();                          \
        for (int64_t j = 0; j < k; j++) {                                                          \
            __m512 w[NP];                                                                          \
            for (int p = 0; p < NP; p++) w[p] = LOAD(pw + p * pstride + j * 16);                   \
            for (int m = 0; m < MR; m++) {                                                         \
                __m512 b = _mm512_set1_ps(x[m * k + j]);                                           \
                for (int p = 0; p < NP; p++) acc[m][p] = _mm512_fmadd_ps(w[p], b, acc[m][p]);      \
            }                                                                                      \
        }                                                                                          \
        for (int m = 0; m < MR; m++) {                                                             \
            for (int p = 0; p < NP - 1; p++) _mm512_storeu_ps(y + m * ldy + p * 16, acc[m][p]);    \
            _mm512_mask_storeu_ps(y + m * ldy + (NP - 1) * 16, last, acc[m][NP - 1]);              \
        }                                                                                          \
    }

// clang-format off
#define PANEL_TILES(TAG, T, LOAD)                                                                  \
    PANEL_TILE(TAG, T, LOAD, 1, 1) PANEL_TILE(TAG, T, LOAD, 2, 1) PANEL_TILE(TAG, T, LOAD, 3, 1)   \
    PANEL_TILE(TAG, T, LOAD, 4, 1) PANEL_TILE(TAG, T, LOAD, 5, 1) PANEL_TILE(TAG, T, LOAD, 6, 1)   \
    PANEL_TILE(TAG, T, LOAD, 7, 1) PANEL_TILE(TAG, T, LOAD, 8, 1)                                  \
    PANEL_TILE(TAG, T, LOAD, 1, 2) PANEL_TILE(TAG, T, LOAD, 2, 2) PANEL_TILE(TAG, T, LOAD, 3, 2)   \
    PANEL_TILE(TAG, T, LOAD, 4, 2) PANEL_TILE(TAG, T, LOAD, 5, 2) PANEL_TILE(TAG, T, LOAD, 6, 2)   \
    PANEL_TILE(TAG, T, LOAD, 7, 2) PANEL_TILE(TAG, T, LOAD, 8, 2)
// clang-format on

/* Tokens per chunk: a chunk's activations (PANEL_CHUNK_BYTES) stay in L2
 * while it runs over every panel of the slice, and the weights are read once
 * per chunk. 384 KiB measured best on a 1 MiB L2 (M = 512 prefill: 218
 * GFLOP/s on 2 cores; 186 without chunks, the activations then coming from L3). */
#define PANEL_CHUNK_BYTES (384 * 1024)

static int64_t chunk_tokens(int64_t k) {
    int64_t mc = PANEL_CHUNK_BYTES / (k * (int64_t)sizeof(float)) / PANEL_MR * PANEL_MR;
    return mc < PANEL_MR ? PANEL_MR : mc;
}

/* Loops over token chunks, then panel pairs, and within a pair over groups of PANEL_MR tokens. */
#define PANEL_RUN(NAME, TAG, T, LOAD)                                                        \
    PANEL_TILES(TAG, T, LOAD)                                                                \
    void NAME(const float *restrict x, int64_t n_tokens, const void *restrict pw, int64_t k, \
              int64_t n, int64_t p0, int64_t p1, float *restrict y) {                        \
        typedef void (*fn)(const float *restrict, int64_t, const T *restrict, int64_t,       \
                           float *restrict, int64_t, __mmask16);                             \
        static const fn tiles[PANEL_NP][PANEL_MR] = {                                        \
            {tile_##TAG##_1_1, tile_##TAG##_2_1, tile_##TAG##_3_1, tile_##TAG##_4_1,         \
             tile_##TAG##_5_1, tile_##TAG##_6_1, tile_##TAG##_7_1, tile_##TAG##_8_1},        \
            {tile_##TAG##_1_2, tile_##TAG##_2_2, tile_##TAG##_3_2, tile_##TAG##_4_2,         \
             tile_##TAG##_5_2, tile_##TAG##_6_2, tile_##TAG##_7_2, tile_##TAG##_8_2},        \
        };                                                                                   \
        const T *w = pw;                                                                     \
        const int64_t pstride = k * KERN_PANEL_ROWS;                                         \
        const int64_t n_panels = (n + KERN_PANEL_ROWS - 1) / KERN_PANEL_ROWS;                \
        const int64_t mc = chunk_tokens(k);                                                  \
        for (int64_t t0 = 0; t0 < n_tokens; t0 += mc) {                                      \
            const int64_t t1 = n_tokens - t0 < mc ? n_tokens : t0 + mc;                      \
            for (int64_t p = p0; p < p1; p += PANEL_NP) {                                    \
                const int64_t np = p1 - p < PANEL_NP ? p1 - p : PANEL_NP;                    \
                __mmask16 last = 0xffff;                                                     \
                if (p + np == n_panels && n % KERN_PANEL_ROWS) {                             \
                    last = (__mmask16)((1u << (n % KERN_PANEL_ROWS)) - 1);                   \
                }                                                                            \
                for (int64_t t = t0; t < t1; t += PANEL_MR) {                                \
                    const int64_t mr = t1 - t < PANEL_MR ? t1 - t : PANEL_MR;                \
                    tiles[np - 1][mr - 1](x + t * k, k, w + p * pstride, pstride,            \
                                          y + t * n + p * KERN_PANEL_ROWS, n, last);         \
                }                                                                            \
            }                                                                                \
        }                                                                                    \
    }

PANEL_RUN(kern_panel_avx512_f32, f32, float, load_f32)
PANEL_RUN(kern_panel_avx512_f16, f16, uint16_t, load_f16)
PANEL_RUN(kern_panel_avx512_bf16, bf16, uint16_t, load_bf16)
