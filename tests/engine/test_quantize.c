/*
 * test_quantize.c - the whole-model quantizer: per-tensor type rules against
 * llama.cpp's documented mixes (docs/quantization.md), the fallbacks for rows
 * that do not split into blocks, and a quantized file that keeps every
 * metadata entry and every tensor's shape, with the data dequantizing close
 * to the source.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>

#include "engine/base/err.h"
#include "engine/format/gguf.h"
#include "engine/format/quant.h"
#include "engine/model/quantize.h"
#include "tests/helpers/testutil.h"

static void test_quantize_ftype_names(void **state) {
    (void)state;
    assert_int_equal(quantize_ftype_from_name("Q4_K_M"), QUANTIZE_FTYPE_Q4_K_M);
    assert_int_equal(quantize_ftype_from_name("q4_k"), QUANTIZE_FTYPE_Q4_K_M);
    assert_int_equal(quantize_ftype_from_name("Q5_K"), QUANTIZE_FTYPE_Q5_K_M);
    assert_int_equal(quantize_ftype_from_name("Q8_0"), QUANTIZE_FTYPE_Q8_0);
    assert_int_equal(quantize_ftype_from_name("f16"), QUANTIZE_FTYPE_F16);
    assert_int_equal(quantize_ftype_from_name("IQ2_XXS"), -1);
    assert_int_equal(quantize_ftype_from_name(""), -1);
}

static void test_quantize_q4_k_m_mix_like_llama_cpp(void **state) {
    (void)state;
    // TinyLlama's shape: 22 layers, 32 heads, 4 KV heads, rows of 2048 / 5632.
    struct quantize_model_shape sh = {.n_layer = 22, .n_head = 32, .n_head_kv = 4,
                                      .n_attn_v = 22, .has_output = 1};
    const enum quantize_ftype f = QUANTIZE_FTYPE_Q4_K_M;
    assert_int_equal(quantize_tensor_type(f, "output.weight", 2048, 0, &sh), QUANT_Q6_K);
    assert_int_equal(quantize_tensor_type(f, "token_embd.weight", 2048, 0, &sh), QUANT_Q4_K);
    assert_int_equal(quantize_tensor_type(f, "blk.5.attn_q.weight", 2048, 0, &sh), QUANT_Q4_K);
    // more bits: i < 22/8 = 2, i >= 7*22/8 = 19, or (i - 2) % 3 == 2
    const int more[22] = {1, 1, 0, 0, 1, 0, 0, 1, 0, 0, 1, 0, 0, 1, 0, 0, 1, 0, 0, 1, 1, 1};
    char name[64];
    for (int i = 0; i < 22; i++) {
        snprintf(name, sizeof(name), "blk.%d.attn_v.weight", i);
        assert_int_equal(quantize_tensor_type(f, name, 2048, i, &sh),
                         more[i] ? QUANT_Q6_K : QUANT_Q4_K);
        snprintf(name, sizeof(name), "blk.%d.ffn_down.weight", i);
        assert_int_equal(quantize_tensor_type(f, name, 5632, 0, &sh),
                         more[i] ? QUANT_Q6_K : QUANT_Q4_K);
    }
    // tied classifier: token_embd plays output
    sh.has_output = 0;
    assert_int_equal(quantize_tensor_type(f, "token_embd.weight", 2048, 0, &sh), QUANT_Q6_K);
    // plain Q4_0 and Q8_0 files
    sh.has_output = 1;
    assert_int_equal(quantize_tensor_type(QUANTIZE_FTYPE_Q4_0, "output.weight", 2048, 0, &sh),
                     QUANT_Q6_K);
    assert_int_equal(quantize_tensor_type(QUANTIZE_FTYPE_Q8_0, "output.weight", 2048, 0, &sh),
                     QUANT_Q8_0);
    assert_int_equal(quantize_tensor_type(QUANTIZE_FTYPE_Q4_0, "blk.0.ffn_down.weight", 5632, 0,
                                          &sh), QUANT_Q4_0);
    assert_int_equal(quantize_tensor_type(QUANTIZE_FTYPE_Q3_K_M, "blk.0.attn_output.weight",
                                          2048, 0, &sh), QUANT_Q4_K);
    assert_int_equal(quantize_tensor_type(QUANTIZE_FTYPE_F16, "output.weight", 2048, 0, &sh),
                     QUANT_F16);
}

static void test_quantize_fallbacks_for_short_rows(void **state) {
    (void)state;
    // stories260K: dim 64, ffn 172
    struct quantize_model_shape sh = {.n_layer = 5, .n_head = 8, .n_head_kv = 4, .n_attn_v = 5,
                                      .has_output = 0};
    const enum quantize_ftype f = QUANTIZE_FTYPE_Q4_K_M;
    assert_int_equal(quantize_tensor_type(f, "blk.1.attn_q.weight", 64, 0, &sh), QUANT_Q5_0);
    assert_int_equal(quantize_tensor_type(f, "blk.1.ffn_down.weight", 172, 0, &sh), QUANT_F16);
    assert_int_equal(quantize_tensor_type(f, "token_embd.weight", 64, 0, &sh), QUANT_Q8_0);
    assert_int_equal(quantize_tensor_type(QUANTIZE_FTYPE_Q5_K_S, "blk.1.attn_q.weight", 64, 0,
                                          &sh), QUANT_Q5_1);
    assert_int_equal(quantize_tensor_type(QUANTIZE_FTYPE_Q6_K, "blk.1.attn_q.weight", 64, 0, &sh),
                     QUANT_Q8_0);
    assert_int_equal(quantize_tensor_type(QUANTIZE_FTYPE_Q2_K, "blk.1.attn_q.weight", 64, 0, &sh),
                     QUANT_Q4_0);
    assert_int_equal(quantize_tensor_type(QUANTIZE_FTYPE_Q8_0, "blk.1.ffn_down.weight", 172, 0,
                                          &sh), QUANT_F16);
}

static void test_quantize_model_keeps_metadata_and_shapes(void **state) {
    (void)state;
    const char *src = testutil_path(testutil_build_dir(), "tests/models/llama256-f32.gguf");
    char dst[] = "/tmp/llmserve-test-quantize-XXXXXX";
    int fd = mkstemp(dst);
    assert_true(fd >= 0);
    close(fd);
    struct quantize_params p = {.in_path = src, .out_path = dst,
                                .ftype = QUANTIZE_FTYPE_Q4_K_M, .n_threads = 2};
    assert_int_equal(quantize_model(&p), 0);
    struct gguf_file *a = NULL, *b = NULL;
    assert_int_equal(gguf_open(src, &a), 0);
    assert_int_equal(gguf_open(dst, &b), 0);
    // every entry of the source, in order, with general.file_type set
    int64_t j = 0;
    for (int64_t i = 0; i < gguf_n_kv(a); i++) {
        const struct gguf_kv *ka = gguf_kv_at(a, i);
        const struct gguf_kv *kb = gguf_kv_at(b, j++);
        assert_int_equal(ka->key.len, kb->key.len);
        assert_memory_equal(ka->key.data, kb->key.data, ka->key.len);
        assert_int_equal(ka->type, kb->type);
        if (ka->type == GGUF_TYPE_ARRAY) assert_int_equal(ka->arr_n, kb->arr_n);
    }
    uint32_t ft = 0;
    assert_int_equal(gguf_get_u32(b, "general.file_type", &ft), 0);
    assert_int_equal(ft, QUANTIZE_FTYPE_Q4_K_M);
    assert_int_equal(gguf_n_tensors(a), gguf_n_tensors(b));
    for (int64_t i = 0; i < gguf_n_tensors(a); i++) {
        const struct gguf_tensor_info *ta = gguf_tensor_at(a, i);
        const struct gguf_tensor_info *tb = gguf_tensor_at(b, i);
        assert_memory_equal(ta->ne, tb->ne, sizeof(ta->ne));
        const struct quant_traits *tr = quant_traits(tb->type);
        assert_non_null(tr->to_f32);
        const int64_t n = ta->ne[0] * ta->ne[1];
        float *x = malloc((size_t)n * sizeof(float));
        tr->to_f32(tb->data, x, n);
        double se = 0, s2 = 0;
        const float *want = ta->data;
        for (int64_t e = 0; e < n; e++) {
            se += ((double)x[e] - want[e]) * ((double)x[e] - want[e]);
            s2 += (double)want[e] * want[e];
        }
        assert_true(sqrt(se / s2) < 0.1);  // q4_K bound 0.087 on Gaussian rows
        free(x);
    }
    gguf_close(a);
    gguf_close(b);
    unlink(dst);
}

static void test_quantize_refuses_quantized_input(void **state) {
    (void)state;
    const char *src = testutil_path(testutil_build_dir(), "tests/models/llama-q8_0.gguf");
    struct quantize_params p = {.in_path = src, .out_path = "/tmp/llmserve-test-quantize-never",
                                .ftype = QUANTIZE_FTYPE_Q4_0, .n_threads = 1};
    assert_int_equal(quantize_model(&p), ERR_UNSUPPORTED);
    assert_false(testutil_exists("/tmp/llmserve-test-quantize-never"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_quantize_ftype_names),
        cmocka_unit_test(test_quantize_q4_k_m_mix_like_llama_cpp),
        cmocka_unit_test(test_quantize_fallbacks_for_short_rows),
        cmocka_unit_test(test_quantize_model_keeps_metadata_and_shapes),
        cmocka_unit_test(test_quantize_refuses_quantized_input),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
