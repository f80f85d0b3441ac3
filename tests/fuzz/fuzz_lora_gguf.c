/*
 * tests/fuzz/fuzz_lora_gguf.c - libFuzzer target: GGUF LoRA files
 * (general.type = adapter, adapter.type = lora) through engine_adapter_load()
 * on the base model of fuzz_adapter.h: keys, tensor names and shapes against
 * the model, conversion to f32. Input: the file's bytes. Seeds:
 * tests/fuzz/corpus/lora_gguf.
 */
#include "tests/fuzz/fuzz_adapter.h"
#include "tests/fuzz/fuzz_util.h"

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    fuzz_util_quiet_logs();
    (void)fuzz_adapter_base();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_adapter_load(fuzz_util_write("lora.gguf", data, size));
    return 0;
}
