/*
 * server/req.c - one in-flight request: its sequences, what they produced,
 * and its single release point.
 */
#define LOG_TAG "req"
#include "server/req.h"

#include <stdlib.h>
#include <string.h>

#include "engine/base/alloc.h"
#include "engine/base/clock.h"
#include "engine/base/err.h"
#include "engine/base/log.h"
#include "server/lora_loader.h"

struct req *req_create(struct slot *slot, struct MHD_Connection *conn) {
    struct req *r = xcalloc(1, sizeof(*r));
    r->slot = slot;
    r->conn = conn;
    r->t_start_ns = clock_mono_ns();
    atomic_init(&r->timed_out, false);
    atomic_init(&r->heartbeat_due, false);
    atomic_init(&r->client_gone, false);
    atomic_init(&r->is_canceled, false);
    atomic_init(&r->is_aborted, false);
    return r;
}

static void release_choice(struct req *r, struct req_choice *c) {
    if (!c->ch) return;
    // Clear the wake first: the slot it points to is reused by later requests.
    channel_set_wake(c->ch, NULL, NULL);
    if (c->finish == CHANNEL_FINISH_NONE && !channel_is_finished(c->ch)) {
        scheduler_cancel(r->sched, c->seq_id);
    }
    channel_release(c->ch);
    c->ch = NULL;
}

void req_destroy(struct req *r) {
    if (!r) return;
    for (int32_t i = 0; i < r->n_choices; i++) {
        struct req_choice *c = &r->choices[i];
        release_choice(r, c);
        buf_free(&c->text);
        buf_free(&c->all);
        free(c->ids);
        free(c->lps);
    }
    free(r->choices);
    lora_loader_job_release(r->load);  // no wake reaches the slot after this
    engine_adapter_release(r->adapter);
    openai_request_deinit(&r->oa);
    buf_free(&r->body);
    buf_free(&r->out);
    free(r);
}

int req_submit(struct req *r, void (*wake)(void *), void *wake_user) {
    const struct openai_request *oa = &r->oa;
    r->n_choices = oa->n_prompts * oa->n;
    r->choices = xcalloc((size_t)r->n_choices, sizeof(*r->choices));
    for (int32_t p = 0; p < oa->n_prompts; p++) r->n_prompt_total += oa->prompts[p].n_ids;

    for (int32_t i = 0; i < r->n_choices; i++) {
        struct req_choice *c = &r->choices[i];
        c->i_prompt = i / oa->n;
        const struct openai_prompt *pr = &oa->prompts[c->i_prompt];
        struct scheduler_request sr = scheduler_default_request();
        sr.prompt = pr->ids;
        sr.n_prompt = pr->n_ids;
        sr.sampling = oa->sampling;
        // n > 1 with a seed: distinct but reproducible choices.
        if (sr.sampling.has_seed) sr.sampling.seed += (uint64_t)(i % oa->n);
        sr.max_tokens = oa->max_tokens;
        sr.min_tokens = oa->min_tokens;
        sr.stop = (const char *const *)oa->stop;
        sr.n_stop = oa->n_stop;
        sr.include_stop_str = oa->include_stop_str;
        sr.stop_token_ids = oa->stop_token_ids;
        sr.n_stop_token_ids = oa->n_stop_token_ids;
        sr.ignore_eos = oa->ignore_eos;
        sr.skip_special = oa->skip_special;
        sr.reply_prefix = oa->reply_prefix[0] ? oa->reply_prefix : NULL;
        tokenizer_stream_init_after(&c->lp_stream, r->tok, pr->ids, pr->n_ids, oa->skip_special);
        sr.n_logprobs = oa->n_logprobs;
        sr.adapter = r->adapter;  // the scheduler retains it per sequence
        sr.grammar = oa->grammar; // and the grammar
        sr.grammar_trigger = oa->grammar_trigger;
        int err = scheduler_submit(r->sched, &sr, &c->seq_id, &c->ch);
        if (err) {
            c->ch = NULL;
            for (int32_t j = 0; j < i; j++) {
                scheduler_cancel(r->sched, r->choices[j].seq_id);
                r->choices[j].finish = CHANNEL_FINISH_CANCELED;
            }
            for (int32_t j = 0; j < i; j++) release_choice(r, &r->choices[j]);
            return err;
        }
    }
    // Register the wakes last, so a failed submit never leaves one behind.
    for (int32_t i = 0; i < r->n_choices; i++) channel_set_wake(r->choices[i].ch, wake, wake_user);
    return 0;
}

bool req_poll(struct req *r) {
    bool news = false;
    for (int32_t i = 0; i < r->n_choices; i++) {
        struct req_choice *c = &r->choices[i];
        if (!c->ch || c->finish != CHANNEL_FINISH_NONE) continue;
        struct channel_output out;
        if (!channel_read(c->ch, &out)) continue;
        if (out.text_len) buf_append(&c->text, out.text, out.text_len);
        if (out.n_tokens && out.logprobs) {
            if (c->n_pending + out.n_tokens > c->cap) {
                c->cap = (c->n_pending + out.n_tokens) * 2;
                c->ids = xrealloc(c->ids, (size_t)c->cap * sizeof(*c->ids));
                c->lps = xrealloc(c->lps, (size_t)c->cap * sizeof(*c->lps));
            }
            memcpy(c->ids + c->n_pending, out.token_ids, (size_t)out.n_tokens * sizeof(int32_t));
            memcpy(c->lps + c->n_pending, out.logprobs,
                   (size_t)out.n_tokens * sizeof(struct sampler_result));
            c->n_pending += out.n_tokens;
        }
        if (out.finish != CHANNEL_FINISH_NONE) {
            c->finish = out.finish;
            c->err = out.err;
            c->usage = out.usage;
        }
        news = news || out.text_len || out.n_tokens || out.finish != CHANNEL_FINISH_NONE;
        channel_output_free(&out);
    }
    return news;
}

bool req_is_finished(const struct req *r) {
    if (r->load && !lora_loader_job_is_done(r->load) &&
        !atomic_load(&((struct req *)r)->is_canceled))
        return false;
    for (int32_t i = 0; i < r->n_choices; i++) {
        if (r->choices[i].finish == CHANNEL_FINISH_NONE) return false;
    }
    return true;
}

void req_cancel(struct req *r) {
    atomic_store(&r->is_canceled, true);
    for (int32_t i = 0; i < r->n_choices; i++) {
        if (r->choices[i].ch && r->choices[i].finish == CHANNEL_FINISH_NONE) {
            scheduler_cancel(r->sched, r->choices[i].seq_id);
        }
    }
}

int32_t req_n_generated(const struct req *r) {
    int32_t n = 0;
    for (int32_t i = 0; i < r->n_choices; i++) n += r->choices[i].usage.n_generated;
    return n;
}

const char *req_finish_reason(enum channel_finish f) {
    switch (f) {
    case CHANNEL_FINISH_NONE: return NULL;
    case CHANNEL_FINISH_STOP: return "stop";
    case CHANNEL_FINISH_LENGTH: return "length";
    case CHANNEL_FINISH_CANCELED: return "abort";
    case CHANNEL_FINISH_ERROR: return "error";
    }
    UNREACHABLE();
}
