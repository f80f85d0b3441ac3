/*
 * server/routes.h - the static route table (method, path, handler, flags)
 * and the handlers: /health, /metrics, /v1/models, /tokenize, /detokenize,
 * /v1/completions, /v1/chat/completions, /v1/load_lora_adapter and
 * /v1/unload_lora_adapter (the adapter admin routes: refused with 403 unless
 * allow_runtime_lora, and behind the API key when keys are configured), and
 * the playground's files at GET / and GET /playground.{css,js}
 * (server/web_files.h): the page loads without the API key and asks for it;
 * every API call it makes needs the key as any client's does.
 *
 * Handlers parse, validate and submit; they never block. A handler either
 * fills a reply at once, or submits work and asks http.c to wait for it
 * (sequences, or an adapter load on the loader thread; answered by
 * routes_final_reply()) or to stream it (sse.c). Threads: [HTTP thread].
 */
#ifndef SERVER_ROUTES_H
#define SERVER_ROUTES_H

#include <stdbool.h>
#include <stdint.h>

#include "scheduler/scheduler.h"
#include "server/openai.h"

struct auth;
struct metrics_live;
struct lora_loader;
struct lora_path_root;
struct lora_registry;
struct req;

/* What the handlers need; borrowed for the server's life. */
struct routes_ctx {
    struct scheduler *sched;
    const struct engine_model *model;
    struct openai_model om;     // served name, context, chat family
    const struct auth *auth;
    struct lora_registry *loras;  // served adapters ("model": NAME); NULL: none
    bool allow_runtime_lora;    // POST /v1/load_lora_adapter and /v1/unload_lora_adapter
    struct lora_loader *lora_loader;  // runs the loads of /v1/load_lora_adapter; NULL: none
    const struct lora_path_root *lora_root;  // --lora-dir: runtime loads read only inside; NULL: none
    struct metrics_live *live;  // the HTTP server's counters; set by http_start()
    int64_t started_s;          // Unix time the model was loaded
};

enum route_flag {
    ROUTE_FLAG_AUTH = 1,        // needs an API key when keys are configured
    ROUTE_FLAG_BODY = 2,        // reads a JSON body
};

/* A response that is complete now. body is owned (free()); content_type is
 * static. A static file sets static_body instead of body, and may set etag
 * (then http.c answers an If-None-Match that names it with 304 and no body)
 * and headers (more response headers). */
struct route_reply {
    int status;
    char *body;
    const char *content_type;
    int32_t retry_after_s;      // > 0: a Retry-After header
    const void *static_body;    // borrowed for the program's life; used when body is NULL
    size_t static_len;          // bytes of static_body
    const char *etag;           // static, quoted; NULL: none
    const char *const *headers; // static {name, value, ..., NULL}; NULL: none
};

enum route_result {
    ROUTE_RESULT_REPLY,         // out is filled
    ROUTE_RESULT_WAIT,          // sequences or a load submitted; answer when they finish
    ROUTE_RESULT_STREAM,        // sequences submitted; stream them
};

typedef enum route_result (*route_handler_fn)(const struct routes_ctx *ctx, struct req *r,
                                              struct route_reply *out);

struct route {
    const char *method;
    const char *path;
    route_handler_fn handler;
    unsigned flags;
};

/* The route for method and path (query string already removed), or NULL;
 * *out_path_known tells 404 (no such path) from 405 (wrong method). */
const struct route *routes_find(const char *method, const char *path, bool *out_path_known);

/* Fills out with an OpenAI error body for status. */
void routes_error(struct route_reply *out, int status, const char *message, const char *param,
                  const char *code);


/* The full response of a request whose sequences have all finished, or
 * whose adapter load is done (or no longer waited for). */
void routes_final_reply(const struct routes_ctx *ctx, struct req *r, struct route_reply *out);

#endif
