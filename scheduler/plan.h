/*
 * scheduler/plan.h - the step policy: which sequences compute how many tokens
 * this step, who is admitted, who is preempted.
 *
 * plan_step() is pure in the sense of STYLE 2.13: it calls no engine and no
 * clock and its result depends only on its inputs, so it is tested alone. It
 * does act on the ledger, as vLLM's schedule() does: it reserves the blocks of
 * what it schedules, takes prefix-cache hits, and preempts (recompute mode:
 * frees the victim's blocks, keeps its tokens, puts it at the head of the
 * waiting queue). scheduler.c executes the plan.
 * Threads: the step thread.
 */
#ifndef SCHEDULER_PLAN_H
#define SCHEDULER_PLAN_H

#include <stdbool.h>
#include <stdint.h>

#include "scheduler/seq.h"

struct block_alloc;
struct lora_slots;

struct plan_budget {
    int32_t max_batch_tokens;  // token_budget of one step, >= 1
    int32_t max_seqs;          // running sequences at most, >= 1
    int32_t sliding_window;    // the model's window in tokens, 0: none
    int32_t prefill_chunk;     // prefill tokens of a step beside decodes (plan.c), 0: no limit
    int32_t step_ratio;        // percent: a step with prompt work costs at most this much of
                               //    one where every sequence present decodes (plan.c), 0: off
    int32_t fixed_tokens;      // a step's fixed cost in tokens (step_cost.h), >= 0
    bool enable_prefix_cache;
};

/* Of the waiting queue, the first PLAN_WAIT_WINDOW sequences are candidates
 * of a step (shortest first among them); the rest wait their turn in FIFO. */
enum { PLAN_WAIT_WINDOW = 64 };

/* A candidate passed over this many steps in a row goes first (no starvation
 * of long prompts by a stream of short ones). */
enum { PLAN_MAX_PASSED_OVER = 32 };

/* Under step_ratio, prompt work beside decodes gets at least this many tokens
 * a step, so a prompt arriving beside a few streams still moves. */
enum { PLAN_MIN_PREFILL = 16 };

/* One step's decision. Arrays are sized once (step_plan_init) and reused. */
struct step_plan {
    int32_t n_seqs;               // scheduled sequences
    struct seq **seqs;            // owned array [max_seqs] of borrowed running sequences
    int32_t *n_new;               // owned array [max_seqs]: tokens from seqs[i]->n_computed
    int32_t n_tokens;             // sum of n_new, <= max_batch_tokens
    int32_t n_admitted;           // moved from waiting to running this step
    int32_t n_preempted;          // moved from running to the waiting head this step
    int32_t n_rejected;           // could never fit: moved to the rejected queue
    int32_t n_prefix_hit_tokens;  // prompt tokens of admitted sequences found in the cache
    int32_t n_lora_waits;         // admissions put off because every adapter slot was in use
    int32_t max_seqs;
    struct seq **cand;            // owned scratch [max_seqs + PLAN_WAIT_WINDOW]
};

void step_plan_init(struct step_plan *p, int32_t max_seqs);  // aborts on OOM (bookkeeping)
void step_plan_deinit(struct step_plan *p);

/* Plans one step (vLLM's rule, see plan.c). running and waiting are FIFO
 * (oldest at the head); sequences move between them. Admitting a sequence
 * with an adapter acquires a slot of loras (its seq->slot and adapter_id are
 * set; dirty slots must be put into the ctx before the forward pass); every
 * sequence leaving RUNNING here releases its slot. loras may be NULL when no
 * sequence has an adapter. A waiting sequence that
 * can never fit the pool goes to rejected with SEQ_STATUS_FINISHED_ERROR
 * (its request then fails with ERR_TOOLONG). Every scheduled sequence has
 * blocks for positions [0, n_computed + n_new) afterwards. The plan's
 * pointers are valid until the sequences leave the queues. */
void plan_step(struct seq_queue *running, struct seq_queue *waiting, struct seq_queue *rejected,
               struct block_alloc *a, struct lora_slots *loras, const struct plan_budget *b,
               struct step_plan *out);

#endif // SCHEDULER_PLAN_H
