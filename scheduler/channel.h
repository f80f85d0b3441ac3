/*
 * scheduler/channel.h - one sequence's output channel, the only way results
 * leave the step thread (STYLE 2.8).
 *
 * The step thread (producer) appends text pieces, token ids, log-probabilities
 * and finally the finish reason and usage; the consumer (the HTTP side, or a
 * batch tool) takes whatever is pending with channel_read(). A channel has
 * exactly two references, producer and consumer: whoever drops the last one
 * with channel_release() frees it, so either side may go away first (a
 * client disconnect, or a finished sequence). After each push the producer
 * calls the wake callback the consumer registered, without holding the lock.
 * Threads: every function is [any thread]; the lock is internal.
 */
#ifndef SCHEDULER_CHANNEL_H
#define SCHEDULER_CHANNEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/text/sampler.h"

/* Why a sequence ended (OpenAI's finish_reason: "stop", "length"). */
enum channel_finish {
    CHANNEL_FINISH_NONE,      // still running
    CHANNEL_FINISH_STOP,
    CHANNEL_FINISH_LENGTH,
    CHANNEL_FINISH_CANCELED,
    CHANNEL_FINISH_ERROR,
};

struct channel_usage {
    int32_t n_prompt;      // prompt tokens
    int32_t n_generated;   // generated tokens
    int32_t n_cached;      // prompt tokens served from the prefix cache
    int32_t n_preemptions;
};

/* Called by the producer after new output or the finish is pushed. */
typedef void (*channel_wake_fn)(void *user);

struct channel;

/* What channel_read() hands over; all owned by the caller
 * (channel_output_free()). A zeroed struct is empty. */
struct channel_output {
    char *text;                           // NUL-terminated, valid UTF-8; NULL if none
    size_t text_len;
    int32_t *token_ids;                   // [n_tokens]
    struct sampler_result *logprobs;      // [n_tokens] when the request asked, else NULL
    int32_t n_tokens;
    enum channel_finish finish;           // NONE while running
    int err;                              // with CHANNEL_FINISH_ERROR: the ERR_* code
    struct channel_usage usage;           // valid once finished
};

/* A channel with two references (NULL when out of memory). with_logprobs:
 * keep a sampler_result per token. */
struct channel *channel_create(bool with_logprobs);

/* Drops one reference; the second drop frees the channel. */
void channel_release(struct channel *c);

/* Registers (or clears, with fn NULL) the consumer's wake callback. When the
 * producer already pushed output, the callback is called once at once, so no
 * wake-up is lost. */
void channel_set_wake(struct channel *c, channel_wake_fn fn, void *user);

/* Producer: one token and its text piece (may be empty); lp may be NULL. */
void channel_push(struct channel *c, int32_t token, const char *text, size_t len,
                  const struct sampler_result *lp);

/* Producer: text without a token (held-back text flushed at the finish). */
void channel_push_text(struct channel *c, const char *text, size_t len);

/* Producer: the end. err is 0 unless finish is CHANNEL_FINISH_ERROR. */
void channel_finish(struct channel *c, enum channel_finish finish, int err,
                    const struct channel_usage *usage);

/* Consumer: moves everything pending into *out (a fresh struct; the caller
 * frees it with channel_output_free()). Returns true when something was
 * pending or the channel has finished (out->finish then set on every later
 * call), false when there was nothing new. */
bool channel_read(struct channel *c, struct channel_output *out);

bool channel_is_finished(struct channel *c);

void channel_output_free(struct channel_output *out);  // NULL-safe, leaves it zeroed

#endif // SCHEDULER_CHANNEL_H
