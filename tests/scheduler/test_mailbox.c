/*
 * tests/scheduler/test_mailbox.c - FIFO order, draining, several posting
 * threads, and the uv_async wake-up of a loop.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <cmocka.h>

#include <uv.h>

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
    struct mailbox mb;
    assert_int_equal(mailbox_init(&mb, NULL), 0);
    assert_null(mailbox_drain(&mb));
    for (uint64_t i = 1; i <= 3; i++) mailbox_post(&mb, msg(i));
    struct mailbox_msg *m = mailbox_drain(&mb);
    for (uint64_t i = 1; i <= 3; i++) {
        assert_non_null(m);
        assert_int_equal(m->id, i);
        struct mailbox_msg *next = m->next;
        free(m);
        m = next;
    }
    assert_null(m);
    mailbox_post(&mb, msg(7));  // left queued: deinit frees it
    mailbox_deinit(&mb, NULL);
}

enum { N_THREADS = 4, N_PER_THREAD = 2000 };

struct poster {
    struct mailbox *mb;
    uint64_t base;
};

static void post_many(void *arg) {
    struct poster *p = arg;
    for (uint64_t i = 0; i < N_PER_THREAD; i++) mailbox_post(p->mb, msg(p->base + i));
}

struct wake_state {
    struct mailbox *mb;
    int64_t n_seen;
    uint64_t last[N_THREADS];
    bool in_order;
    uv_async_t async;
};

static void on_async(uv_async_t *h) {
    struct wake_state *w = h->data;
    struct mailbox_msg *m = mailbox_drain(w->mb);
    while (m) {
        uint64_t t = m->id / 1000000;
        if (m->id <= w->last[t] && w->last[t] != 0) w->in_order = false;
        w->last[t] = m->id;
        w->n_seen++;
        struct mailbox_msg *next = m->next;
        free(m);
        m = next;
    }
    if (w->n_seen == N_THREADS * N_PER_THREAD) uv_close((uv_handle_t *)&w->async, NULL);
}

static void test_mailbox_many_threads_wake_the_loop(void **state) {
    (void)state;
    uv_loop_t loop;
    assert_int_equal(uv_loop_init(&loop), 0);
    struct mailbox mb;
    struct wake_state w = {.mb = &mb, .in_order = true};
    assert_int_equal(uv_async_init(&loop, &w.async, on_async), 0);
    w.async.data = &w;
    assert_int_equal(mailbox_init(&mb, &w.async), 0);
    uv_thread_t th[N_THREADS];
    struct poster ps[N_THREADS];
    for (int i = 0; i < N_THREADS; i++) {
        ps[i].mb = &mb;
        ps[i].base = (uint64_t)i * 1000000 + 1;
        assert_int_equal(uv_thread_create(&th[i], post_many, &ps[i]), 0);
    }
    // Runs until every message was seen (the handle closes itself then).
    uv_run(&loop, UV_RUN_DEFAULT);
    for (int i = 0; i < N_THREADS; i++) uv_thread_join(&th[i]);
    assert_int_equal(w.n_seen, N_THREADS * N_PER_THREAD);
    assert_true(w.in_order);  // per sender, FIFO
    mailbox_deinit(&mb, NULL);
    assert_int_equal(uv_loop_close(&loop), 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mailbox_fifo),
        cmocka_unit_test(test_mailbox_many_threads_wake_the_loop),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
