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
