/*
 * bench_attention.c - attention time per token against context length, for
 * decode (one query per sequence) and prefill (a causal run of queries), on
 * the engine's paged KV layout with random K/V (a benchmark, not a test).
 *
 * usage: bench_attention [threads] [head_dim] [n_head] [n_head_kv] [f32|f16|q8_0|all] [ISAS]
 * ISAS is a comma-separated list of kernel levels to compare (portable, avx2,
 * avx512; default: the best the CPU has); a level above the CPU's runs the
 * CPU's best. Prints a markdown table: context, then decode us/token and
 * prefill us/token for each (level, KV type) asked for, interleaved per
 * context so a noisy machine affects each alike, and the KV bytes per token;
 * then a decode step of 32 sequences of 64..256 tokens each (one query each,
 * distinct blocks): us per step and the GB/s of the KV bytes it reads.
 * Each cell is the best of several runs. With 1 thread the work runs on the
 * calling thread and its time is that thread's CPU time, which other
 * processes on a shared machine do not inflate (they still share the caches
 * and memory); with more, it is wall time.
 */
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/compute/attention.h"
#include "engine/base/alloc.h"
#include "engine/kernels/kernels.h"
#include "engine/kernels/threadpool.h"

/* Seconds on the calling thread's CPU clock (cpu_time) or the monotonic clock. */
static double now_s(bool cpu_time) {
    struct timespec ts;
    clock_gettime(cpu_time ? CLOCK_THREAD_CPUTIME_ID : CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Seconds per call of attention over n_q queries ending at position ctx - 1. */
static double run(struct threadpool *pool, const struct kv_store *kv,
                  const struct kern_attn *kern, int32_t *table, int32_t n_blocks, int32_t ctx,
                  int32_t n_q, int32_t n_head, int reps) {
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
        .kern = kern, .scratch = scratch, .scratch_floats = sf,
    };
    const bool cpu_time = threadpool_n_threads(pool) == 1;
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        double t0 = now_s(cpu_time);
        attention_run(pool, &a);
        double dt = now_s(cpu_time) - t0;
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

/* Seconds per call of decode attention for n_seqs sequences of ctx tokens
 * each, one query each, in one batch (a decode step of n_seqs streams): the
 * sequences' blocks are distinct, n_seqs * ctx / bs of them from block 1. */
static double run_batch(struct threadpool *pool, const struct kv_store *kv,
                        const struct kern_attn *kern, int32_t n_seqs, int32_t ctx, int32_t n_head,
                        int reps) {
    const int32_t bs = kv->block_size, nb = ctx / bs;
    ASSERT(kv->n_blocks > n_seqs * nb);
    const int32_t hd = kv->head_dim;
    int32_t *table = malloc((size_t)n_seqs * nb * sizeof(int32_t));
    int32_t *pos = malloc((size_t)n_seqs * sizeof(int32_t));
    int32_t *sq = malloc((size_t)n_seqs * sizeof(int32_t));
    int32_t *zeros = calloc((size_t)n_seqs, sizeof(int32_t));
    int8_t *outf = calloc((size_t)n_seqs, 1);
    struct engine_seq *seqs = malloc((size_t)n_seqs * sizeof(*seqs));
    for (int32_t i = 0; i < n_seqs; i++) {
        for (int32_t j = 0; j < nb; j++) table[i * nb + j] = 1 + i * nb + j;
        seqs[i] = (struct engine_seq){.block_table = table + i * nb, .n_blocks = nb};
        pos[i] = ctx - 1;
        sq[i] = i;
    }
    struct engine_batch b = {.n_tokens = n_seqs, .token = zeros, .pos = pos, .seq = sq,
                             .output = outf, .n_seqs = n_seqs, .seqs = seqs};
    float *q = malloc((size_t)n_seqs * n_head * hd * sizeof(float));
    float *out = malloc((size_t)n_seqs * n_head * hd * sizeof(float));
    for (size_t i = 0; i < (size_t)n_seqs * n_head * hd; i++) q[i] = (float)(i % 13) * 0.01f;
    struct attention_tile *tiles = malloc((size_t)n_seqs * sizeof(*tiles));
    size_t sf = attention_scratch_floats(n_head, kv->n_head_kv, hd, bs);
    float *scratch = malloc(sf * (size_t)threadpool_n_threads(pool) * sizeof(float));
    struct attention_args a = {
        .kv = kv, .layer = 0, .batch = &b, .tiles = tiles, .n_tiles = attention_tiles(&b, tiles),
        .q = q, .out = out, .n_head = n_head, .window = 0, .scale = 1.0f / sqrtf((float)hd),
        .kern = kern, .scratch = scratch, .scratch_floats = sf,
    };
    const bool cpu_time = threadpool_n_threads(pool) == 1;
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        double t0 = now_s(cpu_time);
        attention_run(pool, &a);
        double dt = now_s(cpu_time) - t0;
        if (dt < best) best = dt;
    }
    free(table);
    free(pos);
    free(sq);
    free(zeros);
    free(outf);
    free(seqs);
    free(q);
    free(out);
    free(tiles);
    free(scratch);
    return best;
}

/* Parses "avx2,avx512" into levels; returns how many, or -1. */
static int parse_isas(const char *list, enum kern_isa out[3]) {
    static const struct {
        const char *name;
        enum kern_isa isa;
    } names[] = {{"portable", KERN_ISA_PORTABLE}, {"avx2", KERN_ISA_AVX2},
                 {"avx512", KERN_ISA_AVX512}};
    int n = 0;
    for (const char *p = list; *p;) {
        const size_t len = strcspn(p, ",");
        int found = -1;
        for (int i = 0; i < 3; i++) {
            if (strlen(names[i].name) == len && strncmp(p, names[i].name, len) == 0) found = i;
        }
        if (found < 0 || n == 3) return -1;
        out[n++] = names[found].isa;
        p += len + (p[len] == ',');
    }
    return n;
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
    enum kern_isa isas[3] = {KERN_ISA_VNNI};
    int n_isas = argc > 6 ? parse_isas(argv[6], isas) : 1;
    if (n_isas <= 0) {
        fprintf(stderr, "bench_attention: '%s' is not a list of portable, avx2, avx512\n",
                argv[6]);
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
    // Columns: every (level, type) pair, level-major.
    const int n_cols = n_isas * n_types;
    const struct kern_attn *kern[3 * ENGINE_KV_TYPE_COUNT];
    const struct kv_store *col_kv[3 * ENGINE_KV_TYPE_COUNT];
    for (int i = 0; i < n_isas; i++) {
        for (int t = 0; t < n_types; t++) {
            kern[i * n_types + t] = kern_attn_select(types[t], isas[i]);
            col_kv[i * n_types + t] = &kv[t];
        }
    }
    int32_t *table = malloc((size_t)(max_ctx / bs) * sizeof(int32_t));
    for (int32_t i = 0; i < max_ctx / bs; i++) table[i] = i + 1;
    printf("one layer, head_dim %d, %d heads, %d kv heads, block %d, %d threads (%s time)\n\n",
           hd, n_head, n_head_kv, bs, n_threads, n_threads == 1 ? "CPU" : "wall");
    printf("KV bytes per token of this layer (K + V, all kv heads):");
    for (int t = 0; t < n_types; t++) {
        printf(" %s %zu", engine_kv_type_name(types[t]),
               kv_block_bytes(types[t], 1, n_head_kv, hd, bs) / (size_t)bs);
    }
    printf("\n\n| context |");
    for (int c = 0; c < n_cols; c++) {
        printf(" decode us/token %s %s |", engine_kv_type_name(col_kv[c]->type), kern[c]->isa);
    }
    for (int c = 0; c < n_cols; c++) {
        printf(" prefill us/token %s %s |", engine_kv_type_name(col_kv[c]->type), kern[c]->isa);
    }
    printf("\n|---:|");
    for (int c = 0; c < 2 * n_cols; c++) printf("---:|");
    printf("\n");
    for (int32_t ctx = 512; ctx <= max_ctx; ctx *= 2) {
        double dec[3 * ENGINE_KV_TYPE_COUNT], pre[3 * ENGINE_KV_TYPE_COUNT];
        for (int c = 0; c < n_cols; c++) {
            dec[c] = run(pool, col_kv[c], kern[c], table, ctx / bs, ctx, 1, n_head, 20);
        }
        for (int c = 0; c < n_cols; c++) {
            pre[c] = run(pool, col_kv[c], kern[c], table, ctx / bs, ctx, ctx, n_head,
                         ctx <= 2048 ? 3 : 1);
        }
        printf("| %d |", ctx);
        for (int c = 0; c < n_cols; c++) printf(" %.1f |", dec[c] * 1e6);
        for (int c = 0; c < n_cols; c++) printf(" %.1f |", pre[c] * 1e6 / ctx);
        printf("\n");
        fflush(stdout);
    }
    // A decode step of 32 streams: each reads its own KV once.
    const int32_t n_streams = 32;
    printf("\n%d sequences in one decode step, one query each (us per step; GB/s of the KV "
           "bytes read)\n\n| context of each |",
           n_streams);
    for (int c = 0; c < n_cols; c++) {
        printf(" us/step %s %s | GB/s |", engine_kv_type_name(col_kv[c]->type), kern[c]->isa);
    }
    printf("\n|---:|");
    for (int c = 0; c < 2 * n_cols; c++) printf("---:|");
    printf("\n");
    for (int32_t ctx = 64; ctx * n_streams <= max_ctx; ctx *= 2) {
        printf("| %d |", ctx);
        for (int c = 0; c < n_cols; c++) {
            const double t = run_batch(pool, col_kv[c], kern[c], n_streams, ctx, n_head, 20);
            const double bytes = (double)kv_block_bytes(col_kv[c]->type, 1, n_head_kv, hd, bs) /
                                 bs * ctx * n_streams;
            printf(" %.1f | %.1f |", t * 1e6, bytes / t * 1e-9);
        }
        printf("\n");
        fflush(stdout);
    }
    for (int t = 0; t < n_types; t++) kv_free(&kv[t]);
    free(k);
    free(v);
    free(table);
    threadpool_free(pool);
    return 0;
}
