/*
 * mpi_job.h - engine tests run as a job of several ranks (`mpirun -np N
 * TEST --tp A --pp B` or `--sp C [--sp-kv divided]`): rank 0 runs the cmocka tests; before
 * each model load, ctx creation and model free it tells the other ranks
 * which to do (one broadcast), so they follow it step by step. Without
 * those flags (or at 1) there is no job and every call is for one process.
 */
#ifndef TESTS_MPI_JOB_H
#define TESTS_MPI_JOB_H

#include <stdbool.h>
#include <stdint.h>

#include "engine/engine.h"

struct mpi_job {
    struct comm *comm;  // NULL: one process
    int32_t n_tp;       // TP ranks per stage
    int32_t n_pp;       // pipeline stages
    int32_t n_sp;       // sequence-parallel ranks (never with TP or PP)
    bool is_kv_divided; // `--sp-kv divided`: the KV pool divided over the SP ranks
};

extern struct mpi_job mpi_job;

/* Reads --tp/--pp/--sp from argv and opens the job's comm; the ranks other
 * than 0 then follow rank 0 until it ends the job. Returns -1 on rank 0
 * (go on: run the tests, then mpi_job_end()), else the exit code: a
 * follower's when the job has ended, 2 for bad flags, 1 for a job that did
 * not open. */
int mpi_job_start(int argc, char **argv);

/* Rank 0, at the end: tells the others to leave, closes the comm. */
void mpi_job_end(void);

/* Loads the model at path as this rank's part of the job, after telling the
 * other ranks to do the same; returns what every rank agreed on (0 or the
 * lowest error code). */
int mpi_job_load(const char *path, struct engine_model **out);

/* Frees m (NULL-safe) and tells the other ranks to free theirs. */
void mpi_job_unload(struct engine_model *m);

/* Tells the other ranks to create a ctx with rank 0's limits and follow it
 * until rank 0 frees its own; sets p->comm. Call right before
 * engine_ctx_create(). */
void mpi_job_ctx(struct engine_ctx_params *p);

/* The ctx a test has open (set it after engine_ctx_create(), clear it
 * before its own free). A cmocka teardown, mpi_job_teardown_ctx(), frees it
 * when an assertion failed in the middle, so that the other ranks leave
 * engine_follow() and the job goes on instead of hanging. */
extern struct engine_ctx *mpi_job_open_ctx;
int mpi_job_teardown_ctx(void **state);

/* A cmocka test with that teardown. */
#define MPI_JOB_TEST(f) cmocka_unit_test_teardown(f, mpi_job_teardown_ctx)

#endif
