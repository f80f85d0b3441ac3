/*
 * tests/scheduler/test_draft.c - prompt-lookup drafts: the tokens after the
 * most recent earlier occurrence of the last 3 (else 2) tokens. Every
 * expectation is worked out by hand from the token lists below.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "scheduler/draft.h"

#define N(a) ((int32_t)(sizeof(a) / sizeof((a)[0])))

static void expect(const int32_t *t, int32_t n, int32_t max_n, const int32_t *want,
                   int32_t n_want) {
    int32_t out[16] = {0};
    assert_int_equal(draft_lookup(t, n, max_n, out), n_want);
    for (int32_t i = 0; i < n_want; i++) assert_int_equal(out[i], want[i]);
}

static void test_draft_copies_after_trigram(void **state) {
    (void)state;
    // ... 5 6 7 [8 9 10 11] ... 5 6 7: the 3-gram 5 6 7 occurred at 1
    const int32_t t[] = {4, 5, 6, 7, 8, 9, 10, 11, 12, 5, 6, 7};
    const int32_t want4[] = {8, 9, 10, 11};
    expect(t, N(t), 4, want4, 4);
    const int32_t want2[] = {8, 9};
    expect(t, N(t), 2, want2, 2);  // max_n caps it
    expect(t, N(t), 0, NULL, 0);
}

static void test_draft_most_recent_occurrence(void **state) {
    (void)state;
    // 1 2 3 occurs at 0 (then 20) and at 4 (then 30): the later one wins
    const int32_t t[] = {1, 2, 3, 20, 1, 2, 3, 30, 31, 1, 2, 3};
    const int32_t want[] = {30, 31, 1};
    expect(t, N(t), 3, want, 3);
}

static void test_draft_bigram_when_no_trigram(void **state) {
    (void)state;
    // last 3 = 9 6 7 never occurred before; last 2 = 6 7 did, at 1
    const int32_t t[] = {5, 6, 7, 8, 9, 6, 7};
    const int32_t want[] = {8, 9, 6};
    expect(t, N(t), 3, want, 3);
}

static void test_draft_stops_at_the_end(void **state) {
    (void)state;
    // 1 1 1 1: the 3-gram at 0 is followed by one token only (index 3)
    const int32_t t[] = {1, 1, 1, 1};
    const int32_t want[] = {1};
    expect(t, N(t), 8, want, 1);
}

static void test_draft_none(void **state) {
    (void)state;
    const int32_t t[] = {1, 2, 3, 4, 5, 6};  // no n-gram repeats
    expect(t, N(t), 4, NULL, 0);
    const int32_t one[] = {7};
    expect(one, 1, 4, NULL, 0);
    const int32_t two[] = {7, 7};  // a 2-gram needs a token after an earlier one
    expect(two, 2, 4, NULL, 0);
    const int32_t uni[] = {3, 9, 4, 9};  // a 1-token match is not used
    expect(uni, 4, 4, NULL, 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_draft_copies_after_trigram),
        cmocka_unit_test(test_draft_most_recent_occurrence),
        cmocka_unit_test(test_draft_bigram_when_no_trigram),
        cmocka_unit_test(test_draft_stops_at_the_end),
        cmocka_unit_test(test_draft_none),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
