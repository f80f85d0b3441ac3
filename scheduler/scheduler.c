/*
 * scheduler/scheduler.c - the step loop: drain the mailbox, plan, build the
 * batch, engine_forward, sample, append, detokenize, check stops, emit, free
 * what finished.
 *
 * The loop runs on its own thread on a libuv loop: an async handle (the
 * mailbox's wake-up) starts an idle handle, which runs one step per loop turn
 * while there is work and stops itself when there is none, so an idle
 * scheduler sleeps in the kernel. Everything the step touches is owned by the
 * step thread; the batch arrays, the plan and the sampler scratch are sized
 * once at creation, so a step allocates nothing per token.
 */
#define LOG_TAG "sched"
#include "scheduler/scheduler.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include <uv.h>

#include "engine/base/alloc.h"
#include "engine/base/buf.h"
#include "engine/base/clock.h"
#include "engine/base/err.h"
#include "engine/base/log.h"
#include "engine/text/stop.h"
#include "scheduler/block_alloc.h"
#include "scheduler/block_table.h"
#include "scheduler/draft.h"
#include "scheduler/drafter.h"
#include "scheduler/lora_slots.h"
#include "scheduler/mailbox.h"
#include "scheduler/plan.h"
#include "scheduler/seq.h"
#include "scheduler/step_cost.h"

struct scheduler {
    const struct engine_model *model;   // borrowed; outlives the scheduler
    const struct tokenizer *tok;        // borrowed from model
    struct engine_ctx *ctx;             // owned
    struct scheduler_params p;
    int32_t n_vocab;
    int32_t n_ctx;                      // most tokens of one sequence
    int32_t sliding_window;

    // step-thread state
    struct block_alloc *alloc;          // owned
    struct lora_slots loras;            // owned; the ctx's adapter slots, as planned
    struct seq_queue running;           // owns its sequences
    struct seq_queue waiting;           // owns its sequences
    struct seq_queue rejected;          // filled by plan_step, emptied in the same step
    struct step_plan plan;              // owned arrays
    struct plan_budget budget;
    struct step_cost cost;              // the fitted step time against tokens
    int32_t *b_token;                   // owned; [max_batch_tokens]
    int32_t *b_pos;                     // owned; [max_batch_tokens]
    int32_t *b_seq;                     // owned; [max_batch_tokens]
    int32_t *b_adapter;                 // owned; [max_batch_tokens]
    int8_t *b_output;                   // owned; [max_batch_tokens]
    struct engine_seq *b_seqs;          // owned; [max_seqs]
    int32_t *row_of;                    // owned; [max_seqs] output row of plan.seqs[i], -1: none
    int32_t *n_draft;                   // owned; [max_seqs] draft tokens of plan.seqs[i]
    int32_t *drafts;                    // owned; [max_seqs * SCHEDULER_MAX_DRAFT] those tokens
    struct drafter *drafter;            // owned; NULL: prompt-lookup drafts
    struct drafter_job *jobs;           // owned; [SCHEDULER_DRAFT_MAX_DECODES] with a drafter
    float *draft_q;                     // owned; [SCHEDULER_DRAFT_MAX_DECODES][draft_n][n_vocab]
                                        //    the distributions sampled drafts came from
    const float **draft_q_of;           // owned; [max_seqs] plan.seqs[i]'s, NULL: none
    int32_t *job_of;                    // owned; [SCHEDULER_DRAFT_MAX_DECODES] plan index of jobs[j]
    int32_t max_outputs;                // logits rows of the ctx
    double draft_ns_on, draft_ns_off;   // EMA of ns per emitted token of decode-only steps
                                        //    with and without drafts (0: none yet)
    int64_t n_draft_steps;              // decode-only steps where drafting was possible
    bool is_drafting;                   // this step's choice (propose_drafts)
    bool is_timed;                      // this step is decode-only with drafting possible
    int32_t emitted;                    // the token emit_token() last appended, -1: none
    int32_t *check_refs;                // owned; [n_blocks] scratch of scheduler_check()
    struct sampler_scratch *scratch;    // owned
    struct grammar_vocab *gvocab;       // owned; built for the first constrained sequence
    uint64_t *allow;                    // owned; [grammar_mask_words(n_vocab)] a token mask
    struct buf text;                    // owned scratch: one token's emitted text
    struct scheduler_stats cur;         // the step thread's counters
    bool stopping;
    int64_t t_stop_deadline_ns;

    // crossings
    struct mailbox *mailbox;            // owned; [any thread] -> step thread
    uv_mutex_t stats_lock;              // guards published
    struct scheduler_stats published;   // step thread -> [any thread], under stats_lock
    atomic_uint_fast64_t next_id;
    atomic_int n_submitted;             // posted but not yet drained
    atomic_int n_waiting;               // waiting.n as of the last step
    atomic_bool is_accepting;
    atomic_bool is_stop_requested;
    atomic_bool is_loop_running;        // the step thread is inside uv_run
    atomic_llong t_progress_ns;         // last step start or submission (scheduler_is_alive)

    // loop
    uv_loop_t loop;
    uv_async_t async;
    uv_idle_t idle;
    uv_thread_t thread;
    bool has_loop;
    bool has_handles;
    bool has_thread;
    bool has_mailbox;
    bool has_stats;
};

struct scheduler_params scheduler_default_params(void) {
    struct scheduler_params p = {
        .block_size = SCHEDULER_BLOCK_SIZE_DEFAULT,
        .kv_blocks = 0,
        .kv_memory_mib = 256,
        .kv_type = ENGINE_KV_TYPE_F16,
        .max_seqs = 64,
        .max_batch_tokens = 2048,  // = config.c's default (tests/server/test_defaults.c)
        .prefill_chunk = 256,
        .step_ratio = 125,
        .max_queue = 1024,
        .enable_prefix_cache = true,
        .n_threads = 0,
        .max_loras = 8,
        .kv_parts = 1,
    };
    return p;
}

struct scheduler_request scheduler_default_request(void) {
    struct scheduler_request r;
    memset(&r, 0, sizeof(r));
    r.sampling = sampler_default_params();
    r.max_tokens = 16;
    r.skip_special = true;
    r.n_logprobs = -1;
    r.adapter = NULL;
    return r;
}

/* ---- finishing ---- */

static enum channel_finish finish_of(enum seq_status st) {
    switch (st) {
    case SEQ_STATUS_FINISHED_STOP:     return CHANNEL_FINISH_STOP;
    case SEQ_STATUS_FINISHED_LENGTH:   return CHANNEL_FINISH_LENGTH;
    case SEQ_STATUS_FINISHED_CANCELED: return CHANNEL_FINISH_CANCELED;
    case SEQ_STATUS_FINISHED_ERROR:    return CHANNEL_FINISH_ERROR;
    case SEQ_STATUS_WAITING:
    case SEQ_STATUS_RUNNING:
    case SEQ_STATUS_PREEMPTED:
        break;
    }
    UNREACHABLE();
}

/* Ends sq (already out of every queue, status set): blocks back to the
 * ledger at once, last output to the channel, then the sequence is freed. */
static void finish_seq(struct scheduler *s, struct seq *sq, int err) {
    ASSERT(seq_is_finished(sq));
    block_table_release(&sq->table, s->alloc);
    if (s->drafter) drafter_release(s->drafter, sq);
    if (sq->slot >= 0) {
        lora_slots_release(&s->loras, sq->slot);
        sq->slot = -1;
    }
    if (sq->channel) {
        struct channel_usage u = {sq->n_prompt, seq_n_generated(sq), sq->n_cached,
                                  sq->n_preemptions};
        channel_finish(sq->channel, finish_of(sq->status), err, &u);
    }
    stats_observe(&s->cur.latency, (double)(clock_mono_ns() - sq->t_arrival_ns) / 1e6);
    s->cur.n_finished++;
    LOG_DEBUG("finished seq=%llu status=%d n_prompt=%d n_gen=%d n_cached=%d",
              (unsigned long long)sq->id, (int)sq->status, (int)sq->n_prompt,
              (int)seq_n_generated(sq), (int)sq->n_cached);
    seq_destroy(sq);
}

static struct seq_queue *queue_of(struct scheduler *s, const struct seq *sq) {
    return sq->status == SEQ_STATUS_RUNNING ? &s->running : &s->waiting;
}

static void cancel_seq(struct scheduler *s, struct seq *sq) {
    seq_queue_remove(queue_of(s, sq), sq);
    sq->status = SEQ_STATUS_FINISHED_CANCELED;
    finish_seq(s, sq, 0);
}

static void cancel_all(struct scheduler *s) {
    while (s->running.head) cancel_seq(s, s->running.head);
    while (s->waiting.head) cancel_seq(s, s->waiting.head);
}

static struct seq *find_seq(struct scheduler *s, uint64_t id) {
    for (struct seq *q = s->running.head; q; q = q->next)
        if (q->id == id) return q;
    for (struct seq *q = s->waiting.head; q; q = q->next)
        if (q->id == id) return q;
    return NULL;
}

/* ---- mailbox ---- */

static void free_msg(struct mailbox_msg *m) {
    if (m->type == MAILBOX_MSG_SUBMIT) {
        struct seq *sq = m->payload;
        if (sq->channel) {
            struct channel_usage u = {sq->n_prompt, 0, 0, 0};
            channel_finish(sq->channel, CHANNEL_FINISH_CANCELED, 0, &u);
        }
        seq_destroy(sq);
    }
    free(m);
}

static void drain_mailbox(struct scheduler *s) {
    struct mailbox_msg *m = mailbox_drain(s->mailbox);
    while (m) {
        struct mailbox_msg *next = m->next;
        switch (m->type) {
        case MAILBOX_MSG_SUBMIT: {
            struct seq *sq = m->payload;
            atomic_fetch_sub(&s->n_submitted, 1);
            seq_queue_push_back(&s->waiting, sq);
            s->cur.n_requests++;
            s->cur.n_prompt_tokens += sq->n_prompt;
            m->payload = NULL;
            break;
        }
        case MAILBOX_MSG_CANCEL: {
            struct seq *sq = find_seq(s, m->id);
            if (sq) cancel_seq(s, sq);
            break;
        }
        case MAILBOX_MSG_STOP:
            if (!s->stopping) {
                s->stopping = true;
                s->t_stop_deadline_ns = clock_mono_ns() + m->arg_ms * 1000000;
            }
            break;
        }
        free(m);
        m = next;
    }
}

/* The mailbox's wake-up: uv_async_send is safe from any thread and coalesces. */
static void wake_loop(void *user) {
    struct scheduler *s = user;
    uv_async_send(&s->async);
}

/* ---- the step ---- */

static void publish_stats(struct scheduler *s) {
    s->cur.n_running = s->running.n;
    s->cur.n_waiting = s->waiting.n;
    s->cur.n_blocks_total = block_alloc_n_total(s->alloc);
    s->cur.n_blocks_used = block_alloc_n_used(s->alloc);
    s->cur.n_blocks_free = block_alloc_n_free(s->alloc);
    s->cur.n_blocks_cached = block_alloc_n_cached(s->alloc);
    s->cur.n_lora_slots = s->loras.n_slots;
    s->cur.n_lora_resident = lora_slots_n_resident(&s->loras);
    s->cur.n_lora_loads = s->loras.n_loads;
    s->cur.n_lora_evictions = s->loras.n_evictions;
    if (s->drafter) {
        s->cur.n_draft_blocks_total = drafter_n_blocks(s->drafter);
        s->cur.n_draft_blocks_used = drafter_n_blocks_used(s->drafter);
    }
    s->cur.n_ranks = engine_ctx_rank_stats(s->ctx, s->cur.ranks, STATS_MAX_RANKS);
    atomic_store(&s->n_waiting, s->waiting.n);
    uv_mutex_lock(&s->stats_lock);
    s->published = s->cur;
    uv_mutex_unlock(&s->stats_lock);
}

/* The vocabulary's byte trie for grammars, built on first use. */
static const struct grammar_vocab *grammar_vocab_of(struct scheduler *s) {
    if (!s->gvocab) {
        s->gvocab = grammar_vocab_create(s->tok);
        s->allow = xmalloc(grammar_mask_words(s->n_vocab) * sizeof(*s->allow));
        ASSERT(s->gvocab);  // bookkeeping-sized: the vocabulary's pieces
    }
    return s->gvocab;
}

/* The allowed tokens of a constrained sequence into s->allow: NULL when sq
 * is unconstrained, or when no token continues its grammar (*is_dead set). */
static const uint64_t *grammar_allow(struct scheduler *s, struct seq *sq, bool *is_dead) {
    *is_dead = false;
    if (!seq_is_constrained(sq)) return NULL;
    const struct grammar_vocab *v = grammar_vocab_of(s);  // before s->allow: it makes that
    *is_dead = grammar_mask(sq->grammar, v, s->allow) == 0;
    return *is_dead ? NULL : s->allow;
}

/* Ends sq with STOP without a new token (its grammar can go no further):
 * text held back for stop strings or UTF-8 goes out first. */
static void grammar_stop(struct scheduler *s, struct seq *sq) {
    seq_finish_stop(sq, &s->text);
    if (sq->channel && s->text.len) channel_push_text(sq->channel, s->text.data, s->text.len);
    seq_queue_remove(&s->running, sq);
    finish_seq(s, sq, 0);
}

/* A sampled draft token and the distribution it came from (q NULL: none). */
struct draft_pick {
    int32_t token;
    const float *q;
};

/* Samples the row of sq (by the rejection rule against dp's sampled draft,
 * if any), appends, emits; finishes (and frees) sq if it stopped. Returns
 * true while sq runs on. */
static bool emit_token(struct scheduler *s, struct seq *sq, const float *row,
                       struct draft_pick dp, int64_t now_ns) {
    struct sampler_result res;
    bool want_lp = sq->n_logprobs >= 0;  // filling res costs a pass over the row
    bool is_dead = false;
    s->emitted = -1;
    const uint64_t *allow = grammar_allow(s, sq, &is_dead);
    buf_reset(&s->text);
    if (is_dead && grammar_is_cut_dead(sq->grammar)) {
        // Not a dead end: a grammar too ambiguous to follow within a mask's bound of
        // work (grammar.h). Ending with "stop" would say the grammar is complete.
        LOG_WARN("seq=%llu: its grammar is too ambiguous to follow (every token mask hit "
                 "the matcher's bound of work); ending it with an error",
                 (unsigned long long)sq->id);
        seq_queue_remove(&s->running, sq);
        sq->status = SEQ_STATUS_FINISHED_ERROR;
        finish_seq(s, sq, ERR_UNSUPPORTED);
        return false;
    }
    if (is_dead) {  // nothing can continue the grammar: end here, truthfully "stop"
        LOG_DEBUG("seq=%llu grammar has no allowed token; stopping", (unsigned long long)sq->id);
        grammar_stop(s, sq);
        return false;
    }
    int32_t token = dp.q ? sampler_sample_draft(sq->sampler, s->scratch, row, allow, dp.token,
                                                dp.q, want_lp ? &res : NULL)
                         : sampler_sample_allowed(sq->sampler, s->scratch, row, allow,
                                                  want_lp ? &res : NULL);
    enum grammar_step gst = GRAMMAR_STEP_OK;
    if (seq_is_constrained(sq)) {
        gst = grammar_accept_token(sq->grammar, s->gvocab, token);
    } else if (sq->grammar) {
        // A grammar waiting for its trigger: the token was free; it may start it.
        gst = seq_grammar_trigger(sq, token);
        if (gst == GRAMMAR_STEP_REJECT) gst = GRAMMAR_STEP_OK;  // dropped: free text goes on
    }
    if (gst == GRAMMAR_STEP_REJECT) {
        // Every allowed token was banned after the mask (logit bias, min_tokens
        // holding back the end): the sampler fell back to a token outside the
        // grammar, which is never emitted. The output so far is what we have.
        LOG_DEBUG("seq=%llu every grammar token was banned; stopping", (unsigned long long)sq->id);
        grammar_stop(s, sq);
        return false;
    }
    enum seq_status st = seq_append(sq, token, &s->text);
    s->emitted = token;
    // A grammar that is complete ends the sequence with the token's text.
    if (gst == GRAMMAR_STEP_DONE && st == SEQ_STATUS_RUNNING) st = seq_finish_stop(sq, &s->text);
    if (sq->channel)
        channel_push(sq->channel, token, s->text.data ? s->text.data : "", s->text.len,
                     want_lp ? &res : NULL);
    s->cur.n_generated_tokens++;
    if (sq->t_last_token_ns == 0)
        stats_observe(&s->cur.ttft, (double)(now_ns - sq->t_arrival_ns) / 1e6);
    else
        stats_observe(&s->cur.inter_token, (double)(now_ns - sq->t_last_token_ns) / 1e6);
    sq->t_last_token_ns = now_ns;
    if (st != SEQ_STATUS_RUNNING) {
        seq_queue_remove(&s->running, sq);
        finish_seq(s, sq, 0);
        return false;
    }
    return true;
}

/* Speculative decoding. A decoding sequence whose last tokens occurred
 * earlier in it gets the tokens that followed there as a draft: they go into
 * the step after its real token, each with its own logits row, at the next
 * positions (blocks reserved from the free pool, never by preempting).
 * verify() then samples row 0 as usual; while the token it gave equals the
 * draft's, the draft token's K/V is already right and its row gives the
 * next token. So the tokens are exactly those of decoding one at a time
 * (the same rows, the same sampler draws in the same order): a point-mass
 * draft accepted when the sample equals it is the standard rejection rule.
 * A draft model's drafts for a sequence that samples without a seed are
 * sampled instead, from the draft's distribution q under the sequence's own
 * sampling pipeline, and verified by the general rule (keep with
 * min(1, p/q), else draw from max(0, p - q)): the tokens are distributed as
 * without drafts (not the same draws), and a draft close to the model is
 * kept far more often than its greedy token would be.
 * Rejected tokens' K/V is left behind n_computed (overwritten later) and
 * their blocks are released: nothing is copied. Only steps with at most
 * SCHEDULER_DRAFT_MAX_DECODES decoders draft: at batch 1 a step reads every
 * weight for one token and verifying a few more is nearly free; at many
 * sequences the step is compute-bound and a rejected draft costs. A
 * sequence whose drafts were mostly rejected (under 1 in 4 of 16 or more)
 * stops drafting for its next 64 tokens. And drafting must pay on this model
 * and machine: the time per emitted token of decode-only steps is kept for
 * steps with drafts and without (moving averages); the faster mode is used,
 * the other one every DRAFT_EXPLORE_STEPS steps to keep its figure fresh. A
 * tiny model whose step is overhead, not weight reads, verifies drafts at
 * nearly the cost of decoding them and turns drafting off by itself. */
#define DRAFT_MIN_SAMPLE 16
#define DRAFT_BACKOFF_TOKENS 64
#define DRAFT_EXPLORE_STEPS 32
#define DRAFT_EMA_WEIGHT 0.1

/* Whether this decode-only step drafts (see above). A draft model explores
 * for two steps: the first feeds it the tokens of the steps without drafts
 * and is not timed (propose_drafts). */
static bool draft_choice(struct scheduler *s) {
    if (s->p.draft_always || s->draft_ns_on == 0.0) return true;
    if (s->draft_ns_off == 0.0) return false;
    bool is_on_faster = s->draft_ns_on < s->draft_ns_off;
    if (s->n_draft_steps % DRAFT_EXPLORE_STEPS < (s->drafter ? 2 : 1)) return !is_on_faster;
    return is_on_faster;
}

/* Feeds a decode-only step's time per emitted token to its mode's average. */
static void draft_observe(struct scheduler *s, int64_t ns, int32_t n_emitted) {
    if (n_emitted <= 0) return;
    double *ema = s->is_drafting ? &s->draft_ns_on : &s->draft_ns_off;
    double x = (double)ns / n_emitted;
    *ema = *ema == 0.0 ? x : *ema + DRAFT_EMA_WEIGHT * (x - *ema);
}

/* The most draft tokens sequence sq may take, given the
 * batch's tokens and rows so far. */
static int32_t draft_room(const struct scheduler *s, const struct seq *sq, int32_t n_tokens,
                          int32_t n_rows) {
    int32_t room = s->p.draft_n;
    if (room > s->p.max_batch_tokens - n_tokens) room = s->p.max_batch_tokens - n_tokens;
    if (room > s->max_outputs - n_rows) room = s->max_outputs - n_rows;
    // the draft and the token after it must fit in max_tokens
    if (room > sq->n_tokens_max - sq->n_tokens - 1) room = sq->n_tokens_max - sq->n_tokens - 1;
    return room;
}

/* Puts plan entry i's k draft tokens (in s->drafts) into the step: its
 * blocks for them first (from the free pool, never by preempting). */
static void take_draft(struct scheduler *s, int32_t i, int32_t k, int32_t *n_tokens,
                       int32_t *n_rows) {
    struct seq *sq = s->plan.seqs[i];
    if (k == 0) return;
    if (block_table_reserve(&sq->table, s->alloc, sq->n_tokens + k) != BLOCK_RESERVE_OK) {
        if (s->drafter) drafter_cut(s->drafter, sq, sq->n_tokens);
        return;
    }
    s->n_draft[i] = k;
    *n_tokens += k;
    *n_rows += k;
}

/* How many of prompt lookup's draft d [k] a constrained sequence's grammar
 * takes in turn (all of it for an unconstrained sequence): the draft is cut
 * before the first token the grammar refuses, which the model cannot emit,
 * so verifying it would only cost. The grammar is rewound after. */
static int32_t grammar_prefix(struct scheduler *s, struct seq *sq, const int32_t *d, int32_t k) {
    if (k == 0 || !seq_is_constrained(sq)) return k;
    const struct grammar_vocab *v = grammar_vocab_of(s);
    const int32_t at = grammar_mark(sq->grammar);
    int32_t n = 0;
    while (n < k) {
        const enum grammar_step st = grammar_accept_token(sq->grammar, v, d[n]);
        if (st == GRAMMAR_STEP_REJECT) break;
        n++;
        if (st == GRAMMAR_STEP_DONE) break;  // complete: nothing but the end can follow
    }
    grammar_rewind(sq->grammar, at);
    return n;
}

/* A draft model's draft length. With alpha the chance that a draft token
 * is right (each one given the ones before it: the sequence's accepted over
 * tested draft tokens, from a prior of 1 in 2), k drafted tokens yield
 * E(k) = 1 + alpha + ... + alpha^k tokens a step, and cost k drafting
 * passes (c each, in steps of the model without drafts) and k more tokens
 * in the model's step (1 / (F + 1) each, F its fixed cost in tokens,
 * step_cost.h). The k of room or less with the most tokens per cost wins;
 * none (0) when no k beats decoding without drafts. Before the costs are
 * measured, and with draft_always: room. */
static int32_t draft_length(const struct scheduler *s, const struct seq *sq, int32_t room,
                            int32_t n_decodes) {
    const double pass = drafter_pass_ns(s->drafter);
    if (s->p.draft_always || pass == 0.0 || s->draft_ns_off == 0.0) return room;
    const double c = pass / (s->draft_ns_off * (n_decodes > 0 ? n_decodes : 1));
    const double v = s->cost.fixed > 0 ? 1.0 / (s->cost.fixed + 1.0) : 0.0;
    const double alpha = (sq->draft_hits + 1.0) / (sq->draft_trials + 2.0);
    double best = 1.0, e = 1.0, a_k = 1.0;
    int32_t best_k = 0;
    for (int32_t k = 1; k <= room; k++) {
        a_k *= alpha;
        e += a_k;
        double value = e / (1.0 + k * (c + v));
        if (value > best) best = value, best_k = k;
    }
    return best_k;
}

static void propose_drafts(struct scheduler *s, int32_t *n_tokens, int32_t *n_rows) {
    struct step_plan *plan = &s->plan;
    int32_t n_decodes = 0;
    for (int32_t i = 0; i < plan->n_seqs; i++) {
        s->n_draft[i] = 0;
        s->draft_q_of[i] = NULL;
        const struct seq *sq = plan->seqs[i];
        n_decodes += plan->n_new[i] == 1 && sq->n_computed == sq->n_tokens - 1;
    }
    s->is_drafting = false;
    s->is_timed = false;
    if (s->p.draft_n == 0 || n_decodes > SCHEDULER_DRAFT_MAX_DECODES) return;
    if (n_decodes == plan->n_seqs) {  // decode-only: timed, so choose
        s->is_timed = true;
        s->n_draft_steps++;
        if (!draft_choice(s)) return;
    }
    s->is_drafting = true;
    int32_t n_jobs = 0, n_room = 0;
    for (int32_t i = 0; i < plan->n_seqs; i++) {
        struct seq *sq = plan->seqs[i];
        if (plan->n_new[i] != 1 || sq->n_computed != sq->n_tokens - 1) continue;
        if (sq->n_tokens < sq->draft_resume_at) continue;
        int32_t *d = s->drafts + (size_t)i * SCHEDULER_MAX_DRAFT;
        if (!s->drafter) {
            int32_t k = draft_lookup(sq->tokens, sq->n_tokens, draft_room(s, sq, *n_tokens, *n_rows), d);
            take_draft(s, i, grammar_prefix(s, sq, d, k), n_tokens, n_rows);
            continue;
        }
        // The draft model drafts for all of them at once: room as if each
        // earlier one took all of its own.
        int32_t room = draft_room(s, sq, *n_tokens + n_room, *n_rows + n_room);
        if (room <= 0) continue;
        room = draft_length(s, sq, room, n_decodes);
        if (room == 0) {  // not worth it now: try again later, afresh
            sq->draft_resume_at = sq->n_tokens + DRAFT_BACKOFF_TOKENS;
            sq->draft_hits = sq->draft_trials = 0.0f;
            continue;
        }
        // A sequence that samples without a seed drafts by sampling, verified by the
        // rejection rule against the draft's distribution (sampler.h): more of its
        // drafts are kept than of greedy ones. Greedy and seeded sequences draft
        // greedily: their tokens stay exactly those without drafts.
        float *q = sampler_is_deterministic(sq->sampler)
                       ? NULL
                       : s->draft_q + (size_t)n_jobs * (size_t)s->p.draft_n * (size_t)s->n_vocab;
        // A sampled draft's blocks for the whole room first: whether it is taken
        // must not depend on what was drawn (one that ends in an end token is
        // shorter, and taking only the short ones where the pool is short would
        // tilt the tokens towards the end). The unused ones go back after.
        if (q && block_table_reserve(&sq->table, s->alloc, sq->n_tokens + room) !=
                     BLOCK_RESERVE_OK)
            continue;
        const bool is_constrained = seq_is_constrained(sq);
        s->jobs[n_jobs] = (struct drafter_job){
            .sq = sq, .room = room, .out = d, .q = q,
            .grammar = is_constrained ? sq->grammar : NULL,
            .gvocab = is_constrained ? grammar_vocab_of(s) : NULL,
        };
        s->job_of[n_jobs++] = i;
        n_room += room;
    }
    if (n_jobs == 0) return;
    struct seq_queue *queues[2] = {&s->running, &s->waiting};
    const int err = drafter_propose(s->drafter, s->jobs, n_jobs, queues, 2);
    for (int32_t j = 0; j < n_jobs; j++) {
        struct seq *sq = s->jobs[j].sq;
        if (s->jobs[j].q)  // the blocks reserved for its room beyond what it drafted
            block_table_truncate(&sq->table, s->alloc, sq->n_tokens + (err ? 0 : s->jobs[j].k));
    }
    if (err) return;
    for (int32_t j = 0; j < n_jobs; j++) {
        take_draft(s, s->job_of[j], s->jobs[j].k, n_tokens, n_rows);
        s->draft_q_of[s->job_of[j]] = s->jobs[j].q;
        // Catching the draft model up (a prompt, or the steps it sat out) is not
        // what a step with drafts costs: such a step is not timed.
        if (s->jobs[j].n_fed > 2) s->is_timed = false;
    }
}

/* The draft of row j of a verification (d [k], q: the distributions of a
 * sampled draft, or NULL): none past the draft's end. */
static struct draft_pick pick(const int32_t *d, int32_t k, const float *q, int32_t j,
                              size_t nv) {
    if (j >= k || !q) return (struct draft_pick){.token = -1, .q = NULL};
    return (struct draft_pick){.token = d[j], .q = q + (size_t)j * nv};
}

/* After the forward pass: sq's rows row .. row + k (k = its draft tokens
 * d). Emits row's token, then each next row's while the last emitted token
 * equals its draft token. A sampled draft (q: [k][n_vocab], the draft's
 * distributions) is kept or replaced by the rejection rule (sampler.h);
 * a greedy one is kept when the model's own sample equals it, the same rule
 * for a point mass. Returns false if sq finished (it is freed). */
static bool verify(struct scheduler *s, struct seq *sq, const float *logits, int32_t row,
                   const int32_t *d, int32_t k, const float *q, int64_t now_ns) {
    const size_t nv = (size_t)s->n_vocab;
    const int32_t n_before = sq->n_tokens;
    if (!emit_token(s, sq, logits + (size_t)row * nv, pick(d, k, q, 0, nv), now_ns)) return false;
    if (k == 0) return true;
    int32_t n_ok = 0;
    bool is_running = true;
    while (n_ok < k && s->emitted == d[n_ok]) {
        n_ok++;
        sq->n_computed++;  // d[n_ok - 1]'s K/V, written by this step, is the token's
        if (!emit_token(s, sq, logits + (size_t)(row + n_ok) * nv, pick(d, k, q, n_ok, nv),
                        now_ns)) {
            is_running = false;
            break;
        }
    }
    // A draft token the last emitted token equals was right, also where the
    // sequence ended with it (sq is freed then).
    s->cur.n_draft_tokens += k;
    s->cur.n_draft_accepted += n_ok + (!is_running && n_ok < k && s->emitted == d[n_ok]);
    if (!is_running) return false;
    block_table_truncate(&sq->table, s->alloc, sq->n_computed);
    // The draft model's KV holds the draft from n_before on: right as far as it was accepted.
    if (s->drafter) drafter_cut(s->drafter, sq, n_before + n_ok);
    if (s->p.enable_prefix_cache) seq_publish_blocks(sq, s->alloc);
    sq->n_drafted += k;
    sq->n_draft_accepted += n_ok;
    // Trials of the draft length's alpha: every accepted token, and the first
    // rejected one; the older ones count less (halved every 64).
    sq->draft_hits += (float)n_ok;
    sq->draft_trials += (float)(n_ok + (n_ok < k));
    if (sq->draft_trials > 64.0f) sq->draft_hits *= 0.5f, sq->draft_trials *= 0.5f;
    if (sq->n_drafted >= DRAFT_MIN_SAMPLE && 4 * sq->n_draft_accepted < sq->n_drafted) {
        sq->draft_resume_at = sq->n_tokens + DRAFT_BACKOFF_TOKENS;
        sq->n_drafted = sq->n_draft_accepted = 0;
    }
    return true;
}

/* Takes plan entry i out of the plan (its sequence failed before the forward pass). */
static void drop_plan_entry(struct step_plan *plan, int32_t i) {
    plan->n_tokens -= plan->n_new[i];
    for (int32_t j = i + 1; j < plan->n_seqs; j++) {
        plan->seqs[j - 1] = plan->seqs[j];
        plan->n_new[j - 1] = plan->n_new[j];
    }
    plan->n_seqs--;
}

/* Puts the adapters the plan assigned into the ctx's slots (no file I/O: the
 * adapters were loaded on other threads). A slot the engine refuses fails the
 * planned sequences that use it, and is emptied. */
static void sync_adapter_slots(struct scheduler *s) {
    for (int32_t k = 0; k < s->loras.n_slots; k++) {
        struct lora_slot *ls = &s->loras.slots[k];
        if (!ls->is_dirty) continue;
        int err = engine_ctx_set_adapter(s->ctx, k, ls->adapter);
        if (!err) {
            ls->is_dirty = false;
            LOG_DEBUG("adapter slot=%d adapter_id=%llu loaded", (int)k,
                      (unsigned long long)ls->adapter_id);
            continue;
        }
        LOG_ERROR("engine_ctx_set_adapter slot=%d failed: %s; failing its sequences", (int)k,
                  err_str(err));
        for (int32_t i = s->plan.n_seqs - 1; i >= 0; i--) {
            struct seq *sq = s->plan.seqs[i];
            if (sq->slot != k) continue;
            drop_plan_entry(&s->plan, i);
            seq_queue_remove(&s->running, sq);
            sq->status = SEQ_STATUS_FINISHED_ERROR;
            finish_seq(s, sq, err);
        }
        // Running sequences outside this step's plan may hold the slot too.
        struct seq *nxt;
        for (struct seq *sq = s->running.head; sq; sq = nxt) {
            nxt = sq->next;
            if (sq->slot != k) continue;
            seq_queue_remove(&s->running, sq);
            sq->status = SEQ_STATUS_FINISHED_ERROR;
            finish_seq(s, sq, err);
        }
        ASSERT(ls->n_users == 0);
        engine_adapter_release(ls->adapter);
        ls->adapter = NULL;
        ls->adapter_id = 0;
        ls->is_dirty = false;
        engine_ctx_set_adapter(s->ctx, k, NULL);
    }
}

int32_t scheduler_step(struct scheduler *s) {
    atomic_store(&s->t_progress_ns, clock_mono_ns());
    drain_mailbox(s);
    if (s->stopping && clock_mono_ns() >= s->t_stop_deadline_ns) cancel_all(s);

    struct step_plan *plan = &s->plan;
    s->budget.fixed_tokens = s->cost.fixed;
    plan_step(&s->running, &s->waiting, &s->rejected, s->alloc, &s->loras, &s->budget, plan);
    s->cur.n_preemptions += plan->n_preempted;
    s->cur.n_prefix_hit_tokens += plan->n_prefix_hit_tokens;
    s->cur.n_lora_waits += plan->n_lora_waits;
    while (s->rejected.head) {
        struct seq *sq = seq_queue_pop_front(&s->rejected);
        finish_seq(s, sq, ERR_TOOLONG);
    }
    if (plan->n_seqs == 0) {
        publish_stats(s);
        return 0;
    }
    sync_adapter_slots(s);
    if (plan->n_seqs == 0) {
        publish_stats(s);
        return 0;
    }

    // Flatten the plan into the batch: seqs[i] contributes the tokens
    // [n_computed, n_computed + n_new) and its draft; only a token that is
    // the sequence's last, or a draft token, asks for logits.
    // A draft's tokens follow its sequence's last token, each with a row.
    int32_t n_rows = 0;
    for (int32_t i = 0; i < plan->n_seqs; i++)
        n_rows += plan->seqs[i]->n_computed + plan->n_new[i] == plan->seqs[i]->n_tokens;
    int32_t n_with_drafts = plan->n_tokens;
    const int64_t t_draft_ns = clock_mono_ns();  // a draft model's passes count in the step
    propose_drafts(s, &n_with_drafts, &n_rows);
    int32_t n = 0;
    int32_t n_out = 0;
    for (int32_t i = 0; i < plan->n_seqs; i++) {
        struct seq *sq = plan->seqs[i];
        s->row_of[i] = -1;
        for (int32_t k = 0; k < plan->n_new[i] + s->n_draft[i]; k++) {
            int32_t pos = sq->n_computed + k;
            s->b_token[n] = k < plan->n_new[i]
                                ? sq->tokens[pos]
                                : s->drafts[(size_t)i * SCHEDULER_MAX_DRAFT + k - plan->n_new[i]];
            s->b_pos[n] = pos;
            s->b_seq[n] = i;
            s->b_adapter[n] = sq->slot;
            s->b_output[n] = pos >= sq->n_tokens - 1;
            if (pos == sq->n_tokens - 1) s->row_of[i] = n_out;
            n_out += s->b_output[n];
            n++;
        }
        s->b_seqs[i].block_table = sq->table.ids;
        s->b_seqs[i].n_blocks = sq->table.n_blocks;
    }
    struct engine_batch batch = {
        .n_tokens = n,
        .token = s->b_token,
        .pos = s->b_pos,
        .seq = s->b_seq,
        .adapter = s->b_adapter,
        .output = s->b_output,
        .n_seqs = plan->n_seqs,
        .seqs = s->b_seqs,
    };
    const float *logits = NULL;
    const int64_t t_forward_ns = clock_mono_ns();
    const bool is_timed = s->is_timed;
    const int64_t n_generated_before = s->cur.n_generated_tokens;
    int err = engine_forward(s->ctx, &batch, &logits);
    if (!err) step_cost_observe(&s->cost, n, clock_mono_ns() - t_forward_ns);
    if (err) {
        LOG_ERROR("engine_forward failed: %s; failing %d sequences", err_str(err),
                  (int)plan->n_seqs);
        for (int32_t i = 0; i < plan->n_seqs; i++) {
            struct seq *sq = plan->seqs[i];
            seq_queue_remove(&s->running, sq);
            sq->status = SEQ_STATUS_FINISHED_ERROR;
            finish_seq(s, sq, err);
        }
        publish_stats(s);
        return err;
    }

    int64_t now_ns = clock_mono_ns();
    for (int32_t i = 0; i < plan->n_seqs; i++) {
        struct seq *sq = plan->seqs[i];
        sq->n_computed += plan->n_new[i];
        if (s->p.enable_prefix_cache) seq_publish_blocks(sq, s->alloc);
        if (s->row_of[i] >= 0)
            verify(s, sq, logits, s->row_of[i], s->drafts + (size_t)i * SCHEDULER_MAX_DRAFT,
                   s->n_draft[i], s->draft_q_of[i], now_ns);
    }
    if (is_timed)
        draft_observe(s, clock_mono_ns() - t_draft_ns,
                      (int32_t)(s->cur.n_generated_tokens - n_generated_before));
    s->cur.n_steps++;
    s->cur.n_computed_tokens += n;
#ifndef NDEBUG
    ASSERT(scheduler_check(s));
#endif
    publish_stats(s);
    return n;
}

bool scheduler_has_work(struct scheduler *s) {
    // Pending cancels need no step: they only matter for queued sequences.
    return s->running.n > 0 || s->waiting.n > 0 || atomic_load(&s->n_submitted) > 0;
}

/* Every slot's n_users equals the running sequences that name it. */
static bool check_slots(struct scheduler *s) {
    if (!lora_slots_check(&s->loras)) return false;
    for (int32_t k = 0; k < s->loras.n_slots; k++) {
        int32_t n = 0;
        for (struct seq *q = s->running.head; q; q = q->next) n += q->slot == k;
        if (n != s->loras.slots[k].n_users) {
            LOG_ERROR("scheduler_check: adapter slot %d has n_users %d but %d running sequences",
                      (int)k, (int)s->loras.slots[k].n_users, (int)n);
            return false;
        }
    }
    for (struct seq *q = s->waiting.head; q; q = q->next) {
        if (q->slot >= 0) {
            LOG_ERROR("scheduler_check: waiting seq=%llu holds adapter slot %d",
                      (unsigned long long)q->id, (int)q->slot);
            return false;
        }
    }
    for (struct seq *q = s->running.head; q; q = q->next) {
        if ((q->adapter != NULL) != (q->slot >= 0) ||
            (q->slot >= 0 && (s->loras.slots[q->slot].adapter != q->adapter ||
                              s->loras.slots[q->slot].adapter_id != q->adapter_id))) {
            LOG_ERROR("scheduler_check: running seq=%llu has slot %d for the wrong adapter",
                      (unsigned long long)q->id, (int)q->slot);
            return false;
        }
    }
    return true;
}

bool scheduler_check(struct scheduler *s) {
    if (!block_alloc_check(s->alloc)) return false;
    const struct seq_queue *const all[2] = {&s->running, &s->waiting};
    if (s->drafter && !drafter_check(s->drafter, all, 2)) return false;
    if (!check_slots(s)) return false;
    int32_t n_blocks = block_alloc_n_total(s->alloc) + 1;
    memset(s->check_refs, 0, (size_t)n_blocks * sizeof(*s->check_refs));
    struct seq_queue *queues[2] = {&s->running, &s->waiting};
    for (int qi = 0; qi < 2; qi++) {
        for (struct seq *q = queues[qi]->head; q; q = q->next) {
            for (int32_t j = 0; j < q->table.n_blocks; j++) {
                int32_t id = q->table.ids[j];
                if (id < 0 || id >= n_blocks) return false;
                if (id) s->check_refs[id]++;
            }
            // Waste: at most the one partly filled block past n_computed.
            int32_t need = block_table_blocks_for(q->n_computed, s->p.block_size);
            if (q->table.n_blocks > need + 1 && q->status == SEQ_STATUS_RUNNING) {
                LOG_ERROR("scheduler_check: seq=%llu holds %d blocks for %d computed tokens",
                          (unsigned long long)q->id, (int)q->table.n_blocks, (int)q->n_computed);
                return false;
            }
        }
    }
    for (int32_t id = 1; id < n_blocks; id++) {
        if (s->check_refs[id] != block_alloc_n_refs(s->alloc, id)) {
            LOG_ERROR("scheduler_check: block %d n_refs %d but %d tables hold it", (int)id,
                      (int)block_alloc_n_refs(s->alloc, id), (int)s->check_refs[id]);
            return false;
        }
    }
    return true;
}

/* ---- the loop thread ---- */

static void on_idle(uv_idle_t *h) {
    struct scheduler *s = h->data;
    scheduler_step(s);
    if (scheduler_has_work(s)) return;
    uv_idle_stop(&s->idle);
    if (s->stopping) uv_stop(&s->loop);
}

static void on_async(uv_async_t *h) {
    struct scheduler *s = h->data;
    if (!uv_is_active((uv_handle_t *)&s->idle)) uv_idle_start(&s->idle, on_idle);
}

static void loop_main(void *arg) {
    struct scheduler *s = arg;
    atomic_store(&s->is_loop_running, true);
    uv_run(&s->loop, UV_RUN_DEFAULT);
    atomic_store(&s->is_loop_running, false);
}

int scheduler_start(struct scheduler *s) {
    ASSERT(!s->has_thread);
    if (uv_thread_create(&s->thread, loop_main, s) != 0) {
        LOG_ERROR("%s: cannot create the step thread", __func__);
        return ERR_NOMEM;
    }
    s->has_thread = true;
    // Alive from here on: the thread sets the flag itself when uv_run begins,
    // but a caller asking right after start must not see a spurious "dead".
    atomic_store(&s->is_loop_running, true);
    return 0;
}

bool scheduler_is_alive(struct scheduler *s) {
    if (!atomic_load(&s->is_loop_running) || !atomic_load(&s->is_accepting)) return false;
    bool has_work = atomic_load(&s->n_submitted) > 0 || atomic_load(&s->n_waiting) > 0;
    if (!has_work) {
        uv_mutex_lock(&s->stats_lock);
        has_work = s->published.n_running > 0;
        uv_mutex_unlock(&s->stats_lock);
    }
    if (!has_work) return true;  // idle: asleep in uv_run, which is fine
    return clock_mono_ns() - atomic_load(&s->t_progress_ns) <
           (int64_t)SCHEDULER_STALL_MS * 1000000;
}

/* ---- lifecycle ---- */

/* The draft model's pool: draft_kv_blocks, else room for
 * SCHEDULER_DRAFT_MAX_DECODES whole sequences of n_ctx tokens (n_ctx 0:
 * unknown before the model's pool is sized; then half the budget), out of
 * kv_memory_mib, of which it takes at most half. */
static int32_t draft_pool_blocks(const struct scheduler_params *p, int32_t n_ctx) {
    if (p->draft_kv_blocks > 0) return p->draft_kv_blocks;
    size_t bb = engine_kv_block_bytes(p->draft_model, p->block_size, p->kv_type);
    int64_t most = bb ? (int64_t)((((size_t)p->kv_memory_mib << 20) / 2) / bb) : 0;
    int64_t n = n_ctx > 0 ? (int64_t)SCHEDULER_DRAFT_MAX_DECODES *
                                block_table_blocks_for(n_ctx, p->block_size)
                          : most;
    if (n > most) n = most;
    if (n > (1 << 24)) n = 1 << 24;
    return (int32_t)n + 1;  // + the null block
}

/* The model's pool: kv_blocks, else kv_memory_mib less what the draft
 * model's pool of draft_blocks takes of it (0: no draft model, or a pool
 * given in blocks). */
static int32_t pool_blocks(const struct engine_model *model, const struct scheduler_params *p,
                           int32_t draft_blocks) {
    const int32_t parts = p->kv_parts > 1 ? p->kv_parts : 1;  // 0 (unset) is 1
    if (p->kv_blocks > 0) {
        const int64_t n = ((int64_t)p->kv_blocks + parts - 1) / parts * parts;
        return n > (1 << 24) ? (1 << 24) / parts * parts : (int32_t)n;
    }
    size_t bb = engine_kv_block_bytes(model, p->block_size, p->kv_type);
    if (bb == 0) return 0;
    size_t budget = (size_t)p->kv_memory_mib << 20;
    if (draft_blocks > 1) {
        size_t taken = (size_t)(draft_blocks - 1) *
                       engine_kv_block_bytes(p->draft_model, p->block_size, p->kv_type);
        budget = taken < budget ? budget - taken : 0;
    }
    size_t n = budget / bb;
    if (n > (1u << 24)) n = 1u << 24;
    // Divided: the budget is each rank's, whose blocks are one id in `parts`
    // (the null block is rank 0's first); whole: + the null block.
    if (parts > 1) {
        if (n > (1u << 24) / (size_t)parts) n = (1u << 24) / (size_t)parts;
        return (int32_t)(n * (size_t)parts);
    }
    return (int32_t)n + 1;  // + the null block
}

static int create_drafter(struct scheduler *s, int32_t n_draft_blocks) {
    struct drafter_params dp = {
        .block_size = s->p.block_size,
        .n_blocks = n_draft_blocks,
        .max_seqs = SCHEDULER_DRAFT_MAX_DECODES,
        .max_batch_tokens = s->p.max_batch_tokens,
        .n_vocab = s->n_vocab,
        .kv_type = s->p.kv_type,
        .pool_of = s->ctx,
        .scratch = s->scratch,
    };
    if (dp.n_blocks < 2) {
        LOG_ERROR("%s: a KV budget of %d MiB holds no block of the draft model", __func__,
                  (int)s->p.kv_memory_mib);
        return ERR_INVAL;
    }
    int err = drafter_create(s->p.draft_model, &dp, &s->drafter);
    if (err) return err;
    s->jobs = calloc(SCHEDULER_DRAFT_MAX_DECODES, sizeof(*s->jobs));
    s->job_of = calloc(SCHEDULER_DRAFT_MAX_DECODES, sizeof(*s->job_of));
    s->draft_q = malloc((size_t)SCHEDULER_DRAFT_MAX_DECODES * (size_t)s->p.draft_n *
                        (size_t)s->n_vocab * sizeof(*s->draft_q));
    if (!s->jobs || !s->job_of || !s->draft_q) return ERR_NOMEM;
    // The draft distributions (q) are outside kv_memory_mib, like the logits: say how much.
    LOG_INFO("draft model: kv_blocks=%d kv_mib=%.1f draft_n=%d q_mib=%.1f",
             (int)(dp.n_blocks - 1),
             (double)engine_kv_block_bytes(s->p.draft_model, dp.block_size, dp.kv_type) *
                 (dp.n_blocks - 1) / 1048576.0,
             (int)s->p.draft_n,
             (double)SCHEDULER_DRAFT_MAX_DECODES * s->p.draft_n * s->n_vocab *
                 sizeof(*s->draft_q) / 1048576.0);
    return 0;
}

int scheduler_create(const struct engine_model *model, const struct scheduler_params *p,
                     struct scheduler **out) {
    *out = NULL;
    if (p->block_size < 1 || p->block_size > 1024 || p->max_seqs < 1 ||
        p->max_batch_tokens < 1 || p->max_queue < 1 || p->kv_blocks < 0 ||
        (p->kv_blocks == 0 && p->kv_memory_mib < 1) || p->n_ctx < 0 ||
        p->kv_type < 0 || p->kv_type >= ENGINE_KV_TYPE_COUNT || p->max_loras < 0 ||
        p->max_loras > SCHEDULER_MAX_LORAS || p->draft_n < 0 || p->draft_n > SCHEDULER_MAX_DRAFT ||
        p->draft_kv_blocks < 0 || p->kv_parts < 0 || p->kv_parts > 1024) {
        LOG_ERROR("%s: bad params block_size=%d max_seqs=%d max_batch_tokens=%d max_queue=%d "
                  "kv_blocks=%d kv_memory_mib=%d max_loras=%d draft_n=%d draft_kv_blocks=%d "
                  "draft_model=%s", __func__,
                  (int)p->block_size, (int)p->max_seqs, (int)p->max_batch_tokens,
                  (int)p->max_queue, (int)p->kv_blocks, (int)p->kv_memory_mib,
                  (int)p->max_loras, (int)p->draft_n, (int)p->draft_kv_blocks,
                  p->draft_model ? "set" : "none");
        return ERR_INVAL;
    }
    // A draft model's pool comes out of the same KV budget (unless either pool is
    // given in blocks), sized first: it needs the context, known here unless
    // neither --ctx nor the model gives one.
    int32_t n_draft_blocks = 0;
    if (p->draft_model) {
        const struct engine_model_info *mi = engine_model_get_info(model);
        n_draft_blocks = draft_pool_blocks(p, p->n_ctx > 0 ? p->n_ctx : mi->n_ctx_train);
    }
    int32_t n_blocks = pool_blocks(model, p, p->draft_kv_blocks > 0 ? 0 : n_draft_blocks);
    if (n_blocks < 2) {
        LOG_ERROR("%s: a KV budget of %d MiB holds no block of %zu bytes", __func__,
                  (int)p->kv_memory_mib, engine_kv_block_bytes(model, p->block_size, p->kv_type));
        return ERR_INVAL;
    }
    struct scheduler *s = calloc(1, sizeof(*s));
    if (!s) return ERR_NOMEM;
    s->model = model;
    s->p = *p;
    if (p->draft_model && p->draft_n == 0) s->p.draft_n = SCHEDULER_DRAFT_N_WITH_MODEL;
    s->tok = engine_model_tokenizer(model);
    const struct engine_model_info *info = engine_model_get_info(model);
    s->n_vocab = info->n_vocab;
    s->sliding_window = info->sliding_window;
    int64_t pool_tokens = (int64_t)(n_blocks - 1) * p->block_size;
    s->n_ctx = info->n_ctx_train > 0 ? info->n_ctx_train : (int32_t)(pool_tokens < INT32_MAX ? pool_tokens : INT32_MAX);
    if (p->n_ctx > 0) s->n_ctx = p->n_ctx;  // --ctx overrides the model's context_length
    atomic_init(&s->next_id, 1);
    atomic_init(&s->n_submitted, 0);
    atomic_init(&s->n_waiting, 0);
    atomic_init(&s->is_accepting, true);
    atomic_init(&s->is_stop_requested, false);

    struct engine_ctx_params cp = engine_ctx_default_params();
    cp.n_threads = p->n_threads;
    cp.max_batch_tokens = p->max_batch_tokens;
    cp.max_seqs = p->max_seqs;
    // One logits row per sequence, plus the draft tokens of the few decoders
    // that draft (propose_drafts); never more rows than tokens.
    int64_t rows = (int64_t)p->max_seqs + (int64_t)SCHEDULER_DRAFT_MAX_DECODES * s->p.draft_n;
    cp.max_outputs = rows < p->max_batch_tokens ? (int32_t)rows : p->max_batch_tokens;
    s->max_outputs = cp.max_outputs;
    cp.block_size = p->block_size;
    cp.n_blocks = n_blocks;
    cp.kv_type = p->kv_type;
    cp.kv_divided = p->kv_parts > 1;
    cp.max_adapters = p->max_loras;
    cp.comm = p->comm;
    lora_slots_init(&s->loras, p->max_loras);
    int err = engine_ctx_create(model, &cp, &s->ctx);
    if (err) goto fail;
    err = block_alloc_create(n_blocks, p->block_size, &s->alloc);
    if (err) goto fail;
    err = ERR_NOMEM;
    s->scratch = sampler_scratch_create(s->n_vocab);
    if (!s->scratch) goto fail;
    if (p->draft_model) {
        err = create_drafter(s, n_draft_blocks);
        if (err) goto fail;
    }
    err = ERR_NOMEM;
    size_t nt = (size_t)p->max_batch_tokens;
    s->b_token = malloc(nt * sizeof(*s->b_token));
    s->b_pos = malloc(nt * sizeof(*s->b_pos));
    s->b_seq = malloc(nt * sizeof(*s->b_seq));
    s->b_adapter = malloc(nt * sizeof(*s->b_adapter));
    s->b_output = malloc(nt * sizeof(*s->b_output));
    s->b_seqs = calloc((size_t)p->max_seqs, sizeof(*s->b_seqs));
    s->row_of = calloc((size_t)p->max_seqs, sizeof(*s->row_of));
    s->n_draft = calloc((size_t)p->max_seqs, sizeof(*s->n_draft));
    s->drafts = calloc((size_t)p->max_seqs * SCHEDULER_MAX_DRAFT, sizeof(*s->drafts));
    s->check_refs = calloc((size_t)n_blocks, sizeof(*s->check_refs));
    s->draft_q_of = calloc((size_t)p->max_seqs, sizeof(*s->draft_q_of));
    if (!s->b_token || !s->b_pos || !s->b_seq || !s->b_adapter || !s->b_output || !s->b_seqs ||
        !s->row_of || !s->n_draft || !s->drafts || !s->check_refs || !s->draft_q_of)
        goto fail;
    step_plan_init(&s->plan, p->max_seqs);
    s->budget.max_batch_tokens = p->max_batch_tokens;
    s->budget.prefill_chunk = p->prefill_chunk;
    s->budget.step_ratio = p->step_ratio;
    step_cost_init(&s->cost);
    s->budget.max_seqs = p->max_seqs;
    s->budget.sliding_window = s->sliding_window;
    s->budget.enable_prefix_cache = p->enable_prefix_cache;

    if (uv_loop_init(&s->loop) != 0) goto fail;
    s->has_loop = true;
    if (uv_async_init(&s->loop, &s->async, on_async) != 0) goto fail;
    uv_idle_init(&s->loop, &s->idle);
    s->async.data = s;
    s->idle.data = s;
    s->has_handles = true;
    s->mailbox = mailbox_create(wake_loop, s);
    if (!s->mailbox) goto fail;
    s->has_mailbox = true;
    if (uv_mutex_init(&s->stats_lock) != 0) goto fail;
    s->has_stats = true;
    publish_stats(s);
    LOG_INFO("scheduler: kv_blocks=%d block_size=%d kv_type=%s kv_mib=%.1f max_seqs=%d max_batch_tokens=%d "
             "prefix_cache=%d n_ctx=%d max_loras=%d", (int)(n_blocks - 1), (int)p->block_size,
             engine_kv_type_name(p->kv_type),
             (double)engine_kv_block_bytes(model, p->block_size, p->kv_type) * (n_blocks - 1) / 1048576.0,
             (int)p->max_seqs, (int)p->max_batch_tokens, (int)p->enable_prefix_cache,
             (int)s->n_ctx, (int)p->max_loras);
    *out = s;
    return 0;

fail:
    scheduler_free(s);
    return err;
}

void scheduler_stop(struct scheduler *s, int64_t grace_ms) {
    atomic_store(&s->is_accepting, false);
    if (atomic_exchange(&s->is_stop_requested, true)) return;
    if (grace_ms < 0) grace_ms = 0;
    if (s->has_thread) {
        struct mailbox_msg *m = xcalloc(1, sizeof(*m));
        m->type = MAILBOX_MSG_STOP;
        m->arg_ms = grace_ms;
        mailbox_post(s->mailbox, m);
        uv_thread_join(&s->thread);
        s->has_thread = false;
        // Anything that raced in after the loop's last step.
        drain_mailbox(s);
        cancel_all(s);
    } else {
        // Driven by hand: finish within the grace period on this thread.
        drain_mailbox(s);
        s->stopping = true;
        s->t_stop_deadline_ns = clock_mono_ns() + grace_ms * 1000000;
        while (scheduler_has_work(s)) scheduler_step(s);
    }
    publish_stats(s);
}

static void close_noop(uv_handle_t *h) {
    (void)h;
}

void scheduler_free(struct scheduler *s) {
    if (!s) return;
    if (s->has_mailbox) scheduler_stop(s, 0);
    if (s->has_handles) {
        uv_close((uv_handle_t *)&s->async, close_noop);
        uv_close((uv_handle_t *)&s->idle, close_noop);
        uv_run(&s->loop, UV_RUN_DEFAULT);
    }
    if (s->has_loop) uv_loop_close(&s->loop);
    mailbox_destroy(s->mailbox, free_msg);
    if (s->has_stats) uv_mutex_destroy(&s->stats_lock);
    step_plan_deinit(&s->plan);
    free(s->b_token);
    free(s->b_pos);
    free(s->b_seq);
    free(s->b_adapter);
    free(s->b_output);
    free(s->b_seqs);
    free(s->row_of);
    free(s->n_draft);
    free(s->drafts);
    free(s->jobs);
    free(s->job_of);
    free(s->draft_q);
    free(s->draft_q_of);
    free(s->check_refs);
    sampler_scratch_free(s->scratch);
    grammar_vocab_free(s->gvocab);
    free(s->allow);
    buf_free(&s->text);
    drafter_free(s->drafter);  // before the ctx whose worker pool it borrows
    block_alloc_destroy(s->alloc);
    lora_slots_deinit(&s->loras);
    engine_ctx_free(s->ctx);
    free(s);
}

/* ---- any thread ---- */

static int validate_request(const struct scheduler *s, const struct scheduler_request *r) {
    if (!r->prompt || r->n_prompt < 1 || r->max_tokens < 1 || r->min_tokens < 0 ||
        r->n_logprobs < -1 || r->n_logprobs > SAMPLER_MAX_TOP_LOGPROBS || r->n_stop < 0 ||
        r->n_stop_token_ids < 0 || (r->n_stop_token_ids > 0 && !r->stop_token_ids) ||
        (r->adapter && s->p.max_loras == 0))
        return ERR_INVAL;
    for (int32_t i = 0; i < r->n_prompt; i++)
        if (r->prompt[i] < 0 || r->prompt[i] >= s->n_vocab) return ERR_INVAL;
    char msg[128];
    if (sampler_params_validate(&r->sampling, s->n_vocab, msg, sizeof(msg)) != 0) {
        LOG_DEBUG("submit: %s", msg);
        return ERR_INVAL;
    }
    if (stop_matcher_validate(r->stop, r->n_stop, msg, sizeof(msg)) != 0) {
        LOG_DEBUG("submit: %s", msg);
        return ERR_INVAL;
    }
    if (r->reply_prefix && strlen(r->reply_prefix) > SEQ_MAX_REPLY_PREFIX) return ERR_INVAL;
    // Lengths: the context, and the pool (with a sliding window only the
    // window plus one step's chunk is ever live).
    int64_t n_total = (int64_t)r->n_prompt + r->max_tokens;
    if (n_total > s->n_ctx) return ERR_TOOLONG;
    int64_t n_live = n_total;
    int64_t n_slack = 0;
    if (s->sliding_window > 0 && (int64_t)s->sliding_window + s->p.max_batch_tokens < n_live) {
        n_live = (int64_t)s->sliding_window + s->p.max_batch_tokens;
        n_slack = 1;  // the window's first block is partly outside it
    }
    int64_t bs = s->p.block_size;
    if ((n_live + bs - 1) / bs + n_slack > block_alloc_n_total(s->alloc)) return ERR_TOOLONG;
    return 0;
}

int scheduler_submit(struct scheduler *s, const struct scheduler_request *req, uint64_t *out_id,
                     struct channel **out_channel) {
    *out_id = 0;
    *out_channel = NULL;
    if (!atomic_load(&s->is_accepting)) return ERR_SHUTDOWN;
    int err = validate_request(s, req);
    if (err) return err;
    // Work arriving at an idle loop restarts the stall clock; a loop that
    // hangs leaves submissions queued, so later ones do not refresh it.
    if (atomic_load(&s->n_submitted) == 0) atomic_store(&s->t_progress_ns, clock_mono_ns());
    int n_queued = atomic_fetch_add(&s->n_submitted, 1);
    if (n_queued + atomic_load(&s->n_waiting) >= s->p.max_queue) {
        atomic_fetch_sub(&s->n_submitted, 1);
        return ERR_FULL;
    }
    struct seq_params sp = {
        .sampling = req->sampling,
        .max_tokens = req->max_tokens,
        .min_tokens = req->min_tokens,
        .stop = req->stop,
        .n_stop = req->n_stop,
        .include_stop_str = req->include_stop_str,
        .stop_token_ids = req->stop_token_ids,
        .n_stop_token_ids = req->n_stop_token_ids,
        .ignore_eos = req->ignore_eos,
        .skip_special = req->skip_special,
        .reply_prefix = req->reply_prefix,
        .n_logprobs = req->n_logprobs,
        .adapter = req->adapter,
        .grammar = req->grammar,
        .grammar_trigger = req->grammar_trigger,
    };
    uint64_t id = atomic_fetch_add(&s->next_id, 1);
    struct seq *sq = NULL;
    err = seq_create(id, s->tok, s->n_vocab, req->prompt, req->n_prompt, &sp, s->p.block_size, &sq);
    struct channel *c = err ? NULL : channel_create(req->n_logprobs >= 0);
    struct mailbox_msg *m = err ? NULL : calloc(1, sizeof(*m));
    if (err || !c || !m) {
        atomic_fetch_sub(&s->n_submitted, 1);
        seq_destroy(sq);
        if (c) {
            channel_release(c);
            channel_release(c);
        }
        free(m);
        return err ? err : ERR_NOMEM;
    }
    sq->channel = c;  // the producer's reference; the caller gets the other
    sq->t_arrival_ns = clock_mono_ns();
    m->type = MAILBOX_MSG_SUBMIT;
    m->id = id;
    m->payload = sq;
    mailbox_post(s->mailbox, m);
    *out_id = id;
    *out_channel = c;
    return 0;
}

void scheduler_cancel(struct scheduler *s, uint64_t id) {
    struct mailbox_msg *m = xcalloc(1, sizeof(*m));
    m->type = MAILBOX_MSG_CANCEL;
    m->id = id;
    mailbox_post(s->mailbox, m);
}

void scheduler_get_stats(struct scheduler *s, struct scheduler_stats *out) {
    uv_mutex_lock(&s->stats_lock);
    *out = s->published;
    uv_mutex_unlock(&s->stats_lock);
}
