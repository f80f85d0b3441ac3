/*
 * qpanel.c - the q-panel layout of quantized weights (kernels.h, "q-panels"):
 * sizes, packing from GGUF rows, the activation rows, and the portable
 * products over it, the oracle every SIMD version equals bit for bit.
 *
 * Per type: the chunks of a panel-block (64 bytes each; byte 4 r + b of a
 * chunk belongs to row r, b < 4), the meta fields (per row), and the float
 * operations per (row, token), which every implementation performs in this
 * order. i, i_j are exact int32 sums; d_x is the activation block's scale.
 *
 * q8_0, blocks of 32: 8 chunks, chunk g = w + 128 at k = 4 g + b.
 *   meta: d[16] f16.
 *   per block: acc = fmaf((float)i, d_w * d_x, acc), i = sum of w x.
 * q4_0, blocks of 32: 4 chunks; chunk c = GGUF qs[4 c + b] of the row: low
 *   nibble q at k = 4 c + b (group c), high nibble k = 16 + 4 c + b (c + 4).
 *   meta: d[16] f16.
 *   per block: as q8_0 with i = sum of (q - 8) x.
 * q4_K, super-blocks of 256: 32 chunks; chunk 8 h + t (h < 4, t < 8) = GGUF
 *   qs[32 h + 4 t + b]: low nibble k = 64 h + 4 t + b (sub-block 2 h), high
 *   nibble k = 64 h + 32 + 4 t + b (sub-block 2 h + 1).
 *   meta: d[16] f16, dmin[16] f16, sc[8][16] u8, m[4][16][2] u8 (the mins of
 *   sub-blocks 2 i and 2 i + 1 of a row side by side, for vpdpwssd).
 *   per super-block: s = 0; for j < 8: s = fmaf((float)i_j, d_w * sc_j, s)
 *   (i_j = sum of q x over sub-block j); s = fmaf((float)-mn, dmin_w, s)
 *   (mn = sum_j m_j bsum32_j); acc = fmaf(s, d_x, acc).
 * q6_K, super-blocks of 256: sub-block j (16 values, groups 4 j .. 4 j + 3)
 *   has chunks 3 j, 3 j + 1 (low 4 bits of groups 4 j, 4 j + 1 and 4 j + 2,
 *   4 j + 3 in low, high nibbles) and 3 j + 2 (the high 2 bits of group
 *   4 j + i in bits 2 i, 2 i + 1).
 *   meta: d[16] f16, sc[16][16] i8.
 *   per super-block: s = 0; for j < 16: s = fmaf((float)i_j, d_w * sc_j, s)
 *   (i_j = sum of (q - 32) x); acc = fmaf(s, d_x, acc).
 * q5_0: q4_0's 4 chunks and a fifth: the high bit of k = 4 g + b at bit
 *   8 b + g of the row's 4 bytes (so group g's bits move to bit 4 of each
 *   byte with one shift). meta: d[16] f16. per block: as q4_0 with q - 16.
 * q4_1, q5_1: the chunks of q4_0, q5_0. meta: d[16] f16, m[16] f16.
 *   per block: acc = fmaf((float)i, d_w * d_x, acc), i = sum of q x;
 *   acc = fmaf((float)s_x, m_w * d_x, acc), s_x the block sum of the x.
 * q5_K: q4_K's 32 chunks, then 8 of high bits: chunk 32 + j has sub-block
 *   j's, the bit of k = 32 j + 4 t + b at bit 8 b + t. meta and per
 *   super-block: as q4_K.
 * q3_K: 16 chunks of 2-bit values, chunk j = sub-block j (group 4 j + i in
 *   bits 2 i, 2 i + 1), then 8 of high bits: chunk 16 + h has sub-blocks 2 h
 *   and 2 h + 1, the bit of k = 16 j + 4 i + b at bit 8 b + 4 (j % 2) + i.
 *   meta: d[16] f16, sc[16][16] i8 (the 6-bit scale - 32).
 *   per super-block: as q6_K with i_j = sum of (q - 4) x.
 * q2_K: 16 chunks of 2-bit values as q3_K's. meta: d[16] f16, dmin[16] f16,
 *   scm[8][16][2] u8 (GGUF's scale | min << 4 of sub-blocks 2 i, 2 i + 1 of
 *   each row side by side). per super-block: s = 0; for j < 16: s =
 *   fmaf((float)i_j, d_w * sc_j, s) (i_j = sum of q x); s = fmaf((float)-mn,
 *   dmin_w, s) (mn = sum_j m_j bsum16_j); acc = fmaf(s, d_x, acc).
 *
 * d_w * sc_j is exact (11 + 6 significant bits). Rows past n are packed as
 * zeros (scales 0) and never stored.
 */
#include <math.h>
#include <string.h>

#include "engine/base/alloc.h"
#include "engine/kernels/kernels.h"
#include "engine/format/quant.h"

/* Bytes per panel-block: the quant chunks, then the meta. */
struct qpanel_layout {
    int32_t block;    // elements of k per block
    int32_t q_bytes;  // quant chunks of 16 rows
    int32_t m_bytes;  // scales (and mins) of 16 rows
};

static bool layout_of(enum quant_type t, struct qpanel_layout *out) {
    switch (t) {
        case QUANT_Q8_0:
            *out = (struct qpanel_layout){QK8_0, 8 * 64, 32};
            return true;
        case QUANT_Q4_0:
            *out = (struct qpanel_layout){QK4_0, 4 * 64, 32};
            return true;
        case QUANT_Q4_K:
            *out = (struct qpanel_layout){QK_K, 32 * 64, 64 + 128 + 128};
            return true;
        case QUANT_Q6_K:
            *out = (struct qpanel_layout){QK_K, 48 * 64, 32 + 256};
            return true;
        case QUANT_Q5_0:
            *out = (struct qpanel_layout){QK5_0, 5 * 64, 32};
            return true;
        case QUANT_Q4_1:
            *out = (struct qpanel_layout){QK4_1, 4 * 64, 64};
            return true;
        case QUANT_Q5_1:
            *out = (struct qpanel_layout){QK5_1, 5 * 64, 64};
            return true;
        case QUANT_Q5_K:
            *out = (struct qpanel_layout){QK_K, 40 * 64, 64 + 128 + 128};
            return true;
        case QUANT_Q3_K:
            *out = (struct qpanel_layout){QK_K, 24 * 64, 32 + 256};
            return true;
        case QUANT_Q2_K:
            *out = (struct qpanel_layout){QK_K, 16 * 64, 64 + 256};
            return true;
        default:
            return false;
    }
}

bool kern_qpanel_supports(enum quant_type t) {
    struct qpanel_layout l;
    return layout_of(t, &l);
}

size_t kern_qpanel_stride(enum quant_type t, int64_t k) {
    struct qpanel_layout l;
    ASSERT(layout_of(t, &l) && k % l.block == 0);
    const size_t nb = (size_t)(k / l.block);
    return (nb * (size_t)(l.q_bytes + l.m_bytes) + 63) / 64 * 64;
}

/* ---- activations ------------------------------------------------------------ */

size_t kern_qpanel_act_bytes(enum quant_type t, int64_t k) {
    size_t bytes = (size_t)k;
    if (quant_traits(t)->vec_dot_type == QUANT_Q8_K) {
        bytes += (size_t)(k / QK_K) * (4 + 16 * 4 + 16 * 4 + 16 * 2 + 8 * 2);
    } else {
        bytes += (size_t)(k / QK8_0) * (4 * 5);
    }
    return (bytes + 63) / 64 * 64;
}

void kern_qpanel_ref_act(enum quant_type t, const float *restrict x, int64_t k,
                         void *restrict dst) {
    const enum quant_type vt = quant_traits(t)->vec_dot_type;
    const struct quant_traits *vd = quant_traits(vt);
    struct kern_qact a = kern_qact_view(t, dst, k);
    int8_t *qs = (int8_t *)a.qs;
    float *d = (float *)a.d;
    if (vt == QUANT_Q8_K) {
        int32_t *n32 = (int32_t *)a.n32, *n4 = (int32_t *)a.n4;
        int16_t *b16 = (int16_t *)a.b16, *b32 = (int16_t *)a.b32;
        for (int64_t ib = 0; ib < k / QK_K; ib++) {
            struct block_q8_K blk;
            vd->from_f32(x + ib * QK_K, &blk, QK_K);
            memcpy(qs + ib * QK_K, blk.qs, QK_K);
            d[ib] = blk.d;
            for (int j = 0; j < 16; j++) {
                n32[16 * ib + j] = -32 * blk.bsums[j];
                n4[16 * ib + j] = -4 * blk.bsums[j];
                b16[16 * ib + j] = blk.bsums[j];
            }
            for (int j = 0; j < 8; j++) {
                b32[8 * ib + j] = (int16_t)(blk.bsums[2 * j] + blk.bsums[2 * j + 1]);
            }
        }
        return;
    }
    // q8_0 and q8_1 round the same qs and d (q8_1 adds a sum we recompute exactly)
    ASSERT(vt == QUANT_Q8_0 || vt == QUANT_Q8_1);
    int32_t *n8 = (int32_t *)a.n8, *n16 = (int32_t *)a.n16, *n128 = (int32_t *)a.n128;
    float *fs = (float *)a.fs;
    const size_t qs_off =
        vt == QUANT_Q8_0 ? offsetof(struct block_q8_0, qs) : offsetof(struct block_q8_1, qs);
    for (int64_t ib = 0; ib < k / QK8_0; ib++) {
        uint8_t blk[sizeof(struct block_q8_1)];
        vd->from_f32(x + ib * QK8_0, blk, QK8_0);
        uint16_t dh;
        memcpy(&dh, blk, 2);
        memcpy(qs + ib * QK8_0, blk + qs_off, QK8_0);
        d[ib] = quant_f16_to_f32(dh);
        int32_t s = 0;
        for (int l = 0; l < QK8_0; l++) s += qs[ib * QK8_0 + l];
        n8[ib] = -8 * s;
        n16[ib] = -16 * s;
        n128[ib] = -128 * s;
        fs[ib] = (float)s;
    }
}

/* ---- packing ------------------------------------------------------------------ */

/* The 6-bit values of a q6_K block in element order (quant.h's layout:
 * element 128 h + 32 c + l). */
static void q6_values(const struct block_q6_K *b, uint8_t v[QK_K]) {
    for (int h = 0; h < 2; h++) {
        for (int l = 0; l < 32; l++) {
            const int lo0 = b->ql[64 * h + l], lo1 = b->ql[64 * h + 32 + l], hi = b->qh[32 * h + l];
            v[128 * h + l] = (uint8_t)((lo0 & 15) | (hi & 3) << 4);
            v[128 * h + 32 + l] = (uint8_t)((lo1 & 15) | ((hi >> 2) & 3) << 4);
            v[128 * h + 64 + l] = (uint8_t)((lo0 >> 4) | ((hi >> 4) & 3) << 4);
            v[128 * h + 96 + l] = (uint8_t)((lo1 >> 4) | ((hi >> 6) & 3) << 4);
        }
    }
}

/* The 2-bit values of a q2_K/q3_K block (qs of 64 bytes) in element order
 * (element 128 h + 32 c + l: bits 2 c of qs[32 h + l]). */
static void q2_values(const uint8_t *qs, uint8_t v[QK_K]) {
    for (int h = 0; h < 2; h++) {
        for (int c = 0; c < 4; c++) {
            for (int l = 0; l < 32; l++) v[128 * h + 32 * c + l] = (qs[32 * h + l] >> (2 * c)) & 3;
        }
    }
}

/* Packs 2-bit values v (element order) of one row into 16 chunks: chunk j
 * byte 4 r + b, bits 2 i = v[16 j + 4 i + b]. */
static void put_bits2(uint8_t *q, int r, const uint8_t v[QK_K]) {
    for (int j = 0; j < 16; j++) {
        for (int b = 0; b < 4; b++) {
            const uint8_t *e = v + 16 * j + b;
            q[64 * j + 4 * r + b] = (uint8_t)(e[0] | e[4] << 2 | e[8] << 4 | e[12] << 6);
        }
    }
}

/* Sets bit 8 b + g of the row's 4 bytes at c (4 r already added) for the
 * value at group g, lane b. */
static void put_hbit(uint8_t *c, int g, int b, int bit) {
    c[b] = (uint8_t)(c[b] | bit << g);
}

/* ---- packing, one function per format: row r's block b into the panel-block
 * (q: its quants, m: its meta), in the chunk order the top of this file gives. */

static void pack_q8_0(const void *blk, int r, uint8_t *q, uint8_t *m) {
    const struct block_q8_0 *b = blk;
    for (int g = 0; g < 8; g++) {
        for (int i = 0; i < 4; i++) q[64 * g + 4 * r + i] = (uint8_t)(b->qs[4 * g + i] + 128);
    }
    memcpy(m + 2 * r, &b->d, 2);
}

/* The 16 bytes of nibbles of a block of 32 (q4_0, q4_1, and q5's low bits). */
static void put_nibbles32(const uint8_t *qs, int r, uint8_t *q) {
    for (int c = 0; c < 4; c++) memcpy(q + 64 * c + 4 * r, qs + 4 * c, 4);
}

static void pack_q4_0(const void *blk, int r, uint8_t *q, uint8_t *m) {
    const struct block_q4_0 *b = blk;
    put_nibbles32(b->qs, r, q);
    memcpy(m + 2 * r, &b->d, 2);
}

static void pack_q4_1(const void *blk, int r, uint8_t *q, uint8_t *m) {
    const struct block_q4_1 *b = blk;
    put_nibbles32(b->qs, r, q);
    memcpy(m + 2 * r, &b->d, 2);
    memcpy(m + 32 + 2 * r, &b->m, 2);
}

/* q5_0 and q5_1: q4's nibbles and the 5th bits (qh) in the chunk at 256. */
static void put_q5_bits(const uint8_t *qs, const uint8_t *qh, int r, uint8_t *q) {
    put_nibbles32(qs, r, q);
    for (int e = 0; e < 32; e++)
        put_hbit(q + 256 + 4 * r, e / 4, e % 4, (qh[e / 8] >> (e % 8)) & 1);
}

static void pack_q5_0(const void *blk, int r, uint8_t *q, uint8_t *m) {
    const struct block_q5_0 *b = blk;
    put_q5_bits(b->qs, b->qh, r, q);
    memcpy(m + 2 * r, &b->d, 2);
}

static void pack_q5_1(const void *blk, int r, uint8_t *q, uint8_t *m) {
    const struct block_q5_1 *b = blk;
    put_q5_bits(b->qs, b->qh, r, q);
    memcpy(m + 2 * r, &b->d, 2);
    memcpy(m + 32 + 2 * r, &b->m, 2);
}

/* q4_K and q5_K meta: d, dmin, the 8 6-bit scales at 64 and mins at 192. */
static void put_k4_meta(const uint8_t *d, const uint8_t *dmin, const uint8_t *scales, int r,
                        uint8_t *m) {
    memcpy(m + 2 * r, d, 2);
    memcpy(m + 32 + 2 * r, dmin, 2);
    for (int j = 0; j < 8; j++) {
        uint8_t sc, mn;
        quant_get_scale_min_k4(j, scales, &sc, &mn);
        m[64 + 16 * j + r] = sc;
        m[192 + 32 * (j / 2) + 2 * r + j % 2] = mn;
    }
}

static void pack_q4_K(const void *blk, int r, uint8_t *q, uint8_t *m) {
    const struct block_q4_K *b = blk;
    for (int c = 0; c < 32; c++) memcpy(q + 64 * c + 4 * r, b->qs + 4 * c, 4);
    put_k4_meta((const uint8_t *)&b->d, (const uint8_t *)&b->dmin, b->scales, r, m);
}

static void pack_q5_K(const void *blk, int r, uint8_t *q, uint8_t *m) {
    const struct block_q5_K *b = blk;
    for (int c = 0; c < 32; c++) memcpy(q + 64 * c + 4 * r, b->qs + 4 * c, 4);
    for (int e = 0; e < QK_K; e++) {
        const int j = e / 32, l = e % 32;
        put_hbit(q + 64 * (32 + j) + 4 * r, l / 4, l % 4, (b->qh[l] >> j) & 1);
    }
    put_k4_meta((const uint8_t *)&b->d, (const uint8_t *)&b->dmin, b->scales, r, m);
}

static void pack_q6_K(const void *blk, int r, uint8_t *q, uint8_t *m) {
    const struct block_q6_K *b = blk;
    uint8_t v6[QK_K];
    q6_values(b, v6);
    for (int j = 0; j < 16; j++) {
        uint8_t *c = q + 192 * j;
        for (int i = 0; i < 4; i++) {
            const uint8_t *v = v6 + 16 * j + i;  // groups 0..3 of lane i: v[0], v[4], ...
            c[4 * r + i] = (uint8_t)((v[0] & 15) | (v[4] & 15) << 4);
            c[64 + 4 * r + i] = (uint8_t)((v[8] & 15) | (v[12] & 15) << 4);
            c[128 + 4 * r + i] =
                (uint8_t)(v[0] >> 4 | (v[4] >> 4) << 2 | (v[8] >> 4) << 4 | (v[12] >> 4) << 6);
        }
        m[32 + 16 * j + r] = (uint8_t)b->scales[j];
    }
    memcpy(m + 2 * r, &b->d, 2);
}

/* q3_K and q2_K: the 2-bit values of the block's qs in 16 chunks. */
static void put_2bit_values(const uint8_t *qs, int r, uint8_t *q) {
    uint8_t v2[QK_K];
    q2_values(qs, v2);
    put_bits2(q, r, v2);
}

static void pack_q3_K(const void *blk, int r, uint8_t *q, uint8_t *m) {
    const struct block_q3_K *b = blk;
    put_2bit_values(b->qs, r, q);
    for (int e = 0; e < QK_K; e++) {
        const int j = e / 16, i = (e % 16) / 4, l = e % 4;
        put_hbit(q + 64 * (16 + j / 2) + 4 * r, 4 * (j % 2) + i, l,
                 (b->hmask[e % 32] >> (e / 32)) & 1);
    }
    const uint8_t *sc = b->scales;
    for (int j = 0; j < 16; j++) {
        const int lo4 = (sc[j % 8] >> (4 * (j / 8))) & 15;
        const int hi2 = (sc[8 + j % 4] >> (2 * (j / 4))) & 3;
        const int v = lo4 | hi2 << 4;
        m[32 + 16 * j + r] = (uint8_t)(int8_t)(v - 32);
    }
    memcpy(m + 2 * r, &b->d, 2);
}

static void pack_q2_K(const void *blk, int r, uint8_t *q, uint8_t *m) {
    const struct block_q2_K *b = blk;
    put_2bit_values(b->qs, r, q);
    for (int j = 0; j < 16; j++) m[64 + 32 * (j / 2) + 2 * r + j % 2] = b->scales[j];
    memcpy(m + 2 * r, &b->d, 2);
    memcpy(m + 32 + 2 * r, &b->dmin, 2);
}

typedef void (*pack_fn)(const void *blk, int r, uint8_t *q, uint8_t *m);

static const pack_fn packers[QUANT_TYPE_COUNT] = {
    [QUANT_Q8_0] = pack_q8_0, [QUANT_Q4_0] = pack_q4_0, [QUANT_Q4_1] = pack_q4_1,
    [QUANT_Q5_0] = pack_q5_0, [QUANT_Q5_1] = pack_q5_1, [QUANT_Q4_K] = pack_q4_K,
    [QUANT_Q5_K] = pack_q5_K, [QUANT_Q6_K] = pack_q6_K, [QUANT_Q3_K] = pack_q3_K,
    [QUANT_Q2_K] = pack_q2_K,
};

/* Writes one panel-block of type t: q (l.q_bytes) and m (l.m_bytes) from the
 * blocks blk[r] of the panel's rows (NULL past n: zeros). */
static void pack_block(enum quant_type t, const void *const blk[KERN_PANEL_ROWS], uint8_t *q,
                       uint8_t *m) {
    const pack_fn pack = packers[t];
    ASSERT(pack);  // layout_of() accepted only these types
    for (int r = 0; r < KERN_PANEL_ROWS; r++) {
        if (blk[r]) pack(blk[r], r, q, m);
    }
}

void kern_qpanel_pack(const struct tensor *w, void *dst) {
    struct qpanel_layout l;
    ASSERT(layout_of(w->type, &l) && w->ne[2] == 1 && w->ne[3] == 1);
    const int64_t k = w->ne[0], n = w->ne[1];
    const int64_t nb = k / l.block;
    const size_t type_size = quant_traits(w->type)->type_size;
    const size_t stride = kern_qpanel_stride(w->type, k);
    for (int64_t r0 = 0; r0 < n; r0 += KERN_PANEL_ROWS) {
        uint8_t *panel = (uint8_t *)dst + (size_t)(r0 / KERN_PANEL_ROWS) * stride;
        memset(panel, 0, stride);
        for (int64_t ib = 0; ib < nb; ib++) {
            const void *blk[KERN_PANEL_ROWS] = {0};
            for (int r = 0; r < KERN_PANEL_ROWS && r0 + r < n; r++) {
                blk[r] = (const uint8_t *)tensor_row(w, r0 + r) + (size_t)ib * type_size;
            }
            pack_block(w->type, blk, panel + (size_t)ib * (size_t)l.q_bytes,
                       panel + (size_t)nb * (size_t)l.q_bytes + (size_t)ib * (size_t)l.m_bytes);
        }
    }
}

/* ---- portable products ---------------------------------------------------------- */

static float h2f(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return quant_f16_to_f32(h);
}

/* Loops over panels [p0, p1), tokens and the panel's rows; BODY computes
 * `acc` for row r of panel `panel` (quants q, meta m) and token view a; the
 * body is the variadic argument (it may hold commas). */
#define QPANEL_REF(NAME, TYPE, BLOCK, QBYTES, MBYTES, ...)                                        \
    void NAME(const void *restrict xq, int64_t n_tokens, const void *restrict pw, int64_t k,      \
              int64_t n, int64_t p0, int64_t p1, float *restrict y) {                             \
        const int64_t nb = k / (BLOCK);                                                           \
        const size_t stride = kern_qpanel_stride(TYPE, k);                                        \
        const size_t act_bytes = kern_qpanel_act_bytes(TYPE, k);                                  \
        for (int64_t p = p0; p < p1; p++) {                                                       \
            const uint8_t *panel = (const uint8_t *)pw + (size_t)p * stride;                      \
            const int64_t rows = n - p * KERN_PANEL_ROWS < KERN_PANEL_ROWS                        \
                                     ? n - p * KERN_PANEL_ROWS                                    \
                                     : KERN_PANEL_ROWS;                                           \
            for (int64_t t = 0; t < n_tokens; t++) {                                              \
                const struct kern_qact a =                                                        \
                    kern_qact_view(TYPE, (const uint8_t *)xq + (size_t)t * act_bytes, k);         \
                for (int r = 0; r < rows; r++) {                                                  \
                    float acc = 0.0f;                                                             \
                    for (int64_t ib = 0; ib < nb; ib++) {                                         \
                        const uint8_t *q = panel + (size_t)ib * (QBYTES);                         \
                        const uint8_t *m = panel + (size_t)nb * (QBYTES) + (size_t)ib * (MBYTES); \
                        const int8_t *x = a.qs + ib * (BLOCK);                                    \
                        __VA_ARGS__                                                               \
                    }                                                                             \
                    y[t * n + p * KERN_PANEL_ROWS + r] = acc;                                     \
                }                                                                                 \
            }                                                                                     \
        }                                                                                         \
    }

QPANEL_REF(kern_qpanel_ref_q8_0, QUANT_Q8_0, QK8_0, 512, 32, {
    int32_t i = a.n128[ib];
    for (int g = 0; g < 8; g++) {
        for (int b = 0; b < 4; b++) i += q[64 * g + 4 * r + b] * x[4 * g + b];
    }
    acc = fmaf((float)i, h2f(m + 2 * r) * a.d[ib], acc);
})

QPANEL_REF(kern_qpanel_ref_q4_0, QUANT_Q4_0, QK4_0, 256, 32, {
    int32_t i = a.n8[ib];
    for (int c = 0; c < 4; c++) {
        for (int b = 0; b < 4; b++) {
            const uint8_t v = q[64 * c + 4 * r + b];
            i += (v & 15) * x[4 * c + b] + (v >> 4) * x[16 + 4 * c + b];
        }
    }
    acc = fmaf((float)i, h2f(m + 2 * r) * a.d[ib], acc);
})

QPANEL_REF(kern_qpanel_ref_q4_K, QUANT_Q4_K, QK_K, 2048, 320, {
    const float d = h2f(m + 2 * r);
    float s = 0.0f;
    for (int j = 0; j < 8; j++) {
        const int h = j / 2, shift = 4 * (j % 2);
        int32_t i = 0;
        for (int t8 = 0; t8 < 8; t8++) {
            for (int b = 0; b < 4; b++) {
                const int v = (q[64 * (8 * h + t8) + 4 * r + b] >> shift) & 15;
                i += v * x[64 * h + 32 * (j % 2) + 4 * t8 + b];
            }
        }
        s = fmaf((float)i, d * (float)m[64 + 16 * j + r], s);
    }
    int32_t mn = 0;
    for (int j = 0; j < 8; j++) mn += m[192 + 32 * (j / 2) + 2 * r + j % 2] * a.b32[8 * ib + j];
    s = fmaf((float)-mn, h2f(m + 32 + 2 * r), s);
    acc = fmaf(s, a.d[ib], acc);
})

QPANEL_REF(kern_qpanel_ref_q6_K, QUANT_Q6_K, QK_K, 3072, 288, {
    const float d = h2f(m + 2 * r);
    float s = 0.0f;
    for (int j = 0; j < 16; j++) {
        const uint8_t *c = q + 192 * j;
        int32_t i = a.n32[16 * ib + j];
        for (int g = 0; g < 4; g++) {
            for (int b = 0; b < 4; b++) {
                const int lo = (c[64 * (g / 2) + 4 * r + b] >> (4 * (g % 2))) & 15;
                const int hi = (c[128 + 4 * r + b] >> (2 * g)) & 3;
                i += (lo | hi << 4) * x[16 * j + 4 * g + b];
            }
        }
        s = fmaf((float)i, d * (float)(int8_t)m[32 + 16 * j + r], s);
    }
    acc = fmaf(s, a.d[ib], acc);
})

/* The 5th bit of k = 4 g + b from a chunk of high bits (bit 8 b + g). */
static int hbit(const uint8_t *c, int r, int g, int b) {
    return (c[4 * r + b] >> g) & 1;
}

QPANEL_REF(kern_qpanel_ref_q5_0, QUANT_Q5_0, QK5_0, 320, 32, {
    int32_t i = a.n16[ib];
    for (int c = 0; c < 4; c++) {
        for (int b = 0; b < 4; b++) {
            const uint8_t v = q[64 * c + 4 * r + b];
            i += ((v & 15) | hbit(q + 256, r, c, b) << 4) * x[4 * c + b];
            i += ((v >> 4) | hbit(q + 256, r, c + 4, b) << 4) * x[16 + 4 * c + b];
        }
    }
    acc = fmaf((float)i, h2f(m + 2 * r) * a.d[ib], acc);
})

QPANEL_REF(kern_qpanel_ref_q4_1, QUANT_Q4_1, QK4_1, 256, 64, {
    int32_t i = 0;
    for (int c = 0; c < 4; c++) {
        for (int b = 0; b < 4; b++) {
            const uint8_t v = q[64 * c + 4 * r + b];
            i += (v & 15) * x[4 * c + b] + (v >> 4) * x[16 + 4 * c + b];
        }
    }
    acc = fmaf((float)i, h2f(m + 2 * r) * a.d[ib], acc);
    acc = fmaf(a.fs[ib], h2f(m + 32 + 2 * r) * a.d[ib], acc);
})

QPANEL_REF(kern_qpanel_ref_q5_1, QUANT_Q5_1, QK5_1, 320, 64, {
    int32_t i = 0;
    for (int c = 0; c < 4; c++) {
        for (int b = 0; b < 4; b++) {
            const uint8_t v = q[64 * c + 4 * r + b];
            i += ((v & 15) | hbit(q + 256, r, c, b) << 4) * x[4 * c + b];
            i += ((v >> 4) | hbit(q + 256, r, c + 4, b) << 4) * x[16 + 4 * c + b];
        }
    }
    acc = fmaf((float)i, h2f(m + 2 * r) * a.d[ib], acc);
    acc = fmaf(a.fs[ib], h2f(m + 32 + 2 * r) * a.d[ib], acc);
})

QPANEL_REF(kern_qpanel_ref_q5_K, QUANT_Q5_K, QK_K, 2560, 320, {
    const float d = h2f(m + 2 * r);
    float s = 0.0f;
    for (int j = 0; j < 8; j++) {
        const int h = j / 2, shift = 4 * (j % 2);
        int32_t i = 0;
        for (int t8 = 0; t8 < 8; t8++) {
            for (int b = 0; b < 4; b++) {
                const int v = ((q[64 * (8 * h + t8) + 4 * r + b] >> shift) & 15) |
                              hbit(q + 64 * (32 + j), r, t8, b) << 4;
                i += v * x[64 * h + 32 * (j % 2) + 4 * t8 + b];
            }
        }
        s = fmaf((float)i, d * (float)m[64 + 16 * j + r], s);
    }
    int32_t mn = 0;
    for (int j = 0; j < 8; j++) mn += m[192 + 32 * (j / 2) + 2 * r + j % 2] * a.b32[8 * ib + j];
    s = fmaf((float)-mn, h2f(m + 32 + 2 * r), s);
    acc = fmaf(s, a.d[ib], acc);
})

QPANEL_REF(kern_qpanel_ref_q3_K, QUANT_Q3_K, QK_K, 1536, 288, {
    const float d = h2f(m + 2 * r);
    float s = 0.0f;
    for (int j = 0; j < 16; j++) {
        int32_t i = a.n4[16 * ib + j];
        for (int g = 0; g < 4; g++) {
            for (int b = 0; b < 4; b++) {
                const int v = ((q[64 * j + 4 * r + b] >> (2 * g)) & 3) |
                              hbit(q + 64 * (16 + j / 2), r, 4 * (j % 2) + g, b) << 2;
                i += v * x[16 * j + 4 * g + b];
            }
        }
        s = fmaf((float)i, d * (float)(int8_t)m[32 + 16 * j + r], s);
    }
    acc = fmaf(s, a.d[ib], acc);
})

QPANEL_REF(kern_qpanel_ref_q2_K, QUANT_Q2_K, QK_K, 1024, 320, {
    const float d = h2f(m + 2 * r);
    float s = 0.0f;
    int32_t mn = 0;
    for (int j = 0; j < 16; j++) {
        const uint8_t scm = m[64 + 32 * (j / 2) + 2 * r + j % 2];
        int32_t i = 0;
        for (int g = 0; g < 4; g++) {
            for (int b = 0; b < 4; b++)
                i += ((q[64 * j + 4 * r + b] >> (2 * g)) & 3) * x[16 * j + 4 * g + b];
        }
        s = fmaf((float)i, d * (float)(scm & 15), s);
        mn += (scm >> 4) * a.b16[16 * ib + j];
    }
    s = fmaf((float)-mn, h2f(m + 32 + 2 * r), s);
    acc = fmaf(s, a.d[ib], acc);
})
