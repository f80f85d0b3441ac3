/*
 * progress.c - the arithmetic, the three kinds of text, and when to write.
 */
#include "engine/base/progress.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include "engine/base/clock.h"
#include "engine/base/log.h"

#define PROGRESS_BAR_MAX   40  // widest bar in cells
#define PROGRESS_BAR_MIN   10  // narrower than this: figures only
#define PROGRESS_TAIL_COLS 40  // columns kept for the figures after the bar

double progress_rate(int64_t done, int64_t unit_div, int64_t elapsed_ns) {
    if (elapsed_ns <= 0) return 0.0;
    return ((double)done / (double)(unit_div > 0 ? unit_div : 1)) / ((double)elapsed_ns / 1e9);
}

int64_t progress_eta_ns(int64_t done, int64_t total, int64_t elapsed_ns) {
    if (done <= 0) return -1;
    if (done >= total) return 0;
    return (int64_t)((double)elapsed_ns * (double)(total - done) / (double)done);
}

int progress_format_duration(char *buf, size_t n, int64_t ns) {
    if (ns < 0) return snprintf(buf, n, "?");
    const int64_t s = (ns + 500000000) / 1000000000;
    if (s < 60) return snprintf(buf, n, "%llds", (long long)s);
    if (s < 3600) return snprintf(buf, n, "%lldm%02llds", (long long)(s / 60), (long long)(s % 60));
    return snprintf(buf, n, "%lldh%02lldm", (long long)(s / 3600), (long long)(s % 3600 / 60));
}

/* A count in shown units: one decimal when a unit is many work units (MiB
 * of bytes), a whole number otherwise. */
static int format_amount(const struct progress *p, int64_t v, char *buf, size_t n) {
    if (p->unit_div > 1) return snprintf(buf, n, "%.1f", (double)v / (double)p->unit_div);
    return snprintf(buf, n, "%lld", (long long)v);
}

/* "45% 123.4/274.0 MiB" (percent rounded down: 100% only when all is done);
 * is_padded: the percent right-aligned in 3 columns, so a bar does not jitter. */
static int format_figures(const struct progress *p, bool is_padded, char *buf, size_t n) {
    char done[32], total[32];
    format_amount(p, p->done, done, sizeof(done));
    format_amount(p, p->total, total, sizeof(total));
    return snprintf(buf, n, "%*d%% %s/%s %s", is_padded ? 3 : 0, (int)(p->done * 100 / p->total),
                    done, total, p->unit);
}

int progress_format_line(const struct progress *p, int64_t now_ns, char *buf, size_t n) {
    const int64_t elapsed = now_ns - p->t_start_ns;
    char fig[96], el[16], eta[16];
    format_figures(p, false, fig, sizeof(fig));
    progress_format_duration(el, sizeof(el), elapsed);
    progress_format_duration(eta, sizeof(eta), progress_eta_ns(p->done, p->total, elapsed));
    return snprintf(buf, n, "%s, %.1f %s/s, %s elapsed, eta %s%s%s", fig,
                    progress_rate(p->done, p->unit_div, elapsed), p->unit, el, eta,
                    p->note[0] ? ", " : "", p->note);
}

int progress_format_done(const struct progress *p, int64_t now_ns, char *buf, size_t n) {
    const int64_t elapsed = now_ns - p->t_start_ns;
    char amount[32], el[16];
    format_amount(p, p->done, amount, sizeof(amount));
    progress_format_duration(el, sizeof(el), elapsed);
    return snprintf(buf, n, "done %s %s in %s, %.1f %s/s%s%s", amount, p->unit, el,
                    progress_rate(p->done, p->unit_div, elapsed), p->unit, p->note[0] ? ", " : "",
                    p->note);
}

int progress_format_bar(const struct progress *p, int64_t now_ns, int cols, bool is_final,
                        char *buf, size_t n) {
    const int64_t elapsed = now_ns - p->t_start_ns;
    char fig[96], t[16], tail[192];
    format_figures(p, true, fig, sizeof(fig));
    if (is_final) {
        progress_format_duration(t, sizeof(t), elapsed);
    } else {
        progress_format_duration(t, sizeof(t), progress_eta_ns(p->done, p->total, elapsed));
    }
    int tail_len = snprintf(tail, sizeof(tail), "%s %.1f %s/s %s %s%s%s", fig,
                            progress_rate(p->done, p->unit_div, elapsed), p->unit,
                            is_final ? "in" : "eta", t, p->note[0] ? " " : "", p->note);
    if (tail_len < 0) return tail_len;
    // "what [" + cells + "] " + tail, in at most cols - 1 columns; the cells
    // leave PROGRESS_TAIL_COLS for the tail even when it is shorter, so the
    // bar keeps its width while the figures change
    const int tail_cols = tail_len > PROGRESS_TAIL_COLS ? tail_len : PROGRESS_TAIL_COLS;
    int width = cols - 1 - (int)strlen(p->what) - 4 - tail_cols;
    if (width > PROGRESS_BAR_MAX) width = PROGRESS_BAR_MAX;
    if (width < PROGRESS_BAR_MIN) {
        int room = cols - 1 - (int)strlen(p->what) - 1;
        if (room < 0) room = 0;
        return snprintf(buf, n, "%s %.*s", p->what, room, tail);
    }
    char cells[PROGRESS_BAR_MAX + 1];
    const int filled = (int)(p->done * width / p->total);
    memset(cells, '#', (size_t)filled);
    memset(cells + filled, '-', (size_t)(width - filled));
    cells[width] = 0;
    return snprintf(buf, n, "%s [%s] %s", p->what, cells, tail);
}

/* One write(2), retried on EINTR; a short or failed write of a progress
 * display is not worth reporting. */
static void write_all(int fd, const char *s, size_t len) {
    ssize_t w;
    do {
        w = write(fd, s, len);
    } while (w < 0 && errno == EINTR);
}

static void draw_bar(struct progress *p, int64_t now_ns, bool is_final) {
    char line[512];
    memcpy(line, "\r", 1);
    int m = progress_format_bar(p, now_ns, p->cols, is_final, line + 1, sizeof(line) - 8);
    if (m < 0) return;
    size_t len = 1 + ((size_t)m < sizeof(line) - 8 ? (size_t)m : sizeof(line) - 9);
    memcpy(line + len, "\033[K", 3);  // clear what a longer earlier bar left
    len += 3;
    if (is_final) line[len++] = '\n';
    write_all(p->fd, line, len);
    p->is_drawn = !is_final;
    log_bar_set_drawn(!is_final);
}

void progress_begin_at(struct progress *p, const char *what, int64_t total, const char *unit,
                       int64_t unit_div, enum progress_mode mode, int fd, int cols,
                       int64_t now_ns) {
    memset(p, 0, sizeof(*p));
    p->what = what;
    p->unit = unit;
    p->unit_div = unit_div > 0 ? unit_div : 1;
    p->total = total > 0 ? total : 1;
    p->mode = mode;
    p->fd = fd;
    p->cols = cols > 0 ? cols : 80;
    p->t_start_ns = now_ns;
    if (mode == PROGRESS_BAR) {
        draw_bar(p, now_ns, false);
        p->t_next_ns = now_ns + PROGRESS_BAR_INTERVAL_NS;
    } else {
        p->t_next_ns = now_ns + PROGRESS_LOG_INTERVAL_NS;
    }
}

void progress_begin(struct progress *p, const char *what, int64_t total, const char *unit,
                    int64_t unit_div) {
    const int fd = log_get_fd();
    enum progress_mode mode = PROGRESS_OFF;
    int cols = 80;
    const char *term = getenv("TERM");
    if (isatty(fd) && !(term && strcmp(term, "dumb") == 0)) {
        if (log_level_current >= LOG_LEVEL_WARN) mode = PROGRESS_BAR;
    } else if (log_level_current >= LOG_LEVEL_INFO) {
        mode = PROGRESS_LOG;
    }
    struct winsize ws;
    if (mode == PROGRESS_BAR && ioctl(fd, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0) {
        cols = ws.ws_col;
    }
    progress_begin_at(p, what, total, unit, unit_div, mode, fd, cols, clock_mono_ns());
}

void progress_update_at(struct progress *p, int64_t done, int64_t now_ns) {
    p->done = done < 0 ? 0 : done > p->total ? p->total : done;
    if (p->mode == PROGRESS_OFF) return;
    // a log line from elsewhere erased the bar: draw it again at once
    const bool is_erased = p->mode == PROGRESS_BAR && p->is_drawn && !log_bar_is_drawn();
    if (now_ns < p->t_next_ns && !is_erased) return;
    if (p->mode == PROGRESS_BAR) {
        draw_bar(p, now_ns, false);
        p->t_next_ns = now_ns + PROGRESS_BAR_INTERVAL_NS;
    } else {
        char line[256];
        progress_format_line(p, now_ns, line, sizeof(line));
        log_write(LOG_LEVEL_INFO, p->what, "%s", line);
        p->t_next_ns = now_ns + PROGRESS_LOG_INTERVAL_NS;
    }
}

void progress_update(struct progress *p, int64_t done) {
    if (p->mode == PROGRESS_OFF) {
        p->done = done;
        return;
    }
    progress_update_at(p, done, clock_mono_ns());
}

void progress_note(struct progress *p, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(p->note, sizeof(p->note), fmt, ap);
    va_end(ap);
}

void progress_printf(struct progress *p, const char *fmt, ...) {
    char line[1024];
    size_t len = 0;
    const bool has_bar = p->mode == PROGRESS_BAR && p->is_drawn;
    if (has_bar) {
        memcpy(line, "\r\033[K", 4);
        len = 4;
    }
    va_list ap;
    va_start(ap, fmt);
    int m = vsnprintf(line + len, sizeof(line) - len - 1, fmt, ap);
    va_end(ap);
    if (m < 0) return;
    len += (size_t)m < sizeof(line) - len - 1 ? (size_t)m : sizeof(line) - len - 2;
    line[len++] = '\n';
    write_all(p->fd, line, len);
    if (has_bar) draw_bar(p, clock_mono_ns(), false);
}

void progress_end_at(struct progress *p, int64_t now_ns) {
    if (p->mode == PROGRESS_BAR) {
        draw_bar(p, now_ns, true);
    } else if (p->mode == PROGRESS_LOG) {
        char line[256];
        progress_format_done(p, now_ns, line, sizeof(line));
        log_write(LOG_LEVEL_INFO, p->what, "%s", line);
    }
    p->mode = PROGRESS_OFF;
}

void progress_end(struct progress *p) {
    progress_end_at(p, p->mode == PROGRESS_OFF ? p->t_start_ns : clock_mono_ns());
}
