/*
 * stop.h - incremental stop-string matcher for one sequence's streamed text.
 *
 * The sequence's decoded text is fed piece by piece (one token's text at a
 * time). The matcher passes on at once every byte that cannot be the start of
 * a stop string, holds back the longest tail that is a proper prefix of some
 * stop string (a possible match split across tokens), and reports the match
 * when a stop string completes. The text before the stop string is emitted;
 * the stop string itself only with include_stop (vLLM's
 * include_stop_str_in_output); nothing after it ever is.
 *
 * Matching works on bytes. When the fed text and the stop strings are valid
 * UTF-8 (stop_matcher_validate checks the stop strings), everything emitted
 * ends on a character boundary: a held-back tail and a match both begin with
 * the first byte of a stop string, which is a lead byte.
 *
 * When several stop strings match, the one that completes first in the byte
 * stream wins (what a byte-at-a-time stream would see); among those completing
 * at the same byte, the longest.
 *
 * Threads: a stop_matcher belongs to the thread that feeds its sequence.
 */
#ifndef LLMSERVE_STOP_H
#define LLMSERVE_STOP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/base/buf.h"

#define STOP_MAX_STRINGS 16   // OpenAI allows 4; vLLM clients send more
#define STOP_MAX_BYTES   256  // per stop string

struct stop_matcher;

/* Checks a client's stop list: n in [0, STOP_MAX_STRINGS], each string
 * non-NULL, 1..STOP_MAX_BYTES bytes, valid UTF-8. Returns 0 or ERR_INVAL with
 * a message naming "stop" and the string's index in msg (size msg_size; msg
 * may be NULL when msg_size is 0). [any thread] */
int stop_matcher_validate(const char *const *stops, int32_t n, char *msg, size_t msg_size);

/* Creates a matcher for stops [n] (copied; n may be 0: nothing ever matches).
 * Returns 0, or ERR_INVAL when stop_matcher_validate() rejects the list
 * (nothing logged: the list comes from a client). On success *out is owned by
 * the caller (stop_matcher_free()); on failure *out is NULL. */
int stop_matcher_create(const char *const *stops, int32_t n, bool include_stop,
                        struct stop_matcher **out);
void stop_matcher_free(struct stop_matcher *m);  // NULL-safe

/* Appends text [len] to the stream and appends to out the bytes that are now
 * safe to emit. Returns 1 when a stop string matched (the matcher is then
 * finished: out got the text before the stop, plus the stop with
 * include_stop, and later feeds emit nothing and return 1), else 0. */
int stop_matcher_feed(struct stop_matcher *m, const char *text, size_t len, struct buf *out);

/* End of generation without a stop: appends the held-back text to out. Does
 * nothing once finished. After a flush the matcher starts from an empty tail. */
void stop_matcher_flush(struct stop_matcher *m, struct buf *out);

/* Index of the stop string that matched, or -1 while none has. */
int32_t stop_matcher_matched(const struct stop_matcher *m);

/* Bytes currently held back (a possible partial match). */
size_t stop_matcher_n_held(const struct stop_matcher *m);

#endif
