/*
 * shard.c - cutting a loaded model down to one tensor-parallel rank's slice
 * (shard.h has the scheme): the plan, the cuts of one layer's tensors, and
 * the vocabulary rows of the embedding and the classifier.
 * model.c applies them between binding and panel packing, so the panels, the
 * q-panels and every kernel see ordinary, smaller matrices.
 */
#define LOG_TAG "shard"
#include "engine/model/shard.h"

#include "engine/base/err.h"
#include "engine/base/log.h"
#include "engine/format/quant.h"

/* Keeps rows [r0, r0 + n) of t: a contiguous view. */
static void keep_rows(struct tensor *t, int64_t r0, int64_t n) {
    t->data = (const uint8_t *)t->data + (size_t)r0 * t->row_bytes;
    t->ne[1] = n;
}

/* Checks that columns [c0, c0 + n) of t start and end on block boundaries. */
static int check_cols(const char *path, const struct tensor *t, int64_t c0, int64_t n) {
    const int32_t bs = quant_traits(t->type)->block_size;
    if (c0 % bs != 0 || n % bs != 0) {
        LOG_ERROR(
            "%s: tensor '%s' (%s, blocks of %d) cannot be split at columns [%lld, %lld) "
            "for tensor parallelism",
            path, t->name, quant_name(t->type), bs, (long long)c0, (long long)(c0 + n));
        return ERR_UNSUPPORTED;
    }
    return 0;
}

/* Keeps columns [c0, c0 + n) of every row of t: a strided view whose row
 * stride (row_bytes) stays the file's. */
static void keep_cols(struct tensor *t, int64_t c0, int64_t n) {
    t->data = (const uint8_t *)t->data + quant_row_size(t->type, c0);
    t->ne[0] = n;
}

int shard_plan(const char *path, int32_t rank, int32_t size, int32_t n_head, int32_t n_head_kv,
               int32_t n_ff, enum quant_type ff_type, struct shard *out) {
    struct shard *sh = out;
    *sh = (struct shard){
        .rank = rank, .size = size, .n_head = n_head, .n_head_kv = n_head_kv, .n_ff = n_ff};
    if (size == 1) return 0;
    if (n_head_kv % size != 0) {
        LOG_ERROR(
            "%s: tensor parallelism over %d ranks needs the model's %d kv heads to be a "
            "multiple of %d (--tp must divide %d)",
            path, size, n_head_kv, size, n_head_kv);
        return ERR_UNSUPPORTED;
    }
    sh->n_head_kv = n_head_kv / size;
    sh->n_head = n_head / size;
    sh->head_kv0 = rank * sh->n_head_kv;
    sh->head0 = rank * sh->n_head;

    // FFN columns: whole blocks of ffn_down's type, spread as evenly as they go.
    const int32_t bs_ff = quant_traits(ff_type)->block_size;
    const int64_t n_units = n_ff / bs_ff;
    const int64_t u0 = n_units * rank / size;
    const int64_t u1 = n_units * (rank + 1) / size;
    sh->ff0 = (int32_t)(u0 * bs_ff);
    sh->n_ff = (int32_t)((u1 - u0) * bs_ff);
    if (sh->n_ff == 0) {
        LOG_ERROR(
            "%s: %d FFN columns in blocks of %d leave rank %d of %d none (use fewer "
            "ranks)",
            path, n_ff, bs_ff, rank, size);
        return ERR_UNSUPPORTED;
    }
    return 0;
}

int shard_plan_stage(const char *path, int32_t stage, int32_t n_stages, int32_t n_layer,
                     struct shard *sh) {
    sh->stage = stage;
    sh->n_stages = n_stages;
    sh->layer0 = (int32_t)((int64_t)n_layer * stage / n_stages);
    sh->n_layer = (int32_t)((int64_t)n_layer * (stage + 1) / n_stages) - sh->layer0;
    if (sh->n_layer < 1) {
        LOG_ERROR("%s: %d pipeline stages over the model's %d layers leave stage %d none "
                  "(--pp must be at most %d)",
                  path, n_stages, n_layer, stage, n_layer);
        return ERR_UNSUPPORTED;
    }
    return 0;
}

int shard_check_layer(const char *path, const struct shard *sh, int32_t head_dim,
                      const struct shard_layer *l) {
    const int64_t q0 = (int64_t)sh->head0 * head_dim;
    const int64_t n_q = (int64_t)sh->n_head * head_dim;
    int err = check_cols(path, l->wo, q0, n_q);
    if (!err) err = check_cols(path, l->ffn_down, sh->ff0, sh->n_ff);
    return err;
}

void shard_cut_layer(const struct shard *sh, int32_t head_dim, const struct shard_layer *l) {
    const int64_t q0 = (int64_t)sh->head0 * head_dim;
    const int64_t n_q = (int64_t)sh->n_head * head_dim;
    const int64_t kv0 = (int64_t)sh->head_kv0 * head_dim;
    const int64_t n_kv = (int64_t)sh->n_head_kv * head_dim;
    keep_rows(l->wq, q0, n_q);
    keep_rows(l->wk, kv0, n_kv);
    keep_rows(l->wv, kv0, n_kv);
    keep_rows(l->ffn_gate, sh->ff0, sh->n_ff);
    keep_rows(l->ffn_up, sh->ff0, sh->n_ff);
    keep_cols(l->wo, q0, n_q);
    keep_cols(l->ffn_down, sh->ff0, sh->n_ff);
    if (*l->bq) *l->bq += q0;
    if (*l->bk) *l->bk += kv0;
    if (*l->bv) *l->bv += kv0;
}

void shard_plan_vocab(int32_t n_vocab, struct shard *sh) {
    sh->vocab0 = 0;
    sh->n_vocab = 0;
    if (!shard_has_embedding(sh) && !shard_has_classifier(sh)) return;
    sh->vocab0 = shard_vocab_first(sh, n_vocab, sh->rank);
    sh->n_vocab = shard_vocab_first(sh, n_vocab, sh->rank + 1) - sh->vocab0;
}

void shard_cut_vocab(const struct shard *sh, struct tensor *t) {
    if (sh->size == 1) return;
    keep_rows(t, sh->vocab0, sh->n_vocab);
}
