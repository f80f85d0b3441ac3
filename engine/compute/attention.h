/*
 * attention.h - causal (optionally sliding-window) GQA attention over paged
 * KV, flash-style: for each tile of queries, walk the sequence's KV blocks,
 * keeping a running max, sum and output per query row (online softmax), so no
 * [tokens x context] score matrix ever exists. Memory beyond the output is
 * per-thread scratch of O(tile rows * (block_size + head_dim)).
 *
 * Work items are (query tile, kv head): a tile is up to ATTENTION_TILE
 * consecutive tokens of one sequence (prefill) or a single token (decode), and
 * the K/V tiles of one kv head are read once for all the query heads that
 * share it (GQA) and all the tile's tokens. Items run interleaved on the pool,
 * which balances causal prefill (later tokens see more keys).
 */
#ifndef LLMSERVE_ATTENTION_H
#define LLMSERVE_ATTENTION_H

#include <stddef.h>
#include <stdint.h>

#include "engine/engine.h"
#include "engine/kernels/attn.h"
#include "engine/compute/kv.h"

struct threadpool;

#define ATTENTION_TILE 16  // most query tokens per tile

struct attention_tile {
    int32_t t0;       // first token of the tile in the batch
    int32_t n;        // tokens: consecutive positions of one sequence
};

struct attention_args {
    const struct kv_store *kv;
    int32_t layer;
    const struct engine_batch *batch;
    const struct attention_tile *tiles;  // [n_tiles], from attention_tiles()
    int32_t n_tiles;
    const float *q;       // [n_tokens][n_head][head_dim], RoPE applied
    float *out;           // [n_tokens][n_head][head_dim]
    // A KV cache divided over ranks (kv->n_parts > 1): the keys of this rank's
    // blocks only, and out unnormalised (the running acc of the recurrence),
    // each row's m and l here, for the ranks to combine (forward.c). NULL: the
    // whole cache is here, out is the attention itself.
    float *part_m;        // [n_tokens][n_head], or NULL
    float *part_l;        // [n_tokens][n_head]
    int32_t n_head;
    int32_t window;       // 0: full causal attention; W: keys in (pos - W, pos]
    float scale;          // usually 1 / sqrt(head_dim)
    const struct kern_attn *kern;  // inner kernels of kv->type (kern_attn_select)
    float *scratch;       // [n_threads][scratch_floats]
    size_t scratch_floats;  // per thread, from attention_scratch_floats()
};

/* Floats of per-thread scratch attention_run needs. */
size_t attention_scratch_floats(int32_t n_head, int32_t n_head_kv, int32_t head_dim,
                                int32_t block_size);

/* Splits the batch into query tiles (at most n_tokens of them) into tiles;
 * returns how many. The split depends only on the batch, so it is done once per
 * forward pass and shared by every layer. */
int32_t attention_tiles(const struct engine_batch *b, struct attention_tile *tiles);

/* Computes out for every token of the batch. The K/V of every position each
 * token attends to must already be in kv (asserted through the block table:
 * a needed entry must not be the null block). With part_m, over the blocks
 * kv holds only (a row without keys here: m = -inf, l = 0, acc = 0), each
 * block its own step, so a row's bits still do not depend on the batch. */
void attention_run(struct threadpool *pool, const struct attention_args *a);

#endif
