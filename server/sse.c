/*
 * server/sse.c - the streaming state machine. Each call of sse_read() first
 * hands out bytes already framed; when there are none it advances the state:
 *
 *   SSE_ROLE    chat only: one chunk per choice with delta {"role": "assistant"}
 *   SSE_DELTAS  poll the channels; one chunk per choice with new text (and its
 *               finish_reason when it ended); all finished -> SSE_FINAL;
 *               nothing new -> heartbeat if due, else park the connection
 *   SSE_FINAL   the usage chunk when stream_options.include_usage
 *   SSE_DONE    "data: [DONE]"
 *   SSE_END     end of stream
 */
#include "server/sse.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "engine/base/clock.h"
#include "server/openai.h"
#include "server/req.h"
#include "server/tool_call.h"
#include "server/slot.h"

void sse_frame_data(struct buf *out, const char *json) {
    buf_append(out, "data: ", 6);
    buf_append_str(out, json);
    buf_append(out, "\n\n", 2);
}

void sse_frame_done(struct buf *out) {
    buf_append_str(out, "data: [DONE]\n\n");
}

void sse_frame_comment(struct buf *out, const char *text) {
    buf_append(out, ": ", 2);
    buf_append_str(out, text);
    buf_append(out, "\n\n", 2);
}

static void emit_chunk(struct req *r, struct openai_choice *c, const struct openai_usage *usage,
                       int32_t n_choices) {
    struct openai_meta meta = {.id = r->id, .created = r->created, .model = r->model_name};
    char *json = r->oa.route == OPENAI_ROUTE_CHAT
                     ? openai_chat_json(&meta, c, n_choices, usage, true)
                     : openai_completion_json(&meta, c, n_choices, usage, true);
    sse_frame_data(&r->out, json);
    free(json);
}

/* A choice whose text holds tool calls: the text is reparsed whole
 * (tool_call.h, prefix-stable) and what is new goes out as OpenAI streams
 * it: content deltas; per call a first delta with index, id, type, name and
 * arguments "", then argument fragments; the finish in a last chunk
 * ("tool_calls" when the turn ended with calls). Returns true if anything
 * was framed. */
static bool emit_tool_deltas(struct req *r, int32_t i) {
    struct req_choice *ch = &r->choices[i];
    bool ended = ch->finish != CHANNEL_FINISH_NONE && !ch->finish_sent;
    if (!ch->text.len && !ch->n_pending && !ended) return false;
    buf_append(&ch->all, ch->text.data ? ch->text.data : "", ch->text.len);
    buf_reset(&ch->text);
    struct tool_call_parse tp;
    tool_call_parse(&r->oa.tool_syntax, ch->all.data, ch->all.len, ended, &tp);
    const char *all = ch->all.data ? ch->all.data : "";
    size_t n_content = 0;
    if (tp.content_len > ch->content_sent && !(tp.is_failed && ch->calls_begun > 0))
        n_content = tp.content_len - ch->content_sent;
    if (n_content || ch->n_pending) {
        struct openai_choice c = {
            .index = i,
            .text = all + ch->content_sent,
            .text_len = n_content,
            .tok = r->tok,
            .stream = &ch->lp_stream,
            .ids = ch->ids,
            .lps = ch->lps && ch->n_pending ? ch->lps : NULL,
            .n_lps = ch->n_pending,
            .n_top = r->oa.n_logprobs,
        };
        if (n_content || c.lps) emit_chunk(r, &c, NULL, 1);
        ch->content_sent += n_content;
        ch->n_pending = 0;
    }
    for (int32_t k = 0; k < tp.n_calls && !tp.is_failed; k++) {
        const struct tool_call_found *f = &tp.calls[k];
        if (!f->has_name) break;
        struct openai_tool_call tc = {.index = k};
        struct openai_choice c = {.index = i, .tool_calls = &tc, .n_tool_calls = 1};
        if (k >= ch->calls_begun) {
            tool_call_make_id(&r->oa.tool_syntax, ch->call_ids[k], sizeof(ch->call_ids[k]));
            tc.id = ch->call_ids[k];
            tc.name = all + f->name_off;
            tc.name_len = f->name_len;
            emit_chunk(r, &c, NULL, 1);
            ch->calls_begun = k + 1;
            ch->args_sent[k] = 0;
        }
        if (f->args_len > ch->args_sent[k]) {
            tc = (struct openai_tool_call){.index = k,
                                           .arguments = all + f->args_off + ch->args_sent[k],
                                           .arguments_len = f->args_len - ch->args_sent[k]};
            emit_chunk(r, &c, NULL, 1);
            ch->args_sent[k] = f->args_len;
        }
    }
    if (ended) {
        bool calls = ch->calls_begun > 0 && ch->finish == CHANNEL_FINISH_STOP;
        struct openai_choice c = {
            .index = i, .finish_reason = calls ? "tool_calls" : req_finish_reason(ch->finish)};
        emit_chunk(r, &c, NULL, 1);
        ch->finish_sent = true;
    }
    return true;
}

/* One chunk per choice with something new. Returns true if any was framed. */
static bool emit_deltas(struct req *r) {
    bool any = false;
    for (int32_t i = 0; i < r->n_choices; i++) {
        if (r->oa.parse_tools) {
            any |= emit_tool_deltas(r, i);
            continue;
        }
        struct req_choice *ch = &r->choices[i];
        bool ended = ch->finish != CHANNEL_FINISH_NONE && !ch->finish_sent;
        if (!ch->text.len && !ch->n_pending && !ended) continue;
        struct openai_choice c = {
            .index = i,
            .text = ch->text.data,
            .text_len = ch->text.len,
            .finish_reason = ended ? req_finish_reason(ch->finish) : NULL,
            .tok = r->tok,
            .stream = &ch->lp_stream,
            .ids = ch->ids,
            .lps = ch->lps && ch->n_pending ? ch->lps : NULL,
            .n_lps = ch->n_pending,
            .n_top = r->oa.n_logprobs,
            .text_offset = ch->text_sent,
        };
        emit_chunk(r, &c, NULL, 1);
        ch->text_sent += ch->text.len;
        buf_reset(&ch->text);
        ch->n_pending = 0;
        if (ended) ch->finish_sent = true;
        any = true;
    }
    return any;
}

static void emit_error(struct req *r, const char *message, const char *type, const char *code) {
    char *json = openai_error_json(message, type, NULL, code);
    sse_frame_data(&r->out, json);
    free(json);
}

ssize_t sse_read(struct req *r, char *dst, size_t max) {
    for (;;) {
        if (r->out_pos < r->out.len) {
            size_t n = r->out.len - r->out_pos;
            if (n > max) n = max;
            memcpy(dst, r->out.data + r->out_pos, n);
            r->out_pos += n;
            if (r->out_pos == r->out.len) {
                buf_reset(&r->out);
                r->out_pos = 0;
            }
            r->t_last_write_ns = clock_mono_ns();
            return (ssize_t)n;
        }
        switch (r->sse) {
        case SSE_ROLE:
            for (int32_t i = 0; i < r->n_choices; i++) {
                struct openai_choice c = {.index = i, .role = true};
                emit_chunk(r, &c, NULL, 1);
            }
            r->sse = SSE_DELTAS;
            break;
        case SSE_DELTAS:
            req_poll(r);
            if (emit_deltas(r)) break;
            if (atomic_load(&r->is_aborted) && !req_is_finished(r)) {
                // What was generated has gone out above; the rest never comes.
                emit_error(r, REQ_JOB_FAILED_MESSAGE, "server_error", "job_failed");
                r->sse = SSE_END;
                break;
            }
            if (atomic_load(&r->timed_out) && !r->is_timeout_told) {
                r->is_timeout_told = true;
                // The ticker canceled the sequences; tell the client why. Before
                // the finished check: the cancellation may have finished every
                // sequence by this poll, and the stream must still say why.
                emit_error(r, "The request took longer than the server's request timeout",
                           "timeout", "request_timeout");
                break;
            }
            if (req_is_finished(r)) {
                r->sse = SSE_FINAL;
                break;
            }
            if (atomic_exchange(&r->heartbeat_due, false)) {
                sse_frame_comment(&r->out, "keep-alive");
                break;
            }
            if (slot_park(r->slot)) return 0;
            break;
        case SSE_FINAL:
            if (r->oa.include_usage) {
                struct openai_usage u = {.prompt_tokens = r->n_prompt_total,
                                         .completion_tokens = req_n_generated(r)};
                for (int32_t i = 0; i < r->n_choices; i++) {
                    u.cached_tokens += r->choices[i].usage.n_cached;
                }
                emit_chunk(r, NULL, &u, 0);
            }
            r->sse = SSE_DONE;
            break;
        case SSE_DONE:
            sse_frame_done(&r->out);
            r->sse = SSE_END;
            break;
        case SSE_END:
            return -1;
        }
    }
}
