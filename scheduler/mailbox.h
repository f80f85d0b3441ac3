/*
 * scheduler/mailbox.h - the one way into the step loop (STYLE 2.8): a locked
 * FIFO of messages plus a wake-up of the step loop
 * (the scheduler passes uv_async_send).
 *
 * Senders allocate a message and hand it over whole; the step thread drains
 * the whole queue at each wake-up (uv_async_send coalesces) and owns what it
 * drains. Threads: mailbox_post() [any thread]; mailbox_drain() [step thread].
 */
#ifndef SCHEDULER_MAILBOX_H
#define SCHEDULER_MAILBOX_H

#include <stdint.h>

enum mailbox_msg_type {
    MAILBOX_MSG_SUBMIT,  // payload: a struct seq to admit (ownership moves with it)
    MAILBOX_MSG_CANCEL,  // id: the sequence to cancel
    MAILBOX_MSG_STOP,    // stop the loop after the grace period in arg_ms
};

struct mailbox_msg {
    enum mailbox_msg_type type;
    uint64_t id;
    int64_t arg_ms;
    void *payload;             // owned by the message until drained
    struct mailbox_msg *next;  // link: owned by the mailbox while queued
};

/* Wakes the consumer (the step loop's uv_async_send); called after each post,
 * outside the lock, on the posting thread. */
typedef void (*mailbox_wake_fn)(void *user);

struct mailbox;

/* An empty mailbox that calls wake(user) after every post (wake NULL: no
 * wake-up, for a loop driven by hand). Owned by the caller
 * (mailbox_destroy()); NULL when out of memory. */
struct mailbox *mailbox_create(mailbox_wake_fn wake, void *user);
/* Frees still-queued messages with free_msg (NULL: free() each message only),
 * then the mailbox. NULL-safe. [after the step thread ended] */
void mailbox_destroy(struct mailbox *mb, void (*free_msg)(struct mailbox_msg *m));

/* Appends m (taking ownership) and wakes the loop. [any thread] */
void mailbox_post(struct mailbox *mb, struct mailbox_msg *m);

/* Takes every queued message, oldest first, as a list linked by next; owned
 * by the caller. NULL when empty. [step thread] */
struct mailbox_msg *mailbox_drain(struct mailbox *mb);

#endif // SCHEDULER_MAILBOX_H
