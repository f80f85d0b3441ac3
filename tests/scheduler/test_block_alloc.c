/*
 * tests/scheduler/test_block_alloc.c - the block ledger: null block, LRU
 * eviction order, prefix-cache map, and a randomized run of thousands of
 * operations by simulated sequences on tiny pools with every invariant (and
 * n_refs == number of tables holding the block) checked after each one.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "engine/base/err.h"
#include "scheduler/block_alloc.h"
#include "scheduler/block_hash.h"
#include "scheduler/block_table.h"

static void test_block_alloc_never_hands_out_the_null_block(void **state) {
    (void)state;
    struct block_alloc *a;
    assert_int_equal(block_alloc_create(5, 4, &a), 0);
    assert_int_equal(block_alloc_n_total(a), 4);
    int seen[5] = {0};
    for (int i = 0; i < 4; i++) {
        int32_t id = block_alloc_allocate(a);
        assert_true(id >= 1 && id <= 4);
        assert_int_equal(seen[id]++, 0);
        assert_true(block_alloc_check(a));
    }
    assert_int_equal(block_alloc_allocate(a), 0);  // empty
    assert_int_equal(block_alloc_n_used(a), 4);
    assert_int_equal(block_alloc_n_free(a), 0);
    block_alloc_destroy(a);
}

static void test_block_alloc_rejects_bad_sizes(void **state) {
    (void)state;
    struct block_alloc *a = (struct block_alloc *)&a;
    assert_int_equal(block_alloc_create(1, 16, &a), ERR_INVAL);
    assert_null(a);
    assert_int_equal(block_alloc_create(8, 0, &a), ERR_INVAL);
}

static void fill(int32_t *t, int32_t n, int32_t v) {
    for (int32_t i = 0; i < n; i++) t[i] = v + i;
}

static void test_block_alloc_reuses_lru_cached_block_first(void **state) {
    (void)state;
    struct block_alloc *a;
    assert_int_equal(block_alloc_create(4, 2, &a), 0);  // blocks 1..3
    int32_t t1[2], t2[2];
    fill(t1, 2, 10);
    fill(t2, 2, 20);
    struct block_hash k1 = block_hash_compute(BLOCK_HASH_ROOT, t1, 2, 0);
    struct block_hash k2 = block_hash_compute(BLOCK_HASH_ROOT, t2, 2, 0);
    int32_t b1 = block_alloc_allocate(a);
    int32_t b2 = block_alloc_allocate(a);
    int32_t b3 = block_alloc_allocate(a);
    assert_true(block_alloc_publish(a, b1, k1, t1, 0));
    assert_true(block_alloc_publish(a, b2, k2, t2, 0));
    assert_false(block_alloc_publish(a, b3, k1, t1, 0));  // key taken: stays uncached
    block_alloc_unref(a, b1);  // cached, LRU head
    block_alloc_unref(a, b2);  // cached
    block_alloc_unref(a, b3);  // plain free, tail
    assert_true(block_alloc_check(a));
    assert_int_equal(block_alloc_n_cached(a), 2);
    assert_int_equal(block_alloc_n_free(a), 3);
    assert_int_equal(block_alloc_lookup(a, k1, t1, 0), b1);
    assert_int_equal(block_alloc_lookup(a, k1, t1, 7), 0);  // other adapter
    // A hit revives b2 from the free list.
    block_alloc_ref(a, block_alloc_lookup(a, k2, t2, 0));
    assert_int_equal(block_alloc_n_refs(a, b2), 1);
    assert_int_equal(block_alloc_n_cached(a), 1);
    assert_true(block_alloc_check(a));
    // Fresh allocations come from the head: b1 first (evicting its key), then b3.
    assert_int_equal(block_alloc_allocate(a), b1);
    assert_int_equal(block_alloc_lookup(a, k1, t1, 0), 0);
    assert_int_equal(block_alloc_allocate(a), b3);
    assert_int_equal(block_alloc_allocate(a), 0);
    assert_true(block_alloc_check(a));
    block_alloc_destroy(a);
}

static void test_block_alloc_lookup_compares_tokens(void **state) {
    (void)state;
    struct block_alloc *a;
    assert_int_equal(block_alloc_create(3, 2, &a), 0);
    int32_t t[2] = {1, 2};
    int32_t u[2] = {1, 3};
    struct block_hash k = block_hash_compute(BLOCK_HASH_ROOT, t, 2, 0);
    int32_t b = block_alloc_allocate(a);
    assert_true(block_alloc_publish(a, b, k, t, 0));
    // A (forged) equal key with other tokens must never hit.
    assert_int_equal(block_alloc_lookup(a, k, u, 0), 0);
    assert_int_equal(block_alloc_lookup(a, k, t, 0), b);
    block_alloc_unref(a, b);
    block_alloc_clear_cache(a);
    assert_int_equal(block_alloc_n_cached(a), 0);
    assert_true(block_alloc_check(a));
    block_alloc_destroy(a);
}

/* ---- randomized ---- */

static uint64_t rng_next(uint64_t *s) {
    uint64_t x = *s += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

enum { SIM_MAX_SEQS = 8, SIM_BS = 4, SIM_MAX_TOKENS = 64 };

struct sim_seq {
    bool live;
    int32_t tokens[SIM_MAX_TOKENS];
    int32_t n_tokens;    // target length
    int32_t n_computed;  // positions reserved and "written"
    int32_t n_published; // full blocks published
    struct block_hash keys[SIM_MAX_TOKENS / SIM_BS];
    struct block_table table;
};

/* n_refs of every block equals the number of tables holding it. */
static bool refs_match(const struct block_alloc *a, const struct sim_seq *seqs, int32_t n_blocks) {
    int32_t counts[64] = {0};
    for (int i = 0; i < SIM_MAX_SEQS; i++) {
        if (!seqs[i].live) continue;
        int32_t n_live = 0;
        for (int32_t j = 0; j < seqs[i].table.n_blocks; j++) {
            int32_t id = seqs[i].table.ids[j];
            if (id == 0) continue;
            if (id >= n_blocks) return false;
            counts[id]++;
            n_live++;
        }
        if (n_live != seqs[i].table.n_live) return false;
    }
    for (int32_t id = 1; id < n_blocks; id++)
        if (counts[id] != block_alloc_n_refs(a, id)) return false;
    return true;
}

static void sim_start(struct sim_seq *q, struct block_alloc *a, uint64_t *rng) {
    memset(q, 0, sizeof(*q));
    q->live = true;
    q->n_tokens = 1 + (int32_t)(rng_next(rng) % SIM_MAX_TOKENS);
    int32_t family = (int32_t)(rng_next(rng) % 3);  // shared prefixes are likely
    for (int32_t i = 0; i < q->n_tokens; i++)
        q->tokens[i] = (i < 12) ? family * 100 + i : (int32_t)(rng_next(rng) % 5);
    block_table_init(&q->table, SIM_MAX_TOKENS / SIM_BS);
    // Prefix hits over full blocks, never the one holding the last token.
    struct block_hash parent = BLOCK_HASH_ROOT;
    for (int32_t i = 0; (i + 1) * SIM_BS <= q->n_tokens - 1; i++) {
        struct block_hash k = block_hash_compute(parent, &q->tokens[i * SIM_BS], SIM_BS, 0);
        int32_t id = block_alloc_lookup(a, k, &q->tokens[i * SIM_BS], 0);
        if (id == 0) break;
        block_table_append(&q->table, a, id);
        q->keys[i] = k;
        parent = k;
        q->n_computed = (i + 1) * SIM_BS;
        q->n_published = i + 1;
    }
}

static void sim_stop(struct sim_seq *q, struct block_alloc *a) {
    block_table_release(&q->table, a);
    block_table_deinit(&q->table);
    q->live = false;
}

static void sim_step(struct sim_seq *q, struct block_alloc *a, uint64_t *rng, bool use_window) {
    int32_t n_new = 1 + (int32_t)(rng_next(rng) % 6);
    if (q->n_computed + n_new > q->n_tokens) n_new = q->n_tokens - q->n_computed;
    if (n_new <= 0) return;
    if (use_window) block_table_trim(&q->table, a, q->n_computed - 2 * SIM_BS);
    int32_t redo = block_table_copy_on_write(&q->table, a, q->n_computed);
    if (redo < 0) return;
    if (redo < q->n_computed) q->n_computed = redo;
    enum block_reserve r = block_table_reserve(&q->table, a, q->n_computed + n_new);
    if (r != BLOCK_RESERVE_OK) return;
    q->n_computed += n_new;
    // Publish blocks that became full (not after a trim: those entries are 0).
    while ((q->n_published + 1) * SIM_BS <= q->n_computed) {
        int32_t i = q->n_published;
        struct block_hash parent = i ? q->keys[i - 1] : BLOCK_HASH_ROOT;
        q->keys[i] = block_hash_compute(parent, &q->tokens[i * SIM_BS], SIM_BS, 0);
        if (q->table.ids[i]) block_alloc_publish(a, q->table.ids[i], q->keys[i], &q->tokens[i * SIM_BS], 0);
        q->n_published++;
    }
}

static void run_random(uint64_t seed, int32_t n_blocks, int n_ops) {
    struct block_alloc *a;
    assert_int_equal(block_alloc_create(n_blocks, SIM_BS, &a), 0);
    struct sim_seq seqs[SIM_MAX_SEQS];
    memset(seqs, 0, sizeof(seqs));
    uint64_t rng = seed;
    bool use_window = seed & 1;
    for (int op = 0; op < n_ops; op++) {
        struct sim_seq *q = &seqs[rng_next(&rng) % SIM_MAX_SEQS];
        uint64_t what = rng_next(&rng) % 16;
        if (!q->live) {
            if (what < 6) sim_start(q, a, &rng);
        } else if (what == 0 || q->n_computed >= q->n_tokens) {
            sim_stop(q, a);  // cancel or finish
        } else if (what == 1) {
            // Preempt (recompute): free every block, start over with prefix hits.
            sim_stop(q, a);
            sim_start(q, a, &rng);
        } else if (what == 2 && block_alloc_n_cached(a) > 0 && (rng_next(&rng) % 8) == 0) {
            block_alloc_clear_cache(a);
        } else {
            sim_step(q, a, &rng, use_window);
        }
        if (!block_alloc_check(a) || !refs_match(a, seqs, n_blocks)) {
            fprintf(stderr, "randomized block test failed: seed=%llu n_blocks=%d op=%d\n",
                    (unsigned long long)seed, (int)n_blocks, op);
            fail();
        }
    }
    for (int i = 0; i < SIM_MAX_SEQS; i++)
        if (seqs[i].live) sim_stop(&seqs[i], a);
    assert_true(block_alloc_check(a));
    assert_int_equal(block_alloc_n_used(a), 0);
    assert_int_equal(block_alloc_n_free(a), n_blocks - 1);
    block_alloc_destroy(a);
}

static void test_block_alloc_randomized_invariants(void **state) {
    (void)state;
    for (uint64_t seed = 1; seed <= 40; seed++) {
        int32_t n_blocks = 2 + (int32_t)(seed % 30);  // tiny pools included
        run_random(seed * 7919, n_blocks, 5000);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_block_alloc_never_hands_out_the_null_block),
        cmocka_unit_test(test_block_alloc_rejects_bad_sizes),
        cmocka_unit_test(test_block_alloc_reuses_lru_cached_block_first),
        cmocka_unit_test(test_block_alloc_lookup_compares_tokens),
        cmocka_unit_test(test_block_alloc_randomized_invariants),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
