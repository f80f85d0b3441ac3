/*
 * server/routes.c - the route table and its handlers.
 */
#define LOG_TAG "routes"
#include "server/routes.h"

#include <limits.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <jansson.h>

#include "engine/base/alloc.h"
#include "engine/base/err.h"
#include "engine/base/fault.h"
#include "engine/base/log.h"
#include "server/lora_loader.h"
#include "server/lora_path.h"
#include "server/lora_registry.h"
#include "server/metrics.h"
#include "server/req.h"
#include "server/tool_call.h"
#include "server/slot.h"
#include "server/status.h"
#include "server/web_files.h"

static const char JSON_TYPE[] = "application/json";

void routes_error(struct route_reply *out, int status, const char *message, const char *param,
                  const char *code) {
    out->status = status;
    out->body = openai_error_json(message, status_error_type(status), param, code);
    out->content_type = JSON_TYPE;
    if (status == 429) out->retry_after_s = 1;
}

static void reply_json(struct route_reply *out, int status, json_t *root) {
    out->status = status;
    out->body = json_dumps(root, JSON_COMPACT);
    ASSERT(out->body);
    out->content_type = JSON_TYPE;
    json_decref(root);
}

/* ---- simple routes ---------------------------------------------------------- */

static enum route_result handle_health(const struct routes_ctx *ctx, struct req *r,
                                       struct route_reply *out) {
    (void)r;
    // 200 only with the model loaded, the step loop alive (running, not
    // hung) and not shutting down: a load balancer takes the rest out.
    bool ok = ctx->model && ctx->sched && scheduler_is_alive(ctx->sched) &&
              !(ctx->live && atomic_load(&ctx->live->draining));
    json_t *o = json_object();
    json_object_set_new(o, "status", json_string(ok ? "ok" : "unavailable"));
    if (ctx->sched) {
        // Under tensor parallelism: every rank, with its last report (at most a second old;
        // a rank that died ends the whole job, so a listed rank is a live one).
        struct scheduler_stats st;
        scheduler_get_stats(ctx->sched, &st);
        if (st.n_ranks > 1) {
            json_t *ranks = json_array();
            const int32_t n = st.n_ranks < STATS_MAX_RANKS ? st.n_ranks : STATS_MAX_RANKS;
            for (int32_t i = 0; i < n; i++) {
                json_t *rk = json_object();
                json_object_set_new(rk, "rank", json_integer(i));
                json_object_set_new(rk, "peak_rss_bytes",
                                    json_integer(st.ranks[i].peak_rss_bytes));
                json_object_set_new(rk, "forward_seconds",
                                    json_real((double)st.ranks[i].forward_ns / 1e9));
                json_object_set_new(rk, "steps", json_integer(st.ranks[i].n_steps));
                json_object_set_new(rk, "comm_bytes", json_integer(st.ranks[i].comm_bytes));
                json_object_set_new(rk, "rss_bytes", json_integer(st.ranks[i].rss_bytes));
                json_object_set_new(rk, "model_read_bytes",
                                    json_integer(st.ranks[i].model_read_bytes));
                json_array_append_new(ranks, rk);
            }
            json_object_set_new(o, "n_ranks", json_integer(st.n_ranks));
            json_object_set_new(o, "ranks", ranks);
        }
    }
    reply_json(out, ok ? 200 : 503, o);
    return ROUTE_RESULT_REPLY;
}

static enum route_result handle_metrics(const struct routes_ctx *ctx, struct req *r,
                                        struct route_reply *out) {
    (void)r;
    struct scheduler_stats st;
    scheduler_get_stats(ctx->sched, &st);
    struct metrics_server sv;
    metrics_live_read(ctx->live, &sv);
    sv.n_lora_adapters = ctx->loras ? lora_registry_count(ctx->loras) : 0;
    sv.n_lora_loads_queued = 0;
    sv.n_lora_loads_running = 0;
    if (ctx->lora_loader) {
        lora_loader_get_counts(ctx->lora_loader, &sv.n_lora_loads_queued,
                               &sv.n_lora_loads_running);
    }
    struct buf b = {0};
    metrics_format(&b, &st, stats_bucket_ms, &sv);
    out->status = 200;
    out->body = buf_take(&b);
    out->content_type = "text/plain; version=0.0.4; charset=utf-8";
    return ROUTE_RESULT_REPLY;
}

/* One /v1/models entry, in vLLM's shape: adapters name their base as parent
 * and their path as root. */
static json_t *model_json(const char *id, int64_t created, const char *root, const char *parent,
                          int32_t n_ctx) {
    json_t *m = json_object();
    json_object_set_new(m, "id", json_string(id));
    json_object_set_new(m, "object", json_string("model"));
    json_object_set_new(m, "created", json_integer(created));
    json_object_set_new(m, "owned_by", json_string("llmserve"));
    json_object_set_new(m, "root", json_string(root));
    json_object_set_new(m, "parent", parent ? json_string(parent) : json_null());
    json_object_set_new(m, "max_model_len", json_integer(n_ctx));
    return m;
}

struct models_list {
    const struct routes_ctx *ctx;
    json_t *data;
};

static void add_adapter_model(const struct lora_registry_entry *e, void *user) {
    struct models_list *l = user;
    json_array_append_new(l->data, model_json(e->name, e->created_s, e->path, l->ctx->om.name,
                                              l->ctx->om.n_ctx));
}

static enum route_result handle_models(const struct routes_ctx *ctx, struct req *r,
                                       struct route_reply *out) {
    (void)r;
    json_t *data = json_array();
    json_array_append_new(data, model_json(ctx->om.name, ctx->started_s, ctx->om.name, NULL,
                                           ctx->om.n_ctx));
    struct models_list l = {ctx, data};
    if (ctx->loras) lora_registry_foreach(ctx->loras, add_adapter_model, &l);
    json_t *o = json_object();
    json_object_set_new(o, "object", json_string("list"));
    json_object_set_new(o, "data", data);
    reply_json(out, 200, o);
    return ROUTE_RESULT_REPLY;
}

static json_t *parse_body(struct req *r, struct route_reply *out) {
    json_error_t jerr;
    json_t *root = json_loadb(r->body.data ? r->body.data : "", r->body.len, 0, &jerr);
    if (!root || !json_is_object(root)) {
        char msg[256];
        snprintf(msg, sizeof(msg), "The request body must be a JSON object%s%s",
                 root ? "" : ": ", root ? "" : jerr.text);
        json_decref(root);
        routes_error(out, 400, msg, NULL, NULL);
        return NULL;
    }
    return root;
}

/* POST /tokenize {"prompt": "...", "add_special_tokens": true} -> {"tokens", "count"} */
static enum route_result handle_tokenize(const struct routes_ctx *ctx, struct req *r,
                                         struct route_reply *out) {
    json_t *root = parse_body(r, out);
    if (!root) return ROUTE_RESULT_REPLY;
    json_t *p = json_object_get(root, "prompt");
    if (!p) p = json_object_get(root, "content");  // llama.cpp's name
    json_t *add = json_object_get(root, "add_special_tokens");
    if (!json_is_string(p) || (add && !json_is_null(add) && !json_is_boolean(add))) {
        bool bad_prompt = !json_is_string(p);
        json_decref(root);
        routes_error(out, 400, bad_prompt ? "'prompt' must be a string"
                                          : "'add_special_tokens' must be a boolean",
                     bad_prompt ? "prompt" : "add_special_tokens", NULL);
        return ROUTE_RESULT_REPLY;
    }
    const struct tokenizer *tok = engine_model_tokenizer(ctx->model);
    int32_t *ids = NULL;
    int32_t n = 0;
    int err = tokenizer_encode(tok, json_string_value(p), json_string_length(p),
                               !json_is_false(add), true, &ids, &n);
    json_decref(root);
    if (err) {
        routes_error(out, status_for_err(err),
                     err == ERR_INVAL ? "'prompt' is not valid UTF-8" : err_str(err), "prompt",
                     NULL);
        return ROUTE_RESULT_REPLY;
    }
    json_t *arr = json_array();
    for (int32_t i = 0; i < n; i++) json_array_append_new(arr, json_integer(ids[i]));
    free(ids);
    json_t *o = json_object();
    json_object_set_new(o, "tokens", arr);
    json_object_set_new(o, "count", json_integer(n));
    json_object_set_new(o, "max_model_len", json_integer(ctx->om.n_ctx));
    reply_json(out, 200, o);
    return ROUTE_RESULT_REPLY;
}

/* POST /detokenize {"tokens": [ids]} -> {"prompt": "..."} */
static enum route_result handle_detokenize(const struct routes_ctx *ctx, struct req *r,
                                           struct route_reply *out) {
    json_t *root = parse_body(r, out);
    if (!root) return ROUTE_RESULT_REPLY;
    const struct tokenizer *tok = engine_model_tokenizer(ctx->model);
    int32_t n_vocab = tokenizer_n_vocab(tok);
    json_t *t = json_object_get(root, "tokens");
    if (!json_is_array(t)) {
        json_decref(root);
        routes_error(out, 400, "'tokens' must be an array of token ids", "tokens", NULL);
        return ROUTE_RESULT_REPLY;
    }
    size_t n = json_array_size(t);
    int32_t *ids = xmalloc((n ? n : 1) * sizeof(int32_t));
    size_t i;
    json_t *v;
    json_array_foreach(t, i, v) {
        if (!json_is_integer(v) || json_integer_value(v) < 0 ||
            json_integer_value(v) >= n_vocab) {
            free(ids);
            json_decref(root);
            char msg[128];
            snprintf(msg, sizeof(msg), "'tokens' must hold token ids in [0, %d)", (int)n_vocab);
            routes_error(out, 400, msg, "tokens", NULL);
            return ROUTE_RESULT_REPLY;
        }
        ids[i] = (int32_t)json_integer_value(v);
    }
    json_decref(root);
    struct buf text = {0};
    tokenizer_decode(tok, ids, (int32_t)n, false, &text);
    free(ids);
    json_t *o = json_object();
    json_object_set_new(o, "prompt", json_stringn(text.data ? text.data : "", text.len));
    buf_free(&text);
    reply_json(out, 200, o);
    return ROUTE_RESULT_REPLY;
}

/* ---- completions ------------------------------------------------------------ */

static enum route_result handle_generate(const struct routes_ctx *ctx, struct req *r,
                                         struct route_reply *out, enum openai_route route) {
    const struct tokenizer *tok = engine_model_tokenizer(ctx->model);
    struct openai_error e;
    int err = openai_parse(route, r->body.data ? r->body.data : "", r->body.len,
                           tokenizer_n_vocab(tok), &r->oa, &e);
    // "model" names the base model or a served adapter (vLLM's rule); an
    // unknown name fails in openai_prepare() with 404 model_not_found.
    struct openai_model om = ctx->om;
    if (!err && r->oa.model && strcmp(r->oa.model, ctx->om.name) != 0 && ctx->loras) {
        r->adapter = lora_registry_get(ctx->loras, r->oa.model);
        if (r->adapter) om.name = r->oa.model;
    }
    if (!err) err = openai_prepare(&r->oa, &om, &e);
    if (err) {
        routes_error(out, status_for_err(e.err ? e.err : err), e.message, e.param, e.code);
        return ROUTE_RESULT_REPLY;
    }
    r->sched = ctx->sched;
    r->tok = tok;
    r->model_name = r->adapter ? r->oa.model : ctx->om.name;
    r->created = (int64_t)time(NULL);
    openai_make_id(route == OPENAI_ROUTE_CHAT ? "chatcmpl-" : "cmpl-", r->id, sizeof(r->id));
    err = req_submit(r, slot_wake, r->slot);
    if (err) {
        int status = status_for_err(err);
        const char *msg = err == ERR_FULL       ? "The server's queue is full; retry shortly"
                          : err == ERR_TOOLONG  ? "The prompt and max_tokens do not fit the KV cache"
                          : err == ERR_SHUTDOWN ? "The server is shutting down"
                                                : err_str(err);
        routes_error(out, status, msg, NULL,
                     err == ERR_TOOLONG ? "context_length_exceeded" : NULL);
        return ROUTE_RESULT_REPLY;
    }
    if (r->oa.stream) {
        r->is_stream = true;
        r->sse = route == OPENAI_ROUTE_CHAT ? SSE_ROLE : SSE_DELTAS;
        return ROUTE_RESULT_STREAM;
    }
    return ROUTE_RESULT_WAIT;
}

static enum route_result handle_completions(const struct routes_ctx *ctx, struct req *r,
                                            struct route_reply *out) {
    return handle_generate(ctx, r, out, OPENAI_ROUTE_COMPLETIONS);
}

static enum route_result handle_chat(const struct routes_ctx *ctx, struct req *r,
                                     struct route_reply *out) {
    return handle_generate(ctx, r, out, OPENAI_ROUTE_CHAT);
}

static void load_reply(const struct routes_ctx *ctx, struct req *r, struct route_reply *out);

/* Choice i's text parsed for tool calls: a turn that stopped after whole
 * calls answers them (content is what came before, finish_reason
 * "tool_calls"); anything else (cut by max_tokens, no calls) stays text.
 * calls and ids [TOOL_CALL_MAX_CALLS] are the choice's storage. */
static void reply_tool_calls(const struct req *r, int32_t i, struct openai_choice *c,
                             struct openai_tool_call *calls, char (*ids)[32]) {
    const struct req_choice *ch = &r->choices[i];
    struct tool_call_parse tp;
    tool_call_parse(&r->oa.tool_syntax, c->text, c->text_len, true, &tp);
    if (!tp.has_trigger || tp.is_failed) return;  // all content
    // From the trigger on the text is the calls' syntax, never content, as in a stream
    // of the same request (sse.c holds it back). A call cut short (max_tokens) is a call
    // begun all the same once its name is complete: the name and the arguments so far,
    // with the finish that ended it ("length"), as the stream has sent them and as
    // OpenAI answers; cut before that, there is no call.
    c->text_len = tp.content_len;
    if (tp.n_calls == 0) return;
    for (int32_t k = 0; k < tp.n_calls; k++) {
        tool_call_make_id(&r->oa.tool_syntax, ids[k], sizeof(ids[k]));
        calls[k] = (struct openai_tool_call){.index = k,
                                             .id = ids[k],
                                             .name = c->text + tp.calls[k].name_off,
                                             .name_len = tp.calls[k].name_len,
                                             .arguments = c->text + tp.calls[k].args_off,
                                             .arguments_len = tp.calls[k].args_len};
    }
    c->tool_calls = calls;
    c->n_tool_calls = tp.n_calls;
    c->finish_reason = ch->finish == CHANNEL_FINISH_STOP ? "tool_calls"
                                                         : req_finish_reason(ch->finish);
}

void routes_final_reply(const struct routes_ctx *ctx, struct req *r, struct route_reply *out) {
    if (r->load) {
        load_reply(ctx, r, out);
        return;
    }
    if (atomic_load(&r->is_aborted)) {
        routes_error(out, 503, REQ_JOB_FAILED_MESSAGE, NULL, "job_failed");
        return;
    }
    if (atomic_load(&r->timed_out)) {
        routes_error(out, 504, "The request took longer than the server's request timeout",
                     NULL, "request_timeout");
        return;
    }
    for (int32_t i = 0; i < r->n_choices; i++) {
        if (r->choices[i].finish == CHANNEL_FINISH_ERROR) {
            int err = r->choices[i].err;
            routes_error(out, err == ERR_SHUTDOWN ? 503 : status_for_err(err),
                         err ? err_str(err) : "generation failed", NULL, NULL);
            return;
        }
    }
    struct openai_choice *cs = xcalloc((size_t)r->n_choices, sizeof(*cs));
    struct buf *texts = xcalloc((size_t)r->n_choices, sizeof(*texts));
    struct openai_tool_call *calls = NULL;
    char (*ids)[32] = NULL;
    if (r->oa.parse_tools) {
        // Sized by the request (n choices), so fallible, and a test's fault
        // site: a 500 for this reply, nothing else.
        size_t n = (size_t)r->n_choices * TOOL_CALL_MAX_CALLS;
        calls = fault_calloc(FAULT_SITE_TOOLS, n, sizeof(*calls));
        ids = calls ? fault_calloc(FAULT_SITE_TOOLS, n, sizeof(*ids)) : NULL;
        if (!ids) {
            free(calls);
            free(texts);
            free(cs);
            routes_error(out, 500, "Out of memory while building the reply", NULL, NULL);
            return;
        }
    }
    struct openai_usage u = {.prompt_tokens = r->n_prompt_total,
                             .completion_tokens = req_n_generated(r)};
    for (int32_t i = 0; i < r->n_choices; i++) {
        struct req_choice *ch = &r->choices[i];
        u.cached_tokens += ch->usage.n_cached;
        size_t offset = 0;
        if (r->oa.echo) {
            const struct openai_prompt *p = &r->oa.prompts[ch->i_prompt];
            if (p->text) {
                buf_append_str(&texts[i], p->text);
            } else {
                // As decode(prompt + completion) has it, so the two join up.
                tokenizer_decode(r->tok, p->ids, p->n_ids, r->oa.skip_special, &texts[i]);
            }
            offset = texts[i].len;
        }
        buf_append(&texts[i], ch->text.data ? ch->text.data : "", ch->text.len);
        cs[i] = (struct openai_choice){
            .index = i,
            .text = texts[i].data,
            .text_len = texts[i].len,
            .finish_reason = req_finish_reason(ch->finish),
            .tok = r->tok,
            .stream = &ch->lp_stream,
            .ids = ch->ids,
            .lps = ch->lps,
            .n_lps = ch->lps ? ch->n_pending : 0,
            .n_top = r->oa.n_logprobs,
            .text_offset = offset,
        };
        if (r->oa.parse_tools) reply_tool_calls(r, i, &cs[i], calls + i * TOOL_CALL_MAX_CALLS,
                                                ids + i * TOOL_CALL_MAX_CALLS);
        if (r->oa.n_logprobs >= 0 && !cs[i].lps) {
            // Asked for, but nothing generated: an empty logprobs object.
            static const struct sampler_result none;
            cs[i].lps = &none;
            cs[i].n_lps = 0;
        }
    }
    struct openai_meta meta = {.id = r->id, .created = r->created, .model = r->model_name};
    out->status = 200;
    out->body = r->oa.route == OPENAI_ROUTE_CHAT
                    ? openai_chat_json(&meta, cs, r->n_choices, &u, false)
                    : openai_completion_json(&meta, cs, r->n_choices, &u, false);
    out->content_type = JSON_TYPE;
    for (int32_t i = 0; i < r->n_choices; i++) buf_free(&texts[i]);
    free(texts);
    free(cs);
    free(calls);
    free(ids);
}

/* ---- adapters at run time ------------------------------------------------------ */

/* The admin routes' gate: off unless the operator asked for it. */
static bool runtime_lora_refused(const struct routes_ctx *ctx, struct route_reply *out) {
    if (ctx->allow_runtime_lora && ctx->loras && ctx->lora_loader) return false;
    routes_error(out, 403, "Loading and unloading adapters at run time is disabled: start the "
                 "server with --allow-runtime-lora --lora-dir DIR (and --api-key to guard it)",
                 NULL,
                 "runtime_lora_disabled");
    return true;
}

/* A required non-empty string field of the body, or NULL with a 400 in out. */
static const char *string_field(json_t *root, const char *key, struct route_reply *out) {
    json_t *v = json_object_get(root, key);
    if (json_is_string(v) && json_string_length(v) > 0 &&
        strlen(json_string_value(v)) == json_string_length(v))
        return json_string_value(v);
    char msg[96];
    snprintf(msg, sizeof(msg), "'%s' must be a non-empty string", key);
    routes_error(out, 400, msg, key, NULL);
    return NULL;
}

/* POST /v1/load_lora_adapter {"lora_name", "lora_path"}: checks the request,
 * reserves the name and hands the load to the loader thread; the connection
 * waits (suspended) for load_reply(). A name that is taken, loaded or being
 * loaded, is answered at once with 409. */
static enum route_result handle_load_lora(const struct routes_ctx *ctx, struct req *r,
                                          struct route_reply *out) {
    if (runtime_lora_refused(ctx, out)) return ROUTE_RESULT_REPLY;
    json_t *root = parse_body(r, out);
    if (!root) return ROUTE_RESULT_REPLY;
    const char *name = string_field(root, "lora_name", out);
    const char *path = name ? string_field(root, "lora_path", out) : NULL;
    if (!path) {
        json_decref(root);
        return ROUTE_RESULT_REPLY;
    }
    char msg[512];
    char resolved[PATH_MAX];
    if (!ctx->lora_root) {
        // config_validate() refuses --allow-runtime-lora without --lora-dir;
        // a context filled in by code gets the same answer, never an open.
        json_decref(root);
        routes_error(out, 403, "Loading adapters at run time needs the server started with "
                     "--lora-dir DIR: adapter paths are confined to it", NULL,
                     "runtime_lora_disabled");
        return ROUTE_RESULT_REPLY;
    }
    // The path as written here; the loader opens it inside the directory
    // without following a symlink (server/lora_path.h).
    int err = lora_path_check(ctx->lora_root, path, resolved, sizeof(resolved), msg, sizeof(msg));
    if (err) {
        json_decref(root);
        const char *code = err == ERR_PERM ? "lora_path_forbidden" : "invalid_lora_path";
        routes_error(out, err == ERR_PERM ? 403 : 400, msg, "lora_path", code);
        return ROUTE_RESULT_REPLY;
    }
    path = resolved;
    err = lora_loader_submit(ctx->lora_loader, name, path, slot_wake, r->slot, &r->load, msg,
                                 sizeof(msg));
    json_decref(root);
    switch (err) {
    case 0:
        return ROUTE_RESULT_WAIT;
    case LORA_REGISTRY_EXISTS:
        routes_error(out, 409, msg, "lora_name", "lora_exists");
        break;
    case LORA_REGISTRY_LOADING:
        routes_error(out, 409, msg, "lora_name", "lora_loading");
        break;
    case ERR_INVAL:
        routes_error(out, 400, msg, "lora_name", NULL);
        break;
    default:  // ERR_FULL (429), ERR_SHUTDOWN (503)
        routes_error(out, status_for_err(err), msg, NULL, NULL);
        break;
    }
    return ROUTE_RESULT_REPLY;
}

/* The answer to a load: the adapter as /v1/models lists it, or why not. */
static void load_reply(const struct routes_ctx *ctx, struct req *r, struct route_reply *out) {
    if (atomic_load(&r->timed_out)) {
        routes_error(out, 504, "The adapter load took longer than the server's request timeout; "
                     "it goes on, and /v1/models lists the adapter once it is loaded", NULL,
                     "request_timeout");
        return;
    }
    if (!lora_loader_job_is_done(r->load)) {
        // No longer waited for (req_cancel) and not a timeout: the server is
        // stopping (a client that went away reads nothing).
        routes_error(out, 503, "The server is shutting down before the adapter load ended", NULL,
                     NULL);
        return;
    }
    const struct lora_loader_result *res = lora_loader_job_result(r->load);
    switch (res->err) {
    case 0: {
        json_t *o = json_object();
        json_object_set_new(o, "object", json_string("lora_adapter"));
        json_object_set_new(o, "id", json_string(res->name));
        json_object_set_new(o, "root", json_string(res->path));
        json_object_set_new(o, "parent", json_string(ctx->om.name));
        json_object_set_new(o, "format", json_string(res->format));
        json_object_set_new(o, "rank", json_integer(res->rank));
        reply_json(out, 200, o);
        return;
    }
    case ERR_CANCELED:
        routes_error(out, 409, res->message, "lora_name", "lora_load_canceled");
        return;
    case ERR_SHUTDOWN:
        routes_error(out, 503, res->message, NULL, NULL);
        return;
    case ERR_NOMEM:
        routes_error(out, 500, res->message, NULL, NULL);
        return;
    case ERR_PERM:
        // A symlink on the way or inside the adapter (server/lora_path.h).
        routes_error(out, 403, res->message, "lora_path", "lora_path_forbidden");
        return;
    default:
        // ERR_IO, ERR_FORMAT, ERR_UNSUPPORTED, ERR_NOTFOUND, ERR_INVAL: the
        // client's file is at fault.
        routes_error(out, 400, res->message, "lora_path", "lora_load_failed");
        return;
    }
}

/* POST /v1/unload_lora_adapter {"lora_name"}: running requests keep theirs;
 * a load of the name still in progress is canceled (it answers 409). */
static enum route_result handle_unload_lora(const struct routes_ctx *ctx, struct req *r,
                                            struct route_reply *out) {
    if (runtime_lora_refused(ctx, out)) return ROUTE_RESULT_REPLY;
    json_t *root = parse_body(r, out);
    if (!root) return ROUTE_RESULT_REPLY;
    const char *name = string_field(root, "lora_name", out);
    if (name) {
        if (lora_registry_unload(ctx->loras, name) == 0) {
            json_t *o = json_object();
            json_object_set_new(o, "object", json_string("lora_adapter"));
            json_object_set_new(o, "id", json_string(name));
            json_object_set_new(o, "deleted", json_true());
            reply_json(out, 200, o);
        } else {
            char msg[256];
            snprintf(msg, sizeof(msg), "No adapter named '%.128s' is loaded", name);
            routes_error(out, 404, msg, "lora_name", "lora_not_found");
        }
    }
    json_decref(root);
    return ROUTE_RESULT_REPLY;
}

/* ---- the playground ----------------------------------------------------------- */

/* Every file of the page comes from this server and talks only to it: the
 * policy names no other origin (and no inline script or style), so a reply
 * the page renders cannot load or send anything elsewhere. no-cache makes
 * the browser revalidate each time (a 304 by ETag), so the page of a new
 * binary is never a stale one. */
static const char *const web_headers[] = {
    "Content-Security-Policy",
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
    "Cache-Control", "no-cache",
    "X-Content-Type-Options", "nosniff",
    "Referrer-Policy", "no-referrer",
    NULL,
};

/* GET / and GET /playground.*: the compiled-in file of the route's path. */
static enum route_result handle_web(const struct routes_ctx *ctx, struct req *r,
                                    struct route_reply *out) {
    (void)ctx;
    const char *path = strcmp(r->route->path, "/") == 0 ? "/index.html" : r->route->path;
    for (int32_t i = 0; i < web_files_count; i++) {
        const struct web_files_entry *f = &web_files[i];
        if (strcmp(f->path, path) != 0) continue;
        out->status = 200;
        out->static_body = f->data;
        out->static_len = f->n_bytes;
        out->content_type = f->content_type;
        out->etag = f->etag;
        out->headers = web_headers;
        return ROUTE_RESULT_REPLY;
    }
    UNREACHABLE();  // every web route names a file that server/meson.build embeds
}

/* ---- the table -------------------------------------------------------------- */

static const struct route route_table[] = {
    {"GET", "/", handle_web, 0},  // the page asks for the key; its API calls need it
    {"GET", "/playground.css", handle_web, 0},
    {"GET", "/playground.js", handle_web, 0},
    {"GET", "/health", handle_health, 0},
    {"GET", "/metrics", handle_metrics, 0},
    {"GET", "/v1/models", handle_models, ROUTE_FLAG_AUTH},
    {"POST", "/v1/completions", handle_completions, ROUTE_FLAG_AUTH | ROUTE_FLAG_BODY},
    {"POST", "/v1/chat/completions", handle_chat, ROUTE_FLAG_AUTH | ROUTE_FLAG_BODY},
    {"POST", "/tokenize", handle_tokenize, ROUTE_FLAG_AUTH | ROUTE_FLAG_BODY},
    {"POST", "/detokenize", handle_detokenize, ROUTE_FLAG_AUTH | ROUTE_FLAG_BODY},
    {"POST", "/v1/load_lora_adapter", handle_load_lora, ROUTE_FLAG_AUTH | ROUTE_FLAG_BODY},
    {"POST", "/v1/unload_lora_adapter", handle_unload_lora, ROUTE_FLAG_AUTH | ROUTE_FLAG_BODY},
};

const struct route *routes_find(const char *method, const char *path, bool *out_path_known) {
    *out_path_known = false;
    for (size_t i = 0; i < sizeof(route_table) / sizeof(route_table[0]); i++) {
        if (strcmp(route_table[i].path, path) != 0) continue;
        *out_path_known = true;
        if (strcmp(route_table[i].method, method) == 0) return &route_table[i];
    }
    return NULL;
}
