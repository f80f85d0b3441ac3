/*
 * attn_ref.c - portable attention kernels (the oracle of attn_avx2.c) and the
 * selection between the two.
 */
#include <math.h>

#include "engine/kernels/attn.h"

void kern_attn_ref_scores(const float *const *q, int32_t n_rows, const float *kt, int32_t hd,
                          int32_t bs, float scale, float *s) {
    for (int32_t r = 0; r < n_rows; r++) {
        for (int32_t j = 0; j < bs; j++) {
            float sum = 0.0f;
            for (int32_t d = 0; d < hd; d++) sum += q[r][d] * kt[(int64_t)d * bs + j];
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

void kern_attn_ref_pv(float *acc, float corr, const float *p, const float *v, int32_t n,
                      int32_t hd) {
    for (int32_t d = 0; d < hd; d++) {
        float a = acc[d] * corr;
        for (int32_t j = 0; j < n; j++) a += p[j] * v[(int64_t)j * hd + d];
        acc[d] = a;
    }
}

static const struct kern_attn attn_ref = {
    .isa = "portable",
    .scores = kern_attn_ref_scores,
    .exp_sum = kern_attn_ref_exp_sum,
    .pv = kern_attn_ref_pv,
};

static const struct kern_attn attn_avx2 = {
    .isa = "avx2",
    .scores = kern_attn_avx2_scores,
    .exp_sum = kern_attn_avx2_exp_sum,
    .pv = kern_attn_avx2_pv,
};

const struct kern_attn *kern_attn_select(bool force_portable) {
    __builtin_cpu_init();
    if (!force_portable && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
        return &attn_avx2;
    }
    return &attn_ref;
}
