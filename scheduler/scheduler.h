/*
 * scheduler/scheduler.h - THE public scheduler API: in-flight batching of
 * many sequences over one engine context, with a paged KV block ledger,
 * automatic prefix caching and preemption.
 *
 * The scheduler owns the engine context (its KV pool), every sequence, and
 * the step-loop thread, which runs on a libuv loop and sleeps when idle.
 * Requests come in through scheduler_submit() (a mailbox message); results
 * leave through each sequence's channel (scheduler/channel.h, included here:
 * this header is the module's umbrella, as engine/engine.h is the engine's).
 * It knows nothing of HTTP or JSON.
 * Threads: each function carries its tag. The consumer side of a channel is
 * [any thread].
 */
#ifndef SCHEDULER_SCHEDULER_H
#define SCHEDULER_SCHEDULER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/engine.h"
#include "scheduler/channel.h"
#include "scheduler/stats.h"

#define SCHEDULER_BLOCK_SIZE_DEFAULT 16
#define SCHEDULER_MAX_LORAS 256   // most adapter slots
#define SCHEDULER_STALL_MS 60000   // work pending and no step began this long: not alive
#define SCHEDULER_MAX_DRAFT 16     // most draft tokens per sequence and step
#define SCHEDULER_DRAFT_MAX_DECODES 4  // steps with more decoders than this draft nothing
#define SCHEDULER_DRAFT_N_WITH_MODEL 4 // draft_n where a draft model is given and draft_n is not

struct scheduler_params {
    int32_t block_size;         // tokens per KV block (16)
    int32_t kv_blocks;          // KV blocks in the pool incl. the null block; 0: from kv_memory_mib
    int32_t kv_memory_mib;      // KV budget in MiB (default 256): the pool when kv_blocks is 0,
                                //    a draft model's pool included
    int32_t max_seqs;           // running sequences at most (64)
    int32_t max_batch_tokens;   // tokens per step: the token budget (2048)
    int32_t prefill_chunk;      // prefill tokens of a step beside decodes (plan.c; 256), 0: no limit
    int32_t step_ratio;         // percent a step with prompt work may cost of a decode step of
                                //    every sequence present (plan.c; 125), 0: prefill_chunk alone
    int32_t max_queue;          // submitted but not yet running, at most (1024)
    bool enable_prefix_cache;   // automatic prefix caching (on)
    int32_t n_threads;          // kernel threads, 0: all cores
    int32_t n_ctx;              // most tokens of one sequence; 0: the model's context_length
    enum engine_kv_type kv_type; // storage of the KV pool (ENGINE_KV_TYPE_F16)
    int32_t max_loras;          // adapter slots of the engine ctx (8); 0: no adapters
    int32_t draft_n;            // speculative decoding: up to this many prompt-lookup draft
                                //    tokens per decoding sequence and step
                                //    (0..SCHEDULER_MAX_DRAFT; 0: off, the default)
    bool draft_always;          // draft even where it does not pay (tests, benchmarks);
                                //    false: only while it is faster (scheduler.c)
    const struct engine_model *draft_model;  // NULL: drafts by prompt lookup. Else drafts
                                //    from this model (greedy; scheduler/drafter.h), which
                                //    must have the model's vocabulary (the caller checks)
                                //    and outlive the scheduler; draft_n 0 is then
                                //    SCHEDULER_DRAFT_N_WITH_MODEL. With a comm it runs
                                //    in this process alone (rank 0), without one
    int32_t draft_kv_blocks;    // the draft model's KV pool incl. the null block; 0: room for
                                //    SCHEDULER_DRAFT_MAX_DECODES sequences of n_ctx tokens,
                                //    at most half of kv_memory_mib, taken out of the budget
                                //    (the model's pool has the rest unless kv_blocks is set)
    struct comm *comm;          // tensor parallelism: the job's ranks (engine_ctx_params.comm;
                                //   borrowed, outlives the scheduler); NULL: none
    int32_t kv_parts;           // 1: the KV pool whole on every rank (default); N: divided
                                //   over the N ranks of sequence parallelism (engine
                                //   kv_divided): kv_memory_mib on each rank, N times the
                                //   blocks in all (kv_blocks: rounded up to a multiple of N)
};

struct scheduler_params scheduler_default_params(void);

/* One generation request. Every pointer is borrowed for the call: submit
 * copies the prompt, the lists and the sampling parameters. */
struct scheduler_request {
    const int32_t *prompt;          // [n_prompt] token ids, 0 <= id < n_vocab
    int32_t n_prompt;               // >= 1
    struct sampler_params sampling; // validated here (sampler_params_validate)
    int32_t max_tokens;             // >= 1
    int32_t min_tokens;             // >= 0: eos / stop_token_ids ignored before this many
    const char *const *stop;        // [n_stop] stop strings (engine/stop.h rules)
    int32_t n_stop;
    bool include_stop_str;
    const int32_t *stop_token_ids;  // [n_stop_token_ids]
    int32_t n_stop_token_ids;
    bool ignore_eos;
    bool skip_special;              // leave control tokens out of the text
    const char *reply_prefix;       // NULL, or the chat template's bytes before a reply
                                    //    (seq.h: dropped from the text's start)
    int32_t n_logprobs;             // -1: none; 0: chosen token's; 1..20: plus the top k
    struct engine_adapter *adapter; // NULL: the base model. Retained by a successful
                                    //    submit until the sequence is done, so the
                                    //    caller may release its own reference at once
    struct gbnf *grammar;           // NULL: unconstrained. Retained like adapter. Each
                                    //    token is sampled from those that keep the text
                                    //    a prefix of the grammar's language; a grammar
                                    //    that completes ends the sequence (STOP)
    const char *grammar_trigger;    // NULL: the grammar constrains from the first token.
                                    //    Else it waits: tokens are free until the text
                                    //    (control tokens' text included) holds this
                                    //    string, then the grammar is advanced by the bytes
                                    //    from the string's start and constrains the rest
                                    //    (text that leaves it there drops the grammar).
                                    //    Alternatives are separated by '\n': the one that
                                    //    starts first in the text starts the grammar
};

/* Defaults: greedy-free sampler defaults, max_tokens 16, min_tokens 0, no
 * stops, skip_special true, n_logprobs -1, no adapter.
 *
 * Adapters: the step thread gives an adapter one of max_loras engine slots
 * when a sequence using it is admitted (a resident one, else a free slot,
 * else the least recently used slot no running sequence uses, which is
 * evicted); when all slots are in use the sequence waits in the queue
 * (scheduler/lora_slots.h, scheduler/plan.c). Sequences under different
 * adapters share batches. The prefix cache never shares blocks between
 * adapters, or between an adapter and the base model. */
struct scheduler_request scheduler_default_request(void);

struct scheduler;

/* Creates the scheduler and its engine context over model (retained until
 * scheduler_free(); the model must outlive it). Returns 0, ERR_INVAL (bad
 * params; logged), ERR_NOMEM (KV pool; logged with sizes) or what
 * engine_ctx_create() returns. *out is owned by the caller. [any thread] */
int scheduler_create(const struct engine_model *model, const struct scheduler_params *p,
                     struct scheduler **out);

/* Starts the step-loop thread. Returns 0 or ERR_NOMEM. [before start] */
int scheduler_start(struct scheduler *s);

/* True while the step thread runs its loop and accepts work, and, when work
 * is pending, a step began (or a request came in) within SCHEDULER_STALL_MS.
 * False before scheduler_start(), after scheduler_stop(), or when the loop
 * has exited or hangs. For the server's /health. [any thread] */
bool scheduler_is_alive(struct scheduler *s);

/* Queues a request. On success *out_id is its sequence id (never reused) and
 * *out_channel the consumer's reference to its output channel (release it
 * with channel_release() when done, also after cancel). Returns 0; ERR_INVAL
 * (bad token ids, sampling params or stop strings, or an adapter when
 * max_loras is 0; nothing logged: client input); ERR_TOOLONG when n_prompt + max_tokens exceeds the model's context
 * or the KV pool; ERR_FULL when max_queue requests are waiting; ERR_SHUTDOWN
 * after scheduler_stop(); ERR_NOMEM. [any thread] */
int scheduler_submit(struct scheduler *s, const struct scheduler_request *req, uint64_t *out_id,
                     struct channel **out_channel);

/* Cancels sequence id: it finishes with CHANNEL_FINISH_CANCELED and its
 * blocks are freed within one step. Unknown or finished ids are ignored.
 * [any thread] */
void scheduler_cancel(struct scheduler *s, uint64_t id);

/* A snapshot of the counters as of the last step. [any thread] */
void scheduler_get_stats(struct scheduler *s, struct scheduler_stats *out);

/* Stops accepting requests, lets running ones finish for up to grace_ms, then
 * cancels the rest and joins the step thread. Idempotent. [any thread except
 * the step thread] */
void scheduler_stop(struct scheduler *s, int64_t grace_ms);

/* Stops (grace 0) if needed and frees everything. NULL-safe. */
void scheduler_free(struct scheduler *s);

/* Runs one step on the calling thread: drain the mailbox, plan, forward,
 * sample, emit. Returns the number of tokens computed (0 when idle) or a
 * negative ERR_* from the engine. For tests and tools that drive the loop
 * themselves: never after scheduler_start(). [before start] */
int32_t scheduler_step(struct scheduler *s);

/* Whether sequences are running or waiting, or submissions are queued.
 * [before start, like scheduler_step] */
bool scheduler_has_work(struct scheduler *s);

/* Debug check of the whole ledger: block_alloc_check() plus n_refs of every
 * block == the number of block tables holding it. [step thread / before start] */
bool scheduler_check(struct scheduler *s);

#endif // SCHEDULER_SCHEDULER_H
