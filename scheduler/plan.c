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
 *   2. the prefill candidates, shortest remaining work first (ties: running
 *      before waiting, then oldest first), within the step's prefill
 *      allowance: running sequences further behind (a chunked prefill or a
 *      recompute continues) and the first PLAN_WAIT_WINDOW waiting ones.
 *      A waiting one is admitted while max_seqs and blocks allow, and only
 *      while the step has preempted nobody (admitting while preempting would
 *      thrash); once one must wait for blocks, so do the waiting ones after
 *      it. A sequence with an adapter also needs an adapter slot
 *      (lora_slots.h); when none can be had it stays waiting and admission
 *      goes on past it, but only for sequences without an adapter: so
 *      base-model requests are not held up by adapter traffic, and the slots'
 *      users drain until the blocked sequence gets one (no starvation by later
 *      adapter requests either). A candidate passed over PLAN_MAX_PASSED_OVER
 *      steps in a row goes first.
 *
 * NOTE on the prefill allowance (time to first token under load, and
 * inter-token latency while long prompts arrive): with the whole budget
 * open to prefill, 32 prompts arriving together are computed in one long
 * step and every client waits for all 32; a 2048-token prompt arriving
 * beside 32 streams makes one of their tokens take as long as the prompt.
 * So prefill work beside decodes is limited to max(prefill_chunk, the number
 * of decodes) tokens per step: a step costs at most about twice a decode
 * step once decodes are compute-bound, and no more than one when they read
 * weights (a chunk of prefill_chunk tokens rides on the same weight reads).
 * That bound is in tokens, and a step of 32 decodes and 256 prompt tokens
 * still costs 8 of them when decodes are compute-bound (the 110M model on an
 * AVX2 machine: inter-token p99 8x the median while 2000-token prompts kept
 * arriving, docs/benchmarks.md). So step_ratio r (percent, default 125) bounds
 * the step's cost instead: with n sequences present (running and waiting, at
 * most max_seqs), d of them decoding, and a step costing f + tokens (f the
 * fixed cost in tokens, fitted from the step times by step_cost.h), prompt
 * work gets p = r (n + f) - f - d tokens: the step costs at most r times the
 * one in which all n decode, which is what their streams see once the prompts
 * are in. p is at least PLAN_MIN_PREFILL (a prompt beside a few streams still
 * moves) and at most prefill_chunk. While more candidates could be finished
 * by a chunk of prefill_chunk than there are decodes (32 prompts arrived
 * together, few are done), prompt work gets prefill_chunk: the long steps are
 * seen by the few streams already going, and finishing the many short prompts
 * in large chunks is what nearly halves their median time to first token. Long
 * prompts do not count (a chunk does not finish them): beside them the ratio
 * holds (a first version counted every waiting sequence, and the backlog of
 * 2000-token prompts as the last streams finished put p99 back at 6x). When a model reads its weights
 * once for many tokens (large f), the tokens that ride free on those reads are
 * given to prompts.
 * With no decode in the step, the first candidate may take its whole need
 * (up to the budget): a lone prompt is not chunked for nobody's sake. Shortest
 * first then finishes prompts one after another, each client's first token
 * coming as soon as its own prompt is done. A candidate that needs at most a
 * quarter more than what is left of the allowance takes it all, so no chunk of
 * a few tokens is left over for another step. prefill_chunk 0 is the whole
 * budget (no allowance, step_ratio ignored); step_ratio 0 is
 * max(prefill_chunk, d) alone.
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
    p->cand = xcalloc((size_t)max_seqs + PLAN_WAIT_WINDOW, sizeof(*p->cand));
}

void step_plan_deinit(struct step_plan *p) {
    free(p->seqs);
    free(p->n_new);
    free(p->cand);
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

/* s's tokens in the plan if it was the last added to it, else 0. */
static int32_t last_planned(const struct step_plan *out, const struct seq *s) {
    return out->n_seqs > 0 && out->seqs[out->n_seqs - 1] == s ? out->n_new[out->n_seqs - 1] : 0;
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

/* Schedules up to cap (<= budget) tokens of running sequence s, preempting
 * newer ones for blocks. */
static void schedule_running(struct planner *pl, struct seq *s, int32_t cap) {
    trim_window(pl, s);
    for (;;) {
        int32_t redo = block_table_copy_on_write(&s->table, pl->a, s->n_computed);
        if (redo >= 0) {
            if (redo < s->n_computed) s->n_computed = redo;  // the copy is a recompute
            int32_t n_new = s->n_tokens - s->n_computed;
            if (n_new > cap) n_new = cap;
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

/* Admits waiting sequence s if it fits, with up to cap (<= budget) tokens. */
static enum admit_result admit(struct planner *pl, struct seq *s, int32_t cap) {
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
    if (n_new > cap) n_new = cap;
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

/* The prefill work a candidate needs: all its tokens when waiting (its
 * prefix hits are known only at admission), the missing ones when running. */
static int32_t need_of(const struct seq *s) {
    return s->status == SEQ_STATUS_RUNNING ? s->n_tokens - s->n_computed : s->n_tokens;
}

/* Sort key: the need, 0 for a candidate passed over too long. */
static int32_t key_of(const struct seq *s) {
    return s->n_passed_over >= PLAN_MAX_PASSED_OVER ? 0 : need_of(s);
}

/* Gathers the step's prefill candidates into out->cand, shortest first
 * (a stable insertion sort: ties keep running-then-waiting, oldest-first
 * order; there are at most max_seqs + PLAN_WAIT_WINDOW). */
static int32_t gather_candidates(struct planner *pl) {
    struct seq **c = pl->out->cand;
    int32_t n = 0;
    for (struct seq *s = pl->running->head; s; s = s->next)
        if (s->n_tokens - s->n_computed > 1) c[n++] = s;
    int32_t n_wait = 0;
    for (struct seq *s = pl->waiting->head; s && n_wait < PLAN_WAIT_WINDOW; s = s->next, n_wait++)
        c[n++] = s;
    for (int32_t i = 1; i < n; i++) {
        struct seq *x = c[i];
        int32_t k = key_of(x), j = i;
        while (j > 0 && key_of(c[j - 1]) > k) {
            c[j] = c[j - 1];
            j--;
        }
        c[j] = x;
    }
    return n;
}

/* Tokens candidate s gets of what is left of the allowance: all it needs if
 * that is at most a quarter more, else what is left; never over the budget. */
static int32_t take_of(const struct planner *pl, const struct seq *s, int32_t left) {
    int32_t need = need_of(s);
    int32_t take = need <= left + left / 4 ? need : left;
    return take < pl->budget ? take : pl->budget;
}

/* Prompt tokens beside n_decodes decodes under step_ratio r: the step of
 * f + d + p tokens (f its fixed cost) may cost r times the step in which all
 * n sequences present (running and waiting, at most max_seqs) decode, so
 * p = r (n + f) - f - d, at least PLAN_MIN_PREFILL, at most prefill_chunk;
 * prefill_chunk while more candidates than d need at most prefill_chunk. */
static int32_t ratio_allowance(const struct planner *pl, int32_t n_cand, int32_t n_decodes) {
    const struct plan_budget *b = pl->b;
    int64_t n = (int64_t)pl->running->n + pl->waiting->n;
    if (n > b->max_seqs) n = b->max_seqs;
    const int64_t f = b->fixed_tokens > 0 ? b->fixed_tokens : 0;
    int64_t p = b->step_ratio * (n + f) / 100 - f - n_decodes;
    if (p < PLAN_MIN_PREFILL) p = PLAN_MIN_PREFILL;
    int32_t n_finishable = 0;  // prompts a chunk would finish
    for (int32_t i = 0; i < n_cand; i++) n_finishable += need_of(pl->out->cand[i]) <= b->prefill_chunk;
    if (n_finishable > n_decodes) p = b->prefill_chunk;
    if (p > b->prefill_chunk) p = b->prefill_chunk;
    return (int32_t)p;
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

    // 1. decodes, oldest first.
    int32_t n_decodes = 0;
    struct seq *nxt;
    for (struct seq *s = running->head; s && pl.budget > 0; s = nxt) {
        if (s->n_tokens - s->n_computed != 1) {
            nxt = s->next;
            continue;
        }
        schedule_running(&pl, s, 1);
        n_decodes += s->status == SEQ_STATUS_RUNNING;
        // s may have been preempted (then it was the newest: nothing follows).
        nxt = s->status == SEQ_STATUS_RUNNING ? s->next : NULL;
    }
    // 2. prefill candidates, shortest first, within the allowance.
    int32_t n_cand = gather_candidates(&pl);
    int32_t left = pl.budget;
    if (b->prefill_chunk > 0 && n_cand > 0) {
        left = b->prefill_chunk > n_decodes ? b->prefill_chunk : n_decodes;
        if (b->step_ratio > 0) left = ratio_allowance(&pl, n_cand, n_decodes);
        if (n_decodes == 0 && need_of(out->cand[0]) > left) left = need_of(out->cand[0]);
        if (left > pl.budget) left = pl.budget;
    }
    bool is_lora_blocked = false, is_admitting = true;
    for (int32_t i = 0; i < n_cand; i++) {
        struct seq *s = out->cand[i];
        if (left <= 0 || pl.budget <= 0) {
            s->n_passed_over++;
            continue;
        }
        if (s->status == SEQ_STATUS_RUNNING) {
            schedule_running(&pl, s, take_of(&pl, s, left));
        } else if (s->status == SEQ_STATUS_WAITING || s->status == SEQ_STATUS_PREEMPTED) {
            // (a running candidate's preemption this step moved its victim to
            // the waiting head: that one is not a candidate of this step)
            if (is_admitting && out->n_preempted == 0 && running->n < b->max_seqs &&
                !(s->adapter && is_lora_blocked)) {
                enum admit_result r = admit(&pl, s, take_of(&pl, s, left));
                if (r == ADMIT_LATER_BLOCKS) is_admitting = false;
                if (r == ADMIT_LATER_LORA) {
                    is_lora_blocked = true;
                    out->n_lora_waits++;
                }
            }
        }
        // The allowance pays for the candidate's own tokens only: a decoder it
        // preempted gave its token back to the budget, not to the prompts.
        const int32_t took = last_planned(out, s);
        left -= took;
        s->n_passed_over = took == 0 ? s->n_passed_over + 1 : 0;
    }
}
