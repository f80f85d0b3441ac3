/*
 * scheduler/channel.c - a locked output buffer with two references.
 *
 * Pending output lives in buffers that channel_read() hands over whole (the
 * consumer's struct takes the pointers and the channel starts fresh ones), so
 * the lock is held only for pointer moves and appends.
 */
#include "scheduler/channel.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include <uv.h>

#include "engine/base/alloc.h"
#include "engine/base/buf.h"

struct channel {
    uv_mutex_t lock;
    atomic_int n_refs;                 // 2 at creation: producer and consumer
    bool with_logprobs;
    struct buf text;                   // pending text; owned
    int32_t *token_ids;                // owned; [cap] pending ids
    struct sampler_result *logprobs;   // owned; [cap] when with_logprobs
    int32_t n_tokens;
    int32_t cap;
    enum channel_finish finish;
    int err;
    struct channel_usage usage;
    bool has_news;                     // pushed since the last read
    channel_wake_fn wake;              // consumer's callback, under lock
    void *wake_user;
};

struct channel *channel_create(bool with_logprobs) {
    struct channel *c = calloc(1, sizeof(*c));
    if (!c) return NULL;
    if (uv_mutex_init(&c->lock) != 0) {
        free(c);
        return NULL;
    }
    atomic_init(&c->n_refs, 2);
    c->with_logprobs = with_logprobs;
    return c;
}

void channel_release(struct channel *c) {
    if (!c) return;
    if (atomic_fetch_sub(&c->n_refs, 1) != 1) return;
    uv_mutex_destroy(&c->lock);
    buf_free(&c->text);
    free(c->token_ids);
    free(c->logprobs);
    free(c);
}

/* Calls the wake callback outside the lock (it may take the consumer's own
 * locks, or read the channel at once). */
static void wake(struct channel *c) {
    uv_mutex_lock(&c->lock);
    channel_wake_fn fn = c->wake;
    void *user = c->wake_user;
    uv_mutex_unlock(&c->lock);
    if (fn) fn(user);
}

void channel_set_wake(struct channel *c, channel_wake_fn fn, void *user) {
    uv_mutex_lock(&c->lock);
    c->wake = fn;
    c->wake_user = user;
    bool pending = c->has_news || c->finish != CHANNEL_FINISH_NONE;
    uv_mutex_unlock(&c->lock);
    if (fn && pending) fn(user);
}

void channel_push(struct channel *c, int32_t token, const char *text, size_t len,
                  const struct sampler_result *lp) {
    uv_mutex_lock(&c->lock);
    ASSERT(c->finish == CHANNEL_FINISH_NONE);
    if (c->n_tokens == c->cap) {
        c->cap = c->cap ? 2 * c->cap : 16;
        c->token_ids = xrealloc(c->token_ids, (size_t)c->cap * sizeof(*c->token_ids));
        if (c->with_logprobs)
            c->logprobs = xrealloc(c->logprobs, (size_t)c->cap * sizeof(*c->logprobs));
    }
    c->token_ids[c->n_tokens] = token;
    if (c->with_logprobs) {
        if (lp) c->logprobs[c->n_tokens] = *lp;
        else memset(&c->logprobs[c->n_tokens], 0, sizeof(*c->logprobs));
    }
    c->n_tokens++;
    if (len) buf_append(&c->text, text, len);
    c->has_news = true;
    uv_mutex_unlock(&c->lock);
    wake(c);
}

void channel_push_text(struct channel *c, const char *text, size_t len) {
    if (!len) return;
    uv_mutex_lock(&c->lock);
    ASSERT(c->finish == CHANNEL_FINISH_NONE);
    buf_append(&c->text, text, len);
    c->has_news = true;
    uv_mutex_unlock(&c->lock);
    wake(c);
}

void channel_finish(struct channel *c, enum channel_finish finish, int err,
                    const struct channel_usage *usage) {
    ASSERT(finish != CHANNEL_FINISH_NONE);
    uv_mutex_lock(&c->lock);
    ASSERT(c->finish == CHANNEL_FINISH_NONE);
    c->finish = finish;
    c->err = err;
    if (usage) c->usage = *usage;
    c->has_news = true;
    uv_mutex_unlock(&c->lock);
    wake(c);
}

bool channel_read(struct channel *c, struct channel_output *out) {
    memset(out, 0, sizeof(*out));
    uv_mutex_lock(&c->lock);
    bool news = c->has_news || c->finish != CHANNEL_FINISH_NONE;
    if (c->text.len) {
        out->text_len = c->text.len;
        out->text = buf_take(&c->text);
    }
    if (c->n_tokens) {
        out->n_tokens = c->n_tokens;
        out->token_ids = c->token_ids;
        out->logprobs = c->logprobs;
        c->token_ids = NULL;
        c->logprobs = NULL;
        c->n_tokens = 0;
        c->cap = 0;
    }
    out->finish = c->finish;
    out->err = c->err;
    out->usage = c->usage;
    c->has_news = false;
    uv_mutex_unlock(&c->lock);
    return news;
}

bool channel_is_finished(struct channel *c) {
    uv_mutex_lock(&c->lock);
    bool done = c->finish != CHANNEL_FINISH_NONE;
    uv_mutex_unlock(&c->lock);
    return done;
}

void channel_output_free(struct channel_output *out) {
    if (!out) return;
    free(out->text);
    free(out->token_ids);
    free(out->logprobs);
    memset(out, 0, sizeof(*out));
}
