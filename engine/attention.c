/*
 * attention.c - online-softmax attention walking KV blocks (the FlashAttention
 * recurrence, Dao et al. 2022, applied per KV block):
 *
 *   for each block of keys in range:
 *     s_j   = q . k_j * scale                   (scores of this block)
 *     m'    = max(m, max_j s_j)
 *     l     = l * exp(m - m') + sum_j exp(s_j - m')
 *     acc   = acc * exp(m - m') + sum_j exp(s_j - m') v_j
 *     m     = m'
 *   out = acc / l
 */
#include "engine/attention.h"

#include <math.h>
#include <string.h>

#include "engine/base/alloc.h"
#include "engine/kernels/kernels.h"
#include "engine/threadpool.h"

size_t attention_scratch_floats(int32_t n_head, int32_t n_head_kv, int32_t head_dim,
                                int32_t block_size) {
    size_t n_rep = (size_t)(n_head / n_head_kv);
    // acc [n_rep][head_dim] + m, l [n_rep] + scores [n_rep][block_size]
    return n_rep * (size_t)head_dim + 2 * n_rep + n_rep * (size_t)block_size;
}

/* Thread ith takes the items ith, ith + nth, ...: interleaving balances causal
 * prefill, where later tokens attend to more keys than earlier ones. */
static void attention_items(void *arg, int64_t begin, int64_t end, int32_t ith, int32_t nth) {
    (void)begin;
    (void)end;
    const struct attention_args *a = arg;
    const struct kv_store *kv = a->kv;
    const struct engine_batch *b = a->batch;
    const int32_t n_head_kv = kv->n_head_kv;
    const int32_t hd = kv->head_dim;
    const int32_t bs = kv->block_size;
    const int32_t n_rep = a->n_head / n_head_kv;
    const struct kern_dispatch *kd = kern_get();

    float *acc = a->scratch + (size_t)ith * a->scratch_floats;  // [n_rep][hd]
    float *m = acc + (size_t)n_rep * hd;                        // [n_rep]
    float *l = m + n_rep;                                       // [n_rep]
    float *s = l + n_rep;                                       // [n_rep][bs]

    const int64_t n_items = (int64_t)b->n_tokens * n_head_kv;
    for (int64_t item = ith; item < n_items; item += nth) {
        const int32_t t = (int32_t)(item / n_head_kv);
        const int32_t g = (int32_t)(item % n_head_kv);
        const int32_t pos = b->pos[t];
        const struct engine_seq *sq = &b->seqs[b->seq[t]];
        const int32_t first = a->window > 0 && pos - a->window + 1 > 0 ? pos - a->window + 1 : 0;
        const float *q = a->q + ((size_t)t * a->n_head + (size_t)g * n_rep) * hd;  // [n_rep][hd]

        memset(acc, 0, (size_t)n_rep * hd * sizeof(float));
        for (int32_t r = 0; r < n_rep; r++) {
            m[r] = -INFINITY;
            l[r] = 0.0f;
        }
        for (int32_t bi = first / bs; bi <= pos / bs; bi++) {
            ASSERT(bi < sq->n_blocks);
            const int32_t block = sq->block_table[bi];
            ASSERT(block > 0 && block < kv->n_blocks);
            const int32_t j0 = bi * bs > first ? 0 : first - bi * bs;      // first slot
            const int32_t j1 = (bi + 1) * bs - 1 < pos ? bs : pos - bi * bs + 1;  // end slot
            const float *kt = kv_k_tile(kv, a->layer, block, g);  // [bs][hd]
            const float *vt = kv_v_tile(kv, a->layer, block, g);  // [bs][hd]
            for (int32_t r = 0; r < n_rep; r++) {
                const float *qr = q + (size_t)r * hd;
                float *sr = s + (size_t)r * bs;
                float mx = m[r];
                for (int32_t j = j0; j < j1; j++) {
                    sr[j] = kd->dot_f32(qr, kt + (size_t)j * hd, hd) * a->scale;
                    if (sr[j] > mx) mx = sr[j];
                }
                const float corr = expf(m[r] - mx);  // 0 on the first block (m = -inf)
                float *ar = acc + (size_t)r * hd;
                float sum = l[r] * corr;
                for (int32_t d = 0; d < hd; d++) ar[d] *= corr;
                for (int32_t j = j0; j < j1; j++) {
                    const float p = expf(sr[j] - mx);
                    sum += p;
                    const float *vj = vt + (size_t)j * hd;
                    for (int32_t d = 0; d < hd; d++) ar[d] += p * vj[d];
                }
                m[r] = mx;
                l[r] = sum;
            }
        }
        float *o = a->out + ((size_t)t * a->n_head + (size_t)g * n_rep) * hd;
        for (int32_t r = 0; r < n_rep; r++) {
            const float inv = 1.0f / l[r];
            for (int32_t d = 0; d < hd; d++) o[(size_t)r * hd + d] = acc[(size_t)r * hd + d] * inv;
        }
    }
}

void attention_run(struct threadpool *pool, const struct attention_args *a) {
    threadpool_run(pool, threadpool_n_threads(pool), 1, attention_items, (void *)a);
}
