/*
 * scheduler/drafter.c - greedy drafts from a draft model over its own paged
 * KV pool (drafter.h).
 *
 * One proposal for jobs J (each sequence with n tokens, of which the draft
 * has seen c, and room for r draft tokens):
 *   feed   positions [c, n) of every job, in passes of at most
 *          max_batch_tokens; the row of position n - 1 gives d[0];
 *   draft  pass j = 1 .. r - 1: d[j - 1] at position n + j - 1 for every job
 *          still drafting gives d[j].
 * A job stops early at an end-of-generation token (the sequence ends there
 * if it is accepted) and at the end of its room. The draft KV then covers
 * [0, n + k - 1): d[k - 1] itself is never fed. After verification
 * drafter_cut() keeps what matches the tokens the big model chose.
 */
#define LOG_TAG "drafter"
#include "scheduler/drafter.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/base/alloc.h"
#include "engine/base/clock.h"
#include "engine/base/err.h"
#include "engine/base/log.h"
#include "engine/text/grammar.h"
#include "engine/text/sampler.h"
#include "scheduler/block_alloc.h"
#include "scheduler/block_table.h"
#include "scheduler/seq.h"

struct drafter {
    const struct engine_model *model;  // borrowed
    const struct tokenizer *tok;       // borrowed from model
    struct engine_ctx *ctx;            // owned
    struct block_alloc *alloc;         // owned
    struct drafter_params p;
    int32_t n_vocab_draft;             // the draft model's (may exceed p.n_vocab)
    int32_t n_vocab_both;              // ids both vocabularies have: drafts are below it
    int32_t *b_token;                  // owned; [max_batch_tokens]
    int32_t *b_pos;                    // owned; [max_batch_tokens]
    int32_t *b_seq;                    // owned; [max_batch_tokens]
    int8_t *b_output;                  // owned; [max_batch_tokens]
    struct engine_seq *b_seqs;         // owned; [max_seqs]
    int32_t *b_job;                    // owned; [max_seqs] the job of batch sequence i
    int32_t *b_row;                    // owned; [max_seqs] its logits row, -1: none
    double pass_ns;                    // moving average of a drafting pass's time, 0: none yet
    float *row;                        // owned; [p.n_vocab] a draft row in the model's ids
    uint64_t *allow;                   // owned; [grammar_mask_words(p.n_vocab)] a job's mask
};

int drafter_create(const struct engine_model *draft, const struct drafter_params *p,
                   struct drafter **out) {
    *out = NULL;
    if (p->block_size < 1 || p->n_blocks < 2 || p->max_seqs < 1 || p->max_batch_tokens < 1 ||
        p->n_vocab < 1) {
        LOG_ERROR("%s: bad params block_size=%d n_blocks=%d max_seqs=%d max_batch_tokens=%d",
                  __func__, (int)p->block_size, (int)p->n_blocks, (int)p->max_seqs,
                  (int)p->max_batch_tokens);
        return ERR_INVAL;
    }
    struct drafter *d = calloc(1, sizeof(*d));
    if (!d) return ERR_NOMEM;
    d->model = draft;
    d->tok = engine_model_tokenizer(draft);
    d->p = *p;
    d->n_vocab_draft = engine_model_get_info(draft)->n_vocab;
    d->n_vocab_both = p->n_vocab < d->n_vocab_draft ? p->n_vocab : d->n_vocab_draft;
    int32_t max_seqs = p->max_seqs < p->max_batch_tokens ? p->max_seqs : p->max_batch_tokens;
    d->p.max_seqs = max_seqs;
    struct engine_ctx_params cp = engine_ctx_default_params();
    cp.max_batch_tokens = p->max_batch_tokens;
    cp.max_seqs = max_seqs;
    cp.max_outputs = max_seqs;
    cp.block_size = p->block_size;
    cp.n_blocks = p->n_blocks;
    cp.kv_type = p->kv_type;
    cp.pool_of = p->pool_of;
    int err = engine_ctx_create(draft, &cp, &d->ctx);
    if (!err) err = block_alloc_create(p->n_blocks, p->block_size, &d->alloc);
    if (!err) {
        size_t nt = (size_t)p->max_batch_tokens;
        d->b_token = malloc(nt * sizeof(*d->b_token));
        d->b_pos = malloc(nt * sizeof(*d->b_pos));
        d->b_seq = malloc(nt * sizeof(*d->b_seq));
        d->b_output = malloc(nt * sizeof(*d->b_output));
        d->b_seqs = calloc((size_t)max_seqs, sizeof(*d->b_seqs));
        d->b_job = calloc((size_t)max_seqs, sizeof(*d->b_job));
        d->b_row = calloc((size_t)max_seqs, sizeof(*d->b_row));
        d->row = malloc((size_t)p->n_vocab * sizeof(*d->row));
        d->allow = malloc(grammar_mask_words(p->n_vocab) * sizeof(*d->allow));
        if (!d->b_token || !d->b_pos || !d->b_seq || !d->b_output || !d->b_seqs || !d->b_job ||
            !d->b_row || !d->row || !d->allow)
            err = ERR_NOMEM;
    }
    if (err) {
        drafter_free(d);
        return err;
    }
    *out = d;
    return 0;
}

void drafter_free(struct drafter *d) {
    if (!d) return;
    engine_ctx_free(d->ctx);
    block_alloc_destroy(d->alloc);
    free(d->b_token);
    free(d->b_pos);
    free(d->b_seq);
    free(d->b_output);
    free(d->b_seqs);
    free(d->b_job);
    free(d->b_row);
    free(d->row);
    free(d->allow);
    free(d);
}

void drafter_release(struct drafter *d, struct seq *sq) {
    block_table_release(&sq->draft_table, d->alloc);
    sq->n_draft_computed = 0;
}

void drafter_cut(struct drafter *d, struct seq *sq, int32_t n_valid) {
    if (n_valid > sq->n_draft_computed) n_valid = sq->n_draft_computed;
    block_table_truncate(&sq->draft_table, d->alloc, n_valid);
    sq->n_draft_computed = n_valid;
}

/* Makes sq's draft table cover positions [0, n_tokens): its array on first
 * use, then blocks, releasing other sequences' draft KV when the pool is
 * short. False when it cannot. */
static bool reserve(struct drafter *d, struct seq *sq, int32_t n_tokens,
                    struct seq_queue *const *queues, int32_t n_queues,
                    const struct drafter_job *jobs, int32_t n_jobs) {
    if (!sq->draft_table.ids && block_table_init(&sq->draft_table, sq->table.cap) != 0)
        return false;
    enum block_reserve r = block_table_reserve(&sq->draft_table, d->alloc, n_tokens);
    for (int32_t i = 0; i < n_queues; i++) {
        for (struct seq *q = queues[i]->head; q && r == BLOCK_RESERVE_LATER; q = q->next) {
            bool is_job = false;
            for (int32_t j = 0; j < n_jobs && !is_job; j++) is_job = jobs[j].sq == q;
            if (is_job || q->draft_table.n_live == 0) continue;
            drafter_release(d, q);
            r = block_table_reserve(&sq->draft_table, d->alloc, n_tokens);
        }
    }
    return r == BLOCK_RESERVE_OK;
}

/* The tokens the job's grammar allows after its draft so far into d->allow,
 * and every other entry of d->row to -inf; false when no id of the draft's
 * vocabulary is allowed (a dead end, or a mask cut short with nothing). */
static bool mask_row(struct drafter *d, const struct drafter_job *job) {
    if (grammar_mask(job->grammar, job->gvocab, d->allow) == 0) return false;
    int32_t n_left = 0;
    for (int32_t i = 0; i < d->p.n_vocab; i++) {
        if (!((d->allow[i / 64] >> (i % 64)) & 1)) d->row[i] = -INFINITY;
        else n_left += i < d->n_vocab_both;
    }
    return n_left > 0;
}

/* The job's next draft token from logits row `row`, among the ids both
 * vocabularies have and, for a constrained sequence, that its grammar allows
 * next (the grammar then advances by it, and a sampled draft's token goes
 * into the sampler's history: the caller rewinds both after the proposal):
 * greedy, or drawn from the sequence's sampling distribution over
 * the row under that mask (written to the job's q). -1: none allowed. */
static int32_t draft_token(struct drafter *d, const struct drafter_job *job, const float *logits,
                           int32_t row) {
    const float *x = logits + (size_t)row * (size_t)d->n_vocab_draft;
    if (!job->q && !job->grammar) return sampler_argmax(x, d->n_vocab_both);
    memcpy(d->row, x, (size_t)d->n_vocab_both * sizeof(*d->row));
    for (int32_t i = d->n_vocab_both; i < d->p.n_vocab; i++) d->row[i] = -INFINITY;
    if (job->grammar && !mask_row(d, job)) return -1;
    const int32_t t = job->q ? sampler_draft(job->sq->sampler, d->p.scratch, d->row,
                                             job->grammar ? d->allow : NULL,
                                             job->q + (size_t)job->k * (size_t)d->p.n_vocab)
                             : sampler_argmax(d->row, d->p.n_vocab);
    if (job->grammar && grammar_accept_token(job->grammar, job->gvocab, t) == GRAMMAR_STEP_REJECT)
        return -1;  // cannot be (t was allowed); no draft rather than a wrong one
    // The next draft token's q sees this one in the history (penalties), as p will.
    if (job->q) sampler_accept(job->sq->sampler, t, false);
    return t;
}

/* Adds token at pos of batch sequence bi to the batch. An id the draft's
 * vocabulary lacks (the model's is larger: padding ids, which a model
 * rarely emits) goes in as id 0: the draft is only worse for it. */
static void add(struct drafter *d, int32_t *n, int32_t bi, int32_t token, int32_t pos, bool out) {
    d->b_token[*n] = token < d->n_vocab_draft ? token : 0;
    d->b_pos[*n] = pos;
    d->b_seq[*n] = bi;
    d->b_output[*n] = out;
    (*n)++;
}

static int forward(struct drafter *d, int32_t n_tokens, int32_t n_seqs, const float **logits) {
    struct engine_batch b = {
        .n_tokens = n_tokens,
        .token = d->b_token,
        .pos = d->b_pos,
        .seq = d->b_seq,
        .adapter = NULL,
        .output = d->b_output,
        .n_seqs = n_seqs,
        .seqs = d->b_seqs,
    };
    return engine_forward(d->ctx, &b, logits);
}

/* Batch sequence bi is job j's sequence. */
static void bind(struct drafter *d, int32_t bi, const struct drafter_job *job, int32_t j) {
    d->b_seqs[bi].block_table = job->sq->draft_table.ids;
    d->b_seqs[bi].n_blocks = job->sq->draft_table.n_blocks;
    d->b_job[bi] = j;
}

/* Feeds every active job's unseen tokens; sets out[0] and k = 1 of each. */
static int feed(struct drafter *d, struct drafter_job *jobs, int32_t n_jobs) {
    const int32_t T = d->p.max_batch_tokens;
    int32_t j = 0;
    while (j < n_jobs) {
        int32_t n = 0, n_seqs = 0, n_out = 0;
        // Whole jobs, or the start of one, up to T tokens.
        while (j < n_jobs && n < T) {
            struct drafter_job *job = &jobs[j];
            struct seq *sq = job->sq;
            if (job->room == 0) {
                j++;
                continue;
            }
            int32_t from = sq->n_draft_computed;
            int32_t to = sq->n_tokens;
            if (to - from > T - n) to = from + (T - n);
            for (int32_t pos = from; pos < to; pos++)
                add(d, &n, n_seqs, sq->tokens[pos], pos, pos == sq->n_tokens - 1);
            d->b_row[n_seqs] = to == sq->n_tokens ? n_out++ : -1;
            bind(d, n_seqs++, job, j);
            sq->n_draft_computed = to;
            if (to < sq->n_tokens) break;  // the rest of this job in the next pass
            j++;
        }
        if (n == 0) break;
        const float *logits = NULL;
        int err = forward(d, n, n_seqs, &logits);
        if (err) return err;
        for (int32_t bi = 0; bi < n_seqs; bi++) {
            if (d->b_row[bi] < 0) continue;
            struct drafter_job *job = &jobs[d->b_job[bi]];
            const int32_t t = draft_token(d, job, logits, d->b_row[bi]);  // k is 0
            if (t < 0) continue;  // its grammar allows nothing: no draft
            job->out[0] = t;
            job->k = 1;
        }
    }
    return 0;
}

int drafter_propose(struct drafter *d, struct drafter_job *jobs, int32_t n,
                    struct seq_queue *const *queues, int32_t n_queues) {
    ASSERT(n <= d->p.max_seqs);
    for (int32_t j = 0; j < n; j++) {
        struct drafter_job *job = &jobs[j];
        job->k = 0;
        ASSERT(job->room >= 1 && job->sq->n_tokens >= 1);
        job->n_fed = job->sq->n_tokens - job->sq->n_draft_computed;
        // Tokens fed and drafted: [0, n_tokens + room - 1).
        if (!reserve(d, job->sq, job->sq->n_tokens + job->room - 1, queues, n_queues, jobs, n))
            job->room = 0;
    }
    for (int32_t j = 0; j < n; j++) {
        if (jobs[j].grammar) jobs[j].grammar_at = grammar_mark(jobs[j].grammar);
        if (jobs[j].q) jobs[j].sampler_at = sampler_mark(jobs[j].sq->sampler);
    }
    int err = feed(d, jobs, n);
    for (int32_t step = 1; !err; step++) {
        int32_t n_tok = 0, n_seqs = 0;
        for (int32_t j = 0; j < n; j++) {
            struct drafter_job *job = &jobs[j];
            if (job->k != step || job->k >= job->room) continue;
            if (tokenizer_is_eog(d->tok, job->out[job->k - 1])) continue;
            struct seq *sq = job->sq;
            int32_t pos = sq->n_tokens + job->k - 1;
            add(d, &n_tok, n_seqs, job->out[job->k - 1], pos, true);
            bind(d, n_seqs++, job, j);
            sq->n_draft_computed = pos + 1;
        }
        if (n_tok == 0) break;
        const float *logits = NULL;
        const int64_t t0 = clock_mono_ns();
        err = forward(d, n_tok, n_seqs, &logits);
        if (err) break;
        const double ns = (double)(clock_mono_ns() - t0);
        d->pass_ns = d->pass_ns == 0.0 ? ns : d->pass_ns + 0.1 * (ns - d->pass_ns);
        for (int32_t bi = 0; bi < n_seqs; bi++) {
            struct drafter_job *job = &jobs[d->b_job[bi]];
            const int32_t t = draft_token(d, job, logits, bi);
            if (t >= 0) job->out[job->k++] = t;  // else its grammar allows nothing: it ends here
        }
    }
    for (int32_t j = 0; j < n; j++) {  // grammars and histories as they were: drafts are guesses
        if (jobs[j].grammar) grammar_rewind(jobs[j].grammar, jobs[j].grammar_at);
        if (jobs[j].q) sampler_rewind(jobs[j].sq->sampler, jobs[j].sampler_at);
    }
    if (err) {
        LOG_ERROR("draft model forward pass failed: %s; no drafts this step", err_str(err));
        for (int32_t j = 0; j < n; j++) {
            jobs[j].k = 0;
            drafter_release(d, jobs[j].sq);
        }
        return err;
    }
    for (int32_t j = 0; j < n; j++) {
        // Blocks reserved for draft positions never fed go back.
        if (jobs[j].room > 0) drafter_cut(d, jobs[j].sq, jobs[j].sq->n_draft_computed);
        ASSERT(jobs[j].sq->draft_table.n_blocks ==
               block_table_blocks_for(jobs[j].sq->n_draft_computed, d->p.block_size));
    }
    return 0;
}

double drafter_pass_ns(const struct drafter *d) {
    return d->pass_ns;
}

int32_t drafter_n_blocks(const struct drafter *d) {
    return block_alloc_n_total(d->alloc);
}

int32_t drafter_n_blocks_used(const struct drafter *d) {
    return block_alloc_n_used(d->alloc);
}

bool drafter_check(const struct drafter *d, const struct seq_queue *const *queues, int32_t n_queues) {
    if (!block_alloc_check(d->alloc)) return false;
    int32_t n_live = 0;
    for (int32_t i = 0; i < n_queues; i++) {
        for (const struct seq *q = queues[i]->head; q; q = q->next) {
            int32_t need = block_table_blocks_for(q->n_draft_computed, d->p.block_size);
            if (q->draft_table.n_blocks != need) {
                LOG_ERROR("drafter_check: seq=%llu holds %d draft blocks for %d tokens",
                          (unsigned long long)q->id, (int)q->draft_table.n_blocks,
                          (int)q->n_draft_computed);
                return false;
            }
            n_live += q->draft_table.n_live;
        }
    }
    if (n_live != block_alloc_n_used(d->alloc)) {
        LOG_ERROR("drafter_check: %d draft blocks in use, the tables hold %d",
                  (int)block_alloc_n_used(d->alloc), (int)n_live);
        return false;
    }
    return true;
}
