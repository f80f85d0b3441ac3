/*
 * test_gguf_corrupt.c - the GGUF reader on hostile files: truncations at every
 * offset, absurd counts and lengths built so that naive size arithmetic would
 * wrap, invalid types, bad tensor directories, and a seeded random-mutation
 * loop. Each case must fail with the specified code (or, for mutations, any
 * code) and never crash or trip ASan/UBSan; a mutated file that still opens
 * must be safe to read through every accessor.
 *
 * Every input is a malloc'd copy of exactly its size, so ASan sees a read one
 * byte past the end. The expected errors come from the GGUF spec and
 * engine/gguf.h, not from running the reader.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/base/err.h"
#include "engine/base/log.h"
#include "engine/format/gguf.h"
#include "tests/helpers/gguf_builder.h"

#define MUTATION_SEED 0x9e3779b97f4a7c15ull
#define MUTATION_ROUNDS 4000

/* Sends the reader's error lines to /dev/null for the loops (thousands of
 * expected failures); quiet_end() restores stderr. */
static int quiet_begin(void) {
    int fd = open("/dev/null", O_WRONLY | O_CLOEXEC);
    if (fd >= 0) log_set_fd(fd);
    return fd;
}

static void quiet_end(int fd) {
    log_set_fd(2);
    if (fd >= 0) close(fd);
}

/* Opens an exact-size heap copy of data[0..size) and returns the code; a
 * successful open is closed again. */
static int open_copy(const uint8_t *data, size_t size) {
    uint8_t *copy = malloc(size ? size : 1);
    assert_non_null(copy);
    if (size) memcpy(copy, data, size);
    struct gguf_file *f = (struct gguf_file *)1;
    int rc = gguf_open_memory(size ? copy : NULL, size, "corrupt", &f);
    if (rc == 0) {
        assert_non_null(f);
        gguf_close(f);
    } else {
        assert_null(f);
    }
    free(copy);
    return rc;
}

/* Finishes b, expects the open to fail with want, destroys b. */
static void expect_err(struct gguf_builder *b, int want) {
    size_t size;
    uint8_t *bytes = gguf_builder_finish(b, &size);
    int rc = open_copy(bytes, size);
    if (rc != want) print_message("got %s, want %s\n", err_name(rc), err_name(want));
    assert_int_equal(rc, want);
    free(bytes);
    gguf_builder_destroy(b);
}

/* The valid file every corruption starts from: kvs of several kinds, three
 * tensors of different types, the last one non-empty so that cutting any
 * byte of the file removes data a tensor needs. */
static uint8_t *build_valid(size_t *out_size) {
    struct gguf_builder *b = gguf_builder_create(3);
    gguf_builder_kv_str(b, "general.architecture", "llama");
    gguf_builder_kv_u32(b, "general.alignment", 32);
    gguf_builder_kv_u32(b, "llama.block_count", 2);
    gguf_builder_kv_f32(b, "llama.attention.layer_norm_rms_epsilon", 1e-5f);
    gguf_builder_kv_bool(b, "flag", true);
    gguf_builder_kv_i64(b, "big", -1234567890123);
    const char *toks[] = {"<s>", "a", "", "\xe2\x96\x81the"};
    gguf_builder_kv_arr_str(b, "tokenizer.ggml.tokens", 4, toks);
    const float scores[] = {0.0f, -1.0f, -2.0f, -3.5f};
    gguf_builder_kv_arr(b, "tokenizer.ggml.scores", GGUF_TYPE_FLOAT32, 4, scores);
    const int32_t types[] = {3, 1, 1, 1};
    gguf_builder_kv_arr(b, "tokenizer.ggml.token_type", GGUF_TYPE_INT32, 4, types);
    gguf_builder_kv_begin(b, "nested", GGUF_TYPE_ARRAY);
    gguf_builder_put_u32(b, GGUF_TYPE_ARRAY);
    gguf_builder_put_u64(b, 1);
    gguf_builder_put_u32(b, GGUF_TYPE_UINT16);
    gguf_builder_put_u64(b, 2);
    gguf_builder_put_bytes(b, "\x01\x00\x02\x00", 4);
    const int64_t ne_embd[2] = {8, 2};
    const int64_t ne_q[2] = {32, 2};
    const int64_t ne_norm[1] = {8};
    gguf_builder_tensor(b, "token_embd.weight", 2, ne_embd, 0, NULL, 8 * 2 * 4);
    gguf_builder_tensor(b, "blk.0.attn_q.weight", 2, ne_q, 8, NULL, 2 * 34);
    gguf_builder_tensor(b, "output_norm.weight", 1, ne_norm, 1, NULL, 8 * 2);
    uint8_t *bytes = gguf_builder_finish(b, out_size);
    gguf_builder_destroy(b);
    return bytes;
}

static void test_gguf_corrupt_base_file_is_valid(void **state) {
    (void)state;
    size_t size;
    uint8_t *bytes = build_valid(&size);
    assert_int_equal(open_copy(bytes, size), 0);
    free(bytes);
}

static void test_gguf_corrupt_truncated_at_every_offset(void **state) {
    (void)state;
    size_t size;
    uint8_t *bytes = build_valid(&size);
    int q = quiet_begin();
    for (size_t len = 0; len < size; len++) {
        int rc = open_copy(bytes, len);
        if (rc != ERR_FORMAT) {
            quiet_end(q);
            print_message("truncated to %zu of %zu bytes: %s\n", len, size, err_name(rc));
            fail();
        }
    }
    quiet_end(q);
    free(bytes);
}

static void test_gguf_corrupt_bad_magic(void **state) {
    (void)state;
    size_t size;
    uint8_t *bytes = build_valid(&size);
    const char *magics[] = {"GGUG", "FUGG", "ggjt", "\0\0\0\0"};
    for (size_t i = 0; i < 4; i++) {
        memcpy(bytes, magics[i], 4);
        assert_int_equal(open_copy(bytes, size), ERR_FORMAT);
    }
    assert_int_equal(open_copy(NULL, 0), ERR_FORMAT);
    assert_int_equal(open_copy((const uint8_t *)"GGU", 3), ERR_FORMAT);
    free(bytes);
}

static void test_gguf_corrupt_unsupported_versions(void **state) {
    (void)state;
    const uint32_t versions[] = {0, 1, 4, 5, 0x03000000u, UINT32_MAX};
    for (size_t i = 0; i < 6; i++) {
        struct gguf_builder *b = gguf_builder_create(versions[i]);
        gguf_builder_kv_u32(b, "x", 1);
        expect_err(b, ERR_UNSUPPORTED);
    }
}

static void test_gguf_corrupt_absurd_header_counts(void **state) {
    (void)state;
    // Counts whose products with any struct size wrap a 64-bit size_t.
    const uint64_t counts[] = {UINT64_MAX, UINT64_MAX / 13 + 1, (uint64_t)1 << 63,
                               (uint64_t)1 << 60, (uint64_t)1 << 59, 1000000};
    for (size_t i = 0; i < 6; i++) {
        struct gguf_builder *b = gguf_builder_create(3);
        gguf_builder_kv_u32(b, "x", 1);
        gguf_builder_set_n_kv(b, counts[i]);
        expect_err(b, ERR_FORMAT);

        b = gguf_builder_create(3);
        gguf_builder_kv_u32(b, "x", 1);
        const int64_t ne[1] = {4};
        gguf_builder_tensor(b, "t", 1, ne, 0, NULL, 16);
        gguf_builder_set_n_tensors(b, counts[i]);
        expect_err(b, ERR_FORMAT);
    }
    // One more entry than the file holds: the parser runs into the next section.
    struct gguf_builder *b = gguf_builder_create(3);
    gguf_builder_kv_u32(b, "x", 1);
    gguf_builder_kv_u32(b, "y", 2);
    gguf_builder_set_n_kv(b, 3);
    expect_err(b, ERR_FORMAT);
}

static void test_gguf_corrupt_huge_array_counts(void **state) {
    (void)state;
    const struct {
        enum gguf_type t;
        size_t esz;
    } elems[] = {
        {GGUF_TYPE_UINT8, 1},  {GGUF_TYPE_UINT16, 2},  {GGUF_TYPE_INT32, 4},
        {GGUF_TYPE_FLOAT32, 4}, {GGUF_TYPE_UINT64, 8}, {GGUF_TYPE_FLOAT64, 8},
    };
    for (size_t i = 0; i < 6; i++) {
        // n * esz wraps to a small number (or 0) for the last two counts.
        const uint64_t wrap = elems[i].esz > 1 ? UINT64_MAX / elems[i].esz + 1 : UINT64_MAX - 1;
        const uint64_t ns[] = {UINT64_MAX, (uint64_t)1 << 63, wrap,
                               ((uint64_t)1 << 62) + 1, 64};
        for (size_t j = 0; j < 5; j++) {
            struct gguf_builder *b = gguf_builder_create(3);
            gguf_builder_kv_begin(b, "arr", GGUF_TYPE_ARRAY);
            gguf_builder_put_u32(b, elems[i].t);
            gguf_builder_put_u64(b, ns[j]);
            gguf_builder_put_bytes(b, "\x01\x02\x03\x04\x05\x06\x07\x08", 8);
            expect_err(b, ERR_FORMAT);
        }
    }
    // Strings: n * sizeof(struct gguf_str) wraps for 2^60.
    const uint64_t ns[] = {UINT64_MAX, (uint64_t)1 << 60, (uint64_t)1 << 59, 3};
    for (size_t j = 0; j < 4; j++) {
        struct gguf_builder *b = gguf_builder_create(3);
        gguf_builder_kv_begin(b, "strs", GGUF_TYPE_ARRAY);
        gguf_builder_put_u32(b, GGUF_TYPE_STRING);
        gguf_builder_put_u64(b, ns[j]);
        gguf_builder_put_str(b, "one");
        gguf_builder_put_str(b, "two");
        expect_err(b, ERR_FORMAT);
    }
    // Nested: a huge outer count, and a huge inner count.
    for (int inner = 0; inner < 2; inner++) {
        struct gguf_builder *b = gguf_builder_create(3);
        gguf_builder_kv_begin(b, "nested", GGUF_TYPE_ARRAY);
        gguf_builder_put_u32(b, GGUF_TYPE_ARRAY);
        gguf_builder_put_u64(b, inner ? 1 : UINT64_MAX);
        gguf_builder_put_u32(b, GGUF_TYPE_UINT32);
        gguf_builder_put_u64(b, inner ? ((uint64_t)1 << 62) : 0);
        gguf_builder_put_u32(b, 7);
        expect_err(b, ERR_FORMAT);
    }
}

static void test_gguf_corrupt_huge_string_lengths(void **state) {
    (void)state;
    const uint64_t lens[] = {UINT64_MAX, UINT64_MAX - 7, (uint64_t)1 << 63, 1000};
    for (size_t i = 0; i < 4; i++) {
        // A string value.
        struct gguf_builder *b = gguf_builder_create(3);
        gguf_builder_kv_begin(b, "s", GGUF_TYPE_STRING);
        gguf_builder_put_u64(b, lens[i]);
        gguf_builder_put_bytes(b, "abcdefgh", 8);
        expect_err(b, ERR_FORMAT);
        // A key.
        b = gguf_builder_create(3);
        gguf_builder_put_u64(b, lens[i]);
        gguf_builder_put_bytes(b, "key\x04\0\0\0\x01\0\0\0", 11);
        gguf_builder_set_n_kv(b, 1);
        expect_err(b, ERR_FORMAT);
        // A string inside a string array.
        b = gguf_builder_create(3);
        gguf_builder_kv_begin(b, "strs", GGUF_TYPE_ARRAY);
        gguf_builder_put_u32(b, GGUF_TYPE_STRING);
        gguf_builder_put_u64(b, 2);
        gguf_builder_put_str(b, "ok");
        gguf_builder_put_u64(b, lens[i]);
        gguf_builder_put_bytes(b, "abcdefgh", 8);
        expect_err(b, ERR_FORMAT);
    }
}

static void test_gguf_corrupt_invalid_value_types(void **state) {
    (void)state;
    const uint32_t bad[] = {GGUF_TYPE_COUNT, 100, 0x80000000u, UINT32_MAX};
    for (size_t i = 0; i < 4; i++) {
        struct gguf_builder *b = gguf_builder_create(3);
        gguf_builder_kv_begin(b, "v", bad[i]);
        gguf_builder_put_u64(b, 0);
        expect_err(b, ERR_FORMAT);

        b = gguf_builder_create(3);
        gguf_builder_kv_begin(b, "arr", GGUF_TYPE_ARRAY);
        gguf_builder_put_u32(b, bad[i]);
        gguf_builder_put_u64(b, 1);
        gguf_builder_put_u64(b, 0);
        expect_err(b, ERR_FORMAT);

        b = gguf_builder_create(3);  // inside a nested array
        gguf_builder_kv_begin(b, "nested", GGUF_TYPE_ARRAY);
        gguf_builder_put_u32(b, GGUF_TYPE_ARRAY);
        gguf_builder_put_u64(b, 1);
        gguf_builder_put_u32(b, bad[i]);
        gguf_builder_put_u64(b, 1);
        gguf_builder_put_u64(b, 0);
        expect_err(b, ERR_FORMAT);
    }
}

static void test_gguf_corrupt_deep_nesting_is_an_error(void **state) {
    (void)state;
    // 1000 levels of [[[...]]]: refused without deep recursion.
    struct gguf_builder *b = gguf_builder_create(3);
    gguf_builder_kv_begin(b, "deep", GGUF_TYPE_ARRAY);
    for (int i = 0; i < 1000; i++) {
        gguf_builder_put_u32(b, GGUF_TYPE_ARRAY);
        gguf_builder_put_u64(b, 1);
    }
    gguf_builder_put_u32(b, GGUF_TYPE_UINT8);
    gguf_builder_put_u64(b, 1);
    gguf_builder_put_bytes(b, "\x01", 1);
    expect_err(b, ERR_FORMAT);
}

static void test_gguf_corrupt_duplicate_keys(void **state) {
    (void)state;
    // Two general.alignment entries would let readers disagree on the layout.
    struct gguf_builder *b = gguf_builder_create(3);
    gguf_builder_kv_u32(b, "general.alignment", 32);
    gguf_builder_kv_u32(b, "a", 1);
    gguf_builder_kv_u32(b, "general.alignment", 64);
    expect_err(b, ERR_FORMAT);
    b = gguf_builder_create(3);
    gguf_builder_kv_u32(b, "k", 1);
    gguf_builder_kv_str(b, "k", "other type");
    expect_err(b, ERR_FORMAT);
}

/* A file with one raw tensor info and data_bytes of data after the padding. */
static void expect_tensor_err(uint32_t n_dims, const uint64_t *ne, uint32_t type, uint64_t offset,
                              size_t data_bytes, int want) {
    struct gguf_builder *b = gguf_builder_create(3);
    gguf_builder_kv_str(b, "general.architecture", "llama");
    gguf_builder_tensor_raw(b, "t", n_dims, ne, type, offset);
    uint8_t zeros[256] = {0};
    assert_true(data_bytes <= sizeof(zeros));
    gguf_builder_data(b, zeros, data_bytes);
    expect_err(b, want);
}

static void test_gguf_corrupt_tensor_dims(void **state) {
    (void)state;
    const uint64_t ne[8] = {4, 1, 1, 1, 1, 1, 1, 1};
    expect_tensor_err(1, ne, 0, 0, 16, 0);  // the control case opens
    expect_tensor_err(0, NULL, 0, 0, 16, ERR_FORMAT);
    expect_tensor_err(5, ne, 0, 0, 16, ERR_FORMAT);
    expect_tensor_err(8, ne, 0, 0, 16, ERR_FORMAT);
    expect_tensor_err(UINT32_MAX, ne, 0, 0, 16, ERR_FORMAT);
}

static void test_gguf_corrupt_element_count_overflow(void **state) {
    (void)state;
    const uint64_t two32 = (uint64_t)1 << 32;
    const uint64_t cases[][4] = {
        {two32, two32, 1, 1},                      // 2^64
        {(uint64_t)1 << 62, 2, 1, 1},              // 2^63 > INT64_MAX
        {(uint64_t)1 << 21, (uint64_t)1 << 21, (uint64_t)1 << 21, 1},
        {(uint64_t)1 << 63, 1, 1, 1},              // negative as int64
        {UINT64_MAX, 1, 1, 1},
        {1, 1, 1, UINT64_MAX},
        {0, (uint64_t)INT64_MAX, (uint64_t)INT64_MAX, 1},  // 0 elements, but ne[1]*ne[2] wraps
        {3, 0, (uint64_t)1 << 62, 4},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        expect_tensor_err(4, cases[i], 0, 0, 16, ERR_FORMAT);
    }
    // The element count fits in int64 but the byte count does not fit size_t.
    const uint64_t f32_big[1] = {(uint64_t)1 << 62};
    expect_tensor_err(1, f32_big, 0, 0, 16, ERR_FORMAT);
    const uint64_t f64_big[1] = {(uint64_t)1 << 61};
    expect_tensor_err(1, f64_big, 28, 0, 16, ERR_FORMAT);
    // Fits everywhere, but not in the file.
    const uint64_t i8_max[1] = {(uint64_t)INT64_MAX};
    expect_tensor_err(1, i8_max, 24, 0, 16, ERR_FORMAT);
}

static void test_gguf_corrupt_unknown_tensor_types(void **state) {
    (void)state;
    const uint64_t ne[1] = {32};
    // 4, 5: Q4_2/Q4_3 and 31..33, 36..38: repacked types, all removed from
    // ggml; 40 and up: not defined.
    const uint32_t bad[] = {4, 5, 31, 32, 33, 36, 37, 38, 40, 200, UINT32_MAX};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        expect_tensor_err(1, ne, bad[i], 0, 128, ERR_UNSUPPORTED);
    }
}

static void test_gguf_corrupt_rows_not_a_multiple_of_the_block(void **state) {
    (void)state;
    const uint64_t q8[2] = {48, 2};     // q8_0 blocks hold 32
    const uint64_t q4k[1] = {128};      // q4_K blocks hold 256
    const uint64_t q40[1] = {33};
    const uint64_t ok[2] = {64, 2};
    expect_tensor_err(2, ok, 8, 0, 4 * 34, 0);
    expect_tensor_err(2, q8, 8, 0, 136, ERR_FORMAT);
    expect_tensor_err(1, q4k, 12, 0, 144, ERR_FORMAT);
    expect_tensor_err(1, q40, 2, 0, 36, ERR_FORMAT);
}

static void test_gguf_corrupt_bad_offsets(void **state) {
    (void)state;
    const uint64_t ne[1] = {8};  // f32: 32 bytes
    expect_tensor_err(1, ne, 0, 32, 64, 0);             // control: [32, 64) of 64
    expect_tensor_err(1, ne, 0, 1, 64, ERR_FORMAT);     // unaligned
    expect_tensor_err(1, ne, 0, 16, 64, ERR_FORMAT);    // unaligned
    expect_tensor_err(1, ne, 0, 64, 64, ERR_FORMAT);    // starts at the end
    expect_tensor_err(1, ne, 0, 32, 63, ERR_FORMAT);    // one byte short
    expect_tensor_err(1, ne, 0, (uint64_t)1 << 20, 64, ERR_FORMAT);
    expect_tensor_err(1, ne, 0, UINT64_MAX & ~(uint64_t)31, 64, ERR_FORMAT);  // offset+size wraps
    expect_tensor_err(1, ne, 0, ((uint64_t)1 << 63), 64, ERR_FORMAT);
}

static void test_gguf_corrupt_duplicate_tensor_names(void **state) {
    (void)state;
    struct gguf_builder *b = gguf_builder_create(3);
    const int64_t ne[1] = {8};
    gguf_builder_tensor(b, "w", 1, ne, 0, NULL, 32);
    gguf_builder_tensor(b, "v", 1, ne, 0, NULL, 32);
    gguf_builder_tensor(b, "w", 1, ne, 0, NULL, 32);
    expect_err(b, ERR_FORMAT);
}

/* ---- random mutations ------------------------------------------------- */

static uint64_t rng_next(uint64_t *s) {  // xorshift64*
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return *s * 0x2545f4914f6cdd1dull;
}

static bool in_range(const void *p, uint64_t n, const uint8_t *base, size_t size) {
    const uint8_t *q = p;
    return q >= base && q <= base + size && n <= (uint64_t)(base + size - q);
}

/* Reads everything an opened file exposes; returns NULL or what is wrong. */
static const char *check_opened(const struct gguf_file *f, const uint8_t *base, size_t size) {
    unsigned sum = 0;
    char key[256];
    for (int64_t i = 0; i < gguf_n_kv(f); i++) {
        const struct gguf_kv *kv = gguf_kv_at(f, i);
        if (!in_range(kv->key.data, kv->key.len, base, size)) return "key outside the file";
        gguf_str_copy(kv->key, key, sizeof(key));
        uint32_t u;
        int64_t v;
        float x;
        bool bv;
        struct gguf_str s;
        (void)gguf_get_u32(f, key, &u);
        (void)gguf_get_i64(f, key, &v);
        (void)gguf_get_f32(f, key, &x);
        (void)gguf_get_bool(f, key, &bv);
        if (gguf_get_str(f, key, &s) == 0) {
            if (!in_range(s.data, s.len, base, size)) return "string outside the file";
            for (uint64_t k = 0; k < s.len; k++) sum += (unsigned char)s.data[k];
        }
        if (kv->type != GGUF_TYPE_ARRAY || kv->arr_n == 0) continue;
        switch (kv->arr_type) {
        case GGUF_TYPE_STRING:
            for (uint64_t j = 0; j < kv->arr_n; j++) {
                if (!in_range(kv->strs[j].data, kv->strs[j].len, base, size)) {
                    return "array string outside the file";
                }
                for (uint64_t k = 0; k < kv->strs[j].len; k++) {
                    sum += (unsigned char)kv->strs[j].data[k];
                }
            }
            break;
        case GGUF_TYPE_FLOAT32:
            sum += (unsigned)(gguf_arr_f32(kv, 0) != gguf_arr_f32(kv, kv->arr_n - 1));
            break;
        case GGUF_TYPE_INT32:
            sum += (unsigned)(gguf_arr_i32(kv, 0) + gguf_arr_i32(kv, kv->arr_n - 1));
            break;
        case GGUF_TYPE_UINT32:
            sum += gguf_arr_u32(kv, 0) + gguf_arr_u32(kv, kv->arr_n - 1);
            break;
        case GGUF_TYPE_UINT8:
        case GGUF_TYPE_INT8:
        case GGUF_TYPE_BOOL:
            if (!in_range(kv->data, kv->arr_n, base, size)) return "array outside the file";
            sum += kv->data[kv->arr_n - 1];
            break;
        case GGUF_TYPE_UINT16:
        case GGUF_TYPE_INT16:
        case GGUF_TYPE_UINT64:
        case GGUF_TYPE_INT64:
        case GGUF_TYPE_FLOAT64:
        case GGUF_TYPE_ARRAY:
        case GGUF_TYPE_COUNT:
            if (!in_range(kv->data, 0, base, size)) return "array outside the file";
            break;
        }
    }
    char name[256];
    for (int64_t i = 0; i < gguf_n_tensors(f); i++) {
        const struct gguf_tensor_info *t = gguf_tensor_at(f, i);
        if (!in_range(t->name.data, t->name.len, base, size)) return "tensor name outside file";
        if (!in_range(t->data, t->nbytes, base, size)) return "tensor data outside the file";
        if (t->n_dims < 1 || t->n_dims > GGUF_MAX_DIMS) return "bad n_dims accepted";
        for (int d = 0; d < GGUF_MAX_DIMS; d++) {
            if (t->ne[d] < 0) return "negative ne accepted";
        }
        const struct gguf_tensor_info *t0 = gguf_tensor_at(f, 0);
        const uint8_t *data_start = (const uint8_t *)t0->data - t0->offset;
        if (t->offset % gguf_alignment(f) || (const uint8_t *)t->data != data_start + t->offset) {
            return "tensor data not at its aligned offset";
        }
        const uint8_t *p = t->data;
        if (t->nbytes) sum += p[0] + p[t->nbytes - 1];
        gguf_str_copy(t->name, name, sizeof(name));
        (void)gguf_find_tensor(f, name);
    }
    (void)sum;
    return NULL;
}

static void test_gguf_corrupt_random_mutations_never_crash(void **state) {
    (void)state;
    size_t size;
    uint8_t *valid = build_valid(&size);
    const uint64_t u32s[] = {0, 1, 2, 3, 4, 5, 8, 9, 12, 13, 31, 32, 33, 64, 0x7fffffff,
                             0x80000000u, 0xffffffffu};
    const uint64_t u64s[] = {0, 1, 2, 255, 0x7fffffff, (uint64_t)1 << 32, (uint64_t)INT64_MAX,
                             (uint64_t)1 << 63, UINT64_MAX, UINT64_MAX - 7, (uint64_t)1 << 60};
    uint64_t rng = MUTATION_SEED;
    int n_opened = 0;
    int q = quiet_begin();
    for (int round = 0; round < MUTATION_ROUNDS; round++) {
        uint8_t *m = malloc(size);
        assert_non_null(m);
        memcpy(m, valid, size);
        size_t len = size;
        int kind = (int)(rng_next(&rng) % 6);
        size_t pos = (size_t)(rng_next(&rng) % size);
        uint64_t r = rng_next(&rng);
        switch (kind) {
        case 0:  // one random byte
            m[pos] = (uint8_t)r;
            break;
        case 1:  // one bit
            m[pos] ^= (uint8_t)(1u << (r % 8));
            break;
        case 2: {  // an interesting u32 anywhere
            uint32_t v = (uint32_t)(r & 1 ? u32s[(r >> 1) % (sizeof(u32s) / 8)] : r >> 32);
            if (pos + 4 > size) pos = size - 4;
            memcpy(m + pos, &v, 4);
            break;
        }
        case 3: {  // an interesting u64 anywhere
            uint64_t v = r & 1 ? u64s[(r >> 1) % (sizeof(u64s) / 8)] : (r >> 1) % (2 * size);
            if (pos + 8 > size) pos = size - 8;
            memcpy(m + pos, &v, 8);
            break;
        }
        case 4:  // a few random bytes
            for (int k = 0; k < 4; k++) m[rng_next(&rng) % size] = (uint8_t)rng_next(&rng);
            break;
        default:  // one random byte, then a truncation
            m[pos] = (uint8_t)r;
            len = (size_t)(rng_next(&rng) % size);
            break;
        }
        struct gguf_file *f = NULL;
        int rc = gguf_open_memory(m, len, "mutant", &f);
        const char *problem = NULL;
        if (rc == 0) {
            n_opened++;
            problem = check_opened(f, m, len);
            gguf_close(f);
        } else if (rc != ERR_FORMAT && rc != ERR_UNSUPPORTED) {
            problem = err_name(rc);
        }
        free(m);
        if (problem) {
            quiet_end(q);
            print_message("seed=%#llx round=%d kind=%d pos=%zu: %s\n",
                          (unsigned long long)MUTATION_SEED, round, kind, pos, problem);
            fail();
        }
    }
    quiet_end(q);
    print_message("%d of %d mutants opened and were read safely\n", n_opened, MUTATION_ROUNDS);
    free(valid);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gguf_corrupt_base_file_is_valid),
        cmocka_unit_test(test_gguf_corrupt_truncated_at_every_offset),
        cmocka_unit_test(test_gguf_corrupt_bad_magic),
        cmocka_unit_test(test_gguf_corrupt_unsupported_versions),
        cmocka_unit_test(test_gguf_corrupt_absurd_header_counts),
        cmocka_unit_test(test_gguf_corrupt_huge_array_counts),
        cmocka_unit_test(test_gguf_corrupt_huge_string_lengths),
        cmocka_unit_test(test_gguf_corrupt_invalid_value_types),
        cmocka_unit_test(test_gguf_corrupt_deep_nesting_is_an_error),
        cmocka_unit_test(test_gguf_corrupt_duplicate_keys),
        cmocka_unit_test(test_gguf_corrupt_tensor_dims),
        cmocka_unit_test(test_gguf_corrupt_element_count_overflow),
        cmocka_unit_test(test_gguf_corrupt_unknown_tensor_types),
        cmocka_unit_test(test_gguf_corrupt_rows_not_a_multiple_of_the_block),
        cmocka_unit_test(test_gguf_corrupt_bad_offsets),
        cmocka_unit_test(test_gguf_corrupt_duplicate_tensor_names),
        cmocka_unit_test(test_gguf_corrupt_random_mutations_never_crash),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
