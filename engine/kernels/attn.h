/*
 * attn.h - the inner kernels of flash-style attention (engine/attention.c):
 * scores of up to 4 query rows against one KV block, the exponentials of a
 * block's scores, and the P.V update of one row; one table per KV type (f32,
 * f16, q8_0) and instruction set. A portable version (attn_ref.c) is the
 * oracle; attn_avx2.c is chosen on CPUs with AVX2 + FMA + F16C, attn_avx512.c
 * on CPUs that also have AVX-512 F/BW/VL. A table may also have a fused step
 * (scores, softmax and P.V of all a work item's rows over one block in one
 * call); attention.c composes the three pieces where it has none.
 *
 * Layouts they assume are engine/kv.h's: a block's K tile for one kv head is
 * stored transposed, k[head_dim][block_size], so the scores of all keys of a
 * block are a sum of head_dim vector FMAs with no horizontal reductions; the V
 * tile is v[block_size][head_dim]. f16 and q8_0 tiles are converted to f32 in
 * registers as they are read (q8_0: int8 times the group's scale), never into
 * a dequantized copy. Pure functions; any thread.
 */
#ifndef LLMSERVE_ATTN_H
#define LLMSERVE_ATTN_H

#include <stdint.h>

#include "engine/format/kv_type.h"
#include "engine/kernels/kernels.h"

#define KERN_ATTN_ROWS 4

/* s[r][j] = scale * sum_d q[r][d] * k[d][j], for r < n_rows (<= 4) and j < bs;
 * kt is a K tile of hd x bs (kv.h layout of the table's type); s has a row
 * stride of bs. */
typedef void (*kern_attn_scores_fn)(const float *const *q, int32_t n_rows, const void *kt,
                                    int32_t hd, int32_t bs, float scale, float *s);
/* acc[d] = acc[d] * corr + sum_{i < n} p[i] * v[j0 + i][d], d < hd, where vt is
 * a V tile of bs x hd (kv.h layout of the table's type), j0 + n <= bs. */
typedef void (*kern_attn_pv_fn)(float *acc, float corr, const float *p, const void *vt,
                                int32_t j0, int32_t n, int32_t hd, int32_t bs);

/* Most consecutive KV blocks of a sequence one fused step may cover. */
#define KERN_ATTN_RUN 8

/* One online-softmax step of a work item's rows over a run of n_blocks
 * consecutive KV blocks of its sequence (their positions follow one another;
 * their tiles may lie anywhere): the body of attention.c's block loop for
 * several blocks at once, so the softmax bookkeeping is paid per group of
 * blocks, not per block. Row r sees the keys at positions [lo[r], hi[r]]; for
 * each row with keys in the run, over those keys:
 *   s_j = scale * q_r . k_j,  m' = max(m_r, max_j s_j),  c = exp(m_r - m'),
 *   l_r = l_r * c + sum_j exp(s_j - m'),
 *   acc_r = acc_r * c + sum_j exp(s_j - m') v_j,  m_r = m'
 * (a kernel may apply this in several updates over parts of the run), and
 * rows without keys in the run are left as they are. Tiles of blocks in which
 * no row has a key may be NULL. The tiles of the blocks the caller's next
 * step will read are a prefetch hint.
 *
 * Batch invariance: for runs that start at the same block, a row's results
 * must not depend on the other rows of the step, so that a token gets the
 * same bits decoded alone and inside a prefill tile; attention.c starts runs
 * at multiples of KERN_ATTN_RUN blocks. */
struct kern_attn_step {
    const float *const *q;  // [n_rows] query rows of hd floats
    const int32_t *lo;      // [n_rows] first key position of each row
    const int32_t *hi;      // [n_rows] last key position of each row
    int32_t n_rows;
    int32_t pos0;           // position of the first key of the run
    int32_t n_blocks;       // 1 .. KERN_ATTN_RUN
    int32_t hd;
    int32_t bs;
    float scale;
    const void *const *kt;  // [n_blocks] K tiles [hd][bs] of the table's type (kv.h), or NULL
    const void *const *vt;  // [n_blocks] V tiles [bs][hd], or NULL
    const void *const *kt_next;  // [n_next] K tiles of the next step (prefetch hint), or NULL
    const void *const *vt_next;  // [n_next] V tiles of the next step
    int32_t n_next;              // 0 .. KERN_ATTN_RUN
    size_t tile_bytes;      // bytes of one K or V tile (kv_tile_bytes)
    float *m;               // [n_rows] running max (-INFINITY before the first key)
    float *l;               // [n_rows] running sum of exponentials
    float *acc;             // [n_rows][hd] running unnormalised output
    float *scratch;         // [KERN_ATTN_ROWS][KERN_ATTN_RUN * bs] floats, overwritten
};

struct kern_attn {
    const char *isa;
    enum engine_kv_type kv_type;
    kern_attn_scores_fn scores;
    /* p[j] = exp(s[j] - m) for j < n (s[j] may be -inf: p = 0); returns sum p. */
    float (*exp_sum)(float *p, const float *s, float m, int32_t n);
    kern_attn_pv_fn pv;
    /* The fused step (struct kern_attn_step), or NULL: compose the above. */
    void (*step)(const struct kern_attn_step *st);
};

/* The table of kv_type for the highest instruction set that is at most
 * max_isa and that the CPU has (KERN_ISA_VNNI counts as KERN_ISA_AVX512: no
 * attention kernel uses VNNI). max_isa KERN_ISA_PORTABLE gives the oracle;
 * the engine passes kern_get()->isa_quant, a benchmark may pass a lower level
 * to compare. Static tables: the pointer is valid for the program's life. */
const struct kern_attn *kern_attn_select(enum engine_kv_type kv_type, enum kern_isa max_isa);

void kern_attn_ref_scores_f32(const float *const *q, int32_t n_rows, const void *kt, int32_t hd,
                              int32_t bs, float scale, float *s);
void kern_attn_ref_scores_f16(const float *const *q, int32_t n_rows, const void *kt, int32_t hd,
                              int32_t bs, float scale, float *s);
void kern_attn_ref_scores_q8_0(const float *const *q, int32_t n_rows, const void *kt, int32_t hd,
                               int32_t bs, float scale, float *s);
float kern_attn_ref_exp_sum(float *p, const float *s, float m, int32_t n);
void kern_attn_ref_pv_f32(float *acc, float corr, const float *p, const void *vt, int32_t j0,
                          int32_t n, int32_t hd, int32_t bs);
void kern_attn_ref_pv_f16(float *acc, float corr, const float *p, const void *vt, int32_t j0,
                          int32_t n, int32_t hd, int32_t bs);
void kern_attn_ref_pv_q8_0(float *acc, float corr, const float *p, const void *vt, int32_t j0,
                           int32_t n, int32_t hd, int32_t bs);

void kern_attn_avx2_scores_f32(const float *const *q, int32_t n_rows, const void *kt,
                               int32_t hd, int32_t bs, float scale, float *s);
void kern_attn_avx2_scores_f16(const float *const *q, int32_t n_rows, const void *kt,
                               int32_t hd, int32_t bs, float scale, float *s);
void kern_attn_avx2_scores_q8_0(const float *const *q, int32_t n_rows, const void *kt,
                                int32_t hd, int32_t bs, float scale, float *s);
float kern_attn_avx2_exp_sum(float *p, const float *s, float m, int32_t n);
void kern_attn_avx2_pv_f32(float *acc, float corr, const float *p, const void *vt, int32_t j0,
                           int32_t n, int32_t hd, int32_t bs);
void kern_attn_avx2_pv_f16(float *acc, float corr, const float *p, const void *vt, int32_t j0,
                           int32_t n, int32_t hd, int32_t bs);
void kern_attn_avx2_pv_q8_0(float *acc, float corr, const float *p, const void *vt, int32_t j0,
                            int32_t n, int32_t hd, int32_t bs);

void kern_attn_avx512_scores_f32(const float *const *q, int32_t n_rows, const void *kt,
                                 int32_t hd, int32_t bs, float scale, float *s);
void kern_attn_avx512_scores_f16(const float *const *q, int32_t n_rows, const void *kt,
                                 int32_t hd, int32_t bs, float scale, float *s);
void kern_attn_avx512_scores_q8_0(const float *const *q, int32_t n_rows, const void *kt,
                                  int32_t hd, int32_t bs, float scale, float *s);
float kern_attn_avx512_exp_sum(float *p, const float *s, float m, int32_t n);
void kern_attn_avx512_pv_f32(float *acc, float corr, const float *p, const void *vt, int32_t j0,
                             int32_t n, int32_t hd, int32_t bs);
void kern_attn_avx512_pv_f16(float *acc, float corr, const float *p, const void *vt, int32_t j0,
                             int32_t n, int32_t hd, int32_t bs);
void kern_attn_avx512_pv_q8_0(float *acc, float corr, const float *p, const void *vt, int32_t j0,
                              int32_t n, int32_t hd, int32_t bs);
void kern_attn_avx512_step_f32(const struct kern_attn_step *st);
void kern_attn_avx512_step_f16(const struct kern_attn_step *st);
void kern_attn_avx512_step_q8_0(const struct kern_attn_step *st);

#endif
