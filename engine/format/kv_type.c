/*
 * kv_type.c - the names of the KV storage types.
 */
#include "engine/format/kv_type.h"

#include <string.h>

#include "engine/base/err.h"

static const char *const kv_type_names[ENGINE_KV_TYPE_COUNT] = {
    [ENGINE_KV_TYPE_F32] = "f32",
    [ENGINE_KV_TYPE_F16] = "f16",
    [ENGINE_KV_TYPE_Q8_0] = "q8_0",
};

const char *engine_kv_type_name(enum engine_kv_type t) {
    return t >= 0 && t < ENGINE_KV_TYPE_COUNT ? kv_type_names[t] : "?";
}

int engine_kv_type_parse(const char *name, enum engine_kv_type *out) {
    for (int i = 0; i < ENGINE_KV_TYPE_COUNT; i++) {
        if (name && strcmp(name, kv_type_names[i]) == 0) {
            *out = (enum engine_kv_type)i;
            return 0;
        }
    }
    return ERR_INVAL;
}
