/*
 * attention.h - causal (optionally sliding-window) GQA attention over paged
 * KV, flash-style: for each query, walk the sequence's KV blocks, keeping a
 * running max, sum and output (online softmax), so no [tokens x context]
 * score matrix ever exists. Memory beyond the output is per-thread scratch of
 * O(block_size * heads_per_group + head_dim * heads_per_group).
 *
 * Work items are (token, kv head): the K/V of one kv head are read once for
 * all the query heads that share it (GQA). Items run in parallel on the pool.
 */
#ifndef LLMSERVE_ATTENTION_H
#define LLMSERVE_ATTENTION_H

#include <stddef.h>
#include <stdint.h>

#include "engine/engine.h"
#include "engine/kv.h"

struct threadpool;

struct attention_args {
    const struct kv_store *kv;
    int32_t layer;
    const struct engine_batch *batch;
    const float *q;       // [n_tokens][n_head][head_dim], RoPE applied
    float *out;           // [n_tokens][n_head][head_dim]
    int32_t n_head;
    int32_t window;       // 0: full causal attention; W: keys in (pos - W, pos]
    float scale;          // usually 1 / sqrt(head_dim)
    float *scratch;       // [n_threads][scratch_floats]
    size_t scratch_floats;  // per thread, from attention_scratch_floats()
};

/* Floats of per-thread scratch attention_run needs. */
size_t attention_scratch_floats(int32_t n_head, int32_t n_head_kv, int32_t head_dim,
                                int32_t block_size);

/* Computes out for every token of the batch. The K/V of every position each
 * token attends to must already be in kv (asserted through the block table:
 * a needed entry must not be the null block). */
void attention_run(struct threadpool *pool, const struct attention_args *a);

#endif
