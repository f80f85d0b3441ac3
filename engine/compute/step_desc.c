/*
 * step_desc.c - packing, broadcasting and unpacking the step descriptor
 * (layout in step_desc.h).
 */
#define LOG_TAG "step"
#include "engine/compute/step_desc.h"

#include <stdlib.h>
#include <string.h>

#include "engine/base/alloc.h"
#include "engine/base/err.h"
#include "engine/base/log.h"
#include "engine/comm/comm.h"

enum {
    HDR_KIND,
    HDR_N_TOKENS,
    HDR_N_SEQS,
    HDR_HAS_ADAPTER,
    HDR_N_TABLE,
    HDR_WANT_STATS,
    HDR_COUNT
};

int step_desc_init(struct step_desc *d, int32_t max_tokens, int32_t max_seqs) {
    memset(d, 0, sizeof(*d));
    d->body_cap = 5 * (int64_t)max_tokens + 2 * (int64_t)max_seqs;
    d->body = malloc((size_t)d->body_cap * sizeof(int32_t));
    d->output = malloc((size_t)max_tokens);
    d->seqs = malloc((size_t)max_seqs * sizeof(*d->seqs));
    if (!d->body || !d->output || !d->seqs) {
        step_desc_deinit(d);
        return ERR_NOMEM;
    }
    d->max_tokens = max_tokens;
    d->max_seqs = max_seqs;
    return 0;
}

void step_desc_deinit(struct step_desc *d) {
    free(d->body);
    free(d->output);
    free(d->seqs);
    memset(d, 0, sizeof(*d));
}

/* Grows the body to n values; block tables have no bound of their own. */
static void reserve(struct step_desc *d, int64_t n) {
    if (n <= d->body_cap) return;
    d->body = xrealloc(d->body, (size_t)n * sizeof(int32_t));
    d->body_cap = n;
}

static int64_t body_len(const int32_t *hdr) {
    return (4 + (hdr[HDR_HAS_ADAPTER] ? 1 : 0)) * (int64_t)hdr[HDR_N_TOKENS] + hdr[HDR_N_SEQS] +
           (int64_t)hdr[HDR_N_TABLE];
}

void step_desc_send(struct step_desc *d, struct comm *c, const struct engine_batch *b,
                    bool want_stats) {
    const int32_t T = b->n_tokens;
    int64_t n_table = 0;
    for (int32_t s = 0; s < b->n_seqs; s++) n_table += b->seqs[s].n_blocks;
    ASSERT(n_table <= INT32_MAX);
    int32_t hdr[HDR_COUNT] = {STEP_DESC_KIND_FORWARD, T, b->n_seqs, b->adapter != NULL,
                              (int32_t)n_table, want_stats};
    const int64_t n = body_len(hdr);
    reserve(d, n);
    int32_t *p = d->body;
    memcpy(p, b->token, (size_t)T * sizeof(int32_t));
    p += T;
    memcpy(p, b->pos, (size_t)T * sizeof(int32_t));
    p += T;
    memcpy(p, b->seq, (size_t)T * sizeof(int32_t));
    p += T;
    for (int32_t t = 0; t < T; t++) *p++ = b->output[t];
    if (b->adapter) {
        memcpy(p, b->adapter, (size_t)T * sizeof(int32_t));
        p += T;
    }
    for (int32_t s = 0; s < b->n_seqs; s++) *p++ = b->seqs[s].n_blocks;
    for (int32_t s = 0; s < b->n_seqs; s++) {
        memcpy(p, b->seqs[s].block_table, (size_t)b->seqs[s].n_blocks * sizeof(int32_t));
        p += b->seqs[s].n_blocks;
    }
    ASSERT(p - d->body == n);
    comm_bcast_idle(c, hdr, sizeof(hdr));
    comm_bcast(c, d->body, (size_t)n * sizeof(int32_t));
}

void step_desc_send_adapter(struct comm *c, int32_t slot, bool has_adapter) {
    int32_t hdr[HDR_COUNT] = {STEP_DESC_KIND_ADAPTER, slot, has_adapter, 0, 0, 0};
    comm_bcast_idle(c, hdr, sizeof(hdr));
}

void step_desc_send_stop(struct comm *c) {
    int32_t hdr[HDR_COUNT] = {STEP_DESC_KIND_STOP, 0, 0, 0, 0, 0};
    comm_bcast_idle(c, hdr, sizeof(hdr));
}

enum step_desc_kind step_desc_recv(struct step_desc *d, struct comm *c, struct engine_batch *b,
                                   bool *out_want_stats) {
    int32_t hdr[HDR_COUNT] = {0};
    comm_bcast_idle(c, hdr, sizeof(hdr));  // the followers wait here while rank 0 is idle
    if (hdr[HDR_KIND] == STEP_DESC_KIND_STOP) return STEP_DESC_KIND_STOP;
    if (hdr[HDR_KIND] == STEP_DESC_KIND_ADAPTER) {
        d->adapter_slot = hdr[HDR_N_TOKENS];
        d->has_adapter = hdr[HDR_N_SEQS] != 0;
        return STEP_DESC_KIND_ADAPTER;
    }
    // The limits are the ctx's, which rank 0 broadcast at creation: a mismatch is a bug.
    ASSERT(hdr[HDR_KIND] == STEP_DESC_KIND_FORWARD);
    ASSERT(hdr[HDR_N_TOKENS] >= 1 && hdr[HDR_N_TOKENS] <= d->max_tokens);
    ASSERT(hdr[HDR_N_SEQS] >= 1 && hdr[HDR_N_SEQS] <= d->max_seqs && hdr[HDR_N_TABLE] >= 0);
    const int64_t n = body_len(hdr);
    reserve(d, n);
    comm_bcast(c, d->body, (size_t)n * sizeof(int32_t));
    const int32_t T = hdr[HDR_N_TOKENS];
    const int32_t S = hdr[HDR_N_SEQS];
    const int32_t *p = d->body;
    b->n_tokens = T;
    b->token = p;
    b->pos = p + T;
    b->seq = p + 2 * (int64_t)T;
    for (int32_t t = 0; t < T; t++) d->output[t] = (int8_t)p[3 * (int64_t)T + t];
    b->output = d->output;
    p += 4 * (int64_t)T;
    b->adapter = NULL;
    if (hdr[HDR_HAS_ADAPTER]) {
        b->adapter = p;
        p += T;
    }
    const int32_t *tables = p + S;
    for (int32_t s = 0; s < S; s++) {
        d->seqs[s].n_blocks = p[s];
        d->seqs[s].block_table = tables;
        tables += p[s];
    }
    ASSERT(tables - d->body == n);
    b->n_seqs = S;
    b->seqs = d->seqs;
    *out_want_stats = hdr[HDR_WANT_STATS] != 0;
    return STEP_DESC_KIND_FORWARD;
}
