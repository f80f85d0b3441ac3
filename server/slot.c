/*
 * slot.c - park and wake of one request's connection (slot.h). The race
 * between "channel empty" and "suspend" is closed by the slot's lock: a wake
 * that comes first sets wake_pending and the park does not sleep.
 */
#include "server/slot.h"

#include <microhttpd.h>

void slot_wake(void *user) {
    struct slot *s = user;
    pthread_mutex_lock(&s->lock);
    if (s->req) {
        if (s->suspended) {
            s->suspended = false;
            MHD_resume_connection(s->conn);
        } else {
            s->wake_pending = true;
        }
    }
    pthread_mutex_unlock(&s->lock);
}

bool slot_park(struct slot *s) {
    pthread_mutex_lock(&s->lock);
    bool parked = false;
    if (s->wake_pending) {
        s->wake_pending = false;
    } else {
        s->suspended = true;
        MHD_suspend_connection(s->conn);
        parked = true;
    }
    pthread_mutex_unlock(&s->lock);
    return parked;
}
