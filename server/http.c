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
#include <strings.h>
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

/* One TCP connection, from MHD's "started" to its "closed" notification
 * (the socket context). The ticker closes one that is receiving a request
 * for longer than read_timeout_s (a slowloris client) or whose client has
 * gone (close_dead_receivers). Under conns_lock. */
struct http_conn {
    struct http_conn *prev;
    struct http_conn *next;
    int fd;                    // valid until the "closed" notification unlinks it
    bool is_receiving;         // no request of it is being answered
    int64_t t_receive_ns;      // opened, or its last response ended
    int32_t n_eof_ticks;       // ticker passes in a row that found the client's end closed
};

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
    pthread_mutex_t conns_lock;        // guards conns and every http_conn in it
    struct http_conn conns;            // sentinel of the list of open connections
};

struct http_params http_default_params(void) {
    return (struct http_params){
        .host = "127.0.0.1",
        .port = 8080,
        .max_body_bytes = 4 << 20,
        .request_timeout_s = 600,
        .heartbeat_s = 10,
        .max_connections = 4096,
        .idle_timeout_s = 60,
        .read_timeout_s = 30,
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
static bool is_fd_peer_gone(int fd) {
    char c;
    ssize_t n = recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
    if (n == 0) return true;
    return n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR;
}

static bool is_peer_gone(struct MHD_Connection *conn) {
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    return ci && is_fd_peer_gone(ci->connect_fd);
}

/* Closes every connection that has spent longer than read_timeout_s
 * receiving a request, or whose client has closed its end while the server
 * waits for (the rest of) a request: its socket is shut down, so MHD sees
 * the end of the stream and closes it on its own thread (nothing is sent: a
 * keep-alive connection idle between requests looks the same, and a stale
 * 408 would be read as the answer to the client's next request). MHD 0.9.75
 * with epoll misses a FIN that arrives with the last bytes it reads (a read
 * shorter than its buffer clears its read-ready flag, and the edge-triggered
 * epoll never fires again), so a client that sent half a request and left
 * would hold its connection and request until the timeouts. The FIN must be
 * seen on two ticks in a row: between MHD's read of a whole request and its
 * call of on_access the connection still looks like one receiving. The lock
 * keeps the "closed" notification, and so the close of the fd, waiting
 * meanwhile. */
static void close_dead_receivers(struct http_server *h, int64_t now) {
    const int64_t limit_ns = (int64_t)h->p.read_timeout_s * 1000000000LL;
    pthread_mutex_lock(&h->conns_lock);
    for (struct http_conn *c = h->conns.next; c != &h->conns; c = c->next) {
        if (!c->is_receiving) continue;
        bool is_slow = limit_ns > 0 && now - c->t_receive_ns > limit_ns;
        c->n_eof_ticks = is_fd_peer_gone(c->fd) ? c->n_eof_ticks + 1 : 0;
        if (!is_slow && c->n_eof_ticks < 2) continue;
        c->is_receiving = false;
        shutdown(c->fd, SHUT_RDWR);
        if (is_slow) atomic_fetch_add(&h->live.n_read_timeouts, 1);
    }
    pthread_mutex_unlock(&h->conns_lock);
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
        close_dead_receivers(h, now);
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
        if (req_is_finished(r) || atomic_load(&r->is_aborted)) break;
        if (slot_park(r->slot)) return MHD_YES;
    }
    struct route_reply rep = {0};
    routes_final_reply(h->app, r, &rep);
    return queue_reply(h, r, &rep);
}

/* The methods of RFC 9110 section 9 and PATCH: a route that lacks one
 * answers 405; any other method is unknown to the server (501). */
static bool is_known_method(const char *m) {
    static const char *const known[] = {"GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT",
                                        "OPTIONS", "TRACE", "PATCH"};
    for (size_t i = 0; i < sizeof(known) / sizeof(known[0]); i++) {
        if (strcmp(m, known[i]) == 0) return true;
    }
    return false;
}

/* The Allow header of a 405: the methods path has (RFC 9110 15.5.6). */
static void allowed_methods(const char *path, char *out, size_t n) {
    static const char *const methods[] = {"GET", "HEAD", "POST"};
    out[0] = 0;
    for (size_t i = 0; i < sizeof(methods) / sizeof(methods[0]); i++) {
        bool known = false;
        const char *m = strcmp(methods[i], "HEAD") == 0 ? "GET" : methods[i];
        if (!routes_find(m, path, &known)) continue;
        size_t len = strlen(out);
        snprintf(out + len, n - len, "%s%s", len ? ", " : "", methods[i]);
    }
}

/* The path of an absolute-form target ("http://host:port/path", which
 * RFC 9112 3.2.2 says a server MUST accept), or url itself. */
static const char *origin_path(const char *url) {
    const char *p = NULL;
    if (strncasecmp(url, "http://", 7) == 0) p = url + 7;
    if (strncasecmp(url, "https://", 8) == 0) p = url + 8;
    if (!p) return url;
    const char *slash = strchr(p, '/');
    return slash ? slash : "/";
}

/* Case-insensitive comparison of a header value's first token (up to ';'
 * or the end, blanks around it ignored) with word. */
static bool is_token(const char *v, const char *word) {
    while (*v == ' ' || *v == '\t') v++;
    size_t n = strlen(word);
    if (strncasecmp(v, word, n) != 0) return false;
    v += n;
    while (*v == ' ' || *v == '\t') v++;
    return *v == 0 || *v == ';';
}

struct head_counts {
    bool has_bad_name;              // a field name that is not a token (RFC 9110 5.1)
    int n_content_length;
    bool is_content_length_mixed;   // two Content-Length values differ
    const char *content_length;
};

static enum MHD_Result count_header(void *cls, enum MHD_ValueKind kind, const char *key,
                                    const char *value) {
    (void)kind;
    struct head_counts *c = cls;
    if (!key[0] || strpbrk(key, " \t\"(),/:;<=>?@[\\]{}")) c->has_bad_name = true;
    if (strcasecmp(key, MHD_HTTP_HEADER_CONTENT_LENGTH) != 0) return MHD_YES;
    if (c->n_content_length++ && strcmp(c->content_length, value ? value : "") != 0) {
        c->is_content_length_mixed = true;
    }
    c->content_length = value ? value : "";
    return MHD_YES;
}

static const char *const close_headers[] = {"Connection", "close", NULL};

static enum MHD_Result queue_error_ex(struct http_server *h, struct req *r, int status,
                                      const char *message, const char *code,
                                      const char *const *headers) {
    struct route_reply rep = {0};
    routes_error(&rep, status, message, NULL, code);
    rep.headers = headers;
    return queue_reply(h, r, &rep);
}

/* What the request line and headers alone decide, answered before any of
 * the body is read (so a refused Expect: 100-continue gets no 100):
 * framing that cannot be trusted (RFC 9112 6.3: 400, and the connection
 * closes), a body announced over the limit (413), an unknown method (501),
 * HTTP/1.1 without Host (400, RFC 9112 3.2), a body that is not JSON by
 * its Content-Type or is content-coded (415, RFC 9110 15.5.16). Absent and
 * application/x-www-form-urlencoded (what `curl -d` sends) types are taken
 * as JSON. Returns true when it queued an answer (*ret). */
static bool answer_head(struct http_server *h, struct req *r, const char *method,
                        const char *version, enum MHD_Result *ret) {
    struct MHD_Connection *conn = r->conn;
    const char *te = MHD_lookup_connection_value(conn, MHD_HEADER_KIND,
                                                 MHD_HTTP_HEADER_TRANSFER_ENCODING);
    struct head_counts hc = {0};
    MHD_get_connection_values(conn, MHD_HEADER_KIND, count_header, &hc);
    const char *msg = NULL;
    int status = 0;
    const char *const *hdrs = close_headers;
    if (hc.has_bad_name) {
        status = 400, msg = "A header field name is not a token (RFC 9110 5.1)";
    } else if (hc.is_content_length_mixed) {
        status = 400, msg = "The request has conflicting Content-Length headers";
    } else if (te && hc.n_content_length) {
        status = 400, msg = "The request has both Transfer-Encoding and Content-Length";
    } else if (te && !is_token(te, "chunked")) {
        const char *last = strrchr(te, ',');
        status = is_token(last ? last + 1 : te, "chunked") ? 501 : 400;
        msg = status == 501 ? "Only the chunked transfer coding is supported"
                            : "The request body's length cannot be determined: Transfer-Encoding "
                              "must end in chunked";
    } else if (hc.content_length && strtoll(hc.content_length, NULL, 10) > h->p.max_body_bytes) {
        r->body_too_large = true;
        char m[128];
        snprintf(m, sizeof(m), "The request body is larger than the limit of %lld bytes",
                 (long long)h->p.max_body_bytes);
        *ret = queue_error_ex(h, r, 413, m, "request_too_large", close_headers);
        return true;
    } else if (!is_known_method(method)) {
        status = 501, msg = "Unknown HTTP method", hdrs = NULL;
    } else if (strcmp(version, MHD_HTTP_VERSION_1_1) == 0 &&
               !MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_HOST)) {
        status = 400, msg = "An HTTP/1.1 request needs a Host header";
    } else if (r->route && (r->route->flags & ROUTE_FLAG_BODY)) {
        const char *ct = MHD_lookup_connection_value(conn, MHD_HEADER_KIND,
                                                     MHD_HTTP_HEADER_CONTENT_TYPE);
        const char *ce = MHD_lookup_connection_value(conn, MHD_HEADER_KIND,
                                                     MHD_HTTP_HEADER_CONTENT_ENCODING);
        hdrs = NULL;
        if (ct && !is_token(ct, "application/json") &&
            !is_token(ct, "application/x-www-form-urlencoded")) {
            status = 415, msg = "The request body must be JSON (Content-Type: application/json)";
        } else if (ce && !is_token(ce, "identity")) {
            status = 415, msg = "Content-Encoding of the request body is not supported";
        }
    }
    if (!status) return false;
    *ret = queue_error_ex(h, r, status, msg, NULL, hdrs);
    return true;
}

static enum MHD_Result dispatch(struct http_server *h, struct req *r, const char *url) {
    const struct routes_ctx *app = h->app;
    if (r->handled) return wait_or_reply(h, r);  // resumed while waiting
    if (!r->route && !r->method_ok) return queue_error(h, r, 404, "No such route", NULL);
    if (!r->route) {
        char allow[64];
        allowed_methods(origin_path(url), allow, sizeof(allow));
        const char *hdrs[] = {"Allow", allow, NULL};
        return queue_error_ex(h, r, 405, "Method not allowed for this path", NULL, hdrs);
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

/* The connection's struct http_conn (NULL when MHD has none). */
static struct http_conn *conn_of(struct MHD_Connection *conn) {
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(conn, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    return ci ? ci->socket_context : NULL;
}

static void set_receiving(struct http_server *h, struct MHD_Connection *conn, bool receiving) {
    struct http_conn *c = conn_of(conn);
    if (!c) return;
    pthread_mutex_lock(&h->conns_lock);
    c->is_receiving = receiving;
    c->t_receive_ns = clock_mono_ns();
    c->n_eof_ticks = 0;
    pthread_mutex_unlock(&h->conns_lock);
}

static enum MHD_Result on_access(void *cls, struct MHD_Connection *conn, const char *url,
                                 const char *method, const char *version, const char *upload,
                                 size_t *upload_size, void **con_cls) {
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
        // HEAD is GET without the body (RFC 9110 9.3.2); MHD leaves the body out.
        const char *path = origin_path(url);
        r->route = routes_find(strcmp(method, "HEAD") == 0 ? "GET" : method, path, &known);
        r->method_ok = known;
        enum MHD_Result ret = MHD_YES;
        if (answer_head(h, r, method, version, &ret)) set_receiving(h, conn, false);
        return ret;
    }
    if (r->status && !r->handled) {
        // Answered from the head (answer_head): the body, if any, is dropped.
        *upload_size = 0;
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
    if (!r->handled) set_receiving(h, conn, false);
    return dispatch(h, r, url);
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
                         enum MHD_RequestTerminationCode toe) {
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
    set_receiving(h, conn, true);  // keep-alive: the next request's clock starts
    struct slot *s = r->slot;
    // Empty the slot before the req goes, so a wake in flight finds nothing.
    pthread_mutex_lock(&s->lock);
    s->req = NULL;
    pthread_mutex_unlock(&s->lock);
    req_destroy(r);  // the single release point (STYLE 2.7.12)
    slot_put(h, s);
    atomic_fetch_sub(&h->live.n_active, 1);
}

/* Connections opened and closed: the list close_dead_receivers() walks. */
static void on_connection(void *cls, struct MHD_Connection *conn, void **socket_context,
                          enum MHD_ConnectionNotificationCode code) {
    struct http_server *h = cls;
    if (code == MHD_CONNECTION_NOTIFY_STARTED) {
        const union MHD_ConnectionInfo *ci =
            MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
        struct http_conn *c = xcalloc(1, sizeof(*c));
        c->fd = ci ? ci->connect_fd : -1;
        c->is_receiving = c->fd >= 0;
        c->t_receive_ns = clock_mono_ns();
        pthread_mutex_lock(&h->conns_lock);
        c->next = h->conns.next;
        c->prev = &h->conns;
        h->conns.next->prev = c;
        h->conns.next = c;
        pthread_mutex_unlock(&h->conns_lock);
        *socket_context = c;
        return;
    }
    struct http_conn *c = *socket_context;
    if (!c) return;
    pthread_mutex_lock(&h->conns_lock);
    c->prev->next = c->next;
    c->next->prev = c->prev;
    pthread_mutex_unlock(&h->conns_lock);
    free(c);
    *socket_context = NULL;
}

/* MHD's URL decoding, except that %00 stays as it is: a decoded NUL would
 * cut the path short ("/health%00x" would be "/health"). Decodes in place
 * and returns the new length. */
static size_t unescape_url(void *cls, struct MHD_Connection *conn, char *s) {
    (void)cls;
    (void)conn;
    size_t o = 0;
    for (size_t i = 0; s[i]; i++) {
        int hi = -1;
        int lo = -1;
        if (s[i] == '%' && s[i + 1] && s[i + 2]) {
            char a[2] = {s[i + 1], s[i + 2]};
            for (int k = 0; k < 2; k++) {
                int v = a[k] >= '0' && a[k] <= '9'   ? a[k] - '0'
                        : a[k] >= 'a' && a[k] <= 'f' ? a[k] - 'a' + 10
                        : a[k] >= 'A' && a[k] <= 'F' ? a[k] - 'A' + 10
                                                     : -1;
                if (k == 0) hi = v; else lo = v;
            }
        }
        if (hi >= 0 && lo >= 0 && (hi | lo)) {
            s[o++] = (char)(hi * 16 + lo);
            i += 2;
        } else {
            s[o++] = s[i];
        }
    }
    s[o] = 0;
    return o;
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
    pthread_mutex_init(&h->conns_lock, NULL);
    h->conns.next = h->conns.prev = &h->conns;

    // The routes read the counters from the first request on, and MHD serves requests
    // as soon as it starts: set before it (a /metrics request that came in between
    // read them through NULL: a segfault seen under load, integration/lora_load).
    ((struct routes_ctx *)app)->live = &h->live;
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL | MHD_ALLOW_SUSPEND_RESUME |
                     MHD_USE_ERROR_LOG;
    h->daemon = MHD_start_daemon(
        flags, (uint16_t)p->port, NULL, NULL, on_access, h,
        MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&addr,
        MHD_OPTION_NOTIFY_COMPLETED, on_completed, h,
        MHD_OPTION_CONNECTION_LIMIT, (unsigned)p->max_connections,
        MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)p->idle_timeout_s,
        MHD_OPTION_NOTIFY_CONNECTION, on_connection, h,
        MHD_OPTION_UNESCAPE_CALLBACK, unescape_url, NULL,
        MHD_OPTION_LISTENING_ADDRESS_REUSE, (unsigned)1,
        MHD_OPTION_EXTERNAL_LOGGER, mhd_log, NULL,
        MHD_OPTION_END);
    if (!h->daemon) {
        LOG_ERROR("%s: cannot listen on %s:%d (in use, or not an address of this machine)",
                  __func__, p->host, (int)p->port);
        ((struct routes_ctx *)app)->live = NULL;
        http_stop(h);
        return ERR_IO;
    }
    if (pthread_create(&h->ticker, NULL, ticker_main, h) != 0) {
        http_stop(h);
        ((struct routes_ctx *)app)->live = NULL;
        return ERR_NOMEM;
    }
    h->has_ticker = true;
    *out = h;
    return 0;
}

void http_drain(struct http_server *h) {
    atomic_store(&h->live.draining, true);
}

void http_abort_all(struct http_server *h) {
    atomic_store(&h->live.draining, true);
    for (int32_t i = 0; i < h->n_slots; i++) {
        struct slot *s = &h->slots[i];
        pthread_mutex_lock(&s->lock);
        if (s->req) {
            atomic_store(&s->req->is_aborted, true);
            if (s->suspended) {
                s->suspended = false;
                MHD_resume_connection(s->conn);
            }
        }
        pthread_mutex_unlock(&s->lock);
    }
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
    pthread_mutex_destroy(&h->conns_lock);
    free(h);
}
