/*
 * attn_avx512.c - AVX-512 (F, BW, VL) attention kernels for f32, f16 and q8_0
 * KV tiles: the three pieces of the kern_attn table and the fused step.
 * Compiled with -mavx512f -mavx512bw -mavx512vl -mfma -mf16c and called only
 * after kern_attn_select() found those features.
 *
 * One vector holds 16 keys of a K^T row (all of a default 16-token block) or
 * 16 dims of a V row; tails (block size 5, head_dim 80 or 8) are masked loads
 * and stores, never scalar loops. The fused step keeps a row's running max in
 * a register per 16 keys, computes the exponentials 16 at a time, converts
 * each V row (f16, q8_0) once for up to 4 query rows (the heads of a GQA
 * group, the tokens of a prefill tile), and prefetches the next block's
 * tiles, which a paged block table puts anywhere in memory.
 */
#include <immintrin.h>
#include <math.h>

#include "engine/kernels/attn.h"

#define ROWS KERN_ATTN_ROWS  // query rows sharing one pass over a tile

static int32_t n_groups(int32_t hd) { return (hd + KV_Q8_0_GROUP - 1) / KV_Q8_0_GROUP; }

/* The first n lanes (none for n <= 0, all for n >= 16). */
static inline __mmask16 lanes(int32_t n) {
    return n <= 0 ? 0 : n >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << n) - 1u);
}

/* Lanes i of a 16-key chunk starting at key j with j0 <= j + i <= j1. */
static inline __mmask16 key_range(int32_t j, int32_t j0, int32_t j1) {
    return (__mmask16)(lanes(j1 - j + 1) & (__mmask16)~lanes(j0 - j));
}

/* Values i .. i + 15 of a tile's value array as floats. With `masked`, lanes
 * outside mk are 0 and not read; without, all 16 are read (mk is ignored). For
 * q8_0, p is the int8 part and the values are unscaled. `masked` is a
 * constant in every instance below: GCC treats a masked load as an opaque
 * memory read and then keeps a loop's accumulator array in memory, storing
 * it every iteration, so full chunks use plain loads. */
static inline __m512 load16(enum engine_kv_type t, const void *p, int64_t i, __mmask16 mk,
                            int masked) {
    switch (t) {
    case ENGINE_KV_TYPE_F32:
        return masked ? _mm512_maskz_loadu_ps(mk, (const float *)p + i)
                      : _mm512_loadu_ps((const float *)p + i);
    case ENGINE_KV_TYPE_F16:
        return _mm512_cvtph_ps(
            masked ? _mm256_maskz_loadu_epi16(mk, (const uint16_t *)p + i)
                   : _mm256_loadu_si256((const __m256i *)(const void *)((const uint16_t *)p + i)));
    case ENGINE_KV_TYPE_Q8_0:
        return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(
            masked ? _mm_maskz_loadu_epi8(mk, (const int8_t *)p + i)
                   : _mm_loadu_si128((const __m128i *)(const void *)((const int8_t *)p + i))));
    case ENGINE_KV_TYPE_COUNT: break;
    }
    return _mm512_setzero_ps();
}

/* exp(x) for x <= 0 (scores minus their running max): 2^n e^f with
 * n = round(x / ln 2), |f| <= ln 2 / 2, e^f by its degree-6 Taylor polynomial
 * (relative error < 2e-7), 2^n applied by vscalefps. x < -87, -inf and NaN
 * give 0, as the AVX2 kernel does. */
static inline __m512 exp512(__m512 x) {
    const __m512 lo = _mm512_set1_ps(-87.0f);
    const __mmask16 ok = _mm512_cmp_ps_mask(x, lo, _CMP_GE_OQ);
    x = _mm512_max_ps(x, lo);
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 f = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), x);
    f = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.428606765330187045e-06f), f);
    __m512 p = _mm512_set1_ps(1.0f / 720.0f);
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f / 120.0f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f / 24.0f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f / 6.0f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
    return _mm512_maskz_mov_ps(ok, _mm512_scalef_ps(p, n));
}

float kern_attn_avx512_exp_sum(float *p, const float *s, float m, int32_t n) {
    const __m512 vm = _mm512_set1_ps(m);
    __m512 sum = _mm512_setzero_ps();
    for (int32_t j = 0; j < n; j += 16) {
        const __mmask16 mk = lanes(n - j);
        __m512 e = exp512(_mm512_sub_ps(_mm512_maskz_loadu_ps(mk, s + j), vm));
        e = _mm512_maskz_mov_ps(mk, e);
        _mm512_mask_storeu_ps(p + j, mk, e);
        sum = _mm512_add_ps(sum, e);
    }
    return _mm512_reduce_add_ps(sum);
}

/* ---- instances ------------------------------------------------------------ */

/* The two hot loops, written as macros that define one function per (type,
 * rows R, vectors C) with R and C constants, so their row and vector loops
 * unroll into registers: as inline functions taking R, GCC 12 made one clone
 * per type with R at run time and the accumulators in memory. Callers pick an
 * instance from struct attn512_fns by row count. */

/* out[r] = scale * q[r] . k_j for r < R and the 16 keys j .. j + 15 of a K
 * tile (lanes outside mk 0, and not read). One K^T vector feeds R FMAs; each
 * row sums dims d = c mod 4 in chain c, then adds the 4 chains, whatever R
 * is, so a row's score has the same bits in any group (batch invariance).
 * q8_0 sums each group of 32 dims, then multiplies the partial sum by the 16
 * keys' scales of the group, as the portable kernel does. */
#define SCORES16(TAG, T, R, MASKED, NAME)                                                          \
    static void NAME##_##TAG##_##R(const float *const *q, const void *kt, int32_t hd,              \
                                     int32_t bs, int32_t j, __mmask16 mk, float scale,             \
                                     __m512 *out) {                                                \
        enum { C = 4 };                                                                            \
        const int is_q8 = (T) == ENGINE_KV_TYPE_Q8_0;                                              \
        const int32_t ng = is_q8 ? n_groups(hd) : 1;                                               \
        const int32_t gdim = is_q8 ? KV_Q8_0_GROUP : hd;                                           \
        const float *kd = kt; /* q8_0: [ng][bs] scales, then [hd][bs] int8 */                      \
        const void *k = is_q8 ? (const void *)(kd + (int64_t)ng * bs) : kt;                        \
        __m512 o[R];                                                                               \
        for (int r = 0; r < (R); r++) o[r] = _mm512_setzero_ps();                                  \
        for (int32_t g = 0; g < ng; g++) {                                                         \
            const int32_t d0 = g * gdim;                                                           \
            const int32_t d1 = d0 + gdim < hd ? d0 + gdim : hd;                                    \
            __m512 a[R][C];                                                                        \
            for (int r = 0; r < (R); r++) {                                                        \
                for (int c = 0; c < C; c++) a[r][c] = _mm512_setzero_ps();                         \
            }                                                                                      \
            int32_t d = d0;                                                                        \
            for (; d + C <= d1; d += C) {                                                          \
                for (int c = 0; c < C; c++) {                                                      \
                    const __m512 kv = load16((T), k, (int64_t)(d + c) * bs + j, mk, MASKED);       \
                    for (int r = 0; r < (R); r++) {                                                \
                        a[r][c] = _mm512_fmadd_ps(_mm512_set1_ps(q[r][d + c]), kv, a[r][c]);       \
                    }                                                                              \
                }                                                                                  \
            }                                                                                      \
            for (; d < d1; d++) {                                                                  \
                const __m512 kv = load16((T), k, (int64_t)d * bs + j, mk, MASKED);                 \
                for (int r = 0; r < (R); r++) {                                                    \
                    a[r][0] = _mm512_fmadd_ps(_mm512_set1_ps(q[r][d]), kv, a[r][0]);               \
                }                                                                                  \
            }                                                                                      \
            const __m512 dg = is_q8 ? load16(ENGINE_KV_TYPE_F32, kd, (int64_t)g * bs + j, mk,      \
                                             MASKED)                                               \
                                    : _mm512_set1_ps(1.0f);                                        \
            for (int r = 0; r < (R); r++) {                                                        \
                __m512 part = a[r][0];                                                             \
                for (int c = 1; c < C; c++) part = _mm512_add_ps(part, a[r][c]);                   \
                o[r] = is_q8 ? _mm512_fmadd_ps(part, dg, o[r]) : part;                             \
            }                                                                                      \
        }                                                                                          \
        const __m512 vs = _mm512_set1_ps(scale);                                                   \
        for (int r = 0; r < (R); r++) out[r] = _mm512_mul_ps(o[r], vs);                            \
    }

/* The P.V update of R rows over C vectors of dims d .. d + 16 C - 1 (the
 * last one masked by mk_last), keys j0 .. j1 of a V tile:
 *   acc[r][.] = acc[r][.] * corr[r] + sum_j p[r][j - pj] v[j][.]
 * in key order, with p row r at p + r * p_stride. Each V vector is loaded and
 * converted once for all R rows; q8_0 multiplies it by its group's scale
 * once, too. vq is the tile's value array, vd (q8_0) its [bs][ng] scales.
 * Every dim of a row sees the same operations for any R and C. */
#define PV_CHUNK(TAG, T, R, C, MASKED, NAME)                                                   \
    static void NAME##_##TAG##_##R(float *acc, int64_t acc_stride, const float *corr,           \
                                   const float *p, int64_t p_stride, int32_t pj,                \
                                   const void *vq, const float *vd, int32_t ng, int32_t j0,     \
                                   int32_t j1, int32_t hd, int32_t d, __mmask16 mk_last) {      \
        __m512 a[R][C];                                                                         \
        for (int r = 0; r < (R); r++) {                                                         \
            const __m512 vc = _mm512_set1_ps(corr[r]);                                          \
            for (int c = 0; c < (C); c++) {                                                     \
                const __mmask16 mk = c == (C) - 1 ? mk_last : (__mmask16)0xffff;                \
                a[r][c] = _mm512_mul_ps(                                                        \
                    _mm512_maskz_loadu_ps(mk, acc + r * acc_stride + d + 16 * c), vc);          \
            }                                                                                   \
        }                                                                                       \
        for (int32_t j = j0; j <= j1; j++) {                                                    \
            __m512 v[C];                                                                        \
            for (int c = 0; c < (C); c++) {                                                     \
                const __mmask16 mk = c == (C) - 1 ? mk_last : (__mmask16)0xffff;                \
                v[c] = load16((T), vq, (int64_t)j * hd + d + 16 * c, mk, MASKED);               \
                if ((T) == ENGINE_KV_TYPE_Q8_0) {                                               \
                    const float dv = vd[(int64_t)j * ng + (d + 16 * c) / KV_Q8_0_GROUP];        \
                    v[c] = _mm512_mul_ps(v[c], _mm512_set1_ps(dv));                             \
                }                                                                               \
            }                                                                                   \
            for (int r = 0; r < (R); r++) {                                                     \
                const __m512 pb = _mm512_set1_ps(p[r * p_stride + (j - pj)]);                   \
                for (int c = 0; c < (C); c++) a[r][c] = _mm512_fmadd_ps(pb, v[c], a[r][c]);     \
            }                                                                                   \
        }                                                                                       \
        for (int r = 0; r < (R); r++) {                                                         \
            for (int c = 0; c < (C); c++) {                                                     \
                const __mmask16 mk = c == (C) - 1 ? mk_last : (__mmask16)0xffff;                \
                _mm512_mask_storeu_ps(acc + r * acc_stride + d + 16 * c, mk, a[r][c]);          \
            }                                                                                   \
        }                                                                                       \
    }

typedef void (*scores16_fn)(const float *const *q, const void *kt, int32_t hd, int32_t bs,
                            int32_t j, __mmask16 mk, float scale, __m512 *out);
typedef void (*pv_chunk_fn)(float *acc, int64_t acc_stride, const float *corr, const float *p,
                            int64_t p_stride, int32_t pj, const void *vq, const float *vd,
                            int32_t ng, int32_t j0, int32_t j1, int32_t hd, int32_t d,
                            __mmask16 mk_last);

struct attn512_fns {
    scores16_fn scores16[ROWS];  // [R - 1]: 16 keys
    scores16_fn scores16m[ROWS]; // [R - 1]: up to 16 keys, masked
    pv_chunk_fn pv4[ROWS];       // [R - 1]: 4 vectors (64 dims) per pass
    pv_chunk_fn pv1[ROWS];       // [R - 1]: 1 vector
    pv_chunk_fn pv1m[ROWS];      // [R - 1]: 1 vector, masked: the head_dim tail
    pv_chunk_fn pv8;             // 8 vectors (128 dims) of one row: a decode row
};

#define ROW_INSTANCES(TAG, T, R)                                                                   \
    SCORES16(TAG, T, R, 0, scores16)                                                               \
    SCORES16(TAG, T, R, 1, scores16m)                                                              \
    PV_CHUNK(TAG, T, R, 4, 0, pv4)                                                                 \
    PV_CHUNK(TAG, T, R, 1, 0, pv1)                                                                 \
    PV_CHUNK(TAG, T, R, 1, 1, pv1m)
#define TYPE_INSTANCES(TAG, T)                                                                     \
    ROW_INSTANCES(TAG, T, 1)                                                                       \
    ROW_INSTANCES(TAG, T, 2)                                                                       \
    ROW_INSTANCES(TAG, T, 3)                                                                       \
    ROW_INSTANCES(TAG, T, 4)                                                                       \
    PV_CHUNK(TAG, T, 1, 8, 0, pv8)                                                                 \
    static const struct attn512_fns fns_##TAG = {                                                  \
        {scores16_##TAG##_1, scores16_##TAG##_2, scores16_##TAG##_3, scores16_##TAG##_4},          \
        {scores16m_##TAG##_1, scores16m_##TAG##_2, scores16m_##TAG##_3, scores16m_##TAG##_4},      \
        {pv4_##TAG##_1, pv4_##TAG##_2, pv4_##TAG##_3, pv4_##TAG##_4},                              \
        {pv1_##TAG##_1, pv1_##TAG##_2, pv1_##TAG##_3, pv1_##TAG##_4},                              \
        {pv1m_##TAG##_1, pv1m_##TAG##_2, pv1m_##TAG##_3, pv1m_##TAG##_4},                          \
        pv8_##TAG##_1,                                                                             \
    };

TYPE_INSTANCES(f32, ENGINE_KV_TYPE_F32)
TYPE_INSTANCES(f16, ENGINE_KV_TYPE_F16)
TYPE_INSTANCES(q8_0, ENGINE_KV_TYPE_Q8_0)

static const struct attn512_fns *fns_of(enum engine_kv_type t) {
    switch (t) {
    case ENGINE_KV_TYPE_F32: return &fns_f32;
    case ENGINE_KV_TYPE_F16: return &fns_f16;
    case ENGINE_KV_TYPE_Q8_0: return &fns_q8_0;
    case ENGINE_KV_TYPE_COUNT: break;
    }
    return &fns_f32;
}

/* ---- the pieces ----------------------------------------------------------- */

static void scores(enum engine_kv_type t, const float *const *q, int32_t n_rows, const void *kt,
                   int32_t hd, int32_t bs, float scale, float *s) {
    const struct attn512_fns *f = fns_of(t);
    for (int32_t j = 0; j < bs; j += 16) {
        const __mmask16 mk = lanes(bs - j);
        __m512 out[ROWS];
        (mk == 0xffff ? f->scores16 : f->scores16m)[n_rows - 1](q, kt, hd, bs, j, mk, scale, out);
        for (int32_t r = 0; r < n_rows; r++) {
            _mm512_mask_storeu_ps(s + (int64_t)r * bs + j, mk, out[r]);
        }
    }
}

void kern_attn_avx512_scores_f32(const float *const *q, int32_t n_rows, const void *kt,
                                 int32_t hd, int32_t bs, float scale, float *s) {
    scores(ENGINE_KV_TYPE_F32, q, n_rows, kt, hd, bs, scale, s);
}

void kern_attn_avx512_scores_f16(const float *const *q, int32_t n_rows, const void *kt,
                                 int32_t hd, int32_t bs, float scale, float *s) {
    scores(ENGINE_KV_TYPE_F16, q, n_rows, kt, hd, bs, scale, s);
}

void kern_attn_avx512_scores_q8_0(const float *const *q, int32_t n_rows, const void *kt,
                                  int32_t hd, int32_t bs, float scale, float *s) {
    scores(ENGINE_KV_TYPE_Q8_0, q, n_rows, kt, hd, bs, scale, s);
}

/* P.V of R rows over all of head_dim: 128 dims per pass for one row, 64 for
 * several, then single vectors (head_dim 80: 64 + 16; 8: one masked vector). */
static void pv_rows(enum engine_kv_type t, int32_t R, float *acc, int64_t acc_stride,
                    const float *corr, const float *p, int64_t p_stride, int32_t pj,
                    const void *vt, int32_t j0, int32_t j1, int32_t hd, int32_t bs) {
    const struct attn512_fns *f = fns_of(t);
    int32_t ng = 0;
    const float *vd = NULL;  // q8_0: [bs][ng] scales
    const void *vq = vt;     // [bs][hd] values
    if (t == ENGINE_KV_TYPE_Q8_0) {
        ng = n_groups(hd);
        vd = vt;
        vq = vd + (int64_t)ng * bs;
    }
    int32_t d = 0;
    if (R == 1) {
        for (; d + 128 <= hd; d += 128) {
            f->pv8(acc, acc_stride, corr, p, p_stride, pj, vq, vd, ng, j0, j1, hd, d, 0xffff);
        }
    }
    for (; d + 64 <= hd; d += 64) {
        f->pv4[R - 1](acc, acc_stride, corr, p, p_stride, pj, vq, vd, ng, j0, j1, hd, d, 0xffff);
    }
    for (; d + 16 <= hd; d += 16) {
        f->pv1[R - 1](acc, acc_stride, corr, p, p_stride, pj, vq, vd, ng, j0, j1, hd, d, 0xffff);
    }
    if (d < hd) {
        f->pv1m[R - 1](acc, acc_stride, corr, p, p_stride, pj, vq, vd, ng, j0, j1, hd, d,
                       lanes(hd - d));
    }
}

void kern_attn_avx512_pv_f32(float *acc, float corr, const float *p, const void *vt, int32_t j0,
                             int32_t n, int32_t hd, int32_t bs) {
    pv_rows(ENGINE_KV_TYPE_F32, 1, acc, hd, &corr, p, 0, j0, vt, j0, j0 + n - 1, hd, bs);
}

void kern_attn_avx512_pv_f16(float *acc, float corr, const float *p, const void *vt, int32_t j0,
                             int32_t n, int32_t hd, int32_t bs) {
    pv_rows(ENGINE_KV_TYPE_F16, 1, acc, hd, &corr, p, 0, j0, vt, j0, j0 + n - 1, hd, bs);
}

void kern_attn_avx512_pv_q8_0(float *acc, float corr, const float *p, const void *vt, int32_t j0,
                              int32_t n, int32_t hd, int32_t bs) {
    pv_rows(ENGINE_KV_TYPE_Q8_0, 1, acc, hd, &corr, p, 0, j0, vt, j0, j0 + n - 1, hd, bs);
}

/* ---- the fused step ------------------------------------------------------- */

/* Bytes at the start of each tile of the next run that a decode step
 * prefetches (into L2). Each tile is a separate short stream somewhere in the
 * pool; touching its head early lets the hardware prefetcher stream the rest
 * in time. Measured (one thread, one layer, head_dim 64, 12 heads, 8192
 * keys): decode 17% faster for f32 KV, 23% f16, 12% q8_0, and the same with
 * the KV in cache; prefetching whole tiles instead gained less out of cache
 * and cost 10-15% in cache. */
#define PREFETCH_HEAD 256

/* Keys [jb0, jb1] of block b of a run (relative to the block) that fall in
 * the run's key range [u0, u1]. */
static inline void block_keys(int32_t b, int32_t bs, int32_t u0, int32_t u1, int32_t *jb0,
                              int32_t *jb1) {
    *jb0 = u0 - b * bs > 0 ? u0 - b * bs : 0;
    *jb1 = u1 - b * bs < bs - 1 ? u1 - b * bs : bs - 1;
}

/* Rows r0 .. r0 + R - 1 (R <= 4) over the unit of blocks b0 .. b0 + nb - 1
 * of a step: one online-softmax update per row. The keys the rows see
 * together are [u0, u1] (unit-relative); a row's own range is inside it and
 * its exponentials are 0 elsewhere, so one P.V pass over [u0, u1] serves all
 * R rows, and adding those zeros (to sums, and as fma(0, v, acc)) leaves a
 * row's results bit for bit what they would be alone. Every key in the union
 * was written: it is at or before some row's last key and at or after some
 * row's first one, in a live block. P holds the rows' scores, then
 * exponentials, the unit's keys side by side. With `prefetch`, each block
 * also prefetches the block of the caller's next step at the same index. */
static void step_rows(enum engine_kv_type t, const struct kern_attn_step *st, int32_t r0,
                      int32_t R, int32_t b0, int32_t nb, int prefetch) {
    const int32_t bs = st->bs;
    const int32_t n_keys = nb * bs;
    const int32_t first = st->pos0 + b0 * bs;  // position of key 0 of the run
    int32_t j0[ROWS], j1[ROWS];
    int32_t u0 = n_keys, u1 = -1;
    for (int32_t r = 0; r < R; r++) {
        const int32_t lo = st->lo[r0 + r] - first;
        const int32_t hi = st->hi[r0 + r] - first;
        j0[r] = lo > 0 ? lo : 0;
        j1[r] = hi < n_keys - 1 ? hi : n_keys - 1;
        if (j0[r] <= j1[r]) {
            u0 = j0[r] < u0 ? j0[r] : u0;
            u1 = j1[r] > u1 ? j1[r] : u1;
        }
    }
    if (u0 > u1) return;  // no row sees a key of these blocks

    // Scores of the union's keys, 16 (or a block's tail) at a time, and each row's max.
    const struct attn512_fns *f = fns_of(t);
    const int64_t ps = (int64_t)KERN_ATTN_RUN * bs;  // P row stride
    float *P = st->scratch;                           // [ROWS][KERN_ATTN_RUN * bs]
    __m512 vmax[ROWS];
    for (int32_t r = 0; r < R; r++) vmax[r] = _mm512_set1_ps(-INFINITY);
    for (int32_t b = 0; b < nb; b++) {
        if (prefetch && b0 + b < st->n_next && st->kt_next[b0 + b]) {
            // The head of a tile of the next run per block of this one.
            const size_t n = st->tile_bytes < PREFETCH_HEAD ? st->tile_bytes : PREFETCH_HEAD;
            for (size_t o = 0; o < n; o += 64) {
                _mm_prefetch((const char *)st->kt_next[b0 + b] + o, _MM_HINT_T1);
                _mm_prefetch((const char *)st->vt_next[b0 + b] + o, _MM_HINT_T1);
            }
        }
        int32_t jb0, jb1;
        block_keys(b, bs, u0, u1, &jb0, &jb1);
        for (int32_t j = jb0; j <= jb1; j += 16) {
            const __mmask16 mk = lanes(jb1 - j + 1);
            const int32_t kk = b * bs + j;  // run-relative key of lane 0
            __m512 s[ROWS];
            (mk == 0xffff ? f->scores16 : f->scores16m)[R - 1](st->q + r0, st->kt[b0 + b], st->hd,
                                                               bs, j, mk, st->scale, s);
            for (int32_t r = 0; r < R; r++) {
                // Lanes past the chunk (mk) hold no key of this block.
                const __mmask16 mr = key_range(kk, j0[r], j1[r]) & mk;
                vmax[r] = _mm512_mask_max_ps(vmax[r], mr, vmax[r], s[r]);
                _mm512_mask_storeu_ps(P + r * ps + kk, mk, s[r]);
            }
        }
    }

    // Online softmax: new max, correction of the old sums, exponentials.
    float corr[ROWS];
    for (int32_t r = 0; r < R; r++) {
        float *pr = P + r * ps;
        if (j0[r] > j1[r]) {
            corr[r] = 1.0f;  // acc * 1 + 0 * v: the row is unchanged
            for (int32_t j = u0; j <= u1; j += 16) {
                _mm512_mask_storeu_ps(pr + j, lanes(u1 - j + 1), _mm512_setzero_ps());
            }
            continue;
        }
        const float m_old = st->m[r0 + r];
        const float bmax = _mm512_reduce_max_ps(vmax[r]);
        const float mx = bmax > m_old ? bmax : m_old;
        const __m512 vm = _mm512_set1_ps(mx);
        // Chunks start at multiples of 16 keys of the unit, so each key adds
        // into the same lane of `sum` whatever the other rows of the group see.
        __m512 sum = _mm512_setzero_ps();
        for (int32_t j = u0 / 16 * 16; j <= u1; j += 16) {
            const __mmask16 mk = key_range(j, u0, u1);
            const __m512 e =
                _mm512_maskz_mov_ps(key_range(j, j0[r], j1[r]),
                                    exp512(_mm512_sub_ps(_mm512_maskz_loadu_ps(mk, pr + j), vm)));
            _mm512_mask_storeu_ps(pr + j, mk, e);
            sum = _mm512_add_ps(sum, e);
        }
        // exp(-inf) = 0 on the row's first keys: nothing to correct.
        corr[r] = _mm512_cvtss_f32(exp512(_mm512_set1_ps(m_old - mx)));
        st->l[r0 + r] = st->l[r0 + r] * corr[r] + _mm512_reduce_add_ps(sum);
        st->m[r0 + r] = mx;
    }

    // P.V block by block; the correction goes with the first one.
    static const float ones[ROWS] = {1.0f, 1.0f, 1.0f, 1.0f};
    const float *c = corr;
    for (int32_t b = 0; b < nb; b++) {
        int32_t jb0, jb1;
        block_keys(b, bs, u0, u1, &jb0, &jb1);
        if (jb0 > jb1) continue;
        pv_rows(t, R, st->acc + (int64_t)r0 * st->hd, st->hd, c, P + b * bs, ps, 0,
                st->vt[b0 + b], jb0, jb1, st->hd, bs);
        c = ones;
    }
}

/* Bytes of the K and V tiles of a unit: they are read once per group of 4
 * rows, so they should stay in L1 (48 KiB) beside the rows' queries and
 * accumulators. Measured on a 2048-token prefill: 16 and 32 KiB 10% faster
 * than one block per unit, 64 KiB 40% slower. */
#define UNIT_BYTES (16 * 1024)

/* Blocks per unit: a power of two (so units align with the caller's runs,
 * which start at multiples of KERN_ATTN_RUN blocks), at most KERN_ATTN_RUN,
 * whose tiles fit UNIT_BYTES. */
static int32_t unit_blocks(size_t tile_bytes) {
    int32_t n = 1;
    while (n < KERN_ATTN_RUN && (size_t)(2 * n) * 2 * tile_bytes <= UNIT_BYTES) n *= 2;
    return n;
}

/* The run is walked in units of unit_blocks() blocks, one softmax update per
 * row and unit, and within a unit in groups of 4 rows. The units depend only
 * on the tile size and the blocks' positions, never on the rows, so a row
 * gets the same bits in a decode step and in any prefill tile (the engine's
 * batch invariance): decode and prefill differ only in the number of rows. */
static void step(enum engine_kv_type t, const struct kern_attn_step *st) {
    const int32_t unit = unit_blocks(st->tile_bytes);
    for (int32_t b0 = 0; b0 < st->n_blocks; b0 += unit) {
        const int32_t nb = st->n_blocks - b0 < unit ? st->n_blocks - b0 : unit;
        for (int32_t r0 = 0; r0 < st->n_rows; r0 += ROWS) {
            // Decode (a few rows) does little work per block: prefetch.
            step_rows(t, st, r0, st->n_rows - r0 < ROWS ? st->n_rows - r0 : ROWS, b0, nb,
                      st->n_rows <= ROWS);
        }
    }
}

void kern_attn_avx512_step_f32(const struct kern_attn_step *st) { step(ENGINE_KV_TYPE_F32, st); }

void kern_attn_avx512_step_f16(const struct kern_attn_step *st) { step(ENGINE_KV_TYPE_F16, st); }

void kern_attn_avx512_step_q8_0(const struct kern_attn_step *st) {
    step(ENGINE_KV_TYPE_Q8_0, st);
}
