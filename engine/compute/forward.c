/*
 * forward.c - the decoder forward pass over one batch: embedding to logits in
 * one straight function, one step per comment, shapes on every buffer. Speed
 * lives in the kernels it calls (kern_matmul, attention_run), not here.
 * Adapters (adapter.h) add their updates right after the projection they
 * change; tokens without one are untouched, a batch without any costs nothing.
 *
 * T is the number of tokens in the batch (tokens of many sequences, flattened);
 * E = n_embd, Q = n_head * head_dim, KV = n_head_kv * head_dim, F = n_ff.
 *
 * Tensor parallelism (model/shard.h): n_head, n_head_kv and n_ff are this
 * rank's share, the matrices its slices; the outputs of attn_output and
 * ffn_down are partial sums, joined by one allreduce each per layer, after
 * which every rank holds the same residual stream. The embedding and the
 * classifier are split by vocabulary rows: the embedding's rows are summed by
 * one more allreduce, the classifier's logits gathered on rank 0 (so 2 x
 * layers + 1 allreduces and one gather per step). At TP 1 the shares are the
 * whole model and the collectives no-ops.
 *
 * Pipeline parallelism: a stage runs only its layers (model/shard.h); stage 0
 * embeds the tokens, every later stage receives the residual stream [T][E]
 * from the one before, and the last runs the final norm and the classifier
 * and sends the logits [n_out][vocab] to job rank 0, which samples. The KV
 * pool of a stage holds its layers only, indexed from its first layer. A
 * step runs as micro-batches of consecutive tokens, so that stage s works on
 * one while stage s + 1 works on the one before; each stage takes them in
 * order, so a micro-batch attends to the KV the earlier ones wrote. Under
 * TP x PP each TP rank of a stage sends to the same TP rank of the next, the
 * allreduces run among a stage's TP ranks only (ctx->tp_group), and the last
 * stage's TP rank 0 gathers its stage's logits before sending them on.
 */
#include <math.h>
#include <string.h>

#include "engine/model/adapter.h"
#include "engine/compute/attention.h"
#include "engine/comm/comm.h"
#include "engine/base/alloc.h"
#include "engine/compute/ctx.h"
#include "engine/model/model.h"
#include "engine/compute/rope.h"
#include "engine/kernels/threadpool.h"

/* out[t] = x[t] / rms(x[t]) * w, for each of n rows of dim elements. */
static void rmsnorm_rows(float *out, const float *x, const float *w, int64_t n, int32_t dim,
                         float eps) {
    for (int64_t t = 0; t < n; t++) {
        const float *xt = x + t * dim;
        float *ot = out + t * dim;
        double ss = 0.0;
        for (int32_t i = 0; i < dim; i++) ss += (double)xt[i] * xt[i];
        const float inv = 1.0f / sqrtf((float)(ss / dim) + eps);
        for (int32_t i = 0; i < dim; i++) ot[i] = xt[i] * inv * w[i];
    }
}

static void add_rows(float *x, const float *y, int64_t n) {
    for (int64_t i = 0; i < n; i++) x[i] += y[i];
}

static void add_bias(float *y, const float *bias, int64_t n_rows, int32_t dim) {
    for (int64_t t = 0; t < n_rows; t++) {
        for (int32_t i = 0; i < dim; i++) y[t * dim + i] += bias[i];
    }
}

struct swiglu_job {
    float *hb;         // [T][F] gate in, result out
    const float *hb2;  // [T][F] up
    int64_t n_tokens;
    int64_t n_ff;
};

/* hb = silu(hb) * hb2, silu(z) = z * sigmoid(z), on columns [c0, c1) of every
 * token: the epilogue of the gate and up products (kern_matmul_group). The
 * kernel's exp is vectorised (a loop of expf was 7% of a 32-stream step) and
 * gives every element the same bits wherever it is (kernels.h). */
static void swiglu_cols(void *arg, int64_t c0, int64_t c1) {
    struct swiglu_job *j = arg;
    const kern_swiglu_fn swiglu = kern_get()->swiglu;
    for (int64_t t = 0; t < j->n_tokens; t++) {
        swiglu(j->hb + t * j->n_ff + c0, j->hb2 + t * j->n_ff + c0, c1 - c0);
    }
}

static void swiglu_slice(void *arg, int64_t c0, int64_t c1, int32_t ith, int32_t nth) {
    (void)ith;
    (void)nth;
    swiglu_cols(arg, c0, c1);
}

/* What follows the Q/K/V products in a layer, one item per (token, kv head):
 * with `finish`, the biases (qwen2), the per-head norm (qwen3) and RoPE on the
 * kv head's k and on the q heads of its group; with `write`, the kv head's k
 * and v into the token's block, in the KV type (a divided pool: only the
 * blocks this rank holds). All of it is local to a head, so it runs on every
 * thread (heads_slice): on the step thread alone, the K/V writes of a
 * 32-token step (strided K columns, fresh pages) were 7-9% of the samples of
 * a 32-stream run while the other threads waited. Each element sees the same
 * operations as in the serial loops this replaced, so the bits do not move. */
struct heads_job {
    const struct engine_model *m;
    const struct layer *L;
    const struct engine_batch *b;  // the tokens, in the order of q, k, v's rows
    float *q;                      // [T][Q]
    float *k;                      // [T][KV]
    float *v;                      // [T][KV]
    const float *rope_cos;         // [T][n_rot / 2]
    const float *rope_sin;
    const struct kv_store *kv;
    int32_t kl;                    // the layer in the KV pool
    int32_t n_head;                // this rank's
    int32_t n_head_kv;
    bool finish;
    bool write;
};

static void heads_slice(void *arg, int64_t i0, int64_t i1, int32_t ith, int32_t nth) {
    (void)ith;
    (void)nth;
    const struct heads_job *j = arg;
    const struct hparams *hp = &j->m->hp;
    const struct layer *L = j->L;
    const int32_t hd = hp->head_dim;
    const int32_t n_rep = j->n_head / j->n_head_kv;
    const int32_t n_q = j->n_head * hd;
    const int32_t n_kv = j->n_head_kv * hd;
    const int32_t n_pairs = hp->n_rot / 2;
    for (int64_t i = i0; i < i1; i++) {
        const int32_t t = (int32_t)(i / j->n_head_kv);
        const int32_t g = (int32_t)(i % j->n_head_kv);
        float *kt = j->k + (size_t)t * n_kv;  // the token's rows
        float *vt = j->v + (size_t)t * n_kv;
        if (j->finish) {
            const size_t qo = (size_t)g * n_rep * hd;  // the group's q heads
            float *qh = j->q + (size_t)t * n_q + qo;
            float *kh = kt + (size_t)g * hd;
            float *vh = vt + (size_t)g * hd;
            if (L->bq) add_bias(qh, L->bq + qo, 1, n_rep * hd);
            if (L->bk) add_bias(kh, L->bk + (size_t)g * hd, 1, hd);
            if (L->bv) add_bias(vh, L->bv + (size_t)g * hd, 1, hd);
            if (L->q_norm) {
                rmsnorm_rows(qh, qh, L->q_norm, n_rep, hd, hp->norm_eps);
                rmsnorm_rows(kh, kh, L->k_norm, 1, hd, hp->norm_eps);
            }
            const float *c = j->rope_cos + (size_t)t * n_pairs;
            const float *s = j->rope_sin + (size_t)t * n_pairs;
            rope_apply(qh, n_rep, hd, hp->n_rot, c, s, j->m->arch->rope);
            rope_apply(kh, 1, hd, hp->n_rot, c, s, j->m->arch->rope);
        }
        if (j->write) {
            const struct kv_store *kv = j->kv;
            const int32_t bs = kv->block_size;
            const int32_t pos = j->b->pos[t];
            const int32_t block = j->b->seqs[j->b->seq[t]].block_table[pos / bs];
            if (kv_holds(kv, block)) kv_write_heads(kv, j->kl, block, pos % bs, g, g + 1, kt, vt);
        }
    }
}

static void run_heads(struct threadpool *pool, const struct heads_job *j) {
    threadpool_run(pool, (int64_t)j->b->n_tokens * j->n_head_kv, 1, heads_slice, (void *)j);
}

/* Sequence parallelism: every SP rank's K and V rows of a layer, each computed
 * by its rank at its place in ctx->k and ctx->v ([T][KV] in the step's token
 * order), shared with all, then written into this rank's KV pool: every rank
 * keeps the whole KV cache, so each attends its own queries to all of it. */
static void sp_share_kv(struct engine_ctx *ctx, const struct engine_batch *full, int32_t kl) {
    comm_allgather_parts(ctx->comm, ctx->k, ctx->sp_counts);
    comm_allgather_parts(ctx->comm, ctx->v, ctx->sp_counts);
    const struct heads_job wj = {
        .m = ctx->model, .L = NULL, .b = full, .q = ctx->q, .k = ctx->k, .v = ctx->v,
        .kv = &ctx->kv, .kl = kl, .n_head = ctx->model->shard.n_head,
        .n_head_kv = ctx->model->shard.n_head_kv, .write = true,
    };
    run_heads(ctx->pool, &wj);
}

/* Attention over a KV pool divided over the SP ranks (kv.h): every rank
 * attends every query of the step to the blocks it holds (the online-softmax
 * recurrence, stopped before it divides), then the ranks combine their
 * partials, which is the recurrence's own merge of two runs of keys:
 *
 *   M = max_r m_r,  f_r = exp(m_r - M)  (0 where rank r saw no key),
 *   out = (sum_r f_r acc_r) / (sum_r f_r l_r)
 *
 * the max by one allreduce, the two sums, packed per token as
 * [n_head][head_dim] acc then [n_head] l, by one reduce-scatter that leaves
 * each rank the rows of its own tokens (a split step), or one allreduce when
 * every rank runs the whole step. A split step first gathers every rank's Q
 * rows (at their places in ctx->q). The result: this rank's tokens' attention
 * at ctx->att's first rows, for the output projection. */
static void attend_divided(struct engine_ctx *ctx, struct attention_args *att,
                           const struct engine_batch *full, int32_t t0, int32_t n_own,
                           bool is_sp) {
    const int32_t n_sp = ctx->model->shard.n_sp;
    const int32_t T = full->n_tokens;
    const int32_t n_head = att->n_head;
    const int32_t hd = ctx->kv.head_dim;
    const int64_t n_q = (int64_t)n_head * hd;
    const int64_t w = n_q + n_head;  // floats per token of the sums
    if (is_sp) comm_allgather_parts(ctx->comm, ctx->q, ctx->sp_counts + n_sp);
    attention_run(ctx->pool, att);  // [T][Q] unnormalised, [T][n_head] m and l

    const int64_t n_rows = (int64_t)T * n_head;
    memcpy(ctx->att_mx, ctx->att_m, (size_t)n_rows * sizeof(float));
    comm_allreduce_max(ctx->comm, ctx->att_mx, n_rows);
    float *comb = ctx->att_comb;  // [T][w]
    for (int64_t t = 0; t < T; t++) {
        for (int32_t h = 0; h < n_head; h++) {
            const int64_t row = t * n_head + h;
            const float m = ctx->att_m[row];
            const float f = m == -INFINITY ? 0.0f : expf(m - ctx->att_mx[row]);
            const float *acc = ctx->att + row * hd;
            float *c = comb + t * w + (int64_t)h * hd;
            for (int32_t d = 0; d < hd; d++) c[d] = acc[d] * f;
            comb[t * w + n_q + h] = ctx->att_l[row] * f;
        }
    }
    // This rank's tokens' sums                                           [n_own][w]
    float *own = comb + (int64_t)(is_sp ? T : t0) * w;
    if (is_sp) comm_reduce_scatter_parts(ctx->comm, comb, ctx->sp_counts + 2 * n_sp, own);
    else comm_allreduce_sum(ctx->comm, comb, (int64_t)T * w);
    for (int64_t t = 0; t < n_own; t++) {
        for (int32_t h = 0; h < n_head; h++) {
            const float inv = 1.0f / own[t * w + n_q + h];
            const float *c = own + t * w + (int64_t)h * hd;
            float *o = ctx->att + (t * n_head + h) * hd;
            for (int32_t d = 0; d < hd; d++) o[d] = c[d] * inv;
        }
    }
}

/* The decoder layers of this stage over batch b (a whole batch, one
 * micro-batch of it, or an SP rank's share: tokens [t0, t0 + T) of full),
 * on its residual stream x [T][E] in place; ctx's scratch from its first
 * row (K and V: at row t0 under SP, for sp_share_kv). */
static void run_layers(struct engine_ctx *ctx, const struct engine_batch *full,
                       const struct engine_batch *b, int32_t t0, bool is_sp, float *x) {
    const struct engine_model *m = ctx->model;
    const struct hparams *hp = &m->hp;
    const int32_t T = b->n_tokens;
    const int32_t n_embd = hp->n_embd;
    const int32_t n_head = m->shard.n_head;        // this rank's (all at TP 1)
    const int32_t n_head_kv = m->shard.n_head_kv;
    const int32_t head_dim = hp->head_dim;
    const int32_t n_q = n_head * head_dim;
    const int32_t n_kv = n_head_kv * head_dim;
    const int32_t n_ff = m->shard.n_ff;
    const int32_t n_pairs = hp->n_rot / 2;
    struct threadpool *pool = ctx->pool;
    struct kern_scratch *ks = &ctx->kscratch;
    const struct shard *sh = &m->shard;
    struct comm *tp = ctx->tp_group;  // the allreduces' ranks: this stage's TP ranks
    const int64_t n_x = (int64_t)T * n_embd;
    float *k = ctx->k + (is_sp ? (size_t)t0 * n_head_kv * head_dim : 0);  // [T][KV]
    float *v = ctx->v + (is_sp ? (size_t)t0 * n_head_kv * head_dim : 0);
    // A divided KV pool (attend_divided): Q at its place too, every query attends
    const bool is_divided = ctx->kv.n_parts > 1;
    float *q = ctx->q + (is_sp && is_divided ? (size_t)t0 * n_q : 0);      // [T][Q]
    const struct engine_batch *att_batch = is_divided ? full : b;  // whose queries attend

    // RoPE angles per token, shared by every layer                       [T][n_rot/2]
    for (int32_t t = 0; t < T; t++) {
        float *c = ctx->rope_cos + (size_t)t * n_pairs;
        float *s = ctx->rope_sin + (size_t)t * n_pairs;
        rope_cache(m->rope_inv_freq, n_pairs, b->pos[t], c, s);
        if (hp->rope_mscale != 1.0f) {  // YaRN scales q and k, so the scores by mscale^2
            for (int32_t i = 0; i < n_pairs; i++) {
                c[i] *= hp->rope_mscale;
                s[i] *= hp->rope_mscale;
            }
        }
    }

    // The tokens that carry an adapter, sorted by adapter into chunks (none: no-op applies)
    struct adapter_batch *ab = &ctx->ab;
    adapter_batch_build(ab, b->adapter, T, (const struct engine_adapter *const *)ctx->adapters,
                        ctx->params.max_adapters, ctx->ab_count);

    // Query tiles for attention, shared by every layer
    const int32_t n_tiles = attention_tiles(att_batch, ctx->att_tiles);

    struct attention_args att = {
        .kv = &ctx->kv,
        .batch = att_batch,
        .tiles = ctx->att_tiles,
        .n_tiles = n_tiles,
        .kern = ctx->attn_kern,
        .q = ctx->q,
        .out = ctx->att,
        .n_head = n_head,
        .window = hp->sliding_window,
        .scale = 1.0f / sqrtf((float)head_dim),
        .scratch = ctx->att_scratch,
        .scratch_floats = ctx->att_scratch_floats,
        .part_m = ctx->att_m,  // NULL unless the pool is divided (attend_divided)
        .part_l = ctx->att_l,
    };

    for (int32_t il = sh->layer0; il < sh->layer0 + sh->n_layer; il++) {
        const struct layer *L = &m->layers[il];
        const int32_t kl = il - sh->layer0;  // the layer in this stage's KV pool

        // Attention norm                                                  [T][E]
        rmsnorm_rows(ctx->xb, x, L->attn_norm, T, n_embd, hp->norm_eps);

        // Q, K, V projections (+ bias for qwen2)                  [T][Q], [T][KV]
        const struct kern_product qkv_p[3] = {{L->wq, q}, {L->wk, k}, {L->wv, v}};
        kern_matmul_group(pool, ks, ctx->xb, T, qkv_p, 3, NULL, NULL);
        const struct adapter_target qkv[3] = {{ADAPTER_PROJ_Q, q, n_q},
                                              {ADAPTER_PROJ_K, k, n_kv},
                                              {ADAPTER_PROJ_V, v, n_kv}};
        adapter_apply_lora(pool, ab, il, ctx->xb, n_embd, qkv, 3);       // + B (s A xb)

        // Per (token, kv head): + bias (qwen2), per-head RMSNorm of q and k
        // (qwen3), RoPE at the token's position, and (SP: after every rank's
        // rows are shared) K/V into the sequences' blocks; then attend through
        // the block tables
        const struct heads_job hj = {
            .m = m, .L = L, .b = b, .q = q, .k = k, .v = v, .rope_cos = ctx->rope_cos,
            .rope_sin = ctx->rope_sin, .kv = &ctx->kv, .kl = kl, .n_head = n_head,
            .n_head_kv = n_head_kv, .finish = true, .write = !is_sp,
        };
        run_heads(pool, &hj);
        if (is_sp) sp_share_kv(ctx, full, kl);
        att.layer = kl;
        if (is_divided) attend_divided(ctx, &att, full, t0, T, is_sp);   // [T][Q]
        else attention_run(pool, &att);                                  // [T][Q]

        // Output projection (+ LoRA), summed over the ranks, bottleneck adapter,
        // residual                                                       [T][E]
        kern_matmul(pool, ks, L->wo, ctx->att, T, ctx->xb2);
        const struct adapter_target o[1] = {{ADAPTER_PROJ_O, ctx->xb2, n_embd}};
        adapter_apply_lora(pool, ab, il, ctx->att, n_q, o, 1);
        comm_allreduce_sum(tp, ctx->xb2, n_x);
        adapter_apply_bottleneck(pool, ab, il, ADAPTER_POS_ATTN, ctx->xb2, n_embd);
        add_rows(x, ctx->xb2, (int64_t)T * n_embd);

        // FFN norm                                                        [T][E]
        rmsnorm_rows(ctx->xb, x, L->ffn_norm, T, n_embd, hp->norm_eps);

        // Gate and up projections (+ LoRA), then SwiGLU: hb = silu(gate) * up,
        // on each thread's columns as soon as both are done (after LoRA's
        // updates when the batch has adapters)                           [T][F]
        const struct kern_product gu_p[2] = {{L->ffn_gate, ctx->hb}, {L->ffn_up, ctx->hb2}};
        struct swiglu_job sj = {.hb = ctx->hb, .hb2 = ctx->hb2, .n_tokens = T, .n_ff = n_ff};
        if (ab->n_tokens == 0) {
            kern_matmul_group(pool, ks, ctx->xb, T, gu_p, 2, swiglu_cols, &sj);
        } else {
            kern_matmul_group(pool, ks, ctx->xb, T, gu_p, 2, NULL, NULL);
            const struct adapter_target gu[2] = {{ADAPTER_PROJ_GATE, ctx->hb, n_ff},
                                                 {ADAPTER_PROJ_UP, ctx->hb2, n_ff}};
            adapter_apply_lora(pool, ab, il, ctx->xb, n_embd, gu, 2);
            threadpool_run(pool, n_ff, KERN_PANEL_ROWS, swiglu_slice, &sj);
        }

        // Down projection (+ LoRA), summed over the ranks, bottleneck adapter,
        // residual                                                       [T][E]
        kern_matmul(pool, ks, L->ffn_down, ctx->hb, T, ctx->xb2);
        const struct adapter_target down[1] = {{ADAPTER_PROJ_DOWN, ctx->xb2, n_embd}};
        adapter_apply_lora(pool, ab, il, ctx->hb, n_ff, down, 1);
        comm_allreduce_sum(tp, ctx->xb2, n_x);
        adapter_apply_bottleneck(pool, ab, il, ADAPTER_POS_FFN, ctx->xb2, n_embd);
        add_rows(x, ctx->xb2, (int64_t)T * n_embd);
    }
}

/* Token embeddings of b's tokens into x [T][E] (stage 0). Under TP each rank
 * holds its vocabulary rows only: it writes the tokens of those, zeros for
 * the rest, and the allreduce adds the stage's rows up (exactly: one term of
 * each sum is not zero). */
static void embed(struct engine_ctx *ctx, const struct engine_batch *b, float *x) {
    const struct engine_model *m = ctx->model;
    const struct shard *sh = &m->shard;
    const int32_t n_embd = m->hp.n_embd;
    for (int32_t t = 0; t < b->n_tokens; t++) {
        float *xt = x + (size_t)t * n_embd;
        const int32_t row = b->token[t] - sh->vocab0;
        if (row >= 0 && row < sh->n_vocab) tensor_row_to_f32(m->tok_embd, row, xt);
        else memset(xt, 0, (size_t)n_embd * sizeof(float));
    }
    comm_allreduce_sum(ctx->tp_group, x, (int64_t)b->n_tokens * n_embd);
}

/* Micro-batches of a T-token step: 1 without pipeline stages; with them, up
 * to 2 per stage of at least FORWARD_MICRO_TOKENS tokens each, so that stage
 * s works on one while stage s + 1 works on the one before. */
#define FORWARD_MICRO_TOKENS 16
static int32_t n_micro_batches(const struct shard *sh, int32_t T) {
    if (sh->n_stages == 1) return 1;
    int32_t n = T / FORWARD_MICRO_TOKENS;
    if (n > 2 * sh->n_stages) n = 2 * sh->n_stages;
    return n < 1 ? 1 : n;
}

/* Sequence parallelism splits a step of at least this many tokens per rank. */
#define FORWARD_SP_TOKENS 16

/* The first token of micro-batch k of n over tokens [s0, s1) (k = n: s1). */
static int32_t micro_first(int32_t s0, int32_t s1, int32_t k, int32_t n) {
    return s0 + (int32_t)((int64_t)(s1 - s0) * k / n);
}

/* Tokens [t0, t1) of b, a batch of their own over the same sequences. */
static struct engine_batch sub_batch(const struct engine_batch *b, int32_t t0, int32_t t1) {
    struct engine_batch mb = *b;
    mb.n_tokens = t1 - t0;
    mb.token = b->token + t0;
    mb.pos = b->pos + t0;
    mb.seq = b->seq + t0;
    mb.output = b->output + t0;
    if (b->adapter) mb.adapter = b->adapter + t0;
    return mb;
}

void forward_run(struct engine_ctx *ctx, const struct engine_batch *b, int32_t n_outputs) {
    const struct engine_model *m = ctx->model;
    const struct hparams *hp = &m->hp;
    const int32_t T = b->n_tokens;
    const int32_t n_embd = hp->n_embd;
    struct threadpool *pool = ctx->pool;
    struct kern_scratch *ks = &ctx->kscratch;
    const struct shard *sh = &m->shard;
    struct comm *tp = ctx->tp_group;  // the allreduces' ranks: this stage's TP ranks

    // The step in micro-batches of consecutive tokens (one, unless pipelined): each
    // comes from the stage before (stage 0 embeds it), runs this stage's layers and
    // goes on to the next stage (same TP rank); the last stage keeps them all for the
    // classifier.                                                             [T][E]
    // Sequence parallelism instead: this rank's share of the tokens, [s0, s1), one
    // batch, its residual stream from x's first row; the K/V of each layer's tokens
    // shared by all (sp_share_kv).
    // A step too small to be worth it (a decode) runs whole on every SP rank instead,
    // with no collective at all: the same kernels give every rank the same KV.
    const bool is_sp = sh->n_sp > 1 && T >= sh->n_sp * FORWARD_SP_TOKENS;
    int32_t s0 = 0, s1 = T;
    if (is_sp) {
        s0 = shard_sp_first(sh, T, sh->sp_rank);
        s1 = shard_sp_first(sh, T, sh->sp_rank + 1);
        const int64_t n_kv = (int64_t)sh->n_head_kv * hp->head_dim;
        const int64_t n_q = (int64_t)sh->n_head * hp->head_dim;
        for (int32_t r = 0; r < sh->n_sp; r++) {
            const int64_t n_r = shard_sp_first(sh, T, r + 1) - shard_sp_first(sh, T, r);
            ctx->sp_counts[r] = n_r * n_kv;                                // K or V rows
            ctx->sp_counts[sh->n_sp + r] = n_r * n_q;                      // Q rows
            ctx->sp_counts[2 * sh->n_sp + r] = n_r * (n_q + sh->n_head);   // acc and l
        }
    }
    const int32_t n_mb = n_micro_batches(sh, T);
    const int32_t me = shard_job_rank(sh);
    for (int32_t k = 0; k < n_mb; k++) {
        const int32_t t0 = micro_first(s0, s1, k, n_mb);
        const int32_t t1 = micro_first(s0, s1, k + 1, n_mb);
        const struct engine_batch mb = sub_batch(b, t0, t1);
        float *x = ctx->x + (size_t)(t0 - s0) * n_embd;
        const int64_t n_x = (int64_t)(t1 - t0) * n_embd;
        if (sh->stage > 0) comm_recv(ctx->comm, me - sh->size, x, n_x);
        else embed(ctx, &mb, x);
        run_layers(ctx, b, &mb, t0, is_sp, x);
        if (!shard_has_classifier(sh)) comm_send(ctx->comm, me + sh->size, x, n_x);
    }

    // Pipelined, stage 0 (rank 0 among its ranks) takes the logits from the last
    // stage's TP rank 0                                              [n_out][vocab]
    if (!shard_has_classifier(sh)) {
        if (shard_gets_logits(sh) && n_outputs > 0) {
            comm_recv(ctx->comm, (sh->n_stages - 1) * sh->size, ctx->logits,
                      (int64_t)n_outputs * hp->n_vocab);
        }
        return;
    }

    // Final norm of the rows that want logits, then the classifier (the last stage)
    //                                                                [n_out][vocab]
    if (sh->n_sp > 1 && !is_sp && !shard_gets_logits(sh)) return;  // replicated: rank 0's
    int32_t n_out = 0;
    for (int32_t t = s0; t < s1; t++) {
        if (!b->output[t]) continue;
        rmsnorm_rows(ctx->xo + (size_t)n_out * n_embd, ctx->x + (size_t)(t - s0) * n_embd,
                     m->output_norm, 1, n_embd, hp->norm_eps);
        n_out++;
    }
    if (is_sp) {
        // SP: this rank's rows of the logits at their place in the step's outputs, then
        // every rank's rows gathered on rank 0                            [n_out][vocab]
        const int64_t n_vocab = hp->n_vocab;
        int32_t before = 0;  // outputs of the ranks before this one
        for (int32_t r = 0; r < sh->n_sp; r++) {
            const int32_t r0 = shard_sp_first(sh, T, r), r1 = shard_sp_first(sh, T, r + 1);
            int32_t n_r = 0;
            for (int32_t t = r0; t < r1; t++) n_r += b->output[t] != 0;
            if (r < sh->sp_rank) before += n_r;
            ctx->sp_counts[r] = n_r * n_vocab;
        }
        if (n_out > 0) {
            kern_matmul(pool, ks, m->output, ctx->xo, n_out,
                        ctx->logits + (size_t)before * n_vocab);
        }
        comm_gather_parts(ctx->comm, ctx->logits, ctx->sp_counts);
        return;
    }
    ASSERT(n_out == n_outputs);
    if (n_out == 0) return;
    if (sh->size == 1) {
        kern_matmul(pool, ks, m->output, ctx->xo, n_out, ctx->logits);
        // pipelined: on to job rank 0, which samples
        if (!shard_gets_logits(sh)) {
            comm_send(ctx->comm, 0, ctx->logits, (int64_t)n_out * hp->n_vocab);
        }
        return;
    }
    // TP: this rank's vocabulary rows                                 [n_out][its rows]
    // then every rank's part of the stage gathered on its TP rank 0, at one stride,
    // and put in place                                                 [n_out][vocab]
    // (pipelined: then sent on to job rank 0)
    const int32_t n_vocab = hp->n_vocab;
    const int32_t stride = shard_vocab_stride(sh, n_vocab);
    kern_matmul(pool, ks, m->output, ctx->xo, n_out, ctx->logits_part);
    comm_gather(tp, ctx->logits_part, (size_t)n_out * stride * sizeof(float), ctx->logits_all);
    if (sh->rank != 0) return;
    for (int32_t r = 0; r < sh->size; r++) {
        const int32_t v0 = shard_vocab_first(sh, n_vocab, r);
        const int32_t nv = shard_vocab_first(sh, n_vocab, r + 1) - v0;
        const float *part = ctx->logits_all + (size_t)r * n_out * stride;  // [n_out][nv]
        for (int32_t o = 0; o < n_out; o++) {
            memcpy(ctx->logits + (size_t)o * n_vocab + v0, part + (size_t)o * nv,
                   (size_t)nv * sizeof(float));
        }
    }
    if (!shard_gets_logits(sh)) comm_send(ctx->comm, 0, ctx->logits, (int64_t)n_out * n_vocab);
}
