/*
 * server/sse.h - server-sent events for streaming completions: the framing
 * ("data: {json}\n\n", "data: [DONE]\n\n", ": comment\n\n") and the stream
 * state machine of a request (SSE_ROLE -> SSE_DELTAS -> SSE_FINAL ->
 * SSE_DONE), fed by the request's channels.
 *
 * Owns nothing: it writes into the req's output buffer. When the channels
 * are empty it parks the connection (slot_park()) instead of waiting.
 * Threads: [HTTP thread].
 */
#ifndef SERVER_SSE_H
#define SERVER_SSE_H

#include <stddef.h>
#include <sys/types.h>

#include "engine/base/buf.h"

struct req;

/* Appends one event "data: <json>\n\n". */
void sse_frame_data(struct buf *out, const char *json);
/* Appends "data: [DONE]\n\n". */
void sse_frame_done(struct buf *out);
/* Appends a comment line ": text\n\n" (heartbeats; clients ignore it). */
void sse_frame_comment(struct buf *out, const char *text);

/* The content reader of a streaming response: copies up to max bytes of the
 * stream into dst. Returns the bytes copied (> 0), 0 after parking the
 * connection (MHD calls again after the resume), or -1 at the end of the
 * stream. */
ssize_t sse_read(struct req *r, char *dst, size_t max);

#endif
