/*
 * comm.c - the single-process backend of comm.h (builds without MPI): one
 * rank, and every collective leaves its buffer as it is, which is already
 * the sum and the broadcast value over one rank.
 */
#define LOG_TAG "comm"
#include "engine/comm/comm.h"

#include <stdlib.h>
#include <string.h>

#include "engine/base/err.h"
#include "engine/base/log.h"

struct comm {
    int32_t size;  // always 1
};

int comm_open(int32_t n_ranks, struct comm **out) {
    *out = NULL;
    if (n_ranks != 1) {
        LOG_ERROR(
            "%d ranks need MPI, and this build has none (install libopenmpi-dev and "
            "meson setup -Dmpi=enabled)",
            n_ranks);
        return ERR_UNSUPPORTED;
    }
    struct comm *c = calloc(1, sizeof(*c));
    if (!c) return ERR_NOMEM;
    c->size = 1;
    *out = c;
    return 0;
}

int comm_split(struct comm *c, int32_t color, int32_t key, struct comm **out) {
    (void)color;
    (void)key;
    *out = NULL;
    if (!c) return 0;
    struct comm *s = calloc(1, sizeof(*s));  // the one rank is its own group
    if (!s) return ERR_NOMEM;
    s->size = 1;
    *out = s;
    return 0;
}

void comm_close(struct comm *c) {
    free(c);
}

noreturn void comm_abort(struct comm *c, int code, const char *reason) {
    (void)c;
    LOG_ERROR("rank 0/1: %s; exiting", reason);
    exit(code);
}

int32_t comm_rank(const struct comm *c) {
    (void)c;
    return 0;
}

int32_t comm_size(const struct comm *c) {
    (void)c;
    return 1;
}

void comm_bcast(struct comm *c, void *p, size_t bytes) {
    (void)c;
    (void)p;
    (void)bytes;
}

void comm_bcast_idle(struct comm *c, void *p, size_t bytes) {
    (void)c;
    (void)p;
    (void)bytes;
}

void comm_allreduce_sum(struct comm *c, float *x, int64_t n) {
    (void)c;
    (void)x;
    (void)n;
}

void comm_send(struct comm *c, int32_t to, const float *x, int64_t n) {
    (void)x;
    (void)n;
    comm_abort(c, 1, to == 0 ? "comm_send to itself" : "comm_send to a rank of one process");
}

void comm_recv(struct comm *c, int32_t from, float *x, int64_t n) {
    (void)x;
    (void)n;
    comm_abort(c, 1, from == 0 ? "comm_recv from itself" : "comm_recv in one process");
}

void comm_allgather_parts(struct comm *c, float *all, const int64_t *counts) {
    (void)c;
    (void)all;
    (void)counts;
}

void comm_allreduce_max(struct comm *c, float *x, int64_t n) {
    (void)c;
    (void)x;
    (void)n;
}

void comm_reduce_scatter_parts(struct comm *c, float *all, const int64_t *counts, float *mine) {
    (void)c;
    if (mine != all) memmove(mine, all, (size_t)counts[0] * sizeof(float));
}

void comm_gather_parts(struct comm *c, float *all, const int64_t *counts) {
    (void)c;
    (void)all;
    (void)counts;
}

void comm_gather(struct comm *c, const void *mine, size_t bytes, void *all) {
    (void)c;
    memcpy(all, mine, bytes);
}

int comm_agree(struct comm *c, int err) {
    (void)c;
    return err;
}

uint64_t comm_bytes_sent(const struct comm *c) {
    (void)c;
    return 0;
}
