/*
 * step_desc.h - the step descriptor of tensor parallelism: what rank 0 sends
 * every other rank before each forward pass, so that all of them run the
 * same batch on the same block tables (rank 0 alone samples; shard.h has
 * who computes what).
 *
 * On the wire (int32 values, two broadcasts: the header, which the followers
 * wait for without spinning (comm_bcast_idle), then the body):
 *
 *   header  kind | n_tokens | n_seqs | has_adapter | n_table | want_stats
 *   body    token[n_tokens] pos[n_tokens] seq[n_tokens] output[n_tokens]
 *           adapter[n_tokens] (if has_adapter) n_blocks[n_seqs]
 *           block tables, concatenated (n_table = sum of n_blocks)
 *
 * A slot's change between steps is a header alone: kind ADAPTER, the slot
 * in n_tokens' place and whether an adapter follows in n_seqs'.
 *
 * Whole block tables travel each step, not their changes: a decode step of
 * S sequences of L tokens costs 4 * (6 + 5 S + S L / block_size) bytes,
 * small beside the 2 * n_layer * S * n_embd * 4 bytes of the allreduces.
 * want_stats asks every rank to report its figures (engine_rank_stats) to
 * rank 0 after this step's forward pass (a gather, engine.c).
 * Threads: the thread that runs the ctx's collectives (comm.h).
 */
#ifndef LLMSERVE_STEP_DESC_H
#define LLMSERVE_STEP_DESC_H

#include <stdbool.h>
#include <stdint.h>

#include "engine/engine.h"

struct comm;

enum step_desc_kind {
    STEP_DESC_KIND_STOP = 0,     // rank 0 freed its ctx: the followers return
    STEP_DESC_KIND_FORWARD = 1,  // a batch follows
    STEP_DESC_KIND_ADAPTER = 2,  // a slot changes: adapter_share() follows if it gets one
};

/* Receive-side storage, sized once for a ctx's limits (owned). */
struct step_desc {
    int32_t *body;  // [body_cap] the last body received or sent
    int64_t body_cap;
    int8_t *output;           // [max_batch_tokens]
    struct engine_seq *seqs;  // [max_seqs]
    int32_t max_tokens;
    int32_t max_seqs;
    int32_t adapter_slot;     // STEP_DESC_KIND_ADAPTER: the slot
    bool has_adapter;         // STEP_DESC_KIND_ADAPTER: an adapter follows (else it empties)
};

/* Allocates for batches of up to max_tokens tokens and max_seqs sequences.
 * Returns 0 or ERR_NOMEM. */
int step_desc_init(struct step_desc *d, int32_t max_tokens, int32_t max_seqs);
void step_desc_deinit(struct step_desc *d);  // safe on a zeroed struct

/* Rank 0: broadcasts b (a validated batch), and whether the ranks report
 * their figures after it. */
void step_desc_send(struct step_desc *d, struct comm *c, const struct engine_batch *b,
                    bool want_stats);

/* Rank 0: tells the followers that slot gets an adapter (has_adapter: it
 * follows, adapter_share.h) or is emptied. */
void step_desc_send_adapter(struct comm *c, int32_t slot, bool has_adapter);

/* Rank 0: tells the followers to stop. */
void step_desc_send_stop(struct comm *c);

/* Other ranks: receives the next descriptor. For STEP_DESC_KIND_FORWARD, *b
 * views d's storage until the next call; for STEP_DESC_KIND_ADAPTER,
 * d->adapter_slot and d->has_adapter say what changes. A body larger than the limits d was
 * sized for means the ranks disagree on the ctx: that ends the job.
 * *out_want_stats: rank 0's want_stats (set for FORWARD only). */
enum step_desc_kind step_desc_recv(struct step_desc *d, struct comm *c, struct engine_batch *b,
                                   bool *out_want_stats);

#endif
