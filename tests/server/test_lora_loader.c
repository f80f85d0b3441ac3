/*
 * tests/server/test_lora_loader.c - the adapter loader thread: a job's result
 * and its one wake; a second load of a name in flight (LORA_REGISTRY_LOADING);
 * unloads of a queued and of a running load; a consumer that lets go before
 * the end (the adapter still lands, nobody is woken); a full queue; a failed
 * load; and stopping with loads queued and running, within and past the wait.
 *
 * Built against the fake engine: a load of a path containing "gate" waits at
 * the fake model's gate until the test lets it through, so "a load is in
 * progress" is a state the test controls, never a matter of timing. Every
 * wait here is on a condition variable.
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
#include "server/lora_loader.h"
#include "server/lora_registry.h"
#include "tests/helpers/fake_engine.h"

/* A wake target that counts its wakes per job. */
struct waker {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    int n_wakes;
};

static void waker_init(struct waker *w) {
    pthread_mutex_init(&w->lock, NULL);
    pthread_cond_init(&w->cond, NULL);
    w->n_wakes = 0;
}

static void waker_deinit(struct waker *w) {
    pthread_mutex_destroy(&w->lock);
    pthread_cond_destroy(&w->cond);
}

static void wake(void *user) {
    struct waker *w = user;
    pthread_mutex_lock(&w->lock);
    w->n_wakes++;
    pthread_cond_broadcast(&w->cond);
    pthread_mutex_unlock(&w->lock);
}

/* Waits until w has been woken n times in all. */
static void waker_wait(struct waker *w, int n) {
    pthread_mutex_lock(&w->lock);
    while (w->n_wakes < n) pthread_cond_wait(&w->cond, &w->lock);
    pthread_mutex_unlock(&w->lock);
}

static int waker_count(struct waker *w) {
    pthread_mutex_lock(&w->lock);
    int n = w->n_wakes;
    pthread_mutex_unlock(&w->lock);
    return n;
}

struct fixture {
    struct engine_model *m;
    struct lora_registry *r;
    struct lora_loader *l;
};

static void setup(struct fixture *f) {
    struct fake_engine_params p = {.n_vocab = 64, .n_ctx = 256};
    f->m = fake_engine_model_create(&p);
    f->r = lora_registry_create(f->m, "base");
    f->l = lora_loader_create(f->r, NULL);
    assert_non_null(f->r);
    assert_non_null(f->l);
}

static void teardown(struct fixture *f) {
    lora_loader_destroy(f->l);
    lora_registry_destroy(f->r);
    assert_int_equal(fake_engine_n_live_adapters(f->m), 0);
    engine_model_free(f->m);
}

static struct lora_loader_job *submit(struct fixture *f, const char *name, const char *path,
                                      struct waker *w) {
    char msg[512];
    struct lora_loader_job *j = NULL;
    int err = lora_loader_submit(f->l, name, path, wake, w, &j, msg, sizeof(msg));
    if (err) fail_msg("submit %s: %d (%s)", name, err, msg);
    assert_non_null(j);
    return j;
}

static void test_lora_loader_loads_and_wakes_once(void **state) {
    (void)state;
    struct fixture f;
    setup(&f);
    struct waker w;
    waker_init(&w);
    struct lora_loader_job *j = submit(&f, "a", "/adapters/a", &w);
    waker_wait(&w, 1);
    assert_true(lora_loader_job_is_done(j));
    const struct lora_loader_result *res = lora_loader_job_result(j);
    assert_int_equal(res->err, 0);
    assert_string_equal(res->name, "a");
    assert_string_equal(res->path, "/adapters/a");
    assert_string_equal(res->format, "fake");
    assert_int_equal(res->rank, 4);
    struct engine_adapter *a = lora_registry_get(f.r, "a");
    assert_non_null(a);
    engine_adapter_release(a);
    lora_loader_job_release(j);

    // A failed load: the file's error, and the name is free again.
    j = submit(&f, "b", "/adapters/bad", &w);
    waker_wait(&w, 2);
    assert_int_equal(lora_loader_job_result(j)->err, ERR_FORMAT);
    assert_non_null(strstr(lora_loader_job_result(j)->message, "/adapters/bad"));
    lora_loader_job_release(j);
    j = submit(&f, "b", "/adapters/b", &w);
    waker_wait(&w, 3);
    assert_int_equal(lora_loader_job_result(j)->err, 0);
    lora_loader_job_release(j);
    assert_int_equal(waker_count(&w), 3);
    teardown(&f);
    waker_deinit(&w);
}

/* While "g" loads: a second load of "g" is refused at once, another name
 * queues behind it, an unload of the queued one cancels it before it reaches
 * the engine, and nothing of either is served until it has loaded. */
static void test_lora_loader_names_in_flight(void **state) {
    (void)state;
    struct fixture f;
    setup(&f);
    struct waker wg, wq;
    waker_init(&wg);
    waker_init(&wq);
    struct lora_loader_job *jg = submit(&f, "g", "/adapters/gate-g", &wg);
    fake_engine_gate_wait(f.m, 1);  // now running, held at the gate
    char msg[512];
    struct lora_loader_job *j2 = (struct lora_loader_job *)&msg;  // must be reset
    assert_int_equal(lora_loader_submit(f.l, "g", "/adapters/x", wake, &wg, &j2, msg, sizeof(msg)),
                     LORA_REGISTRY_LOADING);
    assert_null(j2);
    struct lora_loader_job *jq = submit(&f, "q", "/adapters/q", &wq);
    assert_null(lora_registry_get(f.r, "g"));
    assert_null(lora_registry_get(f.r, "q"));
    assert_int_equal(lora_registry_count(f.r), 0);
    assert_int_equal(lora_registry_unload(f.r, "q"), 0);
    assert_false(lora_loader_job_is_done(jg));
    assert_false(lora_loader_job_is_done(jq));
    assert_int_equal(waker_count(&wg) + waker_count(&wq), 0);

    fake_engine_gate_pass(f.m, 1);
    waker_wait(&wg, 1);
    waker_wait(&wq, 1);
    assert_int_equal(lora_loader_job_result(jg)->err, 0);
    assert_int_equal(lora_loader_job_result(jq)->err, ERR_CANCELED);
    assert_int_equal(fake_engine_n_loads(f.m), 1);  // q never reached the engine
    assert_int_equal(lora_registry_count(f.r), 1);
    assert_null(lora_registry_get(f.r, "q"));
    lora_loader_job_release(jg);
    lora_loader_job_release(jq);
    teardown(&f);
    waker_deinit(&wg);
    waker_deinit(&wq);
}

/* An unload while the load runs: the adapter is dropped when it ends, the
 * client hears ERR_CANCELED, and the name can be loaded again. */
static void test_lora_loader_unload_while_loading(void **state) {
    (void)state;
    struct fixture f;
    setup(&f);
    struct waker w;
    waker_init(&w);
    struct lora_loader_job *j = submit(&f, "g", "/adapters/gate-g", &w);
    fake_engine_gate_wait(f.m, 1);
    assert_int_equal(lora_registry_unload(f.r, "g"), 0);
    fake_engine_gate_pass(f.m, 1);
    waker_wait(&w, 1);
    assert_int_equal(lora_loader_job_result(j)->err, ERR_CANCELED);
    assert_int_equal(fake_engine_n_live_adapters(f.m), 0);
    assert_int_equal(lora_registry_count(f.r), 0);
    lora_loader_job_release(j);
    j = submit(&f, "g", "/adapters/g", &w);
    waker_wait(&w, 2);
    assert_int_equal(lora_loader_job_result(j)->err, 0);
    lora_loader_job_release(j);
    teardown(&f);
    waker_deinit(&w);
}

/* The client goes away mid-load: its reference goes, the adapter still
 * lands, and no wake is ever called. */
static void test_lora_loader_consumer_leaves_early(void **state) {
    (void)state;
    struct fixture f;
    setup(&f);
    struct waker w;
    waker_init(&w);
    struct lora_loader_job *j = submit(&f, "g", "/adapters/gate-g", &w);
    struct lora_loader_job *k = submit(&f, "k", "/adapters/k", &w);  // queued, left at once
    lora_loader_job_release(k);
    fake_engine_gate_wait(f.m, 1);
    lora_loader_job_release(j);
    fake_engine_gate_pass(f.m, 1);
    // Jobs run in order: when a later one wakes its client, both have ended.
    struct waker wz;
    waker_init(&wz);
    struct lora_loader_job *z = submit(&f, "z", "/adapters/z", &wz);
    waker_wait(&wz, 1);
    lora_loader_job_release(z);
    assert_int_equal(waker_count(&w), 0);
    assert_int_equal(lora_registry_count(f.r), 3);
    teardown(&f);
    waker_deinit(&w);
    waker_deinit(&wz);
}

static void test_lora_loader_full_queue(void **state) {
    (void)state;
    struct fixture f;
    setup(&f);
    struct waker w;
    waker_init(&w);
    struct lora_loader_job *running = submit(&f, "g", "/adapters/gate-g", &w);
    fake_engine_gate_wait(f.m, 1);
    struct lora_loader_job *queued[LORA_LOADER_MAX_QUEUED];
    for (int i = 0; i < LORA_LOADER_MAX_QUEUED; i++) {
        char name[16];
        snprintf(name, sizeof(name), "q%d", i);
        queued[i] = submit(&f, name, "/adapters/q", &w);
    }
    char msg[512];
    struct lora_loader_job *j = NULL;
    assert_int_equal(lora_loader_submit(f.l, "one-more", "/adapters/x", wake, &w, &j, msg,
                                        sizeof(msg)), ERR_FULL);
    assert_null(j);
    fake_engine_gate_pass(f.m, 1);
    waker_wait(&w, 1 + LORA_LOADER_MAX_QUEUED);
    for (int i = 0; i < LORA_LOADER_MAX_QUEUED; i++) {
        assert_int_equal(lora_loader_job_result(queued[i])->err, 0);
        lora_loader_job_release(queued[i]);
    }
    lora_loader_job_release(running);
    // "one-more" reserved nothing: it can be loaded now.
    j = submit(&f, "one-more", "/adapters/x", &w);
    waker_wait(&w, 2 + LORA_LOADER_MAX_QUEUED);
    lora_loader_job_release(j);
    teardown(&f);
    waker_deinit(&w);
}

struct stop_arg {
    struct lora_loader *l;
    enum lora_loader_stop result;
};

static void *stop_thread(void *p) {
    struct stop_arg *sa = p;
    sa->result = lora_loader_stop(sa->l, -1);
    return NULL;
}

/* Shutdown: queued loads are answered ERR_SHUTDOWN at once and never run;
 * the running one ends normally (listed, client woken) while stop waits;
 * later submits are refused. */
static void test_lora_loader_stop_waits_for_the_running_load(void **state) {
    (void)state;
    struct fixture f;
    setup(&f);
    struct waker wr, wq;
    waker_init(&wr);
    waker_init(&wq);
    struct lora_loader_job *jr = submit(&f, "r", "/adapters/gate-r", &wr);
    fake_engine_gate_wait(f.m, 1);
    struct lora_loader_job *jq = submit(&f, "q", "/adapters/q", &wq);
    struct stop_arg sa = {.l = f.l};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, stop_thread, &sa), 0);
    waker_wait(&wq, 1);  // stop has answered the queue; r still runs
    assert_int_equal(lora_loader_job_result(jq)->err, ERR_SHUTDOWN);
    assert_false(lora_loader_job_is_done(jr));
    char msg[512];
    struct lora_loader_job *j = NULL;
    assert_int_equal(lora_loader_submit(f.l, "late", "/adapters/late", wake, &wq, &j, msg,
                                        sizeof(msg)), ERR_SHUTDOWN);
    assert_null(j);
    fake_engine_gate_pass(f.m, 1);
    pthread_join(th, NULL);
    assert_int_equal(sa.result, LORA_LOADER_STOPPED);
    assert_int_equal(waker_count(&wr), 1);
    assert_int_equal(lora_loader_job_result(jr)->err, 0);
    assert_int_equal(fake_engine_n_loads(f.m), 1);  // q and late never loaded
    assert_int_equal(lora_registry_count(f.r), 1);
    assert_null(lora_registry_get(f.r, "q"));
    uint64_t t = 0;  // their names were given back
    assert_int_equal(lora_registry_reserve(f.r, "q", "/p", &t, msg, sizeof(msg)), 0);
    assert_int_equal(lora_registry_reserve(f.r, "late", "/p", &t, msg, sizeof(msg)), 0);
    lora_loader_job_release(jr);
    lora_loader_job_release(jq);
    teardown(&f);
    waker_deinit(&wr);
    waker_deinit(&wq);
}

/* A load that does not end within the wait: STUCK; its client is answered
 * ERR_SHUTDOWN at once, and from then on nobody is woken (the server frees its
 * wake targets right after), though the adapter still lands when it ends. */
static void test_lora_loader_stop_gives_up_on_a_stuck_load(void **state) {
    (void)state;
    struct fixture f;
    setup(&f);
    struct waker w;
    waker_init(&w);
    struct lora_loader_job *j = submit(&f, "s", "/adapters/gate-s", &w);
    fake_engine_gate_wait(f.m, 1);
    int32_t n_queued = -1, n_running = -1;
    lora_loader_get_counts(f.l, &n_queued, &n_running);
    assert_int_equal(n_queued, 0);
    assert_int_equal(n_running, 1);
    assert_int_equal(lora_loader_stop(f.l, 0), LORA_LOADER_STUCK);
    assert_true(lora_loader_job_is_done(j));
    assert_int_equal(lora_loader_job_result(j)->err, ERR_SHUTDOWN);
    assert_string_equal(lora_loader_job_result(j)->name, "s");
    assert_int_equal(waker_count(&w), 1);
    assert_int_equal(lora_loader_stop(f.l, 1), LORA_LOADER_STUCK);
    fake_engine_gate_pass(f.m, 1);
    assert_int_equal(lora_loader_stop(f.l, -1), LORA_LOADER_STOPPED);
    assert_int_equal(lora_loader_job_result(j)->err, ERR_SHUTDOWN);  // answered once
    assert_int_equal(waker_count(&w), 1);
    assert_int_equal(lora_registry_count(f.r), 1);                   // but it landed
    lora_loader_job_release(j);
    teardown(&f);
    waker_deinit(&w);
}

int main(void) {
    log_set_level(LOG_LEVEL_ERROR);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_lora_loader_loads_and_wakes_once),
        cmocka_unit_test(test_lora_loader_names_in_flight),
        cmocka_unit_test(test_lora_loader_unload_while_loading),
        cmocka_unit_test(test_lora_loader_consumer_leaves_early),
        cmocka_unit_test(test_lora_loader_full_queue),
        cmocka_unit_test(test_lora_loader_stop_waits_for_the_running_load),
        cmocka_unit_test(test_lora_loader_stop_gives_up_on_a_stuck_load),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
