/*
 * stop.c - the stop-string matcher of stop.h.
 *
 * State: the held-back tail (shorter than the longest stop string, never
 * containing a whole stop string) and the finished flag. Each feed looks at
 * tail + new text only, so its cost is bounded by the piece's length times
 * the stop strings, never by the length of the whole output.
 */
#include "engine/text/stop.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/base/alloc.h"
#include "engine/base/err.h"

struct stop_matcher {
    char *stops[STOP_MAX_STRINGS];   // owned copies
    size_t lens[STOP_MAX_STRINGS];
    int32_t n_stops;
    size_t len_max;                  // longest stop string
    bool include_stop;
    struct buf work;                 // held tail, then tail + new text during a feed; owned
    int32_t i_matched;               // -1 until a stop matched
};

static int invalid(char *msg, size_t msg_size, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static int invalid(char *msg, size_t msg_size, const char *fmt, ...) {
    if (msg && msg_size) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, msg_size, fmt, ap);
        va_end(ap);
    }
    return ERR_INVAL;
}

/* True when s [n] is well-formed UTF-8 (RFC 3629: no overlongs, no
 * surrogates, nothing above U+10FFFF). */
static bool is_utf8(const unsigned char *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        unsigned c = s[i];
        size_t n_cont;
        unsigned lo = 0x80;
        unsigned hi = 0xbf;  // allowed range of the first continuation byte
        if (c < 0x80) {
            i++;
            continue;
        } else if (c >= 0xc2 && c <= 0xdf) {
            n_cont = 1;
        } else if (c >= 0xe0 && c <= 0xef) {
            n_cont = 2;
            if (c == 0xe0) lo = 0xa0;
            if (c == 0xed) hi = 0x9f;
        } else if (c >= 0xf0 && c <= 0xf4) {
            n_cont = 3;
            if (c == 0xf0) lo = 0x90;
            if (c == 0xf4) hi = 0x8f;
        } else {
            return false;
        }
        if (n - i - 1 < n_cont) return false;
        if (s[i + 1] < lo || s[i + 1] > hi) return false;
        for (size_t j = 2; j <= n_cont; j++)
            if ((s[i + j] & 0xc0) != 0x80) return false;
        i += n_cont + 1;
    }
    return true;
}

int stop_matcher_validate(const char *const *stops, int32_t n, char *msg, size_t msg_size) {
    if (msg && msg_size) msg[0] = '\0';
    if (n < 0 || n > STOP_MAX_STRINGS)
        return invalid(msg, msg_size, "stop: at most %d strings are allowed, got %d",
                       STOP_MAX_STRINGS, (int)n);
    if (n > 0 && !stops) return invalid(msg, msg_size, "stop: missing list");
    for (int32_t i = 0; i < n; i++) {
        if (!stops[i]) return invalid(msg, msg_size, "stop[%d]: missing string", (int)i);
        size_t len = strnlen(stops[i], STOP_MAX_BYTES + 1);
        if (len == 0) return invalid(msg, msg_size, "stop[%d]: empty string", (int)i);
        if (len > STOP_MAX_BYTES)
            return invalid(msg, msg_size, "stop[%d]: longer than %d bytes", (int)i,
                           STOP_MAX_BYTES);
        if (!is_utf8((const unsigned char *)stops[i], len))
            return invalid(msg, msg_size, "stop[%d]: not valid UTF-8", (int)i);
    }
    return 0;
}

int stop_matcher_create(const char *const *stops, int32_t n, bool include_stop,
                        struct stop_matcher **out) {
    *out = NULL;
    int err = stop_matcher_validate(stops, n, NULL, 0);
    if (err) return err;
    struct stop_matcher *m = xcalloc(1, sizeof(*m));
    for (int32_t i = 0; i < n; i++) {
        m->stops[i] = xstrdup(stops[i]);
        m->lens[i] = strlen(stops[i]);
        if (m->lens[i] > m->len_max) m->len_max = m->lens[i];
    }
    m->n_stops = n;
    m->include_stop = include_stop;
    m->i_matched = -1;
    *out = m;
    return 0;
}

void stop_matcher_free(struct stop_matcher *m) {
    if (!m) return;
    for (int32_t i = 0; i < m->n_stops; i++) free(m->stops[i]);
    buf_free(&m->work);
    free(m);
}

/* Finds the first stop string to complete in w [n] at an end beyond from
 * (the bytes before from were already searched). Returns the stop's index and
 * its start in *out_start, or -1. */
static int32_t find_first_match(const struct stop_matcher *m, const char *w, size_t n,
                                size_t from, size_t *out_start) {
    int32_t i_best = -1;
    size_t end_best = 0;
    size_t start_best = 0;
    for (int32_t i = 0; i < m->n_stops; i++) {
        size_t len = m->lens[i];
        if (len > n) continue;
        // a match ending after `from` starts at or after from + 1 - len
        size_t start = from + 1 > len ? from + 1 - len : 0;
        const char *hit = memmem(w + start, n - start, m->stops[i], len);
        if (!hit) continue;
        size_t s = (size_t)(hit - w);
        size_t end = s + len;
        if (i_best < 0 || end < end_best || (end == end_best && s < start_best)) {
            i_best = i;
            end_best = end;
            start_best = s;
        }
    }
    *out_start = start_best;
    return i_best;
}

/* Length of the longest tail of w [n] that is a proper prefix of a stop string. */
static size_t partial_tail(const struct stop_matcher *m, const char *w, size_t n) {
    size_t k_max = m->len_max > 0 ? m->len_max - 1 : 0;
    if (k_max > n) k_max = n;
    for (size_t k = k_max; k > 0; k--) {
        const char *tail = w + n - k;
        for (int32_t i = 0; i < m->n_stops; i++)
            if (m->lens[i] > k && memcmp(m->stops[i], tail, k) == 0) return k;
    }
    return 0;
}

int stop_matcher_feed(struct stop_matcher *m, const char *text, size_t len, struct buf *out) {
    if (m->i_matched >= 0) return 1;
    if (m->n_stops == 0) {
        buf_append(out, text, len);
        return 0;
    }
    size_t n_held = m->work.len;
    buf_append(&m->work, text, len);
    const char *w = m->work.data;
    size_t n = m->work.len;
    // The held tail contains no whole stop string, so only matches ending in
    // the new text are possible.
    size_t start = 0;
    int32_t i = find_first_match(m, w, n, n_held, &start);
    if (i >= 0) {
        buf_append(out, w, m->include_stop ? start + m->lens[i] : start);
        m->i_matched = i;
        buf_free(&m->work);
        return 1;
    }
    size_t k = partial_tail(m, w, n);
    buf_append(out, w, n - k);
    memmove(m->work.data, w + n - k, k);
    m->work.len = k;
    m->work.data[k] = '\0';
    return 0;
}

void stop_matcher_flush(struct stop_matcher *m, struct buf *out) {
    if (m->i_matched >= 0) return;
    if (m->work.len) buf_append(out, m->work.data, m->work.len);
    buf_reset(&m->work);
}

int32_t stop_matcher_matched(const struct stop_matcher *m) { return m->i_matched; }

size_t stop_matcher_n_held(const struct stop_matcher *m) { return m->work.len; }
