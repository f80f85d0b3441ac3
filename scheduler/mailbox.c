/*
 * scheduler/mailbox.c - locked queue + wake callback.
 *
 * The wake-up is sent after the lock is released: the scheduler's callback
 * is uv_async_send, safe from any thread and coalescing, and the loop drains
 * everything queued by then.
 */
#include "scheduler/mailbox.h"

#include <stdlib.h>

#include <uv.h>

struct mailbox {
    uv_mutex_t lock;
    struct mailbox_msg *head;  // oldest; under lock
    struct mailbox_msg *tail;
    mailbox_wake_fn wake;      // may be NULL
    void *wake_user;
};

struct mailbox *mailbox_create(mailbox_wake_fn wake, void *user) {
    struct mailbox *mb = calloc(1, sizeof(*mb));
    if (!mb) return NULL;
    if (uv_mutex_init(&mb->lock) != 0) {
        free(mb);
        return NULL;
    }
    mb->wake = wake;
    mb->wake_user = user;
    return mb;
}

void mailbox_destroy(struct mailbox *mb, void (*free_msg)(struct mailbox_msg *m)) {
    if (!mb) return;
    struct mailbox_msg *m = mb->head;
    while (m) {
        struct mailbox_msg *next = m->next;
        if (free_msg) free_msg(m);
        else free(m);
        m = next;
    }
    uv_mutex_destroy(&mb->lock);
    free(mb);
}

void mailbox_post(struct mailbox *mb, struct mailbox_msg *m) {
    m->next = NULL;
    uv_mutex_lock(&mb->lock);
    if (mb->tail) mb->tail->next = m;
    else mb->head = m;
    mb->tail = m;
    uv_mutex_unlock(&mb->lock);
    if (mb->wake) mb->wake(mb->wake_user);
}

struct mailbox_msg *mailbox_drain(struct mailbox *mb) {
    uv_mutex_lock(&mb->lock);
    struct mailbox_msg *m = mb->head;
    mb->head = mb->tail = NULL;
    uv_mutex_unlock(&mb->lock);
    return m;
}
