/*
 * bench_attention.c - attention time per token against context length, for
 * decode (one query per sequence) and prefill (a causal run of queries), on
 * the engine's paged KV layout with random K/V (a benchmark, not a test).
 *
 * usage: bench_attention [threads] [head_dim] [n_head] [n_head_kv] [f32|f16|q8_0|all]
 * Prints a markdown table: context, then decode us/token and prefill us/token
 * for each KV type asked for (all: f32, f16 and q8_0, interleaved per context
 * so a noisy machine affects each alike), and the KV bytes per token.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/attention.h"
#include "engine/base/alloc.h"
#include "engine/kernels/kernels.h"
#include "engine/threadpool.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Seconds per call of attention over n_q queries ending at position ctx - 1. */
static double run(struct threadpool *pool, const struct kv_store *kv, int32_t *table,
                  int32_t n_blocks, int32_t ctx, int32_t n_q, int32_t n_head, int reps) {
    ASSERT(kv->n_blocks > n_blocks);
    const int32_t hd = kv->head_dim;
    int32_t *pos = malloc((size_t)n_q * sizeof(int32_t));
    int32_t *zeros = calloc((size_t)n_q, sizeof(int32_t));
    int8_t *outf = calloc((size_t)n_q, 1);
    for (int32_t i = 0; i < n_q; i++) pos[i] = ctx - n_q + i;
    struct engine_seq s = {.block_table = table, .n_blocks = n_blocks};
    struct engine_batch b = {.n_tokens = n_q, .token = zeros, .pos = pos, .seq = zeros,
                             .output = outf, .n_seqs = 1, .seqs = &s};
    float *q = malloc((size_t)n_q * n_head * hd * sizeof(float));
    float *out = malloc((size_t)n_q * n_head * hd * sizeof(float));
    for (size_t i = 0; i < (size_t)n_q * n_head * hd; i++) q[i] = (float)(i % 13) * 0.01f;
    struct attention_tile *tiles = malloc((size_t)n_q * sizeof(*tiles));
    size_t sf = attention_scratch_floats(n_head, kv->n_head_kv, hd, kv->block_size);
    float *scratch = malloc(sf * (size_t)threadpool_n_threads(pool) * sizeof(float));
    struct attention_args a = {
        .kv = kv, .layer = 0, .batch = &b, .tiles = tiles, .n_tiles = attention_tiles(&b, tiles),
        .q = q, .out = out, .n_head = n_head, .window = 0, .scale = 1.0f / sqrtf((float)hd),
        .kern = kern_attn_select(kv->type, KERN_ISA_VNNI), .scratch = scratch,
        .scratch_floats = sf,
    };
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        double t0 = now_s();
        attention_run(pool, &a);
        double dt = now_s() - t0;
        if (dt < best) best = dt;
    }
    free(pos);
    free(zeros);
    free(outf);
    free(q);
    free(out);
    free(tiles);
    free(scratch);
    return best;
}

int main(int argc, char **argv) {
    int32_t n_threads = argc > 1 ? atoi(argv[1]) : 2;
    int32_t hd = argc > 2 ? atoi(argv[2]) : 64;
    int32_t n_head = argc > 3 ? atoi(argv[3]) : 12;
    int32_t n_head_kv = argc > 4 ? atoi(argv[4]) : 12;
    const char *which = argc > 5 ? argv[5] : "all";
    enum engine_kv_type types[ENGINE_KV_TYPE_COUNT];
    int n_types = 0;
    if (strcmp(which, "all") == 0) {
        for (int t = 0; t < ENGINE_KV_TYPE_COUNT; t++) types[n_types++] = (enum engine_kv_type)t;
    } else if (engine_kv_type_parse(which, &types[0]) == 0) {
        n_types = 1;
    } else {
        fprintf(stderr, "bench_attention: kv type '%s' is not one of f32, f16, q8_0, all\n", which);
        return 2;
    }
    const int32_t bs = 16;
    const int32_t max_ctx = 8192;
    const int32_t n_blocks = max_ctx / bs + 1;
    kern_dispatch_init(false);
    struct threadpool *pool = threadpool_create(n_threads);
    if (!pool) return 1;
    struct kv_store kv[ENGINE_KV_TYPE_COUNT];
    float *k = malloc((size_t)n_head_kv * hd * sizeof(float));
    float *v = malloc((size_t)n_head_kv * hd * sizeof(float));
    for (int t = 0; t < n_types; t++) {
        if (kv_init(&kv[t], types[t], 1, n_blocks, bs, n_head_kv, hd) != 0) return 1;
        for (int32_t p = 0; p < max_ctx; p++) {
            for (int32_t i = 0; i < n_head_kv * hd; i++) {
                k[i] = (float)((p * 7 + i) % 17) * 0.01f;
                v[i] = (float)((p * 3 + i) % 11) * 0.01f;
            }
            kv_write_token(&kv[t], 0, p / bs + 1, p % bs, k, v);
        }
    }
    int32_t *table = malloc((size_t)(max_ctx / bs) * sizeof(int32_t));
    for (int32_t i = 0; i < max_ctx / bs; i++) table[i] = i + 1;
    printf("one layer, head_dim %d, %d heads, %d kv heads, block %d, %d threads, isa %s\n\n", hd,
           n_head, n_head_kv, bs, n_threads, kern_attn_select(types[0], KERN_ISA_VNNI)->isa);
    printf("KV bytes per token of this layer (K + V, all kv heads):");
    for (int t = 0; t < n_types; t++) {
        printf(" %s %zu", engine_kv_type_name(types[t]),
               kv_block_bytes(types[t], 1, n_head_kv, hd, bs) / (size_t)bs);
    }
    printf("\n\n| context |");
    for (int t = 0; t < n_types; t++) printf(" decode us/token %s |", engine_kv_type_name(types[t]));
    for (int t = 0; t < n_types; t++) printf(" prefill us/token %s |", engine_kv_type_name(types[t]));
    printf("\n|---:|");
    for (int t = 0; t < 2 * n_types; t++) printf("---:|");
    printf("\n");
    for (int32_t ctx = 512; ctx <= max_ctx; ctx *= 2) {
        double dec[ENGINE_KV_TYPE_COUNT], pre[ENGINE_KV_TYPE_COUNT];
        for (int t = 0; t < n_types; t++) {
            dec[t] = run(pool, &kv[t], table, ctx / bs, ctx, 1, n_head, 20);
        }
        for (int t = 0; t < n_types; t++) {
            pre[t] = run(pool, &kv[t], table, ctx / bs, ctx, ctx, n_head, ctx <= 2048 ? 3 : 1);
        }
        printf("| %d |", ctx);
        for (int t = 0; t < n_types; t++) printf(" %.1f |", dec[t] * 1e6);
        for (int t = 0; t < n_types; t++) printf(" %.1f |", pre[t] * 1e6 / ctx);
        printf("\n");
    }
    for (int t = 0; t < n_types; t++) kv_free(&kv[t]);
    free(k);
    free(v);
    free(table);
    threadpool_free(pool);
    return 0;
}
