/*
 * server/lora_loader.c - the loader thread and its queue (the contract is in
 * lora_loader.h).
 *
 * Locks, always taken in this order: the loader's lock (queue, running job,
 * stop state), then a job's lock (done, result, wake), then whatever the wake
 * callback takes (http.c's slot lock). A job's result is published under the
 * job's lock together with is_done, and read only after is_done was seen
 * under that lock, so the consumer reads a complete result.
 *
 * The loader's lock is held while a finished job wakes its client, so that
 * lora_loader_stop() cannot return STUCK between the check of is_abandoned
 * and the wake: after STUCK the wake targets (http.c's slots) are freed, and
 * no wake may reach them. A stop that gives up on the running job answers its
 * client itself (ERR_SHUTDOWN): the thread builds its result in a local and
 * publishes it only into a job that is not done yet, so the two never both
 * write it.
 */
#define LOG_TAG "lora"
#include "server/lora_loader.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/base/alloc.h"
#include "engine/base/err.h"
#include "engine/base/log.h"
#include "engine/engine.h"
#include "server/lora_registry.h"

struct lora_loader_job {
    pthread_mutex_t lock;            // guards is_done, result and the wake
    atomic_int n_refs;               // the loader's and the consumer's
    uint64_t ticket;                 // the registry reservation
    char *name;                      // owned
    char *path;                      // owned
    bool is_done;
    struct lora_loader_result result;
    lora_loader_wake_fn wake;        // NULL once the consumer let go
    void *wake_user;
    struct lora_loader_job *next;    // queue link, owned by the loader's queue
};

struct lora_loader {
    struct lora_registry *registry;  // borrowed
    const struct lora_path_root *root;  // borrowed: where loads may read; NULL: anywhere
    pthread_mutex_t lock;            // guards everything below
    pthread_cond_t has_work;         // queue not empty, or stopping (the thread waits)
    pthread_cond_t has_exited_cond;  // the thread ended (lora_loader_stop() waits)
    struct lora_loader_job *head;    // queued jobs, oldest first; each holds the loader's ref
    struct lora_loader_job *tail;
    int32_t n_queued;
    struct lora_loader_job *running; // the job the thread is loading (its reference), or NULL
    bool is_stopping;
    bool has_exited;
    bool is_abandoned;               // stop gave up waiting: wake nobody any more
    bool has_thread;                 // thread started and not joined
    pthread_t thread;
};

/* ---- jobs ------------------------------------------------------------------ */

static void job_unref(struct lora_loader_job *j) {
    int n = atomic_fetch_sub(&j->n_refs, 1);
    ASSERT(n > 0);
    if (n > 1) return;
    pthread_mutex_destroy(&j->lock);
    free(j->name);
    free(j->path);
    free(j);
}

/* Publishes res as the job's result unless the job is done already (a stop
 * answered it), and wakes the consumer, if any and if allowed. */
static void job_finish(struct lora_loader_job *j, const struct lora_loader_result *res,
                       bool may_wake) {
    pthread_mutex_lock(&j->lock);
    if (!j->is_done) {
        j->result = *res;
        j->is_done = true;
        if (may_wake && j->wake) j->wake(j->wake_user);
    }
    pthread_mutex_unlock(&j->lock);
}

/* An ERR_SHUTDOWN result for job j. */
static void shutdown_result(const struct lora_loader_job *j, const char *why,
                            struct lora_loader_result *out) {
    *out = (struct lora_loader_result){.err = ERR_SHUTDOWN, .name = j->name, .path = j->path};
    snprintf(out->message, sizeof(out->message), "The server is shutting down; %s '%.128s'", why,
             j->name);
}

bool lora_loader_job_is_done(struct lora_loader_job *j) {
    pthread_mutex_lock(&j->lock);
    bool done = j->is_done;
    pthread_mutex_unlock(&j->lock);
    return done;
}

const struct lora_loader_result *lora_loader_job_result(const struct lora_loader_job *j) {
    return &j->result;
}

void lora_loader_job_release(struct lora_loader_job *j) {
    if (!j) return;
    pthread_mutex_lock(&j->lock);
    j->wake = NULL;
    j->wake_user = NULL;
    pthread_mutex_unlock(&j->lock);
    job_unref(j);
}

/* ---- the thread ------------------------------------------------------------- */

/* One job: load, list, tell the consumer. */
static void run_job(struct lora_loader *l, struct lora_loader_job *j) {
    struct lora_loader_result res = {.name = j->name, .path = j->path};
    struct engine_adapter *a = NULL;
    res.err = lora_registry_load_reserved(l->registry, j->ticket, l->root, &a, res.message,
                                          sizeof(res.message));
    if (a) {
        const struct engine_adapter_info *info = engine_adapter_get_info(a);
        snprintf(res.format, sizeof(res.format), "%s", info->format);
        res.rank = info->rank;
        engine_adapter_release(a);
    }
    pthread_mutex_lock(&l->lock);
    job_finish(j, &res, !l->is_abandoned);
    l->running = NULL;
    pthread_mutex_unlock(&l->lock);
}

static void *loader_main(void *arg) {
    struct lora_loader *l = arg;
    pthread_mutex_lock(&l->lock);
    for (;;) {
        while (!l->head && !l->is_stopping) pthread_cond_wait(&l->has_work, &l->lock);
        if (l->is_stopping) break;  // lora_loader_stop() took the queue
        struct lora_loader_job *j = l->head;
        l->head = j->next;
        if (!l->head) l->tail = NULL;
        j->next = NULL;
        l->n_queued--;
        l->running = j;
        pthread_mutex_unlock(&l->lock);
        run_job(l, j);
        job_unref(j);
        pthread_mutex_lock(&l->lock);
    }
    l->has_exited = true;
    pthread_cond_broadcast(&l->has_exited_cond);
    pthread_mutex_unlock(&l->lock);
    return NULL;
}

/* ---- lifecycle --------------------------------------------------------------- */

struct lora_loader *lora_loader_create(struct lora_registry *r,
                                       const struct lora_path_root *root) {
    struct lora_loader *l = xcalloc(1, sizeof(*l));
    l->registry = r;
    l->root = root;
    pthread_mutex_init(&l->lock, NULL);
    pthread_cond_init(&l->has_work, NULL);
    // lora_loader_stop() waits with a deadline on the monotonic clock.
    pthread_condattr_t attr;
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(&l->has_exited_cond, &attr);
    pthread_condattr_destroy(&attr);
    int err = pthread_create(&l->thread, NULL, loader_main, l);
    if (err != 0) {
        LOG_ERROR("%s: cannot start the adapter loader thread: %s", __func__, strerror(err));
        l->has_exited = true;
        lora_loader_destroy(l);
        return NULL;
    }
    l->has_thread = true;
    return l;
}

int lora_loader_submit(struct lora_loader *l, const char *name, const char *path,
                       lora_loader_wake_fn wake, void *wake_user, struct lora_loader_job **out,
                       char *msg, size_t msg_size) {
    *out = NULL;
    uint64_t ticket = 0;
    int err = lora_registry_reserve(l->registry, name, path, &ticket, msg, msg_size);
    if (err) return err;
    struct lora_loader_job *j = xcalloc(1, sizeof(*j));
    pthread_mutex_init(&j->lock, NULL);
    atomic_init(&j->n_refs, 2);
    j->ticket = ticket;
    j->name = xstrdup(name);
    j->path = xstrdup(path);
    j->result.name = j->name;
    j->result.path = j->path;
    j->wake = wake;
    j->wake_user = wake_user;

    pthread_mutex_lock(&l->lock);
    if (l->is_stopping) {
        err = ERR_SHUTDOWN;
        snprintf(msg, msg_size, "The server is shutting down");
    } else if (l->n_queued >= LORA_LOADER_MAX_QUEUED) {
        err = ERR_FULL;
        snprintf(msg, msg_size, "%d adapter loads are waiting already; retry shortly",
                 LORA_LOADER_MAX_QUEUED);
    } else {
        if (l->tail) {
            l->tail->next = j;
        } else {
            l->head = j;
        }
        l->tail = j;
        l->n_queued++;
        pthread_cond_signal(&l->has_work);
    }
    pthread_mutex_unlock(&l->lock);
    if (err) {
        lora_registry_cancel(l->registry, ticket);
        job_unref(j);  // nobody else saw the job: both references go
        job_unref(j);
        return err;
    }
    *out = j;
    return 0;
}

void lora_loader_get_counts(struct lora_loader *l, int32_t *out_n_queued,
                            int32_t *out_n_running) {
    pthread_mutex_lock(&l->lock);
    *out_n_queued = l->n_queued;
    *out_n_running = l->running != NULL;
    pthread_mutex_unlock(&l->lock);
}

enum lora_loader_stop lora_loader_stop(struct lora_loader *l, int64_t wait_ms) {
    // Take the queue and stop the thread from starting anything else.
    pthread_mutex_lock(&l->lock);
    l->is_stopping = true;
    struct lora_loader_job *queued = l->head;
    l->head = NULL;
    l->tail = NULL;
    l->n_queued = 0;
    pthread_cond_signal(&l->has_work);
    pthread_mutex_unlock(&l->lock);

    // Queued jobs: answered now, never started.
    while (queued) {
        struct lora_loader_job *j = queued;
        queued = j->next;
        j->next = NULL;
        lora_registry_cancel(l->registry, j->ticket);
        struct lora_loader_result res;
        shutdown_result(j, "it did not load the adapter", &res);
        job_finish(j, &res, true);
        job_unref(j);
    }

    // The job in progress, if any, ends on its own.
    if (!l->has_thread) return LORA_LOADER_STOPPED;
    struct timespec deadline;
    clock_gettime(CLOCK_MONOTONIC, &deadline);
    if (wait_ms >= 0) {
        deadline.tv_sec += (time_t)(wait_ms / 1000);
        deadline.tv_nsec += (long)(wait_ms % 1000) * 1000000L;
        if (deadline.tv_nsec >= 1000000000L) {
            deadline.tv_sec++;
            deadline.tv_nsec -= 1000000000L;
        }
    }
    pthread_mutex_lock(&l->lock);
    while (!l->has_exited) {
        if (wait_ms < 0) {
            pthread_cond_wait(&l->has_exited_cond, &l->lock);
        } else if (pthread_cond_timedwait(&l->has_exited_cond, &l->lock, &deadline) == ETIMEDOUT &&
                   !l->has_exited) {
            // Answer the running job's client now, while its wake target
            // still exists, and never wake anyone again.
            if (l->running) {
                struct lora_loader_result res;
                shutdown_result(l->running, "it stopped waiting for the load of the adapter",
                                &res);
                job_finish(l->running, &res, !l->is_abandoned);
            }
            l->is_abandoned = true;
            pthread_mutex_unlock(&l->lock);
            LOG_WARN("an adapter load is still running after %lld ms; not waiting for it",
                     (long long)wait_ms);
            return LORA_LOADER_STUCK;
        }
    }
    pthread_mutex_unlock(&l->lock);
    pthread_join(l->thread, NULL);
    l->has_thread = false;
    return LORA_LOADER_STOPPED;
}

void lora_loader_destroy(struct lora_loader *l) {
    if (!l) return;
    enum lora_loader_stop st = lora_loader_stop(l, -1);
    ASSERT(st == LORA_LOADER_STOPPED);
    pthread_mutex_destroy(&l->lock);
    pthread_cond_destroy(&l->has_work);
    pthread_cond_destroy(&l->has_exited_cond);
    free(l);
}
