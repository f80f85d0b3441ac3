/*
 * attn.h - the inner kernels of flash-style attention (engine/attention.c):
 * scores of up to 4 query rows against one KV block, the exponentials of a
 * block's scores, and the P.V update of one row. A portable version
 * (attn_ref.c) is the oracle; attn_avx2.c is chosen on CPUs with AVX2 + FMA.
 *
 * Layout they assume (engine/kv.h): a block's K tile for one kv head is stored
 * transposed, kt[head_dim][block_size], so the scores of all keys of a block
 * are a sum of head_dim vector FMAs with no horizontal reductions; the V tile
 * is v[block_size][head_dim]. Pure functions; any thread.
 */
#ifndef LLMSERVE_ATTN_H
#define LLMSERVE_ATTN_H

#include <stdbool.h>
#include <stdint.h>

#define KERN_ATTN_ROWS 4

struct kern_attn {
    const char *isa;
    /* s[r][j] = scale * sum_d q[r][d] * kt[d][j], for r < n_rows (<= 4) and
     * j < bs; s has a row stride of bs. */
    void (*scores)(const float *const *q, int32_t n_rows, const float *kt, int32_t hd,
                   int32_t bs, float scale, float *s);
    /* p[j] = exp(s[j] - m) for j < n (s[j] may be -inf: p = 0); returns sum p. */
    float (*exp_sum)(float *p, const float *s, float m, int32_t n);
    /* acc[d] = acc[d] * corr + sum_{j < n} p[j] * v[j * hd + d], d < hd. */
    void (*pv)(float *acc, float corr, const float *p, const float *v, int32_t n, int32_t hd);
};

/* The AVX2 table when the CPU has AVX2 + FMA and !force_portable, else the
 * portable one. Static tables: the pointer is valid for the program's life. */
const struct kern_attn *kern_attn_select(bool force_portable);

void kern_attn_ref_scores(const float *const *q, int32_t n_rows, const float *kt, int32_t hd,
                          int32_t bs, float scale, float *s);
float kern_attn_ref_exp_sum(float *p, const float *s, float m, int32_t n);
void kern_attn_ref_pv(float *acc, float corr, const float *p, const float *v, int32_t n,
                      int32_t hd);

void kern_attn_avx2_scores(const float *const *q, int32_t n_rows, const float *kt, int32_t hd,
                           int32_t bs, float scale, float *s);
float kern_attn_avx2_exp_sum(float *p, const float *s, float m, int32_t n);
void kern_attn_avx2_pv(float *acc, float corr, const float *p, const float *v, int32_t n,
                       int32_t hd);

#endif
