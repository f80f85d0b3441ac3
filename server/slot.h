/*
 * slot.h - the wake target of one HTTP request: park (suspend the connection
 * while its channels are empty) and wake (resume it from any thread). The
 * HTTP server (http.c) owns the slot array, which lives as long as the
 * server, so a late wake-up for a request that has already gone finds an
 * empty slot and does nothing. The handlers (routes.c) pass slot_wake to the
 * scheduler's channels; the stream (sse.c) parks. Neither needs http.h, so
 * the include graph goes one way: http -> routes, sse -> slot.
 */
#ifndef SERVER_SLOT_H
#define SERVER_SLOT_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

struct MHD_Connection;
struct req;

/* req is NULL when the slot is free. lock guards req, conn, suspended and
 * wake_pending; next_free belongs to the server's free list (http.c). */
struct slot {
    pthread_mutex_t lock;
    struct req *req;              // borrowed: the request using the slot, or NULL
    struct MHD_Connection *conn;  // borrowed: its connection
    bool suspended;
    bool wake_pending;
    int32_t next_free;            // free list link, under the server's slots_lock
};

/* The channel wake callback: slot is a struct slot *. Resumes the
 * connection if it is suspended, else remembers the wake so the next
 * slot_park() does not sleep. [any thread] */
void slot_wake(void *slot);

/* Suspends the slot's connection unless a wake arrived since the last park.
 * Returns true when suspended (the caller returns to MHD and is called again
 * after the resume), false when it should look at its channels again.
 * [HTTP thread, access handler or content reader only] */
bool slot_park(struct slot *slot);

#endif
