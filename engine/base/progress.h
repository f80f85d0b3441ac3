/*
 * progress.h - progress of one long piece of work (loading a model,
 * quantizing, perplexity over a text, a batch of prompts), shown on the log's
 * fd: a bar redrawn in place when that fd is a terminal, plain INFO log lines
 * every PROGRESS_LOG_INTERVAL_NS otherwise, and one closing line either way.
 *
 *   bar:  load [#########---------]  45% 123.4/274.0 MiB 61.7 MiB/s eta 2s
 *   log:  <time> INFO  load: 45% 123.4/274.0 MiB, 61.7 MiB/s, 2s elapsed, eta 2s
 *   end:  <time> INFO  load: done 274.0 MiB in 4s, 61.7 MiB/s
 *
 * The rate is the average since progress_begin() (done / elapsed) and the ETA
 * the time the rest takes at that rate: elapsed * (total - done) / done.
 * The bar is drawn at log level WARN and above (a person at a terminal
 * wants it even when the log is quiet), the log lines at INFO and above;
 * at ERROR nothing is shown.
 *
 * Ownership: struct progress lives in the caller (usually on its stack) and
 * holds only borrowed strings; nothing to free. Threads: one thread drives a
 * progress; other threads may log meanwhile (a log line erases the bar, and
 * the next update redraws it below the line).
 */
#ifndef LLMSERVE_PROGRESS_H
#define LLMSERVE_PROGRESS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define PROGRESS_LOG_INTERVAL_NS (5 * (int64_t)1000000000)  // log mode: a line every 5 s
#define PROGRESS_BAR_INTERVAL_NS (100 * (int64_t)1000000)   // bar mode: redraw every 100 ms

enum progress_mode {
    PROGRESS_OFF,  // nothing is written (log level too low, or ended)
    PROGRESS_LOG,  // periodic log lines (the log fd is not a terminal)
    PROGRESS_BAR,  // a bar redrawn in place (the log fd is a terminal)
};

struct progress {
    const char *what;  // borrowed: the log tag and the bar's label, e.g. "load"
    const char *unit;  // borrowed: "MiB", "tok", "req", ...
    int64_t unit_div;  // work units per shown unit (1 << 20 for bytes as MiB; 1: as is)
    int64_t total;     // work units in all (> 0)
    int64_t done;      // work units done so far, 0..total
    enum progress_mode mode;
    int fd;    // bar mode: where the bar is drawn
    int cols;  // bar mode: terminal width
    int64_t t_start_ns;
    int64_t t_next_ns;  // the next time an update may write
    bool is_drawn;      // bar mode: a bar is on the screen's last line
    char note[64];      // shown after the figures ("" for none)
};

/* Starts p for `total` units of work (values <= 0 are taken as 1). The mode
 * comes from the log level and isatty() of the log fd (and TERM != "dumb");
 * bar mode draws the 0% bar at once. */
void progress_begin(struct progress *p, const char *what, int64_t total, const char *unit,
                    int64_t unit_div);

/* progress_begin() with the mode, fd, terminal width and clock given: the
 * seam the tests use. */
void progress_begin_at(struct progress *p, const char *what, int64_t total, const char *unit,
                       int64_t unit_div, enum progress_mode mode, int fd, int cols, int64_t now_ns);

/* Records `done` units (clamped to 0..total) and writes a line or redraws the
 * bar when its interval has passed. Cheap enough to call per step. */
void progress_update(struct progress *p, int64_t done);
void progress_update_at(struct progress *p, int64_t done, int64_t now_ns);

/* Sets the short note shown after the figures (printf format; truncated to
 * fit note[]). Shown from the next line or bar drawn. */
void progress_note(struct progress *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Writes one whole line (a newline is added) on the log fd above the bar:
 * erases the bar, writes the line, redraws the bar. In log mode and off mode
 * it is written as is: for output that is not a progress line, like
 * perplexity's per-window figures. */
void progress_printf(struct progress *p, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Finishes: bar mode draws the final bar ("in <time>" instead of the ETA)
 * and ends its line; log mode writes the "done" line. Then p is off: a
 * second progress_end() writes nothing. */
void progress_end(struct progress *p);
void progress_end_at(struct progress *p, int64_t now_ns);

/* ---- the arithmetic and the text, exposed for tests ---------------------- */

/* Shown units per second: (done / unit_div) / elapsed; 0 when elapsed <= 0. */
double progress_rate(int64_t done, int64_t unit_div, int64_t elapsed_ns);

/* Nanoseconds left at the average rate: elapsed * (total - done) / done,
 * rounded down; -1 when unknown (done <= 0). */
int64_t progress_eta_ns(int64_t done, int64_t total, int64_t elapsed_ns);

/* A duration as "7s", "2m05s" or "1h02m" (whole seconds, rounded to nearest);
 * "?" for ns < 0. Returns what snprintf returns. */
int progress_format_duration(char *buf, size_t n, int64_t ns);

/* The log mode's periodic line (without the log prefix) at now_ns. */
int progress_format_line(const struct progress *p, int64_t now_ns, char *buf, size_t n);

/* The closing line (without the log prefix) at now_ns. */
int progress_format_done(const struct progress *p, int64_t now_ns, char *buf, size_t n);

/* The bar for a terminal of `cols` columns at now_ns (no \r, no newline), at
 * most cols - 1 characters so it never wraps. The cells take what is left
 * after the label and 40 columns for the figures (or the figures' width when
 * longer), at most 40 cells; with fewer than 10 the cells are left out. With
 * is_final: "in <elapsed>" in place of the ETA. */
int progress_format_bar(const struct progress *p, int64_t now_ns, int cols, bool is_final,
                        char *buf, size_t n);

#endif
