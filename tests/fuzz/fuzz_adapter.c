/*
 * tests/fuzz/fuzz_adapter.c - the base model of the adapter fuzz targets
 * (fuzz_adapter.h).
 */
#include "tests/fuzz/fuzz_adapter.h"

#include <stdio.h>
#include <stdlib.h>

#include "engine/base/err.h"
#include "engine/engine.h"
#include "tests/fuzz/fuzz_util.h"

static struct engine_model *base;

static void free_base(void) {
    engine_model_free(base);
    base = NULL;
}

const struct engine_model *fuzz_adapter_base(void) {
    if (base) return base;
    struct engine_model_params p = engine_model_default_params();
    p.path = fuzz_util_data_path("base.gguf");
    int err = engine_model_load(&p, &base);
    if (err) {
        fprintf(stderr, "fuzz_adapter: cannot load %s: %s (run tests/fuzz/mkseeds)\n", p.path,
                err_str(err));
        abort();
    }
    atexit(free_base);
    return base;
}

void fuzz_adapter_load(const char *path) {
    struct engine_adapter *a = NULL;
    if (engine_adapter_load(fuzz_adapter_base(), path, &a) != 0) return;
    const struct engine_adapter_info *info = engine_adapter_get_info(a);
    if (info->id < 1 || info->n_targets < 0) abort();  // lora.h's promises
    engine_adapter_release(a);
}
