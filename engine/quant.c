/*
 * quant.c - the type traits table and the f16/bf16 conversions.
 *
 * Block sizes and bytes per block follow ggml's block structs
 * (ggml-common.h): e.g. block_q8_0 = { fp16 d; int8 qs[32] } = 34 bytes.
 */
#include "engine/quant.h"

#include <string.h>

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

#define QK_K 256

static const struct quant_traits quant_table[QUANT_TYPE_COUNT] = {
    [QUANT_F32] = {"f32", 1, 4, f32_to_f32},
    [QUANT_F16] = {"f16", 1, 2, f16_to_f32},
    [QUANT_Q4_0] = {"q4_0", 32, 18, NULL},
    [QUANT_Q4_1] = {"q4_1", 32, 20, NULL},
    [QUANT_Q5_0] = {"q5_0", 32, 22, NULL},
    [QUANT_Q5_1] = {"q5_1", 32, 24, NULL},
    [QUANT_Q8_0] = {"q8_0", 32, 34, NULL},
    [QUANT_Q8_1] = {"q8_1", 32, 36, NULL},
    [QUANT_Q2_K] = {"q2_K", QK_K, 84, NULL},
    [QUANT_Q3_K] = {"q3_K", QK_K, 110, NULL},
    [QUANT_Q4_K] = {"q4_K", QK_K, 144, NULL},
    [QUANT_Q5_K] = {"q5_K", QK_K, 176, NULL},
    [QUANT_Q6_K] = {"q6_K", QK_K, 210, NULL},
    [QUANT_Q8_K] = {"q8_K", QK_K, 292, NULL},
    [QUANT_IQ2_XXS] = {"iq2_xxs", QK_K, 66, NULL},
    [QUANT_IQ2_XS] = {"iq2_xs", QK_K, 74, NULL},
    [QUANT_IQ3_XXS] = {"iq3_xxs", QK_K, 98, NULL},
    [QUANT_IQ1_S] = {"iq1_s", QK_K, 50, NULL},
    [QUANT_IQ4_NL] = {"iq4_nl", 32, 18, NULL},
    [QUANT_IQ3_S] = {"iq3_s", QK_K, 110, NULL},
    [QUANT_IQ2_S] = {"iq2_s", QK_K, 82, NULL},
    [QUANT_IQ4_XS] = {"iq4_xs", QK_K, 136, NULL},
    [QUANT_I8] = {"i8", 1, 1, NULL},
    [QUANT_I16] = {"i16", 1, 2, NULL},
    [QUANT_I32] = {"i32", 1, 4, NULL},
    [QUANT_I64] = {"i64", 1, 8, NULL},
    [QUANT_F64] = {"f64", 1, 8, NULL},
    [QUANT_IQ1_M] = {"iq1_m", QK_K, 56, NULL},
    [QUANT_BF16] = {"bf16", 1, 2, bf16_to_f32},
    [QUANT_TQ1_0] = {"tq1_0", QK_K, 54, NULL},
    [QUANT_TQ2_0] = {"tq2_0", QK_K, 66, NULL},
    [QUANT_MXFP4] = {"mxfp4", 32, 17, NULL},
};

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
    return tr && tr->to_f32;
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
