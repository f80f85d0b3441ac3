/*
 * scheduler/seq.h - struct seq: one generated sequence (STYLE 2.3: the
 * scheduler speaks of sequences, the server of requests).
 *
 * Owns its tokens (prompt + generated, allocated once at the largest size),
 * its block table, the prefix-cache keys of its full blocks, its sampler, its
 * stop-string matcher and incremental detokeniser, and the producer reference
 * of its output channel. The queue links belong to whichever seq_queue holds
 * it. No phases: a sequence has n_tokens and n_computed, and each step
 * computes some of the n_tokens - n_computed tokens not yet in the KV cache.
 * Threads: created on any thread (scheduler_submit), then handed whole to the
 * step thread, which alone touches it afterwards.
 */
#ifndef SCHEDULER_SEQ_H
#define SCHEDULER_SEQ_H

#include <stdbool.h>
#include <stdint.h>

#include "engine/base/buf.h"
#include "engine/engine.h"
#include "scheduler/block_hash.h"
#include "scheduler/block_table.h"

struct block_alloc;
struct channel;
struct stop_matcher;

/* Ordered so that finishing is a comparison: seq_is_finished(). */
enum seq_status {
    SEQ_STATUS_WAITING,
    SEQ_STATUS_RUNNING,
    SEQ_STATUS_PREEMPTED,
    SEQ_STATUS_FINISHED_STOP,      // eos/eot, a stop token id or a stop string
    SEQ_STATUS_FINISHED_LENGTH,    // max_tokens or the context length
    SEQ_STATUS_FINISHED_CANCELED,  // scheduler_cancel() or shutdown
    SEQ_STATUS_FINISHED_ERROR,     // could never be scheduled, or the engine failed
};

#define SEQ_MAX_REPLY_PREFIX 15

/* What a sequence is asked to do; every pointer is borrowed by seq_create(),
 * which copies what it keeps. */
struct seq_params {
    struct sampler_params sampling;
    int32_t max_tokens;             // generated tokens at most, >= 1
    int32_t min_tokens;             // eos and stop_token_ids are ignored before this many
    const char *const *stop;        // [n_stop] stop strings
    int32_t n_stop;
    bool include_stop_str;          // emit the matched stop string too
    const int32_t *stop_token_ids;  // [n_stop_token_ids] extra ids that stop
    int32_t n_stop_token_ids;
    bool ignore_eos;                // do not stop at eos/eot (load generators)
    bool skip_special;              // leave control tokens out of the text
    const char *reply_prefix;       // NULL or <= SEQ_MAX_REPLY_PREFIX bytes the chat template
                                    //    puts before a reply (llama2: " "), dropped from
                                    //    the text's start when the reply begins with them
    int32_t n_logprobs;             // -1: none; 0: the chosen token's; k: plus top k
    struct engine_adapter *adapter; // NULL: the base model; seq_create() retains it
    struct gbnf *grammar;           // NULL: unconstrained; seq_create() retains it
    const char *grammar_trigger;    // NULL, or the text the grammar waits for (scheduler.h)
};

struct seq {
    uint64_t id;                      // never reused
    enum seq_status status;
    int32_t *tokens;                  // owned; [n_tokens_max] prompt then generated
    int32_t n_tokens;                 // prompt + generated so far
    int32_t n_tokens_max;             // n_prompt + max_tokens
    int32_t n_prompt;
    int32_t n_computed;               // tokens whose K/V are in the blocks
    int32_t n_cached;                 // of the prompt, tokens found in the prefix cache
                                      //    at the last admission
    int32_t n_published;              // full blocks already offered to the prefix cache
    int32_t n_hashed;                 // keys[0, n_hashed) are valid
    struct block_hash *keys;          // owned; [table.cap] keys of the full blocks
    struct block_table table;         // owns its block references
    int32_t max_tokens;
    int32_t min_tokens;
    int32_t *stop_token_ids;          // owned; [n_stop_token_ids]
    int32_t n_stop_token_ids;
    bool ignore_eos;
    int32_t n_logprobs;
    struct engine_adapter *adapter;   // owned reference, NULL: the base model
    int32_t slot;                     // adapter slot while RUNNING with an adapter, else -1
    uint64_t adapter_id;              // adapter identity in prefix-cache keys: the
                                      //    adapter's info.id (engine/lora.h), 0: none
    struct sampler *sampler;          // owned
    struct grammar *grammar;          // owned; NULL: unconstrained
    char *grammar_trigger;            // owned; non-NULL while the grammar waits for it
    struct buf trigger_window;        // owned: the latest bytes, to find the trigger in
    struct stop_matcher *stop;        // owned; NULL without stop strings
    struct tokenizer_stream stream;   // incremental detokeniser state
    struct buf piece;                 // owned scratch: one token's text before stop matching
    struct buf unprefixed;            // owned scratch: piece less the reply prefix
    char reply_prefix[SEQ_MAX_REPLY_PREFIX + 1];
    int32_t n_reply_prefix;           // 0: none, or done with it
    int32_t n_prefix_held;            // of reply_prefix, bytes matched and held back
    const struct tokenizer *tok;      // borrowed from the model
    struct channel *channel;          // owned: the producer's reference (NULL in unit tests)
    int64_t t_arrival_ns;             // when submitted
    int64_t t_last_token_ns;          // when the last token was emitted, 0 before the first
    int32_t n_preemptions;
    int32_t n_passed_over;            // steps in a row it was a prefill candidate and got nothing
    int32_t n_drafted;                // speculative decoding: draft tokens verified, and
    int32_t n_draft_accepted;         //    accepted, since draft_resume_at
    int32_t draft_resume_at;          // no drafts before n_tokens reaches this (low acceptance)
    float draft_hits, draft_trials;   // draft model: draft tokens accepted, and tested (each
                                      //    accepted one, plus the first rejected), decayed
    struct block_table draft_table;   // the draft model's KV of tokens [0, n_draft_computed)
    int32_t n_draft_computed;         //    (scheduler/drafter.h); empty without a draft model
    struct seq *prev;                 // queue links: owned by the seq_queue holding it
    struct seq *next;
};

/* Creates a WAITING sequence with a copy of prompt [n_prompt] (n_prompt >= 1,
 * ids valid) and of p's lists; the sampler sees the prompt, the text stream
 * continues the prompt's text (tokenizer_stream_init_after()). block_size sizes
 * the block table for n_prompt + max_tokens tokens. Returns 0, ERR_INVAL
 * (bad stop strings or reply prefix: p comes from a client) or ERR_NOMEM; *out is owned by the
 * caller (seq_destroy()). [any thread] */
int seq_create(uint64_t id, const struct tokenizer *tok, int32_t n_vocab, const int32_t *prompt,
               int32_t n_prompt, const struct seq_params *p, int32_t block_size,
               struct seq **out);

/* Frees everything, releasing the channel reference; the block table must
 * have been released (block_table_release()). NULL-safe. */
void seq_destroy(struct seq *s);

static inline bool seq_is_finished(const struct seq *s) {
    return s->status > SEQ_STATUS_PREEMPTED;
}

static inline int32_t seq_n_generated(const struct seq *s) {
    return s->n_tokens - s->n_prompt;
}

/* Appends a sampled token, appends its text (valid UTF-8, stop strings held
 * back or cut) to text, and checks the stop conditions in order: eos/eot
 * (unless ignore_eos) and stop_token_ids once min_tokens are generated (the
 * token's text is not emitted), stop strings, then max_tokens. On a finish
 * the held-back text is flushed into text and the status set. Returns the new
 * status (RUNNING or FINISHED_STOP / FINISHED_LENGTH). [step thread] */
enum seq_status seq_append(struct seq *s, int32_t token, struct buf *text);

/* For a sequence whose grammar waits for its trigger (s->grammar_trigger
 * set): looks for the trigger in the text so far with token's bytes (its
 * control text included) and, when it is there, advances the grammar by the
 * bytes from the trigger's start and stops waiting. Returns OK (no trigger
 * yet, or the grammar took the bytes), DONE (they completed the grammar) or
 * REJECT (they leave the grammar: it is dropped, the sequence goes on
 * unconstrained). [step thread] */
enum grammar_step seq_grammar_trigger(struct seq *s, int32_t token);

/* True when s is constrained now (it has a grammar that waits for nothing). */
static inline bool seq_is_constrained(const struct seq *s) {
    return s->grammar && !s->grammar_trigger;
}

/* Ends a RUNNING sequence with FINISHED_STOP for a reason outside the token
 * (its grammar completed): held-back text is flushed into text. Returns the
 * new status. [step thread] */
enum seq_status seq_finish_stop(struct seq *s, struct buf *text);

/* Preemption by recompute: n_computed = 0; the caller releases the blocks.
 * Generated tokens, sampler and text state are kept. [step thread] */
void seq_reset_computed(struct seq *s);

/* Prefix-cache key of full block i (positions [i * bs, (i + 1) * bs) all in
 * tokens), computed once and remembered. [step thread] */
struct block_hash seq_block_key(struct seq *s, int32_t i, int32_t block_size);

/* Offers every block that is full of computed tokens and not yet offered to
 * the prefix cache (block_alloc_publish()); call after the step that wrote
 * them. Null (trimmed) entries are skipped. [step thread] */
void seq_publish_blocks(struct seq *s, struct block_alloc *a);

/* ---- queues ---- */

/* An intrusive FIFO of sequences with O(1) removal anywhere (a zeroed struct
 * is an empty queue). A sequence is in at most one queue. */
struct seq_queue {
    struct seq *head;  // oldest
    struct seq *tail;  // newest
    int32_t n;
};

void seq_queue_push_back(struct seq_queue *q, struct seq *s);
void seq_queue_push_front(struct seq_queue *q, struct seq *s);
void seq_queue_remove(struct seq_queue *q, struct seq *s);
struct seq *seq_queue_pop_front(struct seq_queue *q);  // NULL when empty

#endif // SCHEDULER_SEQ_H
