/*
 * test_attention.c - attention over paged KV against a naive float64
 * softmax(q K^T * scale) V, for random shapes: head dims 8/64/80/128, GQA
 * ratios 1/4/8, contexts up to 8192, block sizes that put block boundaries at
 * every offset, sliding windows, prefill tiles and decode rows, shuffled block
 * tables; for every KV type (f32, f16, q8_0), with the portable kernels and
 * every SIMD level the CPU has (AVX2, AVX-512). Tolerances (check_shape):
 * 2e-5 against the values as stored, for every type; against the exact
 * values, the bound derived from each type's rounding error (f16: 2^-11
 * relative; q8_0: max|group| / 254 per value). The SIMD pieces and the fused
 * AVX-512 step are also checked against the portable pieces directly. And
 * every path is batch-invariant: a token decoded alone gets the same bits as
 * in a prefill tile. A KV pool divided over 2-4 parts: the parts' partial
 * states, merged in float64, against the same naive softmax.
 */
#include <math.h>
#include <stdbool.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "engine/compute/attention.h"
#include "engine/base/err.h"
#include "engine/compute/kv.h"
#include "engine/kernels/threadpool.h"

static uint64_t rng = 88172645463325252ull;
static float frand(void) {  // uniform in [-1, 1)
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (float)((rng >> 40) & 0xffffff) / (float)(1 << 23) - 1.0f;
}

struct shape {
    int32_t head_dim;
    int32_t n_head_kv;
    int32_t n_rep;
    int32_t block_size;
    int32_t ctx;      // positions 0..ctx-1 exist in KV
    int32_t window;   // 0: none
    int32_t n_query;  // queries at the last n_query positions (a prefill tile run)
};

/* Float32 rounding slack of the kernels against the float64 reference. */
#define F32_TOL 2e-5

/* Largest |x - stored(x)| the KV type allows for value d of a head vector x
 * (kv.h): f16 rounds to nearest, relative error <= 2^-11 above 2^-14 and an
 * absolute 2^-25 below; q8_0 is within half a step, d/2 = max|group| / 254
 * (plus 1e-6 max|group| for the float division and product). */
static double stored_err(enum engine_kv_type type, const float *x, int32_t hd, int32_t d) {
    switch (type) {
    case ENGINE_KV_TYPE_F32: return 0.0;
    case ENGINE_KV_TYPE_F16: return fabs(x[d]) * 0x1p-11 + 0x1p-25;
    case ENGINE_KV_TYPE_Q8_0: {
        const int32_t g0 = d / 32 * 32;
        const int32_t g1 = g0 + 32 < hd ? g0 + 32 : hd;
        double amax = 0.0;
        for (int32_t i = g0; i < g1; i++) amax = fabs(x[i]) > amax ? fabs(x[i]) : amax;
        return amax / 254.0 + amax * 1e-6;
    }
    case ENGINE_KV_TYPE_COUNT: break;
    }
    return 0.0;
}

/* Naive softmax(q K^T * scale) V in float64 for query head row qh at
 * position p over keys [lo, p] of kv head g; writes o[hd]. */
static void naive(const float *qh, const float *K, const float *V, int32_t n_kv, int32_t g,
                  int32_t hd, int32_t lo, int32_t p, float scale, double *w, double *o) {
    double mx = -INFINITY;
    for (int32_t j = lo; j <= p; j++) {
        double sdot = 0.0;
        for (int32_t d = 0; d < hd; d++) sdot += (double)qh[d] * K[((size_t)j * n_kv + g) * hd + d];
        w[j] = sdot * scale;
        if (w[j] > mx) mx = w[j];
    }
    double sum = 0.0;
    for (int32_t j = lo; j <= p; j++) sum += (w[j] = exp(w[j] - mx));
    for (int32_t d = 0; d < hd; d++) {
        double e = 0.0;
        for (int32_t j = lo; j <= p; j++) e += w[j] * V[((size_t)j * n_kv + g) * hd + d];
        o[d] = e / sum;
    }
}

/* n block ids 1..n in an order shuffled by rng. */
static int32_t *shuffled_table(int32_t n) {
    int32_t *table = malloc((size_t)n * sizeof(int32_t));
    for (int32_t i = 0; i < n; i++) table[i] = i + 1;
    for (int32_t i = n - 1; i > 0; i--) {
        int32_t j = (int32_t)(rng % (uint64_t)(i + 1));
        frand();
        int32_t tmp = table[i];
        table[i] = table[j];
        table[j] = tmp;
    }
    return table;
}

/* The batch of a shape's queries: its last n_query positions, one sequence
 * over the given block table. */
struct queries {
    int32_t *tok, *pos, *seq;
    int8_t *out_flag;
    struct engine_seq s;
    struct engine_batch b;
};

static void queries_init(struct queries *qs, const struct shape *sh, const int32_t *table,
                         int32_t n_blocks) {
    const int32_t nq = sh->n_query;
    qs->tok = calloc((size_t)nq, sizeof(int32_t));
    qs->pos = malloc((size_t)nq * sizeof(int32_t));
    qs->seq = calloc((size_t)nq, sizeof(int32_t));
    qs->out_flag = calloc((size_t)nq, 1);
    for (int32_t i = 0; i < nq; i++) qs->pos[i] = sh->ctx - nq + i;
    qs->s = (struct engine_seq){.block_table = table, .n_blocks = n_blocks};
    qs->b = (struct engine_batch){.n_tokens = nq, .token = qs->tok, .pos = qs->pos,
                                  .seq = qs->seq, .output = qs->out_flag, .n_seqs = 1,
                                  .seqs = &qs->s};
}

static void queries_free(struct queries *qs) {
    free(qs->tok);
    free(qs->pos);
    free(qs->seq);
    free(qs->out_flag);
}

/* Checks attention over KV of `type` twice:
 *  1. against the reference over the values as stored (kv_read_token): the
 *     kernels' own error, F32_TOL for every type;
 *  2. against the reference over the exact values: within the error bound the
 *     type's rounding implies. With |k~ - k| <= ek (stored_err) the scores move
 *     by at most delta = scale * max_j sum_d |q_d| ek[j][d], each softmax weight
 *     by a factor within e^(+-2 delta), so, as the weights sum to 1 before and
 *     after, the output moves by at most
 *       (e^(2 delta) - 1) / 2 * range_j v~[j][d]  +  max_j ev[j][d]
 *     (ev the V rounding error); plus F32_TOL. For f32 the bound is F32_TOL. */
static void check_shape(struct threadpool *pool, const struct shape *sh,
                        enum engine_kv_type type, enum kern_isa isa) {
    const int32_t hd = sh->head_dim;
    const int32_t n_kv = sh->n_head_kv;
    const int32_t n_head = n_kv * sh->n_rep;
    const int32_t bs = sh->block_size;
    const int32_t n_blocks_seq = (sh->ctx + bs - 1) / bs;
    struct kv_store kv;
    assert_int_equal(kv_init(&kv, type, 1, n_blocks_seq + 1, bs, n_kv, hd), 0);

    // The sequence's blocks in shuffled order; K/V values kept for the oracle.
    int32_t *table = shuffled_table(n_blocks_seq);
    const size_t n_kv_vals = (size_t)sh->ctx * n_kv * hd;
    float *K = malloc(n_kv_vals * sizeof(float));   // [pos][kvh][d] exact
    float *V = malloc(n_kv_vals * sizeof(float));
    float *Ks = malloc(n_kv_vals * sizeof(float));  // as stored
    float *Vs = malloc(n_kv_vals * sizeof(float));
    double *ek = malloc(n_kv_vals * sizeof(double));  // rounding bound per value
    double *ev = malloc(n_kv_vals * sizeof(double));
    for (int32_t p = 0; p < sh->ctx; p++) {
        float *kp = K + (size_t)p * n_kv * hd;
        float *vp = V + (size_t)p * n_kv * hd;
        for (int32_t i = 0; i < n_kv * hd; i++) {
            kp[i] = frand() * 2.0f;
            vp[i] = frand();
        }
        if (p % 7 == 3) kp[p % (n_kv * hd)] = 9.0f;  // an outlier: a coarse q8_0 group
        if (p % 2 == 0) {
            kv_write_token(&kv, 0, table[p / bs], p % bs, kp, vp);
        } else {
            // Odd positions by kv head ranges, as the forward pass's threads
            // write them: heads [0, h) first, and the slot's other heads are
            // still the fresh pool's zeros, then the rest.
            const int32_t h = n_kv / 2;
            kv_write_heads(&kv, 0, table[p / bs], p % bs, 0, h, kp, vp);
            kv_read_token(&kv, 0, table[p / bs], p % bs, Ks + (size_t)p * n_kv * hd,
                          Vs + (size_t)p * n_kv * hd);
            for (size_t i = (size_t)h * hd; i < (size_t)n_kv * hd; i++) {
                assert_true(Ks[(size_t)p * n_kv * hd + i] == 0.0f);
                assert_true(Vs[(size_t)p * n_kv * hd + i] == 0.0f);
            }
            kv_write_heads(&kv, 0, table[p / bs], p % bs, h, n_kv, kp, vp);
        }
        kv_read_token(&kv, 0, table[p / bs], p % bs, Ks + (size_t)p * n_kv * hd,
                      Vs + (size_t)p * n_kv * hd);
        for (int32_t g = 0; g < n_kv; g++) {
            for (int32_t d = 0; d < hd; d++) {
                const size_t i = ((size_t)p * n_kv + g) * hd + d;
                ek[i] = stored_err(type, kp + (size_t)g * hd, hd, d);
                ev[i] = stored_err(type, vp + (size_t)g * hd, hd, d);
                assert_true(fabs((double)Ks[i] - K[i]) <= ek[i]);
                assert_true(fabs((double)Vs[i] - V[i]) <= ev[i]);
            }
        }
    }

    const int32_t nq = sh->n_query;
    struct queries qs;
    queries_init(&qs, sh, table, n_blocks_seq);
    const struct engine_batch b = qs.b;
    const int32_t *pos = qs.pos;
    float *q = malloc((size_t)nq * n_head * hd * sizeof(float));
    float *out = malloc((size_t)nq * n_head * hd * sizeof(float));
    for (size_t i = 0; i < (size_t)nq * n_head * hd; i++) q[i] = frand();
    struct attention_tile *tiles = malloc((size_t)nq * sizeof(*tiles));
    size_t sf = attention_scratch_floats(n_head, n_kv, hd, bs);
    float *scratch = malloc(sf * (size_t)threadpool_n_threads(pool) * sizeof(float));
    const float scale = 1.0f / sqrtf((float)hd);
    struct attention_args a = {
        .kv = &kv, .layer = 0, .batch = &b, .tiles = tiles, .n_tiles = attention_tiles(&b, tiles),
        .q = q, .out = out, .n_head = n_head, .window = sh->window, .scale = scale,
        .kern = kern_attn_select(type, isa), .scratch = scratch, .scratch_floats = sf,
    };
    attention_run(pool, &a);

    double *w = malloc((size_t)sh->ctx * sizeof(double));
    double *o_stored = malloc((size_t)hd * sizeof(double));
    double *o_exact = malloc((size_t)hd * sizeof(double));
    for (int32_t i = 0; i < nq; i++) {
        const int32_t p = pos[i];
        const int32_t lo = sh->window > 0 && p - sh->window + 1 > 0 ? p - sh->window + 1 : 0;
        for (int32_t h = 0; h < n_head; h++) {
            const int32_t g = h / sh->n_rep;
            const float *qh = q + ((size_t)i * n_head + h) * hd;
            naive(qh, Ks, Vs, n_kv, g, hd, lo, p, scale, w, o_stored);
            naive(qh, K, V, n_kv, g, hd, lo, p, scale, w, o_exact);
            double delta = 0.0;
            for (int32_t j = lo; j <= p; j++) {
                double e = 0.0;
                for (int32_t d = 0; d < hd; d++) {
                    e += fabs((double)qh[d]) * ek[((size_t)j * n_kv + g) * hd + d];
                }
                delta = e * scale > delta ? e * scale : delta;
            }
            const float *oh = out + ((size_t)i * n_head + h) * hd;
            for (int32_t d = 0; d < hd; d++) {
                double vmin = INFINITY, vmax = -INFINITY, evmax = 0.0;
                for (int32_t j = lo; j <= p; j++) {
                    const size_t k = ((size_t)j * n_kv + g) * hd + d;
                    vmin = Vs[k] < vmin ? Vs[k] : vmin;
                    vmax = Vs[k] > vmax ? Vs[k] : vmax;
                    evmax = ev[k] > evmax ? ev[k] : evmax;
                }
                const double bound = expm1(2.0 * delta) / 2.0 * (vmax - vmin) + evmax + F32_TOL;
                if (fabs(oh[d] - o_stored[d]) > F32_TOL || fabs(oh[d] - o_exact[d]) > bound) {
                    fail_msg("%s hd=%d kv=%d rep=%d bs=%d ctx=%d window=%d %s: query %d head %d "
                             "dim %d: %g vs %g as stored, %g exact (bound %g)",
                             engine_kv_type_name(type), hd, n_kv, sh->n_rep, bs, sh->ctx,
                             sh->window, a.kern->isa, i, h, d,
                             (double)oh[d], o_stored[d], o_exact[d], bound);
                }
            }
        }
    }
    free(w);
    free(o_stored);
    free(o_exact);
    free(scratch);
    free(tiles);
    free(q);
    free(out);
    queries_free(&qs);
    free(K);
    free(V);
    free(Ks);
    free(Vs);
    free(ek);
    free(ev);
    free(table);
    kv_free(&kv);
}

/* The instruction-set levels whose attention tables this CPU can run, lowest
 * first (portable always); returns how many. */
static int32_t isa_levels(enum kern_isa out[3]) {
    const enum kern_isa cpu = kern_isa_detect();
    int32_t n = 0;
    out[n++] = KERN_ISA_PORTABLE;
    if (cpu >= KERN_ISA_AVX2) out[n++] = KERN_ISA_AVX2;
    if (cpu >= KERN_ISA_AVX512) out[n++] = KERN_ISA_AVX512;
    return n;
}

static void test_attention_matches_naive_softmax(void **state) {
    (void)state;
    struct threadpool *pool = threadpool_create(2);
    const int32_t dims[] = {8, 64, 80, 128};
    const int32_t reps[] = {1, 4, 8};
    enum kern_isa isas[3];
    const int32_t n_isas = isa_levels(isas);
    for (int type = 0; type < ENGINE_KV_TYPE_COUNT; type++) {
        for (int32_t ii = 0; ii < n_isas; ii++) {
            for (size_t di = 0; di < 4; di++) {
                for (size_t ri = 0; ri < 3; ri++) {
                    // Contexts 1..~70 with prefill runs crossing block edges, odd block sizes.
                    for (int32_t ctx = 1; ctx <= 70; ctx += 23) {
                        struct shape sh = {dims[di], 2, reps[ri], 16, ctx, 0, ctx < 13 ? ctx : 13};
                        check_shape(pool, &sh, (enum engine_kv_type)type, isas[ii]);
                        sh.block_size = 5;
                        check_shape(pool, &sh, (enum engine_kv_type)type, isas[ii]);
                        sh.window = 7;
                        check_shape(pool, &sh, (enum engine_kv_type)type, isas[ii]);
                        sh.block_size = 20;  // 16-key chunks that straddle the block
                        check_shape(pool, &sh, (enum engine_kv_type)type, isas[ii]);
                    }
                }
            }
        }
    }
    threadpool_free(pool);
}

static void test_attention_every_block_offset(void **state) {
    (void)state;
    struct threadpool *pool = threadpool_create(2);
    enum kern_isa isas[3];
    const int32_t n_isas = isa_levels(isas);
    // Decode rows and short runs ending at every offset inside a block.
    for (int type = 0; type < ENGINE_KV_TYPE_COUNT; type++) {
        for (int32_t ii = 0; ii < n_isas; ii++) {
            for (int32_t ctx = 1; ctx <= 40; ctx++) {
                struct shape sh = {16, 1, 2, 8, ctx, 0, 1 + ctx % 9};
                check_shape(pool, &sh, (enum engine_kv_type)type, isas[ii]);
                sh.window = 3 + ctx % 5;
                check_shape(pool, &sh, (enum engine_kv_type)type, isas[ii]);
                struct shape wide = {80, 1, 1, 16, ctx + 16, ctx % 3 ? 0 : 11, 1 + ctx % 4};
                check_shape(pool, &wide, (enum engine_kv_type)type, isas[ii]);
            }
        }
    }
    threadpool_free(pool);
}

static void test_attention_long_context(void **state) {
    (void)state;
    struct threadpool *pool = threadpool_create(2);
    enum kern_isa isas[3];
    const int32_t n_isas = isa_levels(isas);
    for (int type = 0; type < ENGINE_KV_TYPE_COUNT; type++) {
        // The fastest path the CPU has, and the one below it.
        for (int32_t ii = n_isas > 1 ? n_isas - 2 : 0; ii < n_isas; ii++) {
            struct shape sh = {128, 1, 8, 16, 8192, 0, 3};
            check_shape(pool, &sh, (enum engine_kv_type)type, isas[ii]);
            struct shape sw = {64, 2, 4, 16, 4100, 1000, 9};
            check_shape(pool, &sw, (enum engine_kv_type)type, isas[ii]);
        }
    }
    threadpool_free(pool);
}

/* Batch invariance: every token of a prefill run gets the same bits as when
 * it is decoded alone (a batch of one token), on every path, for GQA ratios
 * 1 and 4, with and without a sliding window, for block sizes 16 and 5 and
 * contexts long enough for several runs of blocks. */
static void test_attention_prefill_equals_decode_bitwise(void **state) {
    (void)state;
    struct threadpool *pool = threadpool_create(2);
    enum kern_isa isas[3];
    const int32_t n_isas = isa_levels(isas);
    const struct shape shapes[] = {
        {64, 2, 1, 16, 300, 0, 21}, {80, 1, 4, 16, 300, 0, 11}, {128, 2, 4, 5, 200, 60, 17},
        {64, 1, 1, 5, 181, 0, 9},
    };
    for (int type = 0; type < ENGINE_KV_TYPE_COUNT; type++) {
        for (int32_t ii = 0; ii < n_isas; ii++) {
            for (size_t si = 0; si < sizeof(shapes) / sizeof(shapes[0]); si++) {
                const struct shape *sh = &shapes[si];
                const int32_t hd = sh->head_dim, bs = sh->block_size;
                const int32_t n_kv = sh->n_head_kv, n_head = n_kv * sh->n_rep;
                const int32_t n_blk = (sh->ctx + bs - 1) / bs, nq = sh->n_query;
                struct kv_store kv;
                assert_int_equal(kv_init(&kv, (enum engine_kv_type)type, 1, n_blk + 1, bs, n_kv, hd),
                                 0);
                int32_t *table = malloc((size_t)n_blk * sizeof(int32_t));
                float *k = malloc((size_t)n_kv * hd * sizeof(float));
                float *v = malloc((size_t)n_kv * hd * sizeof(float));
                for (int32_t i = 0; i < n_blk; i++) table[i] = n_blk - i;  // reversed
                for (int32_t p = 0; p < sh->ctx; p++) {
                    for (int32_t i = 0; i < n_kv * hd; i++) {
                        k[i] = frand() * 2.0f;
                        v[i] = frand();
                    }
                    kv_write_token(&kv, 0, table[p / bs], p % bs, k, v);
                }
                const size_t row = (size_t)n_head * hd;
                float *q = malloc((size_t)nq * row * sizeof(float));
                float *out_p = malloc((size_t)nq * row * sizeof(float));
                float *out_d = malloc(row * sizeof(float));
                for (size_t i = 0; i < (size_t)nq * row; i++) q[i] = frand();
                int32_t *pos = malloc((size_t)nq * sizeof(int32_t));
                int32_t *zero = calloc((size_t)nq, sizeof(int32_t));
                int8_t *flag = calloc((size_t)nq, 1);
                for (int32_t i = 0; i < nq; i++) pos[i] = sh->ctx - nq + i;
                struct engine_seq sq = {.block_table = table, .n_blocks = n_blk};
                struct attention_tile *tiles = malloc((size_t)nq * sizeof(*tiles));
                const size_t sf = attention_scratch_floats(n_head, n_kv, hd, bs);
                float *scratch = malloc(sf * (size_t)threadpool_n_threads(pool) * sizeof(float));
                struct attention_args a = {
                    .kv = &kv, .layer = 0, .q = q, .n_head = n_head, .window = sh->window,
                    .scale = 1.0f / sqrtf((float)hd),
                    .kern = kern_attn_select((enum engine_kv_type)type, isas[ii]),
                    .scratch = scratch, .scratch_floats = sf,
                };
                // All nq tokens in one batch (tiles of up to ATTENTION_TILE) ...
                struct engine_batch b = {.n_tokens = nq, .token = zero, .pos = pos, .seq = zero,
                                         .output = flag, .n_seqs = 1, .seqs = &sq};
                a.batch = &b;
                a.tiles = tiles;
                a.n_tiles = attention_tiles(&b, tiles);
                a.out = out_p;
                attention_run(pool, &a);
                // ... and each alone.
                for (int32_t i = 0; i < nq; i++) {
                    struct engine_batch b1 = {.n_tokens = 1, .token = zero, .pos = pos + i,
                                              .seq = zero, .output = flag, .n_seqs = 1,
                                              .seqs = &sq};
                    a.batch = &b1;
                    a.n_tiles = attention_tiles(&b1, tiles);
                    a.q = q + (size_t)i * row;
                    a.out = out_d;
                    attention_run(pool, &a);
                    a.q = q;
                    if (memcmp(out_d, out_p + (size_t)i * row, row * sizeof(float)) != 0) {
                        fail_msg("%s %s hd=%d rep=%d bs=%d window=%d: token at %d differs",
                                 a.kern->isa, engine_kv_type_name((enum engine_kv_type)type), hd,
                                 sh->n_rep, bs, sh->window, pos[i]);
                    }
                }
                free(scratch);
                free(tiles);
                free(pos);
                free(zero);
                free(flag);
                free(q);
                free(out_p);
                free(out_d);
                free(k);
                free(v);
                free(table);
                kv_free(&kv);
            }
        }
    }
    threadpool_free(pool);
}

/* The SIMD kernels of every KV type and level against the portable ones on
 * the same tiles: scores of 1..4 rows, exponentials of 1..40 scores (some
 * -inf) and P.V over every start and length in a block. */
static void test_attention_kernels_match_portable(void **state) {
    (void)state;
    const int32_t dims[] = {8, 64, 80, 128};
    const int32_t sizes[] = {5, 16, 32};
    enum kern_isa isas[3];
    const int32_t n_isas = isa_levels(isas);
    if (n_isas == 1) skip();  // no SIMD level on this CPU
    for (int type = 0; type < ENGINE_KV_TYPE_COUNT; type++) {
        const struct kern_attn *ref = kern_attn_select((enum engine_kv_type)type,
                                                       KERN_ISA_PORTABLE);
        for (int32_t ii = 1; ii < n_isas; ii++) {
            const struct kern_attn *simd = kern_attn_select((enum engine_kv_type)type, isas[ii]);
            assert_ptr_not_equal(simd, ref);
            for (int32_t n = 1; n <= 40; n++) {
                float sc[40], p_ref[40], p_simd[40], mx = -INFINITY;
                for (int32_t j = 0; j < n; j++) {
                    sc[j] = j % 7 == 5 ? -INFINITY : frand() * 30.0f;
                    mx = sc[j] > mx ? sc[j] : mx;
                }
                const float sum_ref = ref->exp_sum(p_ref, sc, mx, n);
                const float sum_simd = simd->exp_sum(p_simd, sc, mx, n);
                assert_true(fabsf(sum_ref - sum_simd) <= 1e-6f * (float)n);
                for (int32_t j = 0; j < n; j++) {
                    assert_true(fabsf(p_ref[j] - p_simd[j]) <= 1e-6f);
                }
            }
            for (size_t di = 0; di < 4; di++) {
                for (size_t si = 0; si < 3; si++) {
                    const int32_t hd = dims[di], bs = sizes[si];
                    struct kv_store kv;
                    assert_int_equal(kv_init(&kv, (enum engine_kv_type)type, 1, 2, bs, 1, hd), 0);
                    float *k = malloc((size_t)hd * sizeof(float));
                    float *v = malloc((size_t)hd * sizeof(float));
                    for (int32_t j = 0; j < bs; j++) {
                        for (int32_t d = 0; d < hd; d++) {
                            k[d] = frand() * 3.0f;
                            v[d] = frand();
                        }
                        kv_write_token(&kv, 0, 1, j, k, v);
                    }
                    float q[4][128], s_ref[4 * 32], s_simd[4 * 32], p[32];
                    const float *qr[4] = {q[0], q[1], q[2], q[3]};
                    for (int r = 0; r < 4; r++) {
                        for (int32_t d = 0; d < hd; d++) q[r][d] = frand();
                    }
                    for (int32_t j = 0; j < bs; j++) p[j] = (frand() + 1.0f) / 2.0f;
                    const void *kt = kv_k_tile(&kv, 0, 1, 0);
                    const void *vt = kv_v_tile(&kv, 0, 1, 0);
                    for (int32_t nr = 1; nr <= 4; nr++) {
                        ref->scores(qr, nr, kt, hd, bs, 0.125f, s_ref);
                        simd->scores(qr, nr, kt, hd, bs, 0.125f, s_simd);
                        for (int32_t i = 0; i < nr * bs; i++) {
                            assert_true(fabsf(s_ref[i] - s_simd[i]) <=
                                        1e-5f * (1.0f + fabsf(s_ref[i])));
                        }
                    }
                    for (int32_t j0 = 0; j0 < bs; j0++) {
                        for (int32_t n = 1; j0 + n <= bs; n++) {
                            float a_ref[128], a_simd[128];
                            for (int32_t d = 0; d < hd; d++) a_ref[d] = a_simd[d] = frand();
                            ref->pv(a_ref, 0.75f, p, vt, j0, n, hd, bs);
                            simd->pv(a_simd, 0.75f, p, vt, j0, n, hd, bs);
                            for (int32_t d = 0; d < hd; d++) {
                                assert_true(fabsf(a_ref[d] - a_simd[d]) <=
                                            1e-5f * (1.0f + fabsf(a_ref[d])));
                            }
                        }
                    }
                    free(k);
                    free(v);
                    kv_free(&kv);
                }
            }
        }
    }
}

/* The running state (m, l, acc) of n_rows rows after a walk over n_blk blocks,
 * by the portable pieces composed as attention.c composes them: the oracle of
 * a fused step. */
static void walk_with_pieces(const struct kern_attn *ref, const struct kv_store *kv,
                             const float *const *q, const int32_t *lo, const int32_t *hi,
                             int32_t n_rows, int32_t n_blk, float scale, float *m, float *l,
                             float *acc) {
    const int32_t hd = kv->head_dim, bs = kv->block_size;
    float *s = malloc((size_t)n_rows * bs * sizeof(float));
    float *p = malloc((size_t)bs * sizeof(float));
    for (int32_t b = 0; b < n_blk; b++) {
        const void *kt = kv_k_tile(kv, 0, b + 1, 0);
        const void *vt = kv_v_tile(kv, 0, b + 1, 0);
        for (int32_t r = 0; r < n_rows; r += KERN_ATTN_ROWS) {
            const int32_t nr = n_rows - r < KERN_ATTN_ROWS ? n_rows - r : KERN_ATTN_ROWS;
            ref->scores(q + r, nr, kt, hd, bs, scale, s + (size_t)r * bs);
        }
        for (int32_t r = 0; r < n_rows; r++) {
            const int32_t j0 = lo[r] > b * bs ? lo[r] - b * bs : 0;
            const int32_t j1 = hi[r] - b * bs < bs - 1 ? hi[r] - b * bs : bs - 1;
            if (j0 > j1) continue;
            const float *sr = s + (size_t)r * bs;
            float mx = m[r];
            for (int32_t j = j0; j <= j1; j++) mx = sr[j] > mx ? sr[j] : mx;
            const float corr = expf(m[r] - mx);
            const float sum = ref->exp_sum(p, sr + j0, mx, j1 - j0 + 1);
            ref->pv(acc + (size_t)r * hd, corr, p, vt, j0, j1 - j0 + 1, hd, bs);
            l[r] = l[r] * corr + sum;
            m[r] = mx;
        }
    }
    free(s);
    free(p);
}

/* One fused step check: n_rows rows with random key ranges (some empty in
 * some blocks, some starting or ending mid-block) over the 3 blocks of kv, in
 * runs of 1, 2 or 3 blocks, against walk_with_pieces. */
static void check_step(const struct kern_attn *simd, const struct kern_attn *ref,
                       const struct kv_store *kv, int32_t n_rows) {
    const int32_t hd = kv->head_dim, bs = kv->block_size, n_blk = 3;
    float q[9][128], m_ref[9], l_ref[9], m_simd[9], l_simd[9];
    float acc_ref[9 * 128], acc_simd[9 * 128];
    float scratch[KERN_ATTN_ROWS * KERN_ATTN_RUN * 32];
    const float *qr[9];
    int32_t lo[9], hi[9];
    assert_true(n_rows <= 9 && hd <= 128 && bs <= 32 && kv->n_blocks > n_blk);
    for (int32_t r = 0; r < n_rows; r++) {
        qr[r] = q[r];
        for (int32_t d = 0; d < hd; d++) q[r][d] = frand();
        const int32_t a = (int32_t)(rng % (uint64_t)(n_blk * bs));
        frand();
        const int32_t b = (int32_t)(rng % (uint64_t)(n_blk * bs));
        frand();
        lo[r] = a < b ? a : b;
        hi[r] = a < b ? b : a;
        m_ref[r] = m_simd[r] = -INFINITY;
        l_ref[r] = l_simd[r] = 0.0f;
    }
    memset(acc_ref, 0, sizeof(acc_ref));
    memset(acc_simd, 0, sizeof(acc_simd));
    walk_with_pieces(ref, kv, qr, lo, hi, n_rows, n_blk, 0.125f, m_ref, l_ref, acc_ref);

    const void *kts[3], *vts[3];
    for (int32_t blk = 0; blk < n_blk; blk++) {
        kts[blk] = kv_k_tile(kv, 0, blk + 1, 0);
        vts[blk] = kv_v_tile(kv, 0, blk + 1, 0);
    }
    const int32_t run = 1 + n_rows % 3;
    for (int32_t blk = 0; blk < n_blk; blk += run) {
        const int32_t nb = n_blk - blk < run ? n_blk - blk : run;
        struct kern_attn_step st = {
            .q = qr, .lo = lo, .hi = hi, .n_rows = n_rows, .pos0 = blk * bs, .n_blocks = nb,
            .hd = hd, .bs = bs, .scale = 0.125f, .kt = kts + blk, .vt = vts + blk,
            .kt_next = kts + blk + nb, .vt_next = vts + blk + nb,
            .n_next = n_blk - blk - nb < run ? n_blk - blk - nb : run,
            .tile_bytes = kv->tile_bytes, .m = m_simd, .l = l_simd, .acc = acc_simd,
            .scratch = scratch,
        };
        simd->step(&st);
    }

    // The maxima differ by the scores' rounding; l and acc are relative to
    // them, acc / l (the output) is not.
    for (int32_t r = 0; r < n_rows; r++) {
        const bool m_ok = fabsf(m_ref[r] - m_simd[r]) <= 1e-5f * (1.0f + fabsf(m_ref[r]));
        const float l_at = l_ref[r] * expf(m_ref[r] - m_simd[r]);
        const bool l_ok = fabsf(l_at - l_simd[r]) <= 1e-5f * l_at;
        float worst = 0.0f;  // largest error of acc / l beyond the tolerance
        for (int32_t d = 0; d < hd; d++) {
            const float x = acc_ref[r * hd + d] / l_ref[r];
            const float y = acc_simd[r * hd + d] / l_simd[r];
            const float e = fabsf(x - y) - 1e-5f * (1.0f + fabsf(x));
            worst = e > worst ? e : worst;
        }
        if (!m_ok || !l_ok || worst > 0.0f) {
            fail_msg("%s %s hd=%d bs=%d rows=%d: row %d keys [%d, %d]: m %g vs %g, l %g vs %g, "
                     "output off by %g",
                     simd->isa, engine_kv_type_name(kv->type), hd, bs, n_rows, r, lo[r], hi[r],
                     (double)m_simd[r], (double)m_ref[r], (double)l_simd[r], (double)l_at,
                     (double)worst);
        }
    }
}

/* Every fused step (kern_attn.step) against the composed portable pieces,
 * for 1..9 rows, head dims 8/64/80/128 and block sizes 5/16/20/32. */
static void test_attention_step_matches_pieces(void **state) {
    (void)state;
    const int32_t dims[] = {8, 64, 80, 128};
    const int32_t sizes[] = {5, 16, 20, 32};
    enum kern_isa isas[3];
    const int32_t n_isas = isa_levels(isas);
    int32_t n_checked = 0;
    for (int type = 0; type < ENGINE_KV_TYPE_COUNT; type++) {
        const struct kern_attn *ref = kern_attn_select((enum engine_kv_type)type,
                                                       KERN_ISA_PORTABLE);
        for (int32_t ii = 1; ii < n_isas; ii++) {
            const struct kern_attn *simd = kern_attn_select((enum engine_kv_type)type, isas[ii]);
            if (!simd->step) continue;
            for (size_t di = 0; di < 4; di++) {
                for (size_t si = 0; si < 4; si++) {
                    const int32_t hd = dims[di], bs = sizes[si];
                    struct kv_store kv;
                    assert_int_equal(kv_init(&kv, (enum engine_kv_type)type, 1, 4, bs, 1, hd), 0);
                    float k[128], v[128];
                    for (int32_t pos = 0; pos < 3 * bs; pos++) {
                        for (int32_t d = 0; d < hd; d++) {
                            k[d] = frand() * 3.0f;
                            v[d] = frand();
                        }
                        kv_write_token(&kv, 0, pos / bs + 1, pos % bs, k, v);
                    }
                    for (int32_t n_rows = 1; n_rows <= 9; n_rows++) {
                        check_step(simd, ref, &kv, n_rows);
                        n_checked++;
                    }
                    kv_free(&kv);
                }
            }
        }
    }
    if (n_checked == 0) skip();  // no table with a fused step on this CPU
}

/* Bytes per token of each type: f16 half of f32, q8_0 a quarter plus scales. */
static void test_attention_kv_bytes_per_token(void **state) {
    (void)state;
    // head_dim 128, one kv head, one layer, 16-token blocks: K + V per token.
    assert_int_equal(kv_block_bytes(ENGINE_KV_TYPE_F32, 1, 1, 128, 16) / 16, 1024);
    assert_int_equal(kv_block_bytes(ENGINE_KV_TYPE_F16, 1, 1, 128, 16) / 16, 512);
    assert_int_equal(kv_block_bytes(ENGINE_KV_TYPE_Q8_0, 1, 1, 128, 16) / 16, 2 * (128 + 4 * 4));
    assert_int_equal(kv_block_bytes(ENGINE_KV_TYPE_Q8_0, 1, 1, 64, 16) / 16, 2 * (64 + 4 * 2));
    enum engine_kv_type t;
    assert_int_equal(engine_kv_type_parse("q8_0", &t), 0);
    assert_int_equal(t, ENGINE_KV_TYPE_Q8_0);
    assert_int_equal(engine_kv_type_parse("f16", &t), 0);
    assert_int_equal(t, ENGINE_KV_TYPE_F16);
    assert_int_equal(engine_kv_type_parse("q4_0", &t), ERR_INVAL);
    assert_int_equal(engine_kv_type_parse("", &t), ERR_INVAL);
    assert_string_equal(engine_kv_type_name(ENGINE_KV_TYPE_F32), "f32");
}

/* Every (layer, block, slot, kv head) of a pool has its own bytes: an f32
 * pool of 3 layers, 5 blocks and 2 kv heads, each slot written with values
 * that name it, reads every value back exactly (f32 stores them as they are);
 * the slots not written yet read as the fresh pool's zeros; and a divided
 * part (kv_init_part) addresses its own blocks the same way. */
static void test_kv_every_slot_its_own_bytes(void **state) {
    (void)state;
    enum { NL = 3, NB = 6, BS = 4, NKV = 2, HD = 8 };
    for (int32_t n_parts = 1; n_parts <= 2; n_parts++) {
        for (int32_t part = 0; part < n_parts; part++) {
            struct kv_store kv;
            assert_int_equal(kv_init_part(&kv, ENGINE_KV_TYPE_F32, NL, NB, BS, NKV, HD, n_parts,
                                          part), 0);
            float k[NKV * HD], v[NKV * HD], rk[NKV * HD], rv[NKV * HD];
            // Block 0 is the null block; slot 3 of every block stays unwritten.
            for (int32_t il = 0; il < NL; il++) {
                for (int32_t b = 1; b < NB; b++) {
                    if (!kv_holds(&kv, b)) continue;
                    for (int32_t j = 0; j < BS - 1; j++) {
                        for (int32_t i = 0; i < NKV * HD; i++) {
                            k[i] = (float)(((il * NB + b) * BS + j) * 100 + i);
                            v[i] = -k[i];
                        }
                        kv_write_token(&kv, il, b, j, k, v);
                    }
                }
            }
            for (int32_t il = 0; il < NL; il++) {
                for (int32_t b = 1; b < NB; b++) {
                    if (!kv_holds(&kv, b)) continue;
                    for (int32_t j = 0; j < BS; j++) {
                        kv_read_token(&kv, il, b, j, rk, rv);
                        for (int32_t i = 0; i < NKV * HD; i++) {
                            const float want =
                                j == BS - 1 ? 0.0f : (float)(((il * NB + b) * BS + j) * 100 + i);
                            assert_true(rk[i] == want);
                            assert_true(rv[i] == -want);
                        }
                    }
                }
            }
            kv_free(&kv);
        }
    }
}

/* A KV pool divided over n_parts ranks (kv.h): each part holds the blocks
 * b % n_parts == part only, its attention_run with part_m gives the
 * recurrence's unnormalised state over those keys, and the parts merged by
 * the rule forward.c uses, out = sum_r e^(m_r - M) acc_r / sum_r e^(m_r - M)
 * l_r (M the max of the m_r), computed here in float64, must be the naive
 * softmax over every key as stored. Shuffled block tables give each part an
 * uneven share (some rows none of their keys: m = -inf, l = 0 there), decode
 * rows and prefill tiles, windows that leave parts without keys. */
static void check_divided(struct threadpool *pool, int32_t n_parts, const struct shape *sh,
                          enum engine_kv_type type, enum kern_isa isa) {
    const int32_t hd = sh->head_dim, n_kv = sh->n_head_kv, bs = sh->block_size;
    const int32_t n_head = n_kv * sh->n_rep;
    const int32_t n_blocks_seq = (sh->ctx + bs - 1) / bs;
    const int32_t n_blocks = (n_blocks_seq + 1 + n_parts - 1) / n_parts * n_parts;
    struct kv_store kv[4];
    assert_true(n_parts <= 4);
    for (int32_t r = 0; r < n_parts; r++) {
        assert_int_equal(kv_init_part(&kv[r], type, 1, n_blocks, bs, n_kv, hd, n_parts, r), 0);
        assert_int_equal(kv[r].n_local, n_blocks / n_parts);
    }
    int32_t *table = shuffled_table(n_blocks_seq);
    const size_t n_vals = (size_t)sh->ctx * n_kv * hd;
    float *Ks = malloc(n_vals * sizeof(float));  // as stored, in its part
    float *Vs = malloc(n_vals * sizeof(float));
    float *kp = malloc((size_t)n_kv * hd * sizeof(float));
    float *vp = malloc((size_t)n_kv * hd * sizeof(float));
    for (int32_t p = 0; p < sh->ctx; p++) {
        for (int32_t i = 0; i < n_kv * hd; i++) {
            kp[i] = frand() * 2.0f;
            vp[i] = frand();
        }
        const int32_t block = table[p / bs];
        int32_t n_holders = 0;
        for (int32_t r = 0; r < n_parts; r++) {
            if (!kv_holds(&kv[r], block)) continue;
            n_holders++;
            kv_write_token(&kv[r], 0, block, p % bs, kp, vp);
            kv_read_token(&kv[r], 0, block, p % bs, Ks + (size_t)p * n_kv * hd,
                          Vs + (size_t)p * n_kv * hd);
        }
        assert_int_equal(n_holders, 1);
    }

    const int32_t nq = sh->n_query;
    struct queries qs;
    queries_init(&qs, sh, table, n_blocks_seq);
    const struct engine_batch b = qs.b;
    const int32_t *pos = qs.pos;
    const size_t n_rows = (size_t)nq * n_head;
    float *q = malloc(n_rows * hd * sizeof(float));
    for (size_t i = 0; i < n_rows * hd; i++) q[i] = frand();
    float *acc = malloc((size_t)n_parts * n_rows * hd * sizeof(float));
    float *m = malloc((size_t)n_parts * n_rows * sizeof(float));
    float *l = malloc((size_t)n_parts * n_rows * sizeof(float));
    struct attention_tile *tiles = malloc((size_t)nq * sizeof(*tiles));
    const size_t sf = attention_scratch_floats(n_head, n_kv, hd, bs);
    float *scratch = malloc(sf * (size_t)threadpool_n_threads(pool) * sizeof(float));
    const float scale = 1.0f / sqrtf((float)hd);
    for (int32_t r = 0; r < n_parts; r++) {
        struct attention_args a = {
            .kv = &kv[r], .layer = 0, .batch = &b, .tiles = tiles,
            .n_tiles = attention_tiles(&b, tiles), .q = q, .out = acc + (size_t)r * n_rows * hd,
            .part_m = m + (size_t)r * n_rows, .part_l = l + (size_t)r * n_rows,
            .n_head = n_head, .window = sh->window, .scale = scale,
            .kern = kern_attn_select(type, isa), .scratch = scratch, .scratch_floats = sf,
        };
        attention_run(pool, &a);
    }

    double *w = malloc((size_t)sh->ctx * sizeof(double));
    double *o = malloc((size_t)hd * sizeof(double));
    int32_t n_empty = 0;  // (row, part) pairs without keys
    for (int32_t i = 0; i < nq; i++) {
        const int32_t p = pos[i];
        const int32_t lo = sh->window > 0 && p - sh->window + 1 > 0 ? p - sh->window + 1 : 0;
        for (int32_t h = 0; h < n_head; h++) {
            const size_t row = (size_t)i * n_head + h;
            naive(q + row * hd, Ks, Vs, n_kv, h / sh->n_rep, hd, lo, p, scale, w, o);
            double mx = -INFINITY;
            for (int32_t r = 0; r < n_parts; r++) {
                const float mr = m[(size_t)r * n_rows + row];
                if (mr == -INFINITY) {
                    n_empty++;
                    assert_true(l[(size_t)r * n_rows + row] == 0.0f);
                }
                mx = mr > mx ? mr : mx;
            }
            for (int32_t d = 0; d < hd; d++) {
                double num = 0.0, den = 0.0;
                for (int32_t r = 0; r < n_parts; r++) {
                    const float mr = m[(size_t)r * n_rows + row];
                    const double f = mr == -INFINITY ? 0.0 : exp((double)mr - mx);
                    num += f * acc[((size_t)r * n_rows + row) * hd + d];
                    den += f * l[(size_t)r * n_rows + row];
                }
                if (fabs(num / den - o[d]) > F32_TOL) {
                    fail_msg("divided over %d, %s %s hd=%d bs=%d ctx=%d window=%d: query %d "
                             "head %d dim %d: %g vs %g", n_parts, engine_kv_type_name(type),
                             kern_attn_select(type, isa)->isa, hd, bs, sh->ctx, sh->window, i,
                             h, d, num / den, o[d]);
                }
            }
        }
    }
    // Narrow windows leave some part without a row's keys: that case was met.
    if (sh->window > 0 && sh->window <= bs) assert_true(n_empty > 0);
    for (int32_t r = 0; r < n_parts; r++) kv_free(&kv[r]);
    free(w);
    free(o);
    free(scratch);
    free(tiles);
    free(q);
    free(acc);
    free(m);
    free(l);
    queries_free(&qs);
    free(Ks);
    free(Vs);
    free(kp);
    free(vp);
    free(table);
}

static void test_attention_divided_partials_combine(void **state) {
    (void)state;
    struct threadpool *pool = threadpool_create(2);
    enum kern_isa isas[3];
    const int32_t n_isas = isa_levels(isas);
    for (int type = 0; type < ENGINE_KV_TYPE_COUNT; type++) {
        for (int32_t ii = 0; ii < n_isas; ii++) {
            for (int32_t n_parts = 2; n_parts <= 4; n_parts++) {
                // prefill tiles over many blocks, GQA; decode rows; narrow windows
                const struct shape shapes[] = {
                    {64, 2, 4, 16, 300, 0, 20}, {32, 1, 1, 8, 97, 0, 1},
                    {64, 2, 2, 16, 200, 12, 17}, {16, 1, 2, 5, 61, 4, 3},
                };
                for (size_t i = 0; i < sizeof(shapes) / sizeof(shapes[0]); i++) {
                    check_divided(pool, n_parts, &shapes[i], (enum engine_kv_type)type,
                                  isas[ii]);
                }
            }
        }
    }
    threadpool_free(pool);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_attention_matches_naive_softmax),
        cmocka_unit_test(test_attention_every_block_offset),
        cmocka_unit_test(test_attention_long_context),
        cmocka_unit_test(test_attention_prefill_equals_decode_bitwise),
        cmocka_unit_test(test_attention_kernels_match_portable),
        cmocka_unit_test(test_attention_step_matches_pieces),
        cmocka_unit_test(test_attention_kv_bytes_per_token),
        cmocka_unit_test(test_kv_every_slot_its_own_bytes),
        cmocka_unit_test(test_attention_divided_partials_combine),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
