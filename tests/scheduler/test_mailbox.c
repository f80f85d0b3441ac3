/*
 * tests/scheduler/test_mailbox.c - FIFO order, draining, several posting
 * threads, and the wake callback after every post.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <threads.h>
#include <cmocka.h>

#include "engine/base/alloc.h"
#include "scheduler/mailbox.h"

static struct mailbox_msg *msg(uint64_t id) {
    struct mailbox_msg *m = xcalloc(1, sizeof(*m));
    m->type = MAILBOX_MSG_CANCEL;
    m->id = id;
    return m;
}

static void test_mailbox_fifo(void **state) {
    (void)state;
    struct mailbox *mb = mailbox_create(NULL, NULL);
    assert_non_null(mb);
    assert_null(mailbox_drain(mb));
    for (uint64_t i = 1; i <= 3; i++) mailbox_post(mb, msg(i));
    struct mailbox_msg *m = mailbox_drain(mb);
    for (uint64_t i = 1; i <= 3; i++) {
        assert_non_null(m);
        assert_int_equal(m->id, i);
        struct mailbox_msg *next = m->next;
        free(m);
        m = next;
    }
    assert_null(m);
    mailbox_post(mb, msg(7));  // left queued: destroy frees it
    mailbox_destroy(mb, NULL);
}

enum { N_THREADS = 4, N_PER_THREAD = 2000 };

struct poster {
    struct mailbox *mb;
    uint64_t base;
};

static int post_many(void *arg) {
    struct poster *p = arg;
    for (uint64_t i = 0; i < N_PER_THREAD; i++) mailbox_post(p->mb, msg(p->base + i));
    return 0;
}

struct waker {
    mtx_t lock;
    cnd_t cond;
    int64_t n_wakes;
};

static void on_wake(void *user) {
    struct waker *w = user;
    mtx_lock(&w->lock);
    w->n_wakes++;
    cnd_signal(&w->cond);
    mtx_unlock(&w->lock);
}

static void test_mailbox_many_threads_wake_the_consumer(void **state) {
    (void)state;
    struct waker w = {.n_wakes = 0};
    mtx_init(&w.lock, mtx_plain);
    cnd_init(&w.cond);
    struct mailbox *mb = mailbox_create(on_wake, &w);
    thrd_t th[N_THREADS];
    struct poster ps[N_THREADS];
    for (int i = 0; i < N_THREADS; i++) {
        ps[i].mb = mb;
        ps[i].base = (uint64_t)i * 1000000 + 1;
        assert_int_equal(thrd_create(&th[i], post_many, &ps[i]), thrd_success);
    }
    int64_t n_seen = 0;
    uint64_t last[N_THREADS] = {0};
    bool in_order = true;
    int64_t seen_wakes = 0;
    while (n_seen < N_THREADS * N_PER_THREAD) {
        struct mailbox_msg *m = mailbox_drain(mb);
        while (m) {
            uint64_t t = m->id / 1000000;
            if (m->id <= last[t]) in_order = false;
            last[t] = m->id;
            n_seen++;
            struct mailbox_msg *next = m->next;
            free(m);
            m = next;
        }
        if (n_seen == N_THREADS * N_PER_THREAD) break;
        // Sleep until a post wakes us; a post before the wait is not lost.
        mtx_lock(&w.lock);
        while (w.n_wakes == seen_wakes) cnd_wait(&w.cond, &w.lock);
        seen_wakes = w.n_wakes;
        mtx_unlock(&w.lock);
    }
    for (int i = 0; i < N_THREADS; i++) thrd_join(th[i], NULL);
    assert_true(in_order);  // per sender, FIFO
    assert_int_equal(w.n_wakes, N_THREADS * N_PER_THREAD);  // one wake per post
    mailbox_destroy(mb, NULL);
    cnd_destroy(&w.cond);
    mtx_destroy(&w.lock);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mailbox_fifo),
        cmocka_unit_test(test_mailbox_many_threads_wake_the_consumer),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
