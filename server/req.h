/*
 * server/req.h - struct req: one in-flight HTTP request. Its body, its
 * parsed OpenAI request, its sequences (ids and channel references) and what
 * they produced so far, its stream state and its pending output bytes.
 *
 * A request waits for one of two things: its sequences (completions), or an
 * adapter load on the loader thread (POST /v1/load_lora_adapter, `load`).
 *
 * Single release point (STYLE 2.7.12): req_destroy(), called only from the
 * daemon's request-completed callback in http.c. It cancels every sequence
 * still running (a client that went away frees its KV blocks within one
 * step), drops the channel references and its reference to the load job
 * (the load goes on without it).
 * Threads: a req belongs to the HTTP thread. The step and loader threads
 * never see it: wake-ups go to its struct slot (http.h), which outlives
 * it. The ticker thread only sets the atomic flags (req_cancel()).
 */
#ifndef SERVER_REQ_H
#define SERVER_REQ_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "engine/base/buf.h"
#include "scheduler/scheduler.h"
#include "server/openai.h"
#include "server/tool_call.h"

struct route;
struct slot;
struct lora_loader_job;
struct MHD_Connection;

enum sse_state {
    SSE_ROLE,    // chat: the first chunk of each choice carries the role
    SSE_DELTAS,  // text as it comes
    SSE_FINAL,   // the usage chunk, when asked for
    SSE_DONE,    // "data: [DONE]" written; end of stream next
    SSE_END,
};

/* One choice = one sequence. Text, ids and log-probabilities accumulate here
 * until they are sent (streams) or until the end (plain responses). */
struct req_choice {
    uint64_t seq_id;
    struct channel *ch;               // consumer reference; NULL once released
    int32_t i_prompt;                 // which prompt
    struct buf text;                  // not yet sent
    int32_t *ids;                     // owned [n_pending], with lps when asked
    struct sampler_result *lps;       // owned [n_pending] or NULL
    int32_t n_pending;
    int32_t cap;
    size_t text_sent;                 // bytes of text already sent (logprob text_offset)
    struct tokenizer_stream lp_stream;  // where the log-probability token strings are:
                                        //    after the prompt, as the text is
    enum channel_finish finish;       // NONE while running
    int err;                          // with CHANNEL_FINISH_ERROR
    struct channel_usage usage;
    bool finish_sent;
    // Streams with tool calls (oa.parse_tools): the whole text, reparsed at
    // each chunk, and how much of its content and calls went out.
    struct buf all;
    size_t content_sent;
    int32_t calls_begun;                               // calls whose first delta went out
    size_t args_sent[TOOL_CALL_MAX_CALLS];             // argument bytes sent, per call
    char call_ids[TOOL_CALL_MAX_CALLS][32];
};

struct req {
    struct slot *slot;             // borrowed from the server; outlives the req
    struct MHD_Connection *conn;        // borrowed; valid until the completed callback
    const struct route *route;          // NULL: no such path
    bool method_ok;
    struct buf body;                    // the request body (up to the limit)
    bool body_too_large;
    bool handled;                       // the handler ran
    int status;                         // HTTP status answered (for the log)
    int64_t t_start_ns;
    int64_t deadline_ns;                // 0: no timeout
    atomic_bool timed_out;              // set by the ticker (once: it stays set)
    bool is_timeout_told;               // a stream's error event for it went out (sse.c)
    atomic_bool heartbeat_due;          // set by the ticker (streams)
    atomic_bool client_gone;            // set by the ticker: the peer closed while suspended
    atomic_bool is_canceled;            // set by req_cancel() (ticker, shutdown): stop waiting
    atomic_bool is_aborted;             // set by http_abort_all(): the engine cannot go on
    int64_t t_last_write_ns;            // streams

    struct scheduler *sched;            // borrowed
    const struct tokenizer *tok;        // borrowed
    const char *model_name;             // borrowed: the base model's or r->oa.model
    struct engine_adapter *adapter;     // owned reference; NULL: the base model
    struct lora_loader_job *load;       // consumer reference to the adapter load this request
                                        //    waits for (lora_loader.h); NULL: none
    struct openai_request oa;           // owned (zeroed until parsed)
    struct req_choice *choices;         // owned [n_choices]
    int32_t n_choices;
    char id[48];
    int64_t created;
    int32_t n_prompt_total;             // usage: prompt tokens, each prompt once
    bool is_stream;
    enum sse_state sse;
    struct buf out;                     // stream bytes not yet handed to MHD
    size_t out_pos;
};

/* What a request ended by http_abort_all() is told (a 503, or a stream's
 * error event; code "job_failed"). */
#define REQ_JOB_FAILED_MESSAGE                                                        \
    "The server's parallel job is ending (a rank has stopped; see the server's log): " \
    "this request cannot be completed"

/* A zeroed request for one HTTP exchange. Never NULL (xcalloc). */
struct req *req_create(struct slot *slot, struct MHD_Connection *conn);

/* Cancels running sequences, releases the channels, frees everything.
 * NULL-safe. [HTTP thread, completed callback only] */
void req_destroy(struct req *r);

/* Submits one sequence per prompt and choice of r->oa (prepared), registering
 * wake on each channel. On failure every sequence submitted so far is
 * canceled and released, and the scheduler's code is returned (ERR_FULL,
 * ERR_TOOLONG, ERR_SHUTDOWN, ERR_INVAL, ERR_NOMEM). */
int req_submit(struct req *r, void (*wake)(void *), void *wake_user);

/* Moves whatever the channels hold into the choices. Returns true when
 * something new arrived (text, tokens or a finish). */
bool req_poll(struct req *r);

/* True when every choice has finished and the load, if any, is done (or no
 * longer waited for: req_cancel()). [HTTP thread] */
bool req_is_finished(const struct req *r);

/* Cancels every sequence still running, and stops waiting for the load,
 * which goes on (timeout, vanished client, shutdown). Takes no lock but the
 * scheduler's: callers hold http.c's slot lock. [any thread] */
void req_cancel(struct req *r);

/* Generated tokens over all choices (for usage and the log). */
int32_t req_n_generated(const struct req *r);

/* The OpenAI finish_reason for a channel finish ("stop", "length", "abort",
 * "error"), or NULL while running. */
const char *req_finish_reason(enum channel_finish f);

#endif
