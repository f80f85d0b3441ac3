/*
 * tests/fuzz/fuzz_model.c - libFuzzer target: the model loader
 * (engine_model_load) on an arbitrary file: GGUF parse, architecture and
 * hyper-parameters, tensor binding and shape checks, panel packing, the
 * tokenizer and the chat template copy. Input: the file's bytes (written to
 * the scratch directory, since the loader takes a path). Seeds:
 * tests/fuzz/corpus/model (tiny synthetic models of each architecture).
 */
#include "engine/base/err.h"
#include "engine/engine.h"
#include "tests/fuzz/fuzz_util.h"

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    fuzz_util_quiet_logs();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    struct engine_model_params p = engine_model_default_params();
    p.path = fuzz_util_write("model.gguf", data, size);
    struct engine_model *m = NULL;
    if (engine_model_load(&p, &m) == 0) {
        const struct engine_model_info *info = engine_model_get_info(m);
        (void)info;
        (void)engine_model_chat_template(m);
        (void)engine_model_is_eog(m, 0);
    }
    engine_model_free(m);
    return 0;
}
