/*
 * tp.h - a subcommand (serve, generate) under tensor parallelism: every rank
 * of `mpirun -np N llmserve CMD --tp N ...` runs the same command line;
 * rank 0 does the command's work on its slice of the model, the others
 * only follow its forward passes (engine_follow) and serve nothing.
 *
 * The order on every rank: tp_open, tp_load_model; then rank 0 creates its
 * ctx (directly or through the scheduler) with comm set, while the others
 * call tp_follow. A rank-0 failure between tp_load_model and its ctx
 * creation leaves the others waiting in engine_ctx_create: rank 0 ends the
 * job with tp_fail instead of returning. [main thread]
 */
#ifndef LLMSERVE_TP_H
#define LLMSERVE_TP_H

#include <stdint.h>
#include <stdnoreturn.h>

#include "engine/engine.h"

/* n_ranks 1: *out = NULL (no MPI at all), returns 0. More: comm_open(). */
int tp_open(int32_t n_ranks, struct comm **out);

/* Loads this rank's slice of the model at path (n_stages pipeline stages
 * of comm_size / n_stages tensor-parallel ranks each; rank = stage * TP +
 * TP rank; or, with n_sp > 1, the whole model on each of the n_sp sequence-
 * parallel ranks) (all of it with a NULL
 * comm; the load's progress shown by rank 0 alone) and agrees with the other ranks: returns 0 only if every rank
 * loaded. *out is owned by the caller (engine_model_free). */
int tp_load_model(struct comm *c, const char *path, int32_t n_stages, int32_t n_sp,
                  struct engine_model **out);

/* Ranks other than 0: creates the ctx (rank 0's limits, n_threads kernel
 * threads here), follows rank 0 until it frees its ctx, frees this one.
 * Returns the process exit status (0; 1 when the ctx could not be created). */
int tp_follow(struct comm *c, const struct engine_model *m, int32_t n_threads);

/* This process's peak resident memory so far (getrusage), in MiB. [any thread] */
double tp_peak_rss_mib(void);

/* On rank 0 of a job of several ranks: logs why and ends the whole job with
 * `code`. With a NULL comm it just returns, and the caller returns code. */
void tp_fail(struct comm *c, int code, const char *why);

#endif
