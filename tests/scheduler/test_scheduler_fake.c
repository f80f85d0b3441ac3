/*
 * tests/scheduler/test_scheduler_fake.c - the whole step loop over the fake
 * engine (tests/helpers/fake_engine.h), whose logits depend on every token of
 * a sequence's history exactly as its blocks hold it.
 *
 * The oracle: every request run alone, in a fresh scheduler with a big pool.
 * Then many requests arriving at random steps, with and without prefix
 * caching, big and tiny token budgets (chunked prefill), tiny pools
 * (preemption + recompute), must give the same token ids, text and finish
 * reasons, with no fake-KV violation and the ledger consistent after every
 * step. Also: a shared 200-token prefix is prefilled once; cancellation frees
 * blocks within one step; submit errors; the threaded loop. And drafts from a
 * draft model (scheduler/drafter.h) change no token either: a draft model
 * identical to the model is always right at temperature 0 (every draft
 * accepted), one of another vocabulary size mostly wrong; the draft pool,
 * when tiny, is shared by releasing other sequences' draft KV, and none leaks.
 * Unseeded sampled requests draft by sampling (the rejection rule against
 * the draft's distribution): with the identical draft model q is p, so every
 * draft is kept (p / q = 1), where greedy drafts of the same requests are
 * kept only when the sample happens to be the draft's top token.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include <threads.h>

#include "engine/base/err.h"
#include "engine/base/log.h"
#include "scheduler/scheduler.h"
#include "tests/helpers/fake_engine.h"

enum { N_VOCAB = 64, MAX_REQ = 64, MAX_GEN = 40, MAX_PROMPT = 260 };

struct req_spec {
    int32_t prompt[MAX_PROMPT];
    int32_t n_prompt;
    int32_t max_tokens;
    float temperature;
    uint64_t seed;
    bool is_unseeded;  // sampled from the OS's entropy: no token oracle
    float frequency_penalty;
    bool ignore_eos;
    int32_t arrival_step;
};

struct result {
    int32_t tokens[MAX_GEN];
    int32_t n_tokens;
    char text[MAX_GEN * 8];
    size_t text_len;
    enum channel_finish finish;
};

static uint64_t rng_next(uint64_t *s) {
    uint64_t x = *s += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static struct engine_model *make_model(int32_t window) {
    struct fake_engine_params p = {.n_vocab = N_VOCAB, .n_ctx = 2048, .sliding_window = window};
    return fake_engine_model_create(&p);
}

static struct scheduler_params params(int32_t n_blocks, int32_t budget, bool prefix) {
    struct scheduler_params p = scheduler_default_params();
    p.kv_blocks = n_blocks;
    p.block_size = 16;
    p.max_batch_tokens = budget;
    p.max_seqs = 16;
    p.enable_prefix_cache = prefix;
    return p;
}

static int submit(struct scheduler *s, const struct req_spec *r, uint64_t *id, struct channel **c) {
    struct scheduler_request q = scheduler_default_request();
    q.prompt = r->prompt;
    q.n_prompt = r->n_prompt;
    q.max_tokens = r->max_tokens;
    q.sampling.temperature = r->temperature;
    q.sampling.seed = r->seed;
    q.sampling.has_seed = !r->is_unseeded;
    q.sampling.frequency_penalty = r->frequency_penalty;
    q.ignore_eos = r->ignore_eos;
    return scheduler_submit(s, &q, id, c);
}

/* Moves what the channel holds into res; true once finished. */
static bool collect(struct channel *c, struct result *res) {
    struct channel_output out;
    channel_read(c, &out);
    for (int32_t i = 0; i < out.n_tokens; i++) {
        assert_true(res->n_tokens < MAX_GEN);
        res->tokens[res->n_tokens++] = out.token_ids[i];
    }
    if (out.text_len) {
        assert_true(res->text_len + out.text_len < sizeof(res->text));
        memcpy(res->text + res->text_len, out.text, out.text_len);
        res->text_len += out.text_len;
    }
    res->finish = out.finish;
    channel_output_free(&out);
    return res->finish != CHANNEL_FINISH_NONE;
}

/* Runs reqs [n] through one scheduler, submitting each at its arrival step. */
static void run(const struct engine_model *m, const struct scheduler_params *p,
                const struct req_spec *reqs, int n, struct result *res, struct scheduler_stats *st) {
    struct scheduler *s;
    assert_int_equal(scheduler_create(m, p, &s), 0);
    struct channel *ch[MAX_REQ] = {0};
    bool done[MAX_REQ] = {0};
    memset(res, 0, (size_t)n * sizeof(*res));
    int n_done = 0;
    for (int32_t step = 0; n_done < n; step++) {
        assert_true(step < 100000);
        for (int i = 0; i < n; i++) {
            if (reqs[i].arrival_step != step && !(step == 0 && reqs[i].arrival_step < 0)) continue;
            uint64_t id;
            assert_int_equal(submit(s, &reqs[i], &id, &ch[i]), 0);
        }
        assert_true(scheduler_step(s) >= 0);
        assert_true(scheduler_check(s));
        for (int i = 0; i < n; i++) {
            if (!ch[i] || done[i]) continue;
            if (collect(ch[i], &res[i])) {
                done[i] = true;
                n_done++;
                channel_release(ch[i]);
            }
        }
    }
    if (st) scheduler_get_stats(s, st);
    scheduler_free(s);
    assert_int_equal(fake_engine_n_errors(m), 0);
}

static void make_reqs(uint64_t seed, struct req_spec *reqs, int n, int32_t max_arrival) {
    uint64_t rng = seed;
    // A few shared prefixes so the prefix cache has work.
    int32_t prefixes[3][64];
    for (int k = 0; k < 3; k++)
        for (int j = 0; j < 64; j++) prefixes[k][j] = 2 + (int32_t)(rng_next(&rng) % (N_VOCAB - 2));
    for (int i = 0; i < n; i++) {
        struct req_spec *r = &reqs[i];
        memset(r, 0, sizeof(*r));
        r->n_prompt = 1 + (int32_t)(rng_next(&rng) % 90);
        int k = (int)(rng_next(&rng) % 4);
        for (int32_t j = 0; j < r->n_prompt; j++)
            r->prompt[j] = (k < 3 && j < 64) ? prefixes[k][j]
                                             : 2 + (int32_t)(rng_next(&rng) % (N_VOCAB - 2));
        r->max_tokens = 1 + (int32_t)(rng_next(&rng) % 30);
        r->temperature = (rng_next(&rng) % 2) ? 0.0f : 0.8f;
        r->seed = rng_next(&rng);
        r->ignore_eos = rng_next(&rng) % 2;
        r->arrival_step = (int32_t)(rng_next(&rng) % (uint64_t)(max_arrival + 1));
    }
}

static void oracle(const struct engine_model *m, const struct req_spec *reqs, int n,
                   struct result *res) {
    struct scheduler_params p = params(512, 512, false);
    for (int i = 0; i < n; i++) {
        struct req_spec one = reqs[i];
        one.arrival_step = 0;
        run(m, &p, &one, 1, &res[i], NULL);
    }
}

static void expect_same(const struct result *want, const struct result *got, int n,
                        const char *what, uint64_t seed) {
    for (int i = 0; i < n; i++) {
        bool same = want[i].n_tokens == got[i].n_tokens && want[i].finish == got[i].finish &&
                    want[i].text_len == got[i].text_len &&
                    !memcmp(want[i].tokens, got[i].tokens, (size_t)want[i].n_tokens * sizeof(int32_t)) &&
                    !memcmp(want[i].text, got[i].text, want[i].text_len);
        if (!same) {
            fprintf(stderr, "%s: request %d differs from running alone (seed=%llu): "
                    "n_tokens %d vs %d, finish %d vs %d\n", what, i, (unsigned long long)seed,
                    (int)want[i].n_tokens, (int)got[i].n_tokens, (int)want[i].finish,
                    (int)got[i].finish);
            fail();
        }
    }
}

static void check_config(uint64_t seed, int32_t window, int32_t n_blocks, int32_t budget,
                         bool prefix, const char *what, int64_t *n_preempt) {
    struct engine_model *m = make_model(window);
    struct req_spec reqs[40];
    struct result want[40], got[40];
    make_reqs(seed, reqs, 40, 30);
    oracle(m, reqs, 40, want);
    struct scheduler_params p = params(n_blocks, budget, prefix);
    struct scheduler_stats st;
    run(m, &p, reqs, 40, got, &st);
    expect_same(want, got, 40, what, seed);
    if (n_preempt) *n_preempt += st.n_preemptions;
    engine_model_free(m);
}

static void test_scheduler_fake_batched_equals_alone(void **state) {
    (void)state;
    for (uint64_t seed = 1; seed <= 3; seed++) {
        check_config(seed, 0, 512, 512, true, "prefix cache, big budget", NULL);
        check_config(seed, 0, 512, 512, false, "no prefix cache, big budget", NULL);
        check_config(seed, 0, 512, 7, true, "prefix cache, chunked prefill", NULL);
        check_config(seed, 0, 512, 7, false, "no prefix cache, chunked prefill", NULL);
    }
}

static void test_scheduler_fake_tiny_pools_preempt_and_recompute(void **state) {
    (void)state;
    int64_t n_preempt = 0;
    for (uint64_t seed = 10; seed <= 14; seed++) {
        // 10 usable blocks of 16 = 160 tokens; a request needs at most 120.
        check_config(seed, 0, 11, 64, true, "tiny pool, prefix cache", &n_preempt);
        check_config(seed, 0, 11, 64, false, "tiny pool", &n_preempt);
        check_config(seed, 0, 9, 5, true, "tiny pool, tiny budget", &n_preempt);
    }
    assert_true(n_preempt > 0);
}

static void test_scheduler_fake_sliding_window(void **state) {
    (void)state;
    for (uint64_t seed = 20; seed <= 22; seed++) {
        check_config(seed, 24, 512, 512, true, "window 24", NULL);
        check_config(seed, 24, 512, 9, false, "window 24, chunked", NULL);
        check_config(seed, 24, 13, 16, true, "window 24, tiny pool", NULL);
    }
}

static void test_scheduler_fake_shared_prefix_prefilled_once(void **state) {
    (void)state;
    struct engine_model *m = make_model(0);
    struct req_spec r[2];
    memset(r, 0, sizeof(r));
    uint64_t rng = 77;
    for (int32_t j = 0; j < 200; j++) r[0].prompt[j] = 2 + (int32_t)(rng_next(&rng) % (N_VOCAB - 2));
    r[1] = r[0];
    for (int32_t j = 200; j < 208; j++) {
        r[0].prompt[j] = 2 + (int32_t)(rng_next(&rng) % (N_VOCAB - 2));
        r[1].prompt[j] = 2 + (int32_t)(rng_next(&rng) % (N_VOCAB - 2));
    }
    r[0].n_prompt = r[1].n_prompt = 208;
    r[0].max_tokens = r[1].max_tokens = 8;
    r[0].ignore_eos = r[1].ignore_eos = true;
    struct result want;
    oracle(m, &r[1], 1, &want);

    struct scheduler_params p = params(256, 512, true);
    struct scheduler *s;
    assert_int_equal(scheduler_create(m, &p, &s), 0);
    struct result res[2];
    memset(res, 0, sizeof(res));
    for (int i = 0; i < 2; i++) {
        uint64_t id;
        struct channel *c;
        assert_int_equal(submit(s, &r[i], &id, &c), 0);
        int64_t n_before = fake_engine_n_tokens(m);
        while (!collect(c, &res[i])) {
            assert_true(scheduler_step(s) >= 0);
            assert_true(scheduler_check(s));
        }
        channel_release(c);
        if (i == 1) {
            // 200 shared tokens = 12 full blocks (192 tokens); only the rest is
            // prefilled, then 7 decodes (the 8th token needs no forward).
            assert_int_equal(fake_engine_n_tokens(m) - n_before, (208 - 192) + 7);
        }
    }
    struct scheduler_stats st;
    scheduler_get_stats(s, &st);
    assert_int_equal(st.n_prefix_hit_tokens, 192);
    assert_true(st.n_blocks_cached > 0);
    expect_same(&want, &res[1], 1, "shared prefix", 77);
    scheduler_free(s);
    assert_int_equal(fake_engine_n_errors(m), 0);
    engine_model_free(m);
}

static void test_scheduler_fake_cancel_frees_blocks_within_one_step(void **state) {
    (void)state;
    struct engine_model *m = make_model(0);
    struct scheduler_params p = params(64, 512, false);
    struct scheduler *s;
    assert_int_equal(scheduler_create(m, &p, &s), 0);
    struct req_spec r;
    memset(&r, 0, sizeof(r));
    r.n_prompt = 100;
    for (int32_t j = 0; j < 100; j++) r.prompt[j] = 2 + j % 50;
    r.max_tokens = 30;
    r.ignore_eos = true;
    uint64_t id;
    struct channel *c;
    assert_int_equal(submit(s, &r, &id, &c), 0);
    for (int i = 0; i < 3; i++) assert_true(scheduler_step(s) > 0);
    struct scheduler_stats st;
    scheduler_get_stats(s, &st);
    assert_int_equal(st.n_blocks_used, 7);  // 103 tokens
    scheduler_cancel(s, id);
    scheduler_cancel(s, 12345);  // unknown: ignored
    assert_int_equal(scheduler_step(s), 0);
    scheduler_get_stats(s, &st);
    assert_int_equal(st.n_blocks_used, 0);
    assert_int_equal(st.n_running, 0);
    struct result res;
    memset(&res, 0, sizeof(res));
    assert_true(collect(c, &res));
    assert_int_equal(res.finish, CHANNEL_FINISH_CANCELED);
    assert_int_equal(res.n_tokens, 3);
    channel_release(c);
    scheduler_free(s);
    engine_model_free(m);
}

static void test_scheduler_fake_submit_errors(void **state) {
    (void)state;
    struct engine_model *m = make_model(0);
    struct scheduler_params p = params(9, 512, false);  // 8 blocks = 128 tokens
    p.max_queue = 2;
    struct scheduler *s;
    assert_int_equal(scheduler_create(m, &p, &s), 0);
    struct req_spec r;
    memset(&r, 0, sizeof(r));
    r.n_prompt = 100;
    r.max_tokens = 29;  // 129 > 128
    for (int32_t j = 0; j < 100; j++) r.prompt[j] = 3;
    uint64_t id;
    struct channel *c = NULL;
    assert_int_equal(submit(s, &r, &id, &c), ERR_TOOLONG);
    assert_null(c);
    r.max_tokens = 28;
    r.prompt[5] = N_VOCAB;  // bad token id
    assert_int_equal(submit(s, &r, &id, &c), ERR_INVAL);
    r.prompt[5] = 3;
    r.temperature = -1.0f;
    assert_int_equal(submit(s, &r, &id, &c), ERR_INVAL);
    r.temperature = 0.0f;
    struct channel *c1, *c2;
    uint64_t id1, id2;
    assert_int_equal(submit(s, &r, &id1, &c1), 0);
    assert_int_equal(submit(s, &r, &id2, &c2), 0);
    assert_true(id2 > id1);
    assert_int_equal(submit(s, &r, &id, &c), ERR_FULL);
    scheduler_stop(s, 0);
    assert_int_equal(submit(s, &r, &id, &c), ERR_SHUTDOWN);
    struct result res;
    memset(&res, 0, sizeof(res));
    assert_true(collect(c1, &res));
    assert_int_equal(res.finish, CHANNEL_FINISH_CANCELED);
    channel_release(c1);
    channel_release(c2);  // dropped unread: the channel frees with the sequence
    scheduler_free(s);
    engine_model_free(m);
}

/* ---- threaded ---- */

struct waiter {
    mtx_t lock;
    cnd_t cond;
    int64_t n_wakes;
};

static void on_wake(void *user) {
    struct waiter *w = user;
    mtx_lock(&w->lock);
    w->n_wakes++;
    cnd_signal(&w->cond);
    mtx_unlock(&w->lock);
}

static void test_scheduler_fake_threaded_loop(void **state) {
    (void)state;
    struct engine_model *m = make_model(0);
    struct req_spec reqs[24];
    struct result want[24], got[24];
    make_reqs(99, reqs, 24, 0);
    oracle(m, reqs, 24, want);
    struct scheduler_params p = params(64, 32, true);
    struct scheduler *s;
    assert_int_equal(scheduler_create(m, &p, &s), 0);
    assert_false(scheduler_is_alive(s));  // no step thread yet
    assert_int_equal(scheduler_start(s), 0);
    assert_true(scheduler_is_alive(s));
    struct waiter w = {.n_wakes = 0};
    mtx_init(&w.lock, mtx_plain);
    cnd_init(&w.cond);
    struct channel *ch[24];
    bool done[24] = {0};
    memset(got, 0, sizeof(got));
    for (int i = 0; i < 24; i++) {
        uint64_t id;
        assert_int_equal(submit(s, &reqs[i], &id, &ch[i]), 0);
        channel_set_wake(ch[i], on_wake, &w);
    }
    int n_done = 0;
    int64_t seen = 0;
    while (n_done < 24) {
        for (int i = 0; i < 24; i++) {
            if (done[i] || !collect(ch[i], &got[i])) continue;
            done[i] = true;
            n_done++;
        }
        if (n_done == 24) break;
        assert_true(scheduler_is_alive(s));  // busy, stepping
        mtx_lock(&w.lock);
        while (w.n_wakes == seen) cnd_wait(&w.cond, &w.lock);
        seen = w.n_wakes;
        mtx_unlock(&w.lock);
    }
    assert_true(scheduler_is_alive(s));  // idle, asleep in its loop
    scheduler_stop(s, 1000);
    assert_false(scheduler_is_alive(s));
    struct scheduler_stats st;
    scheduler_get_stats(s, &st);
    assert_int_equal(st.n_finished, 24);
    assert_int_equal(st.n_blocks_used, 0);
    for (int i = 0; i < 24; i++) channel_release(ch[i]);
    scheduler_free(s);
    expect_same(want, got, 24, "threaded", 99);
    assert_int_equal(fake_engine_n_errors(m), 0);
    cnd_destroy(&w.cond);
    mtx_destroy(&w.lock);
    engine_model_free(m);
}

/* The requests of check_config, drafted for by draft (draft_n 4, every step
 * that may draft does: --draft-always), against each run alone without. */
static void check_draft(uint64_t seed, const struct engine_model *m, const struct engine_model *draft,
                        int32_t n_blocks, int32_t draft_blocks, int32_t max_seqs, bool greedy,
                        struct scheduler_stats *st) {
    struct req_spec reqs[40];
    struct result want[40], got[40];
    make_reqs(seed, reqs, 40, 30);
    // Greedy, and eos allowed: with ignore_eos the sampler bans eos, which the
    // draft model (knowing nothing of requests) may still propose.
    if (greedy)
        for (int i = 0; i < 40; i++) reqs[i].temperature = 0.0f, reqs[i].ignore_eos = false;
    oracle(m, reqs, 40, want);
    struct scheduler_params p = params(n_blocks, 512, true);
    p.max_seqs = max_seqs;
    p.draft_model = draft;
    p.draft_n = 4;
    p.draft_always = true;
    p.draft_kv_blocks = draft_blocks;
    run(m, &p, reqs, 40, got, st);
    expect_same(want, got, 40, "draft model", seed);
    assert_int_equal(st->n_draft_blocks_used, 0);  // every sequence's draft KV went back
    assert_int_equal(fake_engine_n_errors(draft), 0);
}

/* The requests of check_config sampled without a seed at temperature 0.8
 * (and a frequency penalty), drafted for by draft: no token oracle, so each
 * request must end as asked (max_tokens reached, or eos where eos is
 * allowed) with nothing leaked. */
static void check_draft_unseeded(uint64_t seed, const struct engine_model *m,
                                 const struct engine_model *draft, int32_t n_blocks,
                                 float frequency_penalty, struct scheduler_stats *st) {
    struct req_spec reqs[40];
    struct result got[40];
    make_reqs(seed, reqs, 40, 30);
    for (int i = 0; i < 40; i++) {
        reqs[i].temperature = 0.8f;
        reqs[i].is_unseeded = true;
        reqs[i].frequency_penalty = frequency_penalty;
    }
    struct scheduler_params p = params(n_blocks, 512, true);
    p.max_seqs = 4;
    p.draft_model = draft;
    p.draft_n = 4;
    p.draft_always = true;
    run(m, &p, reqs, 40, got, st);  // the ledger checked after every step
    for (int i = 0; i < 40; i++) {
        assert_true(got[i].n_tokens >= 1 && got[i].n_tokens <= reqs[i].max_tokens);
        if (reqs[i].ignore_eos) assert_int_equal(got[i].n_tokens, reqs[i].max_tokens);
        // eos may also be the last token allowed: a stop at max_tokens
        assert_true(got[i].finish == CHANNEL_FINISH_STOP ||
                    (got[i].finish == CHANNEL_FINISH_LENGTH &&
                     got[i].n_tokens == reqs[i].max_tokens));
    }
    assert_int_equal(st->n_draft_blocks_used, 0);
    assert_int_equal(fake_engine_n_errors(draft), 0);
}

static void test_scheduler_fake_draft_model(void **state) {
    (void)state;
    struct engine_model *m = make_model(0);
    struct engine_model *same = make_model(0);
    struct fake_engine_params op = {.n_vocab = N_VOCAB - 3, .n_ctx = 2048};
    struct engine_model *other = fake_engine_model_create(&op);
    struct scheduler_stats st;
    for (uint64_t seed = 30; seed <= 32; seed++) {
        // The same model drafts: at temperature 0 every draft is what it then says.
        check_draft(seed, m, same, 512, 0, 4, true, &st);
        assert_true(st.n_draft_tokens > 100);
        assert_int_equal(st.n_draft_accepted, st.n_draft_tokens);
        // Sampled requests too; up to 16 running, of which steps with <= 4 decoders draft.
        check_draft(seed, m, same, 512, 0, 16, false, &st);
        assert_true(st.n_draft_accepted > 0 && st.n_draft_accepted < st.n_draft_tokens);
        // A draft pool of 4 blocks (64 tokens) for requests of up to 120, and a
        // main pool that preempts.
        check_draft(seed, m, same, 11, 5, 4, true, &st);
        assert_true(st.n_draft_accepted > 0);
        assert_int_equal(st.n_draft_blocks_total, 4);
        check_draft(seed, m, other, 512, 0, 4, true, &st);
        // 61 ids of 64: the draft's argmax is the model's about 1 time in 64
        assert_true(st.n_draft_tokens > 100);
        assert_true(st.n_draft_accepted * 8 < st.n_draft_tokens);
        // Unseeded sampling: sampled drafts of the same model are all kept.
        check_draft_unseeded(seed, m, same, 512, 0.0f, &st);
        assert_true(st.n_draft_tokens > 100);
        assert_int_equal(st.n_draft_accepted, st.n_draft_tokens);
        // With a penalty too: each draft token's q has the draft's earlier tokens
        // in its history, as the model's p has them at verification.
        check_draft_unseeded(seed, m, same, 512, 2.0f, &st);
        assert_true(st.n_draft_tokens > 100);
        assert_int_equal(st.n_draft_accepted, st.n_draft_tokens);
        check_draft_unseeded(seed, m, other, 512, 0.0f, &st);
        assert_true(st.n_draft_accepted < st.n_draft_tokens);
        // A main pool that preempts: a sampled draft's room is reserved before it
        // is drawn (or it does not draft) and what it did not use goes back.
        check_draft_unseeded(seed, m, same, 11, 0.0f, &st);
        assert_true(st.n_draft_tokens > 0);
        assert_int_equal(st.n_blocks_used, 0);
    }
    engine_model_free(other);
    engine_model_free(same);
    engine_model_free(m);
}

int main(void) {
    log_set_level(LOG_LEVEL_WARN);  // one INFO line per scheduler otherwise
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_scheduler_fake_batched_equals_alone),
        cmocka_unit_test(test_scheduler_fake_tiny_pools_preempt_and_recompute),
        cmocka_unit_test(test_scheduler_fake_sliding_window),
        cmocka_unit_test(test_scheduler_fake_shared_prefix_prefilled_once),
        cmocka_unit_test(test_scheduler_fake_cancel_frees_blocks_within_one_step),
        cmocka_unit_test(test_scheduler_fake_submit_errors),
        cmocka_unit_test(test_scheduler_fake_threaded_loop),
        cmocka_unit_test(test_scheduler_fake_draft_model),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
