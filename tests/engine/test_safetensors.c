/*
 * test_safetensors.c - the safetensors reader (engine/safetensors.c) on valid
 * files and on hostile ones: truncations at every offset, impossible header
 * lengths, malformed and inconsistent JSON headers, dtypes, shapes whose
 * products would wrap, offsets outside the data section, holes and overlaps,
 * and a seeded random-mutation loop. Each case must fail with the specified
 * code (mutations: any code) and never crash or trip ASan/UBSan; a mutated
 * file that still opens must be safe to read in full.
 *
 * Every input is a malloc'd copy of exactly its size, so ASan sees a read one
 * byte past the end. The expected results come from the format's description
 * (github.com/huggingface/safetensors, "Format") and engine/safetensors.h.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/base/err.h"
#include "engine/base/log.h"
#include "engine/format/quant.h"
#include "engine/format/safetensors.h"
#include "tests/helpers/safetensors_builder.h"
#include "tests/helpers/testutil.h"

#define MUTATION_SEED 0x2545f4914f6cdd1dull
#define MUTATION_ROUNDS 4000

static int quiet_begin(void) {
    int fd = open("/dev/null", O_WRONLY | O_CLOEXEC);
    if (fd >= 0) log_set_fd(fd);
    return fd;
}

static void quiet_end(int fd) {
    log_set_fd(2);
    if (fd >= 0) close(fd);
}

/* Reads every tensor of an open file in full (ASan checks the views). */
static void read_all(const struct safetensors_file *f) {
    for (int64_t i = 0; i < safetensors_n_tensors(f); i++) {
        const struct safetensors_tensor *t = safetensors_tensor_at(f, i);
        assert_ptr_equal(safetensors_find(f, t->name), t);
        float *dst = malloc((size_t)(t->n_elements ? t->n_elements : 1) * sizeof(float));
        assert_non_null(dst);
        safetensors_to_f32(t, dst);
        free(dst);
    }
}

/* Opens an exact-size heap copy of data[0..size) and returns the code. */
static int open_copy(const uint8_t *data, size_t size) {
    uint8_t *copy = malloc(size ? size : 1);
    assert_non_null(copy);
    if (size) memcpy(copy, data, size);
    struct safetensors_file *f = (struct safetensors_file *)1;
    int rc = safetensors_open_memory(size ? copy : NULL, size, "corrupt", &f);
    if (rc == 0) {
        assert_non_null(f);
        read_all(f);
        safetensors_close(f);
    } else {
        assert_null(f);
    }
    free(copy);
    return rc;
}

static void expect_bytes(const uint8_t *bytes, size_t n, int want, const char *what) {
    int rc = open_copy(bytes, n);
    if (rc != want) fail_msg("%s: got %s, want %s", what, err_name(rc), err_name(want));
}

/* Builds and expects. */
static void expect(struct safetensors_builder *b, int want, const char *what) {
    size_t n = 0;
    uint8_t *bytes = safetensors_builder_finish(b, &n);
    expect_bytes(bytes, n, want, what);
    free(bytes);
    safetensors_builder_destroy(b);
}

/* A header text over `data_len` pattern bytes of data. */
static void expect_header(const char *header, size_t data_len, int want, const char *what) {
    struct safetensors_builder *b = safetensors_builder_create();
    if (data_len) {
        int64_t shape[1] = {(int64_t)data_len};
        safetensors_builder_tensor(b, "pad", "U8", 1, shape, NULL, data_len);
    }
    safetensors_builder_header(b, header);
    expect(b, want, what);
}

/* Three tensors of the three dtypes, metadata, known values. */
static uint8_t *build_valid(size_t *out_n) {
    struct safetensors_builder *b = safetensors_builder_create();
    float a[6] = {1.0f, -2.0f, 3.5f, 0.25f, -0.0f, 1e-3f};
    safetensors_builder_f32(b, "a", 2, 3, a);
    uint16_t h[4];
    uint16_t bf[3];
    const float hv[4] = {0.5f, -1.0f, 2.0f, 65504.0f};
    const float bv[3] = {1.0f, -3.0f, 0.15625f};
    for (int i = 0; i < 4; i++) h[i] = quant_f32_to_f16(hv[i]);
    for (int i = 0; i < 3; i++) bf[i] = quant_f32_to_bf16(bv[i]);
    int64_t sh[2] = {2, 2};
    safetensors_builder_tensor(b, "layers.0.h", "F16", 2, sh, h, sizeof(h));
    int64_t sb[1] = {3};
    safetensors_builder_tensor(b, "b", "BF16", 1, sb, bf, sizeof(bf));
    safetensors_builder_metadata(b, "format", "pt");
    uint8_t *bytes = safetensors_builder_finish(b, out_n);
    safetensors_builder_destroy(b);
    return bytes;
}

static void test_safetensors_reads_a_valid_file(void **state) {
    (void)state;
    size_t n = 0;
    uint8_t *bytes = build_valid(&n);
    struct safetensors_file *f = NULL;
    assert_int_equal(safetensors_open_memory(bytes, n, "valid", &f), 0);
    assert_string_equal(safetensors_name(f), "valid");
    assert_int_equal(safetensors_n_tensors(f), 3);
    const struct safetensors_tensor *a = safetensors_tensor_at(f, 0);
    assert_string_equal(a->name, "a");  // header order
    assert_int_equal(a->dtype, SAFETENSORS_DTYPE_F32);
    assert_int_equal(a->n_dims, 2);
    assert_int_equal(a->shape[0], 2);
    assert_int_equal(a->shape[1], 3);
    assert_int_equal(a->n_elements, 6);
    assert_int_equal(a->nbytes, 24);
    float v[6];
    safetensors_to_f32(a, v);
    assert_true(v[0] == 1.0f && v[2] == 3.5f && v[5] == 1e-3f && signbit(v[4]));
    const struct safetensors_tensor *h = safetensors_find(f, "layers.0.h");
    assert_non_null(h);
    assert_int_equal(h->dtype, SAFETENSORS_DTYPE_F16);
    safetensors_to_f32(h, v);
    assert_true(v[0] == 0.5f && v[1] == -1.0f && v[2] == 2.0f && v[3] == 65504.0f);
    const struct safetensors_tensor *b = safetensors_find(f, "b");
    assert_int_equal(b->dtype, SAFETENSORS_DTYPE_BF16);
    assert_int_equal(b->n_dims, 1);
    safetensors_to_f32(b, v);
    assert_true(v[0] == 1.0f && v[1] == -3.0f && v[2] == 0.15625f);
    assert_null(safetensors_find(f, "nope"));
    assert_string_equal(safetensors_metadata(f, "format"), "pt");
    assert_null(safetensors_metadata(f, "other"));
    assert_string_equal(safetensors_dtype_name(SAFETENSORS_DTYPE_BF16), "BF16");
    safetensors_close(f);
    safetensors_close(NULL);

    // The same bytes from a file.
    char path[4096];
    snprintf(path, sizeof(path), "%s/tests/engine/valid.safetensors", testutil_build_dir());
    assert_int_equal(safetensors_builder_write_file(path, bytes, n), 0);
    assert_int_equal(safetensors_open(path, &f), 0);
    assert_int_equal(safetensors_n_tensors(f), 3);
    assert_string_equal(safetensors_name(f), path);
    safetensors_close(f);
    unlink(path);
    int q = quiet_begin();
    f = (struct safetensors_file *)1;
    assert_int_equal(safetensors_open("/nonexistent/x.safetensors", &f), ERR_IO);
    assert_null(f);
    quiet_end(q);
    free(bytes);
}

static void test_safetensors_scalars_and_empty_tensors(void **state) {
    (void)state;
    struct safetensors_builder *b = safetensors_builder_create();
    float one = 7.0f;
    safetensors_builder_tensor(b, "scalar", "F32", 0, NULL, &one, 4);
    int64_t sh[2] = {0, 4};
    safetensors_builder_tensor(b, "empty", "F16", 2, sh, NULL, 0);
    size_t n = 0;
    uint8_t *bytes = safetensors_builder_finish(b, &n);
    struct safetensors_file *f = NULL;
    assert_int_equal(safetensors_open_memory(bytes, n, "x", &f), 0);
    const struct safetensors_tensor *s = safetensors_find(f, "scalar");
    assert_int_equal(s->n_dims, 0);
    assert_int_equal(s->n_elements, 1);
    float v = 0;
    safetensors_to_f32(s, &v);
    assert_true(v == 7.0f);
    const struct safetensors_tensor *e = safetensors_find(f, "empty");
    assert_int_equal(e->n_elements, 0);
    assert_int_equal(e->nbytes, 0);
    safetensors_close(f);
    free(bytes);
    safetensors_builder_destroy(b);

    // No tensors at all ("{}"), with or without metadata.
    expect_header("{}", 0, 0, "empty header");
    expect_header("{\"__metadata__\":{\"a\":\"b\"}}", 0, 0, "metadata only");
}

static void test_safetensors_rejects_bad_lengths(void **state) {
    (void)state;
    int q = quiet_begin();
    uint8_t small[8] = {2, 0, 0, 0, 0, 0, 0, 0};
    expect_bytes(NULL, 0, ERR_FORMAT, "empty file");
    expect_bytes(small, 7, ERR_FORMAT, "7 bytes");
    expect_bytes(small, 8, ERR_FORMAT, "length 2, no header bytes");
    uint8_t file[16] = {0};
    memcpy(file + 8, "{}      ", 8);
    const uint64_t lens[] = {0, 1, 9, 1ull << 40, UINT64_MAX, (100ull << 20) + 1};
    for (size_t i = 0; i < sizeof(lens) / sizeof(lens[0]); i++) {
        for (int k = 0; k < 8; k++) file[k] = (uint8_t)(lens[i] >> (8 * k));
        expect_bytes(file, sizeof(file), ERR_FORMAT, "impossible header length");
    }
    quiet_end(q);
}

static void test_safetensors_rejects_bad_headers(void **state) {
    (void)state;
    int q = quiet_begin();
    const struct {
        const char *header;
        size_t data;
        int err;
    } cases[] = {
        {"not json", 0, ERR_FORMAT},
        {"[1,2]", 0, ERR_FORMAT},
        {"{\"a\":", 0, ERR_FORMAT},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
         "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8, ERR_FORMAT},
        {"{\"a\":5}", 0, ERR_FORMAT},
        {"{\"a\":{\"shape\":[1],\"data_offsets\":[0,4]}}", 4, ERR_FORMAT},
        {"{\"a\":{\"dtype\":4,\"shape\":[1],\"data_offsets\":[0,4]}}", 4, ERR_FORMAT},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":1,\"data_offsets\":[0,4]}}", 4, ERR_FORMAT},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0]}}", 4, ERR_FORMAT},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4,8]}}", 8, ERR_FORMAT},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[-4,0]}}", 4, ERR_FORMAT},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,0]}}", 4, ERR_FORMAT},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,8]}}", 4, ERR_FORMAT},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,\"4\"]}}", 4, ERR_FORMAT},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,1e3]}}", 4, ERR_FORMAT},
        {"{\"a\":{\"dtype\":\"F33\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, ERR_FORMAT},
        {"{\"a\":{\"dtype\":\"F64\",\"shape\":[1],\"data_offsets\":[0,8]}}", 8, ERR_UNSUPPORTED},
        {"{\"a\":{\"dtype\":\"I8\",\"shape\":[4],\"data_offsets\":[0,4]}}", 4, ERR_UNSUPPORTED},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", 4, ERR_FORMAT},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1.5],\"data_offsets\":[0,4]}}", 4, ERR_FORMAT},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1],\"data_offsets\":[0,4]}}", 4, ERR_FORMAT},
        // products that wrap 64 bits if multiplied naively: 2^32 * 2^32 * 4 bytes
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296],\"data_offsets\":[0,0]}}", 0,
         ERR_FORMAT},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[4611686018427387904,4],\"data_offsets\":[0,0]}}", 0,
         ERR_FORMAT},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[9223372036854775807,0],\"data_offsets\":[0,0]}}", 0,
         0},  // zero elements: valid
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,4]}}", 4, ERR_FORMAT},
        {"{\"a\":{\"dtype\":\"F16\",\"shape\":[3],\"data_offsets\":[0,8]}}", 8, ERR_FORMAT},
        // tiling: a hole, an overlap, bytes after the last tensor, data without tensors
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
         "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,12]}}", 12, ERR_FORMAT},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
         "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8, ERR_FORMAT},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 8, ERR_FORMAT},
        {"{}", 4, ERR_FORMAT},
        // tensors in any offset order are fine when they tile
        {"{\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]},"
         "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 8, 0},
        {"{\"__metadata__\":[1]}", 0, ERR_FORMAT},
        {"{\"__metadata__\":{\"a\":1}}", 0, ERR_FORMAT},
        {"{\"a\\u0000b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, ERR_FORMAT},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char what[64];
        snprintf(what, sizeof(what), "header case %zu", i);
        expect_header(cases[i].header, cases[i].data, cases[i].err, what);
    }
    quiet_end(q);
}

static void test_safetensors_truncated_at_every_offset(void **state) {
    (void)state;
    size_t n = 0;
    uint8_t *bytes = build_valid(&n);
    int q = quiet_begin();
    for (size_t cut = 0; cut < n; cut++) {
        // The header or the data section loses a byte a tensor needs.
        if (open_copy(bytes, cut) != ERR_FORMAT) fail_msg("cut at %zu of %zu opened", cut, n);
    }
    quiet_end(q);
    assert_int_equal(open_copy(bytes, n), 0);
    free(bytes);
}

static void test_safetensors_random_mutations_never_crash(void **state) {
    (void)state;
    size_t n = 0;
    uint8_t *bytes = build_valid(&n);
    uint8_t *m = malloc(n);
    assert_non_null(m);
    uint64_t s = MUTATION_SEED;
    int n_opened = 0;
    int q = quiet_begin();
    for (int round = 0; round < MUTATION_ROUNDS; round++) {
        memcpy(m, bytes, n);
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        const int n_flips = 1 + (int)(s % 4);
        for (int k = 0; k < n_flips; k++) {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            // Mostly the header (where the structure is), sometimes anywhere.
            size_t at = (s >> 8) % (k == 0 && round % 4 ? (n < 120 ? n : 120) : n);
            static const uint8_t digits[] = "0123456789[]{},:\"-eE. ";
            m[at] = round % 3 == 0 ? digits[(s >> 20) % (sizeof(digits) - 1)] : (uint8_t)(s >> 32);
        }
        const int rc = open_copy(m, n);
        if (rc == 0) n_opened++;
        if (rc != 0 && rc != ERR_FORMAT && rc != ERR_UNSUPPORTED) {
            fail_msg("round %d (seed %llx): unexpected %s", round,
                     (unsigned long long)MUTATION_SEED, err_name(rc));
        }
    }
    quiet_end(q);
    print_message("mutations: %d of %d still opened (and were read in full)\n", n_opened,
                  MUTATION_ROUNDS);
    free(m);
    free(bytes);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_safetensors_reads_a_valid_file),
        cmocka_unit_test(test_safetensors_scalars_and_empty_tensors),
        cmocka_unit_test(test_safetensors_rejects_bad_lengths),
        cmocka_unit_test(test_safetensors_rejects_bad_headers),
        cmocka_unit_test(test_safetensors_truncated_at_every_offset),
        cmocka_unit_test(test_safetensors_random_mutations_never_crash),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
