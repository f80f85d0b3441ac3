/*
 * test_attention.c - attention over paged KV against a naive float64
 * softmax(q K^T * scale) V, for random shapes: head dims 8/64/80/128, GQA
 * ratios 1/4/8, contexts up to 8192, block sizes that put block boundaries at
 * every offset, sliding windows, prefill tiles and decode rows, shuffled block
 * tables; with the SIMD and the portable kernels.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "engine/attention.h"
#include "engine/threadpool.h"

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

static void check_shape(struct threadpool *pool, const struct shape *sh, bool portable) {
    const int32_t hd = sh->head_dim;
    const int32_t n_kv = sh->n_head_kv;
    const int32_t n_head = n_kv * sh->n_rep;
    const int32_t bs = sh->block_size;
    const int32_t n_blocks_seq = (sh->ctx + bs - 1) / bs;
    struct kv_store kv;
    assert_int_equal(kv_init(&kv, 1, n_blocks_seq + 1, bs, n_kv, hd), 0);

    // The sequence's blocks in shuffled order; K/V values kept for the oracle.
    int32_t *table = malloc((size_t)n_blocks_seq * sizeof(int32_t));
    for (int32_t i = 0; i < n_blocks_seq; i++) table[i] = i + 1;
    for (int32_t i = n_blocks_seq - 1; i > 0; i--) {
        int32_t j = (int32_t)(rng % (uint64_t)(i + 1));
        frand();
        int32_t tmp = table[i];
        table[i] = table[j];
        table[j] = tmp;
    }
    float *K = malloc((size_t)sh->ctx * n_kv * hd * sizeof(float));  // [pos][kvh][d]
    float *V = malloc((size_t)sh->ctx * n_kv * hd * sizeof(float));
    for (int32_t p = 0; p < sh->ctx; p++) {
        for (int32_t g = 0; g < n_kv; g++) {
            float *kt = kv_k_tile(&kv, 0, table[p / bs], g);
            float *vt = kv_v_tile(&kv, 0, table[p / bs], g);
            for (int32_t d = 0; d < hd; d++) {
                float k = frand() * 2.0f, v = frand();
                K[((size_t)p * n_kv + g) * hd + d] = k;
                V[((size_t)p * n_kv + g) * hd + d] = v;
                kt[(size_t)d * bs + p % bs] = k;
                vt[(size_t)(p % bs) * hd + d] = v;
            }
        }
    }

    const int32_t nq = sh->n_query;
    int32_t *tok = calloc((size_t)nq, sizeof(int32_t));
    int32_t *pos = malloc((size_t)nq * sizeof(int32_t));
    int32_t *seq = calloc((size_t)nq, sizeof(int32_t));
    int8_t *out_flag = calloc((size_t)nq, 1);
    for (int32_t i = 0; i < nq; i++) pos[i] = sh->ctx - nq + i;
    struct engine_seq s = {.block_table = table, .n_blocks = n_blocks_seq};
    struct engine_batch b = {.n_tokens = nq, .token = tok, .pos = pos, .seq = seq,
                             .output = out_flag, .n_seqs = 1, .seqs = &s};
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
        .kern = kern_attn_select(portable), .scratch = scratch, .scratch_floats = sf,
    };
    attention_run(pool, &a);

    double *w = malloc((size_t)sh->ctx * sizeof(double));
    for (int32_t i = 0; i < nq; i++) {
        const int32_t p = pos[i];
        const int32_t lo = sh->window > 0 && p - sh->window + 1 > 0 ? p - sh->window + 1 : 0;
        for (int32_t h = 0; h < n_head; h++) {
            const int32_t g = h / sh->n_rep;
            const float *qh = q + ((size_t)i * n_head + h) * hd;
            double mx = -INFINITY;
            for (int32_t j = lo; j <= p; j++) {
                double sdot = 0.0;
                for (int32_t d = 0; d < hd; d++) sdot += (double)qh[d] * K[((size_t)j * n_kv + g) * hd + d];
                w[j] = sdot * scale;
                if (w[j] > mx) mx = w[j];
            }
            double sum = 0.0;
            for (int32_t j = lo; j <= p; j++) sum += (w[j] = exp(w[j] - mx));
            const float *oh = out + ((size_t)i * n_head + h) * hd;
            for (int32_t d = 0; d < hd; d++) {
                double e = 0.0;
                for (int32_t j = lo; j <= p; j++) e += w[j] * V[((size_t)j * n_kv + g) * hd + d];
                e /= sum;
                if (fabs(oh[d] - e) > 2e-5) {
                    fail_msg("hd=%d kv=%d rep=%d bs=%d ctx=%d window=%d %s: query %d head %d "
                             "dim %d: %g vs %g", hd, n_kv, sh->n_rep, bs, sh->ctx, sh->window,
                             portable ? "portable" : a.kern->isa, i, h, d, (double)oh[d], e);
                }
            }
        }
    }
    free(w);
    free(scratch);
    free(tiles);
    free(q);
    free(out);
    free(tok);
    free(pos);
    free(seq);
    free(out_flag);
    free(K);
    free(V);
    free(table);
    kv_free(&kv);
}

static void test_attention_matches_naive_softmax(void **state) {
    (void)state;
    struct threadpool *pool = threadpool_create(2);
    const int32_t dims[] = {8, 64, 80, 128};
    const int32_t reps[] = {1, 4, 8};
    for (int portable = 0; portable < 2; portable++) {
        for (size_t di = 0; di < 4; di++) {
            for (size_t ri = 0; ri < 3; ri++) {
                // Contexts 1..~70 with prefill runs crossing block edges, odd block sizes.
                for (int32_t ctx = 1; ctx <= 70; ctx += 23) {
                    struct shape sh = {dims[di], 2, reps[ri], 16, ctx, 0, ctx < 13 ? ctx : 13};
                    check_shape(pool, &sh, portable);
                    sh.block_size = 5;
                    check_shape(pool, &sh, portable);
                    sh.window = 7;
                    check_shape(pool, &sh, portable);
                }
            }
        }
    }
    threadpool_free(pool);
}

static void test_attention_every_block_offset(void **state) {
    (void)state;
    struct threadpool *pool = threadpool_create(2);
    // Decode rows and short runs ending at every offset inside a block.
    for (int32_t ctx = 1; ctx <= 40; ctx++) {
        struct shape sh = {16, 1, 2, 8, ctx, 0, 1 + ctx % 9};
        check_shape(pool, &sh, false);
        sh.window = 3 + ctx % 5;
        check_shape(pool, &sh, true);
    }
    threadpool_free(pool);
}

static void test_attention_long_context(void **state) {
    (void)state;
    struct threadpool *pool = threadpool_create(2);
    struct shape sh = {128, 1, 8, 16, 8192, 0, 3};
    check_shape(pool, &sh, false);
    struct shape sw = {64, 2, 4, 16, 4100, 1000, 9};
    check_shape(pool, &sw, false);
    threadpool_free(pool);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_attention_matches_naive_softmax),
        cmocka_unit_test(test_attention_every_block_offset),
        cmocka_unit_test(test_attention_long_context),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
