/*
 * comm_mpi.c - the MPI backend of comm.h, over MPI_COMM_WORLD, written
 * against the standard API only (Open MPI and MPICH both build it), and over
 * the groups comm_split makes of it (MPI_Comm_split). The only
 * file of the tree that includes mpi.h.
 *
 * NOTE: MPI_THREAD_SERIALIZED, not FUNNELED: the process's main thread opens
 * the comm, loads the model and creates the ctx (which broadcasts the ctx's
 * limits), but rank 0's steps run on the scheduler's step thread. FUNNELED
 * would tie every call to the main thread; SERIALIZED allows any thread as
 * long as one at a time, which is the rule comm.h states. Open MPI and MPICH
 * give both.
 */
#define LOG_TAG "comm"
#include "engine/comm/comm.h"

#include <limits.h>
#include <stdbool.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <mpi.h>

#include "engine/base/alloc.h"
#include "engine/base/err.h"
#include "engine/base/log.h"

struct comm {
    MPI_Comm mc;             // MPI_COMM_WORLD, or a split of it (comm_split)
    int32_t rank;            // in mc
    int32_t size;            // of mc
    uint64_t bytes_sent;     // payload bytes handed to collectives
    uint64_t *parent_bytes;  // a split comm: its parent's bytes_sent, counted too (else NULL)
    bool is_finalize_owned;  // we called MPI_Init_thread, so we call MPI_Finalize
    bool is_split;           // mc is ours to free (MPI_Comm_free)
    int *part_counts;        // [size] scratch of the *_parts collectives (or NULL)
    int *part_displs;        // [size]
};

/* Counts n payload bytes sent on c and on the comm it was split from. */
static void count_sent(struct comm *c, uint64_t n) {
    c->bytes_sent += n;
    if (c->parent_bytes) *c->parent_bytes += n;
}

int comm_open(int32_t n_ranks, struct comm **out) {
    *out = NULL;
    struct comm *c = calloc(1, sizeof(*c));
    if (!c) return ERR_NOMEM;
    int is_init = 0;
    MPI_Initialized(&is_init);
    if (!is_init) {
        int provided = MPI_THREAD_SINGLE;
        if (MPI_Init_thread(NULL, NULL, MPI_THREAD_SERIALIZED, &provided) != MPI_SUCCESS) {
            LOG_ERROR("MPI_Init_thread failed");
            free(c);
            return ERR_UNSUPPORTED;
        }
        c->is_finalize_owned = true;
        if (provided < MPI_THREAD_SERIALIZED) {
            LOG_ERROR("this MPI gives thread level %d, below MPI_THREAD_SERIALIZED (%d)", provided,
                      MPI_THREAD_SERIALIZED);
            comm_close(c);
            return ERR_UNSUPPORTED;
        }
    }
    // A failing collective ends the job: a rank that died makes the others' calls fail,
    // and the default handler then aborts them, so mpirun tears the whole job down.
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_ARE_FATAL);
    int rank = 0;
    int size = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    c->mc = MPI_COMM_WORLD;
    c->rank = rank;
    c->size = size;
    if (size != n_ranks) {
        LOG_ERROR(
            "rank %d: the job has %d ranks but %d were asked for (--tp x --pp = %d runs "
            "under mpirun -np %d; --sp N alone: -np N)",
            rank, size, n_ranks, n_ranks, n_ranks);
        comm_close(c);
        return ERR_INVAL;
    }
    LOG_INFO("rank %d/%d: pid %d", rank, size, (int)getpid());
    *out = c;
    return 0;
}

int comm_split(struct comm *c, int32_t color, int32_t key, struct comm **out) {
    *out = NULL;
    if (!c) return 0;
    ASSERT(color >= 0 && key >= 0);
    struct comm *s = calloc(1, sizeof(*s));
    // Every rank must reach MPI_Comm_split, so a rank short of memory still takes part
    // (and frees its group at once); comm_agree then fails the split on every rank.
    MPI_Comm mc = MPI_COMM_NULL;
    MPI_Comm_split(c->mc, color, key, &mc);
    const int err = comm_agree(c, s ? 0 : ERR_NOMEM);
    if (err) {
        MPI_Comm_free(&mc);
        free(s);
        return err;
    }
    int rank = 0;
    int size = 1;
    MPI_Comm_rank(mc, &rank);
    MPI_Comm_size(mc, &size);
    MPI_Comm_set_errhandler(mc, MPI_ERRORS_ARE_FATAL);
    *s = (struct comm){.mc = mc, .rank = rank, .size = size, .parent_bytes = &c->bytes_sent,
                       .is_split = true};
    *out = s;
    return 0;
}

void comm_close(struct comm *c) {
    if (!c) return;
    free(c->part_counts);
    free(c->part_displs);
    if (c->is_split) MPI_Comm_free(&c->mc);
    if (c->is_finalize_owned) MPI_Finalize();
    free(c);
}

noreturn void comm_abort(struct comm *c, int code, const char *reason) {
    LOG_ERROR("rank %d/%d: %s; aborting the job", comm_rank(c), comm_size(c), reason);
    int is_init = 0;
    MPI_Initialized(&is_init);
    if (c && is_init) MPI_Abort(MPI_COMM_WORLD, code);  // the whole job, even from a split
    exit(code);  // MPI_Abort does not return; this keeps the noreturn promise
}

int32_t comm_rank(const struct comm *c) {
    return c ? c->rank : 0;
}
int32_t comm_size(const struct comm *c) {
    return c ? c->size : 1;
}

#define IDLE_YIELD_NS 20000000LL  // 20 ms: longer than a decode step of a model worth splitting

/* Broadcasts p in slices of at most INT_MAX bytes (MPI counts are int); is_idle:
 * the receivers poll (comm_bcast_idle). */
static void bcast_slices(struct comm *c, void *p, size_t bytes, bool is_idle) {
    uint8_t *cur = p;
    while (bytes > 0) {
        const int n = bytes > (size_t)INT_MAX ? INT_MAX : (int)bytes;
        if (!is_idle) {
            MPI_Bcast(cur, n, MPI_BYTE, 0, c->mc);
        } else {
            // Non-blocking broadcast, tested with a yield between tests for the first
            // IDLE_YIELD_NS (the next step of a busy server comes within a step's time:
            // a rank that finished its part early, such as a stage-0 rank under TP x PP,
            // must not oversleep it), then with sleeps from 10 us up to 1 ms.
            MPI_Request req;
            MPI_Ibcast(cur, n, MPI_BYTE, 0, c->mc, &req);
            int is_done = 0;
            long sleep_ns = 10000;
            struct timespec t0;
            clock_gettime(CLOCK_MONOTONIC, &t0);
            for (;;) {
                MPI_Test(&req, &is_done, MPI_STATUS_IGNORE);
                if (is_done) break;
                struct timespec now;
                clock_gettime(CLOCK_MONOTONIC, &now);
                const long long waited_ns = (long long)(now.tv_sec - t0.tv_sec) * 1000000000LL +
                                            (now.tv_nsec - t0.tv_nsec);
                if (waited_ns < IDLE_YIELD_NS) {
                    sched_yield();
                    continue;
                }
                struct timespec ts = {.tv_sec = 0, .tv_nsec = sleep_ns};
                nanosleep(&ts, NULL);
                if (sleep_ns < 1000000) sleep_ns *= 2;
            }
        }
        if (c->rank == 0) count_sent(c, (uint64_t)n * (uint64_t)(c->size - 1));
        cur += n;
        bytes -= (size_t)n;
    }
}

void comm_bcast(struct comm *c, void *p, size_t bytes) {
    if (!c || c->size == 1) return;
    bcast_slices(c, p, bytes, false);
}

void comm_bcast_idle(struct comm *c, void *p, size_t bytes) {
    if (!c || c->size == 1) return;
    bcast_slices(c, p, bytes, true);
}

/* In place over n floats, in slices of at most INT_MAX. */
static void allreduce(struct comm *c, float *x, int64_t n, MPI_Op op) {
    if (!c || c->size == 1) return;
    DASSERT(n >= 0);
    while (n > 0) {
        const int k = n > INT_MAX ? INT_MAX : (int)n;
        MPI_Allreduce(MPI_IN_PLACE, x, k, MPI_FLOAT, op, c->mc);
        count_sent(c, (uint64_t)k * sizeof(float));
        x += k;
        n -= k;
    }
}

void comm_allreduce_sum(struct comm *c, float *x, int64_t n) { allreduce(c, x, n, MPI_SUM); }

void comm_allreduce_max(struct comm *c, float *x, int64_t n) { allreduce(c, x, n, MPI_MAX); }


void comm_send(struct comm *c, int32_t to, const float *x, int64_t n) {
    ASSERT(c && c->size > 1 && to >= 0 && to < c->size && to != c->rank && n >= 0);
    while (n > 0) {
        const int k = n > INT_MAX ? INT_MAX : (int)n;
        MPI_Send(x, k, MPI_FLOAT, to, 0, c->mc);
        count_sent(c, (uint64_t)k * sizeof(float));
        x += k;
        n -= k;
    }
}

void comm_recv(struct comm *c, int32_t from, float *x, int64_t n) {
    ASSERT(c && c->size > 1 && from >= 0 && from < c->size && from != c->rank && n >= 0);
    while (n > 0) {
        const int k = n > INT_MAX ? INT_MAX : (int)n;
        MPI_Recv(x, k, MPI_FLOAT, from, 0, c->mc, MPI_STATUS_IGNORE);
        x += k;
        n -= k;
    }
}

/* counts as ints, and their displacements, in the comm's scratch; the total. */
static int64_t parts_layout(struct comm *c, const int64_t *counts) {
    if (!c->part_counts) {
        c->part_counts = xcalloc((size_t)c->size, sizeof(int));
        c->part_displs = xcalloc((size_t)c->size, sizeof(int));
    }
    int64_t total = 0;
    for (int32_t r = 0; r < c->size; r++) {
        ASSERT(counts[r] >= 0 && counts[r] <= INT_MAX && total <= INT_MAX);
        c->part_counts[r] = (int)counts[r];
        c->part_displs[r] = (int)total;
        total += counts[r];
    }
    return total;
}

void comm_allgather_parts(struct comm *c, float *all, const int64_t *counts) {
    if (!c || c->size == 1) return;
    parts_layout(c, counts);
    MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, all, c->part_counts, c->part_displs,
                   MPI_FLOAT, c->mc);
    count_sent(c, (uint64_t)counts[c->rank] * sizeof(float));
}

void comm_reduce_scatter_parts(struct comm *c, float *all, const int64_t *counts, float *mine) {
    if (!c || c->size == 1) {
        if (mine != all) memmove(mine, all, (size_t)counts[0] * sizeof(float));
        return;
    }
    const int64_t total = parts_layout(c, counts);
    MPI_Reduce_scatter(all, mine, c->part_counts, MPI_FLOAT, MPI_SUM, c->mc);
    count_sent(c, (uint64_t)total * sizeof(float));
}

void comm_gather_parts(struct comm *c, float *all, const int64_t *counts) {
    if (!c || c->size == 1) return;
    parts_layout(c, counts);
    if (c->rank == 0) {
        MPI_Gatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, all, c->part_counts, c->part_displs,
                    MPI_FLOAT, 0, c->mc);
    } else {
        MPI_Gatherv(all + c->part_displs[c->rank], c->part_counts[c->rank], MPI_FLOAT, NULL,
                    NULL, NULL, MPI_FLOAT, 0, c->mc);
        count_sent(c, (uint64_t)counts[c->rank] * sizeof(float));
    }
}

void comm_gather(struct comm *c, const void *mine, size_t bytes, void *all) {
    if (!c || c->size == 1) {
        memcpy(all, mine, bytes);
        return;
    }
    ASSERT(bytes <= (size_t)INT_MAX);
    MPI_Gather(mine, (int)bytes, MPI_BYTE, all, (int)bytes, MPI_BYTE, 0, c->mc);
    if (c->rank != 0) count_sent(c, bytes);
}

int comm_agree(struct comm *c, int err) {
    if (!c || c->size == 1) return err;
    int all = err;
    MPI_Allreduce(&err, &all, 1, MPI_INT, MPI_MIN, c->mc);
    count_sent(c, sizeof(int));
    return all < 0 ? all : 0;
}

uint64_t comm_bytes_sent(const struct comm *c) {
    return c ? c->bytes_sent : 0;
}
