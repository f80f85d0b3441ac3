/*
 * ctx.h - struct engine_ctx: the compute context of one step thread. Private
 * to the engine (engine.c creates it, forward.c uses it).
 *
 * All activation scratch is allocated here once, for the largest batch the
 * ctx accepts; the forward pass allocates nothing.
 */
#ifndef LLMSERVE_CTX_H
#define LLMSERVE_CTX_H

#include <stdint.h>

#include "engine/model/adapter.h"
#include "engine/compute/attention.h"
#include "engine/engine.h"
#include "engine/kernels/kernels.h"
#include "engine/compute/kv.h"
#include "engine/compute/step_desc.h"

struct threadpool;

struct engine_ctx {
    const struct engine_model *model;  // borrowed; outlives the ctx
    struct engine_ctx_params params;
    struct threadpool *pool;           // owned, unless borrowed (params.pool_of)
    bool owns_pool;
    struct kern_scratch kscratch;      // owned: f16/bf16 conversion tiles
    struct kv_store kv;                // owned: the KV block pool (this rank's kv heads)
    struct comm *comm;                 // borrowed (params.comm): NULL or the job's ranks
    struct comm *tp_group;             // the allreduces' ranks, this stage's TP ranks: NULL at
                                       //   TP 1, comm at PP 1, else a split of comm (owned)
    struct step_desc desc;             // owned: the step descriptor's buffers (TP only)
    bool is_parallel;                  // a job of several ranks (TP or PP), the ctx created
                                       //   on every rank: rank 0 sends STOP when freed
    int64_t forward_ns;                // time in forward_run() so far
    int64_t n_steps;                   // forward_run() calls so far
    int64_t t_report_ns;               // rank 0: when it last asked the ranks for figures
    struct engine_rank_stats *ranks;   // [comm size] rank 0: the last reports (owned)

    // Activations for up to T = params.max_batch_tokens tokens (all owned); the widths
    // are this rank's (Q, KV, F of the shard, model/shard.h), the same as the model's at TP 1.
    float *x;         // [T][n_embd] residual stream
    float *xb;        // [T][n_embd] normed input of a sub-layer
    float *xb2;       // [T][n_embd] sub-layer output
    float *q;         // [T][n_head * head_dim]
    float *k;         // [T][n_head_kv * head_dim]
    float *v;         // [T][n_head_kv * head_dim]
    float *att;       // [T][n_head * head_dim]
    float *hb;        // [T][n_ff]
    float *hb2;       // [T][n_ff]
    float *rope_cos;  // [T][n_rot / 2]
    float *rope_sin;  // [T][n_rot / 2]
    struct attention_tile *att_tiles;   // [T] query tiles of the current batch
    const struct kern_attn *attn_kern;  // static table chosen at creation
    float *att_scratch;       // [n_threads][att_scratch_floats]
    size_t att_scratch_floats;
    float *xo;                // [max_outputs][n_embd] normed rows that want logits
    float *logits;            // [max_outputs][n_vocab] job rank 0 and the classifier stage's
                              //   TP rank 0 (others: one row, unused)
    float *logits_part;       // [max_outputs][vocab stride] the classifier's (last) stage at
                              //   TP > 1: the logits of this rank's vocabulary rows
                              //   (shard.h); else NULL
    float *logits_all;        // [TP][max_outputs][vocab stride] that stage's TP rank 0 at
                              //   TP > 1: every rank's logits_part, gathered; else NULL

    int64_t *sp_counts;       // [3][SP ranks] sequence parallelism: floats of each rank's
                              //   part of a shared collective: its K/V rows, its Q rows,
                              //   its attention partials (forward.c); else NULL
    // A KV pool divided over the SP ranks (params.kv_divided; else all NULL):
    float *att_m;             // [T][n_head] this rank's running max per query row
    float *att_l;             // [T][n_head] and sum of exponentials
    float *att_mx;            // [T][n_head] the max over the ranks
    float *att_comb;          // [2][T][n_head * (head_dim + 1)] the partials to sum (acc, l),
                              //   then this rank's rows of the sum

    // Adapters (engine/lora.h); all NULL/empty when params.max_adapters is 0.
    struct engine_adapter **adapters;  // [max_adapters] slots: an owned reference or NULL
    struct adapter_batch ab;           // this batch's adapter tokens and scratch (owned)
    int32_t *ab_count;                 // [max_adapters + 1] scratch of adapter_batch_build()
};

/* Runs the decoder over a validated batch (engine_forward checks the limits),
 * with the collectives of tensor parallelism when ctx->comm has several ranks. */
void forward_run(struct engine_ctx *ctx, const struct engine_batch *b, int32_t n_outputs);

#endif
