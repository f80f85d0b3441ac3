/*
 * scheduler/mailbox.c - locked queue + uv_async_send.
 *
 * The wake-up is sent after the lock is released: uv_async_send is safe from
 * any thread and coalesces, and the loop drains everything queued by then.
 */
#include "scheduler/mailbox.h"

#include <stdlib.h>

#include "engine/base/err.h"

int mailbox_init(struct mailbox *mb, uv_async_t *wake) {
    mb->head = NULL;
    mb->tail = NULL;
    mb->n = 0;
    mb->wake = wake;
    return uv_mutex_init(&mb->lock) == 0 ? 0 : ERR_NOMEM;
}

void mailbox_deinit(struct mailbox *mb, void (*free_msg)(struct mailbox_msg *m)) {
    struct mailbox_msg *m = mb->head;
    while (m) {
        struct mailbox_msg *next = m->next;
        if (free_msg) free_msg(m);
        else free(m);
        m = next;
    }
    mb->head = mb->tail = NULL;
    mb->n = 0;
    uv_mutex_destroy(&mb->lock);
}

void mailbox_post(struct mailbox *mb, struct mailbox_msg *m) {
    m->next = NULL;
    uv_mutex_lock(&mb->lock);
    if (mb->tail) mb->tail->next = m;
    else mb->head = m;
    mb->tail = m;
    mb->n++;
    uv_mutex_unlock(&mb->lock);
    if (mb->wake) uv_async_send(mb->wake);
}

struct mailbox_msg *mailbox_drain(struct mailbox *mb) {
    uv_mutex_lock(&mb->lock);
    struct mailbox_msg *m = mb->head;
    mb->head = mb->tail = NULL;
    mb->n = 0;
    uv_mutex_unlock(&mb->lock);
    return m;
}
