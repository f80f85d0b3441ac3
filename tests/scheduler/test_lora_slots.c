/*
 * tests/scheduler/test_lora_slots.c - adapter slot assignment: reuse of a
 * resident adapter, empty slots first, LRU eviction of unused slots only,
 * "none" when every slot is in use, each slot naming its adapter by the
 * adapter's own id (the same after an eviction and reload), and every
 * reference given back. Adapters come from the fake engine, which counts
 * the live ones.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <cmocka.h>

#include "scheduler/lora_slots.h"
#include "tests/helpers/fake_engine.h"

static struct engine_model *model(void) {
    struct fake_engine_params p = {.n_vocab = 64, .n_ctx = 256};
    return fake_engine_model_create(&p);
}

static uint64_t id_of(const struct engine_adapter *a) {
    return engine_adapter_get_info(a)->id;
}

static struct engine_adapter *load(const struct engine_model *m, int i) {
    char path[32];
    snprintf(path, sizeof(path), "adapter-%d", i);
    struct engine_adapter *a = NULL;
    assert_int_equal(engine_adapter_load(m, path, &a), 0);
    return a;
}

static void test_lora_slots_reuses_resident_and_fills_empty_first(void **state) {
    (void)state;
    struct engine_model *m = model();
    struct engine_adapter *a = load(m, 0);
    struct engine_adapter *b = load(m, 1);
    struct lora_slots t;
    lora_slots_init(&t, 3);
    int32_t sa = lora_slots_acquire(&t, a);
    int32_t sa2 = lora_slots_acquire(&t, a);
    int32_t sb = lora_slots_acquire(&t, b);
    assert_int_equal(sa, sa2);
    assert_int_not_equal(sa, sb);
    assert_true(id_of(a) != 0 && id_of(b) != 0 && id_of(a) != id_of(b));
    assert_true(t.slots[sa].adapter_id == id_of(a) && t.slots[sb].adapter_id == id_of(b));
    assert_int_equal(t.slots[sa].n_users, 2);
    assert_true(t.slots[sa].is_dirty && t.slots[sb].is_dirty);
    assert_int_equal(t.n_loads, 2);
    assert_int_equal(t.n_evictions, 0);
    assert_int_equal(lora_slots_n_resident(&t), 2);
    assert_true(lora_slots_check(&t));
    lora_slots_release(&t, sa);
    lora_slots_release(&t, sa);
    lora_slots_release(&t, sb);
    // The table holds its own references: the caller's can go at once.
    engine_adapter_release(a);
    engine_adapter_release(b);
    assert_int_equal(fake_engine_n_live_adapters(m), 2);
    lora_slots_deinit(&t);
    assert_int_equal(fake_engine_n_live_adapters(m), 0);
    engine_model_free(m);
}

static void test_lora_slots_none_when_all_in_use_then_lru_eviction(void **state) {
    (void)state;
    struct engine_model *m = model();
    struct engine_adapter *ad[4];
    for (int i = 0; i < 4; i++) ad[i] = load(m, i);
    struct lora_slots t;
    lora_slots_init(&t, 2);
    int32_t s0 = lora_slots_acquire(&t, ad[0]);
    int32_t s1 = lora_slots_acquire(&t, ad[1]);
    // Both slots have users: a third adapter must wait, and nothing changes.
    assert_false(lora_slots_can_acquire(&t, ad[2]));
    assert_true(lora_slots_can_acquire(&t, ad[0]));
    assert_int_equal(lora_slots_acquire(&t, ad[2]), LORA_SLOTS_NONE);
    assert_int_equal(t.n_loads, 2);
    assert_true(lora_slots_check(&t));
    // Both unused, slot 0 least recently used: it is the one evicted.
    lora_slots_release(&t, s1);
    lora_slots_release(&t, s0);
    assert_int_equal(lora_slots_acquire(&t, ad[0]), s0);  // touch 0: now 1 is LRU
    lora_slots_release(&t, s0);
    int32_t s2 = lora_slots_acquire(&t, ad[2]);
    assert_int_equal(s2, s1);
    assert_true(t.slots[s2].adapter_id == id_of(ad[2]));
    assert_int_equal(t.n_evictions, 1);
    // ad[1] comes back into another slot with its own identity, so its cached
    // prefixes are found again.
    lora_slots_release(&t, s2);
    int32_t s1b = lora_slots_acquire(&t, ad[1]);
    assert_int_equal(s1b, s0);  // slot 0 was used before slot 2's acquire
    assert_true(t.slots[s1b].adapter_id == id_of(ad[1]));
    lora_slots_release(&t, s1b);
    assert_true(lora_slots_check(&t));
    for (int i = 0; i < 4; i++) engine_adapter_release(ad[i]);
    lora_slots_deinit(&t);
    assert_int_equal(fake_engine_n_live_adapters(m), 0);
    engine_model_free(m);
}

/* Random acquire/release: invariants after every operation (each slot's id is
 * its adapter's), the slot returned holds the adapter asked for. */
static void test_lora_slots_random_ops_keep_invariants(void **state) {
    (void)state;
    enum { N_AD = 7, N_SLOTS = 3, N_OPS = 5000 };
    struct engine_model *m = model();
    struct engine_adapter *ad[N_AD];
    for (int i = 0; i < N_AD; i++) ad[i] = load(m, i);
    int32_t held[64];
    int n_held = 0;
    struct lora_slots t;
    lora_slots_init(&t, N_SLOTS);
    uint64_t rng = 42;
    for (int op = 0; op < N_OPS; op++) {
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        uint32_t r = (uint32_t)(rng >> 33);
        if (n_held > 0 && (r % 3 == 0 || n_held == 64)) {
            int k = (int)(r / 3 % (uint32_t)n_held);
            lora_slots_release(&t, held[k]);
            held[k] = held[--n_held];
        } else {
            int i = (int)(r / 3 % N_AD);
            bool can = lora_slots_can_acquire(&t, ad[i]);
            int32_t s = lora_slots_acquire(&t, ad[i]);
            assert_int_equal(s >= 0, can);
            if (s >= 0) {
                assert_ptr_equal(t.slots[s].adapter, ad[i]);
                assert_true(t.slots[s].adapter_id == id_of(ad[i]));
                held[n_held++] = s;
            }
        }
        if (!lora_slots_check(&t)) fail_msg("invariant broken at op %d (seed 42)", op);
    }
    while (n_held > 0) lora_slots_release(&t, held[--n_held]);
    for (int i = 0; i < N_AD; i++) engine_adapter_release(ad[i]);
    lora_slots_deinit(&t);
    assert_int_equal(fake_engine_n_live_adapters(m), 0);
    engine_model_free(m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_lora_slots_reuses_resident_and_fills_empty_first),
        cmocka_unit_test(test_lora_slots_none_when_all_in_use_then_lru_eviction),
        cmocka_unit_test(test_lora_slots_random_ops_keep_invariants),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
