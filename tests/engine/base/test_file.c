/*
 * test_file.c - whole-file mappings, file_read_all and its limit, and the
 * bounds-checked cursor. Files live in a fresh directory under $TMPDIR (or
 * /tmp), removed at the end.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/base/err.h"
#include "engine/base/file.h"

struct tmp {
    char dir[1024];
    char path[2048];  // the last file made by tmp_file
};

static int setup(void **state) {
    struct tmp *t = calloc(1, sizeof(*t));
    if (!t) return -1;
    const char *base = getenv("TMPDIR");
    snprintf(t->dir, sizeof(t->dir), "%s/llmserve-file-XXXXXX", base && *base ? base : "/tmp");
    if (!mkdtemp(t->dir)) {
        free(t);
        return -1;
    }
    *state = t;
    return 0;
}

static int teardown(void **state) {
    struct tmp *t = *state;
    rmdir(t->dir);  // each test unlinks its files
    free(t);
    return 0;
}

/* Writes n bytes to dir/name and returns its path (t->path). */
static const char *tmp_file(struct tmp *t, const char *name, const void *data, size_t n) {
    snprintf(t->path, sizeof(t->path), "%s/%s", t->dir, name);
    FILE *fp = fopen(t->path, "wb");
    assert_non_null(fp);
    if (n) assert_int_equal(fwrite(data, 1, n, fp), n);
    assert_int_equal(fclose(fp), 0);
    return t->path;
}

static void test_file_map_reads_a_file(void **state) {
    struct tmp *t = *state;
    const char *p = tmp_file(t, "a.bin", "hello\0world", 11);
    struct file_map m;
    assert_int_equal(file_map(p, &m), 0);
    assert_int_equal(m.size, 11);
    assert_memory_equal(m.data, "hello\0world", 11);
    file_unmap(&m);
    assert_null(m.data);
    assert_int_equal(m.size, 0);
    file_unmap(&m);  // twice is fine
    struct file_map z = {0};
    file_unmap(&z);  // so is a zeroed one
    unlink(p);
}

/* The bytes stay as read when the file is truncated or rewritten afterwards
 * (a mapping of the file would raise SIGBUS on a truncated page). */
static void test_file_map_survives_truncation(void **state) {
    struct tmp *t = *state;
    enum { N = 3 * 4096 + 5 };  // pages and a partial one
    uint8_t *bytes = malloc(N);
    assert_non_null(bytes);
    for (size_t i = 0; i < N; i++) bytes[i] = (uint8_t)(i * 7 + 1);
    const char *p = tmp_file(t, "t.bin", bytes, N);
    struct file_map m;
    assert_int_equal(file_map(p, &m), 0);
    assert_int_equal(m.size, N);
    assert_int_equal(truncate(p, 0), 0);
    assert_memory_equal(m.data, bytes, N);
    tmp_file(t, "t.bin", "other", 5);  // rewritten in place
    assert_memory_equal(m.data, bytes, N);
    file_unmap(&m);
    free(bytes);
    unlink(p);
}

static void test_file_map_missing_is_io(void **state) {
    struct tmp *t = *state;
    char p[2048];
    snprintf(p, sizeof(p), "%s/does-not-exist", t->dir);
    struct file_map m = {(const uint8_t *)"x", 1};
    assert_int_equal(file_map(p, &m), ERR_IO);
    assert_null(m.data);
    assert_int_equal(m.size, 0);
}

static void test_file_map_directory_is_format(void **state) {
    struct tmp *t = *state;
    struct file_map m;
    assert_int_equal(file_map(t->dir, &m), ERR_FORMAT);
    assert_null(m.data);
}

static void test_file_map_empty_file(void **state) {
    struct tmp *t = *state;
    const char *p = tmp_file(t, "empty", NULL, 0);
    struct file_map m;
    assert_int_equal(file_map(p, &m), 0);
    assert_null(m.data);
    assert_int_equal(m.size, 0);
    file_unmap(&m);
    unlink(p);
}

static void test_file_read_all_respects_the_limit(void **state) {
    struct tmp *t = *state;
    const char *p = tmp_file(t, "r.txt", "0123456789", 10);
    char *out = NULL;
    size_t len = 0;
    assert_int_equal(file_read_all(p, 10, &out, &len), 0);  // exactly at the limit
    assert_int_equal(len, 10);
    assert_string_equal(out, "0123456789");  // NUL-terminated
    free(out);
    out = (char *)p;
    len = 99;
    assert_int_equal(file_read_all(p, 9, &out, &len), ERR_TOOLONG);
    assert_null(out);
    assert_int_equal(len, 0);
    assert_int_equal(file_read_all(p, 0, &out, NULL), ERR_TOOLONG);
    assert_int_equal(file_read_all(p, SIZE_MAX, &out, NULL), 0);  // out_len may be NULL
    assert_string_equal(out, "0123456789");
    free(out);
    unlink(p);

    p = tmp_file(t, "e.txt", NULL, 0);
    assert_int_equal(file_read_all(p, 0, &out, &len), 0);
    assert_non_null(out);
    assert_string_equal(out, "");
    assert_int_equal(len, 0);
    free(out);
    unlink(p);

    assert_int_equal(file_read_all(p, 100, &out, &len), ERR_IO);  // gone now
    assert_null(out);
    assert_int_equal(file_read_all(t->dir, 100, &out, &len), ERR_FORMAT);
    assert_null(out);
}

static void test_file_cursor_reads_little_endian_values(void **state) {
    (void)state;
    const uint8_t bytes[] = {0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07,
                             0x08, 0x09, 0x0a, 0x0b, 0x0c, 0x0d, 0x0e, 0x0f};
    struct file_cursor c;
    file_cursor_init(&c, bytes, sizeof(bytes));
    assert_int_equal(file_cursor_left(&c), 15);
    uint8_t u8;
    uint16_t u16;
    uint32_t u32;
    uint64_t u64;
    assert_int_equal(file_cursor_u8(&c, &u8), 0);
    assert_int_equal(u8, 0x01);
    assert_int_equal(file_cursor_u16(&c, &u16), 0);
    assert_int_equal(u16, 0x0302);
    assert_int_equal(file_cursor_u32(&c, &u32), 0);
    assert_int_equal(u32, 0x07060504);
    assert_int_equal(file_cursor_u64(&c, &u64), 0);
    assert_true(u64 == 0x0f0e0d0c0b0a0908ull);
    assert_int_equal(file_cursor_left(&c), 0);
    assert_int_equal(c.pos, 15);
}

static void test_file_cursor_refuses_reads_past_the_end(void **state) {
    (void)state;
    const uint8_t bytes[7] = {1, 2, 3, 4, 5, 6, 7};
    struct file_cursor c;
    file_cursor_init(&c, bytes, sizeof(bytes));
    uint64_t u64 = 42;
    assert_int_equal(file_cursor_u64(&c, &u64), ERR_FORMAT);  // 7 < 8
    assert_true(u64 == 42);   // untouched
    assert_int_equal(c.pos, 0);  // cursor unchanged
    uint32_t u32;
    assert_int_equal(file_cursor_u32(&c, &u32), 0);
    assert_int_equal(file_cursor_u32(&c, &u32), ERR_FORMAT);  // 3 left
    assert_int_equal(c.pos, 4);
    uint16_t u16;
    assert_int_equal(file_cursor_u16(&c, &u16), 0);
    assert_int_equal(file_cursor_u16(&c, &u16), ERR_FORMAT);  // 1 left
    const uint8_t *p = NULL;
    assert_int_equal(file_cursor_bytes(&c, 2, &p), ERR_FORMAT);
    assert_null(p);
    assert_int_equal(file_cursor_bytes(&c, UINT64_MAX, &p), ERR_FORMAT);
    assert_int_equal(file_cursor_skip(&c, UINT64_MAX), ERR_FORMAT);
    assert_int_equal(file_cursor_skip(&c, ((uint64_t)1 << 63) + 1), ERR_FORMAT);
    assert_int_equal(c.pos, 6);
    assert_int_equal(file_cursor_bytes(&c, 1, &p), 0);
    assert_ptr_equal(p, bytes + 6);
    assert_int_equal(*p, 7);
    uint8_t u8 = 9;
    assert_int_equal(file_cursor_u8(&c, &u8), ERR_FORMAT);  // at the end
    assert_int_equal(u8, 9);
    assert_int_equal(file_cursor_bytes(&c, 0, &p), 0);       // empty reads at the end are fine
    assert_ptr_equal(p, bytes + 7);
    assert_int_equal(file_cursor_skip(&c, 0), 0);
    assert_int_equal(file_cursor_skip(&c, 1), ERR_FORMAT);
    assert_int_equal(file_cursor_left(&c), 0);
}

static void test_file_cursor_skip_and_bytes(void **state) {
    (void)state;
    const char text[] = "abcdefghij";
    struct file_cursor c;
    file_cursor_init(&c, text, 10);
    assert_int_equal(file_cursor_skip(&c, 3), 0);
    const uint8_t *p;
    assert_int_equal(file_cursor_bytes(&c, 4, &p), 0);
    assert_memory_equal(p, "defg", 4);
    assert_int_equal(file_cursor_left(&c), 3);
    assert_int_equal(file_cursor_skip(&c, 3), 0);
    assert_int_equal(file_cursor_left(&c), 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_file_map_reads_a_file),
        cmocka_unit_test(test_file_map_survives_truncation),
        cmocka_unit_test(test_file_map_missing_is_io),
        cmocka_unit_test(test_file_map_directory_is_format),
        cmocka_unit_test(test_file_map_empty_file),
        cmocka_unit_test(test_file_read_all_respects_the_limit),
        cmocka_unit_test(test_file_cursor_reads_little_endian_values),
        cmocka_unit_test(test_file_cursor_refuses_reads_past_the_end),
        cmocka_unit_test(test_file_cursor_skip_and_bytes),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
