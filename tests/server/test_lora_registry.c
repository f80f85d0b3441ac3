/*
 * tests/server/test_lora_registry.c - the served-adapter list: name checks,
 * reservations (invisible to requests and /v1/models, but holding the name),
 * loading a reservation, unloading a reservation (the load then never reaches
 * the engine, or drops its adapter), the start-up path, and references: an
 * unloaded adapter lives on in whoever still holds it. Built against the fake
 * engine (tests/helpers/fake_engine.h), whose gate holds a load "in progress"
 * on another thread for as long as a test needs, without timing.
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <cmocka.h>

#include "engine/base/err.h"
#include "engine/base/log.h"
#include "server/lora_registry.h"
#include "tests/helpers/fake_engine.h"

static struct engine_model *model(void) {
    struct fake_engine_params p = {.n_vocab = 64, .n_ctx = 256};
    return fake_engine_model_create(&p);
}

static void count_entry(const struct lora_registry_entry *e, void *user) {
    (void)e;
    (*(int *)user)++;
}

static int n_listed(struct lora_registry *r) {
    int n = 0;
    lora_registry_foreach(r, count_entry, &n);
    assert_int_equal(n, lora_registry_count(r));
    return n;
}

static void test_lora_registry_rejects_bad_names_and_paths(void **state) {
    (void)state;
    struct engine_model *m = model();
    struct lora_registry *r = lora_registry_create(m, "base");
    char msg[256];
    uint64_t ticket = 99;
    char long_name[LORA_REGISTRY_NAME_MAX + 2];
    memset(long_name, 'x', sizeof(long_name) - 1);
    long_name[sizeof(long_name) - 1] = '\0';
    const char *names[] = {"", "base", "a\nb", "tab\there", long_name};
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        msg[0] = '\0';
        assert_int_equal(lora_registry_reserve(r, names[i], "/a", &ticket, msg, sizeof(msg)),
                         ERR_INVAL);
        assert_true(ticket == 0);
        assert_true(strlen(msg) > 0);
    }
    assert_int_equal(lora_registry_reserve(r, "ok", "", &ticket, msg, sizeof(msg)), ERR_INVAL);
    long_name[LORA_REGISTRY_NAME_MAX] = '\0';  // exactly the limit: fine
    assert_int_equal(lora_registry_reserve(r, long_name, "/a", &ticket, msg, sizeof(msg)), 0);
    assert_int_equal(lora_registry_unload(r, long_name), 0);
    assert_int_equal(fake_engine_n_loads(m), 0);
    lora_registry_destroy(r);
    engine_model_free(m);
}

/* A reservation holds the name but is served to nobody until it is loaded. */
static void test_lora_registry_reservation_then_load(void **state) {
    (void)state;
    struct engine_model *m = model();
    struct lora_registry *r = lora_registry_create(m, "base");
    char msg[256];
    uint64_t t1 = 0, t2 = 0, t3 = 0;
    assert_int_equal(lora_registry_reserve(r, "a", "/adapters/a", &t1, msg, sizeof(msg)), 0);
    assert_true(t1 != 0);
    assert_null(lora_registry_get(r, "a"));
    assert_int_equal(n_listed(r), 0);
    assert_int_equal(lora_registry_reserve(r, "a", "/adapters/other", &t2, msg, sizeof(msg)),
                     LORA_REGISTRY_LOADING);
    assert_true(t2 == 0);
    assert_non_null(strstr(msg, "being loaded"));
    assert_int_equal(fake_engine_n_loads(m), 0);  // reserving reads nothing

    struct engine_adapter *a = NULL;
    assert_int_equal(lora_registry_load_reserved(r, t1, NULL, &a, msg, sizeof(msg)), 0);
    assert_non_null(a);
    assert_string_equal(engine_adapter_get_info(a)->path, "/adapters/a");
    struct engine_adapter *got = lora_registry_get(r, "a");
    assert_ptr_equal(got, a);
    engine_adapter_release(got);
    engine_adapter_release(a);
    assert_int_equal(n_listed(r), 1);
    assert_int_equal(lora_registry_reserve(r, "a", "/adapters/a", &t2, msg, sizeof(msg)),
                     LORA_REGISTRY_EXISTS);
    assert_non_null(strstr(msg, "already loaded"));
    // A used-up ticket is never honoured again; tickets are never reused.
    assert_int_equal(lora_registry_load_reserved(r, t1, NULL, NULL, msg, sizeof(msg)), ERR_CANCELED);
    assert_int_equal(lora_registry_reserve(r, "b", "/adapters/b", &t3, msg, sizeof(msg)), 0);
    assert_true(t3 != t1);
    lora_registry_cancel(r, t3);
    lora_registry_cancel(r, t3);  // a no-op the second time
    assert_int_equal(lora_registry_unload(r, "b"), ERR_NOTFOUND);
    assert_int_equal(fake_engine_n_loads(m), 1);

    // The start-up path: reserve and load in one call.
    assert_int_equal(lora_registry_load(r, "c", "/adapters/c", msg, sizeof(msg)), 0);
    assert_int_equal(lora_registry_load(r, "c", "/adapters/c", msg, sizeof(msg)),
                     LORA_REGISTRY_EXISTS);
    assert_int_equal(n_listed(r), 2);
    lora_registry_destroy(r);
    assert_int_equal(fake_engine_n_live_adapters(m), 0);
    engine_model_free(m);
}

/* A load that fails frees the name; its message names the adapter and path. */
static void test_lora_registry_failed_load_frees_the_name(void **state) {
    (void)state;
    struct engine_model *m = model();
    struct lora_registry *r = lora_registry_create(m, "base");
    char msg[512];
    uint64_t t = 0;
    assert_int_equal(lora_registry_reserve(r, "x", "/adapters/bad", &t, msg, sizeof(msg)), 0);
    struct engine_adapter *a = (struct engine_adapter *)&t;  // must be reset
    assert_int_equal(lora_registry_load_reserved(r, t, NULL, &a, msg, sizeof(msg)), ERR_FORMAT);
    assert_null(a);
    assert_non_null(strstr(msg, "'x'"));
    assert_non_null(strstr(msg, "/adapters/bad"));
    assert_int_equal(lora_registry_load(r, "x", "/adapters/missing", msg, sizeof(msg)), ERR_IO);
    assert_int_equal(lora_registry_load(r, "x", "/adapters/x", msg, sizeof(msg)), 0);
    assert_int_equal(n_listed(r), 1);
    lora_registry_destroy(r);
    engine_model_free(m);
}

/* An unload of a reserved name: before its load starts, the engine is never
 * asked; while it runs, the adapter is dropped when it ends. */
struct load_arg {
    struct lora_registry *r;
    uint64_t ticket;
    int err;
    char msg[256];
};

static void *load_thread(void *p) {
    struct load_arg *la = p;
    la->err = lora_registry_load_reserved(la->r, la->ticket, NULL, NULL, la->msg, sizeof(la->msg));
    return NULL;
}

static void test_lora_registry_unload_cancels_a_reservation(void **state) {
    (void)state;
    struct engine_model *m = model();
    struct lora_registry *r = lora_registry_create(m, "base");
    char msg[256];
    uint64_t t = 0;
    // Before the load starts.
    assert_int_equal(lora_registry_reserve(r, "q", "/adapters/q", &t, msg, sizeof(msg)), 0);
    assert_int_equal(lora_registry_unload(r, "q"), 0);
    assert_int_equal(lora_registry_load_reserved(r, t, NULL, NULL, msg, sizeof(msg)), ERR_CANCELED);
    assert_int_equal(fake_engine_n_loads(m), 0);

    // While it runs (held at the gate on another thread); the name may be
    // reserved again meanwhile, and the old load must not take it.
    struct load_arg la = {.r = r};
    assert_int_equal(lora_registry_reserve(r, "g", "/adapters/gate-1", &la.ticket, msg,
                                           sizeof(msg)), 0);
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, load_thread, &la), 0);
    fake_engine_gate_wait(m, 1);
    assert_int_equal(lora_registry_unload(r, "g"), 0);
    uint64_t t2 = 0;
    assert_int_equal(lora_registry_reserve(r, "g", "/adapters/g2", &t2, msg, sizeof(msg)), 0);
    fake_engine_gate_pass(m, 1);
    pthread_join(th, NULL);
    assert_int_equal(la.err, ERR_CANCELED);
    assert_non_null(strstr(la.msg, "unloaded while it was loading"));
    assert_int_equal(fake_engine_n_live_adapters(m), 0);  // the gated adapter was dropped
    assert_null(lora_registry_get(r, "g"));               // still only reserved (t2)
    assert_int_equal(lora_registry_load_reserved(r, t2, NULL, NULL, msg, sizeof(msg)), 0);
    struct engine_adapter *g = lora_registry_get(r, "g");
    assert_non_null(g);
    assert_string_equal(engine_adapter_get_info(g)->path, "/adapters/g2");

    // Unloaded while a request holds it: alive until that reference goes.
    assert_int_equal(lora_registry_unload(r, "g"), 0);
    assert_int_equal(fake_engine_n_live_adapters(m), 1);
    engine_adapter_release(g);
    assert_int_equal(fake_engine_n_live_adapters(m), 0);
    assert_int_equal(lora_registry_unload(r, "g"), ERR_NOTFOUND);
    lora_registry_destroy(r);
    engine_model_free(m);
}

int main(void) {
    log_set_level(LOG_LEVEL_WARN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_lora_registry_rejects_bad_names_and_paths),
        cmocka_unit_test(test_lora_registry_reservation_then_load),
        cmocka_unit_test(test_lora_registry_failed_load_frees_the_name),
        cmocka_unit_test(test_lora_registry_unload_cancels_a_reservation),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
