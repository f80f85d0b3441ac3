/*
 * qpanel_amx.c - q-panel products of q8_0 and q4_0 weights on AMX-INT8 tiles,
 * for groups of 16 tokens (prefill, and decode steps of 16 or more
 * sequences); the tokens left over go to the AVX-512 VNNI kernel, whose
 * bits these equal (kernels.h, "q-panels"). Compiled with -mamx-tile
 * -mamx-int8 and the AVX-512 flags; called only after kern_isa_detect() found
 * AMX-INT8 and the kernel let this process use the tile registers.
 *
 * A panel-block's chunks are already in the layout of a tile's B operand: a
 * chunk is 64 bytes, byte 4 r + b for weight row r and k = 4 g + b, which is
 * one B row (four k values of each of 16 columns). So for one block of 32
 * values of k:
 *   A (tmm2, tmm3): 16 tokens x 32 activation bytes, loaded straight from
 *             the activation rows (stride = their row size), signed;
 *   B (tmm4, tmm5): 8 rows x 64 bytes, the block's chunks (q8_0: in place;
 *             q4_0: its nibbles spread to bytes first), unsigned;
 *   C (tmm0, tmm1): 16 tokens x 16 rows of int32, TDPBSUD: the exact integer sums
 *             of the VNNI kernel, whose unsigned weights (w + 128 for q8_0,
 *             q for q4_0) it shares, as it shares the -128 s and -8 s terms
 *             of the activation row.
 * Then per token, in registers, the float step every q-panel path performs:
 * acc = fmaf((float)(i + n), d_w * d_x, acc), block after block in k order.
 * Two sets of tiles alternate, block by block. One tile op carries 8192
 * multiply-adds (16 x 16 x 32), where the VNNI tile of 4 tokens x 2 panels
 * needs 64 vpdpbusd for 4096; the float step (a tile store, then 16 vector
 * loads and 4 operations per token) is what is left, and what bounds it
 * (docs/decisions.md: 1.1-1.6x the VNNI kernel, not more).
 */
#include <immintrin.h>
#include <stdlib.h>
#include <string.h>

#include "engine/kernels/kernels.h"
#include "engine/format/quant.h"

#define TOKENS  16  // rows of A and C: tokens per tile group
#define K_BLOCK 32  // k values per block of q8_0 and q4_0

/* LDTILECFG's 64-byte operand (palette 1). */
struct tile_config {
    uint8_t palette;
    uint8_t start_row;
    uint8_t reserved[14];
    uint16_t colsb[16];  // bytes per row of tmm0..tmm15 (8 exist)
    uint8_t rows[16];
};
_Static_assert(sizeof(struct tile_config) == 64, "LDTILECFG reads 64 bytes");

static void configure_tiles(void) {
    struct tile_config c;
    memset(&c, 0, sizeof(c));
    c.palette = 1;
    for (int i = 0; i < 2; i++) {  // two of each, so one block's tile op runs under
        c.rows[i] = TOKENS;        // the float step of the block before
        c.colsb[i] = 64;           // C (tmm0, tmm1): int32 sums, [token][16 weight rows]
        c.rows[2 + i] = TOKENS;    // A (tmm2, tmm3): the block's activations, [token][32]
        c.colsb[2 + i] = K_BLOCK;
        c.rows[4 + i] = K_BLOCK / 4;  // B (tmm4, tmm5): the block's chunks, [k / 4][16 x 4]
        c.colsb[4 + i] = 64;
    }
    _tile_loadconfig(&c);
}

static inline __m512 load_f16x16(const uint8_t *p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(const void *)p));
}

/* q4_0's 4 chunks of a block as 8 B rows: row c the low nibbles of chunk c
 * (k = 4 c + b), row c + 4 its high nibbles (k = 16 + 4 c + b). */
static inline void spread_q4_0(const uint8_t *chunks, uint8_t out[8][64]) {
    const __m512i m4 = _mm512_set1_epi8(15);
    for (int c = 0; c < 4; c++) {
        const __m512i v = _mm512_loadu_si512(chunks + c * 64);
        _mm512_storeu_si512(out[c], _mm512_and_si512(v, m4));
        _mm512_storeu_si512(out[c + 4], _mm512_and_si512(_mm512_srli_epi16(v, 4), m4));
    }
}

/* Starts block ib's tile op into C tile C with A tile A and B tile B (literal
 * numbers: the intrinsics paste them into the instruction); q4_0 spreads its
 * nibbles into `spread` first. */
#define ISSUE(C, A, B, ib)                                \
    do {                                                  \
        _tile_zero(C);                                    \
        _tile_loadd(A, xq + (ib)*K_BLOCK, (long)act_row); \
        if (t == QUANT_Q8_0) {                            \
            _tile_loadd(B, panel + (ib)*q_bytes, 64);     \
        } else {                                          \
            spread_q4_0(panel + (ib)*q_bytes, spread[C]); \
            _tile_loadd(B, spread[C], 64);                \
        }                                                 \
        _tile_dpbsud(C, A, B);                            \
    } while (0)

/* The 16 accumulators are named variables, not an array: with the tile
 * instructions' memory clobbers GCC kept an array of them on the stack and
 * loaded and stored every one at every block. */
#define EACH_TOKEN(X) \
    X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11) X(12) X(13) X(14) X(15)
#define ACC_ZERO(m) __m512 acc##m = _mm512_setzero_ps();
#define ACC_STEP(m)                                                                          \
    acc##m = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(_mm512_load_si512(sums[m]), \
                                                                 _mm512_set1_epi32(nx[m]))), \
                             _mm512_mul_ps(dw, _mm512_set1_ps(dx[m])), acc##m);
#define ACC_STORE(m) _mm512_mask_storeu_ps(y + (m)*ldy, last, acc##m);

/* Block ib's sums, stored from its C tile into `buf`, into the accumulators:
 * the float step, with the 16 tokens' scales and correction terms of the block
 * side by side (acc = fmaf((float)(i + n), d_w * d_x, acc), as every q-panel
 * path does). */
#define FINISH(buf, ib)                                \
    do {                                               \
        int32_t(*sums)[16] = (buf);                    \
        const __m512 dw = load_f16x16(meta + (ib)*32); \
        const float *dx = cols->d + (ib)*TOKENS;       \
        const int32_t *nx = cols->n + (ib)*TOKENS;     \
        EACH_TOKEN(ACC_STEP)                           \
    } while (0)

/* The activation scales and correction terms (-128 s for q8_0, -8 s for
 * q4_0) of a group of 16 tokens, block by block: [nb][16]. */
struct token_cols {
    float *d;
    int32_t *n;
};

static void gather_cols(enum quant_type t, const uint8_t *xq, size_t act_row, int64_t k,
                        struct token_cols *cols) {
    const int64_t nb = k / K_BLOCK;
    for (int m = 0; m < TOKENS; m++) {
        const struct kern_qact a = kern_qact_view(t, xq + (size_t)m * act_row, k);
        const int32_t *corr = t == QUANT_Q8_0 ? a.n128 : a.n8;
        for (int64_t ib = 0; ib < nb; ib++) {
            cols->d[ib * TOKENS + m] = a.d[ib];
            cols->n[ib * TOKENS + m] = corr[ib];
        }
    }
}

/* One panel for 16 tokens: y[t][16 rows] of tokens t0 .. t0 + 15. Blocks go
 * in pairs through two sets of tiles and two buffers, so that a block's tile
 * op runs under the float step of the block before, and its sums are read
 * back one float step after they were stored (reading them at once waited
 * for the store of the whole tile). */
static void panel16(enum quant_type t, const uint8_t *restrict xq, size_t act_row, int64_t k,
                    const struct token_cols *cols, const uint8_t *restrict panel, float *restrict y,
                    int64_t ldy, __mmask16 last) {
    const int64_t nb = k / K_BLOCK;
    const int32_t q_bytes = t == QUANT_Q8_0 ? 8 * 64 : 4 * 64;
    const uint8_t *meta = panel + nb * q_bytes;
    _Alignas(64) int32_t s0[TOKENS][16];
    _Alignas(64) int32_t s1[TOKENS][16];
    _Alignas(64) uint8_t spread[2][8][64];
    EACH_TOKEN(ACC_ZERO)
    ISSUE(0, 2, 4, 0);
    if (nb > 1) ISSUE(1, 3, 5, 1);
    _tile_stored(0, s0, 64);
    for (int64_t ib = 0; ib < nb; ib += 2) {
        // block ib is in s0; block ib + 1 (if any) is running in tmm1
        if (ib + 2 < nb) ISSUE(0, 2, 4, ib + 2);
        if (ib + 1 < nb) _tile_stored(1, s1, 64);
        FINISH(s0, ib);
        if (ib + 3 < nb) ISSUE(1, 3, 5, ib + 3);
        if (ib + 2 < nb) _tile_stored(0, s0, 64);
        if (ib + 1 < nb) FINISH(s1, ib + 1);
    }
    EACH_TOKEN(ACC_STORE)
}

/* The order of the loops, measured on m110m-q8_0 (2 threads, alternated
 * runs against VNNI): a batch of up to GROUPS groups of 16 tokens (a decode
 * step) runs panel by panel, all its groups on a panel while it is in the
 * caches, so each weight comes from memory once (32 sequences: 945-974
 * tok/s; groups outside panels streamed the weights once per group: 859-890,
 * VNNI 856-948). Larger batches (prefill) run group by group over all the
 * thread's panels, the group's activations staying in L1 (512-token prefill
 * 2076-2188 tok/s; panels outside chunks of 8 groups: 1708-1754, of 2:
 * 1960-2069; VNNI 1911-2011). The tokens left over go through the VNNI
 * kernel `rest`. */
#define GROUPS 4

static void run(enum quant_type t, kern_qpanel_fn rest, const void *restrict xq, int64_t n_tokens,
                const void *restrict pw, int64_t k, int64_t n, int64_t p0, int64_t p1,
                float *restrict y) {
    const int64_t m16 = n_tokens / TOKENS * TOKENS;
    const size_t act_row = kern_qpanel_act_bytes(t, k);
    if (m16 > 0) {
        const size_t stride = kern_qpanel_stride(t, k);
        const int64_t n_panels = (n + KERN_PANEL_ROWS - 1) / KERN_PANEL_ROWS;
        const int64_t nb = k / K_BLOCK;
        // 8 bytes per block and token of a chunk: 90 KiB at k = 5632
        const size_t col_len = (size_t)(nb * TOKENS);
        float *dbuf = malloc(GROUPS * col_len * (sizeof(float) + sizeof(int32_t)));
        if (!dbuf) {
            rest(xq, n_tokens, pw, k, n, p0, p1, y);  // same bits, slower
            return;
        }
        struct token_cols cols[GROUPS];
        for (int g = 0; g < GROUPS; g++) {
            cols[g].d = dbuf + g * col_len;
            cols[g].n = (int32_t *)(dbuf + GROUPS * col_len) + g * col_len;
        }
        configure_tiles();
        const int64_t per_chunk = m16 <= GROUPS * TOKENS ? m16 / TOKENS : 1;
        for (int64_t c0 = 0; c0 < m16; c0 += per_chunk * TOKENS) {
            const int64_t n_groups = per_chunk;
            for (int64_t g = 0; g < n_groups; g++) {
                gather_cols(t, (const uint8_t *)xq + (size_t)(c0 + g * TOKENS) * act_row, act_row,
                            k, &cols[g]);
            }
            for (int64_t p = p0; p < p1; p++) {
                __mmask16 last = 0xffff;
                if (p == n_panels - 1 && n % KERN_PANEL_ROWS) {
                    last = (__mmask16)((1u << (n % KERN_PANEL_ROWS)) - 1);
                }
                for (int64_t g = 0; g < n_groups; g++) {
                    const int64_t t0 = c0 + g * TOKENS;
                    panel16(t, (const uint8_t *)xq + (size_t)t0 * act_row, act_row, k, &cols[g],
                            (const uint8_t *)pw + (size_t)p * stride,
                            y + t0 * n + p * KERN_PANEL_ROWS, n, last);
                }
            }
        }
        _tile_release();
        free(dbuf);
    }
    if (m16 < n_tokens) {
        rest((const uint8_t *)xq + (size_t)m16 * act_row, n_tokens - m16, pw, k, n, p0, p1,
             y + m16 * n);
    }
}

void kern_qpanel_amx_q8_0(const void *restrict xq, int64_t n_tokens, const void *restrict pw,
                          int64_t k, int64_t n, int64_t p0, int64_t p1, float *restrict y) {
    run(QUANT_Q8_0, kern_qpanel_vnni_q8_0, xq, n_tokens, pw, k, n, p0, p1, y);
}

void kern_qpanel_amx_q4_0(const void *restrict xq, int64_t n_tokens, const void *restrict pw,
                          int64_t k, int64_t n, int64_t p0, int64_t p1, float *restrict y) {
    run(QUANT_Q4_0, kern_qpanel_vnni_q4_0, xq, n_tokens, pw, k, n, p0, p1, y);
}
