/*
 * adapter.c - applying adapters inside the forward pass: sorting a batch's
 * tokens by adapter into chunks, the LoRA update and the bottleneck module.
 *
 * An apply is one parallel region whose items are chunks (up to
 * ADAPTER_CHUNK_TOKENS tokens of one adapter). For its chunk a thread
 *   1. computes each token's rank vector v = s A x[t] (bottleneck:
 *      s act(D h[t] + bd)) by r row dots, into the chunk's block of tmp;
 *   2. multiplies B with the chunk's rank vectors, all tokens at once (the
 *      panel product: each weight read once per chunk), into out;
 *   3. adds out into the tokens' rows of y (scatter). Chunks hold distinct
 *      tokens, so no two threads write the same row.
 * A token's B product needs only its own rank vector, so no barrier is
 * needed between 1 and 2: one region per apply, four per layer. At decode
 * with one adapter per request a chunk is one token and every adapter's
 * matrices stream through one core; one adapter's long prefill chunk is
 * spread over the threads eight tokens at a time, its matrices then read
 * from cache after the first chunk. A batch without adapter tokens, or whose
 * adapters leave a projection alone, returns before the region starts.
 */
#include "engine/model/adapter.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "engine/base/alloc.h"
#include "engine/base/err.h"
#include "engine/kernels/kernels.h"
#include "engine/kernels/threadpool.h"
#include "engine/model/model.h"

int32_t adapter_tmp_floats(const struct engine_adapter *a) {
    int32_t n = ADAPTER_MAX_TARGETS * a->max_rank;
    return n > a->max_width ? n : a->max_width;
}

int adapter_batch_init(struct adapter_batch *ab, int32_t max_tokens, int64_t out_floats) {
    memset(ab, 0, sizeof(*ab));
    ab->token = malloc((size_t)max_tokens * sizeof(*ab->token));
    ab->chunks = malloc((size_t)max_tokens * sizeof(*ab->chunks));
    ab->out = malloc((size_t)max_tokens * (size_t)out_floats * sizeof(float));
    ab->out_floats = out_floats;
    if (!ab->token || !ab->chunks || !ab->out) return ERR_NOMEM;
    return 0;
}

int adapter_batch_reserve(struct adapter_batch *ab, int32_t max_tokens, int32_t width) {
    if (width <= ab->width) return 0;
    float *tmp = malloc((size_t)max_tokens * (size_t)width * sizeof(float));
    if (!tmp) return ERR_NOMEM;
    free(ab->tmp);
    ab->tmp = tmp;
    ab->width = width;
    return 0;
}

void adapter_batch_deinit(struct adapter_batch *ab) {
    free(ab->token);
    free(ab->chunks);
    free(ab->tmp);
    free(ab->out);
    memset(ab, 0, sizeof(*ab));
}

void adapter_batch_build(struct adapter_batch *ab, const int32_t *adapter, int32_t n_tokens,
                         const struct engine_adapter *const *slots, int32_t n_slots,
                         int32_t *count) {
    ab->n_tokens = 0;
    ab->n_chunks = 0;
    if (!adapter || n_slots == 0) return;
    // Counting sort by slot: stable, so each slot's tokens keep batch order.
    // count[s + 1] counts slot s, then the prefix sums make count[s] its start.
    for (int32_t s = 0; s <= n_slots; s++) count[s] = 0;
    for (int32_t t = 0; t < n_tokens; t++) {
        if (adapter[t] >= 0) count[adapter[t] + 1]++;
    }
    for (int32_t s = 0; s < n_slots; s++) {
        const int32_t n = count[s + 1];
        count[s + 1] += count[s];
        // The slot's tokens [count[s], count[s] + n), in chunks.
        for (int32_t k = 0; k < n; k += ADAPTER_CHUNK_TOKENS) {
            const int32_t m = n - k < ADAPTER_CHUNK_TOKENS ? n - k : ADAPTER_CHUNK_TOKENS;
            ab->chunks[ab->n_chunks++] = (struct adapter_chunk){slots[s], count[s] + k, m};
        }
    }
    for (int32_t t = 0; t < n_tokens; t++) {
        const int32_t s = adapter[t];
        if (s < 0) continue;
        DASSERT(s < n_slots && slots[s]);
        ab->token[count[s]++] = t;
    }
    ab->n_tokens = count[n_slots];
}

static float act_apply(enum adapter_act act, float z) {
    switch (act) {
    case ADAPTER_ACT_RELU:
        return z > 0.0f ? z : 0.0f;
    case ADAPTER_ACT_GELU:
        return 0.5f * z * (1.0f + erff(z * 0.70710678118654752f));
    case ADAPTER_ACT_SILU:
        return z / (1.0f + expf(-z));
    }
    UNREACHABLE();
}

/* Row r of a [rows][n] matrix of type t, dotted with x [n]. */
static float row_dot(enum quant_type t, const void *m, int64_t r, const float *x, int64_t n) {
    const struct kern_dispatch *kd = kern_get();
    switch (t) {
    case QUANT_F32:
        return kd->dot_f32((const float *)m + r * n, x, n);
    case QUANT_F16:
        return kd->dot_f16((const uint16_t *)m + r * n, x, n);
    case QUANT_BF16:
        return kd->dot_bf16((const uint16_t *)m + r * n, x, n);
    default:
        UNREACHABLE();
    }
}

static kern_panel_fn panel_fn(enum quant_type t) {
    const struct kern_panel *kp = &kern_get()->panel;
    switch (t) {
    case QUANT_F32:
        return kp->f32;
    case QUANT_F16:
        return kp->f16;
    case QUANT_BF16:
        return kp->bf16;
    default:
        UNREACHABLE();
    }
}

/* One apply: up to ADAPTER_MAX_TARGETS LoRA projections sharing x, or one
 * bottleneck module (is_bn; x == y[0] == h). */
struct apply_job {
    const struct adapter_batch *ab;
    int32_t il;
    bool is_bn;
    enum adapter_pos pos;           // bottleneck only
    const float *x;                 // [T][n_in]
    int32_t n_in;
    int32_t n_targets;
    struct adapter_target t[ADAPTER_MAX_TARGETS];
};

static const struct adapter_lora *lora_of(const struct apply_job *j, const struct adapter_chunk *c,
                                          int32_t i) {
    const struct engine_adapter *a = c->adapter;
    if (!a->lora) return NULL;
    const struct adapter_lora *l = &a->lora[(size_t)j->il * ADAPTER_PROJ_COUNT + j->t[i].proj];
    return l->rank > 0 ? l : NULL;
}

static const struct adapter_bottleneck *bn_of(const struct apply_job *j,
                                              const struct adapter_chunk *c) {
    const struct engine_adapter *a = c->adapter;
    if (!a->bn) return NULL;
    const struct adapter_bottleneck *b = &a->bn[(size_t)j->il * ADAPTER_POS_COUNT + j->pos];
    return b->width > 0 ? b : NULL;
}

/* Rank of target i for chunk c (0: not changed), or the bottleneck's width. */
static int32_t rank_of(const struct apply_job *j, const struct adapter_chunk *c, int32_t i) {
    if (j->is_bn) {
        const struct adapter_bottleneck *b = bn_of(j, c);
        return b ? b->width : 0;
    }
    const struct adapter_lora *l = lora_of(j, c, i);
    return l ? l->rank : 0;
}

/* The matrices of one target of a chunk's adapter, whatever the kind. */
struct target_mats {
    int32_t rank;
    float scale;
    enum quant_type a_type;
    const void *a;           // [rank][n_in] rows
    enum quant_type b_type;
    const void *b;           // [n_out][rank] in panels
    const float *a_bias;     // [rank] or NULL (bottleneck: bd)
    const float *b_bias;     // [n_out] or NULL (bottleneck: s bu)
    enum adapter_act act;    // bottleneck only
};

static bool mats_of(const struct apply_job *j, const struct adapter_chunk *c, int32_t i,
                    struct target_mats *m) {
    if (j->is_bn) {
        const struct adapter_bottleneck *b = bn_of(j, c);
        if (!b) return false;
        *m = (struct target_mats){b->width, b->scale, b->down_type, b->down, b->up_type,
                                  b->up, b->down_b, b->up_b, c->adapter->act};
        return true;
    }
    const struct adapter_lora *l = lora_of(j, c, i);
    if (!l) return false;
    *m = (struct target_mats){l->rank, l->scale, l->a_type, l->a, l->b_type, l->b, NULL, NULL,
                              ADAPTER_ACT_RELU};
    return true;
}

/* The items: chunks. Per target: rank vectors, the panel product, the scatter. */
static void chunk_items(void *arg, int64_t begin, int64_t end, int32_t ith, int32_t nth) {
    (void)ith;
    (void)nth;
    const struct apply_job *j = arg;
    const struct adapter_batch *ab = j->ab;
    for (int64_t ci = begin; ci < end; ci++) {
        const struct adapter_chunk *c = &ab->chunks[ci];
        float *v = ab->tmp + (size_t)c->k0 * (size_t)ab->width;    // [c->n][rank], per target
        float *o = ab->out + (size_t)c->k0 * (size_t)ab->out_floats;  // [c->n][n_out], per target
        for (int32_t i = 0; i < j->n_targets; i++) {
            const int32_t n_out = j->t[i].n_out;
            struct target_mats m;
            if (!mats_of(j, c, i, &m)) continue;
            // 1. v[t] = s A x[t] (bottleneck: s act(D h[t] + bd))
            for (int32_t k = 0; k < c->n; k++) {
                const float *x = j->x + (size_t)ab->token[c->k0 + k] * (size_t)j->n_in;
                float *vk = v + (size_t)k * (size_t)m.rank;
                for (int32_t r = 0; r < m.rank; r++) {
                    const float z = row_dot(m.a_type, m.a, r, x, j->n_in);
                    vk[r] = m.a_bias ? m.scale * act_apply(m.act, z + m.a_bias[r]) : m.scale * z;
                }
            }
            // 2. out[t] = B v[t] for the chunk's tokens at once
            const int64_t n_panels = (n_out + KERN_PANEL_ROWS - 1) / KERN_PANEL_ROWS;
            panel_fn(m.b_type)(v, c->n, m.b, m.rank, n_out, 0, n_panels, o);
            // 3. y[t] += out[t] (bottleneck: + s bu)
            for (int32_t k = 0; k < c->n; k++) {
                float *y = j->t[i].y + (size_t)ab->token[c->k0 + k] * (size_t)n_out;
                const float *src = o + (size_t)k * (size_t)n_out;
                if (m.b_bias) {
                    for (int32_t col = 0; col < n_out; col++) y[col] += src[col] + m.b_bias[col];
                } else {
                    for (int32_t col = 0; col < n_out; col++) y[col] += src[col];
                }
            }
            v += (size_t)c->n * (size_t)m.rank;
            o += (size_t)c->n * (size_t)n_out;
        }
    }
}

static void run(struct threadpool *pool, struct apply_job *j) {
    const struct adapter_batch *ab = j->ab;
    bool any = false;
    for (int32_t ci = 0; ci < ab->n_chunks && !any; ci++) {
        for (int32_t i = 0; i < j->n_targets && !any; i++) {
            any = rank_of(j, &ab->chunks[ci], i) > 0;
        }
    }
    if (!any) return;
    int64_t n_out = 0;
    for (int32_t i = 0; i < j->n_targets; i++) n_out += j->t[i].n_out;
    ASSERT(n_out <= ab->out_floats);
    threadpool_run(pool, ab->n_chunks, 1, chunk_items, j);
}

void adapter_apply_lora(struct threadpool *pool, const struct adapter_batch *ab, int32_t il,
                        const float *x, int32_t n_in, const struct adapter_target *targets,
                        int32_t n_targets) {
    if (ab->n_tokens == 0) return;
    ASSERT(n_targets >= 1 && n_targets <= ADAPTER_MAX_TARGETS);
    struct apply_job j = {.ab = ab, .il = il, .x = x, .n_in = n_in, .n_targets = n_targets};
    for (int32_t i = 0; i < n_targets; i++) j.t[i] = targets[i];
    run(pool, &j);
}

void adapter_apply_bottleneck(struct threadpool *pool, const struct adapter_batch *ab,
                              int32_t il, enum adapter_pos pos, float *h, int32_t n_embd) {
    if (ab->n_tokens == 0) return;
    struct apply_job j = {.ab = ab, .il = il, .is_bn = true, .pos = pos, .x = h, .n_in = n_embd,
                          .n_targets = 1};
    j.t[0] = (struct adapter_target){.proj = ADAPTER_PROJ_COUNT, .y = h, .n_out = n_embd};
    run(pool, &j);
}

void adapter_free(struct engine_adapter *a) {
    if (!a) return;
    if (a->lora) {
        for (int32_t i = 0; i < a->n_layer * ADAPTER_PROJ_COUNT; i++) {
            free(a->lora[i].a);
            free(a->lora[i].b);
        }
        free(a->lora);
    }
    if (a->bn) {
        for (int32_t i = 0; i < a->n_layer * ADAPTER_POS_COUNT; i++) {
            free(a->bn[i].down);
            free(a->bn[i].down_b);
            free(a->bn[i].up);
            free(a->bn[i].up_b);
        }
        free(a->bn);
    }
    free(a->path);
    free(a);
}

/* ---- panels, and cutting an adapter to a rank's slice ------------------------- */

size_t adapter_elem_size(enum quant_type t) { return t == QUANT_F32 ? 4 : 2; }

/* rows as the 2-D tensor the panel packer takes. */
static struct tensor rows_tensor(enum quant_type t, const void *rows, int64_t n_rows, int64_t k) {
    return (struct tensor){.type = t, .n_dims = 2, .ne = {k, n_rows, 1, 1},
                           .row_bytes = (size_t)k * adapter_elem_size(t), .data = rows};
}

size_t adapter_panel_bytes(enum quant_type t, int64_t n_rows, int64_t k) {
    const struct tensor w = rows_tensor(t, NULL, n_rows, k);
    return (kern_panel_bytes(&w) + 63) / 64 * 64;
}

void *adapter_panels_from_rows(enum quant_type t, const void *rows, int64_t n_rows, int64_t k,
                               size_t *bytes) {
    const struct tensor w = rows_tensor(t, rows, n_rows, k);
    const size_t n = adapter_panel_bytes(t, n_rows, k);
    void *p = aligned_alloc(64, n);
    if (!p) return NULL;
    kern_panel_pack(&w, p);
    *bytes += n;
    return p;
}

/* Rows [r0, r0 + n) of a matrix of k columns in panels (kernels.h: element
 * (i, j) at ((i / 16) k + j) 16 + i % 16), as rows [n][k] into dst. */
static void panel_rows(const void *pw, enum quant_type t, int64_t k, int64_t r0, int64_t n,
                       void *dst) {
    const size_t esz = adapter_elem_size(t);
    for (int64_t i = 0; i < n; i++) {
        const int64_t g = r0 + i;
        for (int64_t j = 0; j < k; j++) {
            const size_t at = ((size_t)(g / KERN_PANEL_ROWS) * (size_t)k + (size_t)j) *
                                  KERN_PANEL_ROWS + (size_t)(g % KERN_PANEL_ROWS);
            memcpy((uint8_t *)dst + ((size_t)i * (size_t)k + (size_t)j) * esz,
                   (const uint8_t *)pw + at * esz, esz);
        }
    }
}

/* A malloc'ed copy of src's n bytes (NULL when out of memory); adds n to *bytes. */
static void *copy_bytes(const void *src, size_t n, size_t *bytes) {
    void *p = malloc(n ? n : 1);
    if (!p) return NULL;
    memcpy(p, src, n);
    *bytes += n;
    return p;
}

/* The slice of projection p's update a rank keeps (model/shard.h): B's rows
 * [*row0, *row0 + *n_rows) of a column-parallel projection, or A's columns
 * [*col0, *col0 + *n_cols) of a row-parallel one; the other stays whole. */
static void proj_slice(const struct shard *sh, int32_t head_dim, enum adapter_proj p,
                       const struct adapter_lora *l, int32_t *row0, int32_t *n_rows,
                       int32_t *col0, int32_t *n_cols) {
    *row0 = 0;
    *n_rows = l->n_out;
    *col0 = 0;
    *n_cols = l->n_in;
    switch (p) {
    case ADAPTER_PROJ_Q: *row0 = sh->head0 * head_dim; *n_rows = sh->n_head * head_dim; return;
    case ADAPTER_PROJ_K:
    case ADAPTER_PROJ_V:
        *row0 = sh->head_kv0 * head_dim;
        *n_rows = sh->n_head_kv * head_dim;
        return;
    case ADAPTER_PROJ_GATE:
    case ADAPTER_PROJ_UP: *row0 = sh->ff0; *n_rows = sh->n_ff; return;
    case ADAPTER_PROJ_O: *col0 = sh->head0 * head_dim; *n_cols = sh->n_head * head_dim; return;
    case ADAPTER_PROJ_DOWN: *col0 = sh->ff0; *n_cols = sh->n_ff; return;
    case ADAPTER_PROJ_COUNT: break;
    }
    UNREACHABLE();
}

/* dst: src's update cut to sh (dst's matrices NULL when out of memory). */
static int cut_lora(const struct adapter_lora *src, const struct shard *sh, int32_t head_dim,
                    enum adapter_proj p, struct adapter_lora *dst, size_t *bytes) {
    int32_t row0, n_rows, col0, n_cols;
    proj_slice(sh, head_dim, p, src, &row0, &n_rows, &col0, &n_cols);
    *dst = *src;
    dst->b = NULL;
    dst->n_out = n_rows;
    dst->n_in = n_cols;
    const size_t a_esz = adapter_elem_size(src->a_type);
    const size_t a_bytes = (size_t)src->rank * (size_t)n_cols * a_esz;
    dst->a = malloc(a_bytes);
    void *b_rows = malloc((size_t)n_rows * (size_t)src->rank * adapter_elem_size(src->b_type));
    if (dst->a && b_rows) {
        for (int32_t r = 0; r < src->rank; r++) {  // A [rank][n_in]: columns [col0, +n_cols)
            memcpy((uint8_t *)dst->a + (size_t)r * n_cols * a_esz,
                   (const uint8_t *)src->a + ((size_t)r * src->n_in + (size_t)col0) * a_esz,
                   (size_t)n_cols * a_esz);
        }
        *bytes += a_bytes;
        panel_rows(src->b, src->b_type, src->rank, row0, n_rows, b_rows);
        dst->b = adapter_panels_from_rows(src->b_type, b_rows, n_rows, src->rank, bytes);
    }
    free(b_rows);
    return dst->a && dst->b ? 0 : ERR_NOMEM;
}

/* dst: a whole copy of src (its matrices NULL when out of memory). */
static int copy_bottleneck(const struct adapter_bottleneck *src, struct adapter_bottleneck *dst,
                           size_t *bytes) {
    *dst = *src;
    const size_t m = (size_t)src->width, e = (size_t)src->n_embd;
    dst->down = copy_bytes(src->down, adapter_bn_down_bytes(src), bytes);
    dst->down_b = copy_bytes(src->down_b, m * sizeof(float), bytes);
    dst->up_b = copy_bytes(src->up_b, e * sizeof(float), bytes);
    const size_t up_bytes = adapter_bn_up_bytes(src);
    dst->up = aligned_alloc(64, up_bytes);
    if (dst->up) {
        memcpy(dst->up, src->up, up_bytes);
        *bytes += up_bytes;
    }
    return dst->down && dst->down_b && dst->up && dst->up_b ? 0 : ERR_NOMEM;
}

int adapter_cut(struct engine_adapter *full, const struct engine_model *m,
                struct engine_adapter **out) {
    *out = NULL;
    const struct shard *sh = &m->shard;
    if (sh->size == 1 && sh->n_stages == 1) {
        *out = engine_adapter_retain(full);
        return 0;
    }
    struct engine_adapter *a = calloc(1, sizeof(*a));
    if (!a) return ERR_NOMEM;
    atomic_init(&a->n_refs, 1);
    a->model = m;
    a->info = full->info;
    a->info.bytes = 0;
    a->n_layer = full->n_layer;
    a->act = full->act;
    a->path = strdup(full->path);
    a->info.path = a->path;
    int err = a->path ? 0 : ERR_NOMEM;
    if (!err && full->lora) {
        a->lora = calloc((size_t)a->n_layer * ADAPTER_PROJ_COUNT, sizeof(*a->lora));
        if (!a->lora) err = ERR_NOMEM;
    }
    if (!err && full->bn) {
        a->bn = calloc((size_t)a->n_layer * ADAPTER_POS_COUNT, sizeof(*a->bn));
        if (!a->bn) err = ERR_NOMEM;
    }
    // The stage's layers only; the others keep rank 0 / width 0 (left alone).
    for (int32_t il = sh->layer0; il < sh->layer0 + sh->n_layer && !err; il++) {
        for (int32_t p = 0; full->lora && p < ADAPTER_PROJ_COUNT && !err; p++) {
            const size_t i = (size_t)il * ADAPTER_PROJ_COUNT + (size_t)p;
            if (full->lora[i].rank == 0) continue;
            err = cut_lora(&full->lora[i], sh, m->hp.head_dim, (enum adapter_proj)p, &a->lora[i],
                           &a->info.bytes);
            if (a->lora[i].rank > a->max_rank) a->max_rank = a->lora[i].rank;
        }
        for (int32_t q = 0; full->bn && q < ADAPTER_POS_COUNT && !err; q++) {
            const size_t i = (size_t)il * ADAPTER_POS_COUNT + (size_t)q;
            if (full->bn[i].width == 0) continue;
            err = copy_bottleneck(&full->bn[i], &a->bn[i], &a->info.bytes);
            if (a->bn[i].width > a->max_width) a->max_width = a->bn[i].width;
        }
    }
    if (err) {
        adapter_free(a);
        return err;
    }
    *out = a;
    return 0;
}
