/*
 * shard.h - one rank's slice of a model for tensor parallelism (TP): the
 * heads, kv heads and FFN columns this rank computes, and the cutting of the
 * bound weight tensors down to them, in place, as views into the file's
 * bytes in memory (nothing is copied; the loader then reads only the slices
 * from the file, and the panels packed afterwards read only those).
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
 * full ones, joined by one allreduce each per layer (forward.c). Norms are
 * not split. The classifier and the token embedding are split by
 * vocabulary, the same rows for both (they are one tensor when tied): TP
 * rank r of stage 0 holds rows [V * r / TP, V * (r + 1) / TP) of each, a
 * contiguous run of the file. It embeds the tokens of its rows (zeros for
 * the others; one allreduce sums the stage's rows into the whole
 * embedding) and computes the logits of its rows, which job rank 0
 * gathers. With TP = 1 nothing changes.
 *
 * Pipeline parallelism (PP): stage p of PP holds the contiguous layers
 * [n_layer * p / PP, n_layer * (p + 1) / PP) and packs only those (its KV
 * pool has only those layers too); stage 0 also holds the embedding and the
 * last stage the final norm's classifier, each split over its stage's TP
 * ranks as above (the same rows), so that no stage holds both: the
 * embedding is where the residual stream starts and the classifier where it
 * ends. The last stage sends the logits to job rank 0, which samples. The
 * job's ranks are stages times TP ranks, stage-major (job rank = stage * TP
 * + TP rank); under TP x PP each stage has TP ranks, and the allreduces run
 * among them alone.
 */
#ifndef LLMSERVE_SHARD_H
#define LLMSERVE_SHARD_H

#include <stdbool.h>
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
    int32_t stage;      // pipeline stage, 0 <= stage < n_stages
    int32_t n_stages;   // PP stages; 1: every layer here
    int32_t layer0;     // first layer of this stage
    int32_t n_layer;    // layers of this stage (all of them at PP 1)
    int32_t sp_rank;    // sequence parallelism: this rank's share of a step's tokens
    int32_t n_sp;       // SP ranks; 1: every token here (SP is never combined with TP, PP)
    int32_t vocab0;     // first vocabulary row of its embedding or classifier slice
    int32_t n_vocab;    // rows of that slice: all at TP 1; 0 on stages between the first
                        //   and the last, which hold neither
};

/* The job's rank of this slice, and the job's size (stages x TP ranks, or
 * SP ranks). */
static inline int32_t shard_job_rank(const struct shard *sh) {
    return sh->n_sp > 1 ? sh->sp_rank : sh->stage * sh->size + sh->rank;
}
static inline int32_t shard_job_size(const struct shard *sh) {
    return sh->n_sp > 1 ? sh->n_sp : sh->n_stages * sh->size;
}

/* Sequence parallelism: the first of a T-token step's tokens that SP rank r
 * computes (r = n_sp: T); rank r computes [first(r), first(r + 1)). */
static inline int32_t shard_sp_first(const struct shard *sh, int32_t T, int32_t r) {
    return (int32_t)((int64_t)T * r / sh->n_sp);
}

/* Whether this slice embeds tokens (its rows of the token embedding): the
 * ranks of stage 0. */
static inline bool shard_has_embedding(const struct shard *sh) { return sh->stage == 0; }

/* Whether this slice runs the final norm and its rows of the classifier: the
 * ranks of the last stage (stage 0 without pipeline stages). */
static inline bool shard_has_classifier(const struct shard *sh) {
    return sh->stage == sh->n_stages - 1;
}

/* Whether this rank gathers every row of the logits (and samples from them):
 * job rank 0. */
static inline bool shard_gets_logits(const struct shard *sh) { return shard_job_rank(sh) == 0; }

/* The most vocabulary rows any TP rank's slice has: the stride of the
 * gathered logits (forward.c). */
static inline int32_t shard_vocab_stride(const struct shard *sh, int32_t n_vocab) {
    return (int32_t)(((int64_t)n_vocab + sh->size - 1) / sh->size);
}

/* sh's stage/n_stages/layer0/n_layer for stage of n_stages over n_layer
 * layers. Returns 0, or ERR_UNSUPPORTED when a stage would have no layer
 * (the message names path and the numbers). */
int shard_plan_stage(const char *path, int32_t stage, int32_t n_stages, int32_t n_layer,
                     struct shard *sh);

/* sh's vocab0/n_vocab over n_vocab rows: rows [V * r / TP, V * (r + 1) / TP)
 * for TP rank r at the first and the last stage (stage and TP planned
 * first), none between. */
void shard_plan_vocab(int32_t n_vocab, struct shard *sh);

/* The first vocabulary row of TP rank r's slice (any rank may ask). */
static inline int32_t shard_vocab_first(const struct shard *sh, int32_t n_vocab, int32_t r) {
    return (int32_t)((int64_t)n_vocab * r / sh->size);
}

/* Cuts t (token_embd or output, the model's own tensor) to sh's vocabulary
 * rows, in place, as a view; nothing at TP 1. */
void shard_cut_vocab(const struct shard *sh, struct tensor *t);

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

/* Cuts l's tensors and biases to sh, in place, as views into the file's bytes
 * (checked by shard_check_layer first). Nothing is allocated. */
void shard_cut_layer(const struct shard *sh, int32_t head_dim, const struct shard_layer *l);

#endif
