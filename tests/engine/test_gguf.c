/*
 * test_gguf.c - the GGUF reader on well-formed files: every value type through
 * the typed getters, arrays, versions, alignments, tensor views and sizes, a
 * file on disk, and the real files in ../shared/models.
 *
 * The in-memory files come from tests/helpers/gguf_builder.c; the expected
 * tensor sizes are written from the ggml block layouts (GGUF spec), not taken
 * from engine/quant.c. Malformed files are in test_gguf_corrupt.c.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/base/err.h"
#include "engine/format/gguf.h"
#include "tests/helpers/gguf_builder.h"
#include "tests/helpers/testutil.h"

/* Finishes b, opens the bytes and expects success. The bytes stay alive in
 * *out_bytes (free after gguf_close). */
static struct gguf_file *open_built(const struct gguf_builder *b, uint8_t **out_bytes,
                                    size_t *out_size) {
    size_t size = 0;
    uint8_t *bytes = gguf_builder_finish(b, &size);
    struct gguf_file *f = NULL;
    assert_int_equal(gguf_open_memory(bytes, size, "built", &f), 0);
    assert_non_null(f);
    *out_bytes = bytes;
    if (out_size) *out_size = size;
    return f;
}

/* Expects gguf_open_memory on b's bytes to fail with want. */
static void expect_open_fails(const struct gguf_builder *b, int want) {
    size_t size = 0;
    uint8_t *bytes = gguf_builder_finish(b, &size);
    struct gguf_file *f = (struct gguf_file *)1;
    assert_int_equal(gguf_open_memory(bytes, size, "built", &f), want);
    assert_null(f);
    free(bytes);
}

/* ---- scalars ---------------------------------------------------------- */

static void add_all_scalars(struct gguf_builder *b) {
    gguf_builder_kv_u8(b, "t.u8", 200);
    gguf_builder_kv_i8(b, "t.i8", -5);
    gguf_builder_kv_u16(b, "t.u16", 60000);
    gguf_builder_kv_i16(b, "t.i16", -30000);
    gguf_builder_kv_u32(b, "t.u32", 4000000000u);
    gguf_builder_kv_i32(b, "t.i32", -2000000000);
    gguf_builder_kv_f32(b, "t.f32", 1.5f);
    gguf_builder_kv_bool(b, "t.bool", true);
    gguf_builder_kv_str(b, "t.str", "hello, gguf");
    gguf_builder_kv_u64(b, "t.u64", (uint64_t)1 << 40);
    gguf_builder_kv_i64(b, "t.i64", -((int64_t)1 << 40));
    gguf_builder_kv_f64(b, "t.f64", 3.25);
}

static void test_gguf_kv_at_sees_every_scalar_type_in_order(void **state) {
    (void)state;
    struct gguf_builder *b = gguf_builder_create(3);
    add_all_scalars(b);
    uint8_t *bytes;
    struct gguf_file *f = open_built(b, &bytes, NULL);
    assert_int_equal(gguf_n_kv(f), 12);
    assert_int_equal(gguf_n_tensors(f), 0);
    static const struct {
        const char *key;
        enum gguf_type type;
    } want[] = {
        {"t.u8", GGUF_TYPE_UINT8},     {"t.i8", GGUF_TYPE_INT8},     {"t.u16", GGUF_TYPE_UINT16},
        {"t.i16", GGUF_TYPE_INT16},    {"t.u32", GGUF_TYPE_UINT32},  {"t.i32", GGUF_TYPE_INT32},
        {"t.f32", GGUF_TYPE_FLOAT32},  {"t.bool", GGUF_TYPE_BOOL},   {"t.str", GGUF_TYPE_STRING},
        {"t.u64", GGUF_TYPE_UINT64},   {"t.i64", GGUF_TYPE_INT64},   {"t.f64", GGUF_TYPE_FLOAT64},
    };
    for (int64_t i = 0; i < 12; i++) {
        const struct gguf_kv *kv = gguf_kv_at(f, i);
        assert_true(gguf_str_eq(kv->key, want[i].key));
        assert_int_equal(kv->type, want[i].type);
        assert_ptr_equal(gguf_find(f, want[i].key), kv);
    }
    // The raw views hold the little-endian values.
    int16_t i16;
    memcpy(&i16, gguf_kv_at(f, 3)->data, 2);
    assert_int_equal(i16, -30000);
    double f64;
    memcpy(&f64, gguf_kv_at(f, 11)->data, 8);
    assert_true(f64 == 3.25);
    assert_int_equal(gguf_kv_at(f, 0)->data[0], 200);
    assert_null(gguf_find(f, "t.u"));
    assert_null(gguf_find(f, "t.u8x"));
    gguf_close(f);
    free(bytes);
    gguf_builder_destroy(b);
}

static void test_gguf_typed_getters_round_trip(void **state) {
    (void)state;
    struct gguf_builder *b = gguf_builder_create(3);
    add_all_scalars(b);
    uint8_t *bytes;
    struct gguf_file *f = open_built(b, &bytes, NULL);

    uint32_t u32 = 0;
    assert_int_equal(gguf_get_u32(f, "t.u8", &u32), 0);
    assert_int_equal(u32, 200);
    assert_int_equal(gguf_get_u32(f, "t.u16", &u32), 0);
    assert_int_equal(u32, 60000);
    assert_int_equal(gguf_get_u32(f, "t.u32", &u32), 0);
    assert_int_equal(u32, 4000000000u);

    int64_t i64 = 0;
    assert_int_equal(gguf_get_i64(f, "t.i8", &i64), 0);
    assert_int_equal(i64, -5);
    assert_int_equal(gguf_get_i64(f, "t.i16", &i64), 0);
    assert_int_equal(i64, -30000);
    assert_int_equal(gguf_get_i64(f, "t.i32", &i64), 0);
    assert_int_equal(i64, -2000000000);
    assert_int_equal(gguf_get_i64(f, "t.i64", &i64), 0);
    assert_true(i64 == -((int64_t)1 << 40));
    assert_int_equal(gguf_get_i64(f, "t.u64", &i64), 0);
    assert_true(i64 == (int64_t)1 << 40);
    assert_int_equal(gguf_get_i64(f, "t.u32", &i64), 0);
    assert_true(i64 == 4000000000);

    float f32 = 0;
    assert_int_equal(gguf_get_f32(f, "t.f32", &f32), 0);
    assert_true(f32 == 1.5f);
    assert_int_equal(gguf_get_f32(f, "t.f64", &f32), 0);  // FLOAT64 accepted
    assert_true(f32 == 3.25f);

    bool bv = false;
    assert_int_equal(gguf_get_bool(f, "t.bool", &bv), 0);
    assert_true(bv);

    struct gguf_str s = {0};
    assert_int_equal(gguf_get_str(f, "t.str", &s), 0);
    assert_int_equal(s.len, 11);
    assert_memory_equal(s.data, "hello, gguf", 11);
    assert_true(gguf_str_eq(s, "hello, gguf"));
    assert_false(gguf_str_eq(s, "hello, ggu"));
    assert_false(gguf_str_eq(s, "hello, gguf!"));
    char small[6];
    assert_string_equal(gguf_str_copy(s, small, sizeof(small)), "hello");
    char big[64];
    assert_string_equal(gguf_str_copy(s, big, sizeof(big)), "hello, gguf");
    char one[1];
    assert_string_equal(gguf_str_copy(s, one, 1), "");

    gguf_close(f);
    free(bytes);
    gguf_builder_destroy(b);
}

static void test_gguf_integer_getters_check_range_across_types(void **state) {
    (void)state;
    struct gguf_builder *b = gguf_builder_create(3);
    gguf_builder_kv_i8(b, "i8.pos", 100);
    gguf_builder_kv_i8(b, "i8.neg", -1);
    gguf_builder_kv_i16(b, "i16.neg", -1);
    gguf_builder_kv_i32(b, "i32.pos", 2147483647);
    gguf_builder_kv_i32(b, "i32.neg", -7);
    gguf_builder_kv_i64(b, "i64.small", 42);
    gguf_builder_kv_i64(b, "i64.u32max", 4294967295);
    gguf_builder_kv_i64(b, "i64.big", 4294967296);
    gguf_builder_kv_i64(b, "i64.min", INT64_MIN);
    gguf_builder_kv_i64(b, "i64.max", INT64_MAX);
    gguf_builder_kv_u64(b, "u64.small", 7);
    gguf_builder_kv_u64(b, "u64.big", 4294967296u);
    gguf_builder_kv_u64(b, "u64.i64max", (uint64_t)INT64_MAX);
    gguf_builder_kv_u64(b, "u64.i64max1", (uint64_t)INT64_MAX + 1);
    gguf_builder_kv_u64(b, "u64.max", UINT64_MAX);
    uint8_t *bytes;
    struct gguf_file *f = open_built(b, &bytes, NULL);

    uint32_t u = 0;
    assert_int_equal(gguf_get_u32(f, "i8.pos", &u), 0);
    assert_int_equal(u, 100);
    assert_int_equal(gguf_get_u32(f, "i32.pos", &u), 0);
    assert_int_equal(u, 2147483647);
    assert_int_equal(gguf_get_u32(f, "i64.small", &u), 0);
    assert_int_equal(u, 42);
    assert_int_equal(gguf_get_u32(f, "i64.u32max", &u), 0);
    assert_int_equal(u, 4294967295u);
    assert_int_equal(gguf_get_u32(f, "u64.small", &u), 0);
    assert_int_equal(u, 7);
    const char *no_u32[] = {"i8.neg", "i16.neg", "i32.neg", "i64.big", "i64.min",
                            "i64.max", "u64.big", "u64.max"};
    for (size_t i = 0; i < sizeof(no_u32) / sizeof(no_u32[0]); i++) {
        assert_int_equal(gguf_get_u32(f, no_u32[i], &u), ERR_FORMAT);
    }

    int64_t v = 0;
    assert_int_equal(gguf_get_i64(f, "i8.neg", &v), 0);
    assert_int_equal(v, -1);
    assert_int_equal(gguf_get_i64(f, "i64.min", &v), 0);
    assert_true(v == INT64_MIN);
    assert_int_equal(gguf_get_i64(f, "i64.max", &v), 0);
    assert_true(v == INT64_MAX);
    assert_int_equal(gguf_get_i64(f, "u64.i64max", &v), 0);
    assert_true(v == INT64_MAX);
    assert_int_equal(gguf_get_i64(f, "u64.i64max1", &v), ERR_FORMAT);
    assert_int_equal(gguf_get_i64(f, "u64.max", &v), ERR_FORMAT);

    gguf_close(f);
    free(bytes);
    gguf_builder_destroy(b);
}

static void test_gguf_wrong_type_is_format_and_absent_is_notfound(void **state) {
    (void)state;
    struct gguf_builder *b = gguf_builder_create(3);
    add_all_scalars(b);
    const uint32_t arr[] = {1, 2, 3};
    gguf_builder_kv_arr(b, "t.arr", GGUF_TYPE_UINT32, 3, arr);
    uint8_t *bytes;
    struct gguf_file *f = open_built(b, &bytes, NULL);

    uint32_t u = 0;
    int64_t v = 0;
    float x = 0;
    bool bv = false;
    struct gguf_str s = {0};
    const struct gguf_kv *kv = NULL;
    const char *not_int[] = {"t.f32", "t.f64", "t.bool", "t.str", "t.arr"};
    for (size_t i = 0; i < 5; i++) {
        assert_int_equal(gguf_get_u32(f, not_int[i], &u), ERR_FORMAT);
        assert_int_equal(gguf_get_i64(f, not_int[i], &v), ERR_FORMAT);
    }
    const char *not_float[] = {"t.u8", "t.i32", "t.u64", "t.bool", "t.str", "t.arr"};
    for (size_t i = 0; i < 6; i++) assert_int_equal(gguf_get_f32(f, not_float[i], &x), ERR_FORMAT);
    const char *not_bool[] = {"t.u8", "t.i8", "t.f32", "t.str", "t.arr"};
    for (size_t i = 0; i < 5; i++) assert_int_equal(gguf_get_bool(f, not_bool[i], &bv), ERR_FORMAT);
    const char *not_str[] = {"t.u8", "t.u64", "t.f64", "t.bool", "t.arr"};
    for (size_t i = 0; i < 5; i++) assert_int_equal(gguf_get_str(f, not_str[i], &s), ERR_FORMAT);
    assert_int_equal(gguf_get_arr(f, "t.u32", GGUF_TYPE_UINT32, &kv), ERR_FORMAT);
    assert_int_equal(gguf_get_arr(f, "t.str", GGUF_TYPE_STRING, &kv), ERR_FORMAT);
    assert_int_equal(gguf_get_arr(f, "t.arr", GGUF_TYPE_INT32, &kv), ERR_FORMAT);
    assert_null(kv);

    // Absent keys leave *out as preset, so callers can preset a default.
    u = 77;
    v = -77;
    x = 7.5f;
    bv = true;
    s.data = "preset";
    s.len = 6;
    kv = (const struct gguf_kv *)&s;
    assert_int_equal(gguf_get_u32(f, "absent", &u), ERR_NOTFOUND);
    assert_int_equal(gguf_get_i64(f, "absent", &v), ERR_NOTFOUND);
    assert_int_equal(gguf_get_f32(f, "absent", &x), ERR_NOTFOUND);
    assert_int_equal(gguf_get_bool(f, "absent", &bv), ERR_NOTFOUND);
    assert_int_equal(gguf_get_str(f, "absent", &s), ERR_NOTFOUND);
    assert_int_equal(gguf_get_arr(f, "absent", GGUF_TYPE_UINT32, &kv), ERR_NOTFOUND);
    assert_int_equal(gguf_get_u32(f, "", &u), ERR_NOTFOUND);
    assert_int_equal(u, 77);
    assert_true(v == -77);
    assert_true(x == 7.5f);
    assert_true(bv);
    assert_true(gguf_str_eq(s, "preset"));
    assert_ptr_equal(kv, (const struct gguf_kv *)&s);

    gguf_close(f);
    free(bytes);
    gguf_builder_destroy(b);
}

static void test_gguf_get_f32_rejects_doubles_beyond_float(void **state) {
    (void)state;
    struct gguf_builder *b = gguf_builder_create(3);
    gguf_builder_kv_f64(b, "huge", 1e300);
    gguf_builder_kv_f64(b, "tiny", -1e300);
    gguf_builder_kv_f64(b, "inf", INFINITY);
    gguf_builder_kv_f64(b, "max", (double)FLT_MAX);
    gguf_builder_kv_f64(b, "eps", 1e-6);
    uint8_t *bytes;
    struct gguf_file *f = open_built(b, &bytes, NULL);
    float x = 0;
    assert_int_equal(gguf_get_f32(f, "huge", &x), ERR_FORMAT);
    assert_int_equal(gguf_get_f32(f, "tiny", &x), ERR_FORMAT);
    assert_int_equal(gguf_get_f32(f, "inf", &x), 0);
    assert_true(isinf(x) && x > 0);
    assert_int_equal(gguf_get_f32(f, "max", &x), 0);
    assert_true(x == FLT_MAX);
    assert_int_equal(gguf_get_f32(f, "eps", &x), 0);
    assert_true(x == 1e-6f);
    gguf_close(f);
    free(bytes);
    gguf_builder_destroy(b);
}

/* ---- arrays ----------------------------------------------------------- */

static void test_gguf_scalar_arrays_of_every_type(void **state) {
    (void)state;
    const uint8_t a_u8[] = {0, 1, 255};
    const int8_t a_i8[] = {-128, 0, 127};
    const uint16_t a_u16[] = {0, 65535};
    const int16_t a_i16[] = {-32768, 32767, -1};
    const uint32_t a_u32[] = {0, 1, 4294967295u, 123456789};
    const int32_t a_i32[] = {INT32_MIN, -1, 0, INT32_MAX};
    const float a_f32[] = {0.0f, -1.25f, 3.0e38f, 1.0e-45f};
    const uint8_t a_bool[] = {1, 0, 1};
    const uint64_t a_u64[] = {UINT64_MAX, 0};
    const int64_t a_i64[] = {INT64_MIN, INT64_MAX, 5};
    const double a_f64[] = {-0.5, 1e300};
    const struct {
        const char *key;
        enum gguf_type t;
        uint64_t n;
        const void *data;
        size_t esz;
    } arrs[] = {
        {"a.u8", GGUF_TYPE_UINT8, 3, a_u8, 1},      {"a.i8", GGUF_TYPE_INT8, 3, a_i8, 1},
        {"a.u16", GGUF_TYPE_UINT16, 2, a_u16, 2},   {"a.i16", GGUF_TYPE_INT16, 3, a_i16, 2},
        {"a.u32", GGUF_TYPE_UINT32, 4, a_u32, 4},   {"a.i32", GGUF_TYPE_INT32, 4, a_i32, 4},
        {"a.f32", GGUF_TYPE_FLOAT32, 4, a_f32, 4},  {"a.bool", GGUF_TYPE_BOOL, 3, a_bool, 1},
        {"a.u64", GGUF_TYPE_UINT64, 2, a_u64, 8},   {"a.i64", GGUF_TYPE_INT64, 3, a_i64, 8},
        {"a.f64", GGUF_TYPE_FLOAT64, 2, a_f64, 8},  {"a.empty", GGUF_TYPE_UINT32, 0, a_u32, 4},
    };
    const size_t n_arrs = sizeof(arrs) / sizeof(arrs[0]);
    struct gguf_builder *b = gguf_builder_create(3);
    for (size_t i = 0; i < n_arrs; i++) {
        gguf_builder_kv_arr(b, arrs[i].key, arrs[i].t, arrs[i].n, arrs[i].data);
    }
    gguf_builder_kv_u32(b, "after", 99);  // parsing resumes correctly after the arrays
    uint8_t *bytes;
    struct gguf_file *f = open_built(b, &bytes, NULL);
    assert_int_equal(gguf_n_kv(f), (int64_t)n_arrs + 1);
    for (size_t i = 0; i < n_arrs; i++) {
        const struct gguf_kv *kv = NULL;
        assert_int_equal(gguf_get_arr(f, arrs[i].key, arrs[i].t, &kv), 0);
        assert_ptr_equal(kv, gguf_kv_at(f, (int64_t)i));
        assert_int_equal(kv->type, GGUF_TYPE_ARRAY);
        assert_int_equal(kv->arr_type, arrs[i].t);
        assert_int_equal(kv->arr_n, arrs[i].n);
        if (arrs[i].n) assert_memory_equal(kv->data, arrs[i].data, arrs[i].n * arrs[i].esz);
    }
    const struct gguf_kv *kv = NULL;
    assert_int_equal(gguf_get_arr(f, "a.f32", GGUF_TYPE_FLOAT32, &kv), 0);
    for (uint64_t i = 0; i < 4; i++) assert_true(gguf_arr_f32(kv, i) == a_f32[i]);
    assert_int_equal(gguf_get_arr(f, "a.i32", GGUF_TYPE_INT32, &kv), 0);
    for (uint64_t i = 0; i < 4; i++) assert_int_equal(gguf_arr_i32(kv, i), a_i32[i]);
    assert_int_equal(gguf_get_arr(f, "a.u32", GGUF_TYPE_UINT32, &kv), 0);
    for (uint64_t i = 0; i < 4; i++) assert_int_equal(gguf_arr_u32(kv, i), a_u32[i]);
    uint32_t after = 0;
    assert_int_equal(gguf_get_u32(f, "after", &after), 0);
    assert_int_equal(after, 99);
    gguf_close(f);
    free(bytes);
    gguf_builder_destroy(b);
}

static void test_gguf_string_arrays(void **state) {
    (void)state;
    const char *words[] = {"<s>", "", "hello", "\xe2\x96\x81world", "a somewhat longer token"};
    struct gguf_builder *b = gguf_builder_create(3);
    gguf_builder_kv_arr_str(b, "tokens", 5, words);
    gguf_builder_kv_arr_str(b, "none", 0, NULL);
    // A string with an embedded NUL: lengths, not terminators, delimit strings.
    gguf_builder_kv_begin(b, "nul", GGUF_TYPE_ARRAY);
    gguf_builder_put_u32(b, GGUF_TYPE_STRING);
    gguf_builder_put_u64(b, 1);
    gguf_builder_put_u64(b, 3);
    gguf_builder_put_bytes(b, "a\0b", 3);
    gguf_builder_kv_str(b, "tail", "end");
    uint8_t *bytes;
    struct gguf_file *f = open_built(b, &bytes, NULL);

    const struct gguf_kv *kv = NULL;
    assert_int_equal(gguf_get_arr(f, "tokens", GGUF_TYPE_STRING, &kv), 0);
    assert_int_equal(kv->arr_n, 5);
    assert_non_null(kv->strs);
    for (uint64_t i = 0; i < 5; i++) {
        assert_int_equal(kv->strs[i].len, strlen(words[i]));
        assert_true(gguf_str_eq(kv->strs[i], words[i]));
    }
    assert_int_equal(gguf_get_arr(f, "none", GGUF_TYPE_STRING, &kv), 0);
    assert_int_equal(kv->arr_n, 0);
    assert_int_equal(gguf_get_arr(f, "nul", GGUF_TYPE_STRING, &kv), 0);
    assert_int_equal(kv->strs[0].len, 3);
    assert_memory_equal(kv->strs[0].data, "a\0b", 3);
    assert_false(gguf_str_eq(kv->strs[0], "a"));
    struct gguf_str s;
    assert_int_equal(gguf_get_str(f, "tail", &s), 0);
    assert_true(gguf_str_eq(s, "end"));
    gguf_close(f);
    free(bytes);
    gguf_builder_destroy(b);
}

static void test_gguf_nested_arrays_are_kept_as_views(void **state) {
    (void)state;
    struct gguf_builder *b = gguf_builder_create(3);
    // [[1, 2], [3]] of uint32
    gguf_builder_kv_begin(b, "nested.u32", GGUF_TYPE_ARRAY);
    gguf_builder_put_u32(b, GGUF_TYPE_ARRAY);
    gguf_builder_put_u64(b, 2);
    gguf_builder_put_u32(b, GGUF_TYPE_UINT32);
    gguf_builder_put_u64(b, 2);
    gguf_builder_put_u32(b, 1);
    gguf_builder_put_u32(b, 2);
    gguf_builder_put_u32(b, GGUF_TYPE_UINT32);
    gguf_builder_put_u64(b, 1);
    gguf_builder_put_u32(b, 3);
    // [["x", "yz"]]
    gguf_builder_kv_begin(b, "nested.str", GGUF_TYPE_ARRAY);
    gguf_builder_put_u32(b, GGUF_TYPE_ARRAY);
    gguf_builder_put_u64(b, 1);
    gguf_builder_put_u32(b, GGUF_TYPE_STRING);
    gguf_builder_put_u64(b, 2);
    gguf_builder_put_str(b, "x");
    gguf_builder_put_str(b, "yz");
    // [[[7]]]: three levels
    gguf_builder_kv_begin(b, "nested.3", GGUF_TYPE_ARRAY);
    gguf_builder_put_u32(b, GGUF_TYPE_ARRAY);
    gguf_builder_put_u64(b, 1);
    gguf_builder_put_u32(b, GGUF_TYPE_ARRAY);
    gguf_builder_put_u64(b, 1);
    gguf_builder_put_u32(b, GGUF_TYPE_INT8);
    gguf_builder_put_u64(b, 1);
    gguf_builder_put_bytes(b, "\x07", 1);
    gguf_builder_kv_i32(b, "after", -3);
    uint8_t *bytes;
    struct gguf_file *f = open_built(b, &bytes, NULL);
    assert_int_equal(gguf_n_kv(f), 4);
    const struct gguf_kv *kv = NULL;
    assert_int_equal(gguf_get_arr(f, "nested.u32", GGUF_TYPE_ARRAY, &kv), 0);
    assert_int_equal(kv->arr_n, 2);
    assert_int_equal(gguf_get_arr(f, "nested.u32", GGUF_TYPE_UINT32, &kv), ERR_FORMAT);
    assert_int_equal(gguf_get_arr(f, "nested.str", GGUF_TYPE_ARRAY, &kv), 0);
    assert_int_equal(kv->arr_n, 1);
    assert_int_equal(gguf_get_arr(f, "nested.3", GGUF_TYPE_ARRAY, &kv), 0);
    int64_t v = 0;
    assert_int_equal(gguf_get_i64(f, "after", &v), 0);
    assert_int_equal(v, -3);
    gguf_close(f);
    free(bytes);
    gguf_builder_destroy(b);
}

/* ---- versions and alignment ------------------------------------------- */

static void test_gguf_reads_v2_and_v3(void **state) {
    (void)state;
    for (uint32_t version = 2; version <= 3; version++) {
        struct gguf_builder *b = gguf_builder_create(version);
        gguf_builder_kv_str(b, "general.architecture", "llama");
        const int64_t ne[2] = {8, 2};
        gguf_builder_tensor(b, "w", 2, ne, 0, NULL, 64);
        uint8_t *bytes;
        struct gguf_file *f = open_built(b, &bytes, NULL);
        assert_int_equal(gguf_version(f), version);
        assert_int_equal(gguf_alignment(f), 32);
        assert_string_equal(gguf_name(f), "built");
        struct gguf_str s;
        assert_int_equal(gguf_get_str(f, "general.architecture", &s), 0);
        assert_true(gguf_str_eq(s, "llama"));
        assert_int_equal(gguf_n_tensors(f), 1);
        gguf_close(f);
        free(bytes);
        gguf_builder_destroy(b);
    }
}

static void test_gguf_empty_file_header_only(void **state) {
    (void)state;
    struct gguf_builder *b = gguf_builder_create(3);
    uint8_t *bytes;
    size_t size;
    struct gguf_file *f = open_built(b, &bytes, &size);
    assert_int_equal(size, 24);
    assert_int_equal(gguf_n_kv(f), 0);
    assert_int_equal(gguf_n_tensors(f), 0);
    assert_null(gguf_find(f, "x"));
    assert_null(gguf_find_tensor(f, "x"));
    gguf_close(f);
    free(bytes);
    gguf_builder_destroy(b);
}

/* Builds two f32 tensors under alignment a (general.alignment = a when
 * write_key) and checks both data views. */
static void check_alignment(uint32_t a, bool write_key) {
    struct gguf_builder *b = gguf_builder_create(3);
    if (write_key) gguf_builder_kv_u32(b, "general.alignment", a);
    gguf_builder_kv_str(b, "name", "abc");  // makes the header length odd
    gguf_builder_set_alignment(b, a);
    const int64_t ne0[1] = {3};
    const int64_t ne1[1] = {5};
    uint64_t off0 = gguf_builder_tensor(b, "t0", 1, ne0, 0, NULL, 12);
    uint64_t off1 = gguf_builder_tensor(b, "t1", 1, ne1, 0, NULL, 20);
    assert_int_equal(off0, 0);
    assert_int_equal(off1 % a, 0);
    assert_true(off1 >= 12);
    uint8_t *bytes;
    size_t size;
    struct gguf_file *f = open_built(b, &bytes, &size);
    assert_int_equal(gguf_alignment(f), a);
    const struct gguf_tensor_info *t0 = gguf_find_tensor(f, "t0");
    const struct gguf_tensor_info *t1 = gguf_find_tensor(f, "t1");
    assert_non_null(t0);
    assert_non_null(t1);
    assert_int_equal(t1->offset, off1);
    size_t p0 = (size_t)((const uint8_t *)t0->data - bytes);
    size_t p1 = (size_t)((const uint8_t *)t1->data - bytes);
    assert_int_equal(p0 % a, 0);
    assert_int_equal(p1 - p0, off1);
    assert_int_equal(p1 + 20, size);  // the last tensor ends the file
    for (size_t k = 0; k < 20; k++) {
        assert_int_equal(((const uint8_t *)t1->data)[k], (uint8_t)(1 * 31 + k * 7 + 1));
    }
    gguf_close(f);
    free(bytes);
    gguf_builder_destroy(b);
}

static void test_gguf_alignment_other_than_32(void **state) {
    (void)state;
    check_alignment(64, true);
    check_alignment(1, true);
    check_alignment(8, true);
    check_alignment(4096, true);
    check_alignment(32, false);  // the default when the key is absent
}

static void test_gguf_invalid_alignment_rejected(void **state) {
    (void)state;
    const uint32_t bad[] = {0, 3, 48, 0x80000001u};
    for (size_t i = 0; i < 4; i++) {
        struct gguf_builder *b = gguf_builder_create(3);
        gguf_builder_kv_u32(b, "general.alignment", bad[i]);
        expect_open_fails(b, ERR_FORMAT);
        gguf_builder_destroy(b);
    }
    // Right value, wrong type: the spec makes general.alignment a uint32.
    for (int i = 0; i < 4; i++) {
        struct gguf_builder *b = gguf_builder_create(3);
        switch (i) {
        case 0: gguf_builder_kv_u64(b, "general.alignment", 32); break;
        case 1: gguf_builder_kv_i32(b, "general.alignment", 32); break;
        case 2: gguf_builder_kv_str(b, "general.alignment", "32"); break;
        default: gguf_builder_kv_arr(b, "general.alignment", GGUF_TYPE_UINT32, 1,
                                     &(uint32_t){32}); break;
        }
        expect_open_fails(b, ERR_FORMAT);
        gguf_builder_destroy(b);
    }
}

/* ---- tensors ---------------------------------------------------------- */

static void test_gguf_tensor_views_and_sizes(void **state) {
    (void)state;
    // Bytes per block from the ggml block structs: f32 4 per element, f16 2,
    // q8_0 = f16 scale + 32 int8 = 34 per 32, q4_K = 2 f16 + 12 scale bytes +
    // 128 nibble bytes = 144 per 256, q4_0 = f16 + 16 = 18 per 32, bf16 2.
    const struct {
        const char *name;
        uint32_t n_dims;
        int64_t ne[4];
        uint32_t type;
        size_t nbytes;
    } ts[] = {
        {"f32.w", 2, {4, 3, 1, 1}, 0, 4 * 3 * 4},
        {"f16.w", 1, {8, 1, 1, 1}, 1, 8 * 2},
        {"q8_0.w", 2, {64, 2, 1, 1}, 8, 4 * 34},
        {"q4_K.w", 3, {256, 3, 2, 1}, 12, 6 * 144},
        {"q4_0.w", 4, {32, 1, 2, 2}, 2, 4 * 18},
        {"bf16.w", 1, {5, 1, 1, 1}, 30, 10},
        {"empty", 2, {0, 4, 1, 1}, 0, 0},
    };
    const size_t n = sizeof(ts) / sizeof(ts[0]);
    struct gguf_builder *b = gguf_builder_create(3);
    gguf_builder_kv_str(b, "general.architecture", "llama");
    uint64_t offs[7];
    for (size_t i = 0; i < n; i++) {
        offs[i] = gguf_builder_tensor(b, ts[i].name, ts[i].n_dims, ts[i].ne, ts[i].type, NULL,
                                      ts[i].nbytes);
    }
    // The last tensor is empty, so a few data bytes after it keep the file valid.
    gguf_builder_data(b, "pad", 3);
    uint8_t *bytes;
    size_t size;
    struct gguf_file *f = open_built(b, &bytes, &size);
    assert_int_equal(gguf_n_tensors(f), (int64_t)n);
    const uint8_t *base = gguf_tensor_at(f, 0)->data;
    assert_int_equal((size_t)(base - bytes) % 32, 0);
    for (size_t i = 0; i < n; i++) {
        const struct gguf_tensor_info *t = gguf_tensor_at(f, (int64_t)i);
        assert_ptr_equal(gguf_find_tensor(f, ts[i].name), t);
        assert_true(gguf_str_eq(t->name, ts[i].name));
        assert_int_equal(t->n_dims, ts[i].n_dims);
        for (int d = 0; d < 4; d++) assert_int_equal(t->ne[d], ts[i].ne[d]);
        assert_int_equal(t->type, ts[i].type);
        assert_int_equal(t->offset, offs[i]);
        assert_int_equal(t->offset % 32, 0);
        assert_int_equal(t->nbytes, ts[i].nbytes);
        assert_ptr_equal(t->data, base + offs[i]);
        const uint8_t *p = t->data;
        for (size_t k = 0; k < t->nbytes; k++) {
            assert_int_equal(p[k], (uint8_t)(i * 31 + k * 7 + 1));
        }
    }
    assert_null(gguf_find_tensor(f, "f32"));
    assert_null(gguf_find_tensor(f, "f32.w2"));
    gguf_close(f);
    free(bytes);
    gguf_builder_destroy(b);
}

/* ---- files on disk ---------------------------------------------------- */

static void test_gguf_open_reads_a_file_on_disk(void **state) {
    (void)state;
    struct gguf_builder *b = gguf_builder_create(3);
    gguf_builder_kv_u32(b, "llama.block_count", 2);
    const int64_t ne[2] = {32, 2};
    gguf_builder_tensor(b, "tok_embd.weight", 2, ne, 8, NULL, 2 * 34);
    size_t size;
    uint8_t *bytes = gguf_builder_finish(b, &size);
    char path[4096];
    snprintf(path, sizeof(path), "%s", gguf_builder_write_temp(bytes, size));

    struct gguf_file *f = NULL;
    assert_int_equal(gguf_open(path, &f), 0);
    assert_string_equal(gguf_name(f), path);
    uint32_t n = 0;
    assert_int_equal(gguf_get_u32(f, "llama.block_count", &n), 0);
    assert_int_equal(n, 2);
    const struct gguf_tensor_info *t = gguf_find_tensor(f, "tok_embd.weight");
    assert_non_null(t);
    assert_int_equal(t->nbytes, 68);
    assert_memory_equal(t->data, bytes + size - 68, 68);
    gguf_close(f);
    unlink(path);

    // Missing files are I/O errors; empty and truncated ones malformed.
    f = (struct gguf_file *)1;
    assert_int_equal(gguf_open(path, &f), ERR_IO);
    assert_null(f);
    snprintf(path, sizeof(path), "%s", gguf_builder_write_temp(bytes, 0));
    assert_int_equal(gguf_open(path, &f), ERR_FORMAT);
    unlink(path);
    snprintf(path, sizeof(path), "%s", gguf_builder_write_temp(bytes, size - 1));
    assert_int_equal(gguf_open(path, &f), ERR_FORMAT);
    assert_null(f);
    unlink(path);
    free(bytes);
    gguf_builder_destroy(b);
}

/* gguf_open_sparse: a header of 100 KB (a long string) read in chunks of
 * 64 KiB then doubling (by hand: 65536 + 65536 bytes, the second chunk
 * running into the first tensor's data), values as written; a tensor past
 * the chunks stays zero until gguf_read() reads a range of it, which is then
 * the file's bytes and all that is counted as data read; ranges outside the
 * data and reads after gguf_seal() are ERR_INVAL. */
static void test_gguf_open_sparse_reads_the_header_and_asked_ranges(void **state) {
    (void)state;
    struct gguf_builder *b = gguf_builder_create(3);
    char *big = malloc(100001);
    assert_non_null(big);
    memset(big, 'x', 100000);
    big[99999] = 'y';
    big[100000] = '\0';
    gguf_builder_kv_str(b, "general.big", big);
    gguf_builder_kv_u32(b, "llama.block_count", 7);
    const int64_t ne_a[1] = {16384};  // 64 KiB of f32
    gguf_builder_tensor(b, "a", 1, ne_a, 0, NULL, 65536);
    const int64_t ne_b[1] = {1024};
    gguf_builder_tensor(b, "b", 1, ne_b, 0, NULL, 4096);
    size_t size;
    uint8_t *bytes = gguf_builder_finish(b, &size);
    char path[4096];
    snprintf(path, sizeof(path), "%s", gguf_builder_write_temp(bytes, size));

    struct gguf_file *f = NULL;
    assert_int_equal(gguf_open_sparse(path, &f), 0);
    struct gguf_str v;
    assert_int_equal(gguf_get_str(f, "general.big", &v), 0);
    assert_int_equal(v.len, 100000);
    assert_memory_equal(v.data, big, 100000);
    uint32_t n = 0;
    assert_int_equal(gguf_get_u32(f, "llama.block_count", &n), 0);
    assert_int_equal(n, 7);
    assert_int_equal(gguf_header_bytes_read(f), 131072);
    assert_int_equal(gguf_data_bytes_read(f), 0);
    const struct gguf_tensor_info *tb = gguf_find_tensor(f, "b");
    assert_non_null(tb);
    const uint8_t *d = tb->data;
    const size_t at = size - 4096;  // b is the file's last bytes (4096: aligned)
    assert_true(at >= 131072);  // past what the header's chunks read
    for (size_t k = 0; k < 4096; k++) assert_int_equal(d[k], 0);
    assert_int_equal(gguf_read(f, d + 100, 50), 0);
    assert_memory_equal(d + 100, bytes + at + 100, 50);
    assert_int_equal(d[99], 0);
    assert_int_equal(d[150], 0);
    assert_int_equal(gguf_data_bytes_read(f), 50);
    assert_int_equal(gguf_read(f, d, 4097), ERR_INVAL);  // past the end of the file
    assert_int_equal(gguf_read(f, v.data, 1), ERR_INVAL);  // the header is not data
    gguf_seal(f);
    assert_int_equal(gguf_read(f, d, 1), ERR_INVAL);
    assert_memory_equal(d + 100, bytes + at + 100, 50);  // still there, read-only
    gguf_close(f);

    // A file read whole: gguf_read is a no-op, and everything was read.
    assert_int_equal(gguf_open(path, &f), 0);
    assert_int_equal(gguf_read(f, gguf_find_tensor(f, "b")->data, 4096), 0);
    assert_int_equal(gguf_data_bytes_read(f), 65536 + 4096);
    gguf_close(f);
    unlink(path);
    // Truncated files fail as gguf_open's do.
    snprintf(path, sizeof(path), "%s", gguf_builder_write_temp(bytes, 70000));
    assert_int_equal(gguf_open_sparse(path, &f), ERR_FORMAT);
    assert_null(f);
    unlink(path);
    assert_int_equal(gguf_open_sparse(path, &f), ERR_IO);
    free(big);
    free(bytes);
    gguf_builder_destroy(b);
}

/* Reads every kv and tensor of f through the accessors (for ASan's sake). */
static void touch_everything(const struct gguf_file *f) {
    unsigned sum = 0;
    for (int64_t i = 0; i < gguf_n_kv(f); i++) {
        const struct gguf_kv *kv = gguf_kv_at(f, i);
        for (uint64_t k = 0; k < kv->key.len; k++) sum += (unsigned char)kv->key.data[k];
        if (kv->type == GGUF_TYPE_ARRAY && kv->arr_type == GGUF_TYPE_STRING) {
            for (uint64_t j = 0; j < kv->arr_n; j++) {
                for (uint64_t k = 0; k < kv->strs[j].len; k++) {
                    sum += (unsigned char)kv->strs[j].data[k];
                }
            }
        }
    }
    for (int64_t i = 0; i < gguf_n_tensors(f); i++) {
        const struct gguf_tensor_info *t = gguf_tensor_at(f, i);
        const uint8_t *p = t->data;
        if (t->nbytes) sum += p[0] + p[t->nbytes - 1];
    }
    (void)sum;
}

static void test_gguf_parses_stories260k(void **state) {
    (void)state;
    const char *shared = testutil_shared_dir();
    if (!shared) {
        print_message("skipped: ../shared is absent (LLMSERVE_SHARED)\n");
        skip();
    }
    struct gguf_file *f = NULL;
    assert_int_equal(gguf_open(testutil_path(shared, "models/stories260K.gguf"), &f), 0);
    assert_int_equal(gguf_version(f), 3);
    assert_int_equal(gguf_n_kv(f), 19);
    assert_int_equal(gguf_n_tensors(f), 48);
    uint32_t n = 0;
    assert_int_equal(gguf_get_u32(f, "llama.embedding_length", &n), 0);
    assert_int_equal(n, 64);
    const struct gguf_kv *tokens = NULL;
    assert_int_equal(gguf_get_arr(f, "tokenizer.ggml.tokens", GGUF_TYPE_STRING, &tokens), 0);
    assert_int_equal(tokens->arr_n, 512);
    const struct gguf_tensor_info *t = gguf_find_tensor(f, "blk.0.ffn_gate.weight");
    assert_non_null(t);
    assert_int_equal(t->ne[0], 64);
    assert_int_equal(t->ne[1], 172);
    touch_everything(f);
    gguf_close(f);
}

static int has_suffix(const char *s, const char *suffix) {
    size_t n = strlen(s);
    size_t m = strlen(suffix);
    return n >= m && strcmp(s + n - m, suffix) == 0;
}

static void test_gguf_parses_every_shared_file(void **state) {
    (void)state;
    const char *shared = testutil_shared_dir();
    if (!shared) {
        print_message("skipped: ../shared is absent (LLMSERVE_SHARED)\n");
        skip();
    }
    const char *dirs[] = {"models", "models/vocab"};
    int n_files = 0;
    for (size_t i = 0; i < 2; i++) {
        char dir[4096];
        snprintf(dir, sizeof(dir), "%s", testutil_path(shared, dirs[i]));
        DIR *d = opendir(dir);
        if (!d) continue;
        struct dirent *e;
        while ((e = readdir(d)) != NULL) {
            if (!has_suffix(e->d_name, ".gguf")) continue;
            const char *path = testutil_path(dir, e->d_name);
            struct gguf_file *f = NULL;
            int rc = gguf_open(path, &f);
            if (rc != 0) print_message("%s: %s\n", path, err_name(rc));
            assert_int_equal(rc, 0);
            assert_true(gguf_version(f) == 2 || gguf_version(f) == 3);
            assert_true(gguf_n_kv(f) > 0);
            struct gguf_str arch;
            assert_int_equal(gguf_get_str(f, "general.architecture", &arch), 0);
            touch_everything(f);
            // Read sparse, the header says the same: every key and tensor info.
            struct gguf_file *g = NULL;
            assert_int_equal(gguf_open_sparse(path, &g), 0);
            assert_int_equal(gguf_n_kv(g), gguf_n_kv(f));
            assert_int_equal(gguf_n_tensors(g), gguf_n_tensors(f));
            for (int64_t k = 0; k < gguf_n_kv(f); k++) {
                const struct gguf_kv *a = gguf_kv_at(f, k), *c = gguf_kv_at(g, k);
                assert_int_equal(a->key.len, c->key.len);
                assert_memory_equal(a->key.data, c->key.data, a->key.len);
                assert_int_equal(a->type, c->type);
                assert_int_equal(a->arr_n, c->arr_n);
            }
            for (int64_t k = 0; k < gguf_n_tensors(f); k++) {
                const struct gguf_tensor_info *a = gguf_tensor_at(f, k), *c = gguf_tensor_at(g, k);
                assert_int_equal(a->offset, c->offset);
                assert_int_equal(a->nbytes, c->nbytes);
                assert_int_equal(a->type, c->type);
            }
            assert_true(gguf_header_bytes_read(g) < gguf_header_bytes_read(f) * 2 + 65536);
            gguf_close(g);
            gguf_close(f);
            n_files++;
        }
        closedir(d);
    }
    print_message("parsed %d shared .gguf files\n", n_files);
    assert_true(n_files > 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gguf_kv_at_sees_every_scalar_type_in_order),
        cmocka_unit_test(test_gguf_typed_getters_round_trip),
        cmocka_unit_test(test_gguf_integer_getters_check_range_across_types),
        cmocka_unit_test(test_gguf_wrong_type_is_format_and_absent_is_notfound),
        cmocka_unit_test(test_gguf_get_f32_rejects_doubles_beyond_float),
        cmocka_unit_test(test_gguf_scalar_arrays_of_every_type),
        cmocka_unit_test(test_gguf_string_arrays),
        cmocka_unit_test(test_gguf_nested_arrays_are_kept_as_views),
        cmocka_unit_test(test_gguf_reads_v2_and_v3),
        cmocka_unit_test(test_gguf_empty_file_header_only),
        cmocka_unit_test(test_gguf_alignment_other_than_32),
        cmocka_unit_test(test_gguf_invalid_alignment_rejected),
        cmocka_unit_test(test_gguf_tensor_views_and_sizes),
        cmocka_unit_test(test_gguf_open_reads_a_file_on_disk),
        cmocka_unit_test(test_gguf_open_sparse_reads_the_header_and_asked_ranges),
        cmocka_unit_test(test_gguf_parses_stories260k),
        cmocka_unit_test(test_gguf_parses_every_shared_file),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
