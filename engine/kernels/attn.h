/*
 * attn.h - the inner kernels of flash-style attention (engine/attention.c):
 * scores of up to 4 query rows against one KV block, the exponentials of a
 * block's scores, and the P.V update of one row; one table per KV type (f32,
 * f16, q8_0). A portable version (attn_ref.c) is the oracle; attn_avx2.c is
 * chosen on CPUs with AVX2 + FMA + F16C.
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

#include <stdbool.h>
#include <stdint.h>

#include "engine/engine.h"

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

struct kern_attn {
    const char *isa;
    enum engine_kv_type kv_type;
    kern_attn_scores_fn scores;
    /* p[j] = exp(s[j] - m) for j < n (s[j] may be -inf: p = 0); returns sum p. */
    float (*exp_sum)(float *p, const float *s, float m, int32_t n);
    kern_attn_pv_fn pv;
};

/* The AVX2 table of kv_type when the CPU has AVX2 + FMA + F16C and
 * !force_portable, else the portable one. Static tables: the pointer is valid
 * for the program's life. */
const struct kern_attn *kern_attn_select(enum engine_kv_type kv_type, bool force_portable);

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

#endif
