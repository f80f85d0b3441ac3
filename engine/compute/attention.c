/*
 * attention.c - online-softmax attention walking KV blocks (the FlashAttention
 * recurrence, Dao et al. 2022, with the KV block as the key tile):
 *
 *   for each block of keys in range, for each query row r of the tile:
 *     s_j   = q_r . k_j * scale, masked to the row's causal/window range
 *     m'    = max(m, max_j s_j)
 *     l     = l * exp(m - m') + sum_j exp(s_j - m')
 *     acc   = acc * exp(m - m') + sum_j exp(s_j - m') v_j
 *     m     = m'
 *   out_r = acc / l
 *
 * K tiles are stored transposed ([head_dim][block_size], engine/kv.h) so the
 * scores of a block come from vector FMAs with no horizontal sums. The walk is
 * the same for every KV type: the kernels (kern_attn, one table per type)
 * read f16 and q8_0 tiles as they are, converting in registers. Where the
 * table has a fused step (AVX-512), one call per block does the scores,
 * softmax update and P.V of all the item's rows; else the pieces below.
 */
#include "engine/compute/attention.h"

#include <math.h>
#include <stdatomic.h>
#include <string.h>

#include "engine/base/alloc.h"
#include "engine/kernels/threadpool.h"

size_t attention_scratch_floats(int32_t n_head, int32_t n_head_kv, int32_t head_dim,
                                int32_t block_size) {
    size_t rows = (size_t)ATTENTION_TILE * (size_t)(n_head / n_head_kv);
    // scores [rows][bs] (at least a fused step's [KERN_ATTN_ROWS][KERN_ATTN_RUN * bs])
    // + p [bs] + acc [rows][hd] + m, l [rows]
    size_t s_floats = rows * (size_t)block_size;
    const size_t step_floats = (size_t)KERN_ATTN_ROWS * KERN_ATTN_RUN * (size_t)block_size;
    s_floats = s_floats > step_floats ? s_floats : step_floats;
    return s_floats + (size_t)block_size + rows * (size_t)head_dim + 2 * rows;
}

int32_t attention_tiles(const struct engine_batch *b, struct attention_tile *tiles) {
    int32_t n = 0;
    for (int32_t t = 0; t < b->n_tokens;) {
        int32_t len = 1;
        while (len < ATTENTION_TILE && t + len < b->n_tokens &&
               b->seq[t + len] == b->seq[t] && b->pos[t + len] == b->pos[t] + len) {
            len++;
        }
        tiles[n++] = (struct attention_tile){.t0 = t, .n = len};
        t += len;
    }
    return n;
}

/* The KV block holding the sequence's keys bi * bs .. bi * bs + bs - 1. */
static int32_t block_of(const struct kv_store *kv, const struct engine_seq *sq, int32_t bi) {
    ASSERT(bi < sq->n_blocks);
    const int32_t block = sq->block_table[bi];
    ASSERT(block > 0 && block < kv->n_blocks);
    return block;
}

/* The K and V tiles of kv head g for blocks b0 .. min(b0 + KERN_ATTN_RUN - 1,
 * b_last) of the sequence into kv_tiles[0][], kv_tiles[1][]; NULL for blocks
 * before b_first, which no row reads (they may have been freed: sliding
 * window). Returns how many blocks (0 when b0 > b_last). */
static int32_t run_tiles(const struct kv_store *kv, const struct engine_seq *sq, int32_t layer,
                         int32_t g, int32_t b0, int32_t b_first, int32_t b_last,
                         const void *kv_tiles[2][KERN_ATTN_RUN]) {
    int32_t n = 0;
    for (; n < KERN_ATTN_RUN && b0 + n <= b_last; n++) {
        if (b0 + n < b_first) {
            kv_tiles[0][n] = kv_tiles[1][n] = NULL;
            continue;
        }
        const int32_t block = block_of(kv, sq, b0 + n);
        kv_tiles[0][n] = kv_k_tile(kv, layer, block, g);
        kv_tiles[1][n] = kv_v_tile(kv, layer, block, g);
    }
    return n;
}

/* Asks for the K and V tiles of kv head g of the sequence's block bi in the
 * cache ahead of their use (a hint: nothing is read). The unfused path walks
 * a sequence's blocks one by one, and a short sequence's walk is over before
 * the hardware prefetcher has learnt its stride: 32 sequences of 256 tokens
 * read their f16 KV at 0.63x of the triad bandwidth, one of 8192 at 1.1x
 * (docs/benchmarks.md). */
static void prefetch_block(const struct kv_store *kv, const struct engine_seq *sq, int32_t layer,
                           int32_t g, int32_t bi) {
    const int32_t block = block_of(kv, sq, bi);
    const char *kt = kv_k_tile(kv, layer, block, g);
    const char *vt = kv_v_tile(kv, layer, block, g);
    for (size_t o = 0; o < kv->tile_bytes; o += 64) {
        __builtin_prefetch(kt + o);
        __builtin_prefetch(vt + o);
    }
}

/* The region's items, (query tile, kv head), claimed one at a time by every
 * thread from a shared counter rather than dealt in advance: on a shared host
 * one vCPU can run a third slower than the other for seconds (the step thread
 * took 1.4-1.8 s of attention against the worker's 1.1-1.3 s over the same
 * number of equal items, docs/benchmarks.md), and then a fixed deal leaves
 * the faster one waiting. An item's result does not depend on the thread
 * that runs it. */
struct attention_queue {
    const struct attention_args *a;
    atomic_int_fast64_t next;  // the first item not claimed yet
};

static void attention_items(void *arg, int64_t begin, int64_t end, int32_t ith, int32_t nth) {
    (void)begin;
    (void)end;
    (void)nth;
    struct attention_queue *aq = arg;
    const struct attention_args *a = aq->a;
    const struct kv_store *kv = a->kv;
    const struct engine_batch *b = a->batch;
    const struct kern_attn *kern = a->kern;
    ASSERT(kern->kv_type == kv->type);
    const int32_t n_head_kv = kv->n_head_kv;
    const int32_t hd = kv->head_dim;
    const int32_t bs = kv->block_size;
    const int32_t n_rep = a->n_head / n_head_kv;
    const int32_t max_rows = ATTENTION_TILE * n_rep;
    const bool is_part = a->part_m != NULL;
    ASSERT(is_part == (kv->n_parts > 1));

    const size_t s_floats = (size_t)max_rows * bs > (size_t)KERN_ATTN_ROWS * KERN_ATTN_RUN * bs
                                ? (size_t)max_rows * bs
                                : (size_t)KERN_ATTN_ROWS * KERN_ATTN_RUN * bs;
    float *S = a->scratch + (size_t)ith * a->scratch_floats;  // [max_rows][bs], or a step's
    float *P = S + s_floats;                                   // [bs]
    float *acc = P + bs;                                       // [max_rows][hd]
    float *m = acc + (size_t)max_rows * hd;                    // [max_rows]
    float *l = m + max_rows;                                   // [max_rows]
    const float *qrow[ATTENTION_TILE * 64];                    // row pointers (n_rep <= 64)
    int32_t row_lo[ATTENTION_TILE * 64];                       // first key position per row
    int32_t row_hi[ATTENTION_TILE * 64];                       // last key position per row
    ASSERT(n_rep <= 64);

    const int64_t n_items = (int64_t)a->n_tiles * n_head_kv;
    int64_t next = atomic_fetch_add_explicit(&aq->next, 1, memory_order_relaxed);
    for (int64_t item = next; item < n_items; item = next) {
        // The next item is claimed before this one runs, so that its first
        // block can be prefetched at the end of this one.
        next = atomic_fetch_add_explicit(&aq->next, 1, memory_order_relaxed);
        const struct attention_tile *tile = &a->tiles[item / n_head_kv];
        const int32_t g = (int32_t)(item % n_head_kv);
        const struct engine_seq *sq = &b->seqs[b->seq[tile->t0]];
        const int32_t n_rows = tile->n * n_rep;

        // Rows: (token, query head of group g); keys [lo, hi] per row.
        for (int32_t tt = 0; tt < tile->n; tt++) {
            const int32_t t = tile->t0 + tt;
            const int32_t pos = b->pos[t];
            const int32_t lo = a->window > 0 && pos - a->window + 1 > 0 ? pos - a->window + 1 : 0;
            for (int32_t h = 0; h < n_rep; h++) {
                const int32_t r = tt * n_rep + h;
                qrow[r] = a->q + ((size_t)t * a->n_head + (size_t)g * n_rep + h) * hd;
                row_lo[r] = lo;
                row_hi[r] = pos;
                m[r] = -INFINITY;
                l[r] = 0.0f;
            }
        }
        memset(acc, 0, (size_t)n_rows * hd * sizeof(float));

        const int32_t first = row_lo[0];              // smallest lo of the tile
        const int32_t last = row_hi[n_rows - 1];      // largest hi of the tile
        if (kern->step && is_part) {
            // A divided cache: this rank's blocks one step each (its blocks are
            // seldom consecutive ids, and the step's units want no gaps).
            for (int32_t bi = first / bs; bi <= last / bs; bi++) {
                const int32_t block = block_of(kv, sq, bi);
                if (!kv_holds(kv, block)) continue;
                const void *kt = kv_k_tile(kv, a->layer, block, g);
                const void *vt = kv_v_tile(kv, a->layer, block, g);
                struct kern_attn_step st = {
                    .q = qrow, .lo = row_lo, .hi = row_hi, .n_rows = n_rows, .pos0 = bi * bs,
                    .n_blocks = 1, .hd = hd, .bs = bs, .scale = a->scale, .kt = &kt, .vt = &vt,
                    .n_next = 0, .tile_bytes = kv->tile_bytes, .m = m, .l = l, .acc = acc,
                    .scratch = S,
                };
                kern->step(&st);
            }
        } else if (kern->step) {
            // The fused kernel: all rows over runs of up to KERN_ATTN_RUN blocks
            // that start at multiples of KERN_ATTN_RUN (whatever the rows, so the
            // kernel's units, and a row's bits, do not depend on the batch),
            // told the tiles of the following run so it can prefetch them.
            const void *tiles[2][2][KERN_ATTN_RUN];  // [run parity][K, V][block of the run]
            const int32_t b_first = first / bs, b_last = last / bs;
            int32_t bi = b_first / KERN_ATTN_RUN * KERN_ATTN_RUN;
            int32_t nb = run_tiles(kv, sq, a->layer, g, bi, b_first, b_last, tiles[0]);
            for (int32_t i = 0; bi <= b_last; bi += KERN_ATTN_RUN, i ^= 1) {
                const int32_t n_next = run_tiles(kv, sq, a->layer, g, bi + KERN_ATTN_RUN, b_first,
                                                 b_last, tiles[i ^ 1]);
                struct kern_attn_step st = {
                    .q = qrow, .lo = row_lo, .hi = row_hi, .n_rows = n_rows, .pos0 = bi * bs,
                    .n_blocks = nb, .hd = hd, .bs = bs, .scale = a->scale,
                    .kt = tiles[i][0], .vt = tiles[i][1],
                    .kt_next = tiles[i ^ 1][0], .vt_next = tiles[i ^ 1][1], .n_next = n_next,
                    .tile_bytes = kv->tile_bytes, .m = m, .l = l, .acc = acc, .scratch = S,
                };
                kern->step(&st);
                nb = n_next;
            }
        }
        for (int32_t bi = first / bs; !kern->step && bi <= last / bs; bi++) {
            if (is_part) {  // this rank's blocks only (no prefetch: which is next is not known)
                if (!kv_holds(kv, block_of(kv, sq, bi))) continue;
            } else if (bi < last / bs) {
                prefetch_block(kv, sq, a->layer, g, bi + 1);
            } else if (next < n_items) {  // this thread's next item's first block
                const struct attention_tile *nt = &a->tiles[next / n_head_kv];
                const int32_t p0 = b->pos[nt->t0];
                const int32_t lo0 = a->window > 0 && p0 - a->window + 1 > 0 ? p0 - a->window + 1 : 0;
                prefetch_block(kv, &b->seqs[b->seq[nt->t0]], a->layer,
                               (int32_t)(next % n_head_kv), lo0 / bs);
            }
            const int32_t block = block_of(kv, sq, bi);
            const int32_t base = bi * bs;
            const void *kt = kv_k_tile(kv, a->layer, block, g);  // [hd][bs] of kv->type
            const void *vt = kv_v_tile(kv, a->layer, block, g);  // [bs][hd] of kv->type

            // Scores of every row against the whole block, 4 rows at a time.
            for (int32_t r = 0; r < n_rows; r += KERN_ATTN_ROWS) {
                int32_t nr = n_rows - r < KERN_ATTN_ROWS ? n_rows - r : KERN_ATTN_ROWS;
                kern->scores(qrow + r, nr, kt, hd, bs, a->scale, S + (size_t)r * bs);
            }
            // Online softmax update of each row over its keys in this block.
            for (int32_t r = 0; r < n_rows; r++) {
                const int32_t j0 = row_lo[r] > base ? row_lo[r] - base : 0;
                const int32_t j1 = row_hi[r] - base < bs - 1 ? row_hi[r] - base : bs - 1;
                if (j0 > j1) continue;  // none of this row's keys are in the block
                const float *sr = S + (size_t)r * bs;
                float mx = m[r];
                for (int32_t j = j0; j <= j1; j++) mx = sr[j] > mx ? sr[j] : mx;
                const float corr = expf(m[r] - mx);  // 0 on the row's first block
                const float sum = kern->exp_sum(P, sr + j0, mx, j1 - j0 + 1);
                kern->pv(acc + (size_t)r * hd, corr, P, vt, j0, j1 - j0 + 1, hd, bs);
                l[r] = l[r] * corr + sum;
                m[r] = mx;
            }
        }
        for (int32_t r = 0; r < n_rows; r++) {
            const int32_t tt = r / n_rep;
            const int32_t h = r % n_rep;
            const size_t row = (size_t)(tile->t0 + tt) * a->n_head + (size_t)g * n_rep + h;
            float *o = a->out + row * hd;
            if (is_part) {
                a->part_m[row] = m[r];
                a->part_l[row] = l[r];
                memcpy(o, acc + (size_t)r * hd, (size_t)hd * sizeof(float));
                continue;
            }
            const float inv = 1.0f / l[r];
            for (int32_t d = 0; d < hd; d++) o[d] = acc[(size_t)r * hd + d] * inv;
        }
    }
}

void attention_run(struct threadpool *pool, const struct attention_args *a) {
    struct attention_queue aq = {.a = a};
    atomic_init(&aq.next, 0);
    threadpool_run(pool, threadpool_n_threads(pool), 1, attention_items, &aq);
}
