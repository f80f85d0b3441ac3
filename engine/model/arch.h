/*
 * arch.h - what differs between the supported architectures: metadata key
 * prefix, RoPE layout, and which optional tensors a block has. Adding an
 * architecture of the Llama family is a row in arch.c's table.
 */
#ifndef LLMSERVE_ARCH_H
#define LLMSERVE_ARCH_H

#include <stdbool.h>

enum arch_rope {
    ARCH_ROPE_NORMAL,  // GGUF llama layout: rotate adjacent pairs (2i, 2i+1)
    ARCH_ROPE_NEOX,    // NeoX layout: rotate (i, i + n_rot/2)
};

struct arch {
    const char *name;      // general.architecture and the key prefix
    enum arch_rope rope;
    bool has_qkv_bias;     // attn_q/k/v.bias (qwen2)
    bool has_qk_norm;      // attn_q_norm / attn_k_norm per head before RoPE (qwen3)
};

/* The architecture called name, or NULL when it is not supported. */
const struct arch *arch_find(const char *name);

/* Comma-separated names of the supported architectures, for messages. */
const char *arch_names(void);

#endif
