/*
 * test_file.c - whole-file mappings, file_read_all and its limit, files read
 * range by range (file_sparse: the bytes read equal the file's, the others
 * are zero and not resident, by mincore), and the bounds-checked cursor,
 * also filling itself from a sparse file. Files live in a fresh directory under $TMPDIR (or
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
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine/base/err.h"
#include "engine/base/file.h"
#include "tests/helpers/testutil.h"

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

/* A FIFO with no writer: opening it for reading would wait for one (POSIX
 * open()); file_map and file_sparse_open must refuse it as not a regular
 * file at once. alarm() turns a hang into a failure (SIGALRM ends the test). */
static void test_file_fifo_is_format_without_waiting(void **state) {
    struct tmp *t = *state;
    char p[2048];
    snprintf(p, sizeof(p), "%s/fifo", t->dir);
    assert_int_equal(mkfifo(p, 0600), 0);
    alarm(10);
    struct file_map m;
    assert_int_equal(file_map(p, &m), ERR_FORMAT);
    assert_null(m.data);
    struct file_sparse sp;
    assert_int_equal(file_sparse_open(p, &sp), ERR_FORMAT);
    alarm(0);
    unlink(p);
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

/* byte i of the pattern files: never 0, so a byte read is told from one not read */
static uint8_t pattern(size_t i) { return (uint8_t)(1 + i % 251); }

static const char *pattern_file(struct tmp *t, const char *name, size_t n) {
    uint8_t *b = malloc(n);
    assert_non_null(b);
    for (size_t i = 0; i < n; i++) b[i] = pattern(i);
    tmp_file(t, name, b, n);
    free(b);
    return t->path;
}


/* Eight pages; [page + 10, + 2 pages) read: those bytes are the file's, every
 * other is zero, and only the three pages the range touches are resident. */
static void test_file_sparse_reads_only_its_ranges(void **state) {
    struct tmp *t = *state;
    const size_t page = (size_t)sysconf(_SC_PAGESIZE);
    const size_t n = 8 * page;
    const char *path = pattern_file(t, "s.bin", n);
    struct file_sparse s;
    assert_int_equal(file_sparse_open(path, &s), 0);
    assert_int_equal(s.map.size, n);
    assert_int_equal(testutil_resident_pages(s.map.data, n), 0);
    const size_t off = page + 10, len = 2 * page;
    assert_int_equal(file_sparse_read(&s, off, len), 0);
    assert_int_equal(s.n_read, len);
    file_sparse_seal(&s);
    assert_int_equal(testutil_resident_pages(s.map.data, n), 3);  // pages 1, 2 and 3
    for (size_t i = page; i < 4 * page; i++) {
        const uint8_t want = i >= off && i < off + len ? pattern(i) : 0;
        if (s.map.data[i] != want) fail_msg("byte %zu: %u, want %u", i, s.map.data[i], want);
    }
    assert_int_equal(testutil_resident_pages(s.map.data, n), 3);  // reading zeros made none
    // sealed: nothing more is read
    assert_int_equal(file_sparse_read(&s, 0, 1), ERR_INVAL);
    file_sparse_close(&s);
    assert_null(s.map.data);
    file_sparse_close(&s);  // twice is safe
    unlink(path);
}

/* Reads of several MiB ask for 2 MiB pages (file.c, advise_huge), but only
 * over the whole 2 MiB pages inside a range: a 6 MiB file, its range [1 MiB +
 * 10, + 3 MiB) read, leaves exactly the 4 KiB pages that range touches
 * resident, and the bytes are the file's; file_sparse_will_read() commits
 * nothing by itself, clamps a range past the end, and the range it named
 * reads as the file's too. */
static void test_file_sparse_huge_pages_commit_only_what_is_read(void **state) {
    struct tmp *t = *state;
    const size_t page = (size_t)sysconf(_SC_PAGESIZE);
    const size_t mib = (size_t)1 << 20, n = 6 * mib;
    const char *path = pattern_file(t, "h.bin", n);
    struct file_sparse s;
    assert_int_equal(file_sparse_open(path, &s), 0);
    const size_t off = mib + 10, len = 3 * mib;
    assert_int_equal(file_sparse_read(&s, off, len), 0);
    const size_t first = off / page, last = (off + len - 1) / page;
    assert_int_equal(testutil_resident_pages(s.map.data, n), last - first + 1);
    assert_int_equal(testutil_resident_pages(s.map.data + first * page, (last - first + 1) * page),
                     last - first + 1);
    for (size_t i = off; i < off + len; i += 4099) assert_int_equal(s.map.data[i], pattern(i));
    file_sparse_will_read(&s, 5 * mib, SIZE_MAX);  // clamped to the end
    file_sparse_will_read(&s, n + 1, 10);          // past the end: nothing
    assert_int_equal(testutil_resident_pages(s.map.data, n), last - first + 1);
    assert_int_equal(file_sparse_read(&s, 5 * mib, mib), 0);
    for (size_t i = 5 * mib; i < n; i += 4099) assert_int_equal(s.map.data[i], pattern(i));
    assert_int_equal(s.map.data[n - 1], pattern(n - 1));
    file_sparse_close(&s);
    unlink(path);
}

/* Ranges outside the file are ERR_INVAL; a file that shrank after it was
 * opened is ERR_IO for bytes past its new end, and what was there reads. */
static void test_file_sparse_refuses_bad_ranges(void **state) {
    struct tmp *t = *state;
    const char *path = pattern_file(t, "r.bin", 1000);
    struct file_sparse s;
    assert_int_equal(file_sparse_open(path, &s), 0);
    assert_int_equal(file_sparse_read(&s, 1000, 0), 0);
    assert_int_equal(file_sparse_read(&s, 1000, 1), ERR_INVAL);
    assert_int_equal(file_sparse_read(&s, 999, 2), ERR_INVAL);
    assert_int_equal(file_sparse_read(&s, SIZE_MAX, 2), ERR_INVAL);
    assert_int_equal(file_sparse_read(&s, 1, SIZE_MAX), ERR_INVAL);
    assert_int_equal(truncate(path, 500), 0);
    assert_int_equal(file_sparse_read(&s, 400, 200), ERR_IO);
    assert_int_equal(file_sparse_read(&s, 100, 400), 0);
    assert_int_equal(s.map.data[100], pattern(100));
    assert_int_equal(s.map.data[499], pattern(499));
    file_sparse_close(&s);
    unlink(path);
    assert_int_equal(file_sparse_open(path, &s), ERR_IO);  // gone
    assert_int_equal(file_sparse_open(t->dir, &s), ERR_FORMAT);  // a directory
}

/* A cursor over a sparse file of 200000 bytes reads in chunks of 64 KiB, then
 * double what is there (by hand: 65536, then up to 131072, then the rest),
 * so it reads the file once however it moves; values are the file's. */
static void test_file_cursor_fills_from_a_sparse_file(void **state) {
    struct tmp *t = *state;
    const size_t n = 200000;
    const char *path = pattern_file(t, "c.bin", n);
    struct file_sparse s;
    assert_int_equal(file_sparse_open(path, &s), 0);
    struct file_cursor c;
    file_cursor_init_sparse(&c, &s);
    assert_int_equal(s.n_read, 0);
    uint8_t b;
    assert_int_equal(file_cursor_u8(&c, &b), 0);
    assert_int_equal(b, pattern(0));
    assert_int_equal(s.n_read, 65536);
    assert_int_equal(file_cursor_skip(&c, 65535 - 1), 0);  // to 65535: still the first chunk
    assert_int_equal(s.n_read, 65536);
    uint16_t u;
    assert_int_equal(file_cursor_u16(&c, &u), 0);  // bytes 65535, 65536: the second chunk
    assert_int_equal(u, pattern(65535) | pattern(65536) << 8);
    assert_int_equal(s.n_read, 131072);
    const uint8_t *v;
    assert_int_equal(file_cursor_bytes(&c, 100000, &v), 0);  // to 165537: the rest
    assert_int_equal(v[0], pattern(65537));
    assert_int_equal(v[99999], pattern(165536));
    assert_int_equal(s.n_read, n);
    assert_int_equal(file_cursor_skip(&c, n - c.pos + 1), ERR_FORMAT);
    assert_int_equal(file_cursor_skip(&c, n - c.pos), 0);
    assert_int_equal(s.n_read, n);
    file_sparse_close(&s);
    // a file that shrinks under the cursor: ERR_FORMAT, as a short region
    path = pattern_file(t, "c.bin", n);
    assert_int_equal(file_sparse_open(path, &s), 0);
    file_cursor_init_sparse(&c, &s);
    assert_int_equal(truncate(path, 1000), 0);
    assert_int_equal(file_cursor_u8(&c, &b), ERR_FORMAT);
    file_sparse_close(&s);
    unlink(path);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_file_map_reads_a_file),
        cmocka_unit_test(test_file_map_survives_truncation),
        cmocka_unit_test(test_file_map_missing_is_io),
        cmocka_unit_test(test_file_map_directory_is_format),
        cmocka_unit_test(test_file_map_empty_file),
        cmocka_unit_test(test_file_fifo_is_format_without_waiting),
        cmocka_unit_test(test_file_read_all_respects_the_limit),
        cmocka_unit_test(test_file_cursor_reads_little_endian_values),
        cmocka_unit_test(test_file_cursor_refuses_reads_past_the_end),
        cmocka_unit_test(test_file_cursor_skip_and_bytes),
        cmocka_unit_test(test_file_sparse_reads_only_its_ranges),
        cmocka_unit_test(test_file_sparse_refuses_bad_ranges),
        cmocka_unit_test(test_file_sparse_huge_pages_commit_only_what_is_read),
        cmocka_unit_test(test_file_cursor_fills_from_a_sparse_file),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
