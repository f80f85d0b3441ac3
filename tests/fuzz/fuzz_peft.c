/*
 * tests/fuzz/fuzz_peft.c - libFuzzer target: adapter directories (PEFT LoRA
 * and bottleneck) through engine_adapter_load() on the base model of
 * fuzz_adapter.h: adapter_config.json parsing (r, lora_alpha,
 * target_modules, rank/alpha patterns, adapter_type, ...) and the
 * safetensors tensors' names and shapes checked against the model.
 * Input: adapter_config.json, the line "--safetensors--", then
 * adapter_model.safetensors (no separator: the config alone, no tensors
 * file). Seeds: tests/fuzz/corpus/peft.
 */
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tests/fuzz/fuzz_adapter.h"
#include "tests/fuzz/fuzz_util.h"

static const char split[] = "\n--safetensors--\n";

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    fuzz_util_quiet_logs();
    (void)fuzz_adapter_base();
    char dir[600];
    snprintf(dir, sizeof(dir), "%s/peft", fuzz_util_scratch_dir());
    mkdir(dir, 0700);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const uint8_t *cut = memmem(data, size, split, sizeof(split) - 1);
    size_t n_cfg = cut ? (size_t)(cut - data) : size;
    fuzz_util_write("peft/adapter_config.json", data, n_cfg);
    char st[600];
    snprintf(st, sizeof(st), "%s/peft/adapter_model.safetensors", fuzz_util_scratch_dir());
    if (cut) {
        const uint8_t *tensors = cut + sizeof(split) - 1;
        fuzz_util_write("peft/adapter_model.safetensors", tensors,
                        size - (size_t)(tensors - data));
    } else {
        unlink(st);
    }
    char dir[600];
    snprintf(dir, sizeof(dir), "%s/peft", fuzz_util_scratch_dir());
    fuzz_adapter_load(dir);
    return 0;
}
