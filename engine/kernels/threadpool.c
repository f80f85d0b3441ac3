/*
 * threadpool.c - a fork-join pool for kernels.
 *
 * A region is published by bumping `generation` under the mutex; workers wait
 * for a generation they have not run yet, run their static share of the
 * items, and count down `pending`. The caller runs share 0 itself and then
 * waits for `pending` to reach 0. Static shares (rather than work stealing)
 * keep each thread on the same rows from region to region, which is what the
 * memory-bound decode wants.
 */
#include "engine/kernels/threadpool.h"

#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <uv.h>

#include "engine/base/alloc.h"
#include "engine/kernels/kernels.h"

#define THREADPOOL_SPIN 20000
// Every turn of a spin pauses (kern_spin_pause): without it the waiting thread's
// loads and branches ran flat out beside the working thread, and batch-1 decode
// of l1b-q4_0 was 35-37 tok/s instead of 43-45 on the 2-vCPU machine of
// docs/benchmarks.md (l1b-q8_0 21 instead of 26). With the pause, 20000 turns are
// about a millisecond: long enough to bridge the gaps between a forward pass's
// regions and between decode steps.
// Yield inside the spin every so often: when the cores are oversubscribed (other
// processes, or more threads than cores) a pure spin would burn the time slice
// the thread it waits for needs.
#define THREADPOOL_YIELD_EVERY 1024

struct worker {
    struct threadpool *pool;
    int32_t ith;
    uv_thread_t thread;
};

struct threadpool {
    int32_t n_threads;
    struct worker *workers;       // [n_threads - 1], owned
    uv_mutex_t mutex;
    uv_cond_t wake;               // workers wait here for a new generation
    uv_cond_t done;               // the caller waits here for pending == 0
    atomic_uint_fast64_t generation;
    atomic_int pending;           // workers still running the current region
    bool stop;
    // The current region; written by the caller before the generation bump.
    threadpool_fn fn;
    void *arg;
    int64_t n_items;
    int64_t grain;
};

static void run_share(struct threadpool *p, int32_t ith) {
    int64_t n_chunks = (p->n_items + p->grain - 1) / p->grain;
    int64_t per = n_chunks / p->n_threads;
    int64_t extra = n_chunks % p->n_threads;
    int64_t c0 = ith * per + (ith < extra ? ith : extra);
    int64_t c1 = c0 + per + (ith < extra ? 1 : 0);
    int64_t begin = c0 * p->grain;
    int64_t end = c1 * p->grain;
    if (end > p->n_items) end = p->n_items;
    if (begin < end) p->fn(p->arg, begin, end, ith, p->n_threads);
}

static void worker_main(void *arg) {
    struct worker *w = arg;
    struct threadpool *p = w->pool;
    uint64_t seen = 0;
    for (;;) {
        // Spin a little first: regions come back to back during a forward pass.
        uint64_t g = atomic_load_explicit(&p->generation, memory_order_acquire);
        for (int i = 0; i < THREADPOOL_SPIN && g == seen; i++) {
            if (i % THREADPOOL_YIELD_EVERY == THREADPOOL_YIELD_EVERY - 1) sched_yield();
            kern_spin_pause();
            g = atomic_load_explicit(&p->generation, memory_order_acquire);
        }
        if (g == seen) {
            uv_mutex_lock(&p->mutex);
            while ((g = atomic_load(&p->generation)) == seen && !p->stop) {
                uv_cond_wait(&p->wake, &p->mutex);
            }
            bool stop = p->stop;
            uv_mutex_unlock(&p->mutex);
            if (stop) return;
        }
        seen = g;
        run_share(p, w->ith);
        if (atomic_fetch_sub_explicit(&p->pending, 1, memory_order_acq_rel) == 1) {
            uv_mutex_lock(&p->mutex);
            uv_cond_signal(&p->done);
            uv_mutex_unlock(&p->mutex);
        }
    }
}

struct threadpool *threadpool_create(int32_t n_threads) {
    ASSERT(n_threads >= 1);
    struct threadpool *p = xcalloc(1, sizeof(*p));
    p->n_threads = n_threads;
    if (uv_mutex_init(&p->mutex) || uv_cond_init(&p->wake) || uv_cond_init(&p->done)) {
        free(p);
        return NULL;
    }
    p->workers = xcalloc((size_t)n_threads, sizeof(*p->workers));
    for (int32_t i = 1; i < n_threads; i++) {
        struct worker *w = &p->workers[i - 1];
        w->pool = p;
        w->ith = i;
        if (uv_thread_create(&w->thread, worker_main, w) != 0) {
            p->n_threads = i;  // keep the workers that started
            break;
        }
    }
    return p;
}

void threadpool_free(struct threadpool *p) {
    if (!p) return;
    uv_mutex_lock(&p->mutex);
    p->stop = true;
    uv_cond_broadcast(&p->wake);
    uv_mutex_unlock(&p->mutex);
    for (int32_t i = 1; i < p->n_threads; i++) uv_thread_join(&p->workers[i - 1].thread);
    uv_cond_destroy(&p->wake);
    uv_cond_destroy(&p->done);
    uv_mutex_destroy(&p->mutex);
    free(p->workers);
    free(p);
}

int32_t threadpool_n_threads(const struct threadpool *p) { return p->n_threads; }

void threadpool_run(struct threadpool *p, int64_t n_items, int64_t grain, threadpool_fn fn,
                    void *arg) {
    if (n_items <= 0) return;
    if (grain < 1) grain = 1;
    if (p->n_threads == 1 || n_items <= grain) {
        fn(arg, 0, n_items, 0, 1);
        return;
    }
    p->fn = fn;
    p->arg = arg;
    p->n_items = n_items;
    p->grain = grain;
    atomic_store_explicit(&p->pending, p->n_threads - 1, memory_order_relaxed);
    uv_mutex_lock(&p->mutex);
    atomic_fetch_add_explicit(&p->generation, 1, memory_order_release);
    uv_cond_broadcast(&p->wake);
    uv_mutex_unlock(&p->mutex);

    run_share(p, 0);

    for (int i = 0; i < THREADPOOL_SPIN && atomic_load(&p->pending) > 0; i++) {
        if (i % THREADPOOL_YIELD_EVERY == THREADPOOL_YIELD_EVERY - 1) sched_yield();
        kern_spin_pause();
    }
    if (atomic_load(&p->pending) > 0) {
        uv_mutex_lock(&p->mutex);
        while (atomic_load(&p->pending) > 0) uv_cond_wait(&p->done, &p->mutex);
        uv_mutex_unlock(&p->mutex);
    }
}
