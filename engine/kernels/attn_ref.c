/*
 * attn_ref.c - portable attention kernels for every KV type (the oracle of
 * attn_avx2.c and attn_avx512.c) and the selection of a table. Same
 * arithmetic order as the layouts suggest: q8_0 sums q . k over each group of
 * 32 dims in the int8 domain's float image, then scales the group's partial
 * sum once.
 */
#include <math.h>

#include "engine/base/alloc.h"
#include "engine/kernels/attn.h"
#include "engine/format/quant.h"

static int32_t n_groups(int32_t hd) { return (hd + KV_Q8_0_GROUP - 1) / KV_Q8_0_GROUP; }

void kern_attn_ref_scores_f32(const float *const *q, int32_t n_rows, const void *kt, int32_t hd,
                              int32_t bs, float scale, float *s) {
    const float *k = kt;
    for (int32_t r = 0; r < n_rows; r++) {
        for (int32_t j = 0; j < bs; j++) {
            float sum = 0.0f;
            for (int32_t d = 0; d < hd; d++) sum += q[r][d] * k[(int64_t)d * bs + j];
            s[(int64_t)r * bs + j] = sum * scale;
        }
    }
}

void kern_attn_ref_scores_f16(const float *const *q, int32_t n_rows, const void *kt, int32_t hd,
                              int32_t bs, float scale, float *s) {
    const uint16_t *k = kt;
    for (int32_t r = 0; r < n_rows; r++) {
        for (int32_t j = 0; j < bs; j++) {
            float sum = 0.0f;
            for (int32_t d = 0; d < hd; d++) {
                sum += q[r][d] * quant_f16_to_f32(k[(int64_t)d * bs + j]);
            }
            s[(int64_t)r * bs + j] = sum * scale;
        }
    }
}

void kern_attn_ref_scores_q8_0(const float *const *q, int32_t n_rows, const void *kt, int32_t hd,
                               int32_t bs, float scale, float *s) {
    const int32_t ng = n_groups(hd);
    const float *kd = kt;                                      // [ng][bs]
    const int8_t *kq = (const int8_t *)(kd + (int64_t)ng * bs);  // [hd][bs]
    for (int32_t r = 0; r < n_rows; r++) {
        for (int32_t j = 0; j < bs; j++) {
            float sum = 0.0f;
            for (int32_t g = 0; g < ng; g++) {
                const int32_t d1 = (g + 1) * KV_Q8_0_GROUP < hd ? (g + 1) * KV_Q8_0_GROUP : hd;
                float part = 0.0f;
                for (int32_t d = g * KV_Q8_0_GROUP; d < d1; d++) {
                    part += q[r][d] * (float)kq[(int64_t)d * bs + j];
                }
                sum += part * kd[(int64_t)g * bs + j];
            }
            s[(int64_t)r * bs + j] = sum * scale;
        }
    }
}

float kern_attn_ref_exp_sum(float *p, const float *s, float m, int32_t n) {
    float sum = 0.0f;
    for (int32_t j = 0; j < n; j++) {
        p[j] = expf(s[j] - m);
        sum += p[j];
    }
    return sum;
}

void kern_attn_ref_pv_f32(float *acc, float corr, const float *p, const void *vt, int32_t j0,
                          int32_t n, int32_t hd, int32_t bs) {
    (void)bs;
    const float *v = (const float *)vt + (int64_t)j0 * hd;
    for (int32_t d = 0; d < hd; d++) {
        float a = acc[d] * corr;
        for (int32_t j = 0; j < n; j++) a += p[j] * v[(int64_t)j * hd + d];
        acc[d] = a;
    }
}

void kern_attn_ref_pv_f16(float *acc, float corr, const float *p, const void *vt, int32_t j0,
                          int32_t n, int32_t hd, int32_t bs) {
    (void)bs;
    const uint16_t *v = (const uint16_t *)vt + (int64_t)j0 * hd;
    for (int32_t d = 0; d < hd; d++) {
        float a = acc[d] * corr;
        for (int32_t j = 0; j < n; j++) a += p[j] * quant_f16_to_f32(v[(int64_t)j * hd + d]);
        acc[d] = a;
    }
}

void kern_attn_ref_pv_q8_0(float *acc, float corr, const float *p, const void *vt, int32_t j0,
                           int32_t n, int32_t hd, int32_t bs) {
    const int32_t ng = n_groups(hd);
    const float *vd = (const float *)vt + (int64_t)j0 * ng;                    // [n][ng]
    const int8_t *vq = (const int8_t *)((const float *)vt + (int64_t)ng * bs) +
                       (int64_t)j0 * hd;                                       // [n][hd]
    for (int32_t d = 0; d < hd; d++) {
        const int32_t g = d / KV_Q8_0_GROUP;
        float a = acc[d] * corr;
        for (int32_t j = 0; j < n; j++) {
            a += p[j] * vd[(int64_t)j * ng + g] * (float)vq[(int64_t)j * hd + d];
        }
        acc[d] = a;
    }
}

static const struct kern_attn attn_ref[ENGINE_KV_TYPE_COUNT] = {
    [ENGINE_KV_TYPE_F32] = {"portable", ENGINE_KV_TYPE_F32, kern_attn_ref_scores_f32,
                            kern_attn_ref_exp_sum, kern_attn_ref_pv_f32, NULL},
    [ENGINE_KV_TYPE_F16] = {"portable", ENGINE_KV_TYPE_F16, kern_attn_ref_scores_f16,
                            kern_attn_ref_exp_sum, kern_attn_ref_pv_f16, NULL},
    [ENGINE_KV_TYPE_Q8_0] = {"portable", ENGINE_KV_TYPE_Q8_0, kern_attn_ref_scores_q8_0,
                             kern_attn_ref_exp_sum, kern_attn_ref_pv_q8_0, NULL},
};

static const struct kern_attn attn_avx2[ENGINE_KV_TYPE_COUNT] = {
    [ENGINE_KV_TYPE_F32] = {"avx2", ENGINE_KV_TYPE_F32, kern_attn_avx2_scores_f32,
                            kern_attn_avx2_exp_sum, kern_attn_avx2_pv_f32, NULL},
    [ENGINE_KV_TYPE_F16] = {"avx2", ENGINE_KV_TYPE_F16, kern_attn_avx2_scores_f16,
                            kern_attn_avx2_exp_sum, kern_attn_avx2_pv_f16, NULL},
    [ENGINE_KV_TYPE_Q8_0] = {"avx2", ENGINE_KV_TYPE_Q8_0, kern_attn_avx2_scores_q8_0,
                             kern_attn_avx2_exp_sum, kern_attn_avx2_pv_q8_0, NULL},
};

static const struct kern_attn attn_avx512[ENGINE_KV_TYPE_COUNT] = {
    [ENGINE_KV_TYPE_F32] = {"avx512", ENGINE_KV_TYPE_F32, kern_attn_avx512_scores_f32,
                            kern_attn_avx512_exp_sum, kern_attn_avx512_pv_f32,
                            kern_attn_avx512_step_f32},
    [ENGINE_KV_TYPE_F16] = {"avx512", ENGINE_KV_TYPE_F16, kern_attn_avx512_scores_f16,
                            kern_attn_avx512_exp_sum, kern_attn_avx512_pv_f16,
                            kern_attn_avx512_step_f16},
    [ENGINE_KV_TYPE_Q8_0] = {"avx512", ENGINE_KV_TYPE_Q8_0, kern_attn_avx512_scores_q8_0,
                             kern_attn_avx512_exp_sum, kern_attn_avx512_pv_q8_0,
                             kern_attn_avx512_step_q8_0},
};

const struct kern_attn *kern_attn_select(enum engine_kv_type kv_type, enum kern_isa max_isa) {
    ASSERT(kv_type >= 0 && kv_type < ENGINE_KV_TYPE_COUNT);
    const enum kern_isa cpu = kern_isa_detect();
    const enum kern_isa isa = max_isa < cpu ? max_isa : cpu;
    if (isa >= KERN_ISA_AVX512) return &attn_avx512[kv_type];
    if (isa >= KERN_ISA_AVX2) return &attn_avx2[kv_type];
    return &attn_ref[kv_type];
}
