/*
 * model.h - a loaded model: hyper-parameters from the <arch>.* keys and the
 * weight tensors bound into per-layer structs. Private to the engine; the
 * public face is struct engine_model in engine/engine.h.
 *
 * Ownership: the model owns the gguf_file (whose mapping the weights view),
 * the tensor array, the panel (f32/f16/bf16) and q-panel (quantized) copies
 * of the matrices (one anonymous mapping; kern_matmul() reads them instead of
 * the file's rows),
 * the f32 copies of the small 1-D tensors (norms, biases, RoPE factors) and
 * the tokenizer. Immutable after model_load(), except for the adapter id
 * counter (an atomic): any thread may read it.
 */
#ifndef LLMSERVE_MODEL_H
#define LLMSERVE_MODEL_H

#include <stdatomic.h>
#include <stdint.h>

#include "engine/model/arch.h"
#include "engine/engine.h"
#include "engine/format/tensor.h"
#include "engine/model/shard.h"

struct gguf_file;
struct tokenizer;

struct hparams {
    int32_t n_vocab;
    int32_t n_ctx_train;
    int32_t n_embd;
    int32_t n_layer;
    int32_t n_head;
    int32_t n_head_kv;
    int32_t head_dim;        // attention.key_length (= value_length)
    int32_t n_ff;
    int32_t n_rot;           // rope.dimension_count, <= head_dim, even
    float rope_freq_base;
    float rope_scale;        // positions are multiplied by this (1 / linear factor)
    float yarn_factor;       // YaRN context extension factor; 0: no YaRN
    int32_t yarn_orig_ctx;   // YaRN: the context the model was trained at
    float yarn_beta_fast;    // YaRN ramp ends (rotations over the original context)
    float yarn_beta_slow;
    float rope_mscale;       // cos/sin are multiplied by this (YaRN attention factor; else 1)
    float norm_eps;
    int32_t sliding_window;  // 0: full attention
};

struct layer {
    const float *attn_norm;       // [n_embd], f32 copy (owned by the model)
    const struct tensor *wq;      // [n_embd] -> [n_head * head_dim]
    const struct tensor *wk;      // [n_embd] -> [n_head_kv * head_dim]
    const struct tensor *wv;      // [n_embd] -> [n_head_kv * head_dim]
    const struct tensor *wo;      // [n_head * head_dim] -> [n_embd]
    const float *bq;              // [n_head * head_dim] or NULL (qwen2)
    const float *bk;              // [n_head_kv * head_dim] or NULL
    const float *bv;              // [n_head_kv * head_dim] or NULL
    const float *q_norm;          // [head_dim] or NULL (qwen3)
    const float *k_norm;          // [head_dim] or NULL
    const float *ffn_norm;        // [n_embd]
    const struct tensor *ffn_gate;  // [n_embd] -> [n_ff]
    const struct tensor *ffn_up;    // [n_embd] -> [n_ff]
    const struct tensor *ffn_down;  // [n_ff] -> [n_embd]
};

struct engine_model {
    struct gguf_file *gguf;        // owned; the weights are views into its mapping
    const struct arch *arch;       // static table entry
    struct hparams hp;
    int64_t n_tensors;
    struct tensor *tensors;        // [n_tensors], owned
    struct layer *layers;          // [n_layer], owned
    const struct tensor *tok_embd; // [n_embd] x n_vocab rows
    const float *output_norm;      // [n_embd]
    const struct tensor *output;   // classifier; == tok_embd when tied
    float *rope_inv_freq;          // [n_rot / 2], owned: base^(-2i/n_rot) / factor_i * scale
    float *small;                  // owned arena of the f32 1-D tensors
    void *panels;                  // owned mapping of every tensor's panels (tensor.h), or NULL
    size_t panels_bytes;
    struct shard shard;            // this rank's heads and FFN columns (all of them at TP 1)
    struct tokenizer *tok;         // owned; NULL when the file has no tokenizer
    char *chat_template;           // owned copy, or NULL
    char name[128];
    struct engine_model_info info;
    atomic_uint_least64_t *next_adapter_id;  // owned: the id engine_adapter_load() hands out next
                                             //   (lora.h); the one thing that changes after
                                             //   load, so it sits behind a pointer that a
                                             //   const model can still write through
};

/* A new adapter identity for m: 1, 2, 3, ... never repeated while m lives.
 * [any thread] */
uint64_t model_next_adapter_id(const struct engine_model *m);

#endif
