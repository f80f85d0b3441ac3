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

/* Converts n elements of one row (n a multiple of the block size). */
typedef void (*quant_to_f32_fn)(const void *restrict src, float *restrict dst, int64_t n);

struct quant_traits {
    const char *name;          // "f32", "q4_K", ... (ggml's spelling); NULL: unknown id
    int32_t block_size;        // elements per block
    size_t type_size;          // bytes per block
    quant_to_f32_fn to_f32;    // NULL: the engine cannot compute with this type yet
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

/* IEEE half <-> float, and bfloat16 <-> float (round to nearest even). */
float quant_f16_to_f32(uint16_t h);
uint16_t quant_f32_to_f16(float f);
float quant_bf16_to_f32(uint16_t h);
uint16_t quant_f32_to_bf16(float f);

#endif
