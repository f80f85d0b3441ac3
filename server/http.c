/*
 * server/http.c - the libmicrohttpd daemon.
 *
 * One request through here: the access handler is called first with the
 * headers (a struct req is made and bound to a free slot), then with each
 * piece of the body (appended up to the limit), then with no data: auth, the
 * route's handler, and either a reply (Content-Length), a wait (the
 * connection is suspended until the channels finish, then the handler is
 * called again and answers), or a stream (a chunked callback response whose
 * reader is sse_read()). MHD calls the completed callback once per request:
 * the req dies there.
 *
 * Suspend / resume (MACHINE.md): suspension happens only in the access
 * handler or the content reader (slot_park), resume from any thread
 * (slot_wake) under the slot's lock, so a wake between "channel empty" and
 * "suspend" is never lost: it sets wake_pending and the park does not sleep.
 * MHD_ALLOW_SUSPEND_RESUME sets MHD_USE_ITC, so the polling thread sees a
 * resume at once. A suspended connection has no MHD timeout and does not see
 * its client go away, so the ticker thread (once a second) resumes idle
 * streams for a heartbeat, cancels requests past their deadline, and peeks
 * at the socket of every suspended connection: a peer that closed (EOF or
 * an error) has its sequences canceled at once - also while they still wait
 * in the scheduler's queue - and the connection resumed, so MHD sees the
 * close and the req dies within about a second instead of at the end of a
 * generation nobody reads. (A client that half-closes its sending side
 * while it waits for the answer is taken for gone; HTTP clients do not.)
 */
#define LOG_TAG "http"
#include "server/http.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include <microhttpd.h>

#include "engine/base/alloc.h"
#include "engine/base/clock.h"
#include "engine/base/err.h"
#include "engine/base/log.h"
#include "server/auth.h"
#include "server/req.h"
#include "server/routes.h"
#include "server/slot.h"
#include "server/sse.h"
#include "server/status.h"

struct http_server {
    struct MHD_Daemon *daemon;
    const struct routes_ctx *app;      // borrowed
    struct http_params p;
    struct slot *slots;           // owned [n_slots]
    int32_t n_slots;
    pthread_mutex_t slots_lock;        // guards the free list
    int32_t first_free;                // -1: none
    struct metrics_live live;          // counters and the drain flag; routes.c reads them
    pthread_t ticker;
    bool has_ticker;
    pthread_mutex_t tick_lock;
    pthread_cond_t tick_cond;
    bool stopping;                     // under tick_lock
};

struct http_params http_default_params(void) {
    return (struct http_params){
        .host = "127.0.0.1",
        .port = 8080,
        .max_body_bytes = 4 << 20,
        .request_timeout_s = 600,
        .heartbeat_s = 10,
        .max_connections = 4096,
    };
}

/* ---- slots, park and wake ---------------------------------------------------- */

static struct slot *slot_take(struct http_server *h) {
    pthread_mutex_lock(&h->slots_lock);
    struct slot *s = NULL;
    if (h->first_free >= 0) {
        s = &h->slots[h->first_free];
        h->first_free = s->next_free;
    }
    pthread_mutex_unlock(&h->slots_lock);
    return s;
}

static void slot_put(struct http_server *h, struct slot *s) {
    pthread_mutex_lock(&s->lock);
    s->req = NULL;
    s->conn = NULL;
    s->suspended = false;
    s->wake_pending = false;
    pthread_mutex_unlock(&s->lock);
    pthread_mutex_lock(&h->slots_lock);
    s->next_free = h->first_free;
    h->first_free = (int32_t)(s - h->slots);
    pthread_mutex_unlock(&h->slots_lock);
}

/* ---- the ticker: deadlines, heartbeats, vanished clients ------------------------- */

/* Whether the peer of a suspended connection has closed. A suspended
 * connection is not touched by MHD's thread, and the caller holds the slot's
 * lock, so the socket is stable; MSG_PEEK leaves any bytes for MHD. */
static bool is_peer_gone(struct MHD_Connection *conn) {
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (!ci) return false;
    char c;
    ssize_t n = recv(ci->connect_fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
    if (n == 0) return true;
    return n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR;
}

static void *ticker_main(void *arg) {
    struct http_server *h = arg;
    const int64_t heartbeat_ns = (int64_t)h->p.heartbeat_s * 1000000000LL;
    pthread_mutex_lock(&h->tick_lock);
    while (!h->stopping) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_sec += 1;
        pthread_cond_timedwait(&h->tick_cond, &h->tick_lock, &ts);
        if (h->stopping) break;
        pthread_mutex_unlock(&h->tick_lock);
        int64_t now = clock_mono_ns();
        for (int32_t i = 0; i < h->n_slots; i++) {
            struct slot *s = &h->slots[i];
            pthread_mutex_lock(&s->lock);
            struct req *r = s->req;
            if (r && s->suspended) {
                bool resume = false;
                if (r->deadline_ns && now > r->deadline_ns && !atomic_load(&r->timed_out)) {
                    atomic_store(&r->timed_out, true);
                    req_cancel(r);  // scheduler_cancel is [any thread]
                    resume = true;
                }
                if (!resume && !atomic_load(&r->client_gone) && is_peer_gone(s->conn)) {
                    atomic_store(&r->client_gone, true);
                    req_cancel(r);
                    resume = true;
                }
                if (r->is_stream && heartbeat_ns && now - r->t_last_write_ns > heartbeat_ns) {
                    atomic_store(&r->heartbeat_due, true);
                    resume = true;
                }
                if (resume) {
                    s->suspended = false;
                    MHD_resume_connection(s->conn);
                }
            }
            pthread_mutex_unlock(&s->lock);
        }
        pthread_mutex_lock(&h->tick_lock);
    }
    pthread_mutex_unlock(&h->tick_lock);
    return NULL;
}

/* ---- responses --------------------------------------------------------------- */

/* Whether an If-None-Match header value names etag (or is "*"): a list of
 * quoted tags, possibly weak (W/"..."), separated by commas (RFC 9110 13.1.2). */
static bool is_etag_match(const char *inm, const char *etag) {
    if (!inm) return false;
    size_t n = strlen(etag);
    for (const char *p = inm; *p;) {
        while (*p == ' ' || *p == '\t' || *p == ',') p++;
        if (*p == '*') return true;
        if (p[0] == 'W' && p[1] == '/') p += 2;
        if (strncmp(p, etag, n) == 0 && (p[n] == 0 || p[n] == ',' || p[n] == ' ')) return true;
        while (*p && *p != ',') p++;
    }
    return false;
}

static enum MHD_Result queue_reply(struct http_server *h, struct req *r,
                                   struct route_reply *rep) {
    struct MHD_Response *resp;
    const char *inm =
        MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_IF_NONE_MATCH);
    if (rep->body || !rep->static_body) {
        const char *body = rep->body ? rep->body : "";
        resp = MHD_create_response_from_buffer(strlen(body), (void *)body, MHD_RESPMEM_MUST_COPY);
        free(rep->body);
        rep->body = NULL;
    } else if (rep->etag && is_etag_match(inm, rep->etag)) {
        rep->status = MHD_HTTP_NOT_MODIFIED;
        resp = MHD_create_response_from_buffer(0, NULL, MHD_RESPMEM_PERSISTENT);
    } else {
        resp = MHD_create_response_from_buffer(rep->static_len, (void *)rep->static_body,
                                               MHD_RESPMEM_PERSISTENT);
    }
    if (!resp) return MHD_NO;
    if (rep->status != MHD_HTTP_NOT_MODIFIED) {
        MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE,
                                rep->content_type ? rep->content_type : "application/json");
    }
    if (rep->etag) MHD_add_response_header(resp, MHD_HTTP_HEADER_ETAG, rep->etag);
    for (const char *const *hd = rep->headers; hd && hd[0]; hd += 2) {
        MHD_add_response_header(resp, hd[0], hd[1]);
    }
    if (rep->retry_after_s > 0) {
        char v[16];
        snprintf(v, sizeof(v), "%d", (int)rep->retry_after_s);
        MHD_add_response_header(resp, MHD_HTTP_HEADER_RETRY_AFTER, v);
    }
    if (rep->status == 401) MHD_add_response_header(resp, "WWW-Authenticate", "Bearer");
    r->status = rep->status;
    if (rep->status >= 400) atomic_fetch_add(&h->live.n_errors, 1);
    if (rep->status == 429) atomic_fetch_add(&h->live.n_full, 1);
    enum MHD_Result ret = MHD_queue_response(r->conn, (unsigned)rep->status, resp);
    MHD_destroy_response(resp);
    return ret;
}

static enum MHD_Result queue_error(struct http_server *h, struct req *r, int status,
                                   const char *message, const char *code) {
    struct route_reply rep = {0};
    routes_error(&rep, status, message, NULL, code);
    return queue_reply(h, r, &rep);
}

static ssize_t stream_reader(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    ssize_t n = sse_read(cls, buf, max);
    return n < 0 ? MHD_CONTENT_READER_END_OF_STREAM : n;
}

static enum MHD_Result queue_stream(struct http_server *h, struct req *r) {
    struct MHD_Response *resp =
        MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16 * 1024, stream_reader, r, NULL);
    if (!resp) return MHD_NO;
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream");
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    r->status = 200;
    r->t_last_write_ns = clock_mono_ns();
    atomic_fetch_add(&h->live.n_streams, 1);
    enum MHD_Result ret = MHD_queue_response(r->conn, MHD_HTTP_OK, resp);
    MHD_destroy_response(resp);
    return ret;
}

/* ---- the access handler -------------------------------------------------------- */

/* A plain response waits for its sequences: answer when all have finished,
 * else suspend (looking again when a wake came in meanwhile). */
static enum MHD_Result wait_or_reply(struct http_server *h, struct req *r) {
    for (;;) {
        req_poll(r);
        if (req_is_finished(r)) break;
        if (slot_park(r->slot)) return MHD_YES;
    }
    struct route_reply rep = {0};
    routes_final_reply(h->app, r, &rep);
    return queue_reply(h, r, &rep);
}

static enum MHD_Result dispatch(struct http_server *h, struct req *r) {
    const struct routes_ctx *app = h->app;
    if (r->handled) return wait_or_reply(h, r);  // resumed while waiting
    if (!r->route) {
        return queue_error(h, r, r->method_ok ? 405 : 404,
                           r->method_ok ? "Method not allowed for this path" : "No such route",
                           NULL);
    }
    if (r->body_too_large) {
        char msg[128];
        snprintf(msg, sizeof(msg), "The request body is larger than the limit of %lld bytes",
                 (long long)h->p.max_body_bytes);
        return queue_error(h, r, 413, msg, "request_too_large");
    }
    if ((r->route->flags & ROUTE_FLAG_AUTH) && app->auth) {
        const char *authz =
            MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
        if (!auth_check(app->auth, authz)) {
            return queue_error(h, r, 401,
                               authz ? "Incorrect API key provided" : "Missing API key: send "
                                                                      "'Authorization: Bearer KEY'",
                               "invalid_api_key");
        }
    }
    if (atomic_load(&h->live.draining) && strcmp(r->route->path, "/health") != 0) {
        return queue_error(h, r, 503, "The server is shutting down", NULL);
    }
    r->handled = true;
    if (h->p.request_timeout_s > 0) {
        r->deadline_ns = r->t_start_ns + (int64_t)h->p.request_timeout_s * 1000000000LL;
    }
    struct route_reply rep = {0};
    switch (r->route->handler(app, r, &rep)) {
    case ROUTE_RESULT_REPLY:
        return queue_reply(h, r, &rep);
    case ROUTE_RESULT_STREAM:
        return queue_stream(h, r);
    case ROUTE_RESULT_WAIT:
        return wait_or_reply(h, r);
    }
    UNREACHABLE();
}

static enum MHD_Result on_access(void *cls, struct MHD_Connection *conn, const char *url,
                                 const char *method, const char *version, const char *upload,
                                 size_t *upload_size, void **con_cls) {
    (void)version;
    struct http_server *h = cls;
    struct req *r = *con_cls;
    if (!r) {
        // First call: headers only.
        struct slot *s = slot_take(h);
        if (!s) return MHD_NO;  // cannot happen: slots == connection limit
        r = req_create(s, conn);
        pthread_mutex_lock(&s->lock);
        s->req = r;
        s->conn = conn;
        pthread_mutex_unlock(&s->lock);
        *con_cls = r;
        atomic_fetch_add(&h->live.n_active, 1);
        bool known = false;
        r->route = routes_find(method, url, &known);
        r->method_ok = known;
        const char *cl =
            MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
        if (cl && strtoll(cl, NULL, 10) > h->p.max_body_bytes) r->body_too_large = true;
        return MHD_YES;
    }
    if (*upload_size) {
        // Body data: keep it up to the limit, drop the rest (answered with 413).
        if (!r->body_too_large && r->body.len + *upload_size <= (size_t)h->p.max_body_bytes) {
            buf_append(&r->body, upload, *upload_size);
        } else {
            r->body_too_large = true;
        }
        *upload_size = 0;
        return MHD_YES;
    }
    return dispatch(h, r);
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
                         enum MHD_RequestTerminationCode toe) {
    (void)conn;
    struct http_server *h = cls;
    struct req *r = *con_cls;
    if (!r) return;
    *con_cls = NULL;
    atomic_fetch_add(&h->live.n_requests, 1);
    if (r->is_stream) atomic_fetch_sub(&h->live.n_streams, 1);
    bool gone = toe != MHD_REQUEST_TERMINATED_COMPLETED_OK;
    if (r->n_choices && (atomic_load(&r->client_gone) || (gone && !req_is_finished(r)))) {
        atomic_fetch_add(&h->live.n_disconnects, 1);
    }
    if (r->n_choices) {
        int64_t ms = (clock_mono_ns() - r->t_start_ns) / 1000000;
        LOG_INFO("req=%s route=%s status=%d n_prompt=%d n_gen=%d ms=%lld%s", r->id,
                 r->route ? r->route->path : "?", r->status, (int)r->n_prompt_total,
                 (int)req_n_generated(r), (long long)ms, gone ? " client_gone=1" : "");
    }
    struct slot *s = r->slot;
    // Empty the slot before the req goes, so a wake in flight finds nothing.
    pthread_mutex_lock(&s->lock);
    s->req = NULL;
    pthread_mutex_unlock(&s->lock);
    req_destroy(r);  // the single release point (STYLE 2.7.12)
    slot_put(h, s);
    atomic_fetch_sub(&h->live.n_active, 1);
}

static void mhd_log(void *cls, const char *fmt, va_list ap) {
    (void)cls;
    char line[512];
    vsnprintf(line, sizeof(line), fmt, ap);
    size_t n = strlen(line);
    while (n && (line[n - 1] == '\n' || line[n - 1] == '\r')) line[--n] = 0;
    LOG_DEBUG("mhd: %s", line);
}

/* ---- lifecycle ----------------------------------------------------------------- */

int http_start(const struct http_params *p, const struct routes_ctx *app,
               struct http_server **out) {
    *out = NULL;
    struct sockaddr_in addr = {0};
    addr.sin_family = AF_INET;
    addr.sin_port = htons((uint16_t)p->port);
    const char *host = strcmp(p->host, "localhost") == 0 ? "127.0.0.1" : p->host;
    if (inet_pton(AF_INET, host, &addr.sin_addr) != 1) {
        LOG_ERROR("%s: --host '%s' is not an IPv4 address", __func__, p->host);
        return ERR_INVAL;
    }
    struct http_server *h = xcalloc(1, sizeof(*h));
    h->p = *p;
    h->app = app;
    h->n_slots = p->max_connections;
    h->slots = xcalloc((size_t)h->n_slots, sizeof(*h->slots));
    for (int32_t i = 0; i < h->n_slots; i++) {
        pthread_mutex_init(&h->slots[i].lock, NULL);
        h->slots[i].next_free = i + 1 < h->n_slots ? i + 1 : -1;
    }
    h->first_free = 0;
    pthread_mutex_init(&h->slots_lock, NULL);
    pthread_mutex_init(&h->tick_lock, NULL);
    pthread_cond_init(&h->tick_cond, NULL);

    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL | MHD_ALLOW_SUSPEND_RESUME |
                     MHD_USE_ERROR_LOG;
    h->daemon = MHD_start_daemon(
        flags, (uint16_t)p->port, NULL, NULL, on_access, h,
        MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&addr,
        MHD_OPTION_NOTIFY_COMPLETED, on_completed, h,
        MHD_OPTION_CONNECTION_LIMIT, (unsigned)p->max_connections,
        MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)120,
        MHD_OPTION_LISTENING_ADDRESS_REUSE, (unsigned)1,
        MHD_OPTION_EXTERNAL_LOGGER, mhd_log, NULL,
        MHD_OPTION_END);
    if (!h->daemon) {
        LOG_ERROR("%s: cannot listen on %s:%d (in use, or not an address of this machine)",
                  __func__, p->host, (int)p->port);
        http_stop(h);
        return ERR_IO;
    }
    if (pthread_create(&h->ticker, NULL, ticker_main, h) != 0) {
        http_stop(h);
        return ERR_NOMEM;
    }
    h->has_ticker = true;
    ((struct routes_ctx *)app)->live = &h->live;
    *out = h;
    return 0;
}

void http_drain(struct http_server *h) {
    atomic_store(&h->live.draining, true);
}

int32_t http_n_active(struct http_server *h) {
    return atomic_load(&h->live.n_active);
}

void http_note_disconnect(struct http_server *h) {
    atomic_fetch_add(&h->live.n_disconnects, 1);
}

void http_stop(struct http_server *h) {
    if (!h) return;
    if (h->has_ticker) {
        pthread_mutex_lock(&h->tick_lock);
        h->stopping = true;
        pthread_cond_signal(&h->tick_cond);
        pthread_mutex_unlock(&h->tick_lock);
        pthread_join(h->ticker, NULL);
    }
    if (h->daemon) {
        // MHD requires every suspended connection resumed before it stops.
        for (int32_t i = 0; i < h->n_slots; i++) {
            struct slot *s = &h->slots[i];
            pthread_mutex_lock(&s->lock);
            if (s->req) {
                req_cancel(s->req);
                if (s->suspended) {
                    s->suspended = false;
                    MHD_resume_connection(s->conn);
                }
            }
            pthread_mutex_unlock(&s->lock);
        }
        MHD_stop_daemon(h->daemon);
    }
    for (int32_t i = 0; i < h->n_slots; i++) pthread_mutex_destroy(&h->slots[i].lock);
    free(h->slots);
    pthread_mutex_destroy(&h->slots_lock);
    pthread_mutex_destroy(&h->tick_lock);
    pthread_cond_destroy(&h->tick_cond);
    free(h);
}
