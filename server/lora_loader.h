/*
 * server/lora_loader.h - the adapter loader: one thread, owned by the server,
 * that runs the slow part of POST /v1/load_lora_adapter (reading and
 * converting the adapter, engine_adapter_load()) so that the HTTP thread
 * never waits for a file.
 *
 * The handler calls lora_loader_submit(): the name is checked and reserved
 * in the registry at once (a taken name is answered on the spot), and a job
 * is queued. Its connection is suspended; when the job is done the loader
 * calls the job's wake callback (slot_wake), the connection resumes, and the
 * handler's request reads the result. Jobs run one at a time, in order.
 *
 * A job is shared by exactly two references (STYLE 2.7.9): the loader's and
 * the consumer's (the struct req that submitted it). The consumer may let go
 * at any time (a client that went away): the load goes on, its adapter is
 * listed when it ends, and nobody is woken. Whoever drops the last reference
 * frees the job.
 *
 * Threads: lora_loader_create/stop/destroy [main thread];
 * lora_loader_submit and the job functions [any thread]; the wake callback
 * runs on the loader thread (or on the thread in lora_loader_stop()), with the
 * job's lock held, so it must not call back into the job. The loader is a
 * POSIX thread, as http.c's ticker: libuv, the house threading API, lives
 * only in scheduler/ and engine/ (STYLE 2.10).
 */
#ifndef SERVER_LORA_LOADER_H
#define SERVER_LORA_LOADER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define LORA_LOADER_MAX_QUEUED 64  // jobs waiting behind the running one; more get ERR_FULL

struct lora_loader;
struct lora_loader_job;
struct lora_registry;
struct lora_path_root;

typedef void (*lora_loader_wake_fn)(void *user);

/* What a finished job tells its client. Valid while a reference to the job
 * is held and lora_loader_job_is_done() has returned true. */
struct lora_loader_result {
    int err;               // 0 (listed); ERR_CANCELED (unloaded while queued or
                           //   loading); ERR_SHUTDOWN (dropped from the queue, or
                           //   no longer waited for, at shutdown); or
                           //   engine_adapter_load()'s code
    char message[512];     // a sentence for the client when err != 0
    const char *name;      // the job's (owned by the job)
    const char *path;
    char format[16];       // with err == 0: engine_adapter_info's format and rank
    int32_t rank;
};

enum lora_loader_stop {
    LORA_LOADER_STOPPED,   // the thread has ended; every job is done
    LORA_LOADER_STUCK,     // a load is still running after wait_ms (see lora_loader_stop())
};

/* Starts the loader thread for registry r. Loads read only inside root
 * (lora_registry_load_reserved()), or anywhere when root is NULL (tests).
 * Both are borrowed and must outlive the loader. NULL when the thread
 * cannot be started (logged). [main thread] */
struct lora_loader *lora_loader_create(struct lora_registry *r,
                                       const struct lora_path_root *root);

/* Reserves name in the registry (lora_registry_reserve()) and queues a load
 * of path. On success *out is the caller's reference to the job (release it
 * with lora_loader_job_release()), and wake(wake_user) will be called once,
 * when the job is done, unless the reference was released first. Returns 0,
 * LORA_REGISTRY_EXISTS or LORA_REGISTRY_LOADING (the name is taken),
 * ERR_INVAL (bad name or path), ERR_FULL (LORA_LOADER_MAX_QUEUED jobs wait
 * already) or ERR_SHUTDOWN (the loader is stopping); then *out is NULL,
 * nothing was reserved, and msg (msg_size bytes) holds a sentence for the
 * client. [any thread] */
int lora_loader_submit(struct lora_loader *l, const char *name, const char *path,
                       lora_loader_wake_fn wake, void *wake_user, struct lora_loader_job **out,
                       char *msg, size_t msg_size);

/* Whether the job has finished (loaded, failed, canceled or dropped). [any thread] */
bool lora_loader_job_is_done(struct lora_loader_job *j);

/* The result of a done job; borrowed, valid until the caller releases its
 * reference. [any thread] */
const struct lora_loader_result *lora_loader_job_result(const struct lora_loader_job *j);

/* The consumer lets go: its wake is forgotten (never called after this
 * returns) and its reference dropped. The job itself runs on. NULL-safe.
 * [any thread, not from the wake callback] */
void lora_loader_job_release(struct lora_loader_job *j);

/* Jobs waiting and being loaded (0 or 1), for /metrics. [any thread] */
void lora_loader_get_counts(struct lora_loader *l, int32_t *out_n_queued,
                            int32_t *out_n_running);

/* Stops taking jobs (lora_loader_submit() returns ERR_SHUTDOWN), finishes
 * every queued job at once with ERR_SHUTDOWN (their reservations withdrawn,
 * their clients woken), and waits up to wait_ms (< 0: without limit) for the
 * job in progress, which cannot be interrupted: it ends normally (its adapter
 * is listed, its client woken). Returns LORA_LOADER_STOPPED, or
 * LORA_LOADER_STUCK when that load is still running at the deadline (a file
 * system that hangs): then its client is answered ERR_SHUTDOWN at once and no
 * wake callback is called any more (if the load ends later, its adapter is
 * still listed), but the thread still uses the loader, the registry and the
 * model, so the caller
 * must leave all three alive (the process is about to exit), and may call
 * lora_loader_destroy() only after a later call returned STOPPED. It may be
 * called again (after STOPPED it returns STOPPED at once). [main thread] */
enum lora_loader_stop lora_loader_stop(struct lora_loader *l, int64_t wait_ms);

/* lora_loader_stop(l, -1), then frees the loader. NULL-safe. [main thread] */
void lora_loader_destroy(struct lora_loader *l);

#endif
