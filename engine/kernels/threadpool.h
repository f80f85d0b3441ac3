/*
 * threadpool.h - the kernel worker pool: n_threads - 1 libuv threads plus the
 * calling thread run one parallel region at a time; threadpool_run() returns
 * when every item of the region is done (a barrier per region).
 *
 * Thread rule: one thread (the ctx's owner, the step thread) calls
 * threadpool_run(); the work function runs on all pool threads at once.
 * Workers spin briefly after a region, then sleep on a condition variable, so
 * an idle pool costs no CPU.
 */
#ifndef LLMSERVE_THREADPOOL_H
#define LLMSERVE_THREADPOOL_H

#include <stdint.h>

struct threadpool;

/* Runs items [begin, end) of a region on thread ith of nth. */
typedef void (*threadpool_fn)(void *arg, int64_t begin, int64_t end, int32_t ith, int32_t nth);

/* Starts n_threads - 1 workers (n_threads >= 1). Owned by the caller
 * (threadpool_free()); NULL when threads cannot be created. */
struct threadpool *threadpool_create(int32_t n_threads);

/* Stops and joins the workers; NULL-safe. */
void threadpool_free(struct threadpool *p);

int32_t threadpool_n_threads(const struct threadpool *p);

/* Splits [0, n_items) into one contiguous range per thread (sizes differ by at
 * most `grain` items; ranges are multiples of grain except the last) and runs
 * fn on every thread, the caller included; returns when all are done. */
void threadpool_run(struct threadpool *p, int64_t n_items, int64_t grain, threadpool_fn fn,
                    void *arg);

#endif
