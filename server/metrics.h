/*
 * server/metrics.h - the Prometheus text exposition (format 0.0.4) of
 * /metrics, from a scheduler stats snapshot and the server's own counters.
 *
 * Pure formatting: owns nothing, keeps no state (struct metrics_live is the
 * HTTP server's; it is declared here so writer and reader share it). [any thread]
 */
#ifndef SERVER_METRICS_H
#define SERVER_METRICS_H

#include <stdatomic.h>
#include <stdint.h>

#include "engine/base/buf.h"
#include "scheduler/scheduler.h"

/* Counters the HTTP side keeps (atomically) and hands over as plain values. */
struct metrics_server {
    int64_t n_http_requests;   // every request answered
    int64_t n_http_errors;     // of those, with status >= 400
    int64_t n_rejected_full;   // 429s (queue full)
    int64_t n_disconnects;     // clients that went away before their stream ended
    int32_t n_open_streams;    // streaming responses in progress
    int32_t n_http_active;     // requests received and not yet completed (this one included)
    int64_t n_read_timeouts;   // connections closed for not sending a request in time
    int32_t n_lora_adapters;   // adapters in the registry (served by name)
    int32_t n_lora_loads_queued;   // runtime adapter loads waiting for the loader thread
    int32_t n_lora_loads_running;  // runtime adapter loads in progress (0 or 1)
};

/* The HTTP side's live counters and drain flag: one per HTTP server, owned
 * and updated by http.c, read by /health and /metrics (routes.c) through
 * routes_ctx, so the handlers need nothing of http.h. [any thread] */
struct metrics_live {
    atomic_bool draining;       // no new requests: /health answers 503
    atomic_llong n_requests;
    atomic_llong n_errors;
    atomic_llong n_full;
    atomic_llong n_disconnects;
    atomic_int n_streams;
    atomic_int n_active;
    atomic_llong n_read_timeouts;   // connections closed by --read-timeout
};

/* Copies the live counters into the fields of out they name. [any thread] */
void metrics_live_read(struct metrics_live *l, struct metrics_server *out);

/* Appends every metric to out: llmserve_requests_running / _waiting, KV blocks
 * used / free / cached / total, prefix-cache hit tokens, preemptions, prompt
 * and generation token totals, request counters, adapter slots / loads /
 * evictions / waits, registered adapters and adapter loads queued / running,
 * and the histograms
 * time_to_first_token_seconds, inter_token_latency_seconds and
 * request_latency_seconds with bucket bounds bucket_ms [STATS_N_BUCKETS - 1]
 * (in milliseconds; exposed in seconds, cumulative, plus +Inf). */
void metrics_format(struct buf *out, const struct scheduler_stats *st, const double *bucket_ms,
                    const struct metrics_server *sv);

#endif
