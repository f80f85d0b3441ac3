/*
 * quant.c - the type traits table and the f16/bf16 conversions.
 *
 * Block sizes and bytes per block follow ggml's block structs
 * (ggml-common.h): e.g. block_q8_0 = { fp16 d; int8 qs[32] } = 34 bytes.
 */
#include "engine/format/quant.h"

#include <math.h>
#include <string.h>
#include <strings.h>

#include "engine/base/alloc.h"

static void f32_to_f32(const void *restrict src, float *restrict dst, int64_t n) {
    memcpy(dst, src, (size_t)n * sizeof(float));
}

static void f16_to_f32(const void *restrict src, float *restrict dst, int64_t n) {
    const uint16_t *s = src;
    for (int64_t i = 0; i < n; i++) dst[i] = quant_f16_to_f32(s[i]);
}

static void bf16_to_f32(const void *restrict src, float *restrict dst, int64_t n) {
    const uint16_t *s = src;
    for (int64_t i = 0; i < n; i++) dst[i] = quant_bf16_to_f32(s[i]);
}

static void f32_from_f32(const float *restrict src, void *restrict dst, int64_t n) {
    memcpy(dst, src, (size_t)n * sizeof(float));
}

static void f16_from_f32(const float *restrict src, void *restrict dst, int64_t n) {
    uint16_t *d = dst;
    for (int64_t i = 0; i < n; i++) d[i] = quant_f32_to_f16(src[i]);
}

static void bf16_from_f32(const float *restrict src, void *restrict dst, int64_t n) {
    uint16_t *d = dst;
    for (int64_t i = 0; i < n; i++) d[i] = quant_f32_to_bf16(src[i]);
}

#define H2F(h) quant_f16_to_f32(h)

/* ---- dequantization: the formulas of the block comments in quant.h --------- */

static void q4_0_to_f32(const void *restrict src, float *restrict dst, int64_t n) {
    const struct block_q4_0 *b = src;
    for (int64_t ib = 0; ib < n / QK4_0; ib++, dst += QK4_0) {
        const float d = H2F(b[ib].d);
        for (int l = 0; l < QK4_0 / 2; l++) {
            dst[l] = d * (float)((b[ib].qs[l] & 15) - 8);
            dst[l + 16] = d * (float)((b[ib].qs[l] >> 4) - 8);
        }
    }
}

static void q4_1_to_f32(const void *restrict src, float *restrict dst, int64_t n) {
    const struct block_q4_1 *b = src;
    for (int64_t ib = 0; ib < n / QK4_1; ib++, dst += QK4_1) {
        const float d = H2F(b[ib].d), m = H2F(b[ib].m);
        for (int l = 0; l < QK4_1 / 2; l++) {
            dst[l] = d * (float)(b[ib].qs[l] & 15) + m;
            dst[l + 16] = d * (float)(b[ib].qs[l] >> 4) + m;
        }
    }
}

static uint32_t load_u32le(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static void q5_0_to_f32(const void *restrict src, float *restrict dst, int64_t n) {
    const struct block_q5_0 *b = src;
    for (int64_t ib = 0; ib < n / QK5_0; ib++, dst += QK5_0) {
        const float d = H2F(b[ib].d);
        const uint32_t qh = load_u32le(b[ib].qh);
        for (int l = 0; l < 16; l++) {
            int lo = (b[ib].qs[l] & 15) | (int)((qh >> l) & 1) << 4;
            int hi = (b[ib].qs[l] >> 4) | (int)((qh >> (l + 16)) & 1) << 4;
            dst[l] = d * (float)(lo - 16);
            dst[l + 16] = d * (float)(hi - 16);
        }
    }
}

static void q5_1_to_f32(const void *restrict src, float *restrict dst, int64_t n) {
    const struct block_q5_1 *b = src;
    for (int64_t ib = 0; ib < n / QK5_1; ib++, dst += QK5_1) {
        const float d = H2F(b[ib].d), m = H2F(b[ib].m);
        const uint32_t qh = load_u32le(b[ib].qh);
        for (int l = 0; l < 16; l++) {
            int lo = (b[ib].qs[l] & 15) | (int)((qh >> l) & 1) << 4;
            int hi = (b[ib].qs[l] >> 4) | (int)((qh >> (l + 16)) & 1) << 4;
            dst[l] = d * (float)lo + m;
            dst[l + 16] = d * (float)hi + m;
        }
    }
}

static void q8_0_to_f32(const void *restrict src, float *restrict dst, int64_t n) {
    const struct block_q8_0 *b = src;
    for (int64_t ib = 0; ib < n / QK8_0; ib++, dst += QK8_0) {
        const float d = H2F(b[ib].d);
        for (int l = 0; l < QK8_0; l++) dst[l] = d * (float)b[ib].qs[l];
    }
}

static void q8_1_to_f32(const void *restrict src, float *restrict dst, int64_t n) {
    const struct block_q8_1 *b = src;
    for (int64_t ib = 0; ib < n / QK8_1; ib++, dst += QK8_1) {
        const float d = H2F(b[ib].d);
        for (int l = 0; l < QK8_1; l++) dst[l] = d * (float)b[ib].qs[l];
    }
}

static void q8_K_to_f32(const void *restrict src, float *restrict dst, int64_t n) {
    const struct block_q8_K *b = src;
    for (int64_t ib = 0; ib < n / QK_K; ib++, dst += QK_K) {
        for (int l = 0; l < QK_K; l++) dst[l] = b[ib].d * (float)b[ib].qs[l];
    }
}

static void q2_K_to_f32(const void *restrict src, float *restrict dst, int64_t n) {
    const struct block_q2_K *b = src;
    for (int64_t ib = 0; ib < n / QK_K; ib++, dst += QK_K) {
        const float d = H2F(b[ib].d), dmin = H2F(b[ib].dmin);
        for (int i = 0; i < QK_K; i++) {
            int q = (b[ib].qs[32 * (i / 128) + i % 32] >> (2 * ((i % 128) / 32))) & 3;
            uint8_t sc = b[ib].scales[i / 16];
            dst[i] = d * (float)(sc & 15) * (float)q - dmin * (float)(sc >> 4);
        }
    }
}

static int q3_K_scale(const uint8_t *s, int j) {
    int lo = (s[j % 8] >> (4 * (j / 8))) & 15;
    int hi = (s[8 + j % 4] >> (2 * (j / 4))) & 3;
    return (lo | hi << 4) - 32;
}

static void q3_K_to_f32(const void *restrict src, float *restrict dst, int64_t n) {
    const struct block_q3_K *b = src;
    for (int64_t ib = 0; ib < n / QK_K; ib++, dst += QK_K) {
        const float d = H2F(b[ib].d);
        for (int i = 0; i < QK_K; i++) {
            int q = (b[ib].qs[32 * (i / 128) + i % 32] >> (2 * ((i % 128) / 32))) & 3;
            q |= ((b[ib].hmask[i % 32] >> (i / 32)) & 1) << 2;
            dst[i] = d * (float)q3_K_scale(b[ib].scales, i / 16) * (float)(q - 4);
        }
    }
}

static void q4_K_to_f32(const void *restrict src, float *restrict dst, int64_t n) {
    const struct block_q4_K *b = src;
    for (int64_t ib = 0; ib < n / QK_K; ib++, dst += QK_K) {
        const float d = H2F(b[ib].d), dmin = H2F(b[ib].dmin);
        for (int j = 0; j < 8; j++) {
            uint8_t sc, m;
            quant_get_scale_min_k4(j, b[ib].scales, &sc, &m);
            const uint8_t *q = b[ib].qs + 32 * (j / 2);
            for (int l = 0; l < 32; l++) {
                int v = (q[l] >> (4 * (j % 2))) & 15;
                dst[32 * j + l] = d * (float)sc * (float)v - dmin * (float)m;
            }
        }
    }
}

static void q5_K_to_f32(const void *restrict src, float *restrict dst, int64_t n) {
    const struct block_q5_K *b = src;
    for (int64_t ib = 0; ib < n / QK_K; ib++, dst += QK_K) {
        const float d = H2F(b[ib].d), dmin = H2F(b[ib].dmin);
        for (int j = 0; j < 8; j++) {
            uint8_t sc, m;
            quant_get_scale_min_k4(j, b[ib].scales, &sc, &m);
            const uint8_t *q = b[ib].qs + 32 * (j / 2);
            for (int l = 0; l < 32; l++) {
                int v = ((q[l] >> (4 * (j % 2))) & 15) | ((b[ib].qh[l] >> j) & 1) << 4;
                dst[32 * j + l] = d * (float)sc * (float)v - dmin * (float)m;
            }
        }
    }
}

static void q6_K_to_f32(const void *restrict src, float *restrict dst, int64_t n) {
    const struct block_q6_K *b = src;
    for (int64_t ib = 0; ib < n / QK_K; ib++, dst += QK_K) {
        const float d = H2F(b[ib].d);
        for (int i = 0; i < QK_K; i++) {
            int h = i / 128, c = (i % 128) / 32, l = i % 32;
            int lo = (b[ib].ql[64 * h + l + 32 * (c % 2)] >> (4 * (c / 2))) & 15;
            int hi = (b[ib].qh[32 * h + l] >> (2 * c)) & 3;
            dst[i] = d * (float)b[ib].scales[i / 16] * (float)((lo | hi << 4) - 32);
        }
    }
}

/* ---- quantization ------------------------------------------------------------ */

static int nearest(float x) { return (int)lrintf(x); }

static int clampi(int v, int lo, int hi) { return v < lo ? lo : v > hi ? hi : v; }

/* The element of x with the largest magnitude, with its sign. */
static float max_signed(const float *x, int n) {
    float amax = 0.0f, max = 0.0f;
    for (int i = 0; i < n; i++) {
        if (fabsf(x[i]) > amax) {
            amax = fabsf(x[i]);
            max = x[i];
        }
    }
    return max;
}

static float max_abs(const float *x, int n) {
    float amax = 0.0f;
    for (int i = 0; i < n; i++) amax = fmaxf(amax, fabsf(x[i]));
    return amax;
}

/* Fits x[i] ~ scale * q[i] - mn with q in [0, nmax] and scale, mn >= 0:
 * starts from the min/max range and alternates rounding with a least-squares
 * solve for (scale, mn) a few times, keeping the best squared error. */
static void fit_scale_min(const float *x, int n, int nmax, float *out_scale, float *out_min) {
    float lo = 0.0f, hi = x[0];
    for (int i = 0; i < n; i++) {
        lo = fminf(lo, x[i]);
        hi = fmaxf(hi, x[i]);
    }
    if (hi <= lo) {
        *out_scale = 0.0f;
        *out_min = -lo;
        return;
    }
    float best_scale = (hi - lo) / (float)nmax, best_min = -lo, best_err = INFINITY;
    float scale = best_scale, mn = best_min;
    for (int it = 0; it < 5; it++) {
        double sq = 0, sq2 = 0, sx = 0, sqx = 0, err = 0;
        for (int i = 0; i < n; i++) {
            int q = clampi(nearest((x[i] + mn) / scale), 0, nmax);
            double e = (double)scale * q - mn - x[i];
            err += e * e;
            sq += q;
            sq2 += (double)q * q;
            sx += x[i];
            sqx += (double)q * x[i];
        }
        if (err < best_err) {
            best_err = (float)err;
            best_scale = scale;
            best_min = mn;
        }
        // least squares for x = a q + b: a = cov(q, x) / var(q), b = mean x - a mean q
        double det = n * sq2 - sq * sq;
        if (det <= 0) break;
        double a = (n * sqx - sq * sx) / det;
        double b = (sx - a * sq) / n;
        if (b > 0) {  // the format needs the minimum <= 0: refit the scale alone
            b = 0;
            a = sq2 > 0 ? sqx / sq2 : 0;
        }
        if (a <= 0) break;
        scale = (float)a;
        mn = (float)-b;
    }
    *out_scale = best_scale;
    *out_min = best_min;
}

/* Scale d for x[i] ~ d * q[i], q in [nmin, nmax] (nmin = -nmax - 1): tries
 * mapping the largest-magnitude element to nmin with small offsets, refines
 * each by least squares for its rounding, keeps the least squared error. */
static float fit_scale_sym(const float *x, int n, int nmin, int nmax) {
    const float max = max_signed(x, n);
    if (max == 0.0f) return 0.0f;
    float best_d = max / (float)nmin, best_err = INFINITY;
    for (int step = -4; step <= 4; step++) {
        float d = max / ((float)nmin + 0.1f * (float)step);
        for (int pass = 0; pass < 2; pass++) {
            double sxq = 0, sqq = 0, err = 0;
            for (int i = 0; i < n; i++) {
                int q = clampi(nearest(x[i] / d), nmin, nmax);
                double e = (double)d * q - x[i];
                err += e * e;
                sxq += (double)x[i] * q;
                sqq += (double)q * q;
            }
            if (err < best_err) {
                best_err = (float)err;
                best_d = d;
            }
            if (sqq <= 0) break;
            d = (float)(sxq / sqq);
        }
    }
    return best_d;
}

static void q4_0_from_f32(const float *restrict x, void *restrict dst, int64_t n) {
    struct block_q4_0 *b = dst;
    for (int64_t ib = 0; ib < n / QK4_0; ib++, x += QK4_0) {
        const float d = fit_scale_sym(x, QK4_0, -8, 7);
        b[ib].d = quant_f32_to_f16(d);
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        for (int l = 0; l < 16; l++) {
            int lo = clampi(nearest(x[l] * id) + 8, 0, 15);
            int hi = clampi(nearest(x[l + 16] * id) + 8, 0, 15);
            b[ib].qs[l] = (uint8_t)(lo | hi << 4);
        }
    }
}

static void q4_1_from_f32(const float *restrict x, void *restrict dst, int64_t n) {
    struct block_q4_1 *b = dst;
    for (int64_t ib = 0; ib < n / QK4_1; ib++, x += QK4_1) {
        float lo = x[0], hi = x[0];
        for (int l = 0; l < QK4_1; l++) {
            lo = fminf(lo, x[l]);
            hi = fmaxf(hi, x[l]);
        }
        const float d = (hi - lo) / 15.0f;
        b[ib].d = quant_f32_to_f16(d);
        b[ib].m = quant_f32_to_f16(lo);
        const float m = H2F(b[ib].m);
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        for (int l = 0; l < 16; l++) {
            int q0 = clampi(nearest((x[l] - m) * id), 0, 15);
            int q1 = clampi(nearest((x[l + 16] - m) * id), 0, 15);
            b[ib].qs[l] = (uint8_t)(q0 | q1 << 4);
        }
    }
}

static void put_u32le(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static void q5_0_from_f32(const float *restrict x, void *restrict dst, int64_t n) {
    struct block_q5_0 *b = dst;
    for (int64_t ib = 0; ib < n / QK5_0; ib++, x += QK5_0) {
        const float d = fit_scale_sym(x, QK5_0, -16, 15);
        b[ib].d = quant_f32_to_f16(d);
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        uint32_t qh = 0;
        for (int l = 0; l < 16; l++) {
            int q0 = clampi(nearest(x[l] * id) + 16, 0, 31);
            int q1 = clampi(nearest(x[l + 16] * id) + 16, 0, 31);
            b[ib].qs[l] = (uint8_t)((q0 & 15) | (q1 & 15) << 4);
            qh |= (uint32_t)(q0 >> 4) << l | (uint32_t)(q1 >> 4) << (l + 16);
        }
        put_u32le(b[ib].qh, qh);
    }
}

static void q5_1_from_f32(const float *restrict x, void *restrict dst, int64_t n) {
    struct block_q5_1 *b = dst;
    for (int64_t ib = 0; ib < n / QK5_1; ib++, x += QK5_1) {
        float lo = x[0], hi = x[0];
        for (int l = 0; l < QK5_1; l++) {
            lo = fminf(lo, x[l]);
            hi = fmaxf(hi, x[l]);
        }
        const float d = (hi - lo) / 31.0f;
        b[ib].d = quant_f32_to_f16(d);
        b[ib].m = quant_f32_to_f16(lo);
        const float m = H2F(b[ib].m);
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        uint32_t qh = 0;
        for (int l = 0; l < 16; l++) {
            int q0 = clampi(nearest((x[l] - m) * id), 0, 31);
            int q1 = clampi(nearest((x[l + 16] - m) * id), 0, 31);
            b[ib].qs[l] = (uint8_t)((q0 & 15) | (q1 & 15) << 4);
            qh |= (uint32_t)(q0 >> 4) << l | (uint32_t)(q1 >> 4) << (l + 16);
        }
        put_u32le(b[ib].qh, qh);
    }
}

static void q8_0_from_f32(const float *restrict x, void *restrict dst, int64_t n) {
    struct block_q8_0 *b = dst;
    for (int64_t ib = 0; ib < n / QK8_0; ib++, x += QK8_0) {
        const float d = max_abs(x, QK8_0) / 127.0f;
        b[ib].d = quant_f32_to_f16(d);
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        for (int l = 0; l < QK8_0; l++) b[ib].qs[l] = (int8_t)clampi(nearest(x[l] * id), -127, 127);
    }
}

static void q8_1_from_f32(const float *restrict x, void *restrict dst, int64_t n) {
    struct block_q8_1 *b = dst;
    for (int64_t ib = 0; ib < n / QK8_1; ib++, x += QK8_1) {
        const float d = max_abs(x, QK8_1) / 127.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        int sum = 0;
        for (int l = 0; l < QK8_1; l++) {
            b[ib].qs[l] = (int8_t)clampi(nearest(x[l] * id), -127, 127);
            sum += b[ib].qs[l];
        }
        b[ib].d = quant_f32_to_f16(d);
        b[ib].s = quant_f32_to_f16(d * (float)sum);
    }
}

static void q8_K_from_f32(const float *restrict x, void *restrict dst, int64_t n) {
    struct block_q8_K *b = dst;
    for (int64_t ib = 0; ib < n / QK_K; ib++, x += QK_K) {
        const float d = max_abs(x, QK_K) / 127.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        b[ib].d = d;
        for (int j = 0; j < QK_K / 16; j++) {
            int sum = 0;
            for (int l = 0; l < 16; l++) {
                int q = clampi(nearest(x[16 * j + l] * id), -127, 127);
                b[ib].qs[16 * j + l] = (int8_t)q;
                sum += q;
            }
            b[ib].bsums[j] = (int16_t)sum;
        }
    }
}

static void q2_K_from_f32(const float *restrict x, void *restrict dst, int64_t n) {
    struct block_q2_K *b = dst;
    for (int64_t ib = 0; ib < n / QK_K; ib++, x += QK_K) {
        float sc[16], mn[16], max_sc = 0.0f, max_mn = 0.0f;
        for (int j = 0; j < 16; j++) {
            fit_scale_min(x + 16 * j, 16, 3, &sc[j], &mn[j]);
            max_sc = fmaxf(max_sc, sc[j]);
            max_mn = fmaxf(max_mn, mn[j]);
        }
        b[ib].d = quant_f32_to_f16(max_sc / 15.0f);
        b[ib].dmin = quant_f32_to_f16(max_mn / 15.0f);
        const float d = H2F(b[ib].d), dmin = H2F(b[ib].dmin);
        memset(b[ib].qs, 0, sizeof(b[ib].qs));
        for (int j = 0; j < 16; j++) {
            int ls = d > 0 ? clampi(nearest(sc[j] / d), 0, 15) : 0;
            int lm = dmin > 0 ? clampi(nearest(mn[j] / dmin), 0, 15) : 0;
            b[ib].scales[j] = (uint8_t)(ls | lm << 4);
            const float es = d * (float)ls, em = dmin * (float)lm;
            for (int l = 0; l < 16; l++) {
                int i = 16 * j + l;
                int q = es > 0 ? clampi(nearest((x[i] + em) / es), 0, 3) : 0;
                b[ib].qs[32 * (i / 128) + i % 32] |= (uint8_t)(q << (2 * ((i % 128) / 32)));
            }
        }
    }
}

static void q3_K_from_f32(const float *restrict x, void *restrict dst, int64_t n) {
    struct block_q3_K *b = dst;
    for (int64_t ib = 0; ib < n / QK_K; ib++, x += QK_K) {
        float sc[16], max_sc = 0.0f;
        for (int j = 0; j < 16; j++) {
            sc[j] = fit_scale_sym(x + 16 * j, 16, -4, 3);
            if (fabsf(sc[j]) > fabsf(max_sc)) max_sc = sc[j];
        }
        const float iscale = max_sc != 0.0f ? -32.0f / max_sc : 0.0f;
        b[ib].d = quant_f32_to_f16(iscale != 0.0f ? 1.0f / iscale : 0.0f);
        const float d = H2F(b[ib].d);
        memset(b[ib].scales, 0, sizeof(b[ib].scales));
        memset(b[ib].qs, 0, sizeof(b[ib].qs));
        memset(b[ib].hmask, 0, sizeof(b[ib].hmask));
        for (int j = 0; j < 16; j++) {
            int ls = clampi(nearest(iscale * sc[j]), -32, 31);
            int u = ls + 32;
            b[ib].scales[j % 8] |= (uint8_t)((u & 15) << (4 * (j / 8)));
            b[ib].scales[8 + j % 4] |= (uint8_t)((u >> 4) << (2 * (j / 4)));
            const float es = d * (float)ls;
            for (int l = 0; l < 16; l++) {
                int i = 16 * j + l;
                int q = es != 0.0f ? clampi(nearest(x[i] / es), -4, 3) + 4 : 4;
                b[ib].qs[32 * (i / 128) + i % 32] |= (uint8_t)((q & 3) << (2 * ((i % 128) / 32)));
                b[ib].hmask[i % 32] |= (uint8_t)((q >> 2) << (i / 32));
            }
        }
    }
}

/* Scales and mins of the 8 sub-blocks of 32 of a q4_K/q5_K block, quantized to
 * 6 bits against the f16 super-block d/dmin; returns the effective values. */
static void k4_scales(const float *x, int nmax, uint16_t *d_out, uint16_t *dmin_out,
                      uint8_t scales[K_SCALE_SIZE], float es[8], float em[8]) {
    float sc[8], mn[8], max_sc = 0.0f, max_mn = 0.0f;
    for (int j = 0; j < 8; j++) {
        fit_scale_min(x + 32 * j, 32, nmax, &sc[j], &mn[j]);
        max_sc = fmaxf(max_sc, sc[j]);
        max_mn = fmaxf(max_mn, mn[j]);
    }
    *d_out = quant_f32_to_f16(max_sc / 63.0f);
    *dmin_out = quant_f32_to_f16(max_mn / 63.0f);
    const float d = H2F(*d_out), dmin = H2F(*dmin_out);
    uint8_t ls[8], lm[8];
    for (int j = 0; j < 8; j++) {
        ls[j] = (uint8_t)(d > 0 ? clampi(nearest(sc[j] / d), 0, 63) : 0);
        lm[j] = (uint8_t)(dmin > 0 ? clampi(nearest(mn[j] / dmin), 0, 63) : 0);
        es[j] = d * (float)ls[j];
        em[j] = dmin * (float)lm[j];
    }
    for (int j = 0; j < 4; j++) {
        scales[j] = (uint8_t)(ls[j] | (ls[j + 4] >> 4) << 6);
        scales[j + 4] = (uint8_t)(lm[j] | (lm[j + 4] >> 4) << 6);
        scales[j + 8] = (uint8_t)((ls[j + 4] & 15) | (lm[j + 4] & 15) << 4);
    }
}

static void q4_K_from_f32(const float *restrict x, void *restrict dst, int64_t n) {
    struct block_q4_K *b = dst;
    for (int64_t ib = 0; ib < n / QK_K; ib++, x += QK_K) {
        float es[8], em[8];
        k4_scales(x, 15, &b[ib].d, &b[ib].dmin, b[ib].scales, es, em);
        memset(b[ib].qs, 0, sizeof(b[ib].qs));
        for (int j = 0; j < 8; j++) {
            for (int l = 0; l < 32; l++) {
                int q = es[j] > 0 ? clampi(nearest((x[32 * j + l] + em[j]) / es[j]), 0, 15) : 0;
                b[ib].qs[32 * (j / 2) + l] |= (uint8_t)(q << (4 * (j % 2)));
            }
        }
    }
}

static void q5_K_from_f32(const float *restrict x, void *restrict dst, int64_t n) {
    struct block_q5_K *b = dst;
    for (int64_t ib = 0; ib < n / QK_K; ib++, x += QK_K) {
        float es[8], em[8];
        k4_scales(x, 31, &b[ib].d, &b[ib].dmin, b[ib].scales, es, em);
        memset(b[ib].qs, 0, sizeof(b[ib].qs));
        memset(b[ib].qh, 0, sizeof(b[ib].qh));
        for (int j = 0; j < 8; j++) {
            for (int l = 0; l < 32; l++) {
                int q = es[j] > 0 ? clampi(nearest((x[32 * j + l] + em[j]) / es[j]), 0, 31) : 0;
                b[ib].qs[32 * (j / 2) + l] |= (uint8_t)((q & 15) << (4 * (j % 2)));
                b[ib].qh[l] |= (uint8_t)((q >> 4) << j);
            }
        }
    }
}

static void q6_K_from_f32(const float *restrict x, void *restrict dst, int64_t n) {
    struct block_q6_K *b = dst;
    for (int64_t ib = 0; ib < n / QK_K; ib++, x += QK_K) {
        float sc[16], max_sc = 0.0f;
        for (int j = 0; j < 16; j++) {
            sc[j] = fit_scale_sym(x + 16 * j, 16, -32, 31);
            if (fabsf(sc[j]) > fabsf(max_sc)) max_sc = sc[j];
        }
        const float iscale = max_sc != 0.0f ? -128.0f / max_sc : 0.0f;
        b[ib].d = quant_f32_to_f16(iscale != 0.0f ? 1.0f / iscale : 0.0f);
        const float d = H2F(b[ib].d);
        memset(b[ib].ql, 0, sizeof(b[ib].ql));
        memset(b[ib].qh, 0, sizeof(b[ib].qh));
        for (int j = 0; j < 16; j++) {
            int ls = clampi(nearest(iscale * sc[j]), -128, 127);
            b[ib].scales[j] = (int8_t)ls;
            const float es = d * (float)ls;
            for (int l = 0; l < 16; l++) {
                int i = 16 * j + l;
                int q = es != 0.0f ? clampi(nearest(x[i] / es), -32, 31) + 32 : 32;
                int h = i / 128, c = (i % 128) / 32, e = i % 32;
                b[ib].ql[64 * h + e + 32 * (c % 2)] |= (uint8_t)((q & 15) << (4 * (c / 2)));
                b[ib].qh[32 * h + e] |= (uint8_t)((q >> 4) << (2 * c));
            }
        }
    }
}

/* Supported entries: name, block size, bytes per block, to_f32, from_f32, and
 * the activation type of the dot products (quant.h). The rest are sizes only. */
#define Q(nm, bs, ts, to, from, vd) {.name = nm, .block_size = bs, .type_size = ts, \
                                      .to_f32 = to, .from_f32 = from, .vec_dot_type = vd}
static const struct quant_traits quant_table[QUANT_TYPE_COUNT] = {
    [QUANT_F32] = Q("f32", 1, 4, f32_to_f32, f32_from_f32, QUANT_F32),
    [QUANT_F16] = Q("f16", 1, 2, f16_to_f32, f16_from_f32, QUANT_F32),
    [QUANT_Q4_0] = Q("q4_0", QK4_0, 18, q4_0_to_f32, q4_0_from_f32, QUANT_Q8_0),
    [QUANT_Q4_1] = Q("q4_1", QK4_1, 20, q4_1_to_f32, q4_1_from_f32, QUANT_Q8_1),
    [QUANT_Q5_0] = Q("q5_0", QK5_0, 22, q5_0_to_f32, q5_0_from_f32, QUANT_Q8_0),
    [QUANT_Q5_1] = Q("q5_1", QK5_1, 24, q5_1_to_f32, q5_1_from_f32, QUANT_Q8_1),
    [QUANT_Q8_0] = Q("q8_0", QK8_0, 34, q8_0_to_f32, q8_0_from_f32, QUANT_Q8_0),
    [QUANT_Q8_1] = Q("q8_1", QK8_1, 36, q8_1_to_f32, q8_1_from_f32, QUANT_Q8_1),
    [QUANT_Q2_K] = Q("q2_K", QK_K, 84, q2_K_to_f32, q2_K_from_f32, QUANT_Q8_K),
    [QUANT_Q3_K] = Q("q3_K", QK_K, 110, q3_K_to_f32, q3_K_from_f32, QUANT_Q8_K),
    [QUANT_Q4_K] = Q("q4_K", QK_K, 144, q4_K_to_f32, q4_K_from_f32, QUANT_Q8_K),
    [QUANT_Q5_K] = Q("q5_K", QK_K, 176, q5_K_to_f32, q5_K_from_f32, QUANT_Q8_K),
    [QUANT_Q6_K] = Q("q6_K", QK_K, 210, q6_K_to_f32, q6_K_from_f32, QUANT_Q8_K),
    [QUANT_Q8_K] = Q("q8_K", QK_K, 292, q8_K_to_f32, q8_K_from_f32, QUANT_Q8_K),
    [QUANT_IQ2_XXS] = {"iq2_xxs", QK_K, 66, NULL, NULL, QUANT_F32},
    [QUANT_IQ2_XS] = {"iq2_xs", QK_K, 74, NULL, NULL, QUANT_F32},
    [QUANT_IQ3_XXS] = {"iq3_xxs", QK_K, 98, NULL, NULL, QUANT_F32},
    [QUANT_IQ1_S] = {"iq1_s", QK_K, 50, NULL, NULL, QUANT_F32},
    [QUANT_IQ4_NL] = {"iq4_nl", 32, 18, NULL, NULL, QUANT_F32},
    [QUANT_IQ3_S] = {"iq3_s", QK_K, 110, NULL, NULL, QUANT_F32},
    [QUANT_IQ2_S] = {"iq2_s", QK_K, 82, NULL, NULL, QUANT_F32},
    [QUANT_IQ4_XS] = {"iq4_xs", QK_K, 136, NULL, NULL, QUANT_F32},
    [QUANT_I8] = {"i8", 1, 1, NULL, NULL, QUANT_F32},
    [QUANT_I16] = {"i16", 1, 2, NULL, NULL, QUANT_F32},
    [QUANT_I32] = {"i32", 1, 4, NULL, NULL, QUANT_F32},
    [QUANT_I64] = {"i64", 1, 8, NULL, NULL, QUANT_F32},
    [QUANT_F64] = {"f64", 1, 8, NULL, NULL, QUANT_F32},
    [QUANT_IQ1_M] = {"iq1_m", QK_K, 56, NULL, NULL, QUANT_F32},
    [QUANT_BF16] = Q("bf16", 1, 2, bf16_to_f32, bf16_from_f32, QUANT_F32),
    [QUANT_TQ1_0] = {"tq1_0", QK_K, 54, NULL, NULL, QUANT_F32},
    [QUANT_TQ2_0] = {"tq2_0", QK_K, 66, NULL, NULL, QUANT_F32},
    [QUANT_MXFP4] = {"mxfp4", 32, 17, NULL, NULL, QUANT_F32},
};
#undef Q

int32_t quant_type_from_name(const char *name) {
    for (int32_t t = 0; t < QUANT_TYPE_COUNT; t++) {
        if (quant_table[t].name && strcasecmp(quant_table[t].name, name) == 0) return t;
    }
    return -1;
}

const struct quant_traits *quant_traits(uint32_t t) {
    if (t >= QUANT_TYPE_COUNT || !quant_table[t].name) return NULL;
    return &quant_table[t];
}

const char *quant_name(uint32_t t) {
    const struct quant_traits *tr = quant_traits(t);
    return tr ? tr->name : "unknown";
}

bool quant_is_supported(uint32_t t) {
    const struct quant_traits *tr = quant_traits(t);
    // q8_1 and q8_K are activation formats (ggml never writes weights in them);
    // the matrix kernels have no dot product with them as the weight side.
    return tr && tr->to_f32 && t != QUANT_Q8_1 && t != QUANT_Q8_K;
}

size_t quant_row_size(enum quant_type t, int64_t n) {
    const struct quant_traits *tr = quant_traits((uint32_t)t);
    ASSERT(tr && n % tr->block_size == 0);
    return (size_t)(n / tr->block_size) * tr->type_size;
}

/* IEEE 754 binary16: 1 sign, 5 exponent (bias 15), 10 mantissa bits. */
float quant_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f;
    uint32_t man = h & 0x3ff;
    uint32_t bits;
    if (exp == 0) {
        if (man == 0) {
            bits = sign;
        } else {  // subnormal: normalise
            exp = 127 - 15 + 1;
            while (!(man & 0x400)) {
                man <<= 1;
                exp--;
            }
            man &= 0x3ff;
            bits = sign | (exp << 23) | (man << 13);
        }
    } else if (exp == 0x1f) {
        bits = sign | 0x7f800000 | (man << 13);  // inf or nan
    } else {
        bits = sign | ((exp + 127 - 15) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

uint16_t quant_f32_to_f16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000;
    uint32_t abs = x & 0x7fffffff;
    if (abs >= 0x7f800000) {  // inf or nan
        return (uint16_t)(sign | 0x7c00 | (abs > 0x7f800000 ? 0x200 : 0));
    }
    if (abs >= 0x477ff000) return (uint16_t)(sign | 0x7c00);  // rounds to inf
    if (abs < 0x38800000) {  // below the smallest normal half: subnormal or zero
        if (abs < 0x33000000) return (uint16_t)sign;
        uint32_t exp = abs >> 23;
        uint32_t man = (abs & 0x7fffff) | 0x800000;
        uint32_t shift = 126 - exp;  // 14 + (113 - exp)
        uint32_t half = man >> shift;
        uint32_t rem = man & ((1u << shift) - 1);
        uint32_t mid = 1u << (shift - 1);
        if (rem > mid || (rem == mid && (half & 1))) half++;
        return (uint16_t)(sign | half);
    }
    uint32_t h = ((abs - 0x38000000) >> 13);
    uint32_t rem = abs & 0x1fff;
    if (rem > 0x1000 || (rem == 0x1000 && (h & 1))) h++;
    return (uint16_t)(sign | h);
}

float quant_bf16_to_f32(uint16_t h) {
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

uint16_t quant_f32_to_bf16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    if ((x & 0x7fffffff) > 0x7f800000) return (uint16_t)((x >> 16) | 0x40);  // quiet nan
    x += 0x7fff + ((x >> 16) & 1);
    return (uint16_t)(x >> 16);
}
