/*
 * engine.c - the thin facade of engine.h: context creation (scratch, KV pool,
 * worker pool), engine_forward's checks around forward_run(), and the ctx's
 * adapter slots (declared in engine/model/lora.h).
 */
#define LOG_TAG "engine"
#include "engine/engine.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "engine/base/alloc.h"
#include "engine/base/clock.h"
#include "engine/base/err.h"
#include "engine/base/log.h"
#include "engine/compute/adapter_share.h"
#include "engine/compute/ctx.h"
#include "engine/model/model.h"
#include "engine/compute/attention.h"
#include "engine/kernels/kernels.h"
#include "engine/kernels/threadpool.h"

struct engine_ctx_params engine_ctx_default_params(void) {
    return (struct engine_ctx_params){
        .n_threads = 0,
        .max_batch_tokens = 512,
        .max_seqs = 64,
        .max_outputs = 0,
        .block_size = 16,
        .max_adapters = 0,
        .n_blocks = 1024,
        .kv_type = ENGINE_KV_TYPE_F32,
    };
}

size_t engine_kv_block_bytes(const struct engine_model *m, int32_t block_size,
                             enum engine_kv_type kv_type) {
    const struct hparams *hp = &m->hp;
    return kv_block_bytes(kv_type, m->shard.n_layer, m->shard.n_head_kv, hp->head_dim, block_size);
}

void engine_ctx_free(struct engine_ctx *ctx) {
    if (!ctx) return;
    if (ctx->is_parallel && comm_rank(ctx->comm) == 0) step_desc_send_stop(ctx->comm);
    if (ctx->tp_group != ctx->comm) comm_close(ctx->tp_group);  // a split: ours
    step_desc_deinit(&ctx->desc);
    free(ctx->ranks);
    if (ctx->owns_pool) threadpool_free(ctx->pool);
    kern_scratch_free(&ctx->kscratch);
    kv_free(&ctx->kv);
    free(ctx->x);
    free(ctx->xb);
    free(ctx->xb2);
    free(ctx->q);
    free(ctx->k);
    free(ctx->v);
    free(ctx->att);
    free(ctx->hb);
    free(ctx->hb2);
    free(ctx->rope_cos);
    free(ctx->rope_sin);
    free(ctx->att_scratch);
    free(ctx->att_tiles);
    free(ctx->xo);
    free(ctx->logits);
    free(ctx->logits_part);
    free(ctx->sp_counts);
    free(ctx->att_m);
    free(ctx->att_l);
    free(ctx->att_mx);
    free(ctx->att_comb);
    free(ctx->logits_all);
    for (int32_t i = 0; ctx->adapters && i < ctx->params.max_adapters; i++) {
        engine_adapter_release(ctx->adapters[i]);
    }
    free(ctx->adapters);
    adapter_batch_deinit(&ctx->ab);
    free(ctx->ab_count);
    free(ctx);
}

static float *alloc_floats(size_t rows, size_t cols, int *err) {
    float *p = malloc((rows ? rows : 1) * (cols ? cols : 1) * sizeof(float));
    if (!p) *err = ERR_NOMEM;
    return p;
}

/* Tensor parallelism: every rank takes rank 0's limits (n_threads stays its own). */
static void share_params(struct engine_ctx_params *p) {
    int32_t v[8] = {p->max_batch_tokens, p->max_seqs, p->max_outputs, p->block_size,
                    p->n_blocks, p->max_adapters, (int32_t)p->kv_type, p->kv_divided};
    comm_bcast(p->comm, v, sizeof(v));
    p->max_batch_tokens = v[0];
    p->max_seqs = v[1];
    p->max_outputs = v[2];
    p->block_size = v[3];
    p->n_blocks = v[4];
    p->max_adapters = v[5];
    p->kv_type = (enum engine_kv_type)v[6];
    p->kv_divided = v[7] != 0;
}

/* Fills in the defaults of prm and checks it against the model. */
static int check_params(const struct engine_model *m, struct engine_ctx_params *prm) {
    if (prm->n_threads <= 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        prm->n_threads = n > 0 ? (int32_t)n : 1;
    }
    if (prm->max_outputs <= 0) prm->max_outputs = prm->max_seqs;
    if (prm->max_batch_tokens < 1 || prm->max_batch_tokens > (1 << 20) || prm->max_seqs < 1 ||
        prm->max_outputs < 1 || prm->max_outputs > prm->max_batch_tokens ||
        prm->block_size < 1 || prm->block_size > 4096 || prm->n_blocks < 2 ||
        prm->n_threads > 1024 || prm->max_adapters < 0 || (prm->pool_of && prm->comm) ||
        prm->max_adapters > ENGINE_MAX_ADAPTERS || prm->kv_type < 0 ||
        prm->kv_type >= ENGINE_KV_TYPE_COUNT) {
        LOG_ERROR("%s: invalid context parameters (max_batch_tokens=%d max_seqs=%d "
                  "max_outputs=%d block_size=%d n_blocks=%d threads=%d kv_type=%d "
                  "max_adapters=%d)", __func__, prm->max_batch_tokens, prm->max_seqs,
                  prm->max_outputs, prm->block_size, prm->n_blocks, prm->n_threads,
                  (int)prm->kv_type, prm->max_adapters);
        return ERR_INVAL;
    }
    const int32_t job_size = shard_job_size(&m->shard);
    if (comm_size(prm->comm) != job_size || comm_rank(prm->comm) != shard_job_rank(&m->shard)) {
        LOG_ERROR("%s: the model was loaded as rank %d of %d (tensor-parallel rank %d of %d, "
                  "stage %d of %d), the comm is rank %d of %d", __func__,
                  shard_job_rank(&m->shard), job_size, m->shard.rank, m->shard.size,
                  m->shard.stage, m->shard.n_stages, comm_rank(prm->comm),
                  comm_size(prm->comm));
        return ERR_INVAL;
    }
    if (prm->kv_divided && (m->shard.n_sp < 2 || prm->n_blocks % m->shard.n_sp != 0)) {
        LOG_ERROR("%s: a KV pool divided over the ranks needs sequence parallelism (SP %d) and "
                  "a block count that is a multiple of it (%d blocks)", __func__,
                  m->shard.n_sp, prm->n_blocks);
        return ERR_INVAL;
    }
    if (prm->max_seqs > prm->max_batch_tokens) prm->max_seqs = prm->max_batch_tokens;
    if (prm->max_outputs > prm->max_batch_tokens) prm->max_outputs = prm->max_batch_tokens;
    return 0;
}

/* Allocates everything for checked params; on failure *out holds what was built. */
static int ctx_alloc(const struct engine_model *m, const struct engine_ctx_params *prm,
                     struct engine_ctx **out) {
    struct engine_ctx *ctx = calloc(1, sizeof(*ctx));
    *out = ctx;
    if (!ctx) return ERR_NOMEM;
    ctx->model = m;
    ctx->params = *prm;
    ctx->comm = prm->comm;
    const struct hparams *hp = &m->hp;
    const struct shard *sh = &m->shard;
    const size_t T = (size_t)prm->max_batch_tokens;
    const size_t n_q = (size_t)sh->n_head * hp->head_dim;
    const size_t n_kv = (size_t)sh->n_head_kv * hp->head_dim;
    const size_t n_ff = (size_t)sh->n_ff;
    int err = 0;

    ctx->owns_pool = !prm->pool_of;
    ctx->pool = prm->pool_of ? prm->pool_of->pool : threadpool_create(prm->n_threads);
    if (!ctx->pool) return ERR_NOMEM;
    ctx->params.n_threads = threadpool_n_threads(ctx->pool);
    int64_t max_k = hp->n_embd;
    if ((int64_t)n_ff > max_k) max_k = (int64_t)n_ff;
    if ((int64_t)n_q > max_k) max_k = (int64_t)n_q;
    err = kern_scratch_init(&ctx->kscratch, ctx->params.n_threads, max_k);
    if (err) return err;
    err = kv_init_part(&ctx->kv, prm->kv_type, sh->n_layer, prm->n_blocks, prm->block_size,
                       sh->n_head_kv, hp->head_dim, prm->kv_divided ? sh->n_sp : 1,
                       prm->kv_divided ? sh->sp_rank : 0);
    if (err) return err;
    if (shard_job_size(sh) > 1) {
        err = step_desc_init(&ctx->desc, prm->max_batch_tokens, prm->max_seqs);
        if (err) return err;
        ctx->ranks = calloc((size_t)shard_job_size(sh), sizeof(*ctx->ranks));
        if (!ctx->ranks) return ERR_NOMEM;
    }

    ctx->x = alloc_floats(T, (size_t)hp->n_embd, &err);
    ctx->xb = alloc_floats(T, (size_t)hp->n_embd, &err);
    ctx->xb2 = alloc_floats(T, (size_t)hp->n_embd, &err);
    ctx->q = alloc_floats(T, n_q, &err);
    ctx->k = alloc_floats(T, n_kv, &err);
    ctx->v = alloc_floats(T, n_kv, &err);
    ctx->att = alloc_floats(T, n_q, &err);
    ctx->hb = alloc_floats(T, n_ff, &err);
    ctx->hb2 = alloc_floats(T, n_ff, &err);
    ctx->rope_cos = alloc_floats(T, (size_t)hp->n_rot / 2, &err);
    ctx->rope_sin = alloc_floats(T, (size_t)hp->n_rot / 2, &err);
    ctx->att_scratch_floats =
        attention_scratch_floats(sh->n_head, sh->n_head_kv, hp->head_dim, prm->block_size);
    ctx->att_scratch = alloc_floats((size_t)ctx->params.n_threads, ctx->att_scratch_floats, &err);
    ctx->xo = alloc_floats((size_t)prm->max_outputs, (size_t)hp->n_embd, &err);
    // Job rank 0 gets every row of the logits; under TP each rank of the classifier's
    // stage computes its vocabulary rows' part, which the stage's TP rank 0 gathers
    // (and, pipelined, sends on to rank 0; model/shard.h).
    // Under SP every rank computes the logits of its tokens' rows in place.
    const bool is_assembler = shard_has_classifier(sh) && sh->rank == 0;
    const bool has_logits = shard_gets_logits(sh) || is_assembler || sh->n_sp > 1;
    ctx->logits = alloc_floats(has_logits ? (size_t)prm->max_outputs : 1, (size_t)hp->n_vocab,
                               &err);
    if (sh->n_sp > 1) {
        ctx->sp_counts = calloc(3 * (size_t)sh->n_sp, sizeof(*ctx->sp_counts));
        if (!ctx->sp_counts) err = ERR_NOMEM;
    }
    if (prm->kv_divided) {
        const size_t n_rows = (size_t)sh->n_head;
        ctx->att_m = alloc_floats(T, n_rows, &err);
        ctx->att_l = alloc_floats(T, n_rows, &err);
        ctx->att_mx = alloc_floats(T, n_rows, &err);
        ctx->att_comb = alloc_floats(2 * T, n_q + n_rows, &err);
    }
    if (sh->size > 1 && shard_has_classifier(sh)) {
        const size_t stride = (size_t)shard_vocab_stride(sh, hp->n_vocab);
        ctx->logits_part = alloc_floats((size_t)prm->max_outputs, stride, &err);
        if (is_assembler) {
            ctx->logits_all = alloc_floats((size_t)sh->size * prm->max_outputs, stride, &err);
        }
    }
    ctx->att_tiles = malloc(T * sizeof(*ctx->att_tiles));
    if (!ctx->att_tiles) err = ERR_NOMEM;
    if (prm->max_adapters > 0 && !err) {
        // The widest apply: q, k and v together, or gate and up together.
        int64_t out_floats = (int64_t)n_q + 2 * (int64_t)n_kv;
        if (2 * (int64_t)hp->n_ff > out_floats) out_floats = 2 * (int64_t)hp->n_ff;
        if (hp->n_embd > out_floats) out_floats = hp->n_embd;
        ctx->adapters = calloc((size_t)prm->max_adapters, sizeof(*ctx->adapters));
        ctx->ab_count = malloc(((size_t)prm->max_adapters + 1) * sizeof(*ctx->ab_count));
        if (!ctx->adapters || !ctx->ab_count) err = ERR_NOMEM;
        if (!err) err = adapter_batch_init(&ctx->ab, prm->max_batch_tokens, out_floats);
    }
    // Attention follows the kernels' choice: portable when they were forced portable.
    ctx->attn_kern = kern_attn_select(prm->kv_type, kern_get()->isa_quant);
    if (err) {
        LOG_ERROR("%s: cannot allocate scratch for %d tokens and %d outputs", __func__,
                  prm->max_batch_tokens, prm->max_outputs);
    }
    return err;
}

int engine_ctx_create(const struct engine_model *m, const struct engine_ctx_params *p,
                      struct engine_ctx **out) {
    *out = NULL;
    struct engine_ctx_params prm = *p;
    share_params(&prm);
    struct engine_ctx *ctx = NULL;
    int err = check_params(m, &prm);
    if (!err) err = ctx_alloc(m, &prm, &ctx);
    // Under tensor parallelism a ctx that failed on one rank fails on all, so no rank is
    // left waiting for steps that never come.
    err = comm_agree(prm.comm, err);
    // The allreduces of tensor parallelism run among one stage's TP ranks: the whole job
    // at PP 1, the stage's own group under TP x PP (job rank = stage * TP + TP rank).
    const struct shard *sh = &m->shard;
    if (!err && sh->size > 1) {
        if (sh->n_stages == 1) ctx->tp_group = prm.comm;
        else err = comm_split(prm.comm, sh->stage, sh->rank, &ctx->tp_group);
    }
    if (err) {
        engine_ctx_free(ctx);
        return err;
    }
    ctx->is_parallel = shard_job_size(&m->shard) > 1;
    *out = ctx;
    return 0;
}

/* Checks the batch against the ctx's limits and counts its output rows. */
static int check_batch(const struct engine_ctx *ctx, const struct engine_batch *b,
                       int32_t *out_n_outputs) {
    const struct engine_ctx_params *p = &ctx->params;
    if (b->n_tokens < 1 || b->n_tokens > p->max_batch_tokens || b->n_seqs < 1 ||
        b->n_seqs > p->max_seqs) {
        LOG_ERROR("%s: batch of %d tokens / %d sequences exceeds the context (%d / %d)",
                  __func__, b->n_tokens, b->n_seqs, p->max_batch_tokens, p->max_seqs);
        return ERR_INVAL;
    }
    int32_t n_outputs = 0;
    const int32_t bs = p->block_size;
    const int32_t n_vocab = ctx->model->hp.n_vocab;
    for (int32_t t = 0; t < b->n_tokens; t++) {
        ASSERT(b->token[t] >= 0 && b->token[t] < n_vocab);
        ASSERT(b->seq[t] >= 0 && b->seq[t] < b->n_seqs);
        const struct engine_seq *sq = &b->seqs[b->seq[t]];
        ASSERT(b->pos[t] >= 0 && b->pos[t] / bs < sq->n_blocks);
        const int32_t block = sq->block_table[b->pos[t] / bs];
        ASSERT(block > 0 && block < p->n_blocks);
        if (b->output[t]) n_outputs++;
    }
    if (b->adapter) {
        for (int32_t t = 0; t < b->n_tokens; t++) {
            const int32_t slot = b->adapter[t];
            if (slot < -1 || slot >= p->max_adapters || (slot >= 0 && !ctx->adapters[slot])) {
                LOG_ERROR("%s: token %d names adapter slot %d, which is %s", __func__, t, slot,
                          slot < -1 || slot >= p->max_adapters ? "out of range" : "empty");
                return ERR_INVAL;
            }
        }
    }
    if (n_outputs > p->max_outputs) {
        LOG_ERROR("%s: %d output rows exceed the context's %d", __func__, n_outputs,
                  p->max_outputs);
        return ERR_INVAL;
    }
    *out_n_outputs = n_outputs;
    return 0;
}

int64_t engine_peak_rss_bytes(void) {
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) != 0) return 0;
    return (int64_t)ru.ru_maxrss * 1024;  // kilobytes on Linux
}

int64_t engine_rss_bytes(void) {
    FILE *f = fopen("/proc/self/statm", "r");
    if (!f) return 0;
    long long size = 0, resident = 0;
    int n = fscanf(f, "%lld %lld", &size, &resident);
    fclose(f);
    return n == 2 ? (int64_t)resident * sysconf(_SC_PAGESIZE) : 0;
}

static struct engine_rank_stats own_stats(const struct engine_ctx *ctx) {
    return (struct engine_rank_stats){
        .peak_rss_bytes = engine_peak_rss_bytes(),
        .forward_ns = ctx->forward_ns,
        .n_steps = ctx->n_steps,
        .comm_bytes = (int64_t)comm_bytes_sent(ctx->comm),
        .rss_bytes = engine_rss_bytes(),
        .model_read_bytes = (int64_t)ctx->model->info.file_bytes_read};
}

/* forward_run, timed; then, when rank 0 asked for it, every rank's figures
 * gathered on rank 0. */
static void run_step(struct engine_ctx *ctx, const struct engine_batch *b, int32_t n_outputs,
                     bool want_stats) {
    const int64_t t0 = clock_mono_ns();
    forward_run(ctx, b, n_outputs);
    ctx->forward_ns += clock_mono_ns() - t0;
    ctx->n_steps++;
    if (want_stats) {
        const struct engine_rank_stats mine = own_stats(ctx);
        comm_gather(ctx->comm, &mine, sizeof(mine), ctx->ranks);
    }
}

int engine_forward(struct engine_ctx *ctx, const struct engine_batch *b,
                   const float **out_logits) {
    *out_logits = NULL;
    ASSERT(comm_rank(ctx->comm) == 0);  // the other ranks follow (engine_follow)
    int32_t n_outputs = 0;
    int err = check_batch(ctx, b, &n_outputs);
    if (err) return err;
    bool want_stats = false;
    if (ctx->is_parallel) {
        const int64_t now = clock_mono_ns();
        want_stats = now - ctx->t_report_ns >= (int64_t)ENGINE_RANK_REPORT_MS * 1000000;
        if (want_stats) ctx->t_report_ns = now;
        step_desc_send(&ctx->desc, ctx->comm, b, want_stats);
    }
    run_step(ctx, b, n_outputs, want_stats);
    *out_logits = ctx->logits;
    return 0;
}

int32_t engine_ctx_rank_stats(const struct engine_ctx *ctx, struct engine_rank_stats *out,
                              int32_t max) {
    ASSERT(comm_rank(ctx->comm) == 0);
    const int32_t n = comm_size(ctx->comm);
    for (int32_t r = 0; r < n && r < max; r++) {
        out[r] = r == 0 ? own_stats(ctx) : ctx->ranks[r];
    }
    return n;
}

static int set_slot(struct engine_ctx *ctx, int32_t slot, struct engine_adapter *a);
static int set_slot_shared(struct engine_ctx *ctx, int32_t slot, struct engine_adapter *a,
                           bool has_adapter);

int engine_follow(struct engine_ctx *ctx) {
    ASSERT(ctx->is_parallel && comm_rank(ctx->comm) > 0);
    struct engine_batch b;
    bool want_stats = false;
    for (;;) {
        const enum step_desc_kind kind = step_desc_recv(&ctx->desc, ctx->comm, &b, &want_stats);
        if (kind == STEP_DESC_KIND_STOP) return 0;
        if (kind == STEP_DESC_KIND_ADAPTER) {
            // A failure is every rank's (agreed): the slot stays as it was on all of them.
            set_slot_shared(ctx, ctx->desc.adapter_slot, NULL, ctx->desc.has_adapter);
            continue;
        }
        // Rank 0 checked the batch against the same limits before sending it.
        int32_t n_outputs = 0;
        const int err = check_batch(ctx, &b, &n_outputs);
        ASSERT(err == 0);
        run_step(ctx, &b, n_outputs, want_stats);
    }
}

const struct engine_model *engine_ctx_model(const struct engine_ctx *ctx) { return ctx->model; }
int32_t engine_ctx_block_size(const struct engine_ctx *ctx) { return ctx->params.block_size; }
int32_t engine_ctx_n_blocks(const struct engine_ctx *ctx) { return ctx->params.n_blocks; }

/* ---- adapter slots (engine/model/lora.h): the ctx owns them ---- */

/* Puts a (NULL: nothing) into slot, with scratch for its rank vectors. */
static int set_slot(struct engine_ctx *ctx, int32_t slot, struct engine_adapter *a) {
    if (a) {
        int err = adapter_batch_reserve(&ctx->ab, ctx->params.max_batch_tokens,
                                        adapter_tmp_floats(a));
        if (err) {
            LOG_ERROR("%s: no memory for the rank vectors of %s", __func__, a->path);
            return err;
        }
        engine_adapter_retain(a);
    }
    engine_adapter_release(ctx->adapters[slot]);
    ctx->adapters[slot] = a;
    return 0;
}

/* Every rank of a job, in step (rank 0 sent the slot's header first): slot
 * gets this rank's cut of rank 0's adapter a (adapter_share.h,
 * model/adapter.h), or is emptied without has_adapter. A rank that fails
 * fails it on all, which keep what the slot held. */
static int set_slot_shared(struct engine_ctx *ctx, int32_t slot, struct engine_adapter *a,
                           bool has_adapter) {
    if (!has_adapter) return set_slot(ctx, slot, NULL);
    struct engine_adapter *full = NULL, *mine = NULL;
    const int64_t t0 = clock_mono_ns();
    const uint64_t sent0 = comm_bytes_sent(ctx->comm);
    int err = adapter_share(ctx->comm, ctx->model, a, &full);
    if (err) return err;  // agreed
    if (comm_rank(ctx->comm) == 0) {
        LOG_INFO("adapter %s (id %llu) into slot %d: sent to %d ranks, %.1f MiB, %.1f ms",
                 a->path, (unsigned long long)a->info.id, slot, comm_size(ctx->comm) - 1,
                 (double)(comm_bytes_sent(ctx->comm) - sent0) / (1024.0 * 1024.0),
                 (double)(clock_mono_ns() - t0) / 1e6);
    }
    err = adapter_cut(full, ctx->model, &mine);
    engine_adapter_release(full);
    if (!err) err = adapter_batch_reserve(&ctx->ab, ctx->params.max_batch_tokens,
                                          adapter_tmp_floats(mine));
    err = comm_agree(ctx->comm, err);
    if (!err) err = set_slot(ctx, slot, mine);  // reserved above: cannot fail now
    if (err) {
        LOG_ERROR("%s: slot %d: a rank could not hold its part of the adapter", __func__, slot);
    }
    engine_adapter_release(mine);
    return err;
}

int engine_ctx_set_adapter(struct engine_ctx *ctx, int32_t slot, struct engine_adapter *a) {
    if (slot < 0 || slot >= ctx->params.max_adapters) {
        LOG_ERROR("%s: slot %d out of range (the ctx has %d)", __func__, slot,
                  ctx->params.max_adapters);
        return ERR_INVAL;
    }
    if (a && a->model != ctx->model) {
        LOG_ERROR("%s: adapter %s was loaded for another model", __func__, a->path);
        return ERR_INVAL;
    }
    if (!ctx->is_parallel) return set_slot(ctx, slot, a);
    step_desc_send_adapter(ctx->comm, slot, a != NULL);
    return set_slot_shared(ctx, slot, a, a != NULL);
}

const struct engine_adapter *engine_ctx_adapter(const struct engine_ctx *ctx, int32_t slot) {
    ASSERT(slot >= 0 && slot < ctx->params.max_adapters);
    return ctx->adapters[slot];
}
