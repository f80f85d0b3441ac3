/*
 * tests/scheduler/test_channel.c - push/read hand-over, finish and usage,
 * the two references (either side may drop first), the wake callback, and
 * a producer thread against a consumer thread.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <cmocka.h>

#include <threads.h>

#include "scheduler/channel.h"

static void count_wake(void *user) {
    (*(int *)user)++;
}

static void test_channel_push_read_finish(void **state) {
    (void)state;
    struct channel *c = channel_create(true);
    assert_non_null(c);
    struct channel_output out;
    assert_false(channel_read(c, &out));
    channel_output_free(&out);
    int n_wakes = 0;
    channel_set_wake(c, count_wake, &n_wakes);
    assert_int_equal(n_wakes, 0);
    struct sampler_result r = {.token = 5, .logprob = -0.5f};
    channel_push(c, 5, "he", 2, &r);
    channel_push(c, 6, "llo", 3, NULL);
    assert_int_equal(n_wakes, 2);
    assert_true(channel_read(c, &out));
    assert_string_equal(out.text, "hello");
    assert_int_equal(out.n_tokens, 2);
    assert_int_equal(out.token_ids[1], 6);
    assert_true(out.logprobs[0].logprob == -0.5f);
    assert_int_equal(out.finish, CHANNEL_FINISH_NONE);
    channel_output_free(&out);
    channel_push_text(c, "!", 1);
    struct channel_usage u = {3, 2, 0, 1};
    channel_finish(c, CHANNEL_FINISH_LENGTH, 0, &u);
    assert_true(channel_is_finished(c));
    assert_true(channel_read(c, &out));
    assert_string_equal(out.text, "!");
    assert_int_equal(out.n_tokens, 0);
    assert_int_equal(out.finish, CHANNEL_FINISH_LENGTH);
    assert_int_equal(out.usage.n_generated, 2);
    assert_int_equal(out.usage.n_preemptions, 1);
    channel_output_free(&out);
    channel_release(c);  // producer
    channel_release(c);  // consumer: frees (ASan reports a leak otherwise)
}

static void test_channel_late_wake_registration_fires_once(void **state) {
    (void)state;
    struct channel *c = channel_create(false);
    channel_push(c, 1, "x", 1, NULL);
    int n_wakes = 0;
    channel_set_wake(c, count_wake, &n_wakes);
    assert_int_equal(n_wakes, 1);
    channel_release(c);  // consumer goes first (a disconnect)
    channel_push(c, 2, "y", 1, NULL);  // the producer may still push
    channel_release(c);
}

struct produce_args {
    struct channel *c;
    int n;
};

static int produce(void *arg) {
    struct produce_args *a = arg;
    for (int i = 0; i < a->n; i++) channel_push(a->c, i, "ab", 2, NULL);
    channel_finish(a->c, CHANNEL_FINISH_STOP, 0, NULL);
    channel_release(a->c);
    return 0;
}

struct consumer {
    mtx_t lock;
    cnd_t cond;
    int n_wakes;
};

static void wake_consumer(void *user) {
    struct consumer *k = user;
    mtx_lock(&k->lock);
    k->n_wakes++;
    cnd_signal(&k->cond);
    mtx_unlock(&k->lock);
}

static void test_channel_across_threads(void **state) {
    (void)state;
    struct consumer k = {.n_wakes = 0};
    mtx_init(&k.lock, mtx_plain);
    cnd_init(&k.cond);
    struct channel *c = channel_create(false);
    channel_set_wake(c, wake_consumer, &k);
    struct produce_args a = {c, 5000};
    thrd_t th;
    assert_int_equal(thrd_create(&th, produce, &a), thrd_success);
    int64_t n_tokens = 0;
    size_t n_bytes = 0;
    int seen_wakes = 0;
    for (;;) {
        struct channel_output out;
        channel_read(c, &out);
        n_tokens += out.n_tokens;
        n_bytes += out.text_len;
        bool done = out.finish != CHANNEL_FINISH_NONE;
        channel_output_free(&out);
        if (done) break;
        // Sleep until woken; a wake between read and wait is not lost.
        mtx_lock(&k.lock);
        while (k.n_wakes == seen_wakes) cnd_wait(&k.cond, &k.lock);
        seen_wakes = k.n_wakes;
        mtx_unlock(&k.lock);
    }
    thrd_join(th, NULL);
    assert_int_equal(n_tokens, 5000);
    assert_int_equal(n_bytes, 10000);
    channel_release(c);
    cnd_destroy(&k.cond);
    mtx_destroy(&k.lock);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_channel_push_read_finish),
        cmocka_unit_test(test_channel_late_wake_registration_fires_once),
        cmocka_unit_test(test_channel_across_threads),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
