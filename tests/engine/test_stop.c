/*
 * test_stop.c - the stop-string matcher: hand-written cases from the contract
 * in stop.h, and a randomized comparison against a naive oracle that searches
 * the whole text at once (seed printed on failure).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/base/buf.h"
#include "engine/base/err.h"
#include "engine/text/stop.h"

static struct stop_matcher *make(const char *const *stops, int32_t n, bool include_stop) {
    struct stop_matcher *m = NULL;
    assert_int_equal(stop_matcher_create(stops, n, include_stop, &m), 0);
    assert_non_null(m);
    return m;
}

/* Feeds pieces (NULL-terminated) and returns whether a stop matched; out gets
 * everything emitted, the per-feed emissions must each be valid UTF-8. */
static bool feed_all(struct stop_matcher *m, const char *const *pieces, struct buf *out);

/* True when s [n] is valid UTF-8 (the test's own simple decoder). */
static bool valid_utf8(const unsigned char *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        size_t len = s[i] < 0x80 ? 1 : (s[i] >> 5) == 6 ? 2 : (s[i] >> 4) == 14 ? 3
                   : (s[i] >> 3) == 30 ? 4 : 0;
        if (len == 0 || i + len > n) return false;
        for (size_t j = 1; j < len; j++)
            if ((s[i + j] & 0xc0) != 0x80) return false;
        i += len;
    }
    return true;
}

static bool feed_all(struct stop_matcher *m, const char *const *pieces, struct buf *out) {
    for (size_t i = 0; pieces[i]; i++) {
        struct buf step = {0};
        int r = stop_matcher_feed(m, pieces[i], strlen(pieces[i]), &step);
        assert_true(r == 0 || r == 1);
        assert_true(valid_utf8((const unsigned char *)step.data, step.len));
        buf_append(out, step.data, step.len);
        buf_free(&step);
        if (r == 1) return true;
    }
    return false;
}

static void test_stop_matches_across_token_boundaries(void **state) {
    (void)state;
    const char *stops[] = {"lo Wor"};
    struct stop_matcher *m = make(stops, 1, false);
    struct buf out = {0};
    // "Hel": the final "l" may start "lo Wor", so only "He" goes out
    assert_int_equal(stop_matcher_feed(m, "Hel", 3, &out), 0);
    assert_int_equal(out.len, 2);
    assert_memory_equal(out.data, "He", 2);
    assert_int_equal(stop_matcher_n_held(m), 1);
    // "lo W": "llo W" -> the first "l" is safe, "lo W" is held
    assert_int_equal(stop_matcher_feed(m, "lo W", 4, &out), 0);
    assert_string_equal(out.data, "Hel");
    assert_int_equal(stop_matcher_n_held(m), 4);
    // "orld": "lo World" completes the stop
    assert_int_equal(stop_matcher_feed(m, "orld", 4, &out), 1);
    assert_string_equal(out.data, "Hel");
    assert_int_equal(stop_matcher_matched(m), 0);
    // finished: later text and a flush emit nothing
    assert_int_equal(stop_matcher_feed(m, "more", 4, &out), 1);
    stop_matcher_flush(m, &out);
    assert_string_equal(out.data, "Hel");
    buf_free(&out);
    stop_matcher_free(m);
}

static void test_stop_partial_match_that_fails_is_emitted(void **state) {
    (void)state;
    const char *stops[] = {"abc"};
    struct stop_matcher *m = make(stops, 1, false);
    struct buf out = {0};
    assert_int_equal(stop_matcher_feed(m, "xab", 3, &out), 0);
    assert_string_equal(out.data, "x");
    assert_int_equal(stop_matcher_feed(m, "d", 1, &out), 0);
    assert_string_equal(out.data, "xabd");
    assert_int_equal(stop_matcher_n_held(m), 0);
    // a held "a" that turns into "aab..."
    assert_int_equal(stop_matcher_feed(m, "a", 1, &out), 0);
    assert_int_equal(stop_matcher_feed(m, "a", 1, &out), 0);
    assert_string_equal(out.data, "xabda");
    assert_int_equal(stop_matcher_feed(m, "bq", 2, &out), 0);
    assert_string_equal(out.data, "xabdaabq");
    assert_int_equal(stop_matcher_matched(m), -1);
    buf_free(&out);
    stop_matcher_free(m);
}

static void test_stop_overlapping_prefixes(void **state) {
    (void)state;
    const char *stops[] = {"abcd", "abx", "bc"};
    struct buf out = {0};
    // "bc" completes (byte 4) before "abcd" could (byte 5)
    struct stop_matcher *m = make(stops, 3, false);
    const char *p1[] = {"zab", "cd", NULL};
    assert_true(feed_all(m, p1, &out));
    assert_string_equal(out.data, "za");
    assert_int_equal(stop_matcher_matched(m), 2);
    stop_matcher_free(m);

    // "abx" shares "ab" with "abcd"
    buf_reset(&out);
    m = make(stops, 3, false);
    const char *p2[] = {"q", "a", "b", "x", "tail", NULL};
    assert_true(feed_all(m, p2, &out));
    assert_string_equal(out.data, "q");
    assert_int_equal(stop_matcher_matched(m), 1);
    stop_matcher_free(m);

    // two stops ending at the same byte: the longer one wins
    const char *same_end[] = {"bc", "abc"};
    buf_reset(&out);
    m = make(same_end, 2, false);
    const char *p3[] = {"xa", "bc", NULL};
    assert_true(feed_all(m, p3, &out));
    assert_string_equal(out.data, "x");
    assert_int_equal(stop_matcher_matched(m), 1);
    stop_matcher_free(m);

    // a match inside one piece, with text after it that is never emitted
    const char *one[] = {"STOP"};
    buf_reset(&out);
    m = make(one, 1, false);
    const char *p4[] = {"go STOP now", NULL};
    assert_true(feed_all(m, p4, &out));
    assert_string_equal(out.data, "go ");
    stop_matcher_free(m);
    buf_free(&out);
}

static void test_stop_include_stop_in_output(void **state) {
    (void)state;
    const char *stops[] = {"World", "!"};
    struct stop_matcher *m = make(stops, 2, true);
    struct buf out = {0};
    const char *pieces[] = {"Hello ", "Wor", "ld", "!", NULL};
    assert_true(feed_all(m, pieces, &out));
    assert_string_equal(out.data, "Hello World");
    stop_matcher_free(m);
    buf_free(&out);
}

static void test_stop_flush_emits_held_text(void **state) {
    (void)state;
    const char *stops[] = {"END"};
    struct stop_matcher *m = make(stops, 1, false);
    struct buf out = {0};
    assert_int_equal(stop_matcher_feed(m, "the EN", 6, &out), 0);
    assert_string_equal(out.data, "the ");
    stop_matcher_flush(m, &out);
    assert_string_equal(out.data, "the EN");
    assert_int_equal(stop_matcher_n_held(m), 0);
    stop_matcher_flush(m, &out);  // nothing left
    assert_string_equal(out.data, "the EN");
    stop_matcher_free(m);
    buf_free(&out);

    // no stop strings: everything passes straight through
    m = make(NULL, 0, false);
    struct buf all = {0};
    assert_int_equal(stop_matcher_feed(m, "abc", 3, &all), 0);
    assert_int_equal(stop_matcher_n_held(m), 0);
    stop_matcher_flush(m, &all);
    assert_string_equal(all.data, "abc");
    stop_matcher_free(m);
    buf_free(&all);
}

static void test_stop_multibyte_text(void **state) {
    (void)state;
    // "é!" = c3 a9 21; "è" = c3 a8 shares the lead byte only
    const char *stops[] = {"\xc3\xa9!", "\xe2\x82\xac\xe2\x82\xac"};  // "é!", "€€"
    struct buf out = {0};
    struct stop_matcher *m = make(stops, 2, false);
    const char *p1[] = {"caf", "\xc3\xa9", "?", " \xc3\xa8", "\xe2\x82\xac", "x", NULL};
    assert_false(feed_all(m, p1, &out));
    stop_matcher_flush(m, &out);
    assert_string_equal(out.data, "caf\xc3\xa9? \xc3\xa8\xe2\x82\xacx");
    stop_matcher_free(m);

    buf_reset(&out);
    m = make(stops, 2, false);
    const char *p2[] = {"caf", "\xc3\xa9", "!", "more", NULL};
    assert_true(feed_all(m, p2, &out));
    assert_string_equal(out.data, "caf");
    stop_matcher_free(m);

    buf_reset(&out);
    m = make(stops, 2, true);
    const char *p3[] = {"1\xe2\x82\xac", "\xe2\x82\xac", "2", NULL};
    assert_true(feed_all(m, p3, &out));
    assert_string_equal(out.data, "1\xe2\x82\xac\xe2\x82\xac");
    stop_matcher_free(m);
    buf_free(&out);
}

static void expect_invalid(const char *const *stops, int32_t n, const char *what) {
    char msg[256];
    assert_int_equal(stop_matcher_validate(stops, n, msg, sizeof(msg)), ERR_INVAL);
    if (!strstr(msg, "stop") || !strstr(msg, what)) {
        print_message("message \"%s\" lacks \"%s\"\n", msg, what);
        fail();
    }
    struct stop_matcher *m = (struct stop_matcher *)&m;  // must be reset to NULL
    assert_int_equal(stop_matcher_create(stops, n, false, &m), ERR_INVAL);
    assert_null(m);
}

static void test_stop_validation(void **state) {
    (void)state;
    const char *many[STOP_MAX_STRINGS + 1];
    for (int i = 0; i <= STOP_MAX_STRINGS; i++) many[i] = "x";
    assert_int_equal(stop_matcher_validate(many, STOP_MAX_STRINGS, NULL, 0), 0);
    expect_invalid(many, STOP_MAX_STRINGS + 1, "at most");
    expect_invalid(many, -1, "at most");
    expect_invalid(NULL, 1, "missing");

    const char *empty[] = {"ok", ""};
    expect_invalid(empty, 2, "stop[1]: empty");
    const char *null_entry[] = {NULL};
    expect_invalid(null_entry, 1, "stop[0]");

    char long_stop[STOP_MAX_BYTES + 2];
    memset(long_stop, 'a', sizeof(long_stop) - 1);
    long_stop[STOP_MAX_BYTES + 1] = '\0';
    const char *too_long[] = {long_stop};
    expect_invalid(too_long, 1, "longer than");
    long_stop[STOP_MAX_BYTES] = '\0';  // exactly the limit is fine
    assert_int_equal(stop_matcher_validate(too_long, 1, NULL, 0), 0);

    const char *bad_utf8[][1] = {
        {"\xc3"},              // truncated
        {"a\x80"},             // lone continuation
        {"\xc0\xaf"},          // overlong
        {"\xed\xa0\x80"},      // surrogate
        {"\xf4\x90\x80\x80"},  // above U+10FFFF
        {"\xff"},
    };
    for (size_t i = 0; i < sizeof(bad_utf8) / sizeof(bad_utf8[0]); i++)
        expect_invalid(bad_utf8[i], 1, "UTF-8");
    const char *good_utf8[] = {"\xf0\x9f\x98\x80", "\xe2\x82\xac", "\xc3\xa9", "\xf4\x8f\xbf\xbf"};
    assert_int_equal(stop_matcher_validate(good_utf8, 4, NULL, 0), 0);
    stop_matcher_free(NULL);
}

/* The oracle: the first stop to complete in the whole text (longest on a
 * tie), by brute force over end positions. Returns the expected output. */
static void oracle(const char *const *stops, int32_t n, bool include_stop, const char *text,
                   size_t len, struct buf *out, int32_t *out_matched) {
    for (size_t end = 1; end <= len; end++) {
        int32_t best = -1;
        for (int32_t i = 0; i < n; i++) {
            size_t sl = strlen(stops[i]);
            if (sl <= end && memcmp(text + end - sl, stops[i], sl) == 0 &&
                (best < 0 || sl > strlen(stops[best])))
                best = i;
        }
        if (best >= 0) {
            size_t sl = strlen(stops[best]);
            buf_append(out, text, include_stop ? end : end - sl);
            *out_matched = best;
            return;
        }
    }
    buf_append(out, text, len);
    *out_matched = -1;
}

static void test_stop_random_against_oracle(void **state) {
    (void)state;
    // a small alphabet with a multi-byte letter, so matches and near misses are common
    const char *letters[] = {"a", "b", "c", " ", "\xc3\xa9"};
    uint64_t x = 12345;
    for (int round = 0; round < 3000; round++) {
        uint64_t seed = x;
        char stop_store[4][16];
        const char *stops[4];
        int32_t n_stops = (int32_t)(x % 4) + 1;
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        for (int32_t i = 0; i < n_stops; i++) {
            size_t sl = 0;
            int n_letters = (int)((x >> 33) % 4) + 1;
            x = x * 6364136223846793005ull + 1442695040888963407ull;
            for (int j = 0; j < n_letters; j++) {
                const char *c = letters[(x >> 33) % 5];
                x = x * 6364136223846793005ull + 1442695040888963407ull;
                memcpy(stop_store[i] + sl, c, strlen(c));
                sl += strlen(c);
            }
            stop_store[i][sl] = '\0';
            stops[i] = stop_store[i];
        }
        bool include_stop = (x >> 40) & 1;
        struct buf text = {0};
        int n_letters = (int)((x >> 33) % 40);
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        for (int j = 0; j < n_letters; j++) {
            buf_append_str(&text, letters[(x >> 33) % 5]);
            x = x * 6364136223846793005ull + 1442695040888963407ull;
        }
        struct buf want = {0};
        int32_t want_matched = -1;
        oracle(stops, n_stops, include_stop, text.data ? text.data : "", text.len, &want,
               &want_matched);

        // feed in random pieces of whole letters (as a detokenizer would)
        struct stop_matcher *m = make(stops, n_stops, include_stop);
        struct buf got = {0};
        size_t pos = 0;
        int r = 0;
        while (pos < text.len && r == 0) {
            size_t piece = 0;
            int n_piece = (int)((x >> 33) % 4);
            x = x * 6364136223846793005ull + 1442695040888963407ull;
            for (int j = 0; j < n_piece && pos + piece < text.len; j++) {
                unsigned char c = (unsigned char)text.data[pos + piece];
                piece += c < 0x80 ? 1 : 2;
            }
            r = stop_matcher_feed(m, text.data + pos, piece, &got);
            assert_true(valid_utf8((const unsigned char *)got.data, got.len));
            assert_true(stop_matcher_n_held(m) < 16);
            pos += piece;
        }
        if (r == 0) stop_matcher_flush(m, &got);
        if (got.len != want.len || (want.len && memcmp(got.data, want.data, want.len) != 0) ||
            stop_matcher_matched(m) != want_matched) {
            print_message("round %d seed %llu: text \"%s\" got \"%s\" want \"%s\"\n", round,
                          (unsigned long long)seed, text.data ? text.data : "",
                          got.data ? got.data : "", want.data ? want.data : "");
            fail();
        }
        stop_matcher_free(m);
        buf_free(&got);
        buf_free(&want);
        buf_free(&text);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stop_matches_across_token_boundaries),
        cmocka_unit_test(test_stop_partial_match_that_fails_is_emitted),
        cmocka_unit_test(test_stop_overlapping_prefixes),
        cmocka_unit_test(test_stop_include_stop_in_output),
        cmocka_unit_test(test_stop_flush_emits_held_text),
        cmocka_unit_test(test_stop_multibyte_text),
        cmocka_unit_test(test_stop_validation),
        cmocka_unit_test(test_stop_random_against_oracle),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
