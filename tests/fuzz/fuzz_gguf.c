/*
 * tests/fuzz/fuzz_gguf.c - libFuzzer target: the GGUF reader on arbitrary
 * bytes (gguf_open_memory), then every query a loader makes of what it
 * accepted: each key through the typed getters, numeric array elements,
 * each tensor's data (first and last byte, so ASan sees a view that leaves
 * the buffer), the tokenizer loader and chat_detect() on the template.
 * Input: the file's bytes. Seeds: tests/fuzz/corpus/gguf.
 */
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "engine/base/err.h"
#include "engine/text/chat.h"
#include "engine/format/gguf.h"
#include "engine/text/tokenizer.h"
#include "tests/fuzz/fuzz_util.h"

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    fuzz_util_quiet_logs();
    return 0;
}

static volatile uint8_t sink;  // keeps the reads of tensor bytes

static void query_kv(const struct gguf_file *f, const struct gguf_kv *kv) {
    char key[256];
    gguf_str_copy(kv->key, key, sizeof(key));
    uint32_t u32;
    int64_t i64;
    float f32;
    bool b;
    struct gguf_str s;
    (void)gguf_get_u32(f, key, &u32);
    (void)gguf_get_i64(f, key, &i64);
    (void)gguf_get_f32(f, key, &f32);
    (void)gguf_get_bool(f, key, &b);
    if (gguf_get_str(f, key, &s) == 0 && s.len) sink ^= (uint8_t)(s.data[0] ^ s.data[s.len - 1]);
    (void)gguf_find(f, key);
    const struct gguf_kv *arr;
    if (gguf_get_arr(f, key, GGUF_TYPE_FLOAT32, &arr) == 0 && arr->arr_n) {
        // Its bits: converting a float out of uint8_t's range is undefined.
        const float v = gguf_arr_f32(arr, arr->arr_n - 1);
        uint32_t bits;
        memcpy(&bits, &v, sizeof(bits));
        sink ^= (uint8_t)bits;
    }
    if (gguf_get_arr(f, key, GGUF_TYPE_INT32, &arr) == 0 && arr->arr_n) {
        sink ^= (uint8_t)gguf_arr_i32(arr, arr->arr_n - 1);
    }
    if (gguf_get_arr(f, key, GGUF_TYPE_UINT32, &arr) == 0 && arr->arr_n) {
        sink ^= (uint8_t)gguf_arr_u32(arr, arr->arr_n - 1);
    }
    if (gguf_get_arr(f, key, GGUF_TYPE_STRING, &arr) == 0 && arr->arr_n) {
        const struct gguf_str *last = &arr->strs[arr->arr_n - 1];
        if (last->len) sink ^= (uint8_t)last->data[last->len - 1];
    }
    (void)gguf_type_name(kv->type);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    struct gguf_file *f = NULL;
    if (gguf_open_memory(data, size, "fuzz.gguf", &f) != 0) return 0;
    (void)gguf_version(f);
    (void)gguf_alignment(f);
    for (int64_t i = 0; i < gguf_n_kv(f); i++) query_kv(f, gguf_kv_at(f, i));
    for (int64_t i = 0; i < gguf_n_tensors(f); i++) {
        const struct gguf_tensor_info *t = gguf_tensor_at(f, i);
        char name[256];
        gguf_str_copy(t->name, name, sizeof(name));
        (void)gguf_find_tensor(f, name);
        if (t->nbytes) {
            const uint8_t *p = t->data;
            sink ^= (uint8_t)(p[0] ^ p[t->nbytes - 1]);
        }
    }
    struct gguf_str tmpl;
    if (gguf_get_str(f, "tokenizer.chat_template", &tmpl) == 0) {
        enum chat_family fam;
        (void)chat_detect(tmpl.data, (size_t)tmpl.len, &fam);
    }
    if (gguf_find(f, "tokenizer.ggml.model")) {
        struct tokenizer *tok = NULL;
        if (tokenizer_load(f, &tok) == 0) {
            static const char text[] = "Hello <s> world 日本";
            int32_t *ids = NULL;
            int32_t n = 0;
            if (tokenizer_encode(tok, text, sizeof(text) - 1, true, true, &ids, &n) == 0) {
                struct buf out = {0};
                tokenizer_decode(tok, ids, n, false, &out);
                buf_free(&out);
            }
            free(ids);
        }
        tokenizer_free(tok);
    }
    gguf_close(f);
    return 0;
}
