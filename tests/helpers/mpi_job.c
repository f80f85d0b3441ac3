/*
 * mpi_job.c - the job protocol of mpi_job.h: rank 0 broadcasts one job at a
 * time, the other ranks do it.
 */
#include "tests/helpers/mpi_job.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct mpi_job mpi_job = {.n_tp = 1, .n_pp = 1, .n_sp = 1};
struct engine_ctx *mpi_job_open_ctx;

int mpi_job_teardown_ctx(void **state) {
    (void)state;
    engine_ctx_free(mpi_job_open_ctx);
    mpi_job_open_ctx = NULL;
    return 0;
}

enum job_kind { JOB_END, JOB_LOAD, JOB_CTX, JOB_UNLOAD };
struct job {
    int32_t kind;
    char path[1024];  // JOB_LOAD: the model
};

static void send_job(int32_t kind, const char *path) {
    if (!mpi_job.comm) return;
    struct job j = {.kind = kind};
    if (path) snprintf(j.path, sizeof(j.path), "%s", path);
    comm_bcast(mpi_job.comm, &j, sizeof(j));
}

static int follow(void);

int mpi_job_start(int argc, char **argv) {
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--tp") == 0) mpi_job.n_tp = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--pp") == 0) mpi_job.n_pp = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--sp") == 0) mpi_job.n_sp = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--sp-kv") == 0) {
            mpi_job.is_kv_divided = strcmp(argv[i + 1], "divided") == 0;
        }
    }
    if (mpi_job.n_tp < 1 || mpi_job.n_pp < 1 || mpi_job.n_sp < 1 ||
        (mpi_job.n_sp > 1 && mpi_job.n_tp * mpi_job.n_pp > 1) ||
        (mpi_job.is_kv_divided && mpi_job.n_sp < 2)) {
        return 2;
    }
    const int32_t n_ranks = mpi_job.n_tp * mpi_job.n_pp * mpi_job.n_sp;
    if (n_ranks > 1 && comm_open(n_ranks, &mpi_job.comm) != 0) return 1;
    return comm_rank(mpi_job.comm) == 0 ? -1 : follow();
}

static int load(const char *path, struct engine_model **out) {
    struct engine_model_params mp = engine_model_default_params();
    mp.path = path;
    const int32_t rank = comm_rank(mpi_job.comm);
    mp.tp_rank = rank % mpi_job.n_tp;
    mp.tp_size = mpi_job.n_tp;
    mp.pp_rank = rank / mpi_job.n_tp;
    mp.pp_size = mpi_job.n_pp;
    if (mpi_job.n_sp > 1) {
        mp.tp_rank = mp.pp_rank = 0;
        mp.sp_rank = rank;
        mp.sp_size = mpi_job.n_sp;
    }
    return comm_agree(mpi_job.comm, engine_model_load(&mp, out));
}

int mpi_job_load(const char *path, struct engine_model **out) {
    send_job(JOB_LOAD, path);
    return load(path, out);
}

void mpi_job_unload(struct engine_model *m) {
    send_job(JOB_UNLOAD, NULL);
    engine_model_free(m);
}

void mpi_job_ctx(struct engine_ctx_params *p) {
    send_job(JOB_CTX, NULL);
    p->comm = mpi_job.comm;
    if (mpi_job.is_kv_divided) {  // the same ids, each rank holding one in n_sp
        p->kv_divided = true;
        p->n_blocks = (p->n_blocks + mpi_job.n_sp - 1) / mpi_job.n_sp * mpi_job.n_sp;
    }
}

void mpi_job_end(void) {
    send_job(JOB_END, NULL);
    comm_close(mpi_job.comm);
    mpi_job.comm = NULL;
}

/* Ranks other than 0: do rank 0's jobs until JOB_END, then close the comm. */
static int follow(void) {
    struct engine_model *model = NULL;
    for (;;) {
        struct job j;
        comm_bcast(mpi_job.comm, &j, sizeof(j));
        switch ((enum job_kind)j.kind) {
        case JOB_END:
            engine_model_free(model);
            comm_close(mpi_job.comm);
            return 0;
        case JOB_LOAD:
            if (load(j.path, &model) != 0) model = NULL;
            break;
        case JOB_CTX: {
            struct engine_ctx_params cp = engine_ctx_default_params();  // limits: rank 0's
            cp.n_threads = 1;
            cp.comm = mpi_job.comm;
            struct engine_ctx *ctx = NULL;
            if (engine_ctx_create(model, &cp, &ctx) == 0) engine_follow(ctx);
            engine_ctx_free(ctx);
            break;
        }
        case JOB_UNLOAD:
            engine_model_free(model);
            model = NULL;
            break;
        }
    }
}
