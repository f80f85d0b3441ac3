/*
 * quant.h - tensor element types as GGUF/ggml number them, their block
 * layouts (block size, bytes per block), and conversions to f32.
 *
 * enum quant_type values equal the GGUF type ids; ids are only ever added,
 * removed ones stay as comments. quant_traits() knows the size of every type
 * GGUF defines, so a file can be bounds-checked even when its type cannot be
 * computed with yet; quant_is_supported() says which types the engine runs.
 * [any thread]: everything here is pure.
 */
#ifndef LLMSERVE_QUANT_H
#define LLMSERVE_QUANT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum quant_type {
    QUANT_F32 = 0,
    QUANT_F16 = 1,
    QUANT_Q4_0 = 2,
    QUANT_Q4_1 = 3,
    // 4, 5: Q4_2, Q4_3 (removed from ggml)
    QUANT_Q5_0 = 6,
    QUANT_Q5_1 = 7,
    QUANT_Q8_0 = 8,
    QUANT_Q8_1 = 9,
    QUANT_Q2_K = 10,
    QUANT_Q3_K = 11,
    QUANT_Q4_K = 12,
    QUANT_Q5_K = 13,
    QUANT_Q6_K = 14,
    QUANT_Q8_K = 15,
    QUANT_IQ2_XXS = 16,
    QUANT_IQ2_XS = 17,
    QUANT_IQ3_XXS = 18,
    QUANT_IQ1_S = 19,
    QUANT_IQ4_NL = 20,
    QUANT_IQ3_S = 21,
    QUANT_IQ2_S = 22,
    QUANT_IQ4_XS = 23,
    QUANT_I8 = 24,
    QUANT_I16 = 25,
    QUANT_I32 = 26,
    QUANT_I64 = 27,
    QUANT_F64 = 28,
    QUANT_IQ1_M = 29,
    QUANT_BF16 = 30,
    // 31..33: Q4_0_4_4, Q4_0_4_8, Q4_0_8_8 (removed from ggml)
    QUANT_TQ1_0 = 34,
    QUANT_TQ2_0 = 35,
    // 36..38: IQ4_NL_4_4, IQ4_NL_4_8, IQ4_NL_8_8 (removed from ggml)
    QUANT_MXFP4 = 39,
    QUANT_TYPE_COUNT = 40,
};

/* ---- GGUF block layouts (ggml-common.h), bit for bit -------------------------
 *
 * d, dmin, m, s are IEEE halves (uint16_t bits) unless the field says float.
 * Elements of a block are numbered 0..block_size-1 in row order; the comment
 * on each struct says which bits hold element i. K-quants have super-blocks
 * of QK_K = 256 elements split into sub-blocks of 16 or 32 with their own
 * (quantized) scales and mins. */
#define QK4_0 32
#define QK4_1 32
#define QK5_0 32
#define QK5_1 32
#define QK8_0 32
#define QK8_1 32
#define QK_K 256
#define K_SCALE_SIZE 12

/* x[i] = d * ((qs[i % 16] >> (4 * (i / 16))) & 15) - 8) */
struct block_q4_0 {
    uint16_t d;
    uint8_t qs[QK4_0 / 2];
};
/* x[i] = d * nibble(i) + m, nibbles as q4_0 */
struct block_q4_1 {
    uint16_t d;
    uint16_t m;
    uint8_t qs[QK4_1 / 2];
};
/* x[i] = d * ((nibble(i) | bit i of the little-endian uint32 qh << 4) - 16) */
struct block_q5_0 {
    uint16_t d;
    uint8_t qh[4];
    uint8_t qs[QK5_0 / 2];
};
/* x[i] = d * (nibble(i) | bit i of qh << 4) + m */
struct block_q5_1 {
    uint16_t d;
    uint16_t m;
    uint8_t qh[4];
    uint8_t qs[QK5_1 / 2];
};
/* x[i] = d * qs[i] */
struct block_q8_0 {
    uint16_t d;
    int8_t qs[QK8_0];
};
/* x[i] = d * qs[i]; s = d * sum(qs) (the activation partner of q4_1/q5_1) */
struct block_q8_1 {
    uint16_t d;
    uint16_t s;
    int8_t qs[QK8_1];
};
/* 16 sub-blocks of 16: x = d * (scales[j] & 15) * q - dmin * (scales[j] >> 4),
 * q the 2-bit value of element i: qs[32 * (i / 128) + i % 32] >> (2 * ((i % 128) / 32)) */
struct block_q2_K {
    uint8_t scales[QK_K / 16];
    uint8_t qs[QK_K / 4];
    uint16_t d;
    uint16_t dmin;
};
/* 16 sub-blocks of 16: x = d * (scale_j - 32) * (q - 4), q = 2 low bits as in
 * q2_K plus hmask[i % 32] bit (i / 32) as bit 2; scale_j is 6 bits: low 4 in
 * scales[j % 8] (nibble j / 8), high 2 in scales[8 + j % 4] bits 2 * (j / 4). */
struct block_q3_K {
    uint8_t hmask[QK_K / 8];
    uint8_t qs[QK_K / 4];
    uint8_t scales[K_SCALE_SIZE];
    uint16_t d;
};
/* 8 sub-blocks of 32: x = d * sc_j * q - dmin * m_j, sc_j/m_j 6 bits packed in
 * scales (quant_get_scale_min_k4); q = low (even j) or high (odd j) nibble of
 * qs[32 * (j / 2) + i % 32]. */
struct block_q4_K {
    uint16_t d;
    uint16_t dmin;
    uint8_t scales[K_SCALE_SIZE];
    uint8_t qs[QK_K / 2];
};
/* as q4_K with a fifth bit: qh[i % 32] bit j (sub-block j = i / 32) */
struct block_q5_K {
    uint16_t d;
    uint16_t dmin;
    uint8_t scales[K_SCALE_SIZE];
    uint8_t qh[QK_K / 8];
    uint8_t qs[QK_K / 2];
};
/* 16 sub-blocks of 16: x = d * scales[j] * (q - 32), q 6 bits: in each half of
 * 128 (h), element l + 32 * c (c = 0..3, l < 32) has low 4 bits in the
 * (c / 2 ? high : low) nibble of ql[64 h + l + 32 (c % 2)] and high 2 bits in
 * qh[32 h + l] bits 2c..2c+1. */
struct block_q6_K {
    uint8_t ql[QK_K / 2];
    uint8_t qh[QK_K / 4];
    int8_t scales[QK_K / 16];
    uint16_t d;
};
/* Activations for the K-quant dot products: x = d * qs, bsums = sums of 16. */
struct block_q8_K {
    float d;
    int8_t qs[QK_K];
    int16_t bsums[QK_K / 16];
};

_Static_assert(sizeof(struct block_q4_0) == 18, "block_q4_0 layout");
_Static_assert(sizeof(struct block_q4_1) == 20, "block_q4_1 layout");
_Static_assert(sizeof(struct block_q5_0) == 22, "block_q5_0 layout");
_Static_assert(sizeof(struct block_q5_1) == 24, "block_q5_1 layout");
_Static_assert(sizeof(struct block_q8_0) == 34, "block_q8_0 layout");
_Static_assert(sizeof(struct block_q8_1) == 36, "block_q8_1 layout");
_Static_assert(sizeof(struct block_q2_K) == 84, "block_q2_K layout");
_Static_assert(sizeof(struct block_q3_K) == 110, "block_q3_K layout");
_Static_assert(sizeof(struct block_q4_K) == 144, "block_q4_K layout");
_Static_assert(sizeof(struct block_q5_K) == 176, "block_q5_K layout");
_Static_assert(sizeof(struct block_q6_K) == 210, "block_q6_K layout");
_Static_assert(sizeof(struct block_q8_K) == 292, "block_q8_K layout");

/* Converts n elements of one row (n a multiple of the block size). */
typedef void (*quant_to_f32_fn)(const void *restrict src, float *restrict dst, int64_t n);
/* Quantizes n elements (a multiple of the block size) into blocks at dst. Pure
 * round-to-nearest with per-block scale search; no importance matrix. */
typedef void (*quant_from_f32_fn)(const float *restrict src, void *restrict dst, int64_t n);

struct quant_traits {
    const char *name;             // "f32", "q4_K", ... (ggml's spelling); NULL: unknown id
    int32_t block_size;           // elements per block
    size_t type_size;             // bytes per block
    quant_to_f32_fn to_f32;       // NULL: the engine cannot compute with this type yet
    quant_from_f32_fn from_f32;   // NULL: we cannot write this type
    enum quant_type vec_dot_type; // activation type the integer dot products pair it with
};

/* Traits of type id t, or NULL when t is not a GGUF type id (out of range or a
 * removed id). */
const struct quant_traits *quant_traits(uint32_t t);

/* Name of type id t, or "unknown" for ids quant_traits() rejects. */
const char *quant_name(uint32_t t);

/* True when the engine can compute with weights of type t. */
bool quant_is_supported(uint32_t t);

/* Bytes of a row of n elements of type t; n must be a multiple of the block
 * size and t known (asserted). */
size_t quant_row_size(enum quant_type t, int64_t n);

/* Type id of a ggml name ("q4_K", "Q4_K", "f16", ...; case-insensitive), or
 * -1 when no known type has that name. */
int32_t quant_type_from_name(const char *name);

/* The 6-bit scale and min of sub-block j (0..7) of a q4_K/q5_K block:
 * sub-blocks 0..3 keep theirs in the low 6 bits of scales[j] and scales[j + 4];
 * 4..7 split theirs into the nibbles of scales[j + 4] and the top 2 bits of
 * scales[j - 4] (scale) and scales[j] (min). Inline: the kernels call it per
 * sub-block. */
static inline void quant_get_scale_min_k4(int j, const uint8_t *restrict q, uint8_t *restrict sc,
                                          uint8_t *restrict m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (uint8_t)((q[j + 4] & 15) | (q[j - 4] >> 6) << 4);
        *m = (uint8_t)((q[j + 4] >> 4) | (q[j] >> 6) << 4);
    }
}

/* IEEE half <-> float, and bfloat16 <-> float (round to nearest even). */
float quant_f16_to_f32(uint16_t h);
uint16_t quant_f32_to_f16(float f);
float quant_bf16_to_f32(uint16_t h);
uint16_t quant_f32_to_bf16(float f);

#endif
