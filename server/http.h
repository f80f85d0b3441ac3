/*
 * server/http.h - the HTTP front end on libmicrohttpd: one daemon with its
 * internal polling thread on epoll, request bodies and their limit, API key
 * checks, dispatch through the route table, suspend / resume of connections
 * that wait for tokens, request timeouts and stream heartbeats, draining at
 * shutdown. The ERR_* -> HTTP status table is server/status.h.
 *
 * Owns the daemon, the slot table and the ticker thread. Each request has a
 * struct slot (server/slot.h), the wake target its channels call from the step thread:
 * slots live as long as the server, so a late wake-up for a request that has
 * already gone finds an empty slot and does nothing.
 * Threads: http_start/drain/stop [main thread]; slot_wake [any thread];
 * slot_park [HTTP thread]. The ticker is a POSIX thread: libuv, the house
 * threading API, lives only in scheduler/ and engine/ (STYLE 2.10).
 */
#ifndef SERVER_HTTP_H
#define SERVER_HTTP_H

#include <stdbool.h>
#include <stdint.h>

#include "server/metrics.h"

struct http_server;
struct routes_ctx;

struct http_params {
    const char *host;            // IPv4 address or "localhost"
    int32_t port;
    int64_t max_body_bytes;      // larger bodies get 413
    int32_t request_timeout_s;   // 0: none
    int32_t heartbeat_s;         // idle streams get an SSE comment this often
    int32_t max_connections;     // open connections at most; more wait in the listen backlog
    int32_t idle_timeout_s;      // a connection with no traffic this long is closed (0: never)
    int32_t read_timeout_s;      // a request not received in full this long after the
                                 //    connection opened or its last response: closed (0: never)
};

struct http_params http_default_params(void);

/* Binds and starts the daemon. app is retained until http_stop(). Returns
 * 0, ERR_IO (cannot bind: logged with the address) or ERR_INVAL. */
int http_start(const struct http_params *p, const struct routes_ctx *app,
               struct http_server **out);

/* Stops accepting connections; requests on open connections get 503. */
void http_drain(struct http_server *h);

/* Ends every request in progress now, without waiting for its sequences:
 * a stream gets what was generated so far, an OpenAI-shaped error event
 * (code "job_failed") and its end, no [DONE]; a plain request a 503. New
 * requests get 503 (as after http_drain). For a parallel job whose engine can
 * no longer step (a rank died: the step thread may be stuck in a collective),
 * so nothing here waits for the scheduler. [any thread] */
void http_abort_all(struct http_server *h);

/* Requests in progress (for the shutdown wait). [any thread] */
int32_t http_n_active(struct http_server *h);

/* Resumes every suspended connection, stops the daemon and the ticker, frees
 * everything. NULL-safe. */
void http_stop(struct http_server *h);

/* Stream bookkeeping used by the streaming reader. [HTTP thread] */
void http_note_disconnect(struct http_server *h);

#endif
