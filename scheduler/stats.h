/*
 * scheduler/stats.h - counters and latency histograms of the scheduler, for
 * /metrics and the batch tool.
 *
 * struct scheduler_stats is a plain value: the step thread updates its own
 * copy and publishes it once per step under a lock in scheduler.c (the
 * libuv user); readers get a consistent snapshot. Histogram buckets are
 * upper bounds in milliseconds (Prometheus), the same for every histogram.
 * Threads: pure value functions. [any thread]
 */
#ifndef SCHEDULER_STATS_H
#define SCHEDULER_STATS_H

#include <stdint.h>

#include "engine/engine.h"

#define STATS_N_BUCKETS 14
#define STATS_MAX_RANKS 16  // tensor-parallel ranks reported one by one

/* Upper bounds (ms) of the buckets; the last bucket is +Inf. */
extern const double stats_bucket_ms[STATS_N_BUCKETS - 1];

struct stats_histogram {
    int64_t counts[STATS_N_BUCKETS];  // per bucket (not cumulative)
    int64_t n;                        // observations
    double sum_ms;
};

struct scheduler_stats {
    int32_t n_running;
    int32_t n_waiting;
    int32_t n_blocks_total;
    int32_t n_blocks_used;
    int32_t n_blocks_free;            // free list: free + cached
    int32_t n_blocks_cached;          // cached blocks with no user (reusable)
    int64_t n_steps;
    int64_t n_requests;               // submitted
    int64_t n_finished;
    int64_t n_preemptions;
    int64_t n_prompt_tokens;          // prompt tokens of admitted requests (first admission)
    int64_t n_prefix_hit_tokens;      // of those, found in the prefix cache
    int64_t n_computed_tokens;        // tokens run through the engine (incl. recompute)
    int64_t n_generated_tokens;
    int64_t n_draft_tokens;           // speculative decoding: draft tokens verified
    int64_t n_draft_accepted;         // of those, accepted (the model gave the same token)
    int32_t n_draft_blocks_total;     // the draft model's KV pool (--draft-model), 0: none
    int32_t n_draft_blocks_used;      //    and the blocks of it sequences hold now
    int32_t n_lora_slots;             // adapter slots (max_loras)
    int32_t n_lora_resident;          // slots holding an adapter
    int64_t n_lora_loads;             // adapters put into a slot
    int64_t n_lora_evictions;         // of those, replacing a resident adapter (LRU, unused)
    int64_t n_lora_waits;             // admissions put off because every slot was in use
    struct stats_histogram ttft;          // submit -> first token
    struct stats_histogram inter_token;   // between tokens of a sequence
    struct stats_histogram latency;       // submit -> finish
    int32_t n_ranks;                      // tensor-parallel ranks (1: this process alone)
    struct engine_rank_stats ranks[STATS_MAX_RANKS];  // the first min(n_ranks, 16), rank 0
                                                      //   first (engine_ctx_rank_stats)
};

void stats_observe(struct stats_histogram *h, double ms);

#endif // SCHEDULER_STATS_H
