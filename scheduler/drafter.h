/*
 * scheduler/drafter.h - draft tokens from a small draft model for
 * speculative decoding (--draft-model): a model of the same vocabulary that
 * is cheaper to run guesses a sequence's next tokens greedily, one batched
 * forward pass per drafted position over its own paged KV pool; the
 * scheduler then verifies the guesses in one pass of the big model
 * (scheduler.c, as for prompt-lookup drafts).
 *
 * The draft model's KV of a sequence lives in the drafter's pool, in the
 * sequence's own table (struct seq's draft field): it covers the
 * sequence's tokens [0, draft.n_computed), which never change, so it stays
 * valid across steps, rejections (cut back) and preemptions of the big
 * model's blocks. Each proposal first feeds the tokens the draft has not
 * seen (the prompt, the first time; afterwards the one to few tokens the
 * last step accepted), then drafts. A greedy draft is a point mass, so
 * verifying by sampling the big model and comparing is the standard
 * rejection rule: the tokens are exactly those without a draft. A sampled
 * draft (a job with q: a sequence that samples without a seed) is drawn
 * from the sequence's own sampling pipeline over the draft's logits, and
 * the scheduler verifies it with sampler_sample_draft() against that q.
 * A constrained sequence's draft holds only tokens its grammar allows, each
 * after the ones before it (greedy over the masked row, or q masked as the
 * model's p will be), so no draft is wasted on a token the grammar refuses.
 * When the pool is short, the draft KV of sequences not drafting in this
 * step is released (they feed their tokens again when they next draft).
 *
 * Owns the draft model's engine ctx (on the big model's worker pool) and
 * its block ledger. Threads: the step thread only.
 */
#ifndef SCHEDULER_DRAFTER_H
#define SCHEDULER_DRAFTER_H

#include <stdbool.h>
#include <stdint.h>

#include "engine/engine.h"

struct grammar;
struct grammar_vocab;
struct seq;
struct seq_queue;
struct drafter;

struct drafter_params {
    int32_t block_size;         // tokens per KV block, the scheduler's
    int32_t n_blocks;           // KV blocks of the pool, the null block included (>= 2)
    int32_t max_seqs;           // sequences drafting at once at most
    int32_t max_batch_tokens;   // tokens per draft forward pass (feeding is chunked to it)
    int32_t n_vocab;            // the big model's: drafts are ids below it (and the draft's)
    enum engine_kv_type kv_type;
    struct engine_ctx *pool_of; // the big model's ctx, whose worker pool the draft borrows
    struct sampler_scratch *scratch;  // the caller's, for sampled drafts (jobs with q)
};

/* One sequence's part of a proposal: the caller sets sq and room (>= 1, the
 * most draft tokens it can take); drafter_propose() sets k (0..room), writes
 * the draft to out [room] and says how many of the sequence's tokens the
 * draft model had not seen (n_fed: 1 or 2 while it drafts every step, more
 * after steps without drafts, and the whole prompt the first time). */
struct drafter_job {
    struct seq *sq;
    int32_t room;
    int32_t *out;
    float *q;       // NULL: greedy drafts; else [room][n_vocab]: draft token i is drawn
                    //    with sq's sampler from the distribution written to q[i]
                    //    (sampler_draft: the sequence's pipeline over the draft's row,
                    //    its history holding the draft's tokens before i, as the
                    //    model's p will at verification; rewound after)
    struct grammar *grammar;             // NULL: free; else the sequence's (constrained
    const struct grammar_vocab *gvocab;  //    now): each draft token is one its grammar allows
                                         //    after the draft's earlier ones (q masked so);
                                         //    advanced over the draft, then rewound
    int32_t grammar_at;                  // drafter_propose's: the grammar's mark
    int32_t sampler_at;                  // drafter_propose's: the sampler's (with q)
    int32_t k;
    int32_t n_fed;
};

/* Creates the drafter over draft (borrowed; outlives the drafter). The
 * vocabulary must be the big model's (checked by the caller: the server,
 * which knows the tokenizers). Returns 0, ERR_INVAL or ERR_NOMEM (logged),
 * or what engine_ctx_create() returns. */
int drafter_create(const struct engine_model *draft, const struct drafter_params *p,
                   struct drafter **out);

/* NULL-safe. Every sequence's draft table must have been released. */
void drafter_free(struct drafter *d);

/* Drafts for jobs [n] (n <= max_seqs; distinct sequences, each with
 * n_tokens >= 1). Where the pool is short, the draft KV of the sequences of
 * queues [n_queues] (the running and waiting ones) outside jobs is
 * released first; a job that still does not fit gets k = 0. Returns 0, or
 * an engine error (every k is then 0; the draft KV of the jobs is dropped). */
int drafter_propose(struct drafter *d, struct drafter_job *jobs, int32_t n,
                    struct seq_queue *const *queues, int32_t n_queues);

/* After verification: sq's tokens from position n_valid on may differ from
 * what its draft KV holds; it keeps [0, n_valid) and frees the rest (also
 * blocks reserved past what it holds). */
void drafter_cut(struct drafter *d, struct seq *sq, int32_t n_valid);

/* Releases sq's draft KV (it finished, or its blocks are wanted). */
void drafter_release(struct drafter *d, struct seq *sq);

/* Nanoseconds one drafting pass (one token of each job) takes, a moving
 * average; 0 before the first. */
double drafter_pass_ns(const struct drafter *d);

/* KV blocks of the pool (the null block excluded), and in use now. */
int32_t drafter_n_blocks(const struct drafter *d);
int32_t drafter_n_blocks_used(const struct drafter *d);

/* The ledger's own check, and the blocks in use are those the draft tables
 * of the sequences in queues [n_queues] hold (none leaked). */
bool drafter_check(const struct drafter *d, const struct seq_queue *const *queues, int32_t n_queues);

#endif // SCHEDULER_DRAFTER_H
