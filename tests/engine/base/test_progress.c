/*
 * test_progress.c - the progress display: the rate and ETA arithmetic, the
 * duration, line and bar texts, and when the log and bar modes write. Every
 * expected value is worked out by hand in the comment beside it; time is
 * passed in (the *_at seams), so nothing here depends on the clock.
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

#include "engine/base/log.h"
#include "engine/base/progress.h"

#define S   ((int64_t)1000000000)
#define MS  ((int64_t)1000000)
#define MIB ((int64_t)1 << 20)

/* A non-blocking pipe the log (and the bar) write into. */
struct sink {
    int fds[2];
};

static void sink_open(struct sink *k) {
    assert_int_equal(pipe(k->fds), 0);
    assert_int_equal(fcntl(k->fds[0], F_SETFL, O_NONBLOCK), 0);
    log_set_fd(k->fds[1]);
}

/* Everything written so far (NUL-terminated, static). */
static const char *sink_read(struct sink *k) {
    static char text[8192];
    ssize_t n = read(k->fds[0], text, sizeof(text) - 1);
    text[n > 0 ? n : 0] = 0;
    return text;
}

static void sink_close(struct sink *k) {
    log_set_fd(2);
    log_bar_set_drawn(false);
    close(k->fds[0]);
    close(k->fds[1]);
}

/* The message of log line i of text (after "INFO  <tag>: "), copied into out. */
static void log_message(const char *text, int i, const char *tag, char *out, size_t n) {
    const char *line = text;
    for (int k = 0; k < i; k++) {
        line = strchr(line, '\n');
        assert_non_null(line);
        line++;
    }
    char prefix[64];
    snprintf(prefix, sizeof(prefix), "INFO  %s: ", tag);
    const char *m = strstr(line, prefix);
    assert_non_null(m);
    m += strlen(prefix);
    const char *end = strchr(m, '\n');
    assert_non_null(end);
    snprintf(out, n, "%.*s", (int)(end - m), m);
}

static int count_char(const char *s, char c) {
    int n = 0;
    for (; *s; s++) n += *s == c;
    return n;
}

static void test_progress_rate_is_shown_units_per_second(void **state) {
    (void)state;
    assert_true(progress_rate(25, 1, 10 * S) == 2.5);        // 25 / 10 s
    assert_true(progress_rate(3 * MIB, MIB, 2 * S) == 1.5);  // 3 MiB / 2 s
    assert_true(progress_rate(500, 1, 250 * MS) == 2000.0);  // 500 / 0.25 s
    assert_true(progress_rate(5, 1, 0) == 0.0);              // no time yet: no rate
}

static void test_progress_eta_is_the_rest_at_the_average_rate(void **state) {
    (void)state;
    assert_int_equal(progress_eta_ns(25, 100, 10 * S), 30 * S);          // 75 left at 2.5/s
    assert_int_equal(progress_eta_ns(1, 3, 1 * S), 2 * S);               // 2 left at 1/s
    assert_int_equal(progress_eta_ns(3 * MIB, 12 * MIB, 2 * S), 6 * S);  // 9 MiB at 1.5 MiB/s
    assert_int_equal(progress_eta_ns(100, 100, 7 * S), 0);               // all done
    assert_int_equal(progress_eta_ns(0, 100, 5 * S), -1);                // nothing done: unknown
}

static void test_progress_duration_rounds_to_whole_seconds(void **state) {
    (void)state;
    char b[16];
    progress_format_duration(b, sizeof(b), 0);
    assert_string_equal(b, "0s");
    progress_format_duration(b, sizeof(b), 59 * S + 400 * MS);  // 59.4 s
    assert_string_equal(b, "59s");
    progress_format_duration(b, sizeof(b), 59 * S + 500 * MS);  // 59.5 s rounds to 60
    assert_string_equal(b, "1m00s");
    progress_format_duration(b, sizeof(b), 125 * S);  // 2 * 60 + 5
    assert_string_equal(b, "2m05s");
    progress_format_duration(b, sizeof(b), 3725 * S);  // 3600 + 2 * 60 + 5
    assert_string_equal(b, "1h02m");
    progress_format_duration(b, sizeof(b), -1);
    assert_string_equal(b, "?");
}

static void test_progress_line_and_done_texts(void **state) {
    (void)state;
    struct progress p;
    char b[256];
    progress_begin_at(&p, "load", 12 * MIB, "MiB", MIB, PROGRESS_OFF, -1, 80, 100 * S);
    p.done = 3 * MIB;
    // 3 of 12 MiB after 2 s: 25%, 1.5 MiB/s, 9 MiB left = 6 s
    progress_format_line(&p, 102 * S, b, sizeof(b));
    assert_string_equal(b, "25% 3.0/12.0 MiB, 1.5 MiB/s, 2s elapsed, eta 6s");
    p.done = 12 * MIB;
    progress_note(&p, "ppl %.2f", 5.25);
    progress_format_done(&p, 108 * S, b, sizeof(b));  // 12 MiB in 8 s
    assert_string_equal(b, "done 12.0 MiB in 8s, 1.5 MiB/s, ppl 5.25");

    progress_begin_at(&p, "batch", 3, "req", 1, PROGRESS_OFF, -1, 80, 0);
    p.done = 2;  // 66.7% rounds down; 2 / 3 s; 1 left at 0.667/s = 1.5 s -> "2s"
    progress_format_line(&p, 3 * S, b, sizeof(b));
    assert_string_equal(b, "66% 2/3 req, 0.7 req/s, 3s elapsed, eta 2s");
    p.done = 0;  // nothing done: no ETA
    progress_format_line(&p, 3 * S, b, sizeof(b));
    assert_string_equal(b, "0% 0/3 req, 0.0 req/s, 3s elapsed, eta ?");
}

static void test_progress_bar_fits_the_terminal(void **state) {
    (void)state;
    struct progress p;
    char b[512];
    progress_begin_at(&p, "load", 100, "req", 1, PROGRESS_OFF, -1, 80, 0);
    p.done = 45;
    // tail " 45% 45/100 req 5.0 req/s eta 11s" is 33 columns (45 in 9 s = 5/s,
    // 55 left = 11 s); 80 columns: 79 - "load [" - "] " - 40 kept for the
    // tail = 31 cells, 45% of 31 = 13.95 -> 13 filled
    progress_format_bar(&p, 9 * S, 80, false, b, sizeof(b));
    assert_string_equal(b,
                        "load [#############------------------]  45% 45/100 req "
                        "5.0 req/s eta 11s");
    assert_int_equal(strlen(b), 6 + 31 + 2 + 33);
    // 200 columns: the bar stops at 40 cells, 45% of 40 = 18 filled
    progress_format_bar(&p, 9 * S, 200, false, b, sizeof(b));
    assert_string_equal(b,
                        "load [##################----------------------]  45% 45/100 req "
                        "5.0 req/s eta 11s");
    // 40 columns: 39 - 8 - 40 < 10 cells, so the figures only
    progress_format_bar(&p, 9 * S, 40, false, b, sizeof(b));
    assert_string_equal(b, "load  45% 45/100 req 5.0 req/s eta 11s");
    // 20 columns: cut to 19
    progress_format_bar(&p, 9 * S, 20, false, b, sizeof(b));
    assert_string_equal(b, "load  45% 45/100 re");
    // final: 100 in 20 s, all 31 cells filled
    p.done = 100;
    progress_format_bar(&p, 20 * S, 80, true, b, sizeof(b));
    assert_string_equal(b,
                        "load [###############################] 100% 100/100 req "
                        "5.0 req/s in 20s");
    // a tail longer than the 40 kept columns takes cells from the bar:
    // 33 + " " + a 45-character note = 79; at 80 columns 79 - 8 - 79 < 10
    // cells, so the figures only, cut to 79 - "load " = 74
    progress_note(&p, "%s", "ppl 5.25 running 5.50 window 12/100 of text a");
    progress_format_bar(&p, 20 * S, 80, true, b, sizeof(b));
    assert_int_equal(strlen(b), 79);
    assert_memory_equal(b, "load 100% 100/100 req 5.0 req/s in 20s ppl 5.25", 47);
    // at 200 columns 199 - 8 - 79 = 112 cells, so the 40-cell maximum
    progress_format_bar(&p, 20 * S, 200, true, b, sizeof(b));
    assert_memory_equal(b, "load [########################################] 100%", 52);
}

static void test_progress_log_mode_writes_every_interval_and_a_done_line(void **state) {
    (void)state;
    struct sink k;
    sink_open(&k);
    struct progress p;
    progress_begin_at(&p, "ppl", 10, "tok", 1, PROGRESS_LOG, k.fds[1], 80, 0);
    assert_string_equal(sink_read(&k), "");  // log mode: nothing at the start
    progress_update_at(&p, 1, 1 * S);
    assert_string_equal(sink_read(&k), "");  // before the first 5 s
    progress_update_at(&p, 2, 5 * S);        // 2 in 5 s: 0.4/s, 8 left = 20 s
    progress_update_at(&p, 3, 6 * S);        // next line not before 10 s
    progress_update_at(&p, 7, 10 * S);       // 0.7/s, 3 left = 4.29 s -> 4s
    progress_update_at(&p, 99, 11 * S);      // clamped to 10; within the interval
    progress_end_at(&p, 12 * S);             // 10 in 12 s = 0.83/s
    const char *text = sink_read(&k);
    char m[256];
    assert_int_equal(count_char(text, '\n'), 3);
    assert_null(strchr(text, '\r'));
    log_message(text, 0, "ppl", m, sizeof(m));
    assert_string_equal(m, "20% 2/10 tok, 0.4 tok/s, 5s elapsed, eta 20s");
    log_message(text, 1, "ppl", m, sizeof(m));
    assert_string_equal(m, "70% 7/10 tok, 0.7 tok/s, 10s elapsed, eta 4s");
    log_message(text, 2, "ppl", m, sizeof(m));
    assert_string_equal(m, "done 10 tok in 12s, 0.8 tok/s");
    assert_int_equal(p.mode, PROGRESS_OFF);  // ended: later calls write nothing
    progress_update_at(&p, 10, 60 * S);
    assert_string_equal(sink_read(&k), "");
    sink_close(&k);
}

static void test_progress_bar_mode_redraws_in_place(void **state) {
    (void)state;
    struct sink k;
    sink_open(&k);
    struct progress p;
    progress_begin_at(&p, "q", 4, "t", 1, PROGRESS_BAR, k.fds[1], 60, 0);
    // 59 - "q [" - "] " - 40 kept for the tail = 14 cells
    assert_string_equal(sink_read(&k), "\rq [--------------]   0% 0/4 t 0.0 t/s eta ?\033[K");
    assert_true(log_bar_is_drawn());
    progress_update_at(&p, 1, 50 * MS);  // within 100 ms: no redraw
    assert_string_equal(sink_read(&k), "");
    progress_update_at(&p, 2, 1 * S);  // 2 in 1 s: 2/s, 2 left = 1 s; 7 of 14 cells
    assert_string_equal(sink_read(&k), "\rq [#######-------]  50% 2/4 t 2.0 t/s eta 1s\033[K");
    // a log line meanwhile erases the bar first ...
    log_write(LOG_LEVEL_INFO, "other", "hello");
    const char *text = sink_read(&k);
    assert_memory_equal(text, "\r\033[K", 4);
    assert_non_null(strstr(text, "INFO  other: hello\n"));
    assert_false(log_bar_is_drawn());
    // ... and the next update draws it again at once, interval or not
    progress_update_at(&p, 3, 1 * S + 10 * MS);
    text = sink_read(&k);
    assert_memory_equal(text, "\rq [", 4);
    assert_non_null(strstr(text, " 75% 3/4 t"));
    // a line above the bar: erase, the line, the bar again
    progress_printf(&p, "window %d", 3);
    text = sink_read(&k);
    assert_memory_equal(text, "\r\033[Kwindow 3\n\rq [", 15);
    // the end: the final bar and a newline; the log is told the line ended
    progress_update_at(&p, 4, 2 * S);
    (void)sink_read(&k);
    progress_end_at(&p, 2 * S);
    assert_string_equal(sink_read(&k), "\rq [##############] 100% 4/4 t 2.0 t/s in 2s\033[K\n");
    assert_false(log_bar_is_drawn());
    sink_close(&k);
}

static void test_progress_off_mode_writes_nothing(void **state) {
    (void)state;
    struct sink k;
    sink_open(&k);
    struct progress p;
    progress_begin_at(&p, "x", 10, "t", 1, PROGRESS_OFF, k.fds[1], 80, 0);
    progress_update_at(&p, 5, 100 * S);
    progress_end_at(&p, 200 * S);
    assert_string_equal(sink_read(&k), "");
    assert_int_equal(p.done, 5);
    sink_close(&k);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_progress_rate_is_shown_units_per_second),
        cmocka_unit_test(test_progress_eta_is_the_rest_at_the_average_rate),
        cmocka_unit_test(test_progress_duration_rounds_to_whole_seconds),
        cmocka_unit_test(test_progress_line_and_done_texts),
        cmocka_unit_test(test_progress_bar_fits_the_terminal),
        cmocka_unit_test(test_progress_log_mode_writes_every_interval_and_a_done_line),
        cmocka_unit_test(test_progress_bar_mode_redraws_in_place),
        cmocka_unit_test(test_progress_off_mode_writes_nothing),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
