/*
 * quantize.h - the whole-model quantizer behind `llmserve quantize`: reads a
 * GGUF whose matrices are f32/f16/bf16 and writes a GGUF with the same
 * metadata (tokenizer included, in the same order; general.file_type and
 * general.quantization_version set) and every 2-D weight converted to the
 * type the chosen file type gives it.
 *
 * File types follow llama.cpp's llama_ftype and its per-tensor rules
 * (docs/quantization.md): plain types (Q4_0, Q8_0, Q4_K, ...) give most
 * matrices that type and the classifier Q6_K; mixes (Q4_K_M, Q5_K_S, ...)
 * spend more bits on attn_v and ffn_down in chosen layers. A matrix whose row
 * length is not a multiple of the type's block size falls back (Q4_K -> Q5_0,
 * Q5_K -> Q5_1, Q6_K -> Q8_0, Q2_K/Q3_K -> Q4_0, then F16), as llama.cpp does.
 * 1-D tensors (norms, biases) are copied unchanged.
 * Threads: one caller; the quantizer uses its own worker pool.
 */
#ifndef LLMSERVE_QUANTIZE_H
#define LLMSERVE_QUANTIZE_H

#include <stdbool.h>
#include <stdint.h>

#include "engine/format/quant.h"

/* llama.cpp's llama_ftype values, as written to general.file_type. */
enum quantize_ftype {
    QUANTIZE_FTYPE_F32 = 0,
    QUANTIZE_FTYPE_F16 = 1,
    QUANTIZE_FTYPE_Q4_0 = 2,
    QUANTIZE_FTYPE_Q4_1 = 3,
    QUANTIZE_FTYPE_Q8_0 = 7,
    QUANTIZE_FTYPE_Q5_0 = 8,
    QUANTIZE_FTYPE_Q5_1 = 9,
    QUANTIZE_FTYPE_Q2_K = 10,
    QUANTIZE_FTYPE_Q3_K_S = 11,
    QUANTIZE_FTYPE_Q3_K_M = 12,
    QUANTIZE_FTYPE_Q3_K_L = 13,
    QUANTIZE_FTYPE_Q4_K_S = 14,
    QUANTIZE_FTYPE_Q4_K_M = 15,
    QUANTIZE_FTYPE_Q5_K_S = 16,
    QUANTIZE_FTYPE_Q5_K_M = 17,
    QUANTIZE_FTYPE_Q6_K = 18,
    QUANTIZE_FTYPE_BF16 = 32,
};

/* The file type named s ("Q4_K_M", "q8_0", "F16"; "Q4_K" = Q4_K_M,
 * "Q5_K" = Q5_K_M, "Q3_K" = Q3_K_M as in llama-quantize), or -1. */
int32_t quantize_ftype_from_name(const char *s);

/* Comma-separated list of the names quantize_ftype_from_name() accepts. */
const char *quantize_ftype_names(void);

/* What the mix rules need to know of a model. */
struct quantize_model_shape {
    int32_t n_layer;       // blocks (blk.0 .. blk.n_layer-1)
    int32_t n_head;
    int32_t n_head_kv;
    int32_t n_attn_v;      // number of blk.N.attn_v.weight tensors
    int32_t has_output;    // 1 when output.weight exists (else token_embd is the classifier)
};

/* The type tensor `name` (row length ne0, i_attn_v-th attn_v in file order
 * when it is one) gets under ftype, fallbacks applied. For 1-D tensors the
 * caller keeps the input type. */
enum quant_type quantize_tensor_type(enum quantize_ftype ftype, const char *name, int64_t ne0,
                                     int32_t i_attn_v, const struct quantize_model_shape *shape);

struct quantize_params {
    const char *in_path;
    const char *out_path;
    enum quantize_ftype ftype;
    int32_t n_threads;     // worker threads for the conversion (>= 1)
    bool show_progress;    // show progress over the input bytes on the log fd
                           // (engine/base/progress.h)
};

/* Quantizes in_path into out_path. Returns 0, or ERR_IO / ERR_FORMAT /
 * ERR_UNSUPPORTED (a matrix of a type we cannot read, e.g. already
 * quantized) / ERR_NOMEM, logged once with the file and tensor named. Prints
 * one INFO line per tensor (name, shape, types). */
int quantize_model(const struct quantize_params *p);

#endif
