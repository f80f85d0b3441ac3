/*
 * test_pages.c - anonymous memory by the page (engine/base/pages.h): zero
 * and writable, committed only where written (mincore is the oracle: the
 * kernel's own count of resident pages), with or without the 2 MiB ask, and
 * the ask only over the whole 2 MiB pages inside a range.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include "engine/base/pages.h"
#include "tests/helpers/testutil.h"


/* 5 MiB reserved, either way: nothing resident, one byte written commits
 * its page (4 KiB), or at most its 2 MiB page with the ask, every other byte
 * reads zero, and then every byte holds what was written. 0 bytes is a
 * mapping too. */
static void test_pages_commit_only_where_written(void **state) {
    (void)state;
    const size_t page = (size_t)sysconf(_SC_PAGESIZE);
    const size_t n = 5 << 20;
    for (int huge = 0; huge <= 1; huge++) {
        uint8_t *p = pages_reserve(n, huge);
        assert_non_null(p);
        assert_int_equal(testutil_resident_pages(p, n), 0);
        p[3 * page + 5] = 7;
        const size_t r = testutil_resident_pages(p, n);
        assert_true(r >= 1);
        assert_true(huge ? r <= ((size_t)2 << 20) / page : r == 1);
        for (size_t i = 0; i < n; i += 4093) assert_int_equal(p[i], i == 3 * page + 5 ? 7 : 0);
        for (size_t i = 0; i < n; i++) p[i] = (uint8_t)(i * 31);
        for (size_t i = 0; i < n; i += 997) assert_int_equal(p[i], (uint8_t)(i * 31));
        assert_int_equal(testutil_resident_pages(p, n), n / page);
        pages_release(p, n);
    }
    uint8_t *z = pages_reserve(0, true);
    assert_non_null(z);
    z[0] = 1;
    pages_release(z, 0);
    pages_release(NULL, 10);  // NULL-safe
    errno = 0;
    assert_null(pages_reserve(SIZE_MAX, false));
    assert_int_equal(errno, ENOMEM);  // what the callers log
}

/* The ask over a range commits nothing, and writes to the bytes around a
 * 2 MiB page advised inside [p + 10, + 4 MiB) commit their 4 KiB pages only:
 * the ask never reaches past the range it names. */
static void test_pages_advise_stays_inside_its_range(void **state) {
    (void)state;
    const size_t n = 8 << 20;
    uint8_t *p = pages_reserve(n, false);
    assert_non_null(p);
    pages_advise_huge(p + 10, 4 << 20);
    assert_int_equal(testutil_resident_pages(p, n), 0);
    p[0] = 1;                    // before the range
    p[(4 << 20) + 20] = 1;       // just past it
    p[(6 << 20) + 3] = 1;        // far past it
    assert_int_equal(testutil_resident_pages(p, n), 3);
    pages_release(p, n);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pages_commit_only_where_written),
        cmocka_unit_test(test_pages_advise_stays_inside_its_range),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
