/*
 * comm.h - the one communication seam of the engine: the ranks of a tensor
 * parallel job and the few collectives the forward pass and the step
 * descriptor need (broadcast from rank 0, sum-allreduce of floats, agreeing
 * on an error, ending the job).
 *
 * Two backends implement this header, chosen at build time (-Dmpi=...):
 * comm.c, a single process (size 1: every collective is a no-op), and
 * comm_mpi.c, MPI over MPI_COMM_WORLD. Nothing else in the tree names MPI.
 * A NULL comm is the single process in both: every function below accepts
 * it (rank 0 of 1), so a one-process run never initialises MPI at all.
 *
 * Threads: MPI is initialised with MPI_THREAD_SERIALIZED (comm_mpi.c says
 * why not FUNNELED). A comm is used by one thread at a time: the thread that
 * opens it loads the model and creates the ctx, then the step thread alone
 * runs collectives until the ctx is freed; the opener frees the ctx and
 * closes the comm after that thread has been joined. Every collective is
 * called in the same order on every rank.
 */
#ifndef LLMSERVE_COMM_H
#define LLMSERVE_COMM_H

#include <stddef.h>
#include <stdint.h>
#include <stdnoreturn.h>

struct comm;

/* Opens the job's communicator (MPI_Init_thread under the MPI backend) and
 * checks that it has exactly n_ranks ranks. Returns 0, ERR_UNSUPPORTED
 * (n_ranks > 1 in a build without MPI, or MPI without thread support;
 * logged), ERR_INVAL (the job has another size than n_ranks; logged, naming
 * both) or ERR_NOMEM. *out is owned by the caller: comm_close(). Call once
 * per process, on its main thread, before any other thread is started;
 * with n_ranks 1 there is no reason to call it (use NULL). */
int comm_open(int32_t n_ranks, struct comm **out);

/* *out: the ranks of c that pass the same color, a communicator of its own
 * (ranks numbered by key, then by their rank in c), for collectives among a
 * subset (the TP ranks of one pipeline stage). Collective over c: every rank
 * of c calls it, in the same order. Returns 0 or ERR_NOMEM. Bytes sent
 * through *out are also counted in c's comm_bytes_sent. c must outlive *out;
 * free *out with comm_close before c. A NULL c gives NULL (one process). */
int comm_split(struct comm *c, int32_t color, int32_t key, struct comm **out);

/* Finalizes MPI (a split comm: frees it, collective over its parent);
 * NULL-safe. Every rank must reach it (after the last
 * collective), or the others wait in theirs: on a failure call comm_abort. */
void comm_close(struct comm *c);

/* Ends the whole job (every rank) with exit code `code`, after logging
 * `reason` on this rank. Never returns. The way out of any error a rank
 * cannot share with the others through the collectives. */
noreturn void comm_abort(struct comm *c, int code, const char *reason);

int32_t comm_rank(const struct comm *c);  // 0 for NULL
int32_t comm_size(const struct comm *c);  // 1 for NULL

/* Rank 0's `bytes` bytes at p are copied into p on every other rank. */
void comm_bcast(struct comm *c, void *p, size_t bytes);

/* comm_bcast for a message the receivers may wait long for (the next step of
 * an idle server): they poll, yielding the CPU between tests for the first
 * 20 ms (the next step of a busy server comes sooner: no oversleeping it),
 * then with growing sleeps (up to 1 ms) instead of spinning in the MPI
 * library, so an idle follower rank costs no CPU. */
void comm_bcast_idle(struct comm *c, void *p, size_t bytes);

/* x[i] = sum over ranks of x[i], the same result on every rank. */
void comm_allreduce_sum(struct comm *c, float *x, int64_t n);

/* x[i] = max over ranks of x[i] (exact: a max rounds nothing). */
void comm_allreduce_max(struct comm *c, float *x, int64_t n);

/* Point to point (pipeline parallelism): n floats at x to rank `to`, which
 * receives them with comm_recv from this rank; both block until the
 * transfer is done. Only in a job of several ranks (never with a NULL comm). */
void comm_send(struct comm *c, int32_t to, const float *x, int64_t n);
void comm_recv(struct comm *c, int32_t from, float *x, int64_t n);

/* In place, over all of c's ranks: all holds counts[0] floats of rank 0,
 * then counts[1] of rank 1, and so on; each rank has written its own part,
 * and afterwards every rank has every part (allgatherv). Each count fits an
 * int. */
void comm_allgather_parts(struct comm *c, float *all, const int64_t *counts);

/* The sum over ranks of all (every rank's counts[0] + counts[1] + ...
 * floats), of which this rank receives only its own part, the counts[rank]
 * floats after the parts of the ranks before it, into mine (reduce-scatter;
 * all is clobbered). Each count fits an int. */
void comm_reduce_scatter_parts(struct comm *c, float *all, const int64_t *counts, float *mine);

/* As comm_allgather_parts, but only rank 0 receives the parts (gatherv);
 * the others' all is left as it is. */
void comm_gather_parts(struct comm *c, float *all, const int64_t *counts);

/* Every rank's `bytes` bytes at mine, in rank order, into all on rank 0
 * ([size][bytes]; all is not touched on the other ranks, and may be NULL
 * there). */
void comm_gather(struct comm *c, const void *mine, size_t bytes, void *all);

/* Every rank passes its own result (0 or a negative ERR_*); every rank gets
 * back 0 when all passed 0, else the lowest code any rank passed. The way
 * ranks agree that a step that can fail on one of them (a load, an
 * allocation) failed on all, so none is left waiting in a collective. */
int comm_agree(struct comm *c, int err);

/* Payload bytes this rank has handed to collectives since comm_open (the
 * transport's own framing and tree forwarding not counted; a broadcast counts
 * size - 1 copies on rank 0). For benchmarks and /metrics. */
uint64_t comm_bytes_sent(const struct comm *c);

#endif
