/*
 * shard.h - one rank's slice of a model for tensor parallelism (TP): the
 * heads, kv heads and FFN columns this rank computes, and the cutting of the
 * bound weight tensors down to them, in place, as views into the mapped file
 * (nothing is copied: the panels packed afterwards read only the slices).
 *
 * With TP ranks, rank r owns kv heads [r, r + 1) * n_head_kv / TP, the query
 * heads that share them (n_head / TP: the GQA groups stay whole), and a
 * contiguous range of FFN columns split on the block boundaries of
 * ffn_down's type. The Megatron-LM split (Shoeybi et al. 2019):
 *
 *   attn_q, attn_k, attn_v, ffn_gate, ffn_up   "column parallel": the rows of
 *        (+ the q/k/v biases)              this rank's heads or FFN columns,
 *                                          a contiguous run of the file
 *   attn_output, ffn_down                  "row parallel": the matching slice
 *                                          of every row (its input side), a
 *                                          strided view: row_bytes stays the
 *                                          file's row stride (tensor.h)
 *
 * so each rank's attention output and FFN output are partial sums of the
 * full ones, joined by one allreduce each per layer (forward.c). Norms, the
 * embedding and the classifier are not split; the classifier runs on rank 0
 * only, the others never pack it. With TP = 1 nothing changes.
 */
#ifndef LLMSERVE_SHARD_H
#define LLMSERVE_SHARD_H

#include <stdint.h>

#include "engine/format/tensor.h"

struct shard {
    int32_t rank;       // 0 <= rank < size
    int32_t size;       // TP ranks; 1: the whole model
    int32_t n_head;     // query heads of this rank
    int32_t n_head_kv;  // kv heads of this rank
    int32_t head0;      // first query head
    int32_t head_kv0;   // first kv head
    int32_t n_ff;       // FFN columns of this rank
    int32_t ff0;        // first FFN column
};

/* One layer's matrices (the model's own, writable tensors) and biases, as
 * shard_cut_layer() cuts them; a bias pointer may point to NULL (none). */
struct shard_layer {
    struct tensor *wq, *wk, *wv, *wo, *ffn_gate, *ffn_up, *ffn_down;
    const float **bq, **bk, **bv;
};

/* *out: rank's slice of a model of n_head query heads, n_head_kv kv heads
 * and n_ff FFN columns whose ffn_down is of type ff_type (the columns are
 * split on its blocks). Returns 0, or ERR_UNSUPPORTED when the model cannot
 * be split over size ranks (kv heads not a multiple of size, a rank left no
 * FFN block; the message names path and the numbers). */
int shard_plan(const char *path, int32_t rank, int32_t size, int32_t n_head, int32_t n_head_kv,
               int32_t n_ff, enum quant_type ff_type, struct shard *out);

/* Whether l's row-parallel matrices (attn_output, ffn_down) can be cut at
 * sh's columns: 0, or ERR_UNSUPPORTED for a slice off a block boundary of a
 * quantized type (the message names the tensor). */
int shard_check_layer(const char *path, const struct shard *sh, int32_t head_dim,
                      const struct shard_layer *l);

/* Cuts l's tensors and biases to sh, in place, as views into the mapped file
 * (checked by shard_check_layer first). Nothing is allocated. */
void shard_cut_layer(const struct shard *sh, int32_t head_dim, const struct shard_layer *l);

#endif
