/*
 * tests/fuzz/fuzz_safetensors.c - libFuzzer target: the safetensors reader
 * (safetensors_open_memory) on arbitrary bytes, then what the adapter
 * loader does with an accepted file: look each tensor up by name, read
 * __metadata__, convert every tensor to f32. Input: the file's bytes.
 * Seeds: tests/fuzz/corpus/safetensors (PEFT and bottleneck adapters).
 */
#include <stdlib.h>

#include "engine/format/safetensors.h"
#include "tests/fuzz/fuzz_util.h"

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    fuzz_util_quiet_logs();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    struct safetensors_file *f = NULL;
    if (safetensors_open_memory(data, size, "fuzz.safetensors", &f) != 0) return 0;
    (void)safetensors_metadata(f, "format");
    for (int64_t i = 0; i < safetensors_n_tensors(f); i++) {
        const struct safetensors_tensor *t = safetensors_tensor_at(f, i);
        (void)safetensors_find(f, t->name);
        (void)safetensors_dtype_name(t->dtype);
        // n_elements is bounded by the file (checked against nbytes), so
        // this stays small.
        float *dst = malloc((size_t)(t->n_elements ? t->n_elements : 1) * sizeof(float));
        if (dst) safetensors_to_f32(t, dst);
        free(dst);
    }
    safetensors_close(f);
    return 0;
}
