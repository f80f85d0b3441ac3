/*
 * scheduler/plan.c - one step of in-flight batching.
 *
 * NOTE on the scheduling algorithm (vLLM's rule): there is no "prefill phase"
 * and no "decode phase". Each sequence has n_tokens (prompt + generated) and
 * n_computed (tokens whose K/V are already in its blocks). A step gives each
 * chosen sequence some of its n_tokens - n_computed missing tokens, within the
 * token budget, so that n_computed catches up with n_tokens. A fresh prompt is
 * "prefill", a prompt larger than the budget left is "chunked prefill", a
 * sequence one token behind is "decode", a preempted one is "recompute": all
 * the same thing.
 *
 * Order, so that running sequences keep streaming (decode first):
 *   1. running sequences one token behind (decodes), oldest first;
 *   2. running sequences further behind (continuing a chunked prefill or a
 *      recompute), oldest first, with what budget is left;
 *   3. waiting sequences, FIFO, while budget, max_seqs and blocks allow, and
 *      only in a step that preempted nobody (admitting while preempting would
 *      thrash). A sequence with an adapter also needs an adapter slot
 *      (lora_slots.h); when none can be had it stays waiting and admission
 *      goes on past it, but only for sequences without an adapter: so
 *      base-model requests are not held up by adapter traffic, and the slots'
 *      users drain until the blocked sequence gets one (no starvation by later
 *      adapter requests either).
 * When a running sequence needs a block and none is free, the newest running
 * sequence is preempted (recompute: blocks freed, tokens kept, head of the
 * waiting queue), repeatedly, down to the sequence itself.
 */
#include "scheduler/plan.h"

#include <stdlib.h>
#include <string.h>

#include "engine/base/alloc.h"
#include "scheduler/block_alloc.h"
#include "scheduler/block_table.h"
#include "scheduler/lora_slots.h"

void step_plan_init(struct step_plan *p, int32_t max_seqs) {
    memset(p, 0, sizeof(*p));
    ASSERT(max_seqs >= 1);
    p->max_seqs = max_seqs;
    p->seqs = xcalloc((size_t)max_seqs, sizeof(*p->seqs));
    p->n_new = xcalloc((size_t)max_seqs, sizeof(*p->n_new));
}

void step_plan_deinit(struct step_plan *p) {
    free(p->seqs);
    free(p->n_new);
    memset(p, 0, sizeof(*p));
}

struct planner {
    struct seq_queue *running;
    struct seq_queue *waiting;
    struct seq_queue *rejected;
    struct block_alloc *a;
    struct lora_slots *loras;
    const struct plan_budget *b;
    struct step_plan *out;
    int32_t budget;  // tokens left this step
};

static void add_to_plan(struct planner *pl, struct seq *s, int32_t n_new) {
    struct step_plan *out = pl->out;
    ASSERT(out->n_seqs < out->max_seqs && n_new >= 1 && n_new <= pl->budget);
    out->seqs[out->n_seqs] = s;
    out->n_new[out->n_seqs] = n_new;
    out->n_seqs++;
    out->n_tokens += n_new;
    pl->budget -= n_new;
}

/* Takes a preempted sequence out of this step's plan, if it was in it. */
static void drop_from_plan(struct planner *pl, const struct seq *s) {
    struct step_plan *out = pl->out;
    for (int32_t i = 0; i < out->n_seqs; i++) {
        if (out->seqs[i] != s) continue;
        pl->budget += out->n_new[i];
        out->n_tokens -= out->n_new[i];
        memmove(&out->seqs[i], &out->seqs[i + 1], (size_t)(out->n_seqs - i - 1) * sizeof(*out->seqs));
        memmove(&out->n_new[i], &out->n_new[i + 1], (size_t)(out->n_seqs - i - 1) * sizeof(*out->n_new));
        out->n_seqs--;
        return;
    }
}

/* A sequence leaving RUNNING (or a failed admission) gives its adapter slot back. */
static void release_slot(struct planner *pl, struct seq *s) {
    if (s->slot < 0) return;
    lora_slots_release(pl->loras, s->slot);
    s->slot = -1;
}

/* Recompute preemption (nano-vllm's four lines). */
static void preempt(struct planner *pl, struct seq *s) {
    drop_from_plan(pl, s);
    block_table_release(&s->table, pl->a);
    release_slot(pl, s);
    seq_reset_computed(s);
    s->status = SEQ_STATUS_PREEMPTED;
    s->n_preemptions++;
    seq_queue_remove(pl->running, s);
    seq_queue_push_front(pl->waiting, s);
    pl->out->n_preempted++;
}

static void reject(struct planner *pl, struct seq_queue *from, struct seq *s) {
    block_table_release(&s->table, pl->a);
    release_slot(pl, s);
    s->status = SEQ_STATUS_FINISHED_ERROR;
    seq_queue_remove(from, s);
    seq_queue_push_back(pl->rejected, s);
    pl->out->n_rejected++;
}

/* Blocks wholly before the window of the next token to compute are dropped. */
static void trim_window(struct planner *pl, struct seq *s) {
    int32_t w = pl->b->sliding_window;
    if (w > 0) block_table_trim(&s->table, pl->a, s->n_computed - w + 1);
}

/* Schedules running sequence s, preempting newer ones for blocks. */
static void schedule_running(struct planner *pl, struct seq *s) {
    trim_window(pl, s);
    for (;;) {
        int32_t redo = block_table_copy_on_write(&s->table, pl->a, s->n_computed);
        if (redo >= 0) {
            if (redo < s->n_computed) s->n_computed = redo;  // the copy is a recompute
            int32_t n_new = s->n_tokens - s->n_computed;
            if (n_new > pl->budget) n_new = pl->budget;
            enum block_reserve r = block_table_reserve(&s->table, pl->a, s->n_computed + n_new);
            if (r == BLOCK_RESERVE_OK) {
                add_to_plan(pl, s, n_new);
                return;
            }
            if (r == BLOCK_RESERVE_NEVER) {
                reject(pl, pl->running, s);
                return;
            }
        }
        struct seq *victim = pl->running->tail;
        preempt(pl, victim);
        if (victim == s) return;
    }
}

enum admit_result {
    ADMIT_OK,            // running now
    ADMIT_GONE,          // can never fit: rejected
    ADMIT_LATER_BLOCKS,  // not enough free blocks: wait, and so does everyone behind
    ADMIT_LATER_LORA,    // every adapter slot is in use: wait
};

/* Admits waiting sequence s if it fits. */
static enum admit_result admit(struct planner *pl, struct seq *s) {
    struct block_alloc *a = pl->a;
    int32_t bs = block_alloc_block_size(a);
    ASSERT(s->n_computed == 0 && s->table.n_blocks == 0 && s->slot < 0);
    // The adapter slot first, so a sequence that must wait for one takes no
    // blocks. (The cache keys do not depend on the slot: seq.adapter_id.)
    if (s->adapter) {
        ASSERT(pl->loras && pl->loras->n_slots > 0);  // scheduler_submit refuses otherwise
        int32_t slot = lora_slots_acquire(pl->loras, s->adapter);
        if (slot == LORA_SLOTS_NONE) return ADMIT_LATER_LORA;
        s->slot = slot;
    }
    // Prefix hits: full blocks whose key and tokens are cached, never the block
    // holding the last token, whose logits this step must compute. Each hit is
    // referenced at once (a cached block leaves the free list), so the reserve
    // below sees exactly the free blocks that remain.
    int32_t n_hits = 0;
    if (pl->b->enable_prefix_cache) {
        int32_t n_lookup = (s->n_tokens - 1) / bs;
        while (n_hits < n_lookup) {
            struct block_hash key = seq_block_key(s, n_hits, bs);
            int32_t id = block_alloc_lookup(a, key, &s->tokens[n_hits * bs], s->adapter_id);
            if (id == 0) break;
            block_table_append(&s->table, a, id);
            n_hits++;
        }
    }
    int32_t start = n_hits * bs;
    int32_t n_new = s->n_tokens - start;
    if (n_new > pl->budget) n_new = pl->budget;
    s->n_computed = start;
    trim_window(pl, s);
    enum block_reserve r = block_table_reserve(&s->table, a, start + n_new);
    if (r == BLOCK_RESERVE_NEVER) {
        reject(pl, pl->waiting, s);
        return ADMIT_GONE;  // the next one may fit
    }
    if (r == BLOCK_RESERVE_LATER) {
        // Give the hits back (they stay cached, now at the LRU tail) and the
        // slot (its adapter stays resident), and wait.
        block_table_release(&s->table, a);
        release_slot(pl, s);
        seq_reset_computed(s);
        return ADMIT_LATER_BLOCKS;
    }
    s->n_cached = start;
    s->n_published = n_hits;
    s->status = SEQ_STATUS_RUNNING;
    seq_queue_remove(pl->waiting, s);
    seq_queue_push_back(pl->running, s);
    pl->out->n_admitted++;
    pl->out->n_prefix_hit_tokens += start;
    add_to_plan(pl, s, n_new);
    return ADMIT_OK;
}

void plan_step(struct seq_queue *running, struct seq_queue *waiting, struct seq_queue *rejected,
               struct block_alloc *a, struct lora_slots *loras, const struct plan_budget *b,
               struct step_plan *out) {
    ASSERT(b->max_batch_tokens >= 1 && b->max_seqs >= 1 && b->max_seqs <= out->max_seqs);
    out->n_seqs = 0;
    out->n_tokens = 0;
    out->n_admitted = 0;
    out->n_preempted = 0;
    out->n_rejected = 0;
    out->n_prefix_hit_tokens = 0;
    out->n_lora_waits = 0;
    struct planner pl = {running, waiting, rejected, a, loras, b, out, b->max_batch_tokens};

    // 1. decodes, then 2. running sequences further behind.
    for (int pass = 0; pass < 2; pass++) {
        struct seq *nxt;
        for (struct seq *s = running->head; s && pl.budget > 0; s = nxt) {
            bool is_decode = s->n_tokens - s->n_computed == 1;
            if (is_decode != (pass == 0)) {
                nxt = s->next;
                continue;
            }
            ASSERT(s->n_tokens > s->n_computed);
            schedule_running(&pl, s);
            // s may have been preempted (then it was the newest: nothing follows).
            nxt = s->status == SEQ_STATUS_RUNNING ? s->next : NULL;
        }
    }
    // 3. admission, FIFO, never in a step that preempted; past a sequence
    // waiting for an adapter slot only sequences without an adapter.
    if (out->n_preempted > 0) return;
    bool is_lora_blocked = false;
    struct seq *nxt;
    for (struct seq *s = waiting->head; s && pl.budget > 0 && running->n < b->max_seqs; s = nxt) {
        nxt = s->next;
        if (s->adapter && is_lora_blocked) continue;
        enum admit_result r = admit(&pl, s);
        if (r == ADMIT_LATER_BLOCKS) break;
        if (r == ADMIT_LATER_LORA) {
            is_lora_blocked = true;
            out->n_lora_waits++;
        }
    }
}
