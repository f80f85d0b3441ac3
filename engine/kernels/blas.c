/*
 * blas.c - the only OpenBLAS user: matrix products over a batch of tokens.
 * Weights with panels (kernels.h) go to the panel or q-panel products, split
 * by panels across the pool; OpenBLAS serves unpacked f32/f16/bf16 weights
 * above KERN_GEMV_MAX_TOKENS and unpacked quantized ones above
 * kern_scratch.qdot_max_tokens.
 *
 * Parallelism is ours, not OpenBLAS's: OpenBLAS is told to use one thread and
 * each pool thread multiplies the whole batch by its own slice of weight rows.
 * One pool means no oversubscription of the cores (llama.cpp with a threaded
 * OpenBLAS next to its own pool was 4x slower at prefill on our machines), and
 * a slice per thread is also what f16/bf16 tile conversion wants.
 *
 * NOTE: decode does not use cblas_sgemv: on our machines OpenBLAS 0.3.21's
 * sgemv streamed 13 GB/s on one thread where a plain AVX2 row dot streams 23.
 */
#include <cblas.h>
#include <stdlib.h>
#include <string.h>

#include "engine/base/alloc.h"
#include "engine/base/err.h"
#define LOG_TAG "kern"
#include "engine/base/log.h"
#include "engine/kernels/kernels.h"
#include "engine/kernels/threadpool.h"

// Declared by OpenBLAS (openblas_config.h) but not by every cblas.h.
char *openblas_get_corename(void);
void openblas_set_num_threads(int num_threads);

#define KERN_TILE_ROWS 64
#define KERN_ROW_GRAIN 16

int kern_scratch_init(struct kern_scratch *s, int32_t n_threads, int64_t max_k) {
    memset(s, 0, sizeof(*s));
    s->n_threads = n_threads;
    s->tile_rows = KERN_TILE_ROWS;
    s->max_k = max_k;
    s->qdot_max_tokens = KERN_QDOT_MAX_TOKENS;
    s->tiles = calloc((size_t)n_threads, sizeof(float *));
    if (!s->tiles) return ERR_NOMEM;
    for (int32_t i = 0; i < n_threads; i++) {
        s->tiles[i] = malloc((size_t)KERN_TILE_ROWS * (size_t)max_k * sizeof(float));
        if (!s->tiles[i]) return ERR_NOMEM;
    }
    return 0;
}

void kern_scratch_free(struct kern_scratch *s) {
    if (s->tiles) {
        for (int32_t i = 0; i < s->n_threads; i++) free(s->tiles[i]);
    }
    free(s->tiles);
    free(s->act);
    memset(s, 0, sizeof(*s));
}

struct matmul_job {
    struct kern_scratch *scratch;
    const struct tensor *w;
    const float *x;     // [n_tokens][k]
    int64_t n_tokens;
    float *y;           // [n_tokens][n]
    const uint8_t *xq;  // [n_tokens][xq_row] activations in the partner type (integer path)
    size_t xq_row;      // bytes of one quantized activation row
};

static bool is_quantized(enum quant_type t) {
    return t != QUANT_F32 && t != QUANT_F16 && t != QUANT_BF16;
}

/* y[:, r0:r1] = x * W[r0:r1]^T for f32 weights rows w_rows (r1 - r0 rows of k). */
static void gemm_rows(const float *x, int64_t n_tokens, const float *w_rows, int64_t n_rows,
                      int64_t k, int64_t ldw, float *y, int64_t ldy) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (blasint)n_tokens, (blasint)n_rows,
                (blasint)k, 1.0f, x, (blasint)k, w_rows, (blasint)ldw, 0.0f, y, (blasint)ldy);
}

/* Decode path: each weight row is read once, in its own type, and dotted with
 * every token's activations (which stay in L1). */
static void gemv_rows(const struct matmul_job *j, int64_t r0, int64_t r1) {
    const struct tensor *w = j->w;
    const int64_t k = w->ne[0];
    const int64_t n = w->ne[1];
    const struct kern_dispatch *kd = kern_get();
    for (int64_t r = r0; r < r1; r++) {
        const void *row = tensor_row(w, r);
        for (int64_t t = 0; t < j->n_tokens; t++) {
            const float *xt = j->x + t * k;
            float v;
            switch (w->type) {
            case QUANT_F32: v = kd->dot_f32(row, xt, k); break;
            case QUANT_F16: v = kd->dot_f16(row, xt, k); break;
            case QUANT_BF16: v = kd->dot_bf16(row, xt, k); break;
            default: UNREACHABLE();
            }
            j->y[t * n + r] = v;
        }
    }
}

static void matmul_slice(void *arg, int64_t r0, int64_t r1, int32_t ith, int32_t nth) {
    (void)nth;
    const struct matmul_job *j = arg;
    const struct tensor *w = j->w;
    const int64_t k = w->ne[0];
    const int64_t n = w->ne[1];
    if (j->n_tokens <= KERN_GEMV_MAX_TOKENS && !is_quantized(w->type)) {
        gemv_rows(j, r0, r1);
        return;
    }
    if (w->type == QUANT_F32) {
        // rows r0.. in place; the stride may exceed k (a column slice, tensor.h)
        gemm_rows(j->x, j->n_tokens, tensor_row(w, r0), r1 - r0, k,
                  (int64_t)(w->row_bytes / sizeof(float)), j->y + r0, n);
        return;
    }
    const struct kern_dispatch *kd = kern_get();
    kern_to_f32_fn conv = w->type == QUANT_F16    ? kd->f16_to_f32
                          : w->type == QUANT_BF16 ? kd->bf16_to_f32
                                                  : quant_traits(w->type)->to_f32;
    ASSERT(k <= j->scratch->max_k);
    float *tile = j->scratch->tiles[ith];  // [tile_rows][k]
    for (int64_t r = r0; r < r1; r += j->scratch->tile_rows) {
        int64_t rows = r1 - r < j->scratch->tile_rows ? r1 - r : j->scratch->tile_rows;
        for (int64_t i = 0; i < rows; i++) conv(tensor_row(w, r + i), tile + i * k, k);
        gemm_rows(j->x, j->n_tokens, tile, rows, k, k, j->y + r, n);
    }
}

/* Integer path: each weight row is read once and dotted with every token's
 * quantized activations (which stay in L1). */
static void qdot_slice(void *arg, int64_t r0, int64_t r1, int32_t ith, int32_t nth) {
    (void)ith;
    (void)nth;
    const struct matmul_job *j = arg;
    const struct tensor *w = j->w;
    const int64_t k = w->ne[0];
    const int64_t n = w->ne[1];
    const kern_vec_dot_fn dot = kern_get()->vec_dot[w->type];
    for (int64_t r = r0; r < r1; r++) {
        const void *row = tensor_row(w, r);
        for (int64_t t = 0; t < j->n_tokens; t++) {
            j->y[t * n + r] = dot(row, j->xq + (size_t)t * j->xq_row, k);
        }
    }
}

/* Quantizes tokens [t0, t1) of x to the partner type (into act, integer path)
 * or rounds them through it back to f32 (into act as floats, sgemm path). */
static void act_slice(void *arg, int64_t t0, int64_t t1, int32_t ith, int32_t nth) {
    (void)nth;
    const struct matmul_job *j = arg;
    const int64_t k = j->w->ne[0];
    const struct quant_traits *vd = quant_traits(quant_traits(j->w->type)->vec_dot_type);
    uint8_t *act = j->scratch->act;
    for (int64_t t = t0; t < t1; t++) {
        if (j->n_tokens <= j->scratch->qdot_max_tokens) {
            vd->from_f32(j->x + t * k, act + (size_t)t * j->xq_row, k);
        } else {
            // the thread's tile holds the quantized row on its way back to f32
            void *tmp = j->scratch->tiles[ith];
            vd->from_f32(j->x + t * k, tmp, k);
            vd->to_f32(tmp, (float *)act + t * k, k);
        }
    }
}

static void reserve_act(struct kern_scratch *s, size_t bytes) {
    if (s->act_bytes >= bytes) return;
    free(s->act);
    s->act = malloc(bytes);
    // NOTE: bounded by the ctx's batch (tokens x longest row); kern_matmul()
    // has no error return, and this runs once per new batch-size maximum.
    if (!s->act) {
        LOG_ERROR("%s: cannot allocate %zu bytes of activations", __func__, bytes);
        abort();
    }
    s->act_bytes = bytes;
}

void kern_matmul(struct threadpool *pool, struct kern_scratch *scratch, const struct tensor *w,
                 const float *x, int64_t n_tokens, float *y) {
    ASSERT(w->ne[2] == 1 && w->ne[3] == 1);
    struct matmul_job job = {.scratch = scratch, .w = w, .x = x, .n_tokens = n_tokens, .y = y};
    if (w->panels) {  // the panel and q-panel products: a group of one
        const struct kern_product one = {.w = w, .y = y};
        kern_matmul_group(pool, scratch, x, n_tokens, &one, 1, NULL, NULL);
        return;
    }
    if (!is_quantized(w->type)) {
        threadpool_run(pool, w->ne[1], KERN_ROW_GRAIN, matmul_slice, &job);
        return;
    }
    const int64_t k = w->ne[0];
    const enum quant_type vd = quant_traits(w->type)->vec_dot_type;
    ASSERT(kern_get()->vec_dot[w->type] && k <= scratch->max_k);
    job.xq_row = quant_row_size(vd, k);
    if (n_tokens <= scratch->qdot_max_tokens) {
        reserve_act(scratch, (size_t)n_tokens * job.xq_row);
        // a few rows are cheaper to quantize here than a parallel region costs
        if (n_tokens <= KERN_GEMV_MAX_TOKENS) {
            act_slice(&job, 0, n_tokens, 0, 1);
        } else {
            threadpool_run(pool, n_tokens, 1, act_slice, &job);
        }
        job.xq = scratch->act;
        threadpool_run(pool, w->ne[1], KERN_ROW_GRAIN, qdot_slice, &job);
        return;
    }
    reserve_act(scratch, (size_t)n_tokens * (size_t)k * sizeof(float));
    threadpool_run(pool, n_tokens, 1, act_slice, &job);
    job.x = scratch->act;
    threadpool_run(pool, w->ne[1], KERN_ROW_GRAIN, matmul_slice, &job);
}

/* A group of products of one x (kern_matmul_group): the items of its one
 * region are the panels of all its products, one after another, or with an
 * epilogue the panels of one (all have the same rows), every product and then
 * the epilogue run on each thread's panels. */
struct group_job {
    const struct kern_product *p;
    int32_t n;
    const float *x;          // [n_tokens][k]
    int64_t n_tokens;
    const uint8_t *xq[KERN_GROUP_MAX];  // product i's activation rows (q-panels), or NULL
    size_t xq_row[KERN_GROUP_MAX];
    bool quantizes[KERN_GROUP_MAX];     // product i writes xq[i] (the first of its type)
    int64_t first[KERN_GROUP_MAX + 1];  // product i's panels: items [first[i], first[i + 1])
    kern_rows_fn epilogue;
    void *arg;
};

static int64_t n_panels_of(const struct tensor *w) {
    return (w->ne[1] + KERN_PANEL_ROWS - 1) / KERN_PANEL_ROWS;
}

/* Panels [p0, p1) of product i. */
static void group_panels(const struct group_job *g, int32_t i, int64_t p0, int64_t p1) {
    const struct tensor *w = g->p[i].w;
    const struct kern_dispatch *kd = kern_get();
    if (g->xq[i]) {
        kd->qpanel[w->type](g->xq[i], g->n_tokens, w->panels, w->ne[0], w->ne[1], p0, p1,
                            g->p[i].y);
        return;
    }
    const struct kern_panel *kp = &kd->panel;
    kern_panel_fn fn = w->type == QUANT_F32 ? kp->f32 : w->type == QUANT_F16 ? kp->f16 : kp->bf16;
    fn(g->x, g->n_tokens, w->panels, w->ne[0], w->ne[1], p0, p1, g->p[i].y);
}

static void group_slice(void *arg, int64_t b, int64_t e, int32_t ith, int32_t nth) {
    (void)ith;
    (void)nth;
    const struct group_job *g = arg;
    if (g->epilogue) {
        for (int32_t i = 0; i < g->n; i++) group_panels(g, i, b, e);
        const int64_t n = g->p[0].w->ne[1];
        const int64_t r1 = e * KERN_PANEL_ROWS;
        g->epilogue(g->arg, b * KERN_PANEL_ROWS, r1 < n ? r1 : n);
        return;
    }
    for (int32_t i = 0; i < g->n; i++) {
        const int64_t p0 = b > g->first[i] ? b : g->first[i];
        const int64_t p1 = e < g->first[i + 1] ? e : g->first[i + 1];
        if (p0 < p1) group_panels(g, i, p0 - g->first[i], p1 - g->first[i]);
    }
}

/* Rows [b, e) of the epilogue, when the products ran one by one. */
static void epilogue_slice(void *arg, int64_t b, int64_t e, int32_t ith, int32_t nth) {
    (void)ith;
    (void)nth;
    const struct group_job *g = arg;
    g->epilogue(g->arg, b, e);
}

/* Tokens [t0, t1) of x quantized once per weight type of the group. */
static void group_act_slice(void *arg, int64_t t0, int64_t t1, int32_t ith, int32_t nth) {
    (void)ith;
    (void)nth;
    const struct group_job *g = arg;
    const kern_qpanel_act_fn quantize = kern_get()->qpanel_act;
    for (int32_t i = 0; i < g->n; i++) {
        const struct tensor *w = g->p[i].w;
        if (!g->quantizes[i]) continue;
        for (int64_t t = t0; t < t1; t++) {
            quantize(w->type, g->x + t * w->ne[0], w->ne[0],
                     (uint8_t *)g->xq[i] + (size_t)t * g->xq_row[i]);
        }
    }
}

void kern_matmul_group(struct threadpool *pool, struct kern_scratch *scratch, const float *x,
                       int64_t n_tokens, const struct kern_product *p, int32_t n,
                       kern_rows_fn epilogue, void *arg) {
    ASSERT(n >= 1 && n <= KERN_GROUP_MAX);
    struct group_job g = {.p = p, .n = n, .x = x, .n_tokens = n_tokens, .epilogue = epilogue,
                          .arg = arg};
    bool fused = true;  // every weight has panels: one region
    for (int32_t i = 0; i < n; i++) {
        const struct tensor *w = p[i].w;
        ASSERT(w->ne[0] == p[0].w->ne[0] && w->ne[2] == 1 && w->ne[3] == 1);
        ASSERT(!epilogue || w->ne[1] == p[0].w->ne[1]);
        fused = fused && w->panels;
    }
    if (!fused) {
        for (int32_t i = 0; i < n; i++) kern_matmul(pool, scratch, p[i].w, x, n_tokens, p[i].y);
        if (epilogue) threadpool_run(pool, p[0].w->ne[1], KERN_PANEL_ROWS, epilogue_slice, &g);
        return;
    }
    // One activation row set per quantized type of the group, in the scratch
    size_t at[KERN_GROUP_MAX] = {0}, bytes = 0;
    for (int32_t i = 0; i < n; i++) {
        const struct tensor *w = p[i].w;
        if (!is_quantized(w->type)) continue;
        ASSERT(kern_get()->qpanel[w->type]);
        g.xq_row[i] = kern_qpanel_act_bytes(w->type, w->ne[0]);
        int32_t j = 0;  // the first product of this type
        while (j < i && !(g.xq_row[j] && p[j].w->type == w->type)) j++;
        g.quantizes[i] = j == i;
        at[i] = g.quantizes[i] ? bytes : at[j];
        if (g.quantizes[i]) bytes += (size_t)n_tokens * g.xq_row[i];
    }
    if (bytes) reserve_act(scratch, bytes);
    for (int32_t i = 0; i < n; i++) {
        if (g.xq_row[i]) g.xq[i] = (const uint8_t *)scratch->act + at[i];
    }
    if (bytes) {
        // a few rows are cheaper to quantize here than a parallel region costs
        if (n_tokens <= KERN_GEMV_MAX_TOKENS) group_act_slice(&g, 0, n_tokens, 0, 1);
        else threadpool_run(pool, n_tokens, 1, group_act_slice, &g);
    }
    for (int32_t i = 0; i < n; i++) g.first[i + 1] = g.first[i] + n_panels_of(p[i].w);
    const int64_t n_items = epilogue ? n_panels_of(p[0].w) : g.first[n];
    threadpool_run(pool, n_items, 1, group_slice, &g);
}

const char *kern_blas_init(void) {
    openblas_set_num_threads(1);
    return openblas_get_corename();
}

bool kern_blas_wants_coretype(const char **out_coretype) {
    *out_coretype = NULL;
    const char *env = getenv("OPENBLAS_CORETYPE");
    if (env && *env) return false;
    const char *core = openblas_get_corename();
    if (!core) return false;
    // The generic kernels OpenBLAS falls back to on CPUs it does not recognise.
    bool generic = strcmp(core, "Prescott") == 0 || strcmp(core, "Core2") == 0 ||
                   strcmp(core, "Nehalem") == 0 || strcmp(core, "Katmai") == 0 ||
                   strcmp(core, "Atom") == 0 || strcmp(core, "Barcelona") == 0;
    if (!generic) return false;
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f")) {
        *out_coretype = "SkylakeX";
    } else if (__builtin_cpu_supports("avx2")) {
        *out_coretype = "Haswell";
    } else {
        return false;
    }
    return true;
}
