/*
 * model.c - loading a GGUF model: hyper-parameters, tensor binding and shape
 * checks. Everything read from the file is validated here, with a message that
 * names the key or tensor; the forward pass only ASSERTs.
 */
#define LOG_TAG "model"
#include "engine/model/model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "engine/base/alloc.h"
#include "engine/base/err.h"
#include "engine/base/log.h"
#include "engine/base/pages.h"
#include "engine/base/progress.h"
#include "engine/format/gguf.h"
#include "engine/kernels/kernels.h"
#include "engine/text/tokenizer.h"

/* Bounds that keep every size computation far from overflow and reject
 * nonsense early; real models are well inside them. */
#define MODEL_MAX_EMBD 65536
#define MODEL_MAX_LAYERS 1024
#define MODEL_MAX_HEADS 1024
#define MODEL_MAX_HEAD_DIM 1024
#define MODEL_MAX_FF (1 << 20)
#define MODEL_MAX_VOCAB (1 << 22)

struct loader {
    struct engine_model *m;
    const char *path;
    char prefix[64];  // "<arch>."
    bool show_progress;
};

/* Reads <arch>.<key> as a positive int32 in [lo, hi]; absent -> *out keeps
 * def, or an error when required. */
static int get_int(struct loader *ld, const char *key, bool required, int32_t def, int32_t lo,
                   int32_t hi, int32_t *out) {
    char full[160];
    snprintf(full, sizeof(full), "%s%s", ld->prefix, key);
    const struct gguf_kv *kv = gguf_find(ld->m->gguf, full);
    if (kv && kv->type == GGUF_TYPE_ARRAY) {
        LOG_ERROR("%s: %s is a per-layer array; per-layer values are not supported", ld->path,
                  full);
        return ERR_UNSUPPORTED;
    }
    int64_t v = def;
    int err = gguf_get_i64(ld->m->gguf, full, &v);
    if (err == ERR_NOTFOUND) {
        if (required) {
            LOG_ERROR("%s: required key %s is missing", ld->path, full);
            return ERR_FORMAT;
        }
        v = def;
    } else if (err) {
        return err;
    }
    if (v < lo || v > hi) {
        LOG_ERROR("%s: %s = %lld is out of range [%d, %d]", ld->path, full, (long long)v, lo, hi);
        return ERR_FORMAT;
    }
    *out = (int32_t)v;
    return 0;
}

static int get_float(struct loader *ld, const char *key, float def, float *out) {
    char full[160];
    snprintf(full, sizeof(full), "%s%s", ld->prefix, key);
    float v = def;
    int err = gguf_get_f32(ld->m->gguf, full, &v);
    if (err && err != ERR_NOTFOUND) return err;
    if (!isfinite(v)) {
        LOG_ERROR("%s: %s is not a finite number", ld->path, full);
        return ERR_FORMAT;
    }
    *out = v;
    return 0;
}

static int load_hparams(struct loader *ld) {
    struct hparams *hp = &ld->m->hp;
    int err;
    if ((err = get_int(ld, "embedding_length", true, 0, 1, MODEL_MAX_EMBD, &hp->n_embd)) ||
        (err = get_int(ld, "block_count", true, 0, 1, MODEL_MAX_LAYERS, &hp->n_layer)) ||
        (err = get_int(ld, "attention.head_count", true, 0, 1, MODEL_MAX_HEADS, &hp->n_head)) ||
        (err = get_int(ld, "feed_forward_length", true, 0, 1, MODEL_MAX_FF, &hp->n_ff)) ||
        (err = get_int(ld, "context_length", false, 2048, 1, 1 << 24, &hp->n_ctx_train))) {
        return err;
    }
    if ((err = get_int(ld, "attention.head_count_kv", false, hp->n_head, 1, hp->n_head,
                       &hp->n_head_kv))) {
        return err;
    }
    if (hp->n_head % hp->n_head_kv != 0) {
        LOG_ERROR("%s: %d heads are not a multiple of %d kv heads", ld->path, hp->n_head,
                  hp->n_head_kv);
        return ERR_FORMAT;
    }
    int32_t def_head_dim = hp->n_embd / hp->n_head;
    if ((err = get_int(ld, "attention.key_length", false, def_head_dim, 1, MODEL_MAX_HEAD_DIM,
                       &hp->head_dim))) {
        return err;
    }
    int32_t v_len = hp->head_dim;
    if ((err = get_int(ld, "attention.value_length", false, hp->head_dim, 1, MODEL_MAX_HEAD_DIM,
                       &v_len))) {
        return err;
    }
    if (v_len != hp->head_dim) {
        LOG_ERROR("%s: key_length %d != value_length %d is not supported", ld->path,
                  hp->head_dim, v_len);
        return ERR_UNSUPPORTED;
    }
    if (hp->head_dim % 2 != 0) {
        LOG_ERROR("%s: head dimension %d must be even", ld->path, hp->head_dim);
        return ERR_FORMAT;
    }
    if ((err = get_int(ld, "rope.dimension_count", false, hp->head_dim, 2, hp->head_dim,
                       &hp->n_rot))) {
        return err;
    }
    if (hp->n_rot % 2 != 0) {
        LOG_ERROR("%s: rope.dimension_count %d must be even", ld->path, hp->n_rot);
        return ERR_FORMAT;
    }
    if ((err = get_float(ld, "rope.freq_base", 10000.0f, &hp->rope_freq_base)) ||
        (err = get_float(ld, "attention.layer_norm_rms_epsilon", 1e-5f, &hp->norm_eps))) {
        return err;
    }
    if (hp->rope_freq_base <= 0.0f || hp->norm_eps < 0.0f) {
        LOG_ERROR("%s: rope.freq_base must be > 0 and the norm epsilon >= 0", ld->path);
        return ERR_FORMAT;
    }
    if ((err = get_int(ld, "attention.sliding_window", false, 0, 0, 1 << 24,
                       &hp->sliding_window))) {
        return err;
    }

    // RoPE scaling: <arch>.rope.scaling.type + .factor, or the older scale_linear.
    hp->rope_scale = 1.0f;
    hp->rope_mscale = 1.0f;
    char key[160];
    snprintf(key, sizeof(key), "%srope.scaling.type", ld->prefix);
    struct gguf_str type = {0};
    err = gguf_get_str(ld->m->gguf, key, &type);
    if (err && err != ERR_NOTFOUND) return err;
    float factor = 1.0f;
    if ((err = get_float(ld, "rope.scaling.factor", 1.0f, &factor))) return err;
    if (err == 0 && type.data && !gguf_str_eq(type, "none")) {
        if (gguf_str_eq(type, "linear")) {
            if (factor <= 0.0f) {
                LOG_ERROR("%s: rope.scaling.factor must be > 0", ld->path);
                return ERR_FORMAT;
            }
            hp->rope_scale = 1.0f / factor;
        } else if (gguf_str_eq(type, "yarn")) {
            float attn_factor = 1.0f;
            if (factor < 1.0f ||
                (err = get_int(ld, "rope.scaling.original_context_length", true, 0, 1, 1 << 24,
                               &hp->yarn_orig_ctx)) ||
                (err = get_float(ld, "rope.scaling.yarn_beta_fast", 32.0f, &hp->yarn_beta_fast)) ||
                (err = get_float(ld, "rope.scaling.yarn_beta_slow", 1.0f, &hp->yarn_beta_slow)) ||
                (err = get_float(ld, "rope.scaling.attn_factor", 1.0f, &attn_factor))) {
                if (!err) LOG_ERROR("%s: yarn rope.scaling.factor must be >= 1", ld->path);
                return err ? err : ERR_FORMAT;
            }
            if (!(hp->yarn_beta_fast > 0.0f) || !(hp->yarn_beta_slow > 0.0f)) {
                LOG_ERROR("%s: yarn beta_fast and beta_slow must be > 0", ld->path);
                return ERR_FORMAT;
            }
            hp->yarn_factor = factor;
            hp->rope_mscale = attn_factor * (0.1f * logf(factor) + 1.0f);
        } else {
            char t[64];
            LOG_ERROR("%s: rope scaling type '%s' is not supported yet (none, linear, yarn)",
                      ld->path, gguf_str_copy(type, t, sizeof(t)));
            return ERR_UNSUPPORTED;
        }
    } else {
        float lin = 0.0f;
        if ((err = get_float(ld, "rope.scale_linear", 0.0f, &lin))) return err;
        if (lin > 0.0f) hp->rope_scale = 1.0f / lin;
    }
    return 0;
}

/* Finds a tensor and checks its shape [ne0] or [ne0, ne1]; ne1 == 0 means 1-D.
 * Returns NULL with *err set when missing (if required) or mis-shaped. */
static const struct tensor *bind(struct loader *ld, const char *name, int64_t ne0, int64_t ne1,
                                 bool required, int *err) {
    struct engine_model *m = ld->m;
    const struct tensor *t = NULL;
    for (int64_t i = 0; i < m->n_tensors; i++) {
        if (strcmp(m->tensors[i].name, name) == 0) {
            t = &m->tensors[i];
            break;
        }
    }
    if (!t) {
        if (required) {
            LOG_ERROR("%s: tensor '%s' is missing", ld->path, name);
            *err = ERR_FORMAT;
        }
        return NULL;
    }
    int want_dims = ne1 ? 2 : 1;
    bool ok = t->ne[0] == ne0 && t->ne[2] == 1 && t->ne[3] == 1 &&
              (ne1 ? t->ne[1] == ne1 : t->ne[1] == 1);
    if (!ok) {
        LOG_ERROR("%s: tensor '%s' has shape [%lld, %lld, %lld, %lld], expected [%lld%s%lld]",
                  ld->path, name, (long long)t->ne[0], (long long)t->ne[1], (long long)t->ne[2],
                  (long long)t->ne[3], (long long)ne0, want_dims == 2 ? ", " : "",
                  want_dims == 2 ? (long long)ne1 : 0LL);
        *err = ERR_FORMAT;
        return NULL;
    }
    if (!quant_is_supported(t->type)) {
        LOG_ERROR("%s: tensor '%s' has type %s, which is not supported yet (supported: f32, f16, "
                  "bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q2_K, q3_K, q4_K, q5_K, q6_K)", ld->path,
                  name, quant_name(t->type));
        *err = ERR_UNSUPPORTED;
        return NULL;
    }
    return t;
}

/* Binds a 1-D tensor and copies it to f32 at *cursor in the small arena. */
static const float *bind_small(struct loader *ld, const char *name, int64_t n, bool required,
                               float **cursor, int *err) {
    const struct tensor *t = bind(ld, name, n, 0, required, err);
    if (!t) return NULL;
    float *dst = *cursor;
    tensor_row_to_f32(t, 0, dst);
    *cursor += n;
    return dst;
}

static int bind_tensors(struct loader *ld) {
    struct engine_model *m = ld->m;
    const struct hparams *hp = &m->hp;
    const struct arch *a = m->arch;
    int err = 0;
    const int64_t n_embd = hp->n_embd;
    const int64_t n_q = (int64_t)hp->n_head * hp->head_dim;
    const int64_t n_kv = (int64_t)hp->n_head_kv * hp->head_dim;

    // n_vocab comes from the embedding matrix (it may be padded past the tokenizer).
    const struct tensor *te = NULL;
    for (int64_t i = 0; i < m->n_tensors; i++) {
        if (strcmp(m->tensors[i].name, "token_embd.weight") == 0) te = &m->tensors[i];
    }
    if (!te) {
        LOG_ERROR("%s: tensor 'token_embd.weight' is missing", ld->path);
        return ERR_FORMAT;
    }
    if (te->ne[1] < 1 || te->ne[1] > MODEL_MAX_VOCAB) {
        LOG_ERROR("%s: token_embd.weight has %lld rows (vocabulary size out of range)", ld->path,
                  (long long)te->ne[1]);
        return ERR_FORMAT;
    }
    m->hp.n_vocab = (int32_t)te->ne[1];
    m->tok_embd = bind(ld, "token_embd.weight", n_embd, hp->n_vocab, true, &err);
    if (!m->tok_embd) return err;

    // Small f32 copies: per layer two norms, biases, q/k norms; plus output norm.
    size_t n_small = (size_t)n_embd;
    n_small += (size_t)hp->n_layer * (size_t)(2 * n_embd + n_q + 2 * n_kv + 2 * hp->head_dim);
    m->small = malloc(n_small * sizeof(float));
    if (!m->small) return ERR_NOMEM;
    float *cur = m->small;

    m->output_norm = bind_small(ld, "output_norm.weight", n_embd, true, &cur, &err);
    if (!m->output_norm) return err;
    m->output = bind(ld, "output.weight", n_embd, hp->n_vocab, false, &err);
    if (err) return err;
    if (!m->output) m->output = m->tok_embd;  // tied classifier

    m->layers = calloc((size_t)hp->n_layer, sizeof(*m->layers));
    if (!m->layers) return ERR_NOMEM;
    for (int32_t il = 0; il < hp->n_layer; il++) {
        struct layer *L = &m->layers[il];
        char nm[96];
#define NAME(suffix) (snprintf(nm, sizeof(nm), "blk.%d." suffix, il), nm)
        if (!(L->attn_norm = bind_small(ld, NAME("attn_norm.weight"), n_embd, true, &cur, &err)) ||
            !(L->wq = bind(ld, NAME("attn_q.weight"), n_embd, n_q, true, &err)) ||
            !(L->wk = bind(ld, NAME("attn_k.weight"), n_embd, n_kv, true, &err)) ||
            !(L->wv = bind(ld, NAME("attn_v.weight"), n_embd, n_kv, true, &err)) ||
            !(L->wo = bind(ld, NAME("attn_output.weight"), n_q, n_embd, true, &err)) ||
            !(L->ffn_norm = bind_small(ld, NAME("ffn_norm.weight"), n_embd, true, &cur, &err)) ||
            !(L->ffn_gate = bind(ld, NAME("ffn_gate.weight"), n_embd, hp->n_ff, true, &err)) ||
            !(L->ffn_up = bind(ld, NAME("ffn_up.weight"), n_embd, hp->n_ff, true, &err)) ||
            !(L->ffn_down = bind(ld, NAME("ffn_down.weight"), hp->n_ff, n_embd, true, &err))) {
            return err;
        }
        // Biases: required for qwen2, honoured when present for the others.
        L->bq = bind_small(ld, NAME("attn_q.bias"), n_q, a->has_qkv_bias, &cur, &err);
        if (err) return err;
        L->bk = bind_small(ld, NAME("attn_k.bias"), n_kv, a->has_qkv_bias, &cur, &err);
        if (err) return err;
        L->bv = bind_small(ld, NAME("attn_v.bias"), n_kv, a->has_qkv_bias, &cur, &err);
        if (err) return err;
        if (a->has_qk_norm) {
            L->q_norm = bind_small(ld, NAME("attn_q_norm.weight"), hp->head_dim, true, &cur, &err);
            if (!L->q_norm) return err;
            L->k_norm = bind_small(ld, NAME("attn_k_norm.weight"), hp->head_dim, true, &cur, &err);
            if (!L->k_norm) return err;
        }
#undef NAME
    }
    ASSERT((size_t)(cur - m->small) <= n_small);

    // RoPE inverse frequencies, with Llama 3 per-pair factors when present.
    int32_t n_pairs = hp->n_rot / 2;
    m->rope_inv_freq = malloc((size_t)n_pairs * sizeof(float));
    if (!m->rope_inv_freq) return ERR_NOMEM;
    const struct tensor *rf = bind(ld, "rope_freqs.weight", n_pairs, 0, false, &err);
    if (err) return err;
    float *factors = NULL;
    if (rf) {
        factors = malloc((size_t)n_pairs * sizeof(float));
        if (!factors) return ERR_NOMEM;
        tensor_row_to_f32(rf, 0, factors);
        for (int32_t i = 0; i < n_pairs; i++) {
            if (!(factors[i] > 0.0f) || !isfinite(factors[i])) {
                LOG_ERROR("%s: rope_freqs.weight[%d] = %g must be a positive number", ld->path,
                          i, (double)factors[i]);
                free(factors);
                return ERR_FORMAT;
            }
        }
    }
    // YaRN (Peng et al. 2023, as Hugging Face computes it): pairs that turn more
    // than beta_fast times over the original context keep their frequency, those
    // under beta_slow are interpolated by the factor, a linear ramp between.
    double yarn_low = 0.0, yarn_high = 0.0;
    if (hp->yarn_factor > 0.0f) {
        const double d = hp->n_rot, base = hp->rope_freq_base, orig = hp->yarn_orig_ctx;
        const double two_pi = 6.283185307179586;
        yarn_low = floor(d * log(orig / (hp->yarn_beta_fast * two_pi)) / (2.0 * log(base)));
        yarn_high = ceil(d * log(orig / (hp->yarn_beta_slow * two_pi)) / (2.0 * log(base)));
        if (yarn_low < 0.0) yarn_low = 0.0;
        if (yarn_high > d - 1.0) yarn_high = d - 1.0;
        if (yarn_low == yarn_high) yarn_high += 0.001;
    }
    for (int32_t i = 0; i < n_pairs; i++) {
        double inv = pow((double)hp->rope_freq_base, -2.0 * i / hp->n_rot) * hp->rope_scale;
        if (factors) inv /= factors[i];
        if (hp->yarn_factor > 0.0f) {
            double ramp = (i - yarn_low) / (yarn_high - yarn_low);
            ramp = ramp < 0.0 ? 0.0 : ramp > 1.0 ? 1.0 : ramp;
            const double keep = 1.0 - ramp;  // share of the original frequency
            inv = inv / hp->yarn_factor * (1.0 - keep) + inv * keep;
        }
        m->rope_inv_freq[i] = (float)inv;
    }
    free(factors);
    return 0;
}

static int load_tensors(struct loader *ld) {
    struct engine_model *m = ld->m;
    m->n_tensors = gguf_n_tensors(m->gguf);
    m->tensors = calloc((size_t)(m->n_tensors ? m->n_tensors : 1), sizeof(*m->tensors));
    if (!m->tensors) return ERR_NOMEM;
    int64_t n_params = 0;
    size_t bytes = 0;
    int64_t count_by_type[QUANT_TYPE_COUNT] = {0};
    for (int64_t i = 0; i < m->n_tensors; i++) {
        const struct gguf_tensor_info *ti = gguf_tensor_at(m->gguf, i);
        struct tensor *t = &m->tensors[i];
        if (ti->name.len >= sizeof(t->name)) {
            LOG_ERROR("%s: tensor %lld has a name of %llu bytes (max %zu)", ld->path,
                      (long long)i, (unsigned long long)ti->name.len, sizeof(t->name) - 1);
            return ERR_FORMAT;
        }
        gguf_str_copy(ti->name, t->name, sizeof(t->name));
        t->type = (enum quant_type)ti->type;
        t->n_dims = (int32_t)ti->n_dims;
        for (int d = 0; d < 4; d++) t->ne[d] = ti->ne[d];
        t->row_bytes = quant_row_size(t->type, t->ne[0]);
        t->data = ti->data;
        n_params += tensor_n_elements(t);
        bytes += ti->nbytes;
        if (t->ne[1] > 1) count_by_type[t->type] += tensor_n_elements(t);
    }
    int64_t best = -1;
    for (int i = 0; i < QUANT_TYPE_COUNT; i++) {
        if (count_by_type[i] > best) {
            best = count_by_type[i];
            m->info.weight_type = quant_name((uint32_t)i);
        }
    }
    m->info.n_params = n_params;
    m->info.weight_bytes = bytes;
    return 0;
}

/* Gives back the pages wholly inside [p, p + n): they were copied into
 * panels and are never read again. The file's bytes are private anonymous
 * memory (file_sparse), so a dropped page would read back as zeros: the caller
 * keeps the pages of a tensor that is still read (the token embedding of a
 * tied output, whose rows the embedding lookup reads). */
static void drop_pages(const void *p, size_t n) {
    const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    uintptr_t lo = ((uintptr_t)p + page - 1) & ~(page - 1);
    uintptr_t hi = ((uintptr_t)p + n) & ~(page - 1);
    if (hi > lo) madvise((void *)lo, hi - lo, MADV_DONTNEED);
}

/* Cuts the bound layer tensors down to rank's slice of size ranks
 * (m->shard; shard.h has the scheme), between binding and packing, so the
 * panels and every kernel see ordinary, smaller matrices. */
static int shard_layers(struct loader *ld, const struct engine_model_params *p) {
    struct engine_model *m = ld->m;
    const struct hparams *hp = &m->hp;
    const int32_t size = p->tp_size;
    int err = shard_plan(ld->path, p->tp_rank, size, hp->n_head, hp->n_head_kv, hp->n_ff,
                         m->layers[0].ffn_down->type, &m->shard);
    if (!err) err = shard_plan_stage(ld->path, p->pp_rank, p->pp_size, hp->n_layer, &m->shard);
    if (!err) shard_plan_vocab(hp->n_vocab, &m->shard);  // at TP 1: every row
    m->shard.sp_rank = p->sp_rank;
    m->shard.n_sp = p->sp_size;
    if (err || size == 1) return err;
    // The embedding's rows of this rank at stage 0, the classifier's at the last stage
    // (one tensor when tied, cut once).
    const bool is_tied = m->output == m->tok_embd;
    if (shard_has_embedding(&m->shard) || (is_tied && shard_has_classifier(&m->shard))) {
        shard_cut_vocab(&m->shard, &m->tensors[m->tok_embd - m->tensors]);
    }
    if (!is_tied && shard_has_classifier(&m->shard)) {
        shard_cut_vocab(&m->shard, &m->tensors[m->output - m->tensors]);
    }
    const int32_t l0 = m->shard.layer0;
    for (int pass = 0; pass < 2; pass++) {  // check every layer of the stage, then cut
        for (int32_t il = l0; il < l0 + m->shard.n_layer; il++) {
            struct layer *L = &m->layers[il];
            // the model's own, writable tensors: the bound pointers are views of them
            const struct shard_layer sl = {.wq = &m->tensors[L->wq - m->tensors],
                                           .wk = &m->tensors[L->wk - m->tensors],
                                           .wv = &m->tensors[L->wv - m->tensors],
                                           .wo = &m->tensors[L->wo - m->tensors],
                                           .ffn_gate = &m->tensors[L->ffn_gate - m->tensors],
                                           .ffn_up = &m->tensors[L->ffn_up - m->tensors],
                                           .ffn_down = &m->tensors[L->ffn_down - m->tensors],
                                           .bq = &L->bq,
                                           .bk = &L->bk,
                                           .bv = &L->bv};
            if (pass == 0) {
                err = shard_check_layer(ld->path, &m->shard, hp->head_dim, &sl);
            } else {
                shard_cut_layer(&m->shard, hp->head_dim, &sl);
            }
            if (err) return err;
        }
    }
    return 0;
}

/* Bytes of the file a matrix's rows span, first row to the end of the last: a
 * column slice of tensor parallelism (shard.h) spans its whole wider rows. */
static size_t span_bytes(const struct tensor *t) {
    return (size_t)(t->ne[1] - 1) * t->row_bytes + quant_row_size(t->type, t->ne[0]);
}

/* Reads every vector (a tensor of one row: norms, biases, RoPE factors) from
 * the file, before binding copies them to f32: they are small, and every
 * rank reads all of them. */
static int read_vectors(struct loader *ld) {
    struct engine_model *m = ld->m;
    for (int64_t i = 0; i < m->n_tensors; i++) {
        const struct gguf_tensor_info *ti = gguf_tensor_at(m->gguf, i);
        if (ti->ne[1] != 1 || ti->ne[2] != 1 || ti->ne[3] != 1) continue;
        int err = gguf_read(m->gguf, ti->data, ti->nbytes);
        if (err) return err;
    }
    return 0;
}

/* Reads matrix t's rows as this rank sees them (shard.h): each row's ne[0]
 * elements at the view's stride, neighbours joined into one read where the
 * rows are contiguous (a whole matrix, a column-parallel slice). */
static int read_rows(struct gguf_file *f, const struct tensor *t) {
    const size_t row = quant_row_size(t->type, t->ne[0]);
    if (t->row_bytes == row) return gguf_read(f, t->data, (size_t)t->ne[1] * row);
    for (int64_t r = 0; r < t->ne[1]; r++) {
        int err = gguf_read(f, (const uint8_t *)t->data + (size_t)r * t->row_bytes, row);
        if (err) return err;
    }
    return 0;
}

/* Reads the matrices this rank computes with, after shard_layers() cut them:
 * its stage's layer matrices (its rows and columns of each), its vocabulary
 * rows of the token embedding at stage 0 and of the classifier at the last
 * stage (the same rows of one tensor when tied). Nothing else of the file's
 * data is read, so a rank's memory for weights is about its slices. */
static int read_matrices(struct loader *ld) {
    struct engine_model *m = ld->m;
    const struct shard *sh = &m->shard;
    int err = 0;
    for (int32_t il = sh->layer0; !err && il < sh->layer0 + sh->n_layer; il++) {
        const struct layer *L = &m->layers[il];
        const struct tensor *lm[7] = {L->wq, L->wk, L->wv, L->wo, L->ffn_gate, L->ffn_up,
                                      L->ffn_down};
        for (int k = 0; !err && k < 7; k++) err = read_rows(m->gguf, lm[k]);
    }
    if (!err && shard_has_embedding(sh)) err = read_rows(m->gguf, m->tok_embd);
    const bool is_read = m->output == m->tok_embd && shard_has_embedding(sh);  // tied, above
    if (!err && shard_has_classifier(sh) && !is_read) err = read_rows(m->gguf, m->output);
    return err;
}

/* Copies every matrix that kern_matmul() multiplies into the panel layout
 * (f32/f16/bf16) or the q-panel layout (quantized types; kernels.h), in one
 * anonymous mapping the model owns, and
 * drops the copied pages of the file's bytes (all but a tied output's, which
 * the embedding lookup still reads), so resident memory stays about one copy
 * of the weights. */
static int pack_panels(struct loader *ld) {
    struct engine_model *m = ld->m;
    // The layers of this pipeline stage (all of them at PP 1; shard.h): the other
    // stages' are never packed, so their pages are never read.
    const int32_t l0 = m->shard.layer0;
    const int64_t n_mats = 7 * (int64_t)m->shard.n_layer + 1;
    const struct tensor **mats = calloc((size_t)n_mats, sizeof(*mats));
    if (!mats) return ERR_NOMEM;
    for (int32_t il = l0; il < l0 + m->shard.n_layer; il++) {
        const struct layer *L = &m->layers[il];
        const struct tensor *lm[7] = {L->wq, L->wk, L->wv, L->wo, L->ffn_gate, L->ffn_up,
                                      L->ffn_down};
        memcpy(mats + 7 * (il - l0), lm, sizeof(lm));
    }
    // Only the last stage runs the classifier (its rows of it, shard.h): the others
    // never pack it.
    const int64_t n_packed = shard_has_classifier(&m->shard) ? n_mats : n_mats - 1;
    mats[n_mats - 1] = m->output;
    size_t bytes = 0;
    for (int64_t i = 0; i < n_packed; i++) {
        if (kern_panel_supports(mats[i]->type)) bytes += kern_panel_bytes(mats[i]);
    }
    if (bytes == 0) {
        free(mats);
        return 0;
    }
    void *p = pages_reserve(bytes, true);  // 2 MiB pages: fewer faults, fewer TLB misses
    if (!p) {
        LOG_ERROR("%s: cannot allocate %zu bytes for the weight panels", ld->path, bytes);
        free(mats);
        return ERR_NOMEM;
    }
    m->panels = p;
    m->panels_bytes = bytes;
    // Packing reads every weight once (from the file's bytes in memory,
    // read_matrices): that is the load's long part, so its progress is the bytes
    // packed.
    size_t in_bytes = 0;
    for (int64_t i = 0; i < n_packed; i++) {
        if (kern_panel_supports(mats[i]->type)) {
            in_bytes += span_bytes(mats[i]);
        }
    }
    struct progress pr;
    if (ld->show_progress) progress_begin(&pr, "load", (int64_t)in_bytes, "MiB", (int64_t)1 << 20);
    size_t in_done = 0;
    uint8_t *cur = p;
    for (int64_t i = 0; i < n_packed; i++) {
        if (!kern_panel_supports(mats[i]->type)) continue;
        struct tensor *t = &m->tensors[mats[i] - m->tensors];  // ours: the bound pointers are views
        kern_panel_pack(t, cur);
        t->panels = cur;
        cur += kern_panel_bytes(t);
        // A tied classifier's bytes stay where the embedding is looked up from them.
        if (t != m->tok_embd || !shard_has_embedding(&m->shard)) {
            drop_pages(t->data, span_bytes(t));
        }
        in_done += span_bytes(t);
        if (ld->show_progress) progress_update(&pr, (int64_t)in_done);
    }
    if (ld->show_progress) progress_end(&pr);
    free(mats);
    return 0;
}

/* A rank of a parallel job (shard.h) gives back the file's bytes it never
 * reads, which packing left resident: the matrices of other stages' layers,
 * the other ranks' rows and columns of its own packed matrices, and the
 * classifier where it does not run. Kept: the token embedding (its rows are
 * looked up) and matrices read from the file's bytes (no panel layout). */
static void drop_unread(struct engine_model *m) {
    const struct shard *sh = &m->shard;
    if (shard_job_size(sh) == 1) return;
    for (int32_t il = 0; il < m->hp.n_layer; il++) {
        const struct layer *L = &m->layers[il];
        const bool is_mine = il >= sh->layer0 && il < sh->layer0 + sh->n_layer;
        const struct tensor *lm[7] = {L->wq, L->wk, L->wv, L->wo, L->ffn_gate, L->ffn_up,
                                      L->ffn_down};
        for (int k = 0; k < 7; k++) {
            if (lm[k] == m->tok_embd || (is_mine && !lm[k]->panels)) continue;
            const struct gguf_tensor_info *ti = gguf_tensor_at(m->gguf, lm[k] - m->tensors);
            drop_pages(ti->data, ti->nbytes);
        }
    }
    if (!shard_has_classifier(sh) && m->output != m->tok_embd) {
        const struct gguf_tensor_info *ti = gguf_tensor_at(m->gguf, m->output - m->tensors);
        drop_pages(ti->data, ti->nbytes);
    }
}

static int load_meta(struct loader *ld) {
    struct engine_model *m = ld->m;
    struct gguf_str s;
    int err = gguf_get_str(m->gguf, "general.architecture", &s);
    if (err == ERR_NOTFOUND) {
        LOG_ERROR("%s: general.architecture is missing", ld->path);
        return ERR_FORMAT;
    }
    if (err) return err;
    char arch[64];
    gguf_str_copy(s, arch, sizeof(arch));
    m->arch = s.len < sizeof(arch) ? arch_find(arch) : NULL;
    if (!m->arch) {
        LOG_ERROR("%s: architecture '%s' is not supported (supported: %s)", ld->path, arch,
                  arch_names());
        return ERR_UNSUPPORTED;
    }
    snprintf(ld->prefix, sizeof(ld->prefix), "%s.", m->arch->name);

    const char *base = strrchr(ld->path, '/');
    snprintf(m->name, sizeof(m->name), "%s", base ? base + 1 : ld->path);
    if (gguf_get_str(m->gguf, "general.name", &s) == 0 && s.len > 0) {
        gguf_str_copy(s, m->name, sizeof(m->name));
    }
    if (gguf_get_str(m->gguf, "tokenizer.chat_template", &s) == 0) {
        m->chat_template = malloc((size_t)s.len + 1);
        if (!m->chat_template) return ERR_NOMEM;
        gguf_str_copy(s, m->chat_template, (size_t)s.len + 1);
    }
    return 0;
}

struct engine_model_params engine_model_default_params(void) {
    return (struct engine_model_params){
        .path = NULL, .show_progress = false, .tp_rank = 0, .tp_size = 1, .pp_rank = 0,
        .pp_size = 1, .sp_rank = 0, .sp_size = 1};
}

void engine_model_free(struct engine_model *m) {
    if (!m) return;
    tokenizer_free(m->tok);
    free(m->chat_template);
    free(m->rope_inv_freq);
    free(m->small);
    free(m->layers);
    free(m->tensors);
    pages_release(m->panels, m->panels_bytes);
    gguf_close(m->gguf);
    free(m->next_adapter_id);
    free(m);
}

int engine_tokenizer_load(const char *path, struct tokenizer **out) {
    *out = NULL;
    struct gguf_file *f = NULL;
    int err = gguf_open_sparse(path, &f);  // the header only: tensor data is never read
    if (err) return err;
    if (!gguf_find(f, "tokenizer.ggml.model")) {
        LOG_ERROR("%s: no tokenizer (tokenizer.ggml.model is missing)", path);
        err = ERR_NOTFOUND;
    } else {
        err = tokenizer_load(f, out);  // copies what it keeps
    }
    gguf_close(f);
    return err;
}

int engine_model_load(const struct engine_model_params *p, struct engine_model **out) {
    *out = NULL;
    ASSERT(p && p->path);
    struct engine_model *m = calloc(1, sizeof(*m));
    if (!m) return ERR_NOMEM;
    struct loader ld = {.m = m, .path = p->path, .show_progress = p->show_progress};
    m->next_adapter_id = malloc(sizeof(*m->next_adapter_id));
    if (!m->next_adapter_id) {
        free(m);
        return ERR_NOMEM;
    }
    atomic_init(m->next_adapter_id, 1);
    int err = ERR_INVAL;
    if (p->tp_size < 1 || p->tp_rank < 0 || p->tp_rank >= p->tp_size || p->pp_size < 1 ||
        p->pp_rank < 0 || p->pp_rank >= p->pp_size || p->sp_size < 1 || p->sp_rank < 0 ||
        p->sp_rank >= p->sp_size || (p->sp_size > 1 && (p->tp_size > 1 || p->pp_size > 1))) {
        LOG_ERROR("%s: tensor-parallel rank %d of %d, pipeline stage %d of %d, sequence-parallel "
                  "rank %d of %d is not a rank (SP goes with neither TP nor PP)",
                  p->path, p->tp_rank, p->tp_size, p->pp_rank, p->pp_size, p->sp_rank,
                  p->sp_size);
        goto fail;
    }
    // The header now, tensor data as the slices this rank needs are known.
    err = gguf_open_sparse(p->path, &m->gguf);
    if (err) goto fail;
    // Without TP or PP this process reads every tensor (SP ranks hold all).
    if (p->tp_size == 1 && p->pp_size == 1) gguf_will_read_all(m->gguf);
    if ((err = load_meta(&ld)) || (err = load_hparams(&ld)) || (err = load_tensors(&ld)) ||
        (err = read_vectors(&ld)) || (err = bind_tensors(&ld)) || (err = shard_layers(&ld, p)) ||
        (err = read_matrices(&ld)) || (err = pack_panels(&ld))) {
        goto fail;
    }
    drop_unread(m);
    gguf_seal(m->gguf);  // never read from the file again
    m->info.file_bytes_read = gguf_data_bytes_read(m->gguf);
    if (shard_job_size(&m->shard) > 1) {
        LOG_INFO("%s: rank %d of %d read %zu bytes of tensor data (%.1f of %.1f MiB) and "
                 "%zu of the header", p->path, shard_job_rank(&m->shard),
                 shard_job_size(&m->shard), m->info.file_bytes_read,
                 (double)m->info.file_bytes_read / (1 << 20),
                 (double)m->info.weight_bytes / (1 << 20), gguf_header_bytes_read(m->gguf));
    }
    if (gguf_find(m->gguf, "tokenizer.ggml.model")) {
        err = tokenizer_load(m->gguf, &m->tok);
        if (err) goto fail;
    }

    const struct hparams *hp = &m->hp;
    struct engine_model_info *info = &m->info;
    info->arch = m->arch->name;
    info->name = m->name;
    info->n_vocab = hp->n_vocab;
    info->n_ctx_train = hp->n_ctx_train;
    info->n_embd = hp->n_embd;
    info->n_layer = hp->n_layer;
    info->n_head = hp->n_head;
    info->n_head_kv = hp->n_head_kv;
    info->head_dim = hp->head_dim;
    info->n_ff = hp->n_ff;
    info->sliding_window = hp->sliding_window;
    *out = m;
    return 0;

fail:
    engine_model_free(m);
    return err;
}

uint64_t model_next_adapter_id(const struct engine_model *m) {
    return atomic_fetch_add(m->next_adapter_id, 1);
}

const struct engine_model_info *engine_model_get_info(const struct engine_model *m) {
    return &m->info;
}

const struct tokenizer *engine_model_tokenizer(const struct engine_model *m) { return m->tok; }

const char *engine_model_chat_template(const struct engine_model *m) { return m->chat_template; }

bool engine_model_is_eog(const struct engine_model *m, int32_t token) {
    return m->tok && tokenizer_is_eog(m->tok, token);
}
