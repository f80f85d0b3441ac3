/*
 * arch.c - the table of supported architectures.
 *
 * Mistral, TinyLlama, SmolLM, Llama 2 and 3 all ship as "llama" in GGUF. The
 * RoPE layouts follow llama.cpp's choice per architecture: llama's converter
 * permutes the Q/K rows so that adjacent pairs rotate; Qwen keeps the Hugging
 * Face halves layout (NeoX).
 */
#include "engine/model/arch.h"

#include <string.h>

static const struct arch arch_table[] = {
    {.name = "llama", .rope = ARCH_ROPE_NORMAL, .has_qkv_bias = false, .has_qk_norm = false},
    {.name = "qwen2", .rope = ARCH_ROPE_NEOX, .has_qkv_bias = true, .has_qk_norm = false},
    {.name = "qwen3", .rope = ARCH_ROPE_NEOX, .has_qkv_bias = false, .has_qk_norm = true},
};

const struct arch *arch_find(const char *name) {
    for (size_t i = 0; i < sizeof(arch_table) / sizeof(arch_table[0]); i++) {
        if (strcmp(arch_table[i].name, name) == 0) return &arch_table[i];
    }
    return NULL;
}

const char *arch_names(void) { return "llama, qwen2, qwen3"; }
