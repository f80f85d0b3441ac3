/*
 * tests/scheduler/test_scheduler_lora.c - adapters through the whole step
 * loop over the fake engine, whose adapters salt the hash chain of every
 * token computed under them (tests/helpers/fake_engine.h): a token computed
 * under the wrong adapter, or a prefix block reused across adapters, changes
 * the outputs.
 *
 * The oracle: each request run alone in a fresh scheduler. Then batches that
 * mix the base model and more adapters than slots, arriving at random steps,
 * with and without prefix caching, must give the same tokens; plus slot
 * waiting without starving base-model requests, eviction counters, the
 * prefix cache kept apart per adapter (per loaded object: found again after
 * an eviction, not by a new load of the same file), and no adapter reference
 * left behind.
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
#include "engine/base/log.h"
#include "scheduler/scheduler.h"
#include "tests/helpers/fake_engine.h"

enum { N_VOCAB = 64, MAX_REQ = 48, MAX_GEN = 24, MAX_PROMPT = 80, N_ADAPTERS = 5 };

struct req_spec {
    int32_t prompt[MAX_PROMPT];
    int32_t n_prompt;
    int32_t max_tokens;
    int adapter;            // index into the adapters, -1: base model
    int32_t arrival_step;
};

struct result {
    int32_t tokens[MAX_GEN];
    int32_t n_tokens;
    enum channel_finish finish;
};

static struct engine_model *make_model(void) {
    struct fake_engine_params p = {.n_vocab = N_VOCAB, .n_ctx = 2048};
    return fake_engine_model_create(&p);
}

static void load_adapters(const struct engine_model *m, struct engine_adapter **ad, int n) {
    for (int i = 0; i < n; i++) {
        char path[32];
        snprintf(path, sizeof(path), "/adapters/a%d", i);
        assert_int_equal(engine_adapter_load(m, path, &ad[i]), 0);
    }
}

static void release_adapters(struct engine_adapter **ad, int n) {
    for (int i = 0; i < n; i++) engine_adapter_release(ad[i]);
}

static struct scheduler_params params(int32_t max_loras, bool prefix, int32_t budget) {
    struct scheduler_params p = scheduler_default_params();
    p.kv_blocks = 400;
    p.block_size = 16;
    p.max_batch_tokens = budget;
    p.max_seqs = 16;
    p.enable_prefix_cache = prefix;
    p.max_loras = max_loras;
    return p;
}

static int submit(struct scheduler *s, const struct req_spec *r, struct engine_adapter **ad,
                  uint64_t *id, struct channel **c) {
    struct scheduler_request q = scheduler_default_request();
    q.prompt = r->prompt;
    q.n_prompt = r->n_prompt;
    q.max_tokens = r->max_tokens;
    q.sampling.temperature = 0.0f;
    q.ignore_eos = true;
    q.adapter = r->adapter >= 0 ? ad[r->adapter] : NULL;
    return scheduler_submit(s, &q, id, c);
}

static bool collect(struct channel *c, struct result *res) {
    struct channel_output out;
    channel_read(c, &out);
    for (int32_t i = 0; i < out.n_tokens; i++) {
        assert_true(res->n_tokens < MAX_GEN);
        res->tokens[res->n_tokens++] = out.token_ids[i];
    }
    res->finish = out.finish;
    channel_output_free(&out);
    return res->finish != CHANNEL_FINISH_NONE;
}

/* Runs reqs [n] through one scheduler, each submitted at its arrival step,
 * checking the ledger and the slot table after every step. */
static void run(const struct engine_model *m, const struct scheduler_params *p,
                struct engine_adapter **ad, const struct req_spec *reqs, int n,
                struct result *res, struct scheduler_stats *st) {
    struct scheduler *s;
    assert_int_equal(scheduler_create(m, p, &s), 0);
    struct channel *ch[MAX_REQ] = {0};
    bool done[MAX_REQ] = {0};
    memset(res, 0, (size_t)n * sizeof(*res));
    int n_done = 0;
    for (int32_t step = 0; n_done < n; step++) {
        assert_true(step < 100000);
        for (int i = 0; i < n; i++) {
            if (reqs[i].arrival_step != step) continue;
            uint64_t id;
            assert_int_equal(submit(s, &reqs[i], ad, &id, &ch[i]), 0);
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

static uint64_t rng_next(uint64_t *s) {
    uint64_t x = *s += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* Requests sharing two 48-token prefixes under random adapters (or none). */
static void make_reqs(uint64_t seed, struct req_spec *reqs, int n, int32_t max_arrival) {
    uint64_t rng = seed;
    int32_t prefixes[2][48];
    for (int k = 0; k < 2; k++)
        for (int j = 0; j < 48; j++) prefixes[k][j] = 2 + (int32_t)(rng_next(&rng) % (N_VOCAB - 2));
    for (int i = 0; i < n; i++) {
        struct req_spec *r = &reqs[i];
        memset(r, 0, sizeof(*r));
        int32_t n_shared = (int32_t)(rng_next(&rng) % 49);
        r->n_prompt = n_shared + 1 + (int32_t)(rng_next(&rng) % 30);
        int k = (int)(rng_next(&rng) % 2);
        for (int32_t j = 0; j < r->n_prompt; j++)
            r->prompt[j] = j < n_shared ? prefixes[k][j]
                                        : 2 + (int32_t)(rng_next(&rng) % (N_VOCAB - 2));
        r->max_tokens = 1 + (int32_t)(rng_next(&rng) % MAX_GEN);
        r->adapter = (int)(rng_next(&rng) % (N_ADAPTERS + 1)) - 1;
        r->arrival_step = (int32_t)(rng_next(&rng) % (uint64_t)(max_arrival + 1));
    }
}

static void expect_same(const struct result *want, const struct result *got, int n,
                        const char *what, uint64_t seed) {
    for (int i = 0; i < n; i++) {
        if (want[i].n_tokens != got[i].n_tokens || want[i].finish != got[i].finish ||
            memcmp(want[i].tokens, got[i].tokens, (size_t)want[i].n_tokens * sizeof(int32_t)))
            fail_msg("%s: request %d differs from its run alone (seed %llu)", what, i,
                     (unsigned long long)seed);
    }
}

/* The oracle: each request alone, in a fresh scheduler. */
static void run_alone(const struct engine_model *m, struct engine_adapter **ad,
                      const struct req_spec *reqs, int n, struct result *want) {
    struct scheduler_params p = params(1, false, 512);
    for (int i = 0; i < n; i++) {
        struct req_spec r = reqs[i];
        r.arrival_step = 0;
        run(m, &p, ad, &r, 1, &want[i], NULL);
    }
}

static void test_scheduler_lora_mixed_batch_equals_alone(void **state) {
    (void)state;
    struct engine_model *m = make_model();
    struct engine_adapter *ad[N_ADAPTERS];
    load_adapters(m, ad, N_ADAPTERS);
    static struct req_spec reqs[MAX_REQ];
    static struct result want[MAX_REQ], got[MAX_REQ];
    // Adapters do change outputs: the same prompt under a and b differs.
    struct req_spec two[2];
    make_reqs(7, two, 1, 0);
    two[0].max_tokens = 8;
    two[0].adapter = 0;
    two[1] = two[0];
    two[1].adapter = 1;
    run_alone(m, ad, two, 2, want);
    assert_memory_not_equal(want[0].tokens, want[1].tokens, 8 * sizeof(int32_t));

    for (uint64_t seed = 1; seed <= 6; seed++) {
        int n = 40;
        make_reqs(seed, reqs, n, 30);
        run_alone(m, ad, reqs, n, want);
        // More adapters (5) than slots (1, 2, 3): slots are evicted and
        // requests wait for them; prefix cache on and off; chunked prefill.
        for (int32_t max_loras = 1; max_loras <= 3; max_loras++) {
            for (int prefix = 0; prefix < 2; prefix++) {
                struct scheduler_params p = params(max_loras, prefix, seed % 2 ? 512 : 40);
                struct scheduler_stats st;
                run(m, &p, ad, reqs, n, got, &st);
                expect_same(want, got, n, "mixed batch", seed);
                assert_true(st.n_lora_loads >= N_ADAPTERS - 1);
                assert_true(st.n_lora_evictions >= st.n_lora_loads - max_loras);
            }
        }
    }
    release_adapters(ad, N_ADAPTERS);
    assert_int_equal(fake_engine_n_live_adapters(m), 0);
    engine_model_free(m);
}

/* Step until the channel has finished, collecting into res. */
static void drain(struct scheduler *s, struct channel *c, struct result *res) {
    memset(res, 0, sizeof(*res));
    for (int i = 0; i < 10000 && !collect(c, res); i++) assert_true(scheduler_step(s) >= 0);
    assert_int_not_equal(res->finish, CHANNEL_FINISH_NONE);
    channel_release(c);
}

static void test_scheduler_lora_prefix_cache_not_shared_across_adapters(void **state) {
    (void)state;
    struct engine_model *m = make_model();
    struct engine_adapter *ad[2];
    load_adapters(m, ad, 2);
    struct req_spec base;
    make_reqs(11, &base, 1, 0);
    base.n_prompt = 65;  // 4 full blocks before the last token
    for (int32_t j = 0; j < 65; j++) base.prompt[j] = 2 + (j * 7) % 60;
    base.max_tokens = 4;
    base.adapter = -1;
    struct req_spec under[3] = {base, base, base};  // base model, a0, a1
    under[1].adapter = 0;
    under[2].adapter = 1;
    struct result want[3];
    run_alone(m, ad, under, 3, want);

    struct scheduler_params p = params(2, true, 512);
    struct scheduler *s;
    assert_int_equal(scheduler_create(m, &p, &s), 0);
    struct scheduler_stats st;
    int64_t hits = 0;
    // Order: a0, base, a1, a0 again, base again. Only the repeats may hit.
    const int order[5] = {1, 0, 2, 1, 0};
    const int64_t want_hits[5] = {0, 0, 0, 64, 64};
    for (int k = 0; k < 5; k++) {
        uint64_t id;
        struct channel *c;
        assert_int_equal(submit(s, &under[order[k]], ad, &id, &c), 0);
        struct result got;
        drain(s, c, &got);
        expect_same(&want[order[k]], &got, 1, "prefix cache per adapter", (uint64_t)k);
        scheduler_get_stats(s, &st);
        assert_int_equal(st.n_prefix_hit_tokens - hits, want_hits[k]);
        hits = st.n_prefix_hit_tokens;
    }
    scheduler_free(s);

    // With one slot, a0 -> a1 -> a0 evicts a0 and puts it back into the slot:
    // the same loaded object, so the blocks it cached before the eviction
    // are hit again.
    p = params(1, true, 512);
    assert_int_equal(scheduler_create(m, &p, &s), 0);
    hits = 0;
    const int order1[3] = {1, 2, 1};
    const int64_t want_hits1[3] = {0, 0, 64};
    for (int k = 0; k < 3; k++) {
        uint64_t id;
        struct channel *c;
        assert_int_equal(submit(s, &under[order1[k]], ad, &id, &c), 0);
        struct result got;
        drain(s, c, &got);
        expect_same(&want[order1[k]], &got, 1, "evicted and put back", (uint64_t)k);
        scheduler_get_stats(s, &st);
        assert_int_equal(st.n_prefix_hit_tokens - hits, want_hits1[k]);
        hits = st.n_prefix_hit_tokens;
    }
    assert_int_equal(st.n_lora_loads, 3);
    assert_int_equal(st.n_lora_evictions, 2);

    // Unloaded and registered again: a new load of the same file is another
    // object with another id, so it hits none of the old object's blocks
    // (it might hold other weights by now), only its own from then on; the
    // old object, still alive, keeps hitting its own.
    struct engine_adapter *again[1];
    assert_int_equal(engine_adapter_load(m, "/adapters/a0", &again[0]), 0);
    assert_true(engine_adapter_get_info(again[0])->id != engine_adapter_get_info(ad[0])->id);
    struct engine_adapter *which[3] = {again[0], again[0], ad[0]};
    const int64_t want_hits2[3] = {0, 64, 64};
    for (int k = 0; k < 3; k++) {
        uint64_t id;
        struct channel *c;
        assert_int_equal(submit(s, &under[1], &which[k], &id, &c), 0);
        struct result got;
        drain(s, c, &got);
        expect_same(&want[1], &got, 1, "loaded again", (uint64_t)k);
        scheduler_get_stats(s, &st);
        assert_int_equal(st.n_prefix_hit_tokens - hits, want_hits2[k]);
        hits = st.n_prefix_hit_tokens;
    }
    engine_adapter_release(again[0]);
    scheduler_free(s);
    assert_int_equal(fake_engine_n_errors(m), 0);
    release_adapters(ad, 2);
    assert_int_equal(fake_engine_n_live_adapters(m), 0);
    engine_model_free(m);
}

static void test_scheduler_lora_waits_for_a_slot_without_starving_others(void **state) {
    (void)state;
    struct engine_model *m = make_model();
    struct engine_adapter *ad[2];
    load_adapters(m, ad, 2);
    struct scheduler_params p = params(1, false, 512);
    struct scheduler *s;
    assert_int_equal(scheduler_create(m, &p, &s), 0);
    struct req_spec r;
    make_reqs(3, &r, 1, 0);
    r.n_prompt = 8;
    r.arrival_step = 0;
    struct req_spec a_long = r, b = r, none = r, a_late = r;
    a_long.adapter = 0;
    a_long.max_tokens = 20;
    b.adapter = 1;
    b.max_tokens = 3;
    none.adapter = -1;
    none.max_tokens = 3;
    a_late.adapter = 0;
    a_late.max_tokens = 3;
    uint64_t id;
    struct channel *c[4];
    assert_int_equal(submit(s, &a_long, ad, &id, &c[0]), 0);
    assert_true(scheduler_step(s) > 0);  // a0 takes the only slot
    assert_int_equal(submit(s, &b, ad, &id, &c[1]), 0);
    assert_int_equal(submit(s, &none, ad, &id, &c[2]), 0);
    assert_int_equal(submit(s, &a_late, ad, &id, &c[3]), 0);
    assert_true(scheduler_step(s) > 0);
    struct scheduler_stats st;
    scheduler_get_stats(s, &st);
    // b waits for the slot; the base-model request behind it runs; the later
    // a0 request, whose adapter is resident, does not overtake b.
    assert_int_equal(st.n_running, 2);
    assert_int_equal(st.n_waiting, 2);
    assert_true(st.n_lora_waits >= 1);
    assert_int_equal(st.n_lora_resident, 1);
    struct result res[4];
    memset(res, 0, sizeof(res));
    bool done[4] = {false, false, false, false};
    int order[4];
    int n_done = 0;
    for (int step = 0; n_done < 4; step++) {
        assert_true(step < 1000);
        assert_true(scheduler_step(s) >= 0);
        assert_true(scheduler_check(s));
        for (int i = 0; i < 4; i++) {
            if (done[i] || !collect(c[i], &res[i])) continue;
            done[i] = true;
            order[n_done++] = i;
            channel_release(c[i]);
        }
    }
    assert_int_equal(order[0], 2);  // the base-model request was not held up
    // b got the slot as soon as a_long let go of it, before a_late (which
    // needed the same evicted-and-reloaded slot after b).
    scheduler_get_stats(s, &st);
    assert_int_equal(st.n_lora_loads, 3);
    assert_int_equal(st.n_lora_evictions, 2);
    for (int i = 0; i < 4; i++) assert_int_equal(res[i].finish, CHANNEL_FINISH_LENGTH);
    scheduler_free(s);
    release_adapters(ad, 2);
    assert_int_equal(fake_engine_n_live_adapters(m), 0);
    engine_model_free(m);
}

static void test_scheduler_lora_references_and_errors(void **state) {
    (void)state;
    struct engine_model *m = make_model();
    struct engine_adapter *ad[1];
    load_adapters(m, ad, 1);
    struct req_spec r;
    make_reqs(5, &r, 1, 0);
    r.adapter = 0;
    r.max_tokens = 6;
    struct result want;
    run_alone(m, ad, &r, 1, &want);

    // No slots: an adapter request is refused at submit.
    struct scheduler_params p0 = params(0, true, 512);
    struct scheduler *s;
    assert_int_equal(scheduler_create(m, &p0, &s), 0);
    uint64_t id;
    struct channel *c;
    assert_int_equal(submit(s, &r, ad, &id, &c), ERR_INVAL);
    scheduler_free(s);

    // The caller drops its reference right after submit (an unload while the
    // request is queued): the sequence's own reference keeps it alive, and
    // the result is unchanged.
    struct scheduler_params p = params(2, true, 512);
    assert_int_equal(scheduler_create(m, &p, &s), 0);
    assert_int_equal(submit(s, &r, ad, &id, &c), 0);
    engine_adapter_release(ad[0]);
    assert_int_equal(fake_engine_n_live_adapters(m), 1);
    struct result got;
    drain(s, c, &got);
    expect_same(&want, &got, 1, "released after submit", 0);
    // Resident in its slot (scheduler and engine references) until evicted or freed.
    assert_int_equal(fake_engine_n_live_adapters(m), 1);
    scheduler_free(s);
    assert_int_equal(fake_engine_n_live_adapters(m), 0);

    // Canceled while waiting, and left queued at shutdown: no reference leaks.
    load_adapters(m, ad, 1);
    assert_int_equal(scheduler_create(m, &p, &s), 0);
    assert_int_equal(submit(s, &r, ad, &id, &c), 0);
    scheduler_cancel(s, id);
    assert_true(scheduler_step(s) >= 0);
    channel_release(c);
    assert_int_equal(submit(s, &r, ad, &id, &c), 0);
    assert_true(scheduler_step(s) >= 0);
    channel_release(c);
    assert_int_equal(submit(s, &r, ad, &id, &c), 0);  // never drained
    channel_release(c);
    scheduler_free(s);
    release_adapters(ad, 1);
    assert_int_equal(fake_engine_n_live_adapters(m), 0);
    engine_model_free(m);
}

int main(void) {
    log_set_level(LOG_LEVEL_WARN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_scheduler_lora_mixed_batch_equals_alone),
        cmocka_unit_test(test_scheduler_lora_prefix_cache_not_shared_across_adapters),
        cmocka_unit_test(test_scheduler_lora_waits_for_a_slot_without_starving_others),
        cmocka_unit_test(test_scheduler_lora_references_and_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
